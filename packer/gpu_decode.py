"""JPEGs decoded on the GPU (nvJPEG, through torchvision), a few batches ahead of the loop.

Where the cores decode more slowly than the GPU trains, read the store's bytes
(``decode=False``) and decode them on the GPU instead (docs/benchmarks/gpu.md: on an H200
machine nvJPEG decoded 1.4x as fast as its 16 cores):

    with open_reader("train.lmdb", batch_size=256, seed=0, decode=False, workers=4) as reader:
        for images, labels in decode_on_gpu(reader.epoch(epoch), size=(224, 224)):
            ...  # uint8 N x 224 x 224 x 3 on the GPU, upright RGB

A thread of its own decodes each batch on a CUDA stream of its own, ``ahead`` batches ahead
of the loop, as the reader copies its batches: decoding overlaps the step, and the training
stream waits for its own batch alone. A batch's JPEGs go to nvJPEG in one call; a record
that is not a JPEG (a PNG in a mixed store, raw pixels) is decoded on the CPU as the reader
decodes it, then copied up, and so is a JPEG nvJPEG refuses (CMYK, say). nvJPEG ignores
EXIF: each image is turned upright here by its header's orientation, as Pillow turns it.
Each image is then brought to ``size`` as the reader's ``fit`` does ("crop": the centre at
the target's aspect ratio; "stretch"), antialiased bilinear.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from packer.about import require_torch
from packer.errors import CorruptRecordError, UsageError
from packer.imaging.decode import decode_array
from packer.imaging.headers import exif_orientation
from packer.imaging.jpeg_turbo import UPRIGHT_STEPS
from packer.imaging.resizing import centre_box
from packer.prefetch import Prefetcher

torch = require_torch("packer.gpu_decode")

__all__ = ["decode_on_gpu"]

_JPEG = b"\xff\xd8\xff"  # every JPEG starts so: the start-of-image marker, then a segment
_FITS = ("crop", "stretch")


def decode_on_gpu(
    batches: Iterable[tuple[Any, ...]],
    size: tuple[int, int],
    *,
    fit: str = "crop",
    device: str = "cuda",
    ahead: int = 3,
) -> Iterator[tuple[Any, ...]]:
    """Each batch of encoded records, decoded on ``device`` and brought to ``size``.

    ``batches``: a reader's epoch with ``decode=False`` (``reader.epoch(e)``); with
    ``with_paths=True`` the paths come along, and name a record that does not decode.
    Yields ``(images, labels[, paths])``: images uint8 N x H x W x 3 on ``device``, labels a
    tensor there. ``device="cpu"`` decodes with torchvision on the CPU (in the same thread
    ahead of the loop, without streams).

    Raises:
        UsageError: torchvision is missing, ``size``, ``fit`` or ``ahead`` cannot work, or the
            batches hold decoded images (a reader without ``decode=False``).
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

    def decoded(batch: tuple[Any, ...], number: int) -> tuple[Any, ...]:
        payloads, labels, paths = batch[0], batch[1], batch[2] if len(batch) > 2 else None
        if not isinstance(payloads, list) or not all(
            isinstance(p, (bytes, np.ndarray)) for p in payloads
        ):
            raise UsageError(
                "decode_on_gpu takes a reader's encoded records (a list of each record's "
                "bytes, as a store of encoded images gives them): open it with decode=False"
            )
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
                images[i] = on_cpu(payload, number, i, paths)
        stacked = torch.stack([fitted(image) for image in images]).permute(0, 2, 3, 1)
        labels = torch.as_tensor(labels).to(target, non_blocking=True)
        return (stacked.contiguous(), labels) + (() if paths is None else (paths,))

    return _ahead(batches, decoded, target, ahead)


def _upright(image: Any, orientation: int) -> Any:
    """A C x H x W ``image`` turned as Pillow's ``exif_transpose`` turns EXIF ``orientation``
    (the steps the CPU decoder takes, one axis further on)."""
    for flip in UPRIGHT_STEPS.get(orientation, ()):
        image = image.flip([axis + 1 for axis in flip]) if flip else image.transpose(1, 2)
    return image


def _undecodable(number: int, i: int, paths: Any, reason: str) -> CorruptRecordError:
    path = paths[i] if paths is not None else "its path: open the reader with with_paths=True"
    return CorruptRecordError(
        "decode_on_gpu", f"batch {number}", i, path, f"does not decode: {reason}"
    )


def _ahead(batches: Iterable[Any], decoded: Any, target: Any, ahead: int) -> Iterator[Any]:
    """``decoded(batch, number)`` of each batch, made by a Prefetcher's thread (on a CUDA
    device, on a stream of its own) up to ``ahead`` batches ahead of the loop."""
    stream = torch.cuda.Stream(target) if target.type == "cuda" else None

    def produce() -> Iterator[tuple[Any, Any]]:
        try:
            with torch.cuda.stream(stream) if stream else contextlib.nullcontext():
                for number, batch in enumerate(batches):
                    done = decoded(batch, number)
                    finished = torch.cuda.Event() if stream else None
                    if finished is not None:
                        finished.record(stream)
                    yield done, finished
        finally:
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
