"""The reader under stress: thousands of open/iterate/stop/close cycles and many epochs leak no
thread, descriptor or memory; damaged records are named or skipped and reported; Ctrl-C in the
middle of an epoch ends the process promptly. (scripts/stress_reader.py runs the cycles at
larger counts.)"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from helpers import pack_three_ways, rewrite_lmdb_record, rewrite_manifest, write_image

from packer import open_reader, open_store
from packer.errors import CorruptRecordError, StoreError
from packer.store.record import Record

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "stress_reader.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stress_reader", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stress = _load_script()


@pytest.fixture(scope="module")
def small() -> Iterator[list[Path]]:
    """An LMDB and an HDF5 store of 24 small images, 2 shards each."""
    with stress.small_stores() as stores:
        yield stores


# -- thousands of cycles, many epochs -------------------------------------------------------


def test_thousands_of_reader_cycles_leak_no_thread_descriptor_or_memory(
    small: list[Path],
) -> None:
    """480 readers opened and stopped six ways (break, full epoch, exception, dropped without
    close, abandoned epoch, resume), on both backends: afterwards as many threads, descriptors
    and (within a few MB) as much memory as before, and not still growing. (20,000 of them in
    the slow test below.)"""
    figures = stress.run(small, 480, 0, warmup=60)
    before, halfway, after = figures["before"], figures["halfway"], figures["after"]
    assert after["packer_threads"] == [] and after["threads"] <= before["threads"]
    assert after["fds"] <= before["fds"]
    assert after["rss_mb"] - before["rss_mb"] < 16, figures
    assert after["rss_mb"] - halfway["rss_mb"] < 8, figures
    assert stress.leaks(figures) == []


def test_many_epochs_are_each_exactly_once_and_leak_nothing(small: list[Path]) -> None:
    figures = stress.run(small, 0, 60, warmup=6)  # 60 epochs of each store, each checked
    assert figures["epochs_checked"] == 120
    assert stress.leaks(figures) == [], figures


def test_readers_dropped_without_close_release_their_files(
    small: list[Path], tmp_path: Path
) -> None:
    """Readers and stores of 12 different stores, dropped without close: their shard files
    (LMDB maps, HDF5 handles) are released, not kept open for the life of the process."""
    copies = [_copy(store, tmp_path / str(i)) for i in range(6) for store in small]
    before = stress.snapshot()
    for store in copies:
        reader = open_reader(store, batch_size=4)
        batches = iter(reader)
        next(batches)
        del batches, reader
        opened = open_store(store)
        opened[len(opened) - 1]
        del opened
    after = stress.snapshot()
    assert after["fds"] <= before["fds"] and after["packer_threads"] == []


def test_the_leak_check_can_fail() -> None:
    files = ["/dev/null", "/dev/pts/0", "/dev/pts/0", "pipe:[7]", "pipe:[8]", "socket:[9]"]
    flat = {"threads": 1, "packer_threads": [], "fds": 6, "open": files, "rss_mb": 80.0}
    grown = {
        "threads": 3,
        "packer_threads": ["packer-prefetch"],
        "fds": 9,
        "open": [*files, "/data/s.lmdb/shard-00000.lmdb", "pipe:[11]", "pipe:[12]"],
        "rss_mb": 120.0,
    }
    assert stress.leaks({"before": flat, "halfway": flat, "after": flat}) == []
    found = stress.leaks({"before": flat, "halfway": flat, "after": grown})
    assert [f.split()[0] for f in found] == ["threads", "open", "RSS", "RSS"]
    # the report names what was left open
    assert found[1] == (
        "open descriptors 6 -> 9: /data/s.lmdb/shard-00000.lmdb, pipe:[11], pipe:[12]"
    )


@pytest.mark.slow
def test_the_stress_script_at_scale() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cycles", "20000", "--epochs", "200", "--json"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    figures = json.loads(done.stdout)
    assert done.returncode == 0 and figures["leaks"] == [], figures


# -- damaged records: named, or skipped and reported ---------------------------------------


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """40 images of 12 to 30 px in 2 shards: LMDB and HDF5 originals, HDF5 raw 8x8."""
    tmp = tmp_path_factory.mktemp("damaged")
    root = tmp / "images"
    for i in range(40):
        ext = ".png" if i % 2 else ".jpg"
        write_image(root / f"c{i % 4}" / f"{i:02d}{ext}", size=(12 + i % 19, 14), seed=i)
    return pack_three_ways(root, tmp, seed=2, shards=2)


def _copy(store: Path, to: Path) -> Path:
    import shutil

    return Path(shutil.copytree(store, to / store.name))


def _flip_payloads(store: Path, indices: list[int]) -> dict[int, tuple[str, str]]:
    """Flip one bit in the middle of each record's payload, in place (the manifest is left
    as it was: only the record CRCs can tell). Returns {index: (shard file, original path)}."""
    flipped = {}
    with open_store(store) as s:
        for index in indices:
            record = s.record(index)
            file = store / s.manifest.shards[s.locate(index)[0]].file
            payload = bytes(record.data)
            data = bytearray(file.read_bytes())
            at = data.find(payload)
            assert at >= 0 and data.find(payload, at + 1) < 0, "payload not unique in its shard"
            data[at + len(payload) // 2] ^= 0x10
            file.write_bytes(bytes(data))
            flipped[index] = (file.name, record.path)
    return flipped


@pytest.mark.parametrize("variant", ["lmdb", "hdf5", "raw"])
def test_flipped_payloads_are_named_or_skipped_and_reported(
    packed: dict[str, Path], variant: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = _copy(packed[variant], tmp_path)
    with open_store(store) as s:
        everything = Counter(record.path for record in s.records())
    flipped = _flip_payloads(store, [3, 17, 25, 38])  # both shards
    for seed in range(3):  # each order meets a different damaged record first
        with (
            open_reader(store, batch_size=6, seed=seed) as reader,
            pytest.raises(CorruptRecordError) as info,
        ):
            for _ in reader:
                pass
        error = info.value
        assert (error.shard, error.path) == flipped[error.index]
        assert "checksum mismatch" in error.reason
        message = str(error)
        assert str(store) in message and f"record {error.index} " in message
        assert error.path in message and error.shard in message
    caplog.set_level(logging.WARNING, logger="packer")
    # across_epochs=False: the next epoch, prefetched early, would log its own skips before
    # this epoch's warnings are counted.
    with open_reader(
        store, batch_size=6, on_error="skip", with_paths=True, across_epochs=False
    ) as reader:
        for epoch in range(2):
            caplog.clear()
            seen = Counter(p for _, _, paths in reader.epoch(epoch) for p in paths)
            assert seen == everything - Counter(path for _, path in flipped.values())
            assert reader.stats()["skipped"] == len(flipped)
            warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warnings) == len(flipped)
            for index, (shard, path) in flipped.items():
                assert any(f"record {index} in {shard} ({path})" in w for w in warnings)


def test_a_record_whose_payload_was_cut_short_is_named_or_skipped(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    """An LMDB record whose payload lost its second half (its labels and path intact): the
    CRC names it."""
    store = _copy(packed["lmdb"], tmp_path)
    manifest = json.loads((store / "manifest.json").read_text())
    index = manifest["shards"][0]["num_records"] + 2
    with open_store(store) as opened:
        data = bytes(opened.record(index).data)
    record = rewrite_lmdb_record(store, index, data=data[: len(data) // 2])
    assert isinstance(record, Record)
    with open_reader(store, batch_size=8) as reader, pytest.raises(CorruptRecordError) as info:
        list(reader)
    assert (info.value.index, info.value.path) == (index, record.path)
    with open_reader(store, batch_size=8, on_error="skip", with_paths=True) as reader:
        paths = [p for _, _, batch in reader for p in batch]
        assert record.path not in paths and len(paths) == 39
        assert reader.stats()["skipped"] == 1


@pytest.mark.parametrize("variant", ["lmdb", "hdf5"])
@pytest.mark.parametrize("reseal", [False, True])
def test_a_truncated_shard_is_named_even_when_skipping(
    packed: dict[str, Path], variant: str, reseal: bool, tmp_path: Path
) -> None:
    """Cut to half its size: refused by its size against the manifest, or, with the manifest
    made to agree (a hostile store), by the backend's own check. Skipping is per record; a
    shard that cannot be read is an error either way."""
    store = _copy(packed[variant], tmp_path)
    manifest = json.loads((store / "manifest.json").read_text())
    shard = store / manifest["shards"][1]["file"]
    os.truncate(shard, shard.stat().st_size // 2)
    if reseal:
        manifest["shards"][1]["bytes"] = shard.stat().st_size
        rewrite_manifest(store, manifest)
    for on_error in ("raise", "skip"):
        with open_reader(store, batch_size=8, on_error=on_error) as reader:
            with pytest.raises(StoreError) as info:
                list(reader)
            assert str(store) in str(info.value) and shard.name in str(info.value)
            if not reseal:
                assert "truncated or changed" in str(info.value)


# -- Ctrl-C ------------------------------------------------------------------------------

_ITERATE = """
import itertools, sys, time
from packer import open_reader
slow, seconds = sys.argv[2], float(sys.argv[3])
decode_in, _, sized = sys.argv[4].partition("+")  # "+size": decoded to 8x8
calls = itertools.count()
def transform(image):
    if slow == "transform" and next(calls) >= 20:  # the first batch comes quickly
        time.sleep(seconds)
    return image
