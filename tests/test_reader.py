"""open_reader: exactly-once epochs, reproducible order, resume, errors and clean shutdown."""

from __future__ import annotations

import gc
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import pack_three_ways, store_path, write_image

from packer import PackOptions, open_reader, open_store, pack
from packer.errors import CorruptRecordError, StoreError, UsageError
from packer.imaging import resizing
from packer.reading.batching import Ordered, Window, finish_batch


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 120-image source packed three ways: LMDB and HDF5 originals, and HDF5 raw 8x8."""
    tmp = tmp_path_factory.mktemp("reader")
    root = tmp / "images"
    for i in range(120):
        ext = ".png" if i % 4 == 0 else ".jpg"
        write_image(root / f"c{i % 3}" / f"{i:03d}{ext}", size=(10 + i % 7, 12), seed=i)
    return pack_three_ways(root, tmp, seed=3, shards=3)


@pytest.fixture(params=["lmdb", "hdf5", "raw"])
def store(request: pytest.FixtureRequest, stores: dict[str, Path]) -> Path:
    return stores[request.param]


def _paths(reader: Any, epoch: int) -> list[str]:
    return [p for _, _, paths in reader.epoch(epoch) for p in paths]


def _state_after(store: Path, options: dict[str, Any], epoch: int, batches: int) -> dict[str, Any]:
    """The state of a reader with ``options`` that has yielded ``batches`` of ``epoch``."""
    with open_reader(store, **options) as r:
        it = r.epoch(epoch)
        for _ in range(batches):
            next(it)
        return r.state_dict()


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("packer-")}


def _no_packer_threads() -> bool:
    deadline = time.monotonic() + 5
    while _threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _threads()


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [1, 2])
def test_every_record_exactly_once_per_epoch(
    store: Path, seed: int, world: int, workers: int
) -> None:
    everything = [r.path for r in open_store(store).records()]
    for epoch in range(2):
        seen: list[str] = []
        for rank in range(world):
            for worker in range(workers):
                with open_reader(
                    store,
                    batch_size=16,
                    seed=seed,
                    rank=rank,
                    world_size=world,
                    chunk_size=7,
                    buffer_chunks=3,
                    remainder="uneven",
                    worker=(worker, workers),
                    with_paths=True,
                ) as r:
                    got = _paths(r, epoch)
                    assert len(got) == r.records_per_epoch()
                    seen += got
        assert Counter(seen) == Counter(everything)


def test_drop_gives_equal_disjoint_shares(store: Path) -> None:
    shares = []
    for rank in range(7):
        with open_reader(store, batch_size=5, rank=rank, world_size=7, with_paths=True) as r:
            shares.append(_paths(r, 0))
    assert {len(s) for s in shares} == {120 // 7}
    flat = [p for s in shares for p in s]
    assert len(set(flat)) == len(flat)


def test_pad_gives_equal_shares_that_cover_every_record(store: Path) -> None:
    shares = []
    for rank in range(7):
        with open_reader(
            store, batch_size=5, rank=rank, world_size=7, remainder="pad", with_paths=True
        ) as r:
            shares.append(_paths(r, 0))
    assert {len(s) for s in shares} == {-(-120 // 7)}  # ceil: 18 each, 126 in all
    counts = Counter(p for s in shares for p in s)
    assert len(counts) == 120  # every record read
    assert sorted(counts.values()) == [1] * 114 + [2] * 6  # the shortfall repeats 6 records


def test_order_is_reproducible_and_changes_each_epoch(store: Path) -> None:
    def run(seed: int, epoch: int) -> list[str]:
        with open_reader(store, batch_size=10, seed=seed, with_paths=True, chunk_size=5) as r:
            return _paths(r, epoch)

    assert run(1, 0) == run(1, 0)
    assert run(1, 0) != run(1, 1) and run(1, 0) != run(2, 0)
    assert sorted(run(1, 0)) == sorted(run(1, 1))
    with open_reader(store, batch_size=10, shuffle=False, with_paths=True) as r:
        assert _paths(r, 0) == [rec.path for rec in open_store(store).records()]


def test_batches_images_and_labels_match_the_store(store: Path) -> None:
    with open_store(store) as s:
        truth = {s.record(i).path: s[i] for i in range(len(s))}
    with open_reader(store, batch_size=32, with_paths=True) as r:
        sizes = []
        for images, labels, paths in r.epoch(0):
            sizes.append(len(paths))
            assert labels.shape == (len(paths),) and labels.dtype == np.int64
            for image, label, path in zip(images, labels, paths, strict=True):
                assert np.array_equal(image, truth[path][0])
                assert label == truth[path][1][0] == int(path[1])
        assert sizes == [32, 32, 32, 24] and len(r) == 4
    with open_reader(store, batch_size=32, drop_last=True) as r:
        assert [len(labels) for _, labels in r] == [32, 32, 32] and len(r) == 3


def test_raw_fixed_shape_batches_are_one_array(stores: dict[str, Path]) -> None:
    with open_reader(stores["raw"], batch_size=50) as r:
        images, labels = next(iter(r))
        assert (
            isinstance(images, np.ndarray)
            and images.shape == (50, 8, 8, 3)
            and images.dtype == np.uint8
        )


def test_raw_windows_are_reused_across_epochs_and_batches_stay_copies(
    stores: dict[str, Path],
) -> None:
    """The reader reads raw windows into one array, kept from window to window and epoch to
    epoch (3 shards of 40 in chunks of 7: windows of 12 to 21 records); batches are copies
    of it, so a batch kept from an earlier epoch still holds its own records."""
    with open_store(stores["raw"]) as s:
        truth = {r.path: np.frombuffer(bytes(r.data), np.uint8) for r in s.records()}
    options = dict(batch_size=16, chunk_size=7, buffer_chunks=3, seed=1, with_paths=True)
    # across_epochs=False: each epoch's producer ends with it and puts its window array back
    # (prefetching the next epoch, the same thread would already have taken it again)
    with open_reader(stores["raw"], across_epochs=False, **options) as r:  # type: ignore[arg-type]
        kept = [(images, paths) for e in range(3) for images, _, paths in r.epoch(e)]
        ((array,),) = r._producer._spare_windows
        assert array.base is None  # a whole array, not the last window's slice of it
        for _ in r.epoch(3):
            pass
        ((again,),) = r._producer._spare_windows
        assert again is array
    assert len(kept) == 3 * 8
    for images, paths in kept:
        for image, path in zip(images, paths):
            assert np.array_equal(image.reshape(-1), truth[path]), path


@pytest.mark.parametrize("fit", ["crop", "pad", "stretch"])
def test_size_resizes_as_packing_at_that_size_does(
    stores: dict[str, Path], tmp_path: Path, fit: str
) -> None:
    """Read-time ``size`` gives the pixels a pack with ``--raw --size`` stores (the same
    reduced-scale JPEG decode and resize), as one N x H x W x C array per batch."""
    sized = tmp_path / "sized.h5"
    options = PackOptions(backend="hdf5", raw=True, size=(6, 5), fit=fit, workers=1)
    pack(stores["lmdb"].parent / "images", sized, options)
    with open_reader(sized, batch_size=120, with_paths=True, shuffle=False) as r:
        images, labels, paths = next(iter(r))
        packed = {p: (im, label) for p, im, label in zip(paths, images, labels, strict=True)}
    for name in ("lmdb", "hdf5"):
        with open_reader(stores[name], batch_size=32, size=(6, 5), fit=fit, with_paths=True) as r:
            seen = 0
            for images, labels, paths in r.epoch(0):
                assert isinstance(images, np.ndarray) and images.shape == (len(paths), 6, 5, 3)
                for image, label, path in zip(images, labels, paths, strict=True):
                    assert np.array_equal(image, packed[path][0]) and label == packed[path][1]
                seen += len(paths)
            assert seen == 120


def test_size_resizes_raw_pixels_and_runs_before_the_transform(stores: dict[str, Path]) -> None:
    with open_store(stores["raw"]) as s:
        truth = {s.record(i).path: s[i][0] for i in range(len(s))}
    shapes = []
    with open_reader(
        stores["raw"],
        batch_size=40,
        size=(4, 6),
        fit="stretch",
        with_paths=True,
        transform=lambda im: (shapes.append(im.shape), im)[1],
        across_epochs=False,  # no prefetch of the next epoch's batches: exact counts
    ) as r:
        for images, _, paths in r:
            assert images.shape == (len(paths), 4, 6, 3)
            for image, path in zip(images, paths, strict=True):
                expected = resizing.resize(truth[path], size=(4, 6), fit="stretch")
                assert np.array_equal(image, expected)
    assert set(shapes) == {(4, 6, 3)} and len(shapes) == 120


def test_transform_decode_false_and_collate(stores: dict[str, Path]) -> None:
    with open_reader(stores["lmdb"], batch_size=8, transform=lambda im: im[:4, :4]) as r:
        images, _ = next(iter(r))
        assert images.shape == (8, 4, 4, 3)  # equal shapes after the transform: stacked
    with open_reader(stores["lmdb"], batch_size=8, decode=False) as r:
        images, _ = next(iter(r))
        assert all(isinstance(b, bytes) and b[:2] in (b"\xff\xd8", b"\x89P") for b in images)
    with open_reader(stores["lmdb"], batch_size=8, collate=len) as r:
        assert next(iter(r))[0] == 8


def test_resume_mid_epoch_equals_an_uninterrupted_run(store: Path) -> None:
    options = dict(batch_size=9, seed=5, chunk_size=6, buffer_chunks=2, with_paths=True)
    with open_reader(store, **options) as r:
        full = [paths for _, _, paths in r.epoch(1)]
    with open_reader(store, **options) as r:
        it = r.epoch(1)
        first = [next(it)[2] for _ in range(5)]
        state = r.state_dict()
    assert (state["epoch"], state["records_done"], state["seed"]) == (1, 45, 5)
    with open_reader(store, **options) as resumed:
        resumed.load_state_dict(state)
        rest = [paths for _, _, paths in resumed]
    assert first + rest == full
    with (
        open_reader(store, **{**options, "seed": 6}) as other,
        pytest.raises(UsageError, match="seed 5"),
    ):
        other.load_state_dict(state)


def test_exception_in_a_worker_reaches_the_loop_with_its_traceback(stores: dict[str, Path]) -> None:
    def explode(image: np.ndarray) -> np.ndarray:
        raise RuntimeError("boom in transform")

    with (
        open_reader(stores["lmdb"], batch_size=8, transform=explode) as r,
        pytest.raises(RuntimeError) as info,
    ):
        next(iter(r))
    text = "".join(traceback.format_exception(info.value))
    assert "boom in transform" in text and "explode" in text  # the frame where it happened
    assert "packer: in transform of record" in text
    assert _no_packer_threads()


def _flip_a_payload_byte(store: Path) -> str:
    """Flip one byte inside record 5's payload, in place. Returns that record's path."""
    with open_store(store) as s:
        record = s.record(5)
        shard, _ = s.locate(5)
        shard_file = store / s.manifest.shards[shard].file
        needle = bytes(record.data[-40:])
    data = bytearray(shard_file.read_bytes())
    at = data.find(needle)
    assert at > 0 and data.find(needle, at + 1) == -1
    data[at + 10] ^= 0x01
    shard_file.write_bytes(bytes(data))
    return record.path


@pytest.mark.parametrize("raw", [False, True], ids=["encoded", "raw-8x8"])
@pytest.mark.parametrize("backend", ["lmdb", "hdf5"])
def test_bit_flip_is_named_or_skipped(tmp_path: Path, backend: str, raw: bool) -> None:
    """Raw pixels of one shape are checked as they are read, the rest as batches finish."""
    root = tmp_path / "imgs"
    for i in range(30):
        write_image(root / "a" / f"{i}.png", size=(20, 20), seed=i)
    out = store_path(tmp_path, backend)
    shape = {"raw": True, "size": (8, 8)} if raw else {}
    pack(root, out, PackOptions(backend=backend, seed=0, workers=2, **shape))
    bad_path = _flip_a_payload_byte(out)
    with open_reader(out, batch_size=30) as r, pytest.raises(CorruptRecordError) as info:
        list(r)
    assert info.value.path == bad_path and info.value.index == 5
    assert str(out) in str(info.value) and "checksum mismatch" in str(info.value)
    with open_reader(out, batch_size=30, on_error="skip", with_paths=True) as r:
        paths = [p for _, _, ps in r for p in ps]
        assert len(paths) == 29 and bad_path not in paths and r.stats()["skipped"] == 1


@pytest.mark.parametrize(
    "how", ["break", "exception", "close", "gc", "done-close", "done-gc", "done-one-epoch"]
)
def test_every_shutdown_path_stops_the_threads(stores: dict[str, Path], how: str) -> None:
    """ "done-": after a whole epoch, the producer goes on with the next (across_epochs)
    until the reader is closed or collected; with across_epochs=False it just ends."""
    assert _no_packer_threads()
    one_epoch = how == "done-one-epoch"
    reader = open_reader(stores["hdf5"], batch_size=4, prefetch=2, across_epochs=not one_epoch)
    if how.startswith("done"):
        assert sum(1 for _ in reader) == 30
        if how == "done-close":
            reader.close()
        elif how == "done-gc":
            del reader
            gc.collect()
    elif how == "break":
        for _ in reader:
            break
    elif how == "exception":
        with pytest.raises(ValueError, match="training failed"), reader:
            for _ in reader:
                raise ValueError("training failed")
    elif how == "close":
        it = iter(reader)
        next(it)
        reader.close()
    elif how == "gc":
        it = iter(reader)
        next(it)
        del it, reader
        gc.collect()
    assert _no_packer_threads()


@pytest.mark.parametrize("kind", ["lmdb", "raw"])
def test_epochs_prefetched_ahead_are_the_epochs_a_new_reader_gives(
    stores: dict[str, Path], kind: str
) -> None:
    """The producer runs on into the next epoch; what it made ahead is that epoch exactly,
    and anything but the next epoch (a repeat, a skip, a resume) starts afresh."""
    options: dict[str, Any] = {"batch_size": 7, "with_paths": True, "chunk_size": 5, "seed": 3}
    with open_reader(stores[kind], **options) as fresh:
        expected = {e: _paths(fresh, e) for e in (0, 1, 2, 5)}
    with open_reader(stores[kind], **options) as r:
        assert _paths(r, 0) == expected[0]
        queue = r._active._shared.queue if r._active is not None else None
        deadline = time.monotonic() + 5
        while queue is not None and not queue.qsize() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert queue is not None and queue.qsize() > 0  # epoch 1, made without being asked
        ahead = r._active
        assert _paths(r, 1) == expected[1]
        assert r._active is ahead  # that work was used, not redone
        assert r.stats()["images"] == 120 and r.stats()["batches"] == 18
        assert _paths(r, 1) == expected[1]  # a repeat
        assert _paths(r, 5) == expected[5]  # a skip
        r.load_state_dict(_state_after(stores[kind], options, 2, 3))
        assert _paths(r, 2) == expected[2][21:]  # a resume
        expected[3] = _paths(r, 3)
    with open_reader(stores[kind], **options) as fresh:
        assert _paths(fresh, 3) == expected[3]
    assert _no_packer_threads()


def test_a_loop_that_stops_after_len_batches_still_gets_the_next_epoch_prefetched(
    stores: dict[str, Path],
) -> None:
    """zip(range(len(reader)), reader) never asks for the epoch's end: the work done ahead
    is still the next epoch, and nothing of the epoch before leaks into it."""
    options: dict[str, Any] = {"batch_size": 32, "with_paths": True, "seed": 4}
    with open_reader(stores["lmdb"], **options) as fresh:
        expected = [_paths(fresh, e) for e in range(3)]
    with open_reader(stores["lmdb"], **options) as r:
        got = []
        for _ in range(3):
            ahead = r._active
            got.append([p for _, (_, _, paths) in zip(range(len(r)), r) for p in paths])
            assert ahead is None or r._active is ahead  # one producer for every epoch
        state = r.state_dict()
        assert got == expected and (state["epoch"], state["phases"]) == (3, [])
    assert _no_packer_threads()


def test_a_new_epoch_stops_an_abandoned_one(stores: dict[str, Path]) -> None:
    with open_reader(stores["lmdb"], batch_size=4, with_paths=True) as r:
        first = r.epoch(0)
        next(first)
        assert len(_paths(r, 1)) == 120  # the abandoned epoch does not block or leak
    assert _no_packer_threads()


def test_stats_show_whether_loading_keeps_up(stores: dict[str, Path]) -> None:
    with open_reader(stores["raw"], batch_size=10, prefetch=2) as r:
        for _ in r:
            time.sleep(0.01)  # a "training step" much slower than reading raw pixels
        fast = r.stats()
    assert fast["images"] == 120 and fast["batches"] == 12 and fast["images_per_s"] > 0
    assert fast["wait_share"] < 0.5 and fast["queue_fill"] > 0.5
    slow = open_reader(
        stores["lmdb"], batch_size=10, transform=lambda im: (time.sleep(0.005), im)[1], workers=1
    )
    with slow:
        for _ in slow:
            pass
        assert slow.stats()["wait_share"] > 0.5  # nothing to do but wait: input-bound


def test_bounded_memory_on_a_store_larger_than_the_buffers(tmp_path: Path) -> None:
    import tracemalloc

    root = tmp_path / "imgs"
    for i in range(400):
        write_image(root / "a" / f"{i}.png", size=(64, 64), seed=i)
    out = tmp_path / "big.h5"
    pack(root, out, PackOptions(backend="hdf5", raw=True, size=(64, 64), seed=0, workers=2))
    store_bytes = 400 * 64 * 64 * 3  # 4.9 MB of pixels
    tracemalloc.start()
    with open_reader(out, batch_size=8, chunk_size=16, buffer_chunks=2, prefetch=2, workers=1) as r:
        assert sum(len(labels) for _, labels in r) == 400
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # window (2 x 16 records) + batches in flight (prefetch 2 + 1 worker + 2 being built)
    bound = (2 * 16 + 8 * 6) * 64 * 64 * 3
    assert peak < bound + 1_000_000 < store_bytes


def test_bad_options_are_refused(stores: dict[str, Path]) -> None:
    for bad in [
        dict(batch_size=0),
        dict(batch_size=2, on_error="ignore"),
        dict(batch_size=2, rank=2, world_size=2),
        dict(batch_size=2, pin_memory=True),
        dict(batch_size=2, remainder="spread"),
        dict(batch_size=2, size=224),
        dict(batch_size=2, size=(0, 5)),
        dict(batch_size=2, size=(4, 4), fit="squash"),
        dict(batch_size=2, size=(4, 4), decode=False),
        dict(batch_size=2, read_ahead=-1),
        dict(batch_size=2, read_ahead=1.5),
    ]:
        with pytest.raises(UsageError):
            open_reader(stores["lmdb"], **bad)
    # Issue 29: thousands of decode threads are refused, naming the limit for these cores.
    with pytest.raises(UsageError, match=r"workers=10000: more than 4 workers per core"):
        open_reader(stores["lmdb"], batch_size=2, workers=10000)
    # A size no image could be resized to says so, before any read (not "does not decode").
    with pytest.raises(UsageError, match="1,000,000,000,000 pixels, over the limit"):
        open_reader(stores["lmdb"], batch_size=2, size=(10**6, 10**6))


def test_reader_pickles_as_path_and_options(stores: dict[str, Path]) -> None:
    import pickle

    with open_reader(stores["lmdb"], batch_size=40, seed=2, with_paths=True) as r:
        expected = _paths(r, 0)
        it = iter(r)
        next(it)  # a reader in the middle of an epoch, with threads and open handles
        clone = pickle.loads(pickle.dumps(r))
    with clone:
        assert _paths(clone, 0) == expected


def test_a_truncated_shard_is_refused_not_mapped(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    for i in range(10):
        write_image(root / "a" / f"{i}.png", size=(40, 40), seed=i)
    out = tmp_path / "s.lmdb"
    pack(root, out, PackOptions(seed=0, workers=2))
    shard = out / "shard-00000.lmdb"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with (
        open_reader(out, batch_size=4) as r,
        pytest.raises(StoreError, match="truncated or changed") as info,
    ):
        list(r)
    assert "shard-00000.lmdb" in str(info.value)


def test_batches_split_among_decode_threads_are_the_same_batches(stores: dict[str, Path]) -> None:
    def batches(workers: int) -> list[tuple[list[str], np.ndarray, list[np.ndarray]]]:
        with open_reader(stores["lmdb"], batch_size=40, workers=workers, with_paths=True) as r:
            return [(paths, labels, list(images)) for images, labels, paths in r]

    one, three = batches(1), batches(3)  # three threads: each batch decoded in three pieces
    assert [b[0] for b in one] == [b[0] for b in three]
    for (_, labels_a, images_a), (_, labels_b, images_b) in zip(one, three, strict=True):
        assert np.array_equal(labels_a, labels_b)
        assert all(np.array_equal(a, b) for a, b in zip(images_a, images_b, strict=True))


def test_batch_images_are_writable_arrays_stacked_once(
    tmp_path: Path, stores: dict[str, Path]
) -> None:
    """Decoded images reach the batch without a copy of their own, yet what the training
    loop gets is writable: one stacked array when shapes agree (each batch its own memory),
    else writable arrays."""
    root = tmp_path / "imgs"
    for i in range(20):
        write_image(root / "a" / f"{i}.jpg", size=(30 + i, 20), seed=i)
    sized = tmp_path / "sized.lmdb"
    pack(root, sized, PackOptions(seed=0, size=(8, 8), workers=2))
    with open_reader(sized, batch_size=8, workers=2) as r:
        (images, _), (second, _) = list(r)[:2]
    assert isinstance(images, np.ndarray) and images.shape == (8, 8, 8, 3)
    assert images.flags.writeable and images.flags.c_contiguous
    assert not np.shares_memory(images, second)
    with open_reader(stores["lmdb"], batch_size=16, workers=2) as r:
        images, _ = next(iter(r))
    assert isinstance(images, list) and len(images) == 16
    assert all(im.flags.writeable for im in images)


def _read_a_batch(path: str) -> None:
    with open_reader(path, batch_size=4, workers=1) as reader:
        next(iter(reader))


def test_children_forked_while_readers_prefetch_can_read(stores: dict[str, Path]) -> None:
    """A fork while a reader's thread is inside LMDB or HDF5 would hand the child a lock held
    by a thread it does not have; packer.fork_gate.FORK_GATE makes the fork wait for the read.
    A deadlock would hang the parent inside fork itself, so a watchdog ends the run instead."""
    import faulthandler
    import multiprocessing

    fork = multiprocessing.get_context("fork")
    stop = threading.Event()

    def keep_reading(path: Path) -> None:
        with open_reader(path, batch_size=4, prefetch=1, chunk_size=2) as reader:
            while not stop.is_set():
                for _ in reader:
                    if stop.is_set():
                        break

    busy = [threading.Thread(target=keep_reading, args=(stores[k],)) for k in ("lmdb", "raw")]
    for thread in busy:
        thread.start()
    faulthandler.dump_traceback_later(300, exit=True)  # prints every thread's stack, then exits
    try:
        for i in range(40):
            child = fork.Process(target=_read_a_batch, args=(str(stores[("hdf5", "lmdb")[i % 2]]),))
            child.start()
            child.join(30)
            hung = child.is_alive()
            if hung:
                child.kill()
            assert not hung and child.exitcode == 0, f"child {i} hung or failed"
    finally:
        faulthandler.cancel_dump_traceback_later()
        stop.set()
        for thread in busy:
            thread.join(30)
    assert _no_packer_threads()


@pytest.mark.parametrize("raw", [True, False])
def test_an_ordered_windows_batches_are_its_records_in_that_order(raw: bool) -> None:
    """Batches cut from an Ordered window are, column by column, the window's records at
    the order's positions; raw pixels are copied into the rows given, once."""
    n = 50
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (n, 2, 3, 3), dtype=np.uint8)
    window = Window(
        data=pixels if raw else [bytes([i]) * (i + 1) for i in range(n)],
        labels=np.arange(n * 2).reshape(n, 2),
        paths=[f"p{i}" for i in range(n)],
        crc32=np.arange(n, dtype=np.uint32) + 7,
        shapes=np.tile([2, 3, 3], (n, 1)),
        formats=["raw" if i % 2 else "png" for i in range(n)],
        shards=np.arange(n) % 3,
        indices=np.arange(n) + 100,
        intact=np.arange(n) % 5 != 0,
    )
    order = rng.permutation(n)
    ordered = Ordered(window, order)
    assert len(ordered) == n
    got = []
    for start in range(0, n, 16):
        stop = min(start + 16, n)
        into = np.empty((stop - start, 2, 3, 3), np.uint8) if raw else None
        batch = ordered.rows(start, stop, into)
        picked = order[start:stop]
        if raw:
            assert batch.data is into and np.array_equal(into, pixels[picked])
        else:
            assert batch.data == [window.data[i] for i in picked]
        assert np.array_equal(batch.labels, window.labels[picked])
        assert batch.paths == [f"p{i}" for i in picked]
        assert batch.formats == [window.formats[i] for i in picked]
        for column in ("crc32", "shapes", "shards", "indices", "intact"):
            assert np.array_equal(getattr(batch, column), getattr(window, column)[picked])
        got += batch.paths
    assert sorted(got) == sorted(window.paths)  # every record once


