"""Keeping a read-only file map from swelling the resident memory of the process reading it.

LMDB reads a shard through a map of the whole file, and every page a read touches stays
mapped in the reading process until the map is closed: counted in its RSS, and in a
container's working set, which the kernel cannot shrink without unmapping. An epoch over a
100 GB store would leave each DataLoader worker showing 100 GB (users report it as LMDB's
"memory leak"). The pages belong to the page cache, so unmapping them from the process
(``madvise(MADV_DONTNEED)``) loses nothing: the next read of a page maps it again, from the
cache or from the disk. Linux only; elsewhere ``map_span`` finds nothing and nothing drops.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np

__all__ = ["map_span", "drop_pages"]

_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux") and _DONTNEED is not None:
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):
        _libc = None


def map_span(inside: memoryview, length: int) -> tuple[int, int] | None:
    """(address, bytes) of the first ``length`` bytes of the file map that holds the buffer
    ``inside`` (a view of the map), from /proc/self/maps; None where there is none to be
    found. Only a read-only shared map of a file from its start qualifies: on such a map
    MADV_DONTNEED cannot discard data, where on a private or writable one it would."""
    if _libc is None or not len(inside):
        return None
    address = np.frombuffer(inside, np.uint8).ctypes.data
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if start <= address < end:
                    if fields[1] == "r--s" and int(fields[2], 16) == 0:
                        return start, min(end - start, length)
                    return None
    except (OSError, ValueError, IndexError):
        pass
    return None


def drop_pages(span: tuple[int, int]) -> None:
    """Unmap the pages of ``span`` (from ``map_span``) from this process. The caller makes
    sure the map is still open: after a close its addresses may hold other memory."""
    assert _libc is not None and _DONTNEED is not None, "map_span found no span"
    _libc.madvise(span[0], span[1], _DONTNEED)  # a hint: an error leaves pages mapped
