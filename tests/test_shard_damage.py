"""A damaged HDF5 shard is named in one line by `inspect --verify` and by the reader, and
neither hangs: libhdf5 looped forever on a zeroed global heap (issue 29, item 1)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import rewrite_as_legacy_hdf5, shard_checksum, write_image

from packer import PackOptions, pack
from packer.store.hdf5_store import checksummed_metadata
from packer.store.manifest import ShardInfo, read_manifest, write_manifest

# Reads one epoch; prints the packer error's one line, or "read N" if nothing was wrong.
READ_EPOCH = """
import sys
from packer import open_reader
from packer.errors import PackerError
try:
    with open_reader(sys.argv[1], batch_size=16, seed=0) as reader:
        print("read", sum(len(labels) for _, labels in reader.epoch(0)))
except PackerError as e:
    print(e)
"""


def _as_legacy(store: Path) -> None:
    """Rewrite every shard of ``store`` in the layout before metadata checksums; reseal."""
    manifest = read_manifest(store)
    for k, info in enumerate(manifest.shards):
        rewrite_as_legacy_hdf5(store / info.file)
        file = store / info.file
        manifest.shards[k] = ShardInfo.of_file(file, info.num_records, info.payload_bytes)
    write_manifest(store, manifest)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The issue's folder: 150 photos (noise JPEGs of 64-113 x 80 px) in three classes."""
    root = tmp_path_factory.mktemp("damage") / "photos"
    for i in range(150):
        write_image(root / f"c{i % 3}" / f"{i}.jpg", size=(80, 64 + i % 50), seed=i)
    return root


@pytest.mark.parametrize("layout", ["current", "legacy"])
def test_zeroed_bytes_name_the_shard_and_never_hang(
    photos: Path, tmp_path: Path, layout: str
) -> None:
    store = tmp_path / "hr4.h5"
    pack(photos, store, PackOptions(backend="hdf5", seed=1, shards=4, workers=1))
    shard = store / "shard-00001.h5"
    if layout == "legacy":
        _as_legacy(store)
        heap = shard.read_bytes().index(b"GCOL")  # the global heap of /paths
        assert heap < 12288 and heap + 4096 > 8192, "the zeroed bytes must hit the heap"
    assert checksummed_metadata(shard) == (layout == "current")
    with open(shard, "r+b") as f:
        f.seek(8192)
        f.write(bytes(4096))

    started = time.monotonic()
    verify = subprocess.run(
        [sys.executable, "-m", "packer", "inspect", str(store), "--verify"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 1, verify.stderr
    assert "Traceback" not in verify.stderr
    named = [line for line in verify.stderr.splitlines() if "shard-00001.h5" in line]
    assert named and "mismatch" in named[0]

    read = subprocess.run(
        [sys.executable, "-c", READ_EPOCH, str(store)], capture_output=True, text=True, timeout=60
    )
    assert read.returncode == 0, read.stderr
    assert "shard-00001.h5" in read.stdout and len(read.stdout.splitlines()) == 1, read.stdout
    assert time.monotonic() - started < 30


def test_zeroed_offsets_and_checksums_are_not_an_empty_record(photos: Path, tmp_path: Path) -> None:
    """Zeroed /offsets make every payload empty, and zeroed /crc32 then agree with them (the
    CRC-32 of nothing is 0): the fuzz's one wrong read, until an empty payload became damage."""
    import h5py

    from packer.errors import CorruptRecordError
    from packer.store.access import open_store

    store = tmp_path / "s.h5"
    pack(photos, store, PackOptions(backend="hdf5", seed=1, shards=1, workers=1))
    shard = store / "shard-00000.h5"
    with h5py.File(shard, "r+") as f:  # the columns are deflated: zeroed through HDF5
        for name in ("offsets", "crc32"):
            f[name][...] = 0
    manifest = read_manifest(store)
    data = shard.read_bytes()
    manifest.shards[0].bytes, manifest.shards[0].checksum = len(data), shard_checksum(data)
    write_manifest(store, manifest)
    with open_store(store) as opened, pytest.raises(CorruptRecordError, match="empty payload"):
        list(opened.indexed_records())
