"""Records packed twice from one source file, which ``inspect --verify`` reports.

Two records are the same source file packed twice when they came from the same folder (the
manifest's ``source.root``, or that of the ``--append`` that added them), under the same
path, with the same bytes (CRC-32). The same name in two folders, or a file that changed
between two appends, is not a duplicate. Each record is kept as one 64-bit key (8 bytes a
record, so a store of 30 million records takes 240 MB while it is checked); records whose
keys match are read again and compared in full, so a hash collision is never reported.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import xxhash

from packer.store.manifest import Manifest

__all__ = ["SourceKeys"]


class SourceKeys:
    """The source (folder, path, CRC-32) of every record of one store, as it is read."""

    def __init__(self, manifest: Manifest) -> None:
        self.starts, self.roots = _roots(manifest)
        self.keys = np.zeros(manifest.num_records, np.uint64)
        self.seen = np.zeros(manifest.num_records, bool)

    def identity(self, index: int, path: str, crc32: int) -> tuple[str, str, int]:
        """Which source file record ``index``, of ``path`` and ``crc32``, is."""
        return self.roots[bisect.bisect_right(self.starts, index) - 1], path, crc32

    def add(self, first: int, paths: list[str], crc32: np.ndarray) -> None:
        """Records ``first``, ``first + 1``, ... have these paths and CRC-32s."""
        for i, (path, crc) in enumerate(zip(paths, crc32.tolist())):
            root, _, _ = self.identity(first + i, path, crc)
            self.keys[first + i] = xxhash.xxh3_64_intdigest(f"{root}\0{path}\0{crc}".encode())
        self.seen[first : first + len(paths)] = True

    def candidates(self) -> Iterator[tuple[int, int]]:
        """(earlier, later) index pairs of records read whose keys match, by ``later``."""
        read = np.flatnonzero(self.seen)
        order = np.argsort(self.keys[read], kind="stable")  # equal keys stay in index order
        ranked = self.keys[read][order]
        new_run = np.r_[True, ranked[1:] != ranked[:-1]]
        run_first = np.maximum.accumulate(np.where(new_run, np.arange(len(ranked)), 0))
        pairs = [(read[order[run_first[k]]], read[order[k]]) for k in np.flatnonzero(~new_run)]
        for earlier, later in sorted(pairs, key=lambda pair: pair[1]):
            yield int(earlier), int(later)


def _roots(manifest: Manifest) -> tuple[list[int], list[str]]:
    """The first record index from which each source folder's records run, and the folders:
    the pack's, then each append's. A manifest whose history does not add up (a store made
    by another tool, or edited) gets one nameless folder for all."""
    source: dict[str, Any] = manifest.source
    appends = source.get("appends", [])
    try:
        counts = [int(entry["records"]) for entry in appends]
        roots = [str(source.get("root", ""))] + [str(entry["root"]) for entry in appends]
    except (TypeError, KeyError, ValueError):
        return [0], [""]
    first = manifest.num_records - sum(counts)
    if first < 0 or any(n < 0 for n in counts):
        return [0], [""]
    return [0, *itertools.accumulate(counts[:-1], initial=first)][: len(roots)], roots
