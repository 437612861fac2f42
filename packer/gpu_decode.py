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
import itertools
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
from packer.imaging.headers import exif_orientation
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
    pixels as ``open_reader(size=...)``). Each batch is split: the workers decode its first
    part, the device the rest, at once. The split follows the two sides' pace: the workers'
    part shrinks whenever the thread had to wait for it and grows while it did not, so
    where the loop itself is slower (a GPU busy training), they take more of the work off
    the GPU. ``decoded_on`` counts the images each side decoded.

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
                data, mode=ImageReadMode.RGB, device=target, apply_exif_orientation=False
            )
        except RuntimeError:
            return None

    def decoded(payloads: list[Any], number: int, first: int, paths: Any) -> Any:
        """``payloads``, records ``first`` on of batch ``number``, as N x H x W x 3."""
        jpegs = [i for i, p in enumerate(payloads) if isinstance(p, bytes) and p[:3] == _JPEG]
        with warnings.catch_warnings():  # the bytes are read-only; nvJPEG only reads them
            warnings.simplefilter("ignore", UserWarning)
            data = [torch.frombuffer(payloads[i], dtype=torch.uint8) for i in jpegs]
        try:  # one call for the batch
            found = (
                decode_jpeg(
                    data, mode=ImageReadMode.RGB, device=target, apply_exif_orientation=False
                )
                if data
                else []
            )
        except RuntimeError:  # the call fails as a whole: each alone, the refused on the CPU
            found = [jpeg(d) for d in data]
        images: list[Any] = [None] * len(payloads)
        for i, image in zip(jpegs, found):  # nvJPEG ignores EXIF: turned here, as Pillow turns
            images[i] = None if image is None else _upright(image, exif_orientation(payloads[i]))
        for i, payload in enumerate(payloads):
            if images[i] is None:
                images[i] = on_cpu(payload, number, first + i, paths)
        return torch.stack([fitted(image) for image in images]).permute(0, 2, 3, 1)

    cpu = _CpuDecoder(cpu_workers, size, fit) if cpu_workers else None
    return GpuDecoded(batches, decoded, target, ahead, cpu)


def _upright(image: Any, orientation: int) -> Any:
    """A C x H x W ``image`` turned as Pillow's ``exif_transpose`` turns EXIF ``orientation``."""
    turn = _TURNS.get(orientation)
    return image if turn is None else turn(image)


# EXIF orientation -> the turn of a C x H x W image that stands it upright
# (packer.imaging.jpeg_turbo's, for H x W x C arrays).
_TURNS: dict[int, Callable[[Any], Any]] = {
    2: lambda t: t.flip(2),  # mirrored
    3: lambda t: t.flip(1, 2),  # upside down
    4: lambda t: t.flip(1),  # mirrored upside down
    5: lambda t: t.transpose(1, 2),  # transposed
    6: lambda t: t.transpose(1, 2).flip(2),  # turned a quarter, clockwise to fix
    7: lambda t: t.flip(1, 2).transpose(1, 2),  # transverse
    8: lambda t: t.transpose(1, 2).flip(1),  # turned a quarter, anticlockwise to fix
}


def _undecodable(number: int, i: int, paths: Any, reason: str) -> CorruptRecordError:
    path = paths[i] if paths is not None else "its path: open the reader with with_paths=True"
    return CorruptRecordError(
        "decode_on_gpu", f"batch {number}", i, path, f"does not decode: {reason}"
    )


