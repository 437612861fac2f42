"""A record, and how records are laid out in LMDB values.

A block (the "blocks" layout, format 5) holds consecutive records of a shard in one value
(little-endian)::

    payloads back to back | padding | header | u32 length of the header

The header is zlib-compressed msgpack: ``{"offsets": u32 (n + 1), "crc32": u32 (n),
"labels": i64 (n, label columns), "shapes": i32 (n, 3), "formats": [names], "format_of": u8
(n), "paths": the n paths joined by NUL}``, the arrays as bytes; record k's payload is
``value[offsets[k]:offsets[k + 1]]``. Its columns compress well together (a path costs a few
bytes), so a block of small records takes about their bytes, where one value a record took a
whole 4 KB page of LMDB's for a 2-3 KB image. Payloads come first, so that a large record, a
block of its own, is read straight into its value with room after it for the header
(read_source): writing it to LMDB copies no bytes on the way.

The "records" layout (formats 1 to 4), one record a value::

    u32 n | n bytes of msgpack meta {"p": path, "l": [labels], "c": crc32, "s": [h, w, c], "f": format} | payload

msgpack, never pickle: opening a store from an untrusted source must not run code.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

__all__ = [
    "Record",
    "Block",
    "BlockIndex",
    "SourceRead",
    "BLOCK_BYTES",
    "CRC32_BY",
    "checksum",
    "block_value",
    "parse_block",
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
# Payload bytes of a block: records smaller than this share blocks of at most this many
# bytes, larger ones have a block each. LMDB gives a value whole 4 KB pages, so a block wastes
# half a page on average, a small share of this. Reading a few records of a block reads its header
# (tens of KB for the smallest records) and their own pages only.
BLOCK_BYTES = 256 << 10
_HEADER_LEVEL = 6  # zlib's default: lower left headers larger, higher took far longer
# A block's header inflates to some 60 bytes a record plus its path (at most 4 KB, Linux's
# PATH_MAX); more is damage, and must not be inflated into memory.
_MAX_RECORD_HEADER = 64 + 4096
# What a parsed header holds beside its columns (BlockIndex.nbytes): CPython's str object
# around an ASCII path's characters, and the objects of the index itself.
_STR_OBJECT, _INDEX_OBJECTS = 49, 1024
_HEADER_KEYS = ("offsets", "crc32", "labels", "shapes", "formats", "format_of", "paths")


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


def pack_value(record: Record) -> bytes:
    """The record as one value of the "records" layout (formats 1 to 4; packer now writes
    blocks, see block_value)."""
    meta = _meta(record.path, record.labels, record.crc32, record.shape, record.format)
    return b"".join((_LENGTH.pack(len(meta)), meta, record.data))


def _meta(
    path: str, labels: tuple[int, ...], crc32: int, shape: tuple[int, int, int], fmt: str
) -> bytes:
    return msgpack.packb({"p": path, "l": list(labels), "c": crc32, "s": list(shape), "f": fmt})


@dataclass
class BlockIndex:
    """What a block's header says of its records (parse_block)."""

    offsets: np.ndarray  # (n + 1,) uint32: record k's payload is value[offsets[k]:offsets[k + 1]]
    crc32: np.ndarray  # (n,) uint32
    labels: np.ndarray  # (n, label columns) int64
    shapes: np.ndarray  # (n, 3) int32
    formats: list[str]
    paths: list[str]
    row_bytes: int = -1  # every payload's size where all are one size (raw pixels), else -1

    def __len__(self) -> int:
        return len(self.paths)

    def nbytes(self) -> int:
        """The memory it holds, about: its columns, and per record a path (a str object
        and its list slot) and a format's list slot."""
        columns = self.offsets.nbytes + self.crc32.nbytes + self.labels.nbytes
        paths = sum(map(len, self.paths)) + (_STR_OBJECT + 16) * len(self.paths)
        return _INDEX_OBJECTS + columns + self.shapes.nbytes + paths


def block_value(records: Sequence[Record], label_columns: int, min_bytes: int = 0) -> bytes:
    """The LMDB value of a block holding ``records``, padded to ``min_bytes`` if shorter.

    Raises ValueError if the block's payloads reach 4 GiB (offsets are 32-bit).
    """
    payloads = [record.data for record in records]
    offsets = np.zeros(len(payloads) + 1, np.int64)
    np.cumsum([len(p) for p in payloads], out=offsets[1:])
    header = _block_header(records, offsets, label_columns)
    pad = max(0, min_bytes - int(offsets[-1]) - len(header) - _LENGTH.size)
    return b"".join([*payloads, bytes(pad), header, _LENGTH.pack(len(header))])


def _block_header(records: Sequence[Record], offsets: np.ndarray, label_columns: int) -> bytes:
    if offsets[-1] >= 1 << 32:
        raise ValueError(f"{records[0].path}: a payload of 4 GiB or more is not supported")
    n = len(records)
    names = sorted({record.format for record in records})
    code = {name: i for i, name in enumerate(names)}
    header = {
        "offsets": offsets.astype("<u4").tobytes(),
        "crc32": np.array([r.crc32 for r in records], "<u4").tobytes(),
        "labels": np.array([r.labels for r in records], "<i8").reshape(n, label_columns).tobytes(),
        "shapes": np.array([r.shape for r in records], "<i4").reshape(n, 3).tobytes(),
        "formats": names,
        "format_of": bytes(code[r.format] for r in records),
        "paths": "\0".join(r.path for r in records),  # no path holds a NUL
    }
    return zlib.compress(msgpack.packb(header), _HEADER_LEVEL)


