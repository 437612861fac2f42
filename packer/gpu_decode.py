"""JPEGs decoded on the GPU (nvJPEG, through torchvision), a few batches ahead of the loop.

Where the cores decode more slowly than the GPU trains, read the store's bytes
(``decode=False``) and decode them on the GPU instead (docs/benchmarks/gpu.md: on an H200
machine nvJPEG decoded 1.8x as fast as its 16 cores):

    with open_reader("train.lmdb", batch_size=256, seed=0, decode=False, workers=4) as reader:
        for images, labels in decode_on_gpu(reader.epoch(epoch), size=(224, 224)):
            ...  # uint8 N x 224 x 224 x 3 on the GPU, upright RGB

A thread of its own decodes each batch on a CUDA stream of its own, ``ahead`` batches ahead
of the loop, as the reader copies its batches: decoding overlaps the step, and the training
stream waits for its own batch alone. A batch's JPEGs go to nvJPEG in one call; a record
that is not a JPEG (a PNG in a mixed store, raw pixels) is decoded on the CPU as the reader
decodes it, then copied up, and so is a JPEG nvJPEG refuses (CMYK, say). Each image is then
brought to ``size`` as the reader's ``fit`` does ("crop": the centre at the target's aspect
ratio; "stretch"), antialiased bilinear.

Where neither the device nor the cores alone decode as fast as the GPU trains, both can:
``cpu_workers=N`` has N processes decode batches as the reader would, beside the device, each
batch going to whichever side is free, in order.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import warnings
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

from packer.about import require_torch
from packer.errors import CorruptRecordError, PackerError, UsageError
from packer.imaging.decode import decode_array, decode_resized
from packer.imaging.resizing import centre_box, resize
from packer.lifeline import die_with_parent
from packer.prefetch import Prefetcher
from packer.reading.decode_procs import end_pool, start_pool

torch = require_torch("packer.gpu_decode")

__all__ = ["decode_on_gpu", "GpuDecoded"]

_JPEG = b"\xff\xd8\xff"  # every JPEG starts so: the start-of-image marker, then a segment
_FITS = ("crop", "stretch")


def decode_on_gpu(
    batches: Iterable[tuple[Any, ...]],
    size: tuple[int, int],
    *,
    fit: str = "crop",
    device: str = "cuda",
    ahead: int = 3,
    cpu_workers: int = 0,
) -> GpuDecoded:
    """Each batch of encoded records, decoded on ``device`` and brought to ``size``.

    ``batches``: a reader's epoch with ``decode=False`` (``reader.epoch(e)``); with
    ``with_paths=True`` the paths come along, and name a record that does not decode.
    Yields ``(images, labels[, paths])``: images uint8 N x H x W x 3 on ``device``, labels a
    tensor there, in the order the batches came. ``device="cpu"`` decodes with torchvision on
    the CPU (in the same thread ahead of the loop, without streams).

    ``cpu_workers``: also decode on this many CPU processes, as the reader decodes (the same
    pixels as ``open_reader(size=...)``). Each batch goes to whichever side is free: the
    processes keep two batches under way and the device decodes the rest, so neither waits
    for the other; ``decoded_on`` counts what each side decoded. Where the GPU also trains,
    its decoding takes time from the training step, so this pays where the step leaves the
    GPU idle, waiting for data.

    Raises:
        UsageError: torchvision is missing, ``size``, ``fit``, ``ahead`` or ``cpu_workers``
            cannot work, or the batches hold decoded images (a reader without
            ``decode=False``).
        CorruptRecordError: a record does not decode; the loop stops there.
    """
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
        from torchvision.transforms.v2 import functional
    except ImportError:
        raise UsageError("decode_on_gpu needs torchvision: pip install torchvision") from None
    if not (len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size)):
        raise UsageError(f"decode_on_gpu: size must be (height, width), not {size!r}")
    if fit not in _FITS:
        raise UsageError(f"decode_on_gpu: fit must be one of {', '.join(_FITS)}, not {fit!r}")
    if ahead < 1:
        raise UsageError(f"decode_on_gpu: ahead must be at least 1, not {ahead}")
    if not (isinstance(cpu_workers, int) and cpu_workers >= 0):
        raise UsageError(f"decode_on_gpu: cpu_workers must be 0 or more, not {cpu_workers!r}")
    target = torch.device(device)

    def fitted(image: Any) -> Any:
        """A C x h x w image brought to ``size`` as the reader's ``fit`` brings it."""
        if fit == "crop":  # the centre at the target's aspect ratio, then scaled
            height, width = image.shape[1:]
            top, left, box_h, box_w = centre_box(height, width, size)
            return functional.resized_crop(
                image, top, left, box_h, box_w, list(size), antialias=True
            )
        return functional.resize(image, list(size), antialias=True)

    def on_cpu(payload: Any, number: int, i: int, paths: Any) -> Any:
        """A record nvJPEG does not take (not a JPEG, or one it refuses, such as CMYK),
        decoded on the CPU as the reader decodes it, then copied to ``device``."""
        try:
            pixels = payload if isinstance(payload, np.ndarray) else decode_array(payload, "RGB")
        except Exception as e:
            raise _undecodable(number, i, paths, f"{type(e).__name__}: {e}") from None
        if pixels.shape[2] == 1:  # raw grey pixels
            pixels = np.repeat(pixels, 3, axis=2)
        return torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1).to(target)

    def jpeg(data: Any) -> Any:
        """One JPEG by nvJPEG, or None where it refuses it."""
        try:
            return decode_jpeg(
                data, mode=ImageReadMode.RGB, device=target, apply_exif_orientation=True
            )
        except RuntimeError:
            return None

    def decoded(batch: tuple[Any, ...], number: int) -> tuple[Any, ...]:
        payloads, labels, paths = batch[0], batch[1], batch[2] if len(batch) > 2 else None
        jpegs = [i for i, p in enumerate(payloads) if isinstance(p, bytes) and p[:3] == _JPEG]
        with warnings.catch_warnings():  # the bytes are read-only; nvJPEG only reads them
            warnings.simplefilter("ignore", UserWarning)
            data = [torch.frombuffer(payloads[i], dtype=torch.uint8) for i in jpegs]
        try:  # one call for the batch
            found = (
                decode_jpeg(
                    data, mode=ImageReadMode.RGB, device=target, apply_exif_orientation=True
                )
                if data
                else []
            )
        except RuntimeError:  # the call fails as a whole: each alone, the refused on the CPU
            found = [jpeg(d) for d in data]
        images: list[Any] = [None] * len(payloads)
        for i, image in zip(jpegs, found):
            images[i] = image
        for i, payload in enumerate(payloads):
            if images[i] is None:
                images[i] = on_cpu(payload, number, i, paths)
        stacked = torch.stack([fitted(image) for image in images]).permute(0, 2, 3, 1)
        labels = torch.as_tensor(labels).to(target, non_blocking=True)
        return (stacked.contiguous(), labels) + (() if paths is None else (paths,))

    cpu = _CpuDecoder(cpu_workers, size, fit) if cpu_workers else None
    return GpuDecoded(batches, decoded, target, ahead, cpu)