@pytest.mark.parametrize("columns", [1, 2])
def test_a_clean_raw_windows_batches_come_finished_as_finish_batch_makes_them(
    columns: int,
) -> None:
    """Where every record of a raw window passed its checksum, ``Ordered.stored`` gives the
    batch finish_batch makes of the same rows, with no Window in between. A window with a
    damaged record, or of encoded images, is not clean: its batches go through
    finish_batch, which names the record."""
    n = 40
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (n, 2, 3, 3), dtype=np.uint8)

    def window(intact: np.ndarray | None, data: Any = pixels) -> Window:
        return Window(
            data=data,
            labels=np.arange(n * columns).reshape(n, columns),
            paths=[f"p{i}" for i in range(n)],
            crc32=np.zeros(n, np.uint32),
            shapes=np.tile([2, 3, 3], (n, 1)),
            formats=["raw"] * n,
            shards=np.zeros(n, np.int64),
            indices=np.arange(n),
            intact=intact,
        )

    order = rng.permutation(n)
    ordered = Ordered(window(np.ones(n, bool)), order)
    assert ordered.clean and Ordered(window(None), order).clean  # None: not to be checked
    options: dict[str, Any] = {
        "store": None,
        "decode": False,
        "mode": "RGB",
        "verify": True,
        "on_error": "raise",
        "transform": None,
        "size": None,
        "fit": "stretch",
        "collate": None,
    }
    for start in range(0, n, 16):
        stop = min(start + 16, n)
        into = np.empty((stop - start, 2, 3, 3), np.uint8)
        got = ordered.stored(start, stop, into)
        want = finish_batch(ordered.rows(start, stop, np.empty_like(into)), **options)
        assert got.images is into and np.array_equal(got.images, want.images)
        assert np.array_equal(got.labels, want.labels) and got.labels.shape == want.labels.shape
        assert (got.paths, got.skipped, got.nbytes) == (want.paths, want.skipped, want.nbytes)
    damaged = np.ones(n, bool)
    damaged[7] = False
    assert not Ordered(window(damaged), order).clean
    assert not Ordered(window(None, [bytes(3)] * n), order).clean


