"""LMDB shards: one environment per file (``subdir=False``).

Keys are record indices in the shard as 10 zero-padded digits, so cursor order is packed
order and one cursor walk reads a range. The key ``__packer__`` (sorting after every digit
key) holds the shard's own metadata. Three value layouts; packer writes the first:

- "blocks" (format 5): a value is a block of consecutive records, keyed by its first
  record's index, laid out by ``packer.store.record`` (payloads, then one compressed header
  of their labels, checksums, shapes and paths). The metadata's ``block_starts`` lists the
  blocks' first records. Small records share blocks, so the file is about the size of the
  payloads, and a chunk of raw pixels is read by copying a few blocks' payload bytes, with
  no per-record work.
- "records" (formats 1 to 4): each value is a whole record (``record.unpack_value``).
- "columns" (raw pixels of one shape, formats 2 to 4): each value is the pixels alone, and
  every ``GROUP`` records share one ``__columns__<first index>`` key holding their labels,
  CRC-32s and paths as msgpack.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import numpy as np

from packer.store import mapped_pages
from packer.store.base import Fetched, ShardMeta, check_index, check_range, merge_ranges
from packer.store.lmdb_blocks import BlockLayout, record_key
from packer.store.record import (
    BLOCK_BYTES,
    Block,
    Record,
    block_value,
    unpack_value,
)

__all__ = [
    "LmdbShardWriter",
    "LmdbShardReader",
    "META_KEY",
    "GROUP",
    "record_key",
    "columns_key",
]

META_KEY = b"__packer__"
# The shard's metadata field holding where each record's value lies in the file: (offset,
# length) pairs, uint64 little-endian. A reader reading ahead reads a chunk's bytes and takes
# its values from them without walking LMDB's pages (which touches each value's first page:
# one small request per record, the very thing reading ahead avoids). Values never move once
# written (LMDB copies only the pages it changes), so the places stay true. Shards without
# it, or with values small enough to live in the tree's own pages (which move when a later
# write copies them), are not read ahead.
PLACES = "value_places"
# Write transactions of ~1 MB. A commit costs about the same at any size, but a large one
# holds its values and LMDB's dirty pages until it ends, and glibc hands that much freed
# memory back to the OS, so the next batch page-faults all of it afresh: much larger
# transactions made packs and bare LMDB writes slower (benchmarks/bench_lmdb_write.py).
_COMMIT_BYTES = 1 << 20
_COMMIT_RECORDS = 8192
# Records per column group in the "columns" layout: the writer holds one group's labels,
# checksums and paths; a reader decodes one or two groups per chunk.
GROUP = 4096
_CACHED_GROUPS = 16  # decoded column groups a shard reader keeps (a few MB at most)
# Bytes read through the shards' maps after which a process unmaps every page it has read,
# if its open maps are larger than this (see _Environments.count_read): mapped pages then
# take about this much memory at most, on the scale of a reader's own buffers, whatever the
# store's size. The price: a store larger than this has its pages mapped again each epoch,
# minor faults that slow raw epochs read from the page cache (docs/reading.md, "Memory");
# beside decoding they are lost in the noise.
_MAPPED_BYTES = 32 << 20


def columns_key(first: int) -> bytes:
    """The key of the column group whose first record is ``first`` (a multiple of GROUP)."""
    return b"__columns__%010d" % first


class LmdbShardWriter:
    """Writes one LMDB shard in the "blocks" layout. The map grows by itself: a batch that
    hits the map's end is aborted, the map doubled, and the same batch replayed, so no
    MapFullError escapes and no record is lost (py-lmdb docs, "Handling database growth")."""

    def __init__(
        self, path: Path, meta: ShardMeta, expected_bytes: int = 0, map_size: int | None = None
    ) -> None:
        self.path = path
        self.meta = meta
        # lock=False: the shard is private to this writer until the store is committed.
        # sync off while writing, one forced sync in close(): a crash before close leaves an
        # unfinished pack anyway (no manifest), so per-commit fsyncs would buy nothing.
        self._env = lmdb.open(
            str(path),
            subdir=False,
            # Address space only (64-bit): reserve generously, the file grows as data is written.
            map_size=map_size or max(64 << 20, 2 * expected_bytes),
            lock=False,
            sync=False,
            metasync=False,
            writemap=False,  # with writemap a full disk is a SIGBUS, not an error
            meminit=True,  # zero unused page space: same inputs give byte-identical files
            max_dbs=0,
        )
        # A value over half a page has pages of its own, which never move (LMDB puts a node
        # of over (page - 16) / 2 bytes, key and header included, on overflow pages): smaller
        # blocks are padded to that, so that every block's place can be recorded.
        self._min_block = self._env.stat()["psize"] // 2 + 1
        self._pending: list[tuple[bytes, bytes | memoryview]] = []
        self._pending_bytes = 0
        self._count = 0
        self._block: list[Record] = []  # the records of the block being filled
        self._block_bytes = 0
        self._starts: list[int] = []  # the first record of each block written
        self.map_growths = 0

    def append(self, record: Record) -> None:
        if self.meta.raw_shape is not None:
            self.meta.check_row(record)
        size = len(record.data)
        if size >= BLOCK_BYTES:  # a block of its own, read into its value where it could be
            self._end_block()
            value: bytes | memoryview | None = record.value
            if value is None:
                value = block_value([record], self.meta.num_label_columns, self._min_block)
            self._put_block(self._count, value)
        else:
            if self._block_bytes + size > BLOCK_BYTES:
                self._end_block()
            self._block.append(record)
            self._block_bytes += size
        self._count += 1

    def _end_block(self) -> None:
        if self._block:
            value = block_value(self._block, self.meta.num_label_columns, self._min_block)
            self._put_block(self._count - len(self._block), value)
            self._block, self._block_bytes = [], 0

    def _put_block(self, first: int, value: bytes | memoryview) -> None:
        self._starts.append(first)
        self._put(record_key(first), value)

    def _put(self, key: bytes, value: bytes | memoryview) -> None:
        self._pending.append((key, value))
        self._pending_bytes += len(value)
        if self._pending_bytes >= _COMMIT_BYTES or len(self._pending) >= _COMMIT_RECORDS:
            self._commit()

    def _commit(self) -> None:
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    cursor = txn.cursor()
                    for key, value in self._pending:
                        # Keys arrive sorted: pages fill 100%. A key out of order is not
                        # written (put says False): never let that pass silently.
                        if not cursor.put(key, value, append=True):
                            raise ValueError(f"{self.path}: key {key!r} arrived out of order")
                break
            except lmdb.MapFullError:
                # The aborted transaction wrote nothing; grow and replay the same batch.
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
                self.map_growths += 1
        self._pending.clear()
        self._pending_bytes = 0

    def close(self, sync: bool = True) -> None:
        self._end_block()
        self._commit()  # the blocks' places are known once they are committed
        meta = {
            "index": self.meta.index,
            "num_records": self._count,
            "num_label_columns": self.meta.num_label_columns,
            "raw_shape": self.meta.raw_shape,
            "layout": "blocks",
            "block_starts": np.array(self._starts, "<u8").tobytes(),
            **self.meta.extra,
        }
        places = _value_places(self._env, len(self._starts))
        if places is not None:
            meta[PLACES] = places.astype("<u8").tobytes()
        self._pending.append((META_KEY, msgpack.packb(meta)))
        self._commit()
        if sync:
            self._env.sync(True)
        self._env.close()

    def abort(self) -> None:
        self._env.close()


class _Environments:
    """One read-only environment per shard file per process, shared by every reader of it.

    LMDB forbids opening one file twice in a process (py-lmdb raises, and closing one handle
    would drop the other's locks), yet a process may well hold two readers of one store.
    After a fork the child never uses the parent's environments; it closes them (see acquire).
    It also keeps the pages read through the maps from piling up in the process (count_read).
    """

    def __init__(self) -> None:
        # Re-entrant: a reader garbage-collected (its __del__ releasing) inside acquire. Each
        # entry is [environment, users, map span], counted in place, so such a release is
        # never lost.
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._open: dict[str, list[Any]] = {}  # real path -> entry
        # Bytes read through the maps since the last sweep, and the maps they were read
        # from; counted without the lock, as a count lost to a race only puts a sweep off a
        # little.
        self._unswept = 0
        self._read_since: set[str] = set()

    def acquire(self, path: Path) -> lmdb.Environment:
        key = os.path.realpath(path)
        with self._lock:
            if self._pid != os.getpid():
                # A forked child: py-lmdb (3.0) still counts the parent's environments as open
                # here and refuses to open their files again. Closing the inherited handles
                # frees the slot; read-only and lock=False, that only unmaps the child's copy.
                for inherited, *_ in self._open.values():
                    inherited.close()
                self._open, self._pid = {}, os.getpid()
            entry = self._open.get(key)
            if entry is None:
                env = lmdb.open(
                    key,
                    subdir=False,
                    readonly=True,
                    lock=False,  # safe: a finished store never changes
                    max_spare_txns=0,  # cached read txns must not outlive a fork (py-lmdb docs)
                    max_dbs=0,
                )
                _refuse_short(env, key)
                with env.begin(buffers=True) as txn:  # any value is a view into the map
                    view = txn.get(META_KEY)
                    span = None if view is None else mapped_pages.map_span(view, _used_bytes(env))
                entry = self._open[key] = [env, 0, span]
                self._read_since.add(key)  # opening it read its first pages
            entry[1] += 1
            return entry[0]

    def release(self, path: Path) -> None:
        key = os.path.realpath(path)
        with self._lock:
            entry = self._open.get(key)
            if self._pid != os.getpid() or entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del self._open[key]
                entry[0].close()

    def count_read(self, key: str, nbytes: int) -> None:
        """Count ``nbytes`` read through the map of the shard ``key`` (its real path). Past
        _MAPPED_BYTES, every page of the maps read since the last sweep is unmapped from this
        process (see packer.store.mapped_pages), unless all the open maps are no larger than
        that: then they may stay, and re-mapping their pages would be a cost for nothing.
        Only the maps read since: unmapping walks a map's whole range, and a process holds
        every shard of a store open, so walking them all each time cost in proportion to the
        store, not to what was read."""
        self._read_since.add(key)
        self._unswept += nbytes
        if self._unswept < _MAPPED_BYTES:
            return
        # Under the lock: no map is closed, and its addresses reused, during the sweep.
        with self._lock:
            self._unswept = 0
            read, self._read_since = self._read_since, set()
            if self._pid != os.getpid():  # a forked child's inherited maps: acquire closes them
                return
            spans = {shard: span for shard, (_, _, span) in self._open.items() if span}
            if sum(length for _, length in spans.values()) > _MAPPED_BYTES:
                for shard in read & spans.keys():
                    mapped_pages.drop_pages(spans[shard])


def _refuse_short(env: lmdb.Environment, path: str) -> None:
    """Close ``env`` and raise ValueError if its file ends before its last page: LMDB maps
    the file, and touching a page past its end kills the process (SIGBUS), whatever the
    manifest says of the file's size."""
    needed = _used_bytes(env)
    size = os.path.getsize(path)
    if size < needed:
        env.close()
        raise ValueError(
            f"{path}: truncated: its pages need {needed:,} bytes, the file has {size:,}"
        )


def _used_bytes(env: lmdb.Environment) -> int:
    """The bytes of ``env``'s file that its pages take, up to its last page."""
    return int((env.info()["last_pgno"] + 1) * env.stat()["psize"])


_ENVIRONMENTS = _Environments()
if hasattr(os, "register_at_fork"):
    # A release (a close, or a reader collected in any thread) may hold the table's lock at
    # a fork, outside packer.fork_gate; the child, one thread, starts with it free.
    os.register_at_fork(after_in_child=_ENVIRONMENTS._lock._at_fork_reinit)  # type: ignore[attr-defined]


class LmdbShardReader:
    """Read-only, lock-free view of a finished shard (safe: finished stores never change)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._env = _ENVIRONMENTS.acquire(path)
        self._count_read = partial(_ENVIRONMENTS.count_read, os.path.realpath(path))
        self._closed = False
        with self._env.begin() as txn:
            raw = txn.get(META_KEY)
        try:
            if raw is None:
                raise ValueError(f"{path}: not a packer shard (no {META_KEY.decode()} key)")
            self.meta: dict[str, Any] = msgpack.unpackb(raw)
            self._len = int(self.meta["num_records"])
            self._file_bytes = os.path.getsize(path)
            self._blocks: BlockLayout | None = None
            self._shape = None
            if self.meta.get("layout") == "blocks":
                self._blocks = BlockLayout(
                    self._env,
                    path,
                    self.meta,
                    partial(_places, self.meta, file_bytes=self._file_bytes),
                    self._file_bytes,
                    self._count_read,
                )
            else:
                self._shape = _columns_shape(self.meta)  # None: the "records" layout
        except (ValueError, KeyError, TypeError, OSError, msgpack.UnpackException) as e:
            self.close()  # release the environment: a failed open must not hold it
            if raw is None:
                raise
            raise ValueError(
                f"{path}: not a packer shard (damaged {META_KEY.decode()}: {e or type(e).__name__})"
            ) from e
        self._places = None if self._blocks else _places(self.meta, self._len, self._file_bytes)
        # Column groups decoded lately: a point read (store[i]) decodes a whole group.
        self._cached_groups: OrderedDict[int, Block] = OrderedDict()

    def __len__(self) -> int:
        return self._len

    def extents(self, start: int, stop: int) -> list[tuple[int, int]]:
        check_range(start, stop, self._len)
        if self._blocks is not None:
            return self._blocks.extents(start, stop)
        if self._places is None or start == stop:
            return []  # finding the values would touch each one's first page
        pieces = [(int(o), int(n)) for o, n in self._places[start:stop]]
        return merge_ranges(pieces, self._file_bytes)

    def index_extents(self) -> list[tuple[int, int]]:
        return []  # a record's labels and path are in its value, read with its payload

    def read_block(
        self,
        start: int,
        stop: int,
        out: np.ndarray | None = None,
        fetched: Fetched | None = None,
    ) -> Block:
        check_range(start, stop, self._len)
        if self._blocks is not None:
            return self._blocks.read_block(start, stop, out, fetched)
        if self._shape is not None:
            return self._read_columns(start, stop, out, fetched)
        records = []
        # Raw pixels are copied into ``out`` through a flat byte view: a plain buffer copy
        # per record, no NumPy call.
        if out is not None and not out.flags.c_contiguous:  # reshape would copy: writes lost
            raise ValueError("out must be C-contiguous")
        flat = out.reshape(-1).data if out is not None else None
        row_bytes = out[0].nbytes if out is not None and len(out) else 0
        shape = list(out.shape[1:]) if out is not None else []
        keep = partial(self._kept, start=start, flat=flat, row_bytes=row_bytes, shape=shape)
        fetched_values = self._fetched_values(start, stop, fetched)
        if fetched_values is not None:  # no page of the map is touched
            records = [keep(row, value) for row, value in enumerate(fetched_values)]
            return _to_block(records, self.meta.get("num_label_columns", 0), out, stop - start)
        nbytes = 0
        # buffers=True: values are views of the map, valid inside this transaction; a
        # payload is copied out once, into ``out`` or into its own bytes.
        with self._env.begin(buffers=True) as txn:
            cursor = txn.cursor()
            if stop > start and not cursor.set_key(record_key(start)):
                raise ValueError(f"{self.path}: record {start} is missing")
            for row, expected in enumerate(range(start, stop)):
                key, value = cursor.item()
                if key != record_key(expected):
                    raise ValueError(
                        f"{self.path}: record {expected} is missing (found {bytes(key)!r})"
                    )
                records.append(keep(row, value))
                nbytes += len(value)
                cursor.next()
        self._count_read(nbytes)
        return _to_block(records, self.meta.get("num_label_columns", 0), out, stop - start)

    def _kept(
        self,
        row: int,
        value: memoryview,
        *,
        start: int,
        flat: memoryview | None,
        row_bytes: int,
        shape: list[int],
    ) -> Record:
        """Record ``start + row`` from its value: raw pixels copied into row ``row`` of
        ``flat``, any other payload into bytes of its own (a view would keep the map's
        page, or the whole fetched range, alive as long as the record is)."""
        record = unpack_value(value)
        if flat is None:
            record.data = bytes(record.data)
            return record
        if len(record.data) != row_bytes:
            raise self._wrong_row(start + row, len(record.data), shape, row_bytes)
        flat[row * row_bytes : (row + 1) * row_bytes] = record.data
        return record

    def _wrong_row(self, index: int, got: int, shape: list[int], row_bytes: int) -> ValueError:
        """The error for record ``index``, whose ``got`` payload bytes are not one row."""
        return ValueError(
            f"{self.path}: record {index} has {got:,} payload bytes, "
            f"the store's shape {shape} needs {row_bytes:,}"
        )

    def _fetched_values(
        self, start: int, stop: int, fetched: Fetched | None
    ) -> list[memoryview] | None:
        """The values of records start..stop-1, from ``fetched`` by the shard's value
        places; None unless all are there."""
        if fetched is None or self._places is None:
            return None
        values = []
        for offset, length in self._places[start:stop].tolist():
            view = fetched.view(offset, length)
            if view is None:
                return None
            values.append(view)
        return values

    def _read_columns(
        self, start: int, stop: int, out: np.ndarray | None, fetched: Fetched | None
    ) -> Block:
        """Records of the "columns" layout: each value copied into ``out`` as it is (from
        ``fetched`` where it holds them all), the metadata sliced from its column groups."""
        n, shape = stop - start, self._shape
        assert shape is not None
        if out is None:
            out = np.empty((n, *shape), np.uint8)
        if out.shape[1:] != shape or len(out) < n or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous array of records of shape {shape}")
        flat, row_bytes = out.reshape(-1).data, int(np.prod(shape))
        fetched_values = self._fetched_values(start, stop, fetched)
        with self._env.begin(buffers=True) as txn:
            if fetched_values is not None:  # the places say these are the records' values
                for row, value in enumerate(fetched_values):
                    if len(value) != row_bytes:
                        raise self._wrong_row(start + row, len(value), list(shape), row_bytes)
                    flat[row * row_bytes : (row + 1) * row_bytes] = value
            else:
                self._walk_columns(txn, start, stop, flat, row_bytes)
            groups = range(start // GROUP, -(-stop // GROUP))
            parts = [(self._group(txn, g), g * GROUP) for g in groups]
        cuts = [slice(max(start - first, 0), stop - first) for _, first in parts]
        columns = int(self.meta["num_label_columns"])
        return Block(
            data=out[:n],
            labels=np.concatenate(
                [g.labels[cut] for (g, _), cut in zip(parts, cuts)]
                or [np.zeros((0, columns), np.int64)]
            ),
            paths=[p for (g, _), cut in zip(parts, cuts) for p in g.paths[cut]],
            crc32=np.concatenate(
                [g.crc32[cut] for (g, _), cut in zip(parts, cuts)] or [np.zeros(0, np.uint32)]
            ),
            shapes=np.tile(np.array(shape, np.int32), (n, 1)),
            formats=["raw"] * n,
        )

    def _walk_columns(
        self, txn: lmdb.Transaction, start: int, stop: int, flat: memoryview, row_bytes: int
    ) -> None:
        """Copy the values of records start..stop-1 into ``flat`` by a cursor walk."""
        n, shape = stop - start, list(self._shape or ())
        cursor = txn.cursor()
        if n and not cursor.set_key(record_key(start)):
            raise ValueError(f"{self.path}: record {start} is missing")
        at = 0
        for value in islice(cursor.iternext(keys=False), n):
            if len(value) != row_bytes:
                # A missing record lets the walk run on into the column groups' values:
                # name the missing one first.
                self._find_missing(txn, start, stop)
                raise self._wrong_row(start + at // row_bytes, len(value), shape, row_bytes)
            flat[at : at + row_bytes] = value
            at += row_bytes
        # Keys are unique and sorted: n values from record start's key to record
        # stop - 1's are those records, unless one is missing (a foreign key in its place).
        if n and (at != n * row_bytes or cursor.key() != record_key(stop - 1)):
            self._find_missing(txn, start, stop)
            raise ValueError(f"{self.path}: records {start}..{stop - 1} are not all there")
        self._count_read(at)

    def _find_missing(self, txn: lmdb.Transaction, start: int, stop: int) -> None:
        """Raise ValueError naming the first of records start..stop-1 whose key is not there,
        if one is not."""
        cursor = txn.cursor()
        cursor.set_key(record_key(start))
        keys = cursor.iternext(values=False)
        for expected in range(start, stop):
            key = next(keys, b"(the end of the shard)")
            if bytes(key) != record_key(expected):
                raise ValueError(
                    f"{self.path}: record {expected} is missing (found {bytes(key)!r})"
                )

    def _group(self, txn: lmdb.Transaction, number: int) -> Block:
        """Column group ``number``, checked, as a Block without payloads."""
        cached = self._cached_groups.get(number)
        if cached is not None:
            self._cached_groups.move_to_end(number)
            return cached
        first = number * GROUP
        size, columns = min(GROUP, self._len - first), int(self.meta["num_label_columns"])
        where = f"{self.path}: the columns of records {first}..{first + size - 1}"
        value = txn.get(columns_key(first))
        if value is None:
            raise ValueError(f"{where} are missing")
        try:
            # Limits: a hostile value must not unpack into more objects than a group holds.
            group = msgpack.unpackb(value, max_array_len=GROUP, max_map_len=3)
            labels, crc32, paths = group["l"], group["c"], group["p"]
        except (msgpack.UnpackException, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{where} are damaged: {e or type(e).__name__}") from e
        if not (
            type(labels) is bytes
            and len(labels) == 8 * size * columns
            and type(crc32) is bytes
            and len(crc32) == 4 * size
            and type(paths) is list
            and len(paths) == size
            and all(type(p) is str for p in paths)
        ):
            raise ValueError(f"{where} are damaged: not {size} labels, checksums and paths")
        block = Block(
            data=[],
            labels=np.frombuffer(labels, "<i8").reshape(size, columns).astype(np.int64),
            paths=paths,
            crc32=np.frombuffer(crc32, "<u4").astype(np.uint32),
            shapes=np.zeros((0, 3), np.int32),
            formats=[],
        )
        self._cached_groups[number] = block
        if len(self._cached_groups) > _CACHED_GROUPS:
            self._cached_groups.popitem(last=False)
        return block

    def read_record(self, index: int) -> Record:
        check_index(index, self._len)
        if self._shape is not None or self._blocks is not None:
            return self.read_block(index, index + 1).record(0)
        with self._env.begin() as txn:
            value = txn.get(record_key(index))
        if value is None:
            raise ValueError(f"{self.path}: record {index} is missing")
        self._count_read(len(value))
        return unpack_value(value)  # a view of ``value``, a bytes object of its own

    def read_labels(self) -> np.ndarray:
        if self._blocks is not None:
            return self._blocks.read_labels()
        columns = self.meta.get("num_label_columns", 0)
        if self._shape is not None:
            with self._env.begin(buffers=True) as txn:
                groups = [self._group(txn, g) for g in range(-(-self._len // GROUP))]
            return np.concatenate([g.labels for g in groups] or [np.zeros((0, columns), np.int64)])
        # One cursor walk over views of the map: only each value's small meta is parsed.
        with self._env.begin(buffers=True) as txn:
            labels = [
                unpack_value(value).labels for key, value in txn.cursor() if bytes(key) != META_KEY
            ]
        self._count_read(_used_bytes(self._env))  # one walk over every page, at most
        return np.array(labels, np.int64).reshape(len(labels), columns)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            blocks = getattr(self, "_blocks", None)  # not there until the meta is read
            if blocks is not None:
                blocks.close()
            _ENVIRONMENTS.release(self.path)

    def __del__(self) -> None:
        # A reader dropped without close (a Store or Reader never closed) must not keep its
        # environment, a descriptor and a map, open for the rest of the process.
        with contextlib.suppress(Exception):  # half-made, or at interpreter exit
            self.close()


def _value_places(env: lmdb.Environment, count: int) -> np.ndarray | None:
    """(file offset, length) of the first ``count`` values in ``env``'s file, found through
    its map (pages just written: in the page cache); None where the map cannot be located."""
    with env.begin(buffers=True) as txn:
        first = txn.get(record_key(0)) if count else None
        if first is None:
            return None
        span = mapped_pages.map_span(first, _used_bytes(env))
        if span is None:
            return None
        cursor = txn.cursor()
        cursor.set_key(record_key(0))
        places = np.array(
            [(_address(v) - span[0], len(v)) for v in islice(cursor.iternext(keys=False), count)],
            np.int64,
        )
    return places.reshape(-1, 2)


def _places(meta: dict[str, Any], count: int, file_bytes: int) -> np.ndarray | None:
    """The shard's value places, (count, 2) int64, if it has them and they lie in the file
    (one a record, or one a block in the "blocks" layout)."""
    raw = meta.get(PLACES)
    if type(raw) is not bytes or len(raw) != 16 * count:
        return None
    places = np.frombuffer(raw, "<u8").reshape(count, 2).astype(np.int64)
    if count and int((places[:, 0] + places[:, 1]).max()) > file_bytes:
        return None  # damaged: read the usual way, which names what is wrong
    return places


def _address(view: memoryview) -> int:
    """The memory address of a buffer's first byte."""
    return int(np.frombuffer(view, np.uint8).ctypes.data)


def _columns_shape(meta: dict[str, Any]) -> tuple[int, int, int] | None:
    """The record shape of a "columns" shard, None for "records"; ValueError if damaged."""
    layout = meta.get("layout", "records")  # format 1 shards have no layout key
    if layout == "records":
        return None
    shape = meta.get("raw_shape")
    if layout != "columns" or meta.get("group") != GROUP:
        raise ValueError(f"layout {layout!r} with group {meta.get('group')!r} is not known")
    if not (
        type(shape) is list
        and len(shape) == 3
        and all(type(v) is int and 0 < v < 1 << 31 for v in shape)
        and shape[0] * shape[1] * shape[2] <= 1 << 30
        and type(meta.get("num_label_columns")) is int
        and 0 <= meta["num_label_columns"] < 1 << 16
    ):
        raise ValueError(f"raw_shape {shape!r} is not a record shape")
    return (shape[0], shape[1], shape[2])


def _to_block(
    records: list[Record], num_label_columns: int, out: np.ndarray | None = None, n: int = 0
) -> Block:
    """``records`` as a Block; its data the first ``n`` rows of ``out`` where given."""
    if out is not None:
        block = _to_block(records, num_label_columns)
        block.data = out[:n]
        return block
    n = len(records)
    labels = np.array([r.labels for r in records], dtype=np.int64).reshape(n, num_label_columns)
    return Block(
        data=[r.data for r in records],
        labels=labels,
        paths=[r.path for r in records],
        crc32=np.fromiter((r.crc32 for r in records), dtype=np.uint32, count=n),
        shapes=np.array([r.shape for r in records], dtype=np.int32).reshape(n, 3),
        formats=[r.format for r in records],
    )
