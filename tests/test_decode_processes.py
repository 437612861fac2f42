"""Decoding in worker processes (issue 23): the same batches as the threads, the same one-line
errors, no process left behind, and the choice made from the store's own statistics."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import child_pids, process_alive, store_path, write_image

from packer import PackOptions, open_reader, pack
from packer.augment import RandomResizedCrop
from packer.errors import CorruptRecordError, UsageError
from packer.reading.batching import read_window
from packer.reading.decode_procs import MANY_WORKERS, ProcessDecoder, _owned, choose
from packer.reading.epoch import Span
from packer.reading.options import ReaderOptions
from packer.reading.shared_slots import Landing, Outbox
from packer.store.access import Store, open_manifest


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 small PNGs and JPEGs in 3 classes, packed as LMDB in 2 shards."""
    tmp = tmp_path_factory.mktemp("small")
    for i in range(120):
        ext = ".png" if i % 2 else ".jpg"
        write_image(tmp / "images" / f"c{i % 3}" / f"{i:03d}{ext}", size=(16, 16), seed=i)
    out = tmp / "s.lmdb"
    pack(tmp / "images", out, PackOptions(seed=1, workers=2, shards=2))
    return out


def _epoch(store: Path, decode_in: str | None, **options: object) -> list[tuple]:
    with open_reader(
        store, batch_size=32, seed=5, chunk_size=10, with_paths=True, decode_in=decode_in, **options
    ) as reader:
        return list(reader.epoch(1))


@pytest.mark.parametrize("options", [{}, {"shuffle": False, "workers": 1}, {"size": (8, 6)}])
def test_processes_give_the_threads_batches(small: Path, options: dict) -> None:
    threads, processes = _epoch(small, "threads", **options), _epoch(small, "processes", **options)
    assert len(processes) == len(threads) == 4
    for (im_t, lab_t, paths_t), (im_p, lab_p, paths_p) in zip(threads, processes):
        assert paths_p == paths_t
        np.testing.assert_array_equal(lab_p, lab_t)
        assert isinstance(im_p, np.ndarray) and im_p.flags.writeable
        np.testing.assert_array_equal(im_p, im_t)
    assert sorted(p for _, _, paths in processes for p in paths) == sorted(
        p for _, _, paths in threads for p in paths
    )


def test_pixels_of_a_known_size_are_written_in_place_in_their_batch(small: Path) -> None:
    """With ``size`` each batch has a block of shared memory and its workers write their
    parts' pixels straight to their rows: the batch is the block, nothing copied, and the
    batches are the threads' (the test above)."""
    with open_reader(small, batch_size=32, size=(8, 6), decode_in="processes", workers=2) as reader:
        batches = [images for images, _ in reader.epoch(0)]
        decoder = reader._producer._processes  # the reader's own pool (no public handle)
        assert decoder is not None and decoder._batches is not None
        assert decoder.placed == 2 * len(batches) and decoder.landed == 0  # a part per worker
        area = np.frombuffer(decoder._batches.area, np.uint8)
        assert all(np.shares_memory(images, area) for images in batches)


def test_a_batch_block_comes_back_once_the_batch_is_dropped_without_the_collector(
    small: Path,
) -> None:
    """Nothing of the reader's own holds a batch once it is yielded and let go: no reference
    cycle, so its block is free again at once, not at the garbage collector's next pass."""
    options = {"size": (8, 6), "decode_in": "processes", "workers": 2, "across_epochs": False}
    gc.disable()
    try:
        with open_reader(small, batch_size=16, **options) as reader:
            decoder = reader._producer.start_processes()
            assert decoder is not None and decoder._batches is not None
            blocks = len(decoder._batches._free)
            for epoch in range(3):
                for batch in reader.epoch(epoch):
                    del batch
            assert decoder.placed > 0 and len(decoder._batches._free) == blocks
    finally:
        gc.enable()


def test_parts_land_when_every_batch_block_is_held(small: Path) -> None:
    """A training loop that keeps more batches than the batch area has blocks: the batches
    that find none come back through the landing slots, copied, and all stay intact."""
    options = {"size": (8, 6), "decode_in": "processes", "workers": 2, "across_epochs": False}
    with open_reader(small, batch_size=16, **options) as reader:
        kept = [images for epoch in range(3) for images, _ in reader.epoch(epoch)]
        decoder = reader._producer._processes
        assert decoder is not None and decoder.placed > 0 and decoder.landed > 0
        again = [images for epoch in range(3) for images, _ in reader.epoch(epoch)]
    for first, second in zip(kept, again, strict=True):
        np.testing.assert_array_equal(first, second)


