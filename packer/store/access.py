"""Random access to a finished store: ``len(store)``, ``store[i]``, and a record's raw fields.

Shard files are opened lazily, in the process that reads, and reopened after a fork
(an LMDB or HDF5 handle must never cross one), so a Store can be handed to worker processes.
"""

from __future__ import annotations

import bisect
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import lmdb
import numpy as np

from packer.errors import CorruptRecordError, StoreError, UsageError
from packer.imaging import cropping, plain, resizing
from packer.imaging import decode as imaging
from packer.store import ShardReader, open_shard_reader
from packer.store.hdf5_store import checksummed_metadata
from packer.store.manifest import Manifest, ShardInfo, Storage, file_checksum, read_manifest
from packer.store.record import Record, checksum

__all__ = ["Store", "open_store", "open_manifest", "record_pixels"]


def open_store(path: Path | str, *, images: str | None = None, labels: str | None = None) -> Store:
    """Open a finished store for random access. Example: ``image, labels = open_store(p)[0]``.

    ``path`` may also be a plain HDF5 file holding an image array and a label array (a store
    made by others); ``images`` and ``labels`` name them where packer cannot tell.
    """
    return Store(path, images=images, labels=labels)


_HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf")
# What reading a damaged value or column raises (the PyTables reader turns its own errors,
# such as a filter it lacks, into OSError; LMDB raises its own, e.g. MDB_CORRUPTED).
DAMAGE = (ValueError, KeyError, TypeError, OSError, lmdb.Error)
OPEN_SHARDS = 16  # shard readers a Store keeps open at once


def open_manifest(path: Path, images: str | None = None, labels: str | None = None) -> Manifest:
    """A packer store's manifest, or one describing a plain HDF5 file of arrays."""
    if not (path.is_file() and path.suffix.lower() in _HDF5_SUFFIXES):
        return read_manifest(path)
    from packer.store import pytables_store  # PyTables is imported only for such a file

    try:
        found = pytables_store.describe_file(path, images, labels)
    except (ValueError, OSError) as e:
        raise StoreError(str(e)) from e
    h, w, c = found["shape"]
    return Manifest(
        backend="pytables",
        num_records=found["num_records"],
        shards=[
            ShardInfo(
                path.name,
                found["num_records"],
                path.stat().st_size,
                "",
                found["num_records"] * h * w * c,
            )
        ],
        storage=Storage("raw", {1: "L", 3: "RGB"}.get(c, "keep"), shape=[h, w, c], checksums=False),
        label_source="arrays",
        label_columns=[
            {"name": f"{found['labels']}[{k}]", "classes": None}
            for k in range(found["label_columns"])
        ],
        seed=0,
        shuffled=False,
        packer_version="",
        created="",
        options={"images": found["images"], "labels": found["labels"]},
        stats={
            "label_counts": found["label_counts"],
            "height": {"count": found["num_records"], "min": h, "max": h, "mean": h},
            "width": {"count": found["num_records"], "min": w, "max": w, "mean": w},
            "payload_bytes": {
                "count": found["num_records"],
                "min": h * w * c,
                "max": h * w * c,
                "mean": h * w * c,
            },
            "formats": {"raw": found["num_records"]},
        },
        source={"file": str(path.resolve())},
    )


def _check_shard_file(store: Path, info: ShardInfo) -> None:
    """Refuse a shard unless its file is there with the manifest's size. LMDB maps the whole
    file: reading a truncated one is a SIGBUS, not an error."""
    try:
        size = (store / info.file).stat().st_size
    except OSError as e:
        raise StoreError(f"{store}: {info.file}: {e.strerror or e}") from e
    if size != info.bytes:
        raise StoreError(
            f"{store}: {info.file} is {size:,} bytes, the manifest says {info.bytes:,}: "
            "the shard was truncated or changed (packer inspect --verify)"
        )


# HDF5 shards without metadata checksums whose hash this process has checked, by file identity.
_HASHED: set[tuple[int, int, int, int]] = set()


def _check_unprotected_hdf5(store: Path, info: ShardInfo) -> None:
    """Refuse an HDF5 shard of the layout before checksummed metadata (or one whose first bytes
    are damaged) unless its hash is the manifest's, before libhdf5 parses it: damaged metadata
    of that layout can make libhdf5 loop forever. Checked once per file and process; shards
    packed since are never hashed here."""
    file = store / info.file
    try:
        if checksummed_metadata(file):
            return
        st = file.stat()
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if identity in _HASHED:
            return
        digest = file_checksum(file, info.algorithm)[1]
    except OSError as e:
        raise StoreError(f"{store}: {info.file}: {e.strerror or e}") from e
    if digest != info.checksum:
        raise StoreError(
            f"{store}: {info.file} changed after it was packed ({info.algorithm} mismatch); "
            "packer inspect --verify names what is damaged"
        )
    _HASHED.add(identity)