def parse_block(value: bytes | memoryview, count: int, label_columns: int) -> BlockIndex:
    """The header of a block that holds ``count`` records, checked against the value: a
    hostile value reaches neither NumPy nor a decoder, and cannot inflate without bound.

    Raises ValueError naming what is damaged.
    """
    view = memoryview(value)
    end = len(view) - _LENGTH.size
    if end < 0:
        raise ValueError(f"block value is {len(view)} bytes, too short")
    (length,) = _LENGTH.unpack_from(view, end)
    if length > end:
        raise ValueError(
            f"block header length {length:,} does not fit the {len(view):,}-byte value"
        )
    inflate = zlib.decompressobj()
    try:
        limit = 1024 + count * (_MAX_RECORD_HEADER + 8 * label_columns)
        raw = inflate.decompress(view[end - length : end], limit)
        header = msgpack.unpackb(raw, max_array_len=max(count, 1), max_map_len=len(_HEADER_KEYS))
        offsets, crc32, labels, shapes, names, codes, joined = (header[k] for k in _HEADER_KEYS)
        paths = joined.split("\0") if type(joined) is str else None
    except (zlib.error, msgpack.UnpackException, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"block header is damaged: {e or type(e).__name__}") from e
    if not inflate.eof:
        raise ValueError("block header is damaged: it does not end where its length says")
    if not (
        type(offsets) is bytes
        and len(offsets) == 4 * (count + 1)
        and type(crc32) is bytes
        and len(crc32) == 4 * count
        and type(labels) is bytes
        and len(labels) == 8 * count * label_columns
        and type(shapes) is bytes
        and len(shapes) == 12 * count
        and type(names) is list
        and all(type(name) is str for name in names)
        and type(codes) is bytes
        and len(codes) == count
        and (not codes or max(codes) < len(names))
        and paths is not None
        and len(paths) == count
    ):
        raise ValueError(f"block header is damaged: not the columns of {count} records")
    # Views of the header's bytes, not copies: a block's columns are only ever sliced.
    bounds = np.frombuffer(offsets, "<u4")
    sizes = np.frombuffer(shapes, "<i4").reshape(count, 3)
    if (bounds[1:] < bounds[:-1]).any() or bounds[-1] > end - length or (sizes < 0).any():
        raise ValueError("block header is damaged: its offsets or shapes are impossible")
    steps = np.diff(bounds)
    return BlockIndex(
        offsets=bounds,
        crc32=np.frombuffer(crc32, "<u4"),
        labels=np.frombuffer(labels, "<i8").reshape(count, label_columns),
        shapes=sizes,
        formats=names * count if len(names) == 1 else [names[i] for i in codes],
        paths=paths,
        row_bytes=int(steps[0]) if count and bool((steps == steps[0]).all()) else -1,
    )


@dataclass(slots=True)
class SourceRead:
    """A source file's bytes and checksum, read before its shape and format are known (a
    header check looks at the bytes); ``record`` completes it."""

    data: memoryview  # what the file holds now, up to ``size + 1`` bytes (read_source)
    crc32: int
    path: str
    labels: tuple[int, ...]
    buffer: memoryview | None  # when framed: data, then room for a block's header

    def record(self, shape: tuple[int, int, int], fmt: str) -> Record:
        """The record; when framed, its ``value`` the LMDB block of it alone, made by
        writing the header after the data."""
        record = Record(self.data, self.labels, self.path, self.crc32, shape, fmt)
        if self.buffer is None:
            return record
        n = len(self.data)
        header = _block_header([record], np.array([0, n], np.int64), len(self.labels))
        end = n + len(header) + _LENGTH.size
        if end > len(self.buffer):  # a format name longer than any Pillow has: joined instead
            return record
        self.buffer[n:end] = header + _LENGTH.pack(len(header))
        record.value = self.buffer[:end]
        return record


def read_source(
    file: str, size: int, path: str, labels: tuple[int, ...], framed: bool
) -> SourceRead:
    """The source file at ``file``, ``size`` bytes when scanned. Its ``data`` is what the
    file holds now, up to ``size + 1`` bytes: another length says it changed.

    ``framed``: a file of BLOCK_BYTES or more, an LMDB block of its own, is read into a
    buffer with room after it for the block's header, written there once shape, format and
    checksum are known. Joining the two afterwards copied every byte once more, holding the
    GIL: a fifth of what a warm header pack of LMDB held it for.

    Raises:
        OSError: the file cannot be read.
    """
    room = _header_room(path, labels) if framed and size >= BLOCK_BYTES else 0
    buffer = np.empty(size + 1 + room, np.uint8).data  # not zeroed: all used is written
    length = _read_into(file, buffer[: size + 1])
    data = buffer[:length]
    return SourceRead(data, checksum(data), path, labels, buffer if room else None)


def _header_room(path: str, labels: tuple[int, ...]) -> int:
    """Bytes enough for the header and length of a block of one record with this path and
    labels (its columns have fixed sizes; format names are a few letters), with zlib's
    bound on what deflating can add."""
    header = {
        "offsets": bytes(8),
        "crc32": bytes(4),
        "labels": bytes(8 * len(labels)),
        "shapes": bytes(12),
        "formats": ["F" * 31],
        "format_of": bytes(1),
        "paths": path,
    }
    n = len(msgpack.packb(header))
    return n + (n >> 12) + (n >> 14) + 64 + _LENGTH.size


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
