"""Reading an LMDB shard of the "blocks" layout: records found by their block, a chunk read
by copying a few blocks' payload bytes.

A block is one value keyed by its first record's index (``record_key``), laid out by
``packer.store.record`` (block_value, parse_block). The shard's metadata lists where each
block starts (``block_starts``), so record i is in the last block starting at or before i,
found without touching the file. A block's header is parsed once and kept, within a memory
budget (``_HEADERS``): the reader's chunks rarely end where blocks do, so the block at a
chunk's end is read again as the next chunk's start, and a store of small records read epoch
after epoch is parsed once, not each epoch.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from itertools import chain, count
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from packer.store.base import Fetched, merge_ranges
from packer.store.record import Block, BlockIndex, parse_block

__all__ = ["BlockLayout", "record_key", "block_starts"]

# Memory a process gives to parsed block headers, over all its shards: about 120 bytes a
# record, more with longer paths, so about two million records. Parsing is a large part of
# reading small raw records; the headers kept are parsed in a store's first epoch only.
_HEADER_BUDGET = 256 << 20


class _Headers:
    """Parsed block headers, by (shard reader, block), up to ``budget`` bytes in all.

    Once full it keeps what it holds and lets new headers go: an epoch reads every block
    once, in a new order each time, so a cache that let the least recently used go would,
    for a store larger than it, drop each header before its next use and keep nothing
    useful, where this one spares every epoch the parse of the share it holds. Headers go
    when their shard reader closes (``forget``)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._held: dict[tuple[int, int], BlockIndex] = {}
        self._inherited: list[dict[tuple[int, int], BlockIndex]] = []  # see after_fork
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[int, int]) -> BlockIndex | None:
        return self._held.get(key)  # one dict lookup: atomic under the GIL

    def put(self, key: tuple[int, int], index: BlockIndex) -> None:
        if self._bytes >= self.budget:  # full: a store beyond it is not measured per parse
            return
        size = index.nbytes()
        with self._lock:
            if key not in self._held and self._bytes + size <= self.budget:
                self._held[key] = index
                self._bytes += size

    def forget(self, owner: int) -> None:
        """Let go of a closed shard reader's headers."""
        with self._lock:
            for key in [key for key in self._held if key[0] == owner]:
                self._bytes -= self._held.pop(key).nbytes()

    def after_fork(self) -> None:
        """In a forked child, start empty: the parent's headers belong to its shard readers,
        and kept they would fill the child's budget with nothing its own readers use (a
        DataLoader worker of a process that read the store first). They are set aside, not
        freed: freeing them would write to every one, copying the pages the child shares
        with the parent. The lock may have been held by a thread the child does not have."""
        self._lock = threading.Lock()
        self._inherited.append(self._held)
        self._held, self._bytes = {}, 0


_HEADERS = _Headers(_HEADER_BUDGET)
_OWNERS = count()  # tells shard readers apart in _HEADERS
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_HEADERS.after_fork)


def record_key(index: int) -> bytes:
    """The key of record ``index`` (of the block it starts, in the "blocks" layout)."""
    return b"%010d" % index


def block_starts(meta: dict[str, Any], num_records: int) -> np.ndarray:
    """The first record of each block, from the shard's metadata; ValueError if damaged."""
    raw = meta.get("block_starts")
    if type(raw) is not bytes or len(raw) % 8:
        raise ValueError("block_starts is not a list of record indices")
    starts = np.frombuffer(raw, "<u8").astype(np.int64)
    if num_records == 0:
        fits = len(starts) == 0
    else:
        fits = (
            len(starts) > 0
            and starts[0] == 0
            and bool(np.all(np.diff(starts) > 0))
            and starts[-1] < num_records
        )
    if not fits:
        raise ValueError(f"block_starts does not divide {num_records} records into blocks")
    return starts