class Store:
    """Random access to a store's records by index (``store[i]``, ``len(store)``); made by
    ``open_store``. Safe to use in a forked process: each process opens its own shards."""

    def __init__(
        self, path: Path | str, *, images: str | None = None, labels: str | None = None
    ) -> None:
        self.path = Path(path)
        self.manifest: Manifest = open_manifest(self.path, images, labels)
        self._starts = self.manifest.shard_starts()
        # The shards opened last, most recent at the end: a store of thousands of shards must
        # not hold thousands of open files and maps (nor their per-shard columns) at once.
        self._readers: OrderedDict[int, ShardReader] = OrderedDict()
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self.manifest.num_records

    def require_packer_store(self, action: str) -> None:
        """Refuse a plain HDF5 file of arrays where records with paths and CRCs are needed."""
        if self.manifest.backend == "pytables":
            raise UsageError(
                f"{self.path}: a plain HDF5 file, not a packer store; "
                f"{action} works on stores made by packer pack"
            )

    def locate(self, index: int) -> tuple[int, int]:
        """Global record index -> (shard number, index inside that shard)."""
        if not 0 <= index < len(self):
            raise IndexError(f"record {index} out of range for a store of {len(self)} records")
        shard = bisect.bisect_right(self._starts, index) - 1
        while self.manifest.shards[shard].num_records == 0:  # skip empty shards
            shard += 1
        return shard, index - self._starts[shard]

    def shard(self, number: int) -> ShardReader:
        """The reader of one shard, opened on first use in this process; at most
        ``OPEN_SHARDS`` stay open, the least recently used closed first."""
        if os.getpid() != self._pid:  # forked: the parent's handles are not ours to use
            self._readers = OrderedDict()
            self._pid = os.getpid()
        reader = self._readers.get(number)
        if reader is not None:
            self._readers.move_to_end(number)
        else:
            info = self.manifest.shards[number]
            file = self.path / info.file
            if self.manifest.backend != "pytables":
                _check_shard_file(self.path, info)
            if self.manifest.backend == "hdf5":
                _check_unprotected_hdf5(self.path, info)
            try:
                if self.manifest.backend == "pytables":
                    from packer.store import pytables_store

                    opts = self.manifest.options
                    reader = pytables_store.PyTablesShardReader(
                        self.path, opts["images"], opts["labels"]
                    )
                else:
                    reader = open_shard_reader(self.manifest.backend, file)
            except Exception as e:
                raise StoreError(f"{self.path}: cannot open {info.file}: {e}") from e
            if len(reader) != info.num_records:
                reader.close()
                raise StoreError(
                    f"{self.path}: {info.file} holds {len(reader)} records, "
                    f"the manifest says {info.num_records}"
                )
            self._readers[number] = reader
            while len(self._readers) > OPEN_SHARDS:
                self._readers.popitem(last=False)[1].close()
        return reader

    def record(self, index: int, verify: bool = True) -> Record:
        """The stored record: payload bytes, labels, original path, checksum, shape, format."""
        shard, offset = self.locate(index)
        try:
            record = self.shard(shard).read_record(offset)
        except DAMAGE as e:
            raise self.unreadable(shard, offset, offset + 1, e) from e
        if verify and self.manifest.storage.checksums:
            reason = _damage(record, self.manifest.storage.payload == "raw")
            if reason is not None:
                file = self.manifest.shards[shard].file
                raise CorruptRecordError(str(self.path), file, index, record.path, reason)
        return record

    def unreadable(
        self, shard: int, start: int, stop: int, error: Exception, out: np.ndarray | None = None
    ) -> StoreError:
        """The error for records ``start:stop`` of ``shard`` that failed to read as one block
        with ``error``: it names the first of them that fails alone (the block, if none)."""
        file, first = self.manifest.shards[shard].file, self._starts[shard]
        reader = self.shard(shard)
        for i in range(start, stop):
            try:
                reader.read_block(i, i + 1, out=None if out is None else out[i - start :][:1])
            except DAMAGE as e:
                return StoreError(f"{self.path}: record {first + i} in {file} cannot be read: {e}")
        return StoreError(
            f"{self.path}: {file}: records {first + start}..{first + stop - 1}: {error}"
        )

    def records(self) -> Iterator[Record]:
        """Every record in store order, read shard by shard in sequential blocks."""
        for _, record in self.indexed_records(verify=False):
            yield record

    def indexed_records(
        self, shard: int | None = None, verify: bool = True
    ) -> Iterator[tuple[int, Record]]:
        """(global index, record) of every record (of one shard), in order, read in sequential
        blocks of at most 1024 records or 64 MB. With ``verify``, a CRC mismatch or a raw
        payload of the wrong length raises CorruptRecordError naming the record; a damaged
        value or column raises StoreError naming the first record that cannot be read."""
        numbers = range(len(self.manifest.shards)) if shard is None else [shard]
        starts = self.manifest.shard_starts()
        raw = self.manifest.storage.payload == "raw"
        for number in numbers:
            info, first, reader = self.manifest.shards[number], starts[number], self.shard(number)
            mean = info.payload_bytes // info.num_records if info.num_records else 0
            step = max(1, min(1024, (64 << 20) // max(1, mean)))
            for start in range(0, info.num_records, step):
                stop = min(start + step, info.num_records)
                try:
                    block = reader.read_block(start, stop)
                except DAMAGE as e:
                    raise self.unreadable(number, start, stop, e) from e
                for row in range(len(block)):
                    record, index = block.record(row), first + start + row
                    if verify and self.manifest.storage.checksums:
                        reason = _damage(record, raw)
                        if reason is not None:
                            raise CorruptRecordError(
                                str(self.path), info.file, index, record.path, reason
                            )
                    yield index, record

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(height x width x channels uint8 image, labels) of record ``index``, decoded."""
        record = self.record(index)
        try:
            pixels = record_pixels(record, self.manifest.storage.mode)
        except Exception as e:
            shard, _ = self.locate(index)
            raise CorruptRecordError(
                str(self.path),
                self.manifest.shards[shard].file,
                index,
                record.path,
                f"does not decode: {e}",
            ) from e
        return pixels, np.array(record.labels, dtype=np.int64)

    def close(self) -> None:
        """Close the shard files this process opened (also on leaving ``with``)."""
        if os.getpid() == self._pid:
            for reader in self._readers.values():
                reader.close()
        self._readers = OrderedDict()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __getstate__(self) -> dict[str, object]:
        # Pickles as its path: handles are reopened on the other side.
        options = self.manifest.options if self.manifest.backend == "pytables" else {}
        return {"path": self.path, "images": options.get("images"), "labels": options.get("labels")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], images=state["images"], labels=state["labels"])  # type: ignore[misc]


def _damage(record: Record, raw: bool) -> str | None:
    if not len(record.data):  # no image is empty; and an empty payload's CRC-32 is 0, what
        return "empty payload"  # zeroed offsets and CRC columns of an HDF5 shard would pass
    if checksum(record.data) != record.crc32:
        return "checksum mismatch"
    h, w, c = record.shape
    if raw and len(record.data) != h * w * c:
        return f"{len(record.data)} payload bytes do not make shape {list(record.shape)}"
    return None


def record_pixels(
    record: Record,
    mode: str = "RGB",
    writable: bool = True,
    size: tuple[int, int] | None = None,
    fit: str = "crop",
    place: Callable[[int, int], cropping.Placement] | None = None,
    plain_first: bool = False,
) -> np.ndarray:
    """A record's image as height x width x channels uint8, upright, resized to ``size``
    (height, width) if given; ``writable=False`` where the caller copies it anyway (a view
    of the payload or of Pillow's bytes: no copy). ``place(height, width)``: where the
    upright image goes in the output instead (``imaging.decode_placed``), a new array.
    ``plain_first``: a plain JPEG or PNG straight from its C decoder (packer.imaging.plain),
    the reader's path: libpng writes its complaints about a damaged PNG to stderr before
    Pillow raises the error, which a command's one-line errors must not have."""
    if place is not None:
        if record.format == "raw":
            stored = np.frombuffer(record.data, dtype=np.uint8).reshape(record.shape)
            height, width = record.shape[0], record.shape[1]
            return cropping.render(stored, place(height, width), height, width)
        return imaging.decode_placed(bytes(record.data), place, mode)
    if record.format == "raw":
        stored = np.frombuffer(record.data, dtype=np.uint8).reshape(record.shape)
        pixels = stored if size is None else resizing.resize(stored, size=size, fit=fit)
        return pixels.copy() if writable and pixels is stored else pixels
    if size is None:
        data = bytes(record.data)
        # A plain JPEG or PNG straight from its C decoder; anything else through Pillow.
        fast = plain.pixels(data, mode) if plain_first else None
        return fast if fast is not None else imaging.decode_array(data, mode, writable=writable)
    pixels = imaging.decode_resized(bytes(record.data), mode, size=size, fit=fit)
    return pixels.copy() if writable and not pixels.flags.writeable else pixels
