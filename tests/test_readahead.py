"""Reading ahead: the bytes a reader takes from the read-ahead thread are the bytes of the
records it names, on every path (LMDB values with recorded places, LMDB values without, HDF5
flat and raw payloads, compressed HDF5), and an epoch read with it is the epoch read without.
How fast it reads is measured in benchmarks/bench_storage.py, not here."""

from __future__ import annotations

import mmap
import os
import threading
import time
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import numpy as np
import pytest
from helpers import held_by_a_thread, run_in_child, write_image

from packer import PackOptions, open_reader, open_store, pack
from packer.errors import CorruptRecordError
from packer.inspect.look import drop_cached
from packer.reading import produce, readahead
from packer.reading.epoch import chunk_spans
from packer.reading.lanes import Layout
from packer.reading.readahead import ReadAhead
from packer.store.base import Fetched
from packer.store.lmdb_store import META_KEY, PLACES
from packer.store.record import parse_block

BIG = (80, 64)  # noise JPEGs and PNGs of 4-16 KB: a few dozen a block
SMALL = (6, 5)  # ~200 B: one block a shard, padded to pages of its own


def _folder(root: Path, size: tuple[int, int], count: int = 90) -> Path:
    for i in range(count):
        ext = ".png" if i % 3 else ".jpg"
        write_image(root / f"c{i % 3}" / f"{i:03d}{ext}", size=size, seed=i)
    return root


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("readahead")
    big, small = _folder(tmp / "big", BIG), _folder(tmp / "small", SMALL)
    made = {
        "lmdb": (big, {"backend": "lmdb"}),
        "lmdb-small": (small, {"backend": "lmdb"}),
        "hdf5": (big, {"backend": "hdf5"}),
        "hdf5-gzip": (big, {"backend": "hdf5", "compression": "gzip"}),
        "hdf5-raw": (big, {"backend": "hdf5", "raw": True, "size": (16, 16)}),
        "lmdb-raw": (big, {"backend": "lmdb", "raw": True, "size": (32, 32)}),
    }
    out = {}
    for name, (source, options) in made.items():
        out[name] = tmp / f"{name}.{'lmdb' if options['backend'] == 'lmdb' else 'h5'}"
        pack(source, out[name], PackOptions(seed=5, shards=2, workers=1, **options))  # type: ignore[arg-type]
    return out


def _epochs(
    store: Path, epochs: int = 2, **options: object
) -> list[tuple[bytes, list[int], list[str]]]:
    """Every batch of ``epochs`` epochs: its images' bytes, labels and paths."""
    out = []
    with open_reader(store, batch_size=7, seed=1, chunk_size=9, with_paths=True, **options) as r:
        for epoch in range(epochs):
            for images, labels, paths in r.epoch(epoch):
                flat = (
                    b"".join(bytes(i) for i in images)
                    if isinstance(images, list)
                    else images.tobytes()
                )
                out.append((flat, labels.tolist(), list(paths)))
    return out


@pytest.mark.parametrize(
    "name", ["lmdb", "lmdb-small", "hdf5", "hdf5-gzip", "hdf5-raw", "lmdb-raw"]
)
@pytest.mark.parametrize("decode", [True, False])
def test_an_epoch_read_ahead_is_the_epoch_read_without(
    stores: dict[str, Path], name: str, decode: bool
) -> None:
    store = stores[name]
    if name.endswith("raw") and not decode:
        pytest.skip("raw pixels are the same either way")
    without = _epochs(store, read_ahead=0, decode=decode)
    for depth in (1, 2, 5):
        assert _epochs(store, read_ahead=depth, decode=decode) == without
    # Buffers of other sizes, a rank's share and a resumed epoch take other spans ahead.
    assert _epochs(store, read_ahead=3, decode=decode, buffer_chunks=3) == _epochs(
        store, read_ahead=0, decode=decode, buffer_chunks=3
    )
    shares = [_epochs(store, 1, read_ahead=2, rank=r, world_size=2, decode=decode) for r in (0, 1)]
    assert shares == [
        _epochs(store, 1, read_ahead=0, rank=r, world_size=2, decode=decode) for r in (0, 1)
    ]


