"""A pack onto a full filesystem: a clear message, and nothing left behind."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import store_path, write_image

from packer import PackOptions, pack, read_manifest
from packer.errors import StoreError


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KB tmpfs, or a skip where this machine cannot mount one."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_full_disk_is_named_and_leaves_nothing(
    tmp_path: Path, small_fs: Path, backend: str
) -> None:
    root = tmp_path / "images"
    for i in range(12):
        write_image(root / "a" / f"{i}.png", size=(200, 200), seed=i)  # ~120 KB each: 1.4 MB
    out = store_path(small_fs, backend)
    with pytest.raises(
        StoreError,
        match=r"no space left on device \(.* bytes free\); free some space and pack again",
    ) as info:
        pack(root, out, PackOptions(backend=backend, seed=0, workers=1))
    assert str(out) in str(info.value)
    assert list(small_fs.iterdir()) == []  # no store, no .partial
    roomy = store_path(tmp_path, backend)  # once there is room, the same pack succeeds
    pack(root, roomy, PackOptions(backend=backend, seed=0, workers=1))
    assert read_manifest(roomy).num_records == 12


def test_writers_fail_cleanly_when_the_disk_fills_mid_shard(small_fs: Path, backend: str) -> None:
    """Past the pack's up-front check (another process may fill the disk): an error, no crash."""
    import lmdb

    from packer.record import Record, checksum
    from packer.store import ShardMeta, open_shard_writer, shard_name

    data = os.urandom(100_000)
    options = {"map_size": 64 << 20} if backend == "lmdb" else {}
    writer = open_shard_writer(
        backend, small_fs / shard_name(backend, 0), ShardMeta(0, 0), **options
    )
    with pytest.raises((OSError, lmdb.Error)) as info:
        for i in range(12):  # 1.2 MB into 512 KB
            writer.append(Record(data, (), f"{i}.jpg", checksum(data), (1, 1, 3), "JPEG"))
        writer.close()
    writer.abort()
    if backend == "hdf5":
        assert "No space left on device" in str(info.value)


def test_a_pack_that_filled_the_disk_resumes_once_there_is_room(
    tmp_path: Path, small_fs: Path, backend: str
) -> None:
    import hashlib

    # 12 MB: HDF5's writer keeps 8 MB free for its metadata, so a few shards fit, not all.
    subprocess.run(["mount", "-o", "remount,size=12m", str(small_fs)], check=True)
    root = tmp_path / "images"
    for i in range(32):
        write_image(root / "a" / f"{i}.png", size=(400, 400), seed=i)  # ~480 KB each: 15 MB
    options = PackOptions(backend=backend, seed=0, workers=1, shards=12)
    out = store_path(small_fs, backend)
    with pytest.raises(StoreError, match=r"no space left on device") as info:
        pack(root, out, options)
    assert "shards are finished and kept in" in str(info.value)
    assert "run the same command again to resume" in str(info.value)
    assert not out.exists()
    kept = len(list(small_fs.glob("*.partial/*.done.json")))
    assert kept >= 1

    subprocess.run(["mount", "-o", "remount,size=48m", str(small_fs)], check=True)
    resumed = pack(root, out, options)
    assert resumed.kept_shards == kept
    reference = pack(root, store_path(tmp_path, backend), options)

    def hashes(store: Path) -> list[str]:
        return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(store.glob("shard-*"))]

    assert hashes(out) == hashes(reference.store)
    assert [p.name for p in small_fs.iterdir()] == [out.name]  # no .partial left
