"""Stores made by others: a PyTables EArray file, as training scripts write them, read as is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import tables
from click.testing import CliRunner

from packer import open_reader, open_store
from packer.cli import cli
from packer.errors import StoreError


def _earray_file(
    path: Path, n: int = 50, grey: bool = False, extra: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Append batches to EArrays the way many data-prep scripts do."""
    rng = np.random.default_rng(0)
    shape = (12, 10) if grey else (12, 10, 3)
    images = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    labels = rng.integers(0, 5, n)
    with tables.open_file(str(path), "w") as f:
        samples = f.create_earray(
            "/", "samples", tables.UInt8Atom(), shape=(0, *shape), expectedrows=n
        )
        targets = f.create_earray("/", "labels", tables.Int64Atom(), shape=(0,), expectedrows=n)
        for start in range(0, n, 16):
            samples.append(images[start : start + 16])
            targets.append(labels[start : start + 16])
        if extra:
            f.create_array("/", "other_images", images[:, :2])
            f.create_array("/", "other_labels", labels.copy())
    return images, labels


def test_open_reader_reads_the_earrays_exactly_once(tmp_path: Path) -> None:
    path = tmp_path / "train.h5"
    images, labels = _earray_file(path)
    with open_reader(path, batch_size=16, seed=1, with_paths=True) as reader:
        seen = []
        for batch, batch_labels, paths in reader:
            assert batch.shape[1:] == (12, 10, 3) and batch.dtype == np.uint8
            for image, label, name in zip(batch, batch_labels, paths, strict=True):
                i = int(name.split("[")[1].rstrip("]"))
                assert np.array_equal(image, images[i]) and label == labels[i]
                seen.append(i)
    assert sorted(seen) == list(range(50)) and seen != list(range(50))


def test_open_store_grey_and_named_arrays(tmp_path: Path) -> None:
    path = tmp_path / "grey.h5"
    images, labels = _earray_file(path, grey=True, extra=True)
    with pytest.raises(StoreError, match="cannot tell which array holds the images"):
        open_store(path)
    store = open_store(path, images="/samples", labels="/labels")
    image, label = store[7]
    assert image.shape == (12, 10, 1) and np.array_equal(image[:, :, 0], images[7])
    assert label.tolist() == [labels[7]]
    assert store.manifest.storage.checksums is False
    store.close()
    with pytest.raises(StoreError, match="is not an integer array"):
        open_store(path, images="/samples", labels="/other_images")


def test_inspect_describes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "train.h5"
    _, labels = _earray_file(path)
    result = CliRunner().invoke(cli, ["inspect", str(path)])
    assert result.exit_code == 0, result.output
    assert "plain HDF5 file read as a raw store (images /samples, labels /labels)" in result.output
    assert "every image 12x10x3" in result.output
    data = json.loads(CliRunner().invoke(cli, ["inspect", str(path), "--json"]).output)
    counts = data["manifest"]["stats"]["label_counts"][0]
    assert {int(k): v for k, v in counts.items()} == dict(
        zip(*np.unique(labels, return_counts=True))
    )


def test_an_array_pytables_cannot_read_is_a_clear_error(tmp_path: Path) -> None:
    """h5py's lzf filter is one PyTables lacks: reading such images must say which record of
    which file failed, through packer's own error, not escape as a PyTables one."""
    path = tmp_path / "lzf.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=np.zeros((4, 8, 8, 3), np.uint8), compression="lzf")
        f.create_dataset("labels", data=np.arange(4))
    with open_store(path) as store:
        assert len(store) == 4  # the header reads; the chunks do not
        with pytest.raises(StoreError, match=r"record 0 in lzf\.h5 cannot be read: .*lzf\.h5"):
            store[0]
    with (
        open_reader(path, batch_size=2) as reader,
        pytest.raises(StoreError, match="cannot be read"),
    ):
        next(iter(reader))


def test_pytables_is_imported_only_for_a_file_that_needs_it(tmp_path: Path) -> None:
    """Every packer command and training script imports packer; PyTables was nearly a third
    of that import, and is needed only to read plain HDF5 files of arrays."""
    path = tmp_path / "train.h5"
    _earray_file(path)
    code = (
        "import sys, packer\n"
        "print('tables' in sys.modules)\n"
        f"packer.open_store({str(path)!r})\n"
        "print('tables' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
