"""A record, and how it is laid out as one LMDB value.

LMDB value layout (little-endian)::

    u32 n | n bytes of msgpack meta {"p": path, "l": [labels], "c": crc32, "s": [h, w, c], "f": format} | payload

The payload comes last and unframed, so a reader can take it as a zero-copy slice of the
value without msgpack copying it. msgpack, never pickle: opening a store from an untrusted
source must not run code. A pack reads each source file straight into this layout
(read_source), so that writing it to LMDB copies no bytes on the way.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

__all__ = [
    "Record",
    "Block",
    "SourceRead",
    "CRC32_BY",
    "checksum",
    "pack_value",
    "read_source",
    "unpack_value",
]

try:  # ISA-L's CRC-32: zlib's polynomial and values, several times zlib's speed
    from isal.isal_zlib import crc32 as _crc32

    CRC32_BY = "ISA-L"
except ImportError:  # a platform without its wheels (pyproject installs it where they exist)
    from zlib import crc32 as _crc32

    CRC32_BY = "zlib"

_LENGTH = struct.Struct("<I")
# A meta block is a few hundred bytes; anything larger is damage, not data.
_MAX_META = 1 << 20


def checksum(data: bytes | memoryview) -> int:
    """CRC-32 of a payload: cheap enough to check on every read, catches bit flips."""
    return _crc32(data) & 0xFFFFFFFF


@dataclass(slots=True)
class Record:
    data: bytes | memoryview  # encoded image bytes, or raw uint8 pixels in (h, w, c) order
    labels: tuple[int, ...]
    path: str  # original path, relative to the source folder
    crc32: int
    shape: tuple[int, int, int]  # upright height, width, channels as the reader yields them
    format: str  # "JPEG", "PNG", ... or "raw"
    # The whole LMDB value, ``data`` at its end, when the record was read that way
    # (read_source): pack_value then copies nothing.
    value: memoryview | None = None


@dataclass
class Block:
    """Consecutive records of one shard, column by column (what one sequential read returns).

    ``data`` is a list of payloads, or one (n, h, w, c) uint8 array for a raw store whose
    images all have one shape.
    """

    data: list[bytes | memoryview] | np.ndarray
    labels: np.ndarray  # (n, number of label columns) int64
    paths: list[str]
    crc32: np.ndarray  # (n,) uint32
    shapes: np.ndarray  # (n, 3) int32
    formats: list[str]

    def __len__(self) -> int:
        return len(self.paths)

    def record(self, i: int) -> Record:
        data = self.data[i]
        payload = data.tobytes() if isinstance(data, np.ndarray) else data
        return Record(
            payload,
            tuple(int(v) for v in self.labels[i]),
            self.paths[i],
            int(self.crc32[i]),
            (int(self.shapes[i, 0]), int(self.shapes[i, 1]), int(self.shapes[i, 2])),
            self.formats[i],
        )


def pack_value(record: Record) -> bytes | memoryview:
    if record.value is not None:
        return record.value
    meta = _meta(record.path, record.labels, record.crc32, record.shape, record.format)
    return b"".join((_LENGTH.pack(len(meta)), meta, record.data))


def _meta(
    path: str, labels: tuple[int, ...], crc32: int, shape: tuple[int, int, int], fmt: str
) -> bytes:
    return msgpack.packb({"p": path, "l": list(labels), "c": crc32, "s": list(shape), "f": fmt})


@dataclass(slots=True)
class SourceRead:
    """A source file's bytes and checksum, read before its shape and format are known (a
    header check looks at the bytes); ``record`` completes it."""

    data: memoryview  # what the file holds now, up to ``size + 1`` bytes (read_source)
    crc32: int
    path: str
    labels: tuple[int, ...]
    buffer: memoryview | None  # when framed: room for the LMDB value's header, then data
    room: int

    def record(self, shape: tuple[int, int, int], fmt: str) -> Record:
        """The record, its LMDB value (when framed) made by writing the header in front."""
        record = Record(self.data, self.labels, self.path, self.crc32, shape, fmt)
        if self.buffer is None:
            return record
        meta = _meta(self.path, self.labels, self.crc32, shape, fmt)
        start = self.room - _LENGTH.size - len(meta)
        if start < 0:  # a format name longer than any Pillow has: pack_value joins them
            return record
        self.buffer[start : self.room] = _LENGTH.pack(len(meta)) + meta
        record.value = self.buffer[start : self.room + len(self.data)]
        return record


def read_source(
    file: str, size: int, path: str, labels: tuple[int, ...], framed: bool
) -> SourceRead:
    """The source file at ``file``, ``size`` bytes when scanned. Its ``data`` is what the
    file holds now, up to ``size + 1`` bytes: another length says it changed.

    ``framed``: the bytes are read to the end of a buffer with room in front for the
    record's LMDB header (pack_value's), written there once shape, format and checksum are
    known. Joining the two afterwards copied every byte once more, holding the GIL: a fifth
    of what a warm header pack of LMDB held it for.

    Raises:
        OSError: the file cannot be read.
    """
    room = _LENGTH.size + len(_meta(path, labels, *_WIDEST)) if framed else 0
    buffer = np.empty(room + size + 1, np.uint8).data  # not zeroed: all used is written
    length = _read_into(file, buffer[room:])
    data = buffer[room : room + length]
    return SourceRead(data, checksum(data), path, labels, buffer if framed else None, room)


# CRC, shape and format in msgpack's widest forms for them, so that a header's room is
# never short: msgpack writes small numbers in fewer bytes; format names are a few letters.
_WIDEST = (0xFFFFFFFF, ((1 << 31) - 1,) * 3, "F" * 31)


def _read_into(file: str, buffer: memoryview) -> int:
    """Fill ``buffer`` from the file at ``file`` until it is full or the file ends; the bytes read."""
    fd = os.open(file, os.O_RDONLY)
    try:
        got = 0
        while got < len(buffer) and (n := os.readv(fd, [buffer[got:]])):
            got += n
        return got
    finally:
        os.close(fd)


def unpack_value(value: bytes | memoryview) -> Record:
    """Parse one LMDB value; the payload is a slice of ``value`` (no copy for a memoryview).

    Raises ValueError on a value that is not a packer record.
    """
    view = memoryview(value)
    if len(view) < _LENGTH.size:
        raise ValueError(f"record value is {len(view)} bytes, too short")
    (n,) = _LENGTH.unpack_from(view)
    if n > _MAX_META or _LENGTH.size + n > len(view):
        raise ValueError(f"record meta length {n} does not fit the {len(view)}-byte value")
    try:
        meta = msgpack.unpackb(view[_LENGTH.size : _LENGTH.size + n])
        path, labels, crc, shape, fmt = meta["p"], meta["l"], meta["c"], meta["s"], meta["f"]
    except (msgpack.UnpackException, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"record meta is damaged: {e or type(e).__name__}") from e
    # Checked here, once: a hostile value must reach neither NumPy nor a decoder. This runs
    # for every record read, so the common case is one flat expression; the failing field
    # is looked for only when it is false.
    if not (
        type(path) is str
        and type(fmt) is str
        and type(crc) is int
        and 0 <= crc < 1 << 32
        and type(labels) is list
        and all(type(v) is int and -(1 << 63) <= v < 1 << 63 for v in labels)
        and type(shape) is list
        and len(shape) == 3
        and all(type(v) is int and 0 <= v < 1 << 31 for v in shape)
    ):
        raise ValueError(f"record meta is damaged: {_damaged_field(meta)}")
    return Record(view[_LENGTH.size + n :], tuple(labels), path, crc, tuple(shape), fmt)


def _damaged_field(meta: dict[str, Any]) -> str:
    path, labels, crc, shape, fmt = meta["p"], meta["l"], meta["c"], meta["s"], meta["f"]
    fits = {
        "p": isinstance(path, str),
        "l": isinstance(labels, list) and all(_is_int(v, 63, signed=True) for v in labels),
        "c": _is_int(crc, 32),
        "s": isinstance(shape, list) and len(shape) == 3 and all(_is_int(v, 31) for v in shape),
        "f": isinstance(fmt, str),
    }
    key = next(k for k, ok in fits.items() if not ok)
    return f"{key!r} is {_show(meta[key])}"


def _is_int(value: object, bits: int, signed: bool = False) -> bool:
    """An int (not a bool) that fits in ``bits`` bits, plus a sign bit when ``signed``."""
    low = -(1 << bits) if signed else 0
    return type(value) is int and low <= value < 1 << bits


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
