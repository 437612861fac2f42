"""One lock that a fork waits for, so that a forked child never inherits a lock held mid-work.

A fork copies only the thread that calls it. A lock another thread held at that moment
(h5py's global lock, the LMDB handle table's, an import's module lock) stays held in the
child, by a thread the child does not have: the child hangs on its first read or import.
A reader's background thread holds FORK_GATE for each shard open and read, and packer
imports Pillow's plugins under it; os.register_at_fork makes every fork wait for it. So
DataLoader workers, and any other child, may be forked while readers prefetch.
"""

from __future__ import annotations

import os
import threading

# h5py registers a fork hook that takes its global lock; hooks registered later run first.
# Registering ours after h5py's makes a fork wait for our gate before h5py's lock: the other
# order deadlocks with a reader's thread that holds the gate and waits for h5py's lock.
import h5py  # noqa: F401  (imported for its fork hook, which must be registered first)

__all__ = ["FORK_GATE"]

FORK_GATE = threading.RLock()
if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(
        before=FORK_GATE.acquire,
        after_in_parent=FORK_GATE.release,
        after_in_child=FORK_GATE._at_fork_reinit,  # type: ignore[attr-defined]
    )