def _undecodable(number: int, i: int, paths: Any, reason: str) -> CorruptRecordError:
    path = paths[i] if paths is not None else "its path: open the reader with with_paths=True"
    return CorruptRecordError(
        "decode_on_gpu", f"batch {number}", i, path, f"does not decode: {reason}"
    )


class GpuDecoded(Iterator[tuple[Any, ...]]):
    """decode_on_gpu's batches, decoded a few ahead of the loop by a thread of its own (on a
    CUDA device, on a stream of its own). ``decoded_on``: how many batches so far the device
    and the CPU workers decoded, ``{"device": n, "cpu_workers": m}``."""

    def __init__(
        self,
        batches: Iterable[tuple[Any, ...]],
        decoded: Callable[[tuple[Any, ...], int], tuple[Any, ...]],
        target: Any,
        ahead: int,
        cpu: _CpuDecoder | None,
    ) -> None:
        self.decoded_on = {"device": 0, "cpu_workers": 0}
        # Its frame must not hold self: a loop left early drops this object, and with it
        # the generator, whose close ends the thread and the workers.
        self._batches = _delivered(batches, decoded, target, ahead, cpu, self.decoded_on)

    def __next__(self) -> tuple[Any, ...]:
        return next(self._batches)

    def close(self) -> None:
        """Stop decoding now (the thread, the CPU workers, the reader's epoch)."""
        self._batches.close()


def _delivered(
    batches: Iterable[tuple[Any, ...]],
    decoded: Callable[[tuple[Any, ...], int], tuple[Any, ...]],
    target: Any,
    ahead: int,
    cpu: _CpuDecoder | None,
    decoded_on: dict[str, int],
) -> Generator[tuple[Any, ...], None, None]:
    stream = torch.cuda.Stream(target) if target.type == "cuda" else None

    def on_stream(done: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any]:
        finished = torch.cuda.Event() if stream else None
        if finished is not None:
            finished.record(stream)
        return done, finished

    def produce() -> Iterator[tuple[tuple[Any, ...], Any]]:
        # In batch order: a batch the device decoded (with its event), or one under way
        # in the CPU workers. Bounded, so a slow worker cannot pile up decoded batches.
        waiting: deque[Any] = deque()
        most = ahead + _CPU_BATCHES

        def settled(item: Any) -> tuple[tuple[Any, ...], Any]:
            if isinstance(item, _CpuJob):
                decoded_on["cpu_workers"] += 1
                return on_stream(item.result(target))
            decoded_on["device"] += 1
            return item

        try:
            with torch.cuda.stream(stream) if stream else contextlib.nullcontext():
                for number, batch in enumerate(batches):
                    _check_encoded(batch)
                    under_way = sum(isinstance(w, _CpuJob) and not w.done() for w in waiting)
                    if cpu is not None and under_way < _CPU_BATCHES:
                        waiting.append(cpu.submit(batch, number))
                    else:
                        waiting.append(on_stream(decoded(batch, number)))
                    while waiting and (len(waiting) >= most or _ready(waiting[0])):
                        yield settled(waiting.popleft())
                while waiting:
                    yield settled(waiting.popleft())
        finally:
            if cpu is not None:
                cpu.close()
            close = getattr(batches, "close", None)
            if close is not None:  # a reader's epoch: stop its work now
                close()

    with Prefetcher(produce, depth=ahead, name="packer-gpu-decode") as prefetched:
        for done, finished in prefetched:
            if finished is not None:
                current = torch.cuda.current_stream(target)
                current.wait_event(finished)  # this batch's decode, not the whole stream
                for tensor in done[:2]:
                    tensor.record_stream(current)
            yield done


