"""A pack onto a full filesystem: a clear message, and nothing left behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import store_path, write_image

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

    from packer.store import ShardMeta, open_shard_writer, shard_name
    from packer.store.record import Record, checksum

    data = os.urandom(100_000)
    options = {"map_size": 64 << 20} if backend == "lmdb" else {}
    writer = None
    with pytest.raises((OSError, lmdb.Error)) as info:
        # HDF5's writer holds room for its metadata from the start: it may fail here.
        writer = open_shard_writer(
            backend, small_fs / shard_name(backend, 0), ShardMeta(0, 0), **options
        )
        for i in range(12):  # 1.2 MB into 512 KB
            writer.append(Record(data, (), f"{i}.jpg", checksum(data), (1, 1, 3), "JPEG"))
        writer.close()
    if writer is not None:
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


@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_another_process_filling_the_disk_mid_pack(
    tmp_path: Path, small_fs: Path, backend: str
) -> None:
    """Issue 29, item 3: `dd` fills the disk while a real `packer pack` writes its shards,
    at four moments. Each time: the one-line message and exit 1 (HDF5 segfaulted, or its
    raw RuntimeError ended the pack and deleted the finished shards), nothing under the
    store's name, and the same command, once the space is free, resumes and writes the
    store a pack with room to spare writes."""
    import hashlib

    subprocess.run(["mount", "-o", "remount,size=40m", str(small_fs)], check=True)
    root = tmp_path / "images"
    for i in range(48):
        write_image(root / "a" / f"{i}.png", size=(300, 300), seed=i)  # ~270 KB each: 13 MB
    out = store_path(small_fs, backend)
    # Shards of ~4 MB: each is written in a few 2 MB writes, into chunks HDF5 caches.
    command = [sys.executable, "-m", "packer", "pack", str(root), str(out)]
    command += ["--seed", "7", "--shards", "3", "--workers", "1"]
    reference = store_path(tmp_path, backend)
    subprocess.run([*command[:5], str(reference), *command[6:]], check=True, capture_output=True)

    def hashes(store: Path) -> list[str]:
        return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(store.glob("shard-*"))]

    fill = small_fs / "fill"
    for delay in (0.0, 0.1, 0.2, 0.3):
        packing = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(delay)
        filling = subprocess.Popen(
            ["dd", "if=/dev/zero", f"of={fill}", "bs=1M"], stderr=subprocess.DEVNULL
        )
        _, stderr = packing.communicate(timeout=120)
        filling.wait(timeout=120)
        message = stderr.decode().strip()
        fill.unlink()
        if packing.returncode == 0:  # finished before the disk was full: nothing to check
            shutil.rmtree(out)
            continue
        assert packing.returncode == 1, (packing.returncode, message[-2000:])
        assert len(message.splitlines()) == 1 and "no space left on device" in message, message
        assert not out.exists()
        resumed = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr
        assert hashes(out) == hashes(reference)
        shutil.rmtree(out)


# Appends 100 KB records to one HDF5 shard until the disk is full; says when 32 MB are in.
WRITE_UNTIL_FULL = """
import os, sys
from pathlib import Path
from packer.store.record import Record, checksum
from packer.store import ShardMeta, open_shard_writer
writer = open_shard_writer("hdf5", Path(sys.argv[1]), ShardMeta(0, 0), 4 << 20)
data = os.urandom(100_000)
record = Record(data, (), "x.jpg", checksum(data), (1, 1, 3), "JPEG")
try:
    for i in range(1 << 30):
        writer.append(record)
        if i == 320:
            print("writing", flush=True)
except OSError as e:
    writer.abort()
    print(e)
"""


def test_hdf5_writer_survives_the_disk_filling_under_it(small_fs: Path) -> None:
    """`dd` fills the disk while the writer is busy: libhdf5 crashed the process (a segfault
    as Python freed its objects) once one of its writes or flushes met the full disk."""
    subprocess.run(["mount", "-o", "remount,size=128m", str(small_fs)], check=True)
    fill = small_fs / "fill"
    for _ in range(3):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITE_UNTIL_FULL, str(small_fs / "shard.h5")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
        subprocess.run(["dd", "if=/dev/zero", f"of={fill}", "bs=1M"], capture_output=True)
        out, err = writer.communicate(timeout=60)
        assert writer.returncode == 0, err[-2000:]
        assert "No space left on device" in out, out + err
        fill.unlink()
        (small_fs / "shard.h5").unlink()
