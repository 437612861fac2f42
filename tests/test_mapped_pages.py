"""Reading an LMDB store does not leave the whole store mapped in the reading process.

The reads here go through the map (read_ahead=0): read ahead, values are taken from the
fetched bytes and the map holds little but the tree's pages."""

from __future__ import annotations

import mmap
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import write_image
from PIL import Image

from packer import PackOptions, open_reader, open_store, pack
from packer.reading.reader import Reader
from packer.store import lmdb_store
from packer.store.mapped_pages import map_span

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="pages are unmapped on Linux only"
)


def _mapped_kb(path: Path) -> int | None:
    """Resident kB of this process's map of the file at ``path``; None if it is not mapped."""
    total, inside, found = 0, False, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            inside = line.endswith(str(path))
            found = found or inside
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total if found else None


def _pack(tmp_path: Path, raw: bool) -> tuple[Path, dict[str, np.ndarray]]:
    """A one-shard LMDB store of 64 noise images; and each image's pixels by Pillow."""
    images = tmp_path / "images"
    paths = [write_image(images / "cls" / f"{i:03}.png", size=(64, 64), seed=i) for i in range(64)]
    store = tmp_path / "out.lmdb"
    pack(
        images, store, PackOptions(backend="lmdb", seed=0, raw=raw, size=(64, 64) if raw else None)
    )
    assert (store / "shard-00000.lmdb").stat().st_size > 600_000  # 64 x 12 kB (raw) or more
    return store, {
        p.relative_to(images).as_posix(): np.asarray(Image.open(p).convert("RGB")) for p in paths
    }


def _read_epoch(reader: Reader, epoch: int, expected: dict[str, np.ndarray]) -> None:
    seen = 0
    for batch, _, names in reader.epoch(epoch):
        for image, name in zip(batch, names):
            np.testing.assert_array_equal(image, expected[name])
            seen += 1
    assert seen == len(expected)


@pytest.mark.parametrize("raw", [True, False], ids=["columns layout", "records layout"])
def test_read_pages_are_unmapped_past_the_budget_and_reads_stay_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raw: bool
) -> None:
    monkeypatch.setattr(lmdb_store, "_MAPPED_BYTES", 64 << 10)
    store, expected = _pack(tmp_path, raw)
    shard = (store / "shard-00000.lmdb").resolve()
    # across_epochs=False: the map is measured with the reader idle. Going on into a third
    # epoch, it could be measured mid-read, where the pages of the reads since the last sweep
    # (and the pages the kernel maps around each fault) are still mapped: half the file, at
    # times, on a file this small.
    with open_reader(
        store, batch_size=16, shuffle=False, with_paths=True, read_ahead=0, across_epochs=False
    ) as reader:
        for epoch in range(2):  # the second epoch reads pages the first one unmapped
            _read_epoch(reader, epoch, expected)
        mapped = _mapped_kb(shard)
    assert mapped is not None, "the reader's map of the shard is not in /proc/self/smaps"
    # Without the sweep every page read stays mapped: the whole file.
    assert mapped * 1024 < shard.stat().st_size / 2


def test_maps_within_the_budget_stay_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unmapping what fits in the budget would only make the next epoch map it again."""
    monkeypatch.setattr(lmdb_store, "_MAPPED_BYTES", 2 << 20)  # twice the shard
    store, expected = _pack(tmp_path, raw=True)
    shard = (store / "shard-00000.lmdb").resolve()
    with open_reader(store, batch_size=16, shuffle=False, with_paths=True, read_ahead=0) as reader:
        _read_epoch(reader, 0, expected)
        lmdb_store._ENVIRONMENTS.count_read(str(shard), 2 << 20)  # as if as much again was read
        mapped = _mapped_kb(shard)
    assert mapped is not None
    assert mapped * 1024 > shard.stat().st_size * 3 / 4


def test_a_sweep_unmaps_only_the_maps_read_since_the_last_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unmapping walks a map's whole range: a store left open but not read is walked once,
    after it was opened, not at every sweep of the store being read."""
    monkeypatch.setattr(lmdb_store, "_MAPPED_BYTES", 64 << 10)
    read, expected = _pack(tmp_path / "read", raw=True)
    idle, _ = _pack(tmp_path / "idle", raw=True)
    dropped: list[tuple[int, int]] = []
    drop = lmdb_store.mapped_pages.drop_pages
    monkeypatch.setattr(
        lmdb_store.mapped_pages, "drop_pages", lambda span: (dropped.append(span), drop(span))
    )
    # across_epochs=False: a reader going on into a third epoch would be measured mid-read.
    options = {
        "batch_size": 16,
        "shuffle": False,
        "with_paths": True,
        "read_ahead": 0,
        "across_epochs": False,
    }
    with open_store(idle) as other, open_reader(read, **options) as reader:
        other.record(0)  # open, and read a little
        for epoch in range(2):
            _read_epoch(reader, epoch, expected)
        spans = {
            name: lmdb_store._ENVIRONMENTS._open[str((store / "shard-00000.lmdb").resolve())][2]
            for name, store in (("read", read), ("idle", idle))
        }
        read_kb = _mapped_kb((read / "shard-00000.lmdb").resolve())
    assert dropped.count(spans["read"]) >= 4  # two epochs of 768 kB, swept every 64 kB
    assert dropped.count(spans["idle"]) <= 1
    assert read_kb is not None and read_kb * 1024 < (read / "shard-00000.lmdb").stat().st_size / 2


def test_map_span_takes_only_a_read_only_shared_map_of_a_file(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(256)) * 64)  # 16 kB
    assert map_span(memoryview(np.zeros(4096, np.uint8)), 4096) is None  # anonymous memory
    with path.open("rb") as f:
        shared = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ, flags=mmap.MAP_SHARED)
        private = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ, flags=mmap.MAP_PRIVATE)
        writable = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    try:
        view = memoryview(shared)
        span = map_span(view[5000:6000], 8192)
        address = np.frombuffer(view, np.uint8).ctypes.data
        assert span == (address, 8192)  # from the map's start, at most the length asked
        assert map_span(view[:0], 8192) is None
        for other in (private, writable):  # dropping pages of these could lose data
            assert map_span(memoryview(other)[100:200], 8192) is None
        del view
    finally:
        for m in (shared, private, writable):
            m.close()


def test_sweeps_while_other_threads_open_and_close_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep holds the environments' lock: a map closed meanwhile (its addresses free for
    other memory) is never swept. One thread sweeps at every read while another opens, reads
    and closes a second store over and over; every pixel read by either must stay right."""
    monkeypatch.setattr(lmdb_store, "_MAPPED_BYTES", 64 << 10)
    swept, expected = _pack(tmp_path / "a", raw=True)
    churned, other = _pack(tmp_path / "b", raw=False)
    errors: list[BaseException] = []
    stop = threading.Event()

    def churn() -> None:
        try:
            while not stop.is_set():
                with open_reader(
                    churned, batch_size=32, shuffle=False, with_paths=True, read_ahead=0
                ) as r:
                    _read_epoch(r, 0, other)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        with open_reader(
            swept, batch_size=8, shuffle=True, seed=1, with_paths=True, read_ahead=0
        ) as reader:
            for epoch in range(30):
                _read_epoch(reader, epoch, expected)
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()
    assert not errors, errors