# Batches the CPU workers have under way at once: one decoding, the next queued behind it,
# so that the workers never wait while the thread hands the device a batch.
_CPU_BATCHES = 2


def _ready(item: Any) -> bool:
    return not isinstance(item, _CpuJob) or item.done()


def _check_encoded(batch: tuple[Any, ...]) -> None:
    payloads = batch[0]
    if not isinstance(payloads, list) or not all(
        isinstance(p, (bytes, np.ndarray)) for p in payloads
    ):
        raise UsageError(
            "decode_on_gpu takes a reader's encoded records (a list of each record's "
            "bytes, as a store of encoded images gives them): open it with decode=False"
        )


class _CpuDecoder:
    """Worker processes that decode a batch in parts, each part in one worker, as the reader
    decodes (``packer.reading.decode_procs``' pool). Started on the first batch, by the
    thread that decodes ahead."""

    def __init__(self, workers: int, size: tuple[int, int], fit: str) -> None:
        self.workers, self.size, self.fit = workers, size, fit
        self._pool: ProcessPoolExecutor | None = None

    def submit(self, batch: tuple[Any, ...], number: int) -> _CpuJob:
        if self._pool is None:
            kernel = threading.current_thread() is threading.main_thread()
            self._pool = start_pool(self.workers, _init_cpu_worker, (os.getpid(), kernel))
        payloads = batch[0]
        bounds = np.linspace(0, len(payloads), min(self.workers, len(payloads)) + 1).astype(int)
        parts = [
            self._pool.submit(_decode_part, payloads[start:end], self.size, self.fit)
            for start, end in zip(bounds[:-1], bounds[1:])
        ]
        return _CpuJob(parts, bounds[:-1].tolist(), batch, number, self.size)

    def close(self) -> None:
        if self._pool is not None:
            end_pool(self._pool)


class _CpuJob:
    """One batch under way in the CPU workers."""

    def __init__(
        self,
        parts: list[Future[Any]],
        starts: list[int],
        batch: tuple[Any, ...],
        number: int,
        size: tuple[int, int],
    ) -> None:
        self.parts, self.starts, self.batch, self.number = parts, starts, batch, number
        self.size = size

    def done(self) -> bool:
        return all(part.done() for part in self.parts)

    def result(self, target: Any) -> tuple[Any, ...]:
        """The batch as the device side gives it: images and labels on ``target``."""
        labels, paths = self.batch[1], self.batch[2] if len(self.batch) > 2 else None
        # The parts land in pinned memory, so that the copy up runs beside the decoding.
        shape = (len(self.batch[0]), *self.size, 3)
        images = torch.empty(shape, dtype=torch.uint8, pin_memory=target.type == "cuda")
        landed = images.numpy()
        for start, part in zip(self.starts, self.parts):
            try:
                got = part.result()
            except BrokenProcessPool:
                raise PackerError(
                    f"decode_on_gpu: a CPU decode worker died in batch {self.number} "
                    "(killed, or out of memory)"
                ) from None
            if isinstance(got, tuple):  # (the record's place in the part, why it failed)
                raise _undecodable(self.number, start + got[0], paths, got[1])
            landed[start : start + len(got)] = got
        labels = torch.as_tensor(labels).to(target, non_blocking=True)
        return (images.to(target, non_blocking=True), labels) + (() if paths is None else (paths,))


def _init_cpu_worker(parent: int, kernel: bool) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's
    die_with_parent(parent, kernel)


def _decode_part(
    payloads: list[Any], size: tuple[int, int], fit: str
) -> np.ndarray | tuple[int, str]:
    """In a worker: the payloads decoded upright in RGB and brought to ``size`` as the reader
    brings them, as one N x H x W x 3 array; else the first one that failed, and why."""
    images = np.empty((len(payloads), *size, 3), np.uint8)
    for i, payload in enumerate(payloads):
        try:
            if isinstance(payload, np.ndarray):  # raw pixels, as the store keeps them
                pixels = payload if payload.shape[2] == 3 else np.repeat(payload, 3, axis=2)
                images[i] = resize(pixels, size=size, fit=fit)
            else:
                images[i] = decode_resized(payload, "RGB", size=size, fit=fit)
        except Exception as e:
            return i, f"{type(e).__name__}: {e}"
    return images
