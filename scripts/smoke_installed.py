"""The smoke test of an installed packer, as a user installs it: run by scripts/smoke_dist.sh
with the python of a fresh virtual environment that holds only the wheel (or what pip built
from the sdist) and its dependencies, outside the checkout. A missing module, data file,
dependency or entry point fails it.

It packs a small folder into both backends, verifies the stores, reads a batch back through
open_reader, runs `packer --version` and `python -m packer --help`, and checks that the
extras this venv lacks (torch, dask) are refused with the command that installs them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

import packer
from packer.about import DISTRIBUTION, install_hint

BIN = Path(sys.executable).parent


def run(*args: str | Path, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300)
    if (done.returncode == 0) != ok:
        sys.exit(f"smoke: {' '.join(map(str, args))} exited {done.returncode}:\n{done.stderr}")
    return done


def check(cond: bool, what: str) -> None:
    if not cond:
        sys.exit(f"smoke: {what}")


def make_images(root: Path) -> int:
    rng = np.random.default_rng(0)
    n = 0
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(6):
            pixels = rng.integers(0, 256, (24 + i, 32, 3), dtype=np.uint8)
            ext = "png" if i % 2 else "jpg"
            Image.fromarray(pixels).save(root / label / f"{i}.{ext}")
            n += 1
    return n


def main() -> None:
    # The package this venv installed, not a checkout's (editable or on sys.path).
    where = Path(packer.__file__).resolve()
    check(where.is_relative_to(Path(sys.prefix).resolve()), f"packer imported from {where}")
    version = importlib.metadata.version(DISTRIBUTION)
    check(version == packer.__version__, f"{DISTRIBUTION} {version} != {packer.__version__}")

    with tempfile.TemporaryDirectory() as tmp:
        images = Path(tmp) / "images"
        count = make_images(images)
        for name in ("out.lmdb", "out.h5"):
            store = Path(tmp) / name
            run(BIN / "packer", "pack", images, store, "--seed", "0", "-q")
            run(BIN / "packer", "inspect", store, "--verify")
            with packer.open_reader(store, batch_size=4, seed=0) as reader:
                batches = list(reader.epoch(0))
            images_read = sum(len(labels) for _, labels in batches)
            check(images_read == count, f"{name}: read {images_read} images of {count}")
            first, labels = batches[0]
            check(first[0].ndim == 3 and set(labels.tolist()) <= {0, 1}, f"{name}: batch")

        refused = []  # the extras this venv lacks, each refused with its install hint
        if importlib.util.find_spec("torch") is None:
            try:
                packer.open_reader(store, batch_size=4, output="torch")
                check(False, "output='torch' without torch was not refused")
            except ModuleNotFoundError as e:
                check(install_hint("torch") in str(e), f"torch refusal: {e}")
            refused.append("torch")
        if importlib.util.find_spec("distributed") is None:
            dask = ("--dask", "local:1")
            line = run(BIN / "packer", "pack", images, Path(tmp) / "d.lmdb", *dask, ok=False).stderr
            check(line.count("\n") == 1 and install_hint("dask") in line, f"dask refusal: {line}")
            refused.append("dask")

    first_line = run(BIN / "packer", "--version").stdout.splitlines()[0]
    want = f"packer (images -> LMDB/HDF5 shards) {DISTRIBUTION} {version}"
    check(first_line == want, f"packer --version says {first_line!r}, not {want!r}")
    usage = run(sys.executable, "-m", "packer", "--help").stdout
    check(all(f"  {c} " in usage for c in ("pack", "inspect", "version")), usage)
    print(
        f"smoke: {DISTRIBUTION} {version} from {where.parent}: packed, verified and read "
        f"{count} images in LMDB and HDF5; --version, python -m packer --help; "
        f"missing extras refused with their install hints: {', '.join(refused) or 'none'}"
    )


if __name__ == "__main__":
    main()
