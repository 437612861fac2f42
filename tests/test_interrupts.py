"""packer.packing.interrupts.Deferred: real signals sent to this process, in its main thread."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from packer.packing.interrupts import Deferred

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or threading.current_thread() is not threading.main_thread(),
    reason="needs POSIX signals handled in this, the main thread",
)


def _let_handlers_run() -> None:
    """A few bytecodes, at which Python runs the handler of a signal that has arrived."""
    deadline = time.monotonic() + 0.05
    while time.monotonic() < deadline:
        pass


def test_a_signal_inside_is_raised_by_check_not_where_it_lands() -> None:
    with Deferred() as signals:
        os.kill(os.getpid(), signal.SIGINT)
        _let_handlers_run()  # no KeyboardInterrupt here
        with pytest.raises(KeyboardInterrupt):
            signals.check()
        signals.check()  # raised once: the clean-up after it is not interrupted again
        os.kill(os.getpid(), signal.SIGINT)
        _let_handlers_run()
        signals.check()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_signal_still_noted_is_raised_on_leaving() -> None:
    with pytest.raises(KeyboardInterrupt), Deferred():
        os.kill(os.getpid(), signal.SIGINT)
        _let_handlers_run()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_signal_before_the_check_is_raised_at_once() -> None:
    """Ctrl-C twice: the user is not kept waiting on a writer stuck in a long call."""
    with Deferred() as signals:
        os.kill(os.getpid(), signal.SIGINT)
        _let_handlers_run()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            _let_handlers_run()
        signals.check()  # the one raised was that signal's


def test_sigterm_goes_through_the_handler_set_before() -> None:
    """The CLI turns SIGTERM into KeyboardInterrupt; inside, that handler runs at the check.
    A SIGTERM left to the system's default (a library caller's) is not touched."""
    seen: list[int] = []

    def handler(signum: int, frame: object) -> None:
        seen.append(signum)

    before = signal.signal(signal.SIGTERM, handler)
    try:
        with Deferred() as signals:
            os.kill(os.getpid(), signal.SIGTERM)
            _let_handlers_run()
            assert seen == []
            signals.check()
            assert seen == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is handler
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with Deferred():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


def test_outside_the_main_thread_nothing_changes() -> None:
    handlers: list[object] = []

    def enter() -> None:
        with Deferred() as signals:
            handlers.append(signal.getsignal(signal.SIGINT))
            signals.check()

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert handlers == [signal.default_int_handler]


def test_a_process_forked_inside_runs_the_handler_set_before() -> None:
    """A pack's pool worker is forked inside; its pool stops it with SIGTERM when another
    worker dies, so there the signal must act as before, not wait for a check never made."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(7)

    before = signal.signal(signal.SIGTERM, handler)
    try:
        with Deferred():
            pid = os.fork()
            if pid == 0:  # the child: ends by the handler, or with 0 if it was only noted
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                    _let_handlers_run()
                    os._exit(0)
                except SystemExit as e:
                    os._exit(int(e.code or 0))
            _, status = os.waitpid(pid, 0)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert os.waitstatus_to_exitcode(status) == 7
