"""HDF5 shards: columns of equal length, one row per record, readable by h5py, PyTables, h5dump.

Layout of one shard file::

    /data      uint8 (total payload bytes,)   every payload back to back, in record order
    /offsets   uint64 (n + 1,)                record i is data[offsets[i]:offsets[i+1]]
    /images    uint8 (n, h, w, c)             instead of data/offsets for raw pixels of one shape
    /labels    int64 (n, number of label columns)
    /crc32     uint32 (n,)
    /shapes    int32 (n, 3)                   upright height, width, channels
    /formats   uint8 (n,)                     index into the attribute format_names
    /path_bytes    uint8 (total path bytes,)  every original relative path, UTF-8, back to back
    /path_offsets  uint64 (n + 1,)            path i is path_bytes[path_offsets[i]:path_offsets[i+1]]
    attribute "packer" on the root            the shard's own metadata, as JSON

The file is written in HDF5 1.10's format (superblock v3, v2 object headers, extensible-array
chunk indexes), whose every metadata block carries a checksum, and holds no variable-length
data (paths are bytes with offsets, attributes fixed-length strings): the global heap such
data lives in is the one metadata block HDF5 leaves unchecked, and damage there made libhdf5
loop forever. So a damaged shard is an error from libhdf5, never a hang.

Shards packed before this layout (superblock v0, ``/paths`` variable-length UTF-8) still read;
their metadata has no checksums, so packer checks such a file's hash before libhdf5 parses it
(``checksummed_metadata``; ``packer.store.access``).

One flat byte dataset plus offsets, not a vlen dataset: a range of records is then one
contiguous slice, read in one call and split without copying (benchmarks/bench_hdf5_layout.py
measures the two).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from packer.store.base import Fetched, ShardMeta, check_index, check_range, merge_ranges
from packer.store.manifest import fsync_path
from packer.store.record import Block, Record

__all__ = [
    "Hdf5ShardWriter",
    "Hdf5ShardReader",
    "SPAN",
    "PATH_SPAN",
    "checksummed_metadata",
    "is_disk_full",
]

# HDF5 chunk of the payload dataset: 16 MiB reads fastest (faster than a vlen dataset, and on
# par with a contiguous one; benchmarks/bench_hdf5_layout.py), smaller for a small shard,
# whose last chunk would otherwise be mostly empty space.
_MAX_CHUNK_BYTES = 16 << 20
_MIN_CHUNK_BYTES = 64 << 10
_SPACE_MARGIN = 8 << 20  # room held beyond the payloads for HDF5's metadata and caches
_COLUMN_ROWS = 4096  # rows of a small column's chunk (labels, CRC-32s, shapes, paths' offsets)
# Payload bytes buffered in memory between writes: larger buffers made a warm header pack's
# CPU time erratic from run to run, this size did not (benchmarks/bench_pack.py).
_FLUSH_BYTES = 2 << 20
# Files readable by HDF5 1.10 and later, in the formats whose metadata carries checksums.
_LIBVER = ("v110", "v110")
_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_COMPRESSION: dict[str | None, dict[str, Any]] = {
    None: {},
    "gzip": {"compression": "gzip", "compression_opts": 4},
    "lzf": {"compression": "lzf"},
}


class Hdf5ShardWriter:
    """Writes one HDF5 shard; payloads go out in 2 MB slices, the small columns at close."""

    def __init__(self, path: Path, meta: ShardMeta, expected_bytes: int = 0) -> None:
        if meta.compression not in _COMPRESSION:
            raise ValueError(f"unknown HDF5 compression {meta.compression!r}; use gzip or lzf")
        self.path = path
        self.meta = meta
        self._file = h5py.File(path, "w", track_order=False, libver=_LIBVER)
        self._room = _Room(path)
        try:
            self._room.hold(0)  # the margin: libhdf5 flushes metadata even when aborted
        except OSError:
            self.abort()
            raise
        # fill_time="never": no zero-fill of a chunk before it is written, which is then
        # written once, not twice.
        filters = {**_COMPRESSION[meta.compression], "fill_time": "never"}
        expected_bytes = expected_bytes or _MAX_CHUNK_BYTES * 8  # unknown: full-size chunks
        if meta.raw_shape is not None:
            h, w, c = meta.raw_shape
            rows = _chunk_bytes(expected_bytes, h * w * c) // (h * w * c)
            self._payloads = self._file.create_dataset(
                "images",
                (0, h, w, c),
                np.uint8,
                maxshape=(None, h, w, c),
                chunks=(rows, h, w, c),
                track_times=False,
                **filters,
            )
        else:
            self._payloads = self._file.create_dataset(
                "data",
                (0,),
                np.uint8,
                maxshape=(None,),
                chunks=(_chunk_bytes(expected_bytes, 1),),
                track_times=False,
                **filters,
            )
        # Payloads are copied into one reused staging array as they come and written out
        # when it is full. Joining them into a new buffer at each write cost more than the
        # copy: glibc returns freed blocks that large to the OS, so every write page-faulted
        # its buffer afresh.
        self._staged = np.empty(_FLUSH_BYTES, np.uint8)
        self._staged_bytes = 0
        self._written = 0  # payload rows (raw) or bytes (flat) already in the file
        self._offsets = [0]
        self._labels: list[tuple[int, ...]] = []
        self._crc32: list[int] = []
        self._shapes: list[tuple[int, int, int]] = []
        self._formats: list[str] = []
        self._paths: list[str] = []

    def append(self, record: Record) -> None:
        if self.meta.raw_shape is not None:
            self.meta.check_row(record)  # the rows are cut from the staged bytes by size
        payload = np.frombuffer(record.data, np.uint8)
        if self._staged_bytes + len(payload) > len(self._staged):
            self._flush()
        if len(payload) > len(self._staged):
            self._write(payload)  # larger than the staging array: straight to the file
        else:
            self._staged[self._staged_bytes : self._staged_bytes + len(payload)] = payload
            self._staged_bytes += len(payload)
        self._offsets.append(self._offsets[-1] + len(payload))
        self._labels.append(record.labels)
        self._crc32.append(record.crc32)
        self._shapes.append(record.shape)
        self._formats.append(record.format)
        self._paths.append(record.path)

    def _flush(self) -> None:
        if self._staged_bytes:
            self._write(self._staged[: self._staged_bytes])
            self._staged_bytes = 0

    def _write(self, payloads: np.ndarray) -> None:
        """Append ``payloads`` (whole records' bytes, back to back) to the payload dataset."""
        self._room.hold(self._allocated() + len(payloads))
        if self.meta.raw_shape is not None:
            payloads = payloads.reshape(-1, *self.meta.raw_shape)
        # HDF5's own calls through h5py's low-level API: its slicing (resize, then assign)
        # adds Python work to every write.
        dataset, start, stop = self._payloads.id, self._written, self._written + len(payloads)
        with _disk_full_named(self.path):
            dataset.set_extent((stop, *payloads.shape[1:]))
            space = dataset.get_space()
            space.select_hyperslab((start,) + (0,) * (payloads.ndim - 1), payloads.shape)
            dataset.write(h5py.h5s.create_simple(payloads.shape), space, payloads)
        self._written = stop

    def close(self, sync: bool = True) -> None:
        self._flush()
        paths = [p.encode() for p in self._paths]
        self._room.hold(self._allocated() + len(paths) * 64 + sum(map(len, paths)))
        with _disk_full_named(self.path):
            self._write_columns(paths)
            self._file.close()
        self._room.close()
        if sync:
            fsync_path(self.path)

    def _write_columns(self, paths: list[bytes]) -> None:
        """Every column but the payloads, and the shard's own metadata."""
        f, n = self._file, len(paths)
        column = partial(_small_column, f)
        if self.meta.raw_shape is None:
            column("offsets", np.array(self._offsets, np.uint64))
        column("labels", np.array(self._labels, np.int64).reshape(n, self.meta.num_label_columns))
        column("crc32", np.array(self._crc32, np.uint32))
        column("shapes", np.array(self._shapes, np.int32).reshape(n, 3))
        names = sorted(set(self._formats))
        codes = {name: i for i, name in enumerate(names)}
        column("formats", np.array([codes[x] for x in self._formats], np.uint8))
        _set_json(f["formats"].attrs, "format_names", names)
        column("path_offsets", np.cumsum([0, *map(len, paths)], dtype=np.uint64))
        column("path_bytes", np.frombuffer(b"".join(paths), np.uint8))
        meta = {
            "index": self.meta.index,
            "num_records": n,
            "num_label_columns": self.meta.num_label_columns,
            "raw_shape": self.meta.raw_shape,
            **self.meta.extra,
        }
        _set_json(f.attrs, "packer", meta)

    def _allocated(self) -> int:
        """Bytes of the file HDF5 may have allocated by now, at most: every chunk of payloads
        written, uncompressed, and one to spare (the chunk cache holds unwritten ones)."""
        payloads = self._payloads
        chunk = int(np.prod(payloads.chunks))  # uint8
        written = self._written * int(np.prod(payloads.shape[1:]))  # rows (raw) or bytes
        return (written // chunk + 2) * chunk

    def abort(self) -> None:
        """Release the file, which the caller deletes; libhdf5's flush at close stays in the
        room held for it."""
        with contextlib.suppress(Exception):  # an error here would hide the one that matters
            self._file.close()
        self._room.close()


def _chunk_bytes(expected: int, row_bytes: int) -> int:
    """Bytes of a payload chunk, whole rows: at most _MAX_CHUNK_BYTES, at least
    _MIN_CHUNK_BYTES where the shard holds that much, and dividing the ``expected`` payload
    into whole chunks, so that the last one is full: HDF5 allocates every chunk whole, and
    a last chunk's empty tail made a store of 64 KB images much larger than their files
    (benchmarks/bench_store_size.py)."""
    rows = max(1, -(-expected // row_bytes))
    chunks = max(-(-expected // _MAX_CHUNK_BYTES), min(8, max(1, expected // _MIN_CHUNK_BYTES)))
    return -(-rows // chunks) * row_bytes


def _small_column(f: h5py.File, name: str, data: np.ndarray) -> None:
    """One of the small columns, deflated (with HDF5's byte shuffle) in chunks of
    _COLUMN_ROWS rows: uncompressed, their tens of bytes a record made a store of 500-byte
    images much larger than their files (benchmarks/bench_blocks.py). A reader inflates a
    chunk per column for a lone record, and every chunk once when reading in order (_Spans).
    An empty one (no records, no label columns) cannot be chunked."""
    if not data.size:
        f.create_dataset(name, data=data, track_times=False)
        return
    rows = min(len(data), _COLUMN_ROWS)
    column = f.create_dataset(
        name,
        data=data,
        chunks=(rows, *data.shape[1:]),
        compression="gzip",
        shuffle=True,
        track_times=False,
    )
    # Its chunks wait in HDF5's chunk cache until flushed: flushed now, so that they take
    # their place in the file in this order, not whenever Python happens to close the
    # dataset (the same records must make the same file, wherever they are packed).
    column.id.flush()


def _set_json(attrs: h5py.AttributeManager, name: str, value: Any) -> None:
    """An attribute holding ``value`` as JSON, a fixed-length UTF-8 string: it lives in its
    object's header, under the header's checksum, where a variable-length one (h5py's default
    for a str) would live in the unchecked global heap."""
    text = json.dumps(value).encode()
    attrs.create(name, np.array(text), dtype=h5py.string_dtype("utf-8", len(text)))


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` says the disk is full, in any of the ways h5py does: an OSError with
    errno ENOSPC, or a RuntimeError or errno-less OSError whose message quotes libhdf5's
    "errno = 28"."""
    return getattr(e, "errno", None) == errno.ENOSPC or "errno = 28," in str(e)


@contextlib.contextmanager
def _disk_full_named(path: Path) -> Iterator[None]:
    """Raise libhdf5's word for a full disk as the OSError(ENOSPC) a full disk is elsewhere."""
    try:
        yield
    except (RuntimeError, OSError) as e:
        if is_disk_full(e):
            raise OSError(errno.ENOSPC, "No space left on device", str(path)) from e
        raise


class _Room:
    """Disk space held for a shard file before libhdf5 writes there. libhdf5 does not survive
    a full disk: a write or flush that fails leaves its objects to crash the process later
    (a segfault when Python frees them, seen when another process filled the disk during a
    pack), and a check of free space before each write loses that race. So the blocks are
    allocated to the file itself, beyond its end (Linux's fallocate, FALLOC_FL_KEEP_SIZE),
    before libhdf5 needs them: a full disk then fails here, in Python, and libhdf5's writes
    land in blocks the file already owns. Those left over are freed at close. Elsewhere, a
    check of free space, racy as it is."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY)
        self._held = 0

    def hold(self, nbytes: int) -> None:
        """Make sure the file owns its first ``nbytes`` bytes, and a margin beyond."""
        target = nbytes + _SPACE_MARGIN
        if target <= self._held:
            return
        assert self._fd is not None, "hold after close"
        ahead = -(-target // _HOLD_STEP) * _HOLD_STEP  # a whole step, where the disk has it
        if _fallocate is not None and _fallocate(self._fd, _KEEP_SIZE, 0, ahead) == 0:
            self._held = ahead
            return
        if _fallocate is None or _fallocate(self._fd, _KEEP_SIZE, 0, target) != 0:
            failed = ctypes.get_errno() if _fallocate is not None else errno.EOPNOTSUPP
            free = shutil.disk_usage(self.path.parent).free
            if failed == errno.ENOSPC or free < target - os.fstat(self._fd).st_size:
                raise OSError(
                    errno.ENOSPC, f"No space left on device ({free:,} bytes free)", str(self.path)
                )
        self._held = target

    def close(self) -> None:
        """Free the blocks held past the file's end, and let go of the file."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):  # shrinking to the size frees them everywhere
            size = os.fstat(self._fd).st_size
            os.ftruncate(self._fd, size + 1)
            os.ftruncate(self._fd, size)
        os.close(self._fd)
        self._fd = None


_KEEP_SIZE = 1  # FALLOC_FL_KEEP_SIZE, <linux/falloc.h>
# Blocks are held in steps this large: held a few MB at a time, ahead of libhdf5's 2 MB
# writes into 16 MB chunks, a shard's blocks came out of order on the disk, and reading the
# file in order made requests of 130 KB on average (a 7200 rpm disk read it at a sixth of its
# speed: benchmarks/bench_storage.py).
_HOLD_STEP = 64 << 20


def _libc_fallocate() -> Any:
    """libc's fallocate(fd, mode, offset, len), or None where there is none (not Linux)."""
    try:
        function = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    return function


_fallocate = _libc_fallocate()


def _with_chunk_cache(f: h5py.File, name: str) -> h5py.Dataset:
    """The payload dataset; a compressed one gets a chunk cache of a few chunks, so that reads
    smaller than a chunk do not decompress the same chunk again and again."""
    dataset = f[name]
    if dataset.compression is None:
        return dataset
    chunk_bytes = int(np.prod(dataset.chunks)) * dataset.dtype.itemsize
    access = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    access.set_chunk_cache(521, 4 * chunk_bytes, 1.0)
    return h5py.Dataset(h5py.h5d.open(f.id, name.encode(), access))


# A shard file's payload dataset, uncompressed, cannot hold more bytes than the file; deflate
# packs at most 1032 bytes into one (lzf fewer). HDF5 reads chunks never written as zeros, so a
# hostile dataset shape would otherwise ask for terabytes.
_MAX_RATIO = {None: 1, "gzip": 1032, "lzf": 1032}
# Records whose small columns a reader reading in order reads in one go: reading them per
# block cost five HDF5 calls per chunk, more than the pixels of small raw records. Paths take
# fewer: h5py reads each variable-length string into its own allocation (16 MB of heap for
# 65,536 paths).
SPAN = 1 << 16
PATH_SPAN = 1 << 12


class _Spans:
    """Slices of a few columns, read ``span`` rows at a time and the last span kept, once a
    second block in a row falls in the same span. Blocks scattered over a large shard (a
    shuffled epoch) are read as they are: a span re-read for each would cost more than the
    block's own pixels."""

    def __init__(self, columns: tuple[h5py.Dataset, ...], span: int) -> None:
        self._columns, self._span = columns, span
        self._kept: tuple[int, tuple[np.ndarray, ...]] | None = None
        self._last = -1  # the span of the last block read

    def read(self, start: int, stop: int) -> tuple[np.ndarray, ...]:
        first = start - start % self._span
        last, self._last = self._last, first
        if stop > first + self._span:  # a block across spans: read as it is
            return tuple(c[start:stop] for c in self._columns)
        kept = self._kept
        if kept is None or kept[0] != first:
            if first != last:  # a lone block from this span (scattered reads): as it is
                return tuple(c[start:stop] for c in self._columns)
            end = first + self._span
            kept = self._kept = (first, tuple(c[first:end] for c in self._columns))
        a, b = start - first, stop - first
        return tuple(c[a:b] for c in kept[1])


class _ChunkMap:
    """Where the rows of a chunked dataset lie in the file (for /data a row is a byte): rows
    ``lo`` to ``hi`` as (file offset, length) pieces, from HDF5's chunk index, looked up once
    per chunk. A compressed chunk's rows cannot be told apart: its pieces are whole chunks
    (``compressed``), which HDF5 reads and inflates."""

    def __init__(self, dataset: h5py.Dataset) -> None:
        self._id = dataset.id
        self.compressed = dataset.compression is not None
        self._sizes: dict[int, int] = {}
        self._rows = dataset.chunks[0]  # rows per chunk; chunks span whole rows
        self._row_bytes = int(np.prod(dataset.shape[1:], dtype=np.int64))
        self._tail = (0,) * (len(dataset.shape) - 1)
        self._offsets: dict[int, int | None] = {}

    def pieces(self, lo: int, hi: int) -> list[tuple[int, int]] | None:
        """None if a chunk of them was never written (only damage does that)."""
        out = []
        for chunk in range(lo // self._rows, -(-hi // self._rows)):
            first = chunk * self._rows
            if chunk not in self._offsets:
                info = self._id.get_chunk_info_by_coord((first, *self._tail))
                self._offsets[chunk], self._sizes[chunk] = info.byte_offset, info.size
            offset = self._offsets[chunk]
            if offset is None:
                return None
            if self.compressed:
                out.append((offset, self._sizes[chunk]))
                continue
            a, b = max(lo, first), min(hi, first + self._rows)
            out.append((offset + (a - first) * self._row_bytes, (b - a) * self._row_bytes))
        return out

    def bounds(self) -> tuple[int, int]:
        """The first byte of the first chunk and the end of the last, in the file."""
        ends = [self._id.get_chunk_info(i) for i in range(self._id.get_num_chunks())]
        placed = [(c.byte_offset, c.byte_offset + c.size) for c in ends if c.byte_offset]
        return (min(a for a, _ in placed), max(b for _, b in placed)) if placed else (0, 0)


class _FlatPaths:
    """Paths of the flat layout, as _Spans returns a column's: offsets read by span, then the
    bytes of a block's paths in one slice."""

    def __init__(self, offsets: h5py.Dataset, data: h5py.Dataset) -> None:
        self._offsets, self._data = _Spans((offsets,), SPAN), data

    def read(self, start: int, stop: int) -> tuple[list[bytes]]:
        (offsets,) = self._offsets.read(start, stop + 1)
        bounds = offsets.astype(np.int64)
        if bounds[0] < 0 or bounds[-1] > len(self._data) or np.any(np.diff(bounds) < 0):
            raise ValueError(
                f"the path offsets of records {start}..{stop - 1} are damaged "
                f"(they leave the {len(self._data):,} path bytes)"
            )
        data = self._data[bounds[0] : bounds[-1]].tobytes()
        cuts = (bounds - bounds[0]).tolist()
        return ([data[a:b] for a, b in zip(cuts[:-1], cuts[1:])],)


def checksummed_metadata(path: Path) -> bool:
    """Whether the HDF5 file at ``path`` is in a format whose metadata carries checksums
    (superblock v2 or later), read from its first bytes before libhdf5 parses anything.
    Packer's own shards start with the superblock (no user block)."""
    with open(path, "rb") as f:
        head = f.read(len(_SIGNATURE) + 1)
    return head[:-1] == _SIGNATURE and head[-1] >= 2


def _check_columns(reader: Hdf5ShardReader, file_bytes: int) -> None:
    """Refuse (ValueError) columns of the wrong length, type or size, before any read."""
    n, payload = reader._len, reader._payload
    wanted = {
        "labels": (reader._labels, (n, -1)),
        "crc32": (reader._crc32, (n,)),
        "shapes": (reader._shapes, (n, 3)),
        "formats": (reader._formats, (n,)),
        **reader._path_columns(),
        **({"images": (payload, (n, -1, -1, -1))} if reader._raw else {"data": (payload, (-1,))}),
        **({"offsets": (reader._offsets, (n + 1,))} if reader._offsets is not None else {}),
    }
    for name, (dataset, shape) in wanted.items():
        got = dataset.shape
        fits = len(got) == len(shape) and all(w in (-1, g) for w, g in zip(shape, got))
        strings = h5py.check_string_dtype(dataset.dtype) is not None
        typed = strings if name == "paths" else dataset.dtype.kind in "iu"
        if not fits or not typed:
            want = "(" + ", ".join("*" if d == -1 else str(d) for d in shape) + ")"
            kind = "strings" if name == "paths" else "integers"
            raise ValueError(
                f"/{name} is {dataset.dtype} of shape {got}, not {kind} of shape {want}"
            )
    names = reader._format_names
    if not (isinstance(names, list) and all(isinstance(x, str) for x in names)):
        raise ValueError("formats/format_names is not a list of names")
    ratio = _MAX_RATIO.get(payload.compression)
    if payload.dtype != np.uint8 or ratio is None or payload.size > file_bytes * ratio:
        raise ValueError(
            f"/{payload.name.lstrip('/')} holds {payload.size:,} {payload.dtype} values "
            f"({payload.compression or 'uncompressed'}) in a {file_bytes:,}-byte file"
        )


def _read_rows(dataset: h5py.Dataset, start: int, stop: int, out: np.ndarray | None) -> np.ndarray:
    """``dataset[start:stop]``, into ``out[:stop - start]`` if given, through HDF5's own read:
    h5py's slicing and ``read_direct`` build their selections in Python, which cost more
    than the pixels of a small chunk (benchmarks/bench_reader.py, raw reads)."""
    shape = (stop - start, *dataset.shape[1:])
    rows = np.empty(shape, dataset.dtype) if out is None else out[: stop - start]
    if rows.shape != shape:  # HDF5 would write past the buffer's end: h5py checks nothing here
        raise ValueError(
            f"{dataset.name} holds rows of {shape[1:]}, the store's shape is {rows.shape[1:]}"
        )
    if stop > start:
        file_space = dataset.id.get_space()
        file_space.select_hyperslab((start,) + (0,) * (len(shape) - 1), shape)
        dataset.id.read(h5py.h5s.create_simple(shape), file_space, rows)
    return rows


class Hdf5ShardReader:
    """Read-only view of a finished shard. File locking is off: a finished store never changes,
    and HDF5's locks fail on some network filesystems."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # No chunk cache for uncompressed data: a read slices straight from the file. With the
        # default 8 MiB cache, shuffled sub-chunk reads pulled whole 4-16 MiB chunks each time
        # (benchmarks/bench_reader.py: raw epochs twice as fast without it).
        self._file = h5py.File(path, "r", locking=False, rdcc_nbytes=0)
        try:
            self.meta: dict[str, Any] = json.loads(self._file.attrs["packer"])
            self._len = int(self.meta["num_records"])
        except (KeyError, ValueError, TypeError) as e:
            self._file.close()
            raise ValueError(f"{path}: not a packer shard (no valid 'packer' attribute)") from e
        f = self._file
        try:
            self._raw = "images" in f
            self._payload = _with_chunk_cache(f, "images" if self._raw else "data")
            # Dataset handles looked up once; the columns are sliced per block, so opening a
            # shard stays cheap when a reader hops among many shards (a Store keeps a few open).
            self._offsets = None if self._raw else f["offsets"]
            self._labels, self._crc32, self._shapes = f["labels"], f["crc32"], f["shapes"]
            self._formats = f["formats"]
            self._format_names: list[str] = json.loads(self._formats.attrs["format_names"])
            self._small_columns = _Spans(
                (self._labels, self._crc32, self._shapes, self._formats), SPAN
            )
            self._legacy_paths = "paths" in f  # packed before the flat layout
            self._paths: _Spans | _FlatPaths  # either gives each path's UTF-8 bytes
            if self._legacy_paths:
                self._paths = _Spans((f["paths"],), PATH_SPAN)
            else:
                self._paths = _FlatPaths(f["path_offsets"], f["path_bytes"])
            self._file_bytes = path.stat().st_size
            _check_columns(self, self._file_bytes)
            self._chunk_map = _ChunkMap(self._payload) if self._payload.chunks else None
        except (KeyError, ValueError, TypeError, OSError) as e:
            f.close()
            raise ValueError(f"{path}: damaged packer shard: {e}") from e

    def _path_columns(self) -> dict[str, tuple[h5py.Dataset, tuple[int, ...]]]:
        """The path datasets of this shard's layout, with the shapes _check_columns wants."""
        f, n = self._file, self._len
        if self._legacy_paths:
            return {"paths": (f["paths"], (n,))}
        return {
            "path_offsets": (f["path_offsets"], (n + 1,)),
            "path_bytes": (f["path_bytes"], (-1,)),
        }

    def __len__(self) -> int:
        return self._len

    def _payload_rows(self, start: int, stop: int) -> tuple[int, int, np.ndarray | None]:
        """The payload dataset's rows holding records ``start`` to ``stop`` (for /data, its
        bytes), and the records' offsets within /data (None for raw rows)."""
        if self._raw:
            return start, stop, None
        assert self._offsets is not None
        offsets = self._offsets[start : stop + 1].astype(np.int64)
        if offsets[0] < 0 or offsets[-1] > len(self._payload) or np.any(np.diff(offsets) < 0):
            raise ValueError(
                f"{self.path}: the offsets of records {start}..{stop - 1} are damaged "
                f"(they leave the {len(self._payload):,} payload bytes)"
            )
        return int(offsets[0]), int(offsets[-1]), offsets

    def extents(self, start: int, stop: int) -> list[tuple[int, int]]:
        check_range(start, stop, self._len)
        if start == stop:
            return []
        if self._chunk_map is None:
            return []
        lo, hi, _ = self._payload_rows(start, stop)
        return merge_ranges(self._chunk_map.pieces(lo, hi) or [], self._file_bytes)

    def index_extents(self) -> list[tuple[int, int]]:
        # A pack writes the payload chunks first and everything else at close, so the
        # columns, the paths' heap and HDF5's own metadata lie before and after them.
        if self._chunk_map is None or self._chunk_map.compressed:
            return []
        first, end = self._chunk_map.bounds()
        return merge_ranges([(0, first), (end, self._file_bytes - end)], self._file_bytes)

    def _fetched_rows(self, lo: int, hi: int, fetched: Fetched) -> memoryview | None:
        """Payload rows ``lo`` to ``hi`` as bytes, from ``fetched``; None if not all there."""
        chunks = self._chunk_map
        pieces = chunks.pieces(lo, hi) if chunks is not None and not chunks.compressed else None
        views = []
        for offset, length in pieces or []:
            view = fetched.view(offset, length)
            if view is None:
                return None
            views.append(view)
        if not views:
            return None
        return views[0] if len(views) == 1 else memoryview(b"".join(views))

    def read_block(
        self,
        start: int,
        stop: int,
        out: np.ndarray | None = None,
        fetched: Fetched | None = None,
    ) -> Block:
        check_range(start, stop, self._len)
        data: list[bytes | memoryview] | np.ndarray
        lo, hi, offsets = self._payload_rows(start, stop)
        ahead = self._fetched_rows(lo, hi, fetched) if fetched is not None and hi > lo else None
        if self._raw:  # straight into the caller's buffer, if any: no extra copy
            if ahead is None:
                data = _read_rows(self._payload, start, stop, out)
            else:
                rows = np.frombuffer(ahead, np.uint8).reshape(
                    stop - start, *self._payload.shape[1:]
                )
                data = np.empty_like(rows) if out is None else out[: stop - start]
                data[...] = rows  # a row shape other than the store's raises, as HDF5's read
        else:
            assert offsets is not None
            bounds = (offsets - offsets[0]).tolist()
            if ahead is None:
                payload = memoryview(self._payload[lo:hi])
                data = [payload[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
            else:  # bytes of their own: views would keep the fetched range alive. A copy a
                # record, not one of the range: a range of many records is large enough for
                # malloc to map it afresh each time, paying its page faults; a record's is reused
                data = [bytes(ahead[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        labels, crc32, shapes, codes = self._small_columns.read(start, stop)
        (paths,) = self._paths.read(start, stop)
        unknown = (codes < 0) | (codes >= len(self._format_names))
        if unknown.any():
            first = int(np.argmax(unknown))
            raise ValueError(
                f"{self.path}: record {start + first} has format code {codes[first]}, "
                "which is not in format_names"
            )
        return Block(
            data=data,
            labels=labels,
            paths=[p.decode() for p in paths],
            crc32=crc32,
            shapes=shapes,
            formats=[self._format_names[i] for i in codes.tolist()],
        )

    def read_record(self, index: int) -> Record:
        check_index(index, self._len)
        return self.read_block(index, index + 1).record(0)

    def read_labels(self) -> np.ndarray:
        return np.asarray(self._labels[:], np.int64)

    def close(self) -> None:
        self._file.close()