class BlockLayout:
    """The records of one "blocks" shard, read from its open environment.

    ``places``: each block's (file offset, length), to take its value from read-ahead bytes;
    ``count_read``: told the bytes read through the map (see lmdb_store._Environments).
    """

    def __init__(
        self,
        env: lmdb.Environment,
        path: Path,
        meta: dict[str, Any],
        places: Callable[[int], np.ndarray | None],
        file_bytes: int,
        count_read: Callable[[int], None],
    ) -> None:
        self._env, self.path, self._count_read = env, path, count_read
        self._len = int(meta["num_records"])
        columns = meta.get("num_label_columns")
        if type(columns) is not int or not 0 <= columns < 1 << 16:
            raise ValueError(f"num_label_columns {columns!r} is not a column count")
        self._columns: int = columns
        self._starts = block_starts(meta, self._len)
        self._ends = np.append(self._starts[1:], self._len)
        self._shape = _raw_shape(meta.get("raw_shape"))
        self._places = places(len(self._starts))
        self._file_bytes = file_bytes
        self._owner = next(_OWNERS)

    def _blocks(self, start: int, stop: int) -> range:
        """The blocks holding records ``start`` to ``stop``."""
        if start >= stop:
            return range(0)
        first = int(np.searchsorted(self._starts, start, "right")) - 1
        return range(first, int(np.searchsorted(self._starts, stop - 1, "right")))

    def extents(self, start: int, stop: int) -> list[tuple[int, int]]:
        if self._places is None:
            return []
        pieces = [(int(o), int(n)) for o, n in self._places[self._blocks(start, stop)]]
        return merge_ranges(pieces, self._file_bytes)

    def _value(
        self, txn: lmdb.Transaction, number: int, fetched: Fetched | None
    ) -> tuple[bytes | memoryview, bool]:
        """Block ``number``'s value, and whether it was read through the map."""
        if fetched is not None and self._places is not None:
            offset, length = self._places[number]
            view = fetched.view(int(offset), int(length))
            if view is not None:
                return view, False
        value = txn.get(record_key(int(self._starts[number])))
        if value is None:
            raise ValueError(f"{self._where(number)} are missing (no block at their first key)")
        return value, True

    def _where(self, number: int) -> str:
        return f"{self.path}: records {self._starts[number]}..{self._ends[number] - 1}"

    def _index(self, number: int, value: bytes | memoryview) -> BlockIndex:
        """Block ``number``'s header, parsed and checked once while it stays in _HEADERS."""
        index = _HEADERS.get((self._owner, number))
        if index is not None:
            return index
        count = int(self._ends[number] - self._starts[number])
        try:
            index = parse_block(value, count, self._columns)
        except ValueError as e:
            raise ValueError(f"{self._where(number)}: {e}") from e
        _HEADERS.put((self._owner, number), index)
        return index

    def close(self) -> None:
        _HEADERS.forget(self._owner)

    def read_block(
        self, start: int, stop: int, out: np.ndarray | None, fetched: Fetched | None
    ) -> Block:
        """Records ``start`` to ``stop``; raw pixels of one shape copied into ``out`` (made
        if not given) block by block, one copy each, any other payloads sliced from one copy
        of each block's payload bytes."""
        n = stop - start
        if out is None and self._shape is not None:
            out = np.empty((n, *self._shape), np.uint8)
        if out is not None and (len(out) < n or not out.flags.c_contiguous):
            raise ValueError("out must be a C-contiguous array of at least the records read")
        flat = out.reshape(-1).data if out is not None else None
        row_bytes = out[0].nbytes if out is not None and len(out) else 0
        payloads: list[bytes | memoryview] = []
        parts: list[tuple[BlockIndex, int, int]] = []
        mapped, row = 0, 0
        with self._env.begin(buffers=True) as txn:  # a value is a view of the map
            for number in self._blocks(start, stop):
                value, through_map = self._value(txn, number, fetched)
                index = self._index(number, value)
                first = int(self._starts[number])
                a, z = max(start, first) - first, min(stop, int(self._ends[number])) - first
                bounds = index.offsets[a : z + 1]
                lo, hi = int(bounds[0]), int(bounds[-1])
                if flat is not None and out is not None:
                    if index.row_bytes != row_bytes:  # else known, once parsed, to fit
                        sizes = np.diff(bounds)
                        if (sizes != row_bytes).any():
                            k = int(np.argmax(sizes != row_bytes))
                            raise _wrong_row(
                                self.path, first + a + k, int(sizes[k]), out, row_bytes
                            )
                    flat[row * row_bytes : (row + z - a) * row_bytes] = value[lo:hi]
                else:  # one copy: a view would keep the map's pages or the fetched range
                    data = memoryview(bytes(value[lo:hi]))
                    cuts = (bounds - lo).tolist()
                    payloads.extend(data[x:y] for x, y in zip(cuts[:-1], cuts[1:]))
                parts.append((index, a, z))
                row += z - a
                if through_map:
                    mapped += hi - lo
        self._count_read(mapped)
        return Block(
            data=out[:n] if out is not None else payloads,
            labels=_joined([p.labels[a:z] for p, a, z in parts], (0, self._columns), np.int64),
            paths=list(chain.from_iterable(p.paths[a:z] for p, a, z in parts)),
            crc32=_joined([p.crc32[a:z] for p, a, z in parts], (0,), np.uint32),
            shapes=_joined([p.shapes[a:z] for p, a, z in parts], (0, 3), np.int32),
            formats=list(chain.from_iterable(p.formats[a:z] for p, a, z in parts)),
        )

    def read_labels(self) -> np.ndarray:
        """Every record's labels, from the blocks' headers alone."""
        labels, mapped = [], 0
        with self._env.begin(buffers=True) as txn:
            for number in range(len(self._starts)):
                value, _ = self._value(txn, number, None)
                index = self._index(number, value)
                labels.append(index.labels)
                mapped += len(value) - int(index.offsets[-1])
        self._count_read(mapped)
        return _joined(labels, (0, self._columns), np.int64)


def _joined(parts: list[np.ndarray], empty: tuple[int, ...], dtype: type) -> np.ndarray:
    """``parts`` (views of headers' bytes) as one array of their own, writable."""
    return np.concatenate(parts) if parts else np.zeros(empty, dtype)


def _wrong_row(path: Path, index: int, got: int, out: np.ndarray, row_bytes: int) -> ValueError:
    return ValueError(
        f"{path}: record {index} has {got:,} payload bytes, "
        f"the store's shape {list(out.shape[1:])} needs {row_bytes:,}"
    )


def _raw_shape(shape: Any) -> tuple[int, int, int] | None:
    """The shard's one record shape (raw pixels), None if it has none; ValueError if damaged."""
    if shape is None:
        return None
    if not (
        type(shape) is list
        and len(shape) == 3
        and all(type(v) is int and 0 < v < 1 << 31 for v in shape)
        and shape[0] * shape[1] * shape[2] <= 1 << 30
    ):
        raise ValueError(f"raw_shape {shape!r} is not a record shape")
    return (shape[0], shape[1], shape[2])