with open_reader(
    sys.argv[1],
    batch_size=20,
    workers=2,
    transform=transform,
    decode_in=decode_in,
    size=(8, 8) if sized else None,
) as reader:
    for epoch in range(1000):
        for batch in reader.epoch(epoch):
            print("batch", flush=True)
            if slow == "consumer":
                time.sleep(seconds)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals")
@pytest.mark.parametrize(
    ("variant", "slow", "decode_in"),
    [
        ("lmdb", "transform", "threads"),
        ("lmdb", "transform", "processes"),
        ("lmdb", "transform", "processes+size"),  # parts written in place in their batch
        ("hdf5", "consumer", "threads"),
    ],
)
def test_ctrl_c_during_an_epoch_ends_the_process_promptly(
    packed: dict[str, Path], variant: str, slow: str, decode_in: str
) -> None:
    """SIGINT while decode threads or processes run a slow transform (each batch part is 10
    records x 0.4 s, so waiting for the part would take 4 s; a process cannot see the stop
    event, so the prefetch thread must give up on its part), or while the loop is in a slow
    step: KeyboardInterrupt, and the process is gone within 2 s, no thread left waiting."""
    child = subprocess.Popen(
        [sys.executable, "-c", _ITERATE, str(packed[variant]), slow, "0.4", decode_in],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "batch\n"
        time.sleep(0.3)  # into the next batch's work
        child.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, stderr = child.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        child.kill()
        child.wait()
    assert child.returncode in (-signal.SIGINT, 1, 130), stderr
    assert "KeyboardInterrupt" in stderr and "did not stop" not in stderr, stderr
    assert took < 2.0, f"{took:.1f}s after SIGINT: {stderr[-2000:]}"
