"""Memory for bytes read in bulk, given back to the system as soon as it is let go.

A reader allocates a buffer per chunk read ahead and per block of payloads, tens of
megabytes each, from several threads, and frees them as batches are taken. Through malloc,
glibc raises its threshold for serving a request from a map to the size of the largest map
freed, so after the first chunk every buffer comes from the threads' heaps instead, where
freed space is kept for reuse and fragments: the process grew by tens of megabytes an epoch
and was killed under a memory cap that one store's reads fitted in
(benchmarks/bench_mix_storage.py). A buffer of its own anonymous map is unmapped when its
last view goes, whatever malloc's thresholds.
"""

from __future__ import annotations

import mmap

__all__ = ["fresh"]

# Private: a forked child (a DataLoader worker) gets its own copy on write, as of malloc's.
_PRIVATE = {"flags": mmap.MAP_PRIVATE} if hasattr(mmap, "MAP_PRIVATE") else {}


def fresh(nbytes: int) -> memoryview:
    """``nbytes`` zeroed, writable bytes of an anonymous map of their own."""
    if nbytes <= 0:
        return memoryview(bytearray(0))
    return memoryview(mmap.mmap(-1, nbytes, **_PRIVATE))
