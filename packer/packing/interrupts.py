"""Ctrl-C and SIGTERM while a pack's writer shares queues and futures with its threads: noted
when they arrive, raised where the writer holds no lock.

Python raises KeyboardInterrupt at whatever bytecode the main thread is at. Between the acquire
of a Python-level lock and its with block (threading.Condition.__enter__, which queue.Queue and
Future use), that leaves the lock held for good; the clean-up after the interrupt takes the same
lock and waits for ever, and so does any thread that needs it: an interrupted pack could hang.
Inside ``Deferred`` a signal whose handler is Python's (KeyboardInterrupt for Ctrl-C, the CLI's
for SIGTERM) is only noted; ``check()``, called where the writer waits for records, runs that
handler. A second signal before the check runs it at once: a user who presses Ctrl-C twice is not
kept waiting on a writer stuck in a long call.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

__all__ = ["Deferred"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Deferred:
    """A context in which SIGINT and SIGTERM are raised by ``check()``, not where they land.

    Only in the main thread (the one signals are handled in), and only for a signal whose
    handler is a Python function: SIG_DFL (a plain SIGTERM ends the process) and SIG_IGN stay
    as they are. On leaving, the handlers are put back and a signal still noted is raised,
    unless an exception is already on its way out."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self._noted: tuple[int, FrameType | None] | None = None
        self._raised = False
        self._left = False
        self._pid = os.getpid()

    def __enter__(self) -> Deferred:
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                handler = signal.getsignal(signum)
                if callable(handler):
                    self._previous[signum] = handler
                    signal.signal(signum, self._note)
        return self

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self._left or os.getpid() != self._pid:
            # Left from a thread that could not put the handlers back, or in a process forked
            # inside (a pool's worker, which its pool stops with SIGTERM if another dies).
            self._previous[signum](signum, frame)
        elif self._noted is None:
            self._noted = (signum, frame)
        elif not self._raised:  # a second signal before the check: at once
            self._raise(signum, frame)
        # Once raised, the clean-up is not interrupted again.

    def check(self) -> None:
        """Runs the handler of a signal noted since entering (it raises, as a rule)."""
        if self._noted is not None and not self._raised:
            self._raise(*self._noted)

    def _raise(self, signum: int, frame: FrameType | None) -> None:
        self._raised = True
        self._previous[signum](signum, frame)

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self._left = True
        if threading.current_thread() is threading.main_thread():
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
        if kind is None:
            self.check()
