"""Read a store back with open_reader, as a training loop would, and say whether it keeps up.

    python scripts/read_store.py demo/demo.lmdb --epochs 1 --batch-size 64 --step-ms 5

``--step-ms`` simulates a training step (a sleep) per batch, so the data-wait share shows
how much of the loop's time would be spent waiting for data. Prints one line per epoch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from packer import open_reader


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--step-ms", type=float, default=5.0, help="simulated training step per batch"
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="decode threads (default: all cores)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with open_reader(
        args.store, batch_size=args.batch_size, seed=0, workers=args.workers
    ) as reader:
        for epoch in range(args.epochs):
            for _images, _labels in reader.epoch(epoch):
                time.sleep(args.step_ms / 1000)
            stats = reader.stats()
            if args.json:
                print(json.dumps({"epoch": epoch, **stats}))
            else:
                print(
                    f"{args.store} epoch {epoch}: {stats['images']} images in {stats['seconds']:.2f}s, "
                    f"{stats['images_per_s']:,.0f} images/s, {stats['mb_per_s']:.1f} MB/s, "
                    f"waiting for data {stats['wait_share']:.0%} of the time "
                    f"(training step {args.step_ms:g} ms/batch)"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
