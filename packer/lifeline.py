"""Helper processes end with the process that started them, even when it is SIGKILLed.

A SIGKILLed parent gets no chance to stop its children. Left running, a pack's forked worker
kept the pack's lock on its staging folder (so the same command could not resume), and
verify's reader of a damaged shard spun for minutes after ``inspect`` was gone. Every helper
process packer starts calls ``die_with_parent`` first: Linux's PR_SET_PDEATHSIG has the kernel
kill it when its parent dies, and a thread that watches the parent's pid covers systems
without it (and a parent that died before either was in place). Dask's worker processes
watch their parent themselves (distributed's ``AsyncProcess``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>
_WATCH_SECONDS = 0.5


def die_with_parent(expected: int = 0, kernel: bool = True) -> None:
    """End this process when its parent process dies.

    ``expected``: the pid the caller knows the parent has (the starting process's own pid,
    passed to the child): a child whose parent already died exits at once. 0 where the parent
    is not the starting process (a forkserver's children: the forkserver, which exits when
    the process that started it does).

    ``kernel=False``: the watch alone, for a child forked by a thread that may end before
    its process does: PR_SET_PDEATHSIG fires when the parent *thread* ends."""
    parent = os.getppid()
    if expected and parent != expected:
        os._exit(1)
    try:
        if kernel:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the watch below does it, a little later
        pass
    if os.getppid() != parent:  # died before prctl took effect
        os._exit(1)
    threading.Thread(target=_watch, args=(parent,), name="packer-lifeline", daemon=True).start()


def _watch(parent: int) -> None:
    """Exit once this process is no longer its ``parent``'s child (re-parented: it died)."""
    while os.getppid() == parent:
        time.sleep(_WATCH_SECONDS)
    os._exit(1)
