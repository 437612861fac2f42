"""Turn one source file into what a record stores. Runs in the pack's worker processes.

Workers never touch the store: they check, decode and re-encode, and send back either the
new payload or, when the source bytes are stored untouched, only what they learned about
the file (its shape, format, checksum), so the big bytes are not pickled across processes.
"""

from __future__ import annotations

import os
import signal
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image

from packer.imaging import decode as imaging
from packer.imaging import headers
from packer.lifeline import die_with_parent
from packer.packing.options import PackOptions
from packer.store.record import checksum

__all__ = [
    "Prepared",
    "Rejected",
    "init_worker",
    "prepare_files",
    "prepare_file",
    "probed",
    "reason",
]


# Named tuples, not dataclasses: one comes back through the pool's pipe for every file, and a
# dataclass's pickling (field by field) cost several times a tuple's.
class Prepared(NamedTuple):
    payload: bytes | None  # None: store the source file's bytes as they are
    crc32: int | None  # checksum of the payload, or of the source bytes the worker checked
    shape: tuple[int, int, int]  # upright height, width, channels as the reader yields them
    format: str


class Rejected(NamedTuple):
    reason: str


_options: PackOptions | None = None
_PROBE_NICENESS = 10


def init_worker(options: PackOptions, parent: int) -> None:
    """Pool initializer: Ctrl-C is the parent's to handle; Pillow's bomb limit is ours."""
    global _options
    _options = options
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if options.probes_only and hasattr(os, "nice"):  # not on Windows
        # Probes need only stay ahead of the writer, which reads and writes every byte: at a
        # lower priority they use the time it leaves, where on two cores they took from it.
        os.nice(_PROBE_NICENESS)
    # A forked worker shares the pack's lock on its staging folder: left running after the
    # pack is killed, it would hold it forever, and the same command could not resume.
    die_with_parent(parent)
    # Decoders of broken files chatter: Python warnings, and libtiff writing straight to
    # fd 2. Every failure is reported through the result, so the noise only hides progress.
    warnings.simplefilter("ignore")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    # Pillow's own bomb check (it raises over twice this) stays on: some plugins rely on it
    # to stop parsing early. imaging._open refuses anything over max_pixels itself and words
    # Pillow's error the same way, so the reason always names --max-pixels.
    Image.MAX_IMAGE_PIXELS = options.max_pixels


def prepare_files(paths: list[str]) -> list[Prepared | Rejected]:
    """Worker task: prepare a batch of files (absolute paths), in order."""
    assert _options is not None, "init_worker was not called"
    return [prepare_file(Path(p), _options) for p in paths]


def prepare_file(path: Path, options: PackOptions, keep_bytes: bool = False) -> Prepared | Rejected:
    """What a record of ``path`` stores. Untouched source bytes are read again by the writer
    (sending them back through the pool's pipes costs more), unless ``keep_bytes``: a caller
    in the writer's own process keeps the bytes read here and reads each file once."""
    try:
        if options.probes_only:  # Pillow only for what packer.imaging.headers cannot settle
            info = headers.vouch_file(path, options.max_pixels)
            return probed(info or imaging.probe(path, options.max_pixels), options.mode)
        data = path.read_bytes()
        if options.payload == "original":
            info = imaging.verify(data, options.max_pixels)
            kept = data if keep_bytes else None
            return Prepared(kept, checksum(data), _shape(info, options.mode), info.format)
        return _transform(data, options)
    except Exception as e:  # noqa: BLE001 - any exception from a decoder means "bad image"
        return Rejected(reason(e))


def _transform(data: bytes, options: PackOptions) -> Prepared:
    if options.raw and options.max_side is None and options.size is None:
        # Pixels as they are: a JPEG's straight from libjpeg-turbo, no Pillow image between.
        return _raw(imaging.decode_array(data, options.mode, options.max_pixels))
    pixels = imaging.decode_resized(
        data, options.mode, options.max_pixels, options.max_side, options.size, options.fit
    )
    if options.raw:
        return _raw(pixels)
    im = imaging.from_array(pixels)
    encoding = options.encoding or "jpeg"
    payload = imaging.encode(im, encoding, options.quality)
    channels = imaging.CHANNELS[im.mode] if encoding != "jpeg" or im.mode == "L" else 3
    return Prepared(payload, checksum(payload), (im.height, im.width, channels), encoding.upper())


def _raw(pixels: np.ndarray) -> Prepared:
    payload = pixels.tobytes()
    height, width, channels = pixels.shape
    return Prepared(payload, checksum(payload), (height, width, channels), "raw")


def probed(info: imaging.ImageInfo, mode: str) -> Prepared:
    """What a header check of a file stored as it is tells its record: shape and format."""
    return Prepared(None, None, _shape(info, mode), info.format)


def _shape(info: imaging.ImageInfo, mode: str) -> tuple[int, int, int]:
    channels = imaging.CHANNELS[imaging.output_mode(info.mode, info.has_transparency, mode)]
    return (info.height, info.width, channels)


def reason(e: Exception) -> str:
    """One line that says why a file was not packed."""
    if isinstance(e, Image.UnidentifiedImageError):
        return "not an image (Pillow cannot identify it)"
    if isinstance(e, OSError) and e.errno is not None:  # the file itself: EACCES, EIO, ...
        return f"cannot read: {e.strerror}"
    return f"{type(e).__name__}: {e}"  # a decoder's own error: truncated, corrupt, too large