def test_a_clean_raw_windows_rows_carry_every_column_in_the_order() -> None:
    """A clean raw window puts only labels and paths in order up front; a batch that crosses
    into the next window takes ``rows`` of it, which must still carry every column in the
    order, as a window with a damaged record (every column put in order up front) does."""
    n = 30
    rng = np.random.default_rng(4)

    def window(intact: np.ndarray) -> Window:
        return Window(
            data=rng.integers(0, 256, (n, 2, 2, 3), dtype=np.uint8),
            labels=np.arange(2 * n).reshape(n, 2),
            paths=[f"p{i}" for i in range(n)],
            crc32=np.arange(n, dtype=np.uint32) * 7,
            shapes=np.tile([2, 2, 3], (n, 1)) + np.arange(n)[:, None],
            formats=[f"f{i}" for i in range(n)],
            shards=np.arange(n) % 3,
            indices=np.arange(n) + 100,
            intact=intact,
        )

    order = rng.permutation(n)
    damaged = np.ones(n, bool)
    damaged[5] = False
    for source in (window(np.ones(n, bool)), window(damaged)):
        ordered = Ordered(source, order)
        assert ordered.clean == bool(source.intact.all())
        for start, stop in ((0, 9), (9, 30), (12, 13)):
            at = order[start:stop]
            got = ordered.rows(start, stop, np.empty((stop - start, 2, 2, 3), np.uint8))
            assert np.array_equal(got.data, source.data[at])
            for column in ("labels", "crc32", "shapes", "shards", "indices", "intact"):
                assert np.array_equal(getattr(got, column), getattr(source, column)[at]), column
            assert got.paths == [source.paths[i] for i in at]
            assert got.formats == [source.formats[i] for i in at]