def _record_fetches(monkeypatch: pytest.MonkeyPatch, seconds: float = 0.0) -> list[list[Any]]:
    """The readers' read-aheads from here on record the spans they read from the file, in
    order, one list each (taking ``seconds`` a span, as a slow disk would)."""
    fetches: list[list[Any]] = []

    class Recorded(readahead.ReadAhead):
        def __init__(self, *args: Any) -> None:
            fetches.append([])
            self._mine = fetches[-1]
            super().__init__(*args)

        def _fetch(self, store: Any, files: Any, span: Any, warmed: set[int]) -> Fetched | None:
            time.sleep(seconds)
            self._mine.append(span)
            return super()._fetch(store, files, span, warmed)

    monkeypatch.setattr(produce, "ReadAhead", Recorded)
    return fetches


@pytest.mark.parametrize("name", ["lmdb", "hdf5"])
def test_the_next_epochs_first_chunks_are_read_as_this_one_ends(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """An epoch's read-ahead runs on into the next epoch's first chunks and hands their bytes
    over: the next epoch reads them no second time, and every epoch's batches are those read
    without reading ahead. A reader that does not go on to the next epoch reads none of it."""
    fetches = _record_fetches(monkeypatch)
    store = stores[name]
    without = _epochs(store, epochs=3, read_ahead=0)
    assert _epochs(store, epochs=3, read_ahead=2) == without
    with open_reader(store, batch_size=7, seed=1, chunk_size=9) as reader:
        lanes = [reader.planner.lane(e, (), Layout(1, 1, 7, False), 0, 0) for e in range(4)]
    spans = [[s for piece in lane.pieces[0] for s in piece.spans] for lane in lanes]
    assert len(fetches) == 4  # the fourth: epoch 3, begun as the reader went on
    for epoch in (1, 2):
        first = spans[epoch][:2]
        assert fetches[epoch - 1][-2:] == first  # read as the epoch before it ended
        assert not set(first) & set(fetches[epoch])  # ... and not again
        assert fetches[epoch] == spans[epoch][2:] + spans[epoch + 1][:2]
    fetches.clear()
    assert (
        _epochs(store, epochs=1, read_ahead=2, across_epochs=False) == without[: len(without) // 3]
    )
    assert fetches == [spans[0]]


@pytest.mark.parametrize("name", ["lmdb-raw", "lmdb", "hdf5-raw"])
def test_an_epochs_first_window_from_the_disk_opens_as_its_chunks_are_read(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Nothing is read ahead of an epoch's first window: its first batch waits for the
    window's first chunk, not for all of them (epoch.opening_order)."""
    taken: list[int] = []

    class Counted(readahead.ReadAhead):
        def take(self, i: int) -> Fetched | None:
            taken.append(i)
            return super().take(i)

    monkeypatch.setattr(produce, "ReadAhead", Counted)
    options = {"batch_size": 6, "seed": 1, "chunk_size": 9, "buffer_chunks": 4}
    with open_reader(stores[name], read_ahead=2, decode=False, **options) as reader:
        lane = reader.planner.lane(0, (), Layout(1, 1, 6, False), 0, 0)
        assert len(lane.pieces[0][0].spans) == 4
        # The producer's batches, made in this thread. Raw pixels are finished as gathered;
        # encoded payloads go to the decode pool, which is kept a few batches ahead.
        batches = reader._producer.epochs(0, (), threading.Event())
        next(batches)
        assert taken == [0] if name.endswith("raw") else len(taken) < 4
        batches.close()


def test_a_decoded_batch_goes_once_done_not_once_the_pool_is_full(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decode pool keeps a few batches in hand, but a batch it has finished is not held
    back for the next gather, which may wait for the disk: here the second chunk takes half a
    second to arrive, and the first batch goes before the third chunk is asked for."""
    taken: list[int] = []

    class Slow(readahead.ReadAhead):
        def take(self, i: int) -> Fetched | None:
            taken.append(i)
            if i == 1:
                time.sleep(0.5)  # the first batch decodes meanwhile
            return super().take(i)

    monkeypatch.setattr(produce, "ReadAhead", Slow)
    options = {"batch_size": 6, "seed": 1, "chunk_size": 9, "buffer_chunks": 4, "workers": 2}
    with open_reader(stores["lmdb"], read_ahead=2, decode_in="threads", **options) as reader:
        batches = reader._producer.epochs(0, (), threading.Event())
        try:
            next(batches)
        finally:  # its read-ahead thread and store handles go now, pass or fail
            batches.close()
    # [0]: the batch was done before the gather asked for chunk 1. Held back for a full
    # pool, it would have waited for chunk 2 too.
    assert taken in ([0], [0, 1]), taken


def test_the_next_epochs_chunks_are_read_while_the_last_batches_are_taken(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read-ahead reads on into the next epoch until that epoch starts, not only until
    the last window is gathered: here every window is one batch, so the last is gathered at
    once, and only the batches still in flight, taken slowly, leave time to read the next
    epoch's first two chunks, which the next epoch then reads no second time."""
    fetches = _record_fetches(monkeypatch, seconds=0.1)  # a slow disk: two chunks take 0.2 s
    options = {"chunk_size": 9, "buffer_chunks": 1, "read_ahead": 2, "prefetch": 1}
    with open_reader(
        stores["hdf5"], batch_size=9, seed=1, workers=1, decode=False, **options
    ) as reader:
        lanes = [reader.planner.lane(e, (), Layout(1, 1, 9, False), 0, 0) for e in (0, 1)]
        spans = [[s for piece in lane.pieces[0] for s in piece.spans] for lane in lanes]
        batches = len(spans[0])  # one chunk, one window, one batch
        for number, _ in enumerate(reader.epoch(0)):
            if number == batches - 2:  # the last batch gathered and in flight: a slow step
                time.sleep(0.6)
        next(iter(reader.epoch(1)))
    assert fetches[0][-2:] == spans[1][:2]
    assert not set(spans[1][:2]) & set(fetches[1])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")  # on purpose
def test_a_read_ahead_is_let_go_untouched_in_a_forked_child(stores: dict[str, Path]) -> None:
    """A reader's read-ahead can be reading on into the next epoch when the process forks
    (DataLoader workers): the child has its object but not its thread, and maybe its lock
    held. There, leftover() and close() give up at once instead of waiting on that lock."""
    store = stores["hdf5"]
    with open_store(store) as s:
        spans = chunk_spans([info.num_records for info in s.manifest.shards], 9)
    ahead = ReadAhead(store, spans[:2], depth=2)

    def let_go() -> bool:  # neither call may wait
        given_up = ahead.leftover() == {}
        ahead.close()
        return given_up

    try:
        with held_by_a_thread(ahead._lock):  # as the read-ahead thread holds it, now and then
            run_in_child(let_go, seconds=10)
    finally:
        ahead.close()


def test_carried_bytes_are_used_only_for_their_own_span(stores: dict[str, Path]) -> None:
    """Bytes handed over are taken for the span they were read for, not read again; a span
    the new epoch does not read first (a resumed epoch, another plan) is read as usual."""
    store = stores["lmdb"]
    with open_store(store) as s:
        spans = chunk_spans([info.num_records for info in s.manifest.shards], 9)
    first = ReadAhead(store, spans[:1], depth=2, then=lambda: spans[1:3])
    assert first.take(0) is not None
    deadline = time.monotonic() + 10
    while len(first._ready) < 2 and time.monotonic() < deadline:  # both read ahead
        time.sleep(0.01)
    carried = first.leftover()
    assert set(carried) == {spans[1], spans[2]}
    second = ReadAhead(store, [spans[2], spans[3]], depth=2, carried=carried)
    try:
        assert second.take(0) is carried[spans[2]]
        fourth = second.take(1)
        assert fourth is not None and fourth.ranges != carried[spans[1]].ranges
    finally:
        second.close()


@pytest.mark.parametrize(
    "name", ["lmdb", "hdf5", "hdf5-raw", "lmdb-raw", "lmdb-small", "hdf5-gzip"]
)
def test_every_span_is_fetched_where_its_bytes_can_be_told(
    stores: dict[str, Path], name: str
) -> None:
    """Stores whose payloads' places are known (every LMDB block, however small its records,
    every uncompressed HDF5 chunk) are read ahead whole, and the shard readers take the
    payloads from those bytes; compressed HDF5 chunks are read ahead whole, for HDF5 to
    inflate from the page cache."""
    store = stores[name]
    with open_store(store) as s:
        spans = chunk_spans([info.num_records for info in s.manifest.shards], 9)
        ahead = ReadAhead(store, spans, depth=2)
        try:
            fetched = [ahead.take(i) for i in range(len(spans))]
        finally:
            ahead.close()
        assert all(f is not None for f in fetched)
        for span, got in zip(spans, fetched):
            shard = s.shard(span.shard)
            payload = sum(len(bytes(d)) for d in shard.read_block(span.start, span.stop).data)
            assert got is not None and (got.nbytes >= payload or name == "hdf5-gzip")
            taken = shard.read_block(span.start, span.stop, None, got)
            plain = shard.read_block(span.start, span.stop)
            assert taken.paths == plain.paths and np.array_equal(taken.labels, plain.labels)
            assert [bytes(a) for a in taken.data] == [bytes(b) for b in plain.data]


@pytest.mark.parametrize("name", ["lmdb", "hdf5", "hdf5-raw", "lmdb-raw"])
def test_payloads_are_taken_from_the_fetched_bytes(stores: dict[str, Path], name: str) -> None:
    """Not read again: a byte changed in the fetched copy shows in the record read with it
    (and only there), at the place the shard reader computed."""
    with open_store(stores[name]) as s:
        spans = chunk_spans([info.num_records for info in s.manifest.shards], 9)
        ahead = ReadAhead(stores[name], spans[:1], depth=1)
        got = ahead.take(0)
        ahead.close()
        assert got is not None
        span = spans[0]
        shard = s.shard(span.shard)
        plain = [bytes(d) for d in shard.read_block(span.start, span.stop).data]
        offset, data = got.ranges[0]
        changed = bytearray(data)
        at = changed.find(plain[4]) + len(plain[4]) // 2  # inside the span's fifth payload
        assert at > len(plain[4]) // 2
        changed[at] ^= 0xFF
        taken = shard.read_block(
            span.start, span.stop, None, Fetched([(offset, memoryview(changed))])
        )
        differ = [i for i, (a, b) in enumerate(zip(plain, map(bytes, taken.data))) if a != b]
        assert len(differ) == 1, differ


@pytest.mark.parametrize("name", ["lmdb", "lmdb-small", "hdf5"])
def test_chunks_read_ahead_live_in_maps_of_their_own(stores: dict[str, Path], name: str) -> None:
    """The chunks read ahead are anonymous maps of their own, which go back to the system
    once let go: from malloc, a long read's buffers fragmented its heap until a memory cap
    one store fitted in killed a mixture of two. The payloads a shard reader takes from them
    are copies, so the chunk can go (or change) once they are taken."""
    with open_store(stores[name]) as s:
        span = chunk_spans([info.num_records for info in s.manifest.shards], 9)[0]
        ahead = ReadAhead(stores[name], [span], depth=1)
        got = ahead.take(0)
        ahead.close()
        assert got is not None and got.ranges
        assert all(isinstance(data.obj, mmap.mmap) for _, data in got.ranges)
        block = s.shard(span.shard).read_block(span.start, span.stop, None, got)
        assert len(block.data) == len(span)
        taken = [bytes(p) for p in block.data]
        for _, data in got.ranges:
            data[:] = bytes(len(data))
        assert [bytes(p) for p in block.data] == taken


@pytest.mark.parametrize("name", ["lmdb", "lmdb-small"])
def test_lmdb_value_places_are_where_the_blocks_are(stores: dict[str, Path], name: str) -> None:
    """The places a pack records are checked against the file's own bytes: each (offset,
    length) holds the LMDB value that a cursor returns for that block, small ones too."""
    shard = next(stores[name].glob("shard-*.lmdb"))
    data = shard.read_bytes()
    env = lmdb.open(str(shard), subdir=False, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            meta = msgpack.unpackb(txn.get(META_KEY))
            places = np.frombuffer(meta[PLACES], "<u8").reshape(-1, 2)
            starts = np.frombuffer(meta["block_starts"], "<u8").tolist()
            assert len(places) == len(starts) > 0
            ends = [*starts[1:], meta["num_records"]]
            for (offset, length), first, end in zip(places.tolist(), starts, ends):
                value = txn.get(b"%010d" % first)
                assert data[offset : offset + length] == value
                labels = meta["num_label_columns"]
                assert len(parse_block(value, end - first, labels).paths) == end - first
    finally:
        env.close()


def test_a_store_larger_than_memory_is_dropped_from_the_cache_as_it_is_read(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With less memory than the store, fetched bytes leave the page cache once copied;
    the epoch is the same."""
    expected = _epochs(stores["lmdb"], read_ahead=0)
    monkeypatch.setattr(readahead, "memory_for_cache", lambda: 1)
    ahead = ReadAhead(stores["lmdb"], [], depth=1)
    assert ahead._uncached  # the policy the reader's own read-ahead took
    ahead.close()
    assert _epochs(stores["lmdb"], read_ahead=2) == expected


def test_memory_for_cache_is_what_this_machine_has() -> None:
    available = readahead.memory_for_cache()
    meminfo = Path("/proc/meminfo")
    if not meminfo.is_file():
        pytest.skip("no /proc/meminfo here")
    total = int(meminfo.read_text().split("MemTotal:")[1].split()[0]) << 10
    assert 0 < available <= total


def test_a_damaged_value_read_ahead_is_named(tmp_path: Path) -> None:
    """A byte flipped in a payload is reported naming the record, read ahead or not."""
    source = _folder(tmp_path / "src", BIG, count=20)
    store = tmp_path / "s.lmdb"
    pack(source, store, PackOptions(seed=0, workers=1))
    with open_store(store) as s:
        victim = s.record(7, verify=False)
        middle = len(victim.data) // 2
        target = bytes(victim.data[middle : middle + 8])
    shard = next(store.glob("shard-*.lmdb"))
    data = bytearray(shard.read_bytes())
    at = data.find(target)
    assert at > 0 and data.find(target, at + 1) == -1
    data[at] ^= 0xFF
    shard.write_bytes(bytes(data))
    for depth in (0, 2):
        with (
            open_reader(store, batch_size=4, read_ahead=depth) as reader,
            pytest.raises(CorruptRecordError, match=victim.path),
        ):
            for _ in reader.epoch(0):
                pass


def test_the_read_ahead_thread_ends_with_its_epoch(stores: dict[str, Path]) -> None:
    with open_reader(stores["hdf5"], batch_size=5, read_ahead=2) as reader:
        for _ in zip(range(2), reader.epoch(0)):
            pass  # an epoch left early
        for _ in reader.epoch(1):
            pass
    names = [t.name for t in threading.enumerate()]
    assert "packer-read-ahead" not in names, names


@pytest.mark.parametrize("memory, expected", [(1, True), (1 << 60, False)])
def test_by_default_a_store_is_read_ahead_when_memory_cannot_hold_it(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch, memory: int, expected: bool
) -> None:
    """A store the page cache can hold is read from memory after its first epoch, where
    reading ahead would only add a copy; one it cannot hold is read ahead."""
    monkeypatch.setattr(produce, "memory_for_cache", lambda: memory)
    seen = set()
    with open_reader(stores["lmdb"], batch_size=5, seed=1) as reader:
        for _ in reader.epoch(0):
            seen |= {t.name for t in threading.enumerate()}
    assert ("packer-read-ahead" in seen) is expected


def test_each_store_of_a_mixture_reads_ahead_its_own_window(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stores of a mixture share the shuffle buffer (6 and 2 of 8 chunks at 0.75/0.25):
    each reads its own next window ahead, not a whole buffer's."""
    depths: dict[Path, set[int]] = {}

    class Recorded(readahead.ReadAhead):
        def __init__(self, path: Path, spans: Any, depth: int, *handover: Any) -> None:
            depths.setdefault(path, set()).add(depth)
            super().__init__(path, spans, depth, *handover)

    monkeypatch.setattr(produce, "ReadAhead", Recorded)
    monkeypatch.setattr(produce, "memory_for_cache", lambda: 1 << 40)
    monkeypatch.setattr(produce, "store_bytes", lambda path: (1 << 40) + 1)
    mix = [stores["lmdb"], stores["hdf5"]]
    options = {"weights": [0.75, 0.25], "chunk_size": 2, "buffer_chunks": 8, "decode": False}
    with open_reader(mix, batch_size=8, seed=1, **options) as reader:
        assert reader.planner.window_chunks == [6, 2]
        for _ in reader.epoch(0):
            pass
    assert depths == {stores["lmdb"]: {6}, stores["hdf5"]: {2}}


def test_auto_depth_reads_a_whole_window_ahead_as_memory_allows() -> None:
    mb = 1 << 20
    assert readahead.auto_depth(8, 25 * mb, 8 << 30) == 8  # the next window, whole
    assert readahead.auto_depth(8, 25 * mb, 400 * mb) == 8  # 200 MB: all eight chunks
    # half of what the reader's own buffers leave: 150 MB, 6 chunks
    assert readahead.auto_depth(8, 25 * mb, 400 * mb, reserved=100 * mb) == 6
    assert readahead.auto_depth(8, 25 * mb, 765 * mb, reserved=600 * mb) == 3  # 82 MB
    assert readahead.auto_depth(8, 25 * mb, 765 * mb, reserved=700 * mb) == readahead.MIN_DEPTH
    assert readahead.auto_depth(8, 0, 10 * mb) == 8  # unknown chunk bytes: the window


@pytest.mark.parametrize("memory, depth", [(1 << 40, 3), (1, readahead.MIN_DEPTH)])
def test_by_default_the_next_window_is_read_ahead_as_memory_allows(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch, memory: int, depth: int
) -> None:
    """Decoding a window takes as long as reading one: the next window is read while this one
    decodes, where memory allows (here: a store taken as larger than the memory there is)."""
    depths = []

    class Recorded(readahead.ReadAhead):
        def __init__(self, path: Path, spans: Any, depth: int, *handover: Any) -> None:
            depths.append(depth)
            super().__init__(path, spans, depth, *handover)

    monkeypatch.setattr(produce, "ReadAhead", Recorded)
    monkeypatch.setattr(produce, "memory_for_cache", lambda: memory)
    monkeypatch.setattr(produce, "store_bytes", lambda path: memory + 1)
    without = _epochs(stores["lmdb"], epochs=1, buffer_chunks=3, read_ahead=0, decode=False)
    assert _epochs(stores["lmdb"], epochs=1, buffer_chunks=3, decode=False) == without
    assert depths and set(depths) == {depth}  # the epoch, and the next one prefetched


def _out_of_memory_or_skip(files: list[Path]) -> None:
    """``files`` (written and synced) dropped from the page cache, or the test skipped."""
    drop_cached(files)
    share = readahead.share_not_in_memory(files)
    if share is None:
        pytest.skip("this system cannot tell which pages are in memory (no RWF_NOWAIT)")
    if share < 0.9:
        pytest.skip(f"this file system kept the pages in memory ({share:.0%} were dropped)")


def test_share_not_in_memory_tells_pages_read_from_pages_dropped(tmp_path: Path) -> None:
    files = [tmp_path / "a.bin", tmp_path / "b.bin"]
    for i, file in enumerate(files):
        with file.open("wb") as f:
            f.write(os.urandom((i + 1) << 20))
            os.fsync(f.fileno())  # dirty pages would stay in memory
    _out_of_memory_or_skip(files)
    files[1].read_bytes()  # two thirds of the bytes, back in memory
    assert readahead.share_not_in_memory(files) == pytest.approx(1 / 3, abs=0.1)
    files[0].read_bytes()
    assert readahead.share_not_in_memory(files) == 0.0
    assert readahead.share_not_in_memory([]) is None


def test_by_default_a_store_that_fits_in_memory_is_read_ahead_while_it_is_not_there(
    stores: dict[str, Path],
) -> None:
    """The first epoch from a disk is read ahead, so reading and decoding overlap; it is kept
    in memory, and the epochs after it are read from there, without the copy."""
    store = stores["hdf5"]
    _out_of_memory_or_skip(sorted(store.glob("shard-*")))
    seen: list[set[str]] = []
    with open_reader(store, batch_size=5, seed=1, chunk_size=9) as reader:
        for epoch in range(2):
            seen.append(set())
            for _ in reader.epoch(epoch):
                seen[-1] |= {t.name for t in threading.enumerate()}
    assert ["packer-read-ahead" in names for names in seen] == [True, False]


def test_a_range_is_read_tail_first_so_the_kernels_read_ahead_stops_at_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last ``tail`` bytes of a range come first, in one request on the descriptor the
    kernel does not read ahead on, then the rest front to back on the other: read last, the
    tail met the pages the kernel had marked to read on, and it read on past the range."""
    data = os.urandom(3 << 20)
    path = tmp_path / "shard"
    path.write_bytes(data)
    fds = readahead._Descriptors(path)
    fds.tail = 1 << 20
    calls: list[tuple[int, int, int]] = []
    preadv = os.preadv

    def recorded(fd: int, buffers: list[memoryview], offset: int, *flags: int) -> int:
        calls.append((fd, offset, sum(len(b) for b in buffers)))
        return preadv(fd, buffers, offset, *flags)

    monkeypatch.setattr(os, "preadv", recorded)
    try:
        got = readahead._read(fds, 4096, (2 << 20) + 100)
    finally:
        fds.close()
    assert got is not None and bytes(got) == data[4096 : 4096 + (2 << 20) + 100]
    end = 4096 + (2 << 20) + 100
    assert calls[0] == (fds.exact, end - (1 << 20), 1 << 20)
    rest = calls[1:]
    assert {fd for fd, _, _ in rest} == {fds.sequential}
    assert [offset for _, offset, _ in rest] == sorted(offset for _, offset, _ in rest)
    assert rest[0][1] == 4096 and rest[-1][1] + rest[-1][2] == end - (1 << 20)