def test_parts_that_find_no_slot_come_back_through_the_pipe(
    small: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("packer.reading.produce.part_bytes", lambda options, manifests: 64)
    monkeypatch.setattr("packer.reading.produce.image_bytes", lambda options, manifests: 0)
    threads = _epoch(small, "threads", size=(8, 6))
    with open_reader(
        small,
        batch_size=32,
        seed=5,
        chunk_size=10,
        with_paths=True,
        size=(8, 6),
        workers=2,
        decode_in="processes",
    ) as reader:
        processes = list(reader.epoch(1))
        assert reader._producer._processes is not None
        assert reader._producer._processes.landed == 0  # a part's pixels: 16 x 144 bytes
    for (im_t, lab_t, paths_t), (im_p, lab_p, paths_p) in zip(threads, processes, strict=True):
        assert paths_p == paths_t
        np.testing.assert_array_equal(lab_p, lab_t)
        np.testing.assert_array_equal(im_p, im_t)


def test_a_landing_slot_is_used_once_at_a_time_and_what_does_not_fit_is_refused() -> None:
    landing = Landing(2, 64, multiprocessing.get_context("fork"))
    first, second = np.arange(64, dtype=np.uint8).reshape(4, 4, 4), np.full((2, 8), 7, np.uint8)
    slots = [landing.put(first), landing.put(second)]
    assert None not in slots and landing.put(second) is None  # both slots taken
    assert landing.put(np.zeros(65, np.uint8)) is None  # larger than a slot
    np.testing.assert_array_equal(landing.take(slots[0]), first)  # a copy: the slot is free
    again = landing.put(second)
    assert again is not None and again.slot == slots[0].slot
    np.testing.assert_array_equal(landing.take(slots[1]), second)
    np.testing.assert_array_equal(landing.take(again), second)
    assert landing.landed == 3


def test_an_outbox_slot_holds_a_parts_payloads_until_released() -> None:
    outbox = Outbox(2, 16, multiprocessing.get_context("fork"))
    first = outbox.send([b"abc", memoryview(b"defgh"), b""])
    second = outbox.send([b"x" * 16])
    assert first is not None and second is not None and first.slot != second.slot
    assert outbox.send([b"y"]) is None  # both slots taken
    assert [bytes(p) for p in outbox.received(first)] == [b"abc", b"defgh", b""]
    outbox.release(first.slot)
    assert outbox.send([b"z" * 17]) is None  # larger than a slot
    again = outbox.send([b"1", b"22"])
    assert again is not None and again.slot == first.slot
    assert [bytes(p) for p in outbox.received(again)] == [b"1", b"22"]
    assert [bytes(p) for p in outbox.received(second)] == [b"x" * 16]
    assert outbox.sent == 3


def test_a_worker_copies_an_image_that_lies_in_the_outbox() -> None:
    """An image that is its payload as it lies (raw pixels kept as they are) is copied before
    the part's slot is freed: the slot is another part's once freed."""
    outbox = Outbox(2, 64, multiprocessing.get_context("fork"))
    sent = outbox.send([bytes(range(48))])
    assert sent is not None
    (payload,) = outbox.received(sent)
    view = np.frombuffer(payload, np.uint8).reshape(4, 4, 3)
    elsewhere = np.zeros((4, 4, 3), np.uint8)
    copied = _owned(view, outbox)
    assert copied is not view and not outbox.holds(copied) and outbox.holds(view)
    np.testing.assert_array_equal(copied, view)
    assert _owned(elsewhere, outbox) is elsewhere and _owned("text", outbox) == "text"


def _slowly(image: np.ndarray) -> np.ndarray:
    time.sleep(0.005)  # parts take long enough to be in flight when an epoch is left
    return image


def test_payloads_go_out_through_shared_memory_and_every_slot_comes_back(small: Path) -> None:
    """Each part's payloads reach its worker through an outbox slot, and every slot is free
    again once its part is done, or was never taken: epochs left after a batch give back
    the slots of the parts they had in hand."""
    options = {"size": (8, 6), "decode_in": "processes", "workers": 2, "across_epochs": False}
    with open_reader(small, batch_size=16, transform=_slowly, **options) as reader:
        whole = list(reader.epoch(0))
        decoder = reader._producer._processes
        assert decoder is not None and decoder._outbox is not None
        parts = decoder.placed  # each part's pixels came back through shared memory
        assert parts >= len(whole) and decoder.sent == parts  # and its payloads went out so
        for epoch in range(1, 4):
            next(iter(reader.epoch(epoch)))  # then left: its parts in flight are given up
        again = list(reader.epoch(4))
        assert [len(b) for b, _ in again] == [len(b) for b, _ in whole]
        deadline = time.monotonic() + 10
        while any(decoder._outbox.taken[:]) and time.monotonic() < deadline:
            time.sleep(0.05)  # a cancelled part's slot is freed by the pool's thread
        assert not any(decoder._outbox.taken[:])


def test_a_part_cancelled_before_a_worker_took_it_gives_its_outbox_slot_back(
    small: Path,
) -> None:
    options = {"size": (8, 6), "decode_in": "processes", "workers": 2, "transform": _slowly}
    with open_reader(small, batch_size=8, **options) as reader, Store(small) as store:
        decoder = reader._producer.start_processes()
        assert decoder is not None and decoder._outbox is not None
        window = read_window(store, [Span(0, 0, 40)])
        # As many parts as the outbox has slots: (workers + 2) x workers.
        futures = [decoder.submit(0, window.rows(a % 40, a % 40 + 8), 0) for a in range(0, 64, 8)]
        assert decoder.sent == len(futures) == 8
        cancelled = sum(future.cancel() for future in futures[::-1])  # queued ones, last first
        assert cancelled >= len(futures) - 5  # at most a part in each worker, and 3 queued
        deadline = time.monotonic() + 10
        while any(decoder._outbox.taken[:]) and time.monotonic() < deadline:
            time.sleep(0.05)  # the parts under way finish, and free their slots
        assert not any(decoder._outbox.taken[:])


def test_small_images_decode_in_processes_by_default(small: Path, tmp_path: Path) -> None:
    manifest = open_manifest(small)
    assert choose(ReaderOptions(batch_size=8), manifest) == "processes"
    assert choose(ReaderOptions(batch_size=8, decode_in="threads"), manifest) == "threads"
    # decoding nothing, in a DataLoader worker, or a transform only threads can run: threads
    assert choose(ReaderOptions(batch_size=8, decode=False), manifest) == "threads"
    assert choose(ReaderOptions(batch_size=8, worker=(0, 2)), manifest) == "threads"
    assert choose(ReaderOptions(batch_size=8, transform=lambda a: a), manifest) == "threads"
    with pytest.raises(UsageError, match="transform that can be sent"):
        choose(ReaderOptions(batch_size=8, transform=lambda a: a, decode_in="processes"), manifest)
    with pytest.raises(UsageError, match="DataLoader worker"):
        choose(ReaderOptions(batch_size=8, worker=(0, 2), decode_in="processes"), manifest)
    with pytest.raises(UsageError, match="decode_in must be"):
        ReaderOptions(batch_size=8, decode_in="gpu")
    large = tmp_path / "large"
    write_image(large / "c" / "a.jpg", size=(200, 150))
    pack(large, tmp_path / "l.lmdb", PackOptions(seed=0, workers=1))
    large_manifest = open_manifest(tmp_path / "l.lmdb")
    assert choose(ReaderOptions(batch_size=8, workers=2), large_manifest) == "threads"


def test_many_workers_decode_large_images_in_processes_where_they_come_back_small(
    tmp_path: Path,
) -> None:
    """Past MANY_WORKERS, threads queue for the GIL: images whose output is small (size or
    augment) decode in processes; full-size outputs keep threads, whose copy back costs more."""
    write_image(tmp_path / "large" / "c" / "a.jpg", size=(600, 450))
    pack(tmp_path / "large", tmp_path / "l.lmdb", PackOptions(seed=0, workers=1))
    manifest = open_manifest(tmp_path / "l.lmdb")
    few, many = MANY_WORKERS - 1, MANY_WORKERS
    sized = {"batch_size": 8, "size": (224, 224)}
    assert choose(ReaderOptions(workers=few, **sized), manifest) == "threads"
    assert choose(ReaderOptions(workers=many, **sized), manifest) == "processes"
    cropped = ReaderOptions(batch_size=8, workers=many, augment=[RandomResizedCrop(224)])
    assert choose(cropped, manifest) == "processes"
    # whole 600x450 images coming back: threads, however many workers
    assert choose(ReaderOptions(batch_size=8, workers=many), manifest) == "threads"
    assert (
        choose(ReaderOptions(workers=many, **{**sized, "size": (512, 512)}), manifest) == "threads"
    )
    # still threads where processes cannot serve: in a DataLoader worker, or for a lambda
    assert choose(ReaderOptions(workers=many, worker=(0, 2), **sized), manifest) == "threads"
    assert (
        choose(ReaderOptions(workers=many, transform=lambda a: a, **sized), manifest) == "threads"
    )
    # and the reader decodes there, giving the threads' pixels
    with open_reader(tmp_path / "l.lmdb", workers=many, **sized) as reader:
        [(images, _)] = list(reader.epoch(0))
    with open_reader(tmp_path / "l.lmdb", decode_in="threads", **sized) as reader:
        [(expected, _)] = list(reader.epoch(0))
    assert images.shape == (1, 224, 224, 3)
    np.testing.assert_array_equal(images, expected)


def test_a_corrupt_record_in_a_worker_is_the_same_one_line_error(
    tmp_path: Path, backend: str
) -> None:
    root = tmp_path / "images"
    for i in range(40):
        write_image(root / "c" / f"{i:02d}.png", size=(16, 16), seed=i)
    store = store_path(tmp_path, backend)
    pack(root, store, PackOptions(backend=backend, seed=0, workers=1))
    # One byte of one image changed where the shard holds it (originals are stored as they are)
    shard = store / open_manifest(store).shards[0].file
    data = bytearray(shard.read_bytes())
    at = data.find((root / "c" / "07.png").read_bytes())
    assert at > 0
    data[at + 100] ^= 0xFF
    shard.write_bytes(data)
    errors = []
    for decode_in in ("threads", "processes"):
        with (
            pytest.raises(CorruptRecordError) as caught,
            open_reader(store, batch_size=16, shuffle=False, decode_in=decode_in) as reader,
        ):
            list(reader)
        errors.append(str(caught.value))
        assert caught.value.path == "c/07.png" and "\n" not in str(caught.value)
    assert errors[0] == errors[1]
    assert "checksum mismatch" in errors[1]


def test_a_skipped_record_leaves_no_gap_in_a_batch_written_in_place(tmp_path: Path) -> None:
    """on_error="skip" in a part whose rows go straight to its batch's block: the part comes
    back a row short, and the batch is the threads' (the next part's rows moved up)."""
    root = tmp_path / "images"
    for i in range(40):
        write_image(root / "c" / f"{i:02d}.png", size=(16, 16), seed=i)
    store = tmp_path / "s.lmdb"
    pack(root, store, PackOptions(seed=0, workers=1))
    options = {"batch_size": 16, "shuffle": False, "on_error": "skip", "size": (8, 8)}
    with open_reader(store, with_paths=True, **options) as reader:
        third = next(iter(reader))[2][3]  # the fourth record: in the first part of a batch
    shard = store / open_manifest(store).shards[0].file
    data = bytearray(shard.read_bytes())
    at = data.find((root / third).read_bytes())
    assert at > 0
    data[at + 100] ^= 0xFF
    shard.write_bytes(data)
    epochs = {}
    for decode_in in ("threads", "processes"):
        with open_reader(store, decode_in=decode_in, workers=2, **options) as reader:
            epochs[decode_in] = list(reader.epoch(0))
            if decode_in == "processes":
                assert reader._producer._processes.placed > 0
    assert [len(images) for images, _ in epochs["processes"]] == [15, 16, 8]
    for (im_t, lab_t), (im_p, lab_p) in zip(epochs["threads"], epochs["processes"], strict=True):
        np.testing.assert_array_equal(im_p, im_t)
        np.testing.assert_array_equal(lab_p, lab_t)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux's /proc")
def test_a_close_cut_short_by_ctrl_c_still_ends_the_decode_processes(
    small: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C that lands while close() stops the prefetch thread still reaches the user,
    and the decode processes end all the same."""
    before = set(child_pids(os.getpid()))
    reader = open_reader(small, batch_size=8, decode_in="processes")
    next(iter(reader.epoch(0)))
    workers = [pid for pid in child_pids(os.getpid()) if pid not in before]
    assert workers and all(process_alive(w) for w in workers)

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(reader, "_stop_active", interrupted)
    with pytest.raises(KeyboardInterrupt):
        reader.close()
    deadline = time.monotonic() + 5
    while any(process_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [w for w in workers if process_alive(w)]
    monkeypatch.undo()
    reader.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux's /proc")
def test_close_returns_with_the_pools_pipes_closed() -> None:
    """Every pipe of the pool is closed when close() returns, a worker killed mid-task
    included; not later, once the executor's own thread has ended and the collector found
    them (a leak check run just after a reader closed saw them open)."""
    before = len(os.listdir("/proc/self/fd"))
    decoder = ProcessDecoder(2, [], stack=True)
    busy = decoder._pool.submit(time.sleep, 10)  # a slow transform: its worker is killed
    while not busy.running():
        time.sleep(0.01)
    time.sleep(0.1)
    decoder.close()
    assert len(os.listdir("/proc/self/fd")) <= before


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux's /proc")
def test_decode_processes_die_with_a_sigkilled_reader(small: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from packer import open_reader
        reader = open_reader({str(small)!r}, batch_size=8, decode_in="processes")
        for epoch in range(10**6):
            for batch in reader.epoch(epoch):
                print("batch", flush=True)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, env={**os.environ}, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "batch\n"
    workers = child_pids(child.pid)
    assert len(workers) >= 1
    child.kill()
    child.wait()
    deadline = time.monotonic() + 10
    while any(process_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [w for w in workers if process_alive(w)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "decode processes outlived their reader"


def test_torch_dataloader_with_workers_and_in_process(small: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra")
    from torch.utils.data import DataLoader

    from packer.torch_adapter import TorchDataset

    with pytest.raises(UsageError, match="DataLoader worker"):
        TorchDataset(small, batch_size=8, decode_in="processes")
    seen = {}
    for workers in (0, 2):  # 0: the reader in this process decodes in processes
        dataset = TorchDataset(small, batch_size=8, seed=2, with_paths=True, output="torch")
        loader = DataLoader(dataset, batch_size=None, num_workers=workers)
        batches = list(loader)
        assert all(isinstance(images, torch.Tensor) for images, _, _ in batches)
        seen[workers] = sorted(p for _, _, paths in batches for p in paths)
    assert seen[0] == seen[2] and len(seen[0]) == 120


def test_augmenting_small_images_decodes_in_processes_as_in_threads(small: Path) -> None:
    """Each record's draws are keyed by (seed, epoch, record), and each part goes to the
    processes with its epoch: an augmenting reader of small images decodes in processes by
    default, and its crops and flips are the threads', epoch by epoch."""
    from packer.augment import RandomHorizontalFlip, RandomResizedCrop

    augment = [RandomResizedCrop(12), RandomHorizontalFlip()]
    manifest = open_manifest(small)
    assert choose(ReaderOptions(batch_size=8, augment=augment), manifest) == "processes"
    seen = {}
    for decode_in in ("threads", "processes"):
        with open_reader(
            small, batch_size=32, seed=3, augment=augment, with_paths=True, decode_in=decode_in
        ) as reader:
            seen[decode_in] = [list(reader.epoch(epoch)) for epoch in (0, 1)]
    for threads, processes in zip(seen["threads"], seen["processes"], strict=True):
        assert [paths for *_, paths in processes] == [paths for *_, paths in threads]
        for (im_t, lab_t, _), (im_p, lab_p, _) in zip(threads, processes, strict=True):
            assert im_p.shape[1:] == (12, 12, 3)
            np.testing.assert_array_equal(im_p, im_t)
            np.testing.assert_array_equal(lab_p, lab_t)
    first, second = (
        {path: image for images, _, paths in epoch for path, image in zip(paths, images)}
        for epoch in seen["processes"]
    )
    assert first.keys() == second.keys()
    redrawn = sum(not np.array_equal(first[path], second[path]) for path in first)
    assert redrawn > len(first) // 2  # a new epoch draws new crops for the same records
