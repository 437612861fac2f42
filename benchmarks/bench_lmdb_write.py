"""Is LMDB itself the slow part of a pack? Bare LMDB writes of 216 MB of 120 KB values, at
several transaction sizes, with and without writemap, against a plain write + fsync of the
same bytes, side by side in one run. Each value is a new bytes object, as a pack's writer makes
one per record (header + payload): a transaction holds its values until it commits, so its size
decides how much memory is freed and allocated again in turn.

    python benchmarks/bench_lmdb_write.py     # writes docs/benchmarks/components/lmdb-write.md
    python benchmarks/bench_lmdb_write.py --count 20 --repeat 1 --out /tmp/lmdb.md
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import lmdb
import reporting

VALUE_BYTES = 120_000  # the mean source file of benchmarks/bench_pack.py


def lmdb_write(
    path: Path, values: list[bytes], count: int, txn_bytes: int, writemap: bool
) -> float:
    path.unlink(missing_ok=True)
    env = lmdb.open(
        str(path), subdir=False, map_size=2 * count * VALUE_BYTES + (64 << 20), lock=False,
        sync=False, metasync=False, writemap=writemap, meminit=not writemap, max_dbs=0,
    )  # fmt: skip
    started = time.perf_counter()
    pending: list[tuple[bytes, bytes]] = []

    def commit() -> None:
        with env.begin(write=True) as txn:
            cursor = txn.cursor()
            for key, value in pending:
                cursor.put(key, value, append=True)
        pending.clear()

    for i in range(count):
        pending.append((b"%010d" % i, b"".join((b"h", values[i % len(values)]))))
        if len(pending) * VALUE_BYTES >= txn_bytes:
            commit()
    if pending:
        commit()
    env.sync(True)
    env.close()
    return time.perf_counter() - started


def plain_write(path: Path, values: list[bytes], count: int) -> float:
    started = time.perf_counter()
    with open(path, "wb") as f:
        for i in range(count):
            f.write(values[i % len(values)])
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1800, help="values written")
    parser.add_argument("--repeat", type=int, default=3)
    reporting.out_option(parser, "components/lmdb-write.md")
    args = parser.parse_args(argv)
    values = [os.urandom(VALUE_BYTES) for _ in range(64)]
    total_mb = args.count * VALUE_BYTES / 1e6
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench"
        plain = min(plain_write(path, values, args.count) for _ in range(args.repeat))
        rows.append(["plain write + fsync", "", f"{plain:.3f}", "1.00"])
        for txn_mb in (1, 8, 64):
            for writemap in (False, True):
                seconds = min(
                    lmdb_write(path, values, args.count, txn_mb << 20, writemap)
                    for _ in range(args.repeat)
                )
                rows.append(
                    [f"LMDB, {txn_mb} MB transactions", "yes" if writemap else "no",
                     f"{seconds:.3f}", f"{seconds / plain:.2f}"]
                )  # fmt: skip
    text = reporting.header("LMDB writes against a plain write", reporting.command(__file__, argv))
    text += (
        f"{total_mb:,.0f} MB of {VALUE_BYTES // 1000} KB values ({args.count:,}), each a new bytes "
        "object as a pack's writer makes one per record, written by bare LMDB at several "
        "transaction sizes, with and without `writemap`, and synced at the end; against one "
        f"plain write + fsync of the same bytes. Best of {args.repeat}. {reporting.load()}\n\n"
    )
    text += reporting.table(["write", "writemap", "seconds", "× plain write"], rows)
    reporting.write(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
