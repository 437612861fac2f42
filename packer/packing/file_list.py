"""The files of a pack in a few arrays: millions of entries at ~40 bytes each plus their names.

A list of small Python objects costs ~0.5 KB a file (an object, its path string, a tuple
of labels, the ints inside), which put a pack of 1M files at ~600 MB before it read one.
Here every path is in one UTF-8 blob, with offsets, sizes and labels in NumPy arrays; an
entry becomes a ``SourceItem`` only when it is looked at. Shuffling and splitting a list
make views (an index array over the same blob), not copies.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

__all__ = ["SourceItem", "FileList", "FileListBuilder"]

_ITER_CHUNK = 4096  # entries turned into Python objects at a time while iterating


@dataclass(frozen=True, slots=True)
class SourceItem:
    path: str  # relative to the source root, "/"-separated
    size: int
    labels: tuple[int, ...]


class FileList:
    """An immutable sequence of SourceItems held in arrays; see the module's docstring."""

    def __init__(
        self,
        blob: bytes | bytearray,
        offsets: np.ndarray,
        sizes: np.ndarray,
        labels: np.ndarray | None = None,
        order: np.ndarray | None = None,
    ) -> None:
        self._blob = blob
        self._offsets = offsets  # (entries + 1,) int64: entry i's path is blob[o[i]:o[i+1]]
        self._sizes = sizes  # (entries,) int64
        count = len(sizes)
        self._labels = labels if labels is not None else np.zeros((count, 0), np.int64)
        self._order = order  # which entries of the arrays, in what order; None: all, in order

    @classmethod
    def of(cls, items: Iterable[SourceItem]) -> FileList:
        """A FileList of ``items``, which must all have the same number of labels."""
        builder = FileListBuilder()
        labels: list[tuple[int, ...]] = []
        for item in items:
            builder.add(item.path, item.size)
            labels.append(item.labels)
        width = len(labels[0]) if labels else 0
        return builder.build(np.array(labels, np.int64).reshape(len(labels), width))

    def __len__(self) -> int:
        return len(self._sizes) if self._order is None else len(self._order)

    def _index(self) -> np.ndarray:
        return np.arange(len(self._sizes)) if self._order is None else self._order

    @overload
    def __getitem__(self, key: int) -> SourceItem: ...

    @overload
    def __getitem__(self, key: slice) -> FileList: ...

    def __getitem__(self, key: int | slice) -> SourceItem | FileList:
        if isinstance(key, slice):
            return self.take(self._index()[key], within=False)
        n = len(self)
        if not -n <= key < n:
            raise IndexError(f"entry {key} of {n}")
        at = int(key % n if self._order is None else self._order[key])
        return self._item(at, self._labels[at].tolist())

    def _item(self, at: int, labels: list[int]) -> SourceItem:
        start, stop = int(self._offsets[at]), int(self._offsets[at + 1])
        path = self._blob[start:stop].decode("utf-8")
        return SourceItem(path, int(self._sizes[at]), tuple(labels))

    def __iter__(self) -> Iterator[SourceItem]:
        index = self._index()
        for first in range(0, len(index), _ITER_CHUNK):
            chunk = index[first : first + _ITER_CHUNK]
            starts = self._offsets[chunk].tolist()
            stops = self._offsets[chunk + 1].tolist()
            sizes = self._sizes[chunk].tolist()
            labels = self._labels[chunk].tolist()
            blob = self._blob
            for start, stop, size, label in zip(starts, stops, sizes, labels):
                yield SourceItem(blob[start:stop].decode("utf-8"), size, tuple(label))

    def take(self, positions: Any, within: bool = True) -> FileList:
        """The entries at ``positions`` of this list, in that order: a view, no path copied.
        (``within=False``: ``positions`` already index the underlying arrays.)"""
        chosen = np.asarray(positions, dtype=np.int64)
        if within and self._order is not None:
            chosen = self._order[chosen]
        return FileList(self._blob, self._offsets, self._sizes, self._labels, chosen)

    @staticmethod
    def concat(parts: list[FileList]) -> FileList:
        """Views of one list, back to back (the shard jobs of one pack)."""
        if not parts:
            return FileListBuilder().build()
        base = parts[0]
        if any(p._blob is not base._blob for p in parts):
            return FileList.of(item for part in parts for item in part)
        order = np.concatenate([p._index() for p in parts])
        return FileList(base._blob, base._offsets, base._sizes, base._labels, order)

    @property
    def sizes(self) -> np.ndarray:
        """Each entry's size in bytes, in order (int64)."""
        return self._sizes if self._order is None else self._sizes[self._order]

    @property
    def labels(self) -> np.ndarray:
        """(entries, label columns) int64, in order."""
        return self._labels if self._order is None else self._labels[self._order]

    def with_labels(self, labels: np.ndarray) -> FileList:
        """These entries, in this order, with ``labels`` (one row each) instead."""
        kept = self.compact()
        return FileList(kept._blob, kept._offsets, kept._sizes, np.asarray(labels, np.int64))

    def compact(self) -> FileList:
        """This list's own entries in fresh arrays (what a view pickles as)."""
        if self._order is None:
            return self
        return FileList.of(iter(self))

    def top_folders(self) -> tuple[list[str], np.ndarray]:
        """Each entry's first folder: (the folder names, sorted; each entry's index among them,
        -1 for an entry with no folder). Reads each path once, a chunk of entries at a time,
        and makes an object only where the folder changes from one entry to the next (once
        per folder in a list sorted by path)."""
        index = self._index()
        runs = np.full(len(index), -1, np.int64)
        names: list[bytes | bytearray] = []
        for first in range(0, len(index), _ITER_CHUNK * 16):
            chunk = index[first : first + _ITER_CHUNK * 16]
            starts, stops = self._offsets[chunk], self._offsets[chunk + 1]
            low, high = int(starts.min()), int(stops.max())
            slashes = np.flatnonzero(np.frombuffer(self._blob, np.uint8, high - low, low) == 47)
            slashes += low  # ord("/") == 47: the slashes of this chunk's paths, in the blob
            nearest = np.searchsorted(slashes, starts)
            found = nearest < len(slashes)
            if not len(slashes):
                continue
            slash = np.where(found, slashes[np.minimum(nearest, len(slashes) - 1)], stops)
            has = found & (slash < stops)
            lengths = slash - starts
            for k in np.flatnonzero(has).tolist():
                start, length = int(starts[k]), int(lengths[k])
                previous = names[-1] if names else None
                if (
                    previous is None
                    or len(previous) != length
                    or (self._blob[start : start + length] != previous)
                ):
                    names.append(self._blob[start : start + length])
                runs[first + k] = len(names) - 1
        # Runs of one name apart (a list not sorted by path) are one folder all the same.
        texts = [n.decode("utf-8") for n in names]
        ordered = sorted(set(texts))
        where = {name: i for i, name in enumerate(ordered)}
        remap = np.array([where[t] for t in texts] + [-1], np.int64)
        return ordered, remap[runs]  # -1 (no folder) picks remap's last entry: -1

    def sorted_by_path(self) -> FileList:
        """These entries sorted by path (as ``str`` sorts them: UTF-8 bytes sort the same)."""
        blob, offsets = self._blob, self._offsets
        index = self._index()
        keys = [blob[int(offsets[i]) : int(offsets[i + 1])] for i in index]
        order = sorted(range(len(keys)), key=keys.__getitem__)
        return self.take(np.asarray(order, np.int64))

    def __getstate__(self) -> dict[str, Any]:
        # A view (a shard job's part) travels as its own entries, not the whole pack's.
        kept = self.compact()
        return {
            "blob": kept._blob,
            "offsets": kept._offsets,
            "sizes": kept._sizes,
            "labels": kept._labels,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["blob"], state["offsets"], state["sizes"], state["labels"])  # type: ignore[misc]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FileList):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    def __repr__(self) -> str:
        return f"FileList({len(self)} entries)"


class FileListBuilder:
    """Collects (path, size) pairs compactly, as a walk finds them."""

    def __init__(self) -> None:
        self._blob = bytearray()
        self._ends = array("q")
        self._sizes = array("q")

    def add(self, path: str, size: int) -> None:
        self._blob += path.encode("utf-8")
        self._ends.append(len(self._blob))
        self._sizes.append(size)

    def __len__(self) -> int:
        return len(self._sizes)

    def build(self, labels: np.ndarray | None = None) -> FileList:
        """The FileList of everything added (with ``labels``: one row per entry); the builder
        hands its buffers over, without a copy, and starts empty again."""
        offsets = np.zeros(len(self._ends) + 1, np.int64)
        if len(self._ends):
            offsets[1:] = np.frombuffer(self._ends, np.int64)
        sizes = np.frombuffer(self._sizes, np.int64) if len(self._sizes) else np.zeros(0, np.int64)
        blob = self._blob
        self._blob, self._ends, self._sizes = bytearray(), array("q"), array("q")
        return FileList(blob, offsets, sizes, labels)