class GpuDecoded(Iterator[tuple[Any, ...]]):
    """decode_on_gpu's batches, decoded a few ahead of the loop by a thread of its own (on a
    CUDA device, on a stream of its own). ``decoded_on``: how many images so far the device
    and the CPU workers decoded, ``{"device": n, "cpu_workers": m}``."""

    def __init__(
        self,
        batches: Iterable[tuple[Any, ...]],
        decoded: Callable[[list[Any], int, int, Any], Any],
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
    decoded: Callable[[list[Any], int, int, Any], Any],
    target: Any,
    ahead: int,
    cpu: _CpuDecoder | None,
    decoded_on: dict[str, int],
) -> Generator[tuple[Any, ...], None, None]:
    stream = torch.cuda.Stream(target) if target.type == "cuda" else None

    def produce() -> Iterator[tuple[tuple[Any, ...], Any]]:
        numbered = enumerate(batches)
        # Batches whose workers' part is under way: the next one's starts before this one's
        # device part, so that the workers never wait for the thread.
        started: deque[tuple[int, tuple[Any, ...], _CpuJob | None]] = deque()

        def start_next() -> None:
            for number, batch in itertools.islice(numbered, 1):
                _check_encoded(batch)
                job = None if cpu is None else cpu.submit(batch[0], number)
                started.append((number, batch, job))

        try:
            with torch.cuda.stream(stream) if stream else contextlib.nullcontext():
                start_next()
                start_next()
                while started:
                    number, batch, job = started.popleft()
                    payloads, labels = batch[0], batch[1]
                    paths = batch[2] if len(batch) > 2 else None
                    taken = 0 if job is None else job.taken
                    rest = (
                        decoded(payloads[taken:], number, taken, paths)
                        if payloads[taken:]
                        else None
                    )
                    start_next()
                    images: Any = rest if job is None else job.joined(rest, target, paths)
                    decoded_on["cpu_workers"] += taken
                    decoded_on["device"] += len(payloads) - taken
                    labels = torch.as_tensor(labels).to(target, non_blocking=True)
                    done = (images.contiguous(), labels) + (() if paths is None else (paths,))
                    finished = torch.cuda.Event() if stream else None
                    if finished is not None:
                        finished.record(stream)
                    yield done, finished
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
    """Worker processes that decode the first part of each batch, split among them, as the
    reader decodes (``packer.reading.decode_procs``' pool). Started on the first batch, by
    the thread that decodes ahead. ``share``: the part, a fraction of the batch."""

    # The share the workers start with: the device decodes about as fast as this many cores
    # (benchmarks/bench_gpu.py: nvJPEG against the cores, on an H200 machine).
    DEVICE_AS_CORES = 24

    def __init__(self, workers: int, size: tuple[int, int], fit: str) -> None:
        self.workers, self.size, self.fit = workers, size, fit
        self.share = workers / (workers + self.DEVICE_AS_CORES)
        self._pool: ProcessPoolExecutor | None = None

    def submit(self, payloads: list[Any], number: int) -> _CpuJob:
        if self._pool is None:
            kernel = threading.current_thread() is threading.main_thread()
            self._pool = start_pool(self.workers, _init_cpu_worker, (os.getpid(), kernel))
        taken = min(len(payloads), round(self.share * len(payloads)))
        bounds = np.linspace(0, taken, min(self.workers, taken) + 1).astype(int).tolist()
        try:
            parts = [
                self._pool.submit(_decode_part, payloads[start:end], self.size, self.fit)
                for start, end in zip(bounds[:-1], bounds[1:])
            ]
        except BrokenProcessPool:
            raise _worker_died(number) from None
        return _CpuJob(self, parts, bounds, number)

    def settle(self, waited: bool) -> None:
        """After a batch: a smaller share if the thread had to wait for the workers' part,
        else a little larger (the workers' pace, and the device's, change as the GPU trains)."""
        self.share = self.share * 0.9 if waited else min(1.0, self.share * 1.03 + 0.002)

    def close(self) -> None:
        if self._pool is not None:
            end_pool(self._pool)


class _CpuJob:
    """The workers' part of one batch, under way: its first ``taken`` records."""

    def __init__(
        self,
        decoder: _CpuDecoder,
        parts: list[Future[Any]],
        bounds: list[int],
        number: int,
    ) -> None:
        self.decoder, self.parts, self.number = decoder, parts, number
        self.starts, self.taken = bounds[:-1], bounds[-1]

    def joined(self, rest: Any, target: Any, paths: Any) -> Any:
        """The whole batch on ``target``: this part, once decoded, before ``rest`` (the
        device's part, or None)."""
        waited = not all(part.done() for part in self.parts)
        self.decoder.settle(waited)
        size = self.decoder.size
        # The part lands in pinned memory, so that its copy up runs beside the device's work.
        landed = torch.empty(
            (self.taken, *size, 3), dtype=torch.uint8, pin_memory=target.type == "cuda"
        )
        into = landed.numpy()
        for start, part in zip(self.starts, self.parts):
            try:
                got = part.result()
            except BrokenProcessPool:
                raise _worker_died(self.number) from None
            if isinstance(got, tuple):  # (the record's place in the part, why it failed)
                raise _undecodable(self.number, start + got[0], paths, got[1])
            into[start : start + len(got)] = got
        ours = landed.to(target, non_blocking=True)
        return ours if rest is None else torch.cat([ours, rest])


def _worker_died(number: int) -> PackerError:
    return PackerError(
        f"decode_on_gpu: a CPU decode worker died by batch {number} (killed, or out of memory)"
    )


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
