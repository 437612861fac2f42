"""Tests for packer.prefetch.Prefetcher (real threads, no mocks)."""

from __future__ import annotations

import gc
import importlib
import importlib.util
import itertools
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import run_in_child

try:
    prefetch = importlib.import_module("packer.prefetch")
except Exception:  # packer/__init__.py missing or broken while the package is being written
    _spec = importlib.util.spec_from_file_location(
        "_packer_prefetch", Path(__file__).resolve().parents[1] / "packer" / "prefetch.py"
    )
    assert _spec is not None and _spec.loader is not None
    prefetch = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(prefetch)

Prefetcher = prefetch.Prefetcher

_names = itertools.count()


def _name() -> str:
    return f"test-prefetch-{next(_names)}"


def _alive(name: str) -> bool:
    return any(t.name == name and t.is_alive() for t in threading.enumerate())


def _gone(name: str, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(name):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def baseline() -> Iterator[int]:
    """Asserts that no thread the test started is left: threads of earlier tests that end
    meanwhile are not the test's to count."""
    before = set(threading.enumerate())
    yield len(before)
    deadline = time.monotonic() + 3.0
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not set(threading.enumerate()) - before


@pytest.mark.parametrize("depth", [1, 2, 8])
def test_order_and_completeness(depth: int, baseline: int) -> None:
    name = _name()
    pf = Prefetcher(lambda: iter(range(100)), depth=depth, name=name)
    assert list(pf) == list(range(100))
    assert not _alive(name)  # joined when the end was delivered
    with pytest.raises(StopIteration):
        next(pf)


def test_empty_source(baseline: int) -> None:
    pf = Prefetcher(lambda: iter([]), name=_name())
    assert list(pf) == []
    assert pf.stats()["items"] == 0


@pytest.mark.parametrize("bad", [0, -1])
def test_depth_validated(bad: int) -> None:
    with pytest.raises(ValueError, match=rf"depth.*{bad}"):
        Prefetcher(lambda: iter([]), depth=bad)


@pytest.mark.parametrize("depth", [1, 3])
def test_producer_runs_at_most_depth_plus_one_ahead(depth: int, baseline: int) -> None:
    requested = 0
    ahead: list[int] = []

    def source() -> Iterator[int]:
        for i in range(30):
            ahead.append(i + 1 - requested)  # produced (incl. this one) minus requested
            yield i

    pf = Prefetcher(source, depth=depth, name=_name())
    out = []
    while True:
        # Counted before asking so the producer can never observe an undercount.
        requested += 1
        try:
            out.append(next(pf))
        except StopIteration:
            break
        time.sleep(0.003)  # slow consumer: the producer fills the queue meanwhile
    assert out == list(range(30))
    assert max(ahead) == depth + 1  # prefetches fully, but never further


def _bad_source() -> Iterator[int]:
    raise ValueError("cannot open shard")


def test_exception_in_source_call(baseline: int) -> None:
    name = _name()
    pf = Prefetcher(_bad_source, name=name)
    with pytest.raises(ValueError, match="cannot open shard") as info:
        next(pf)
    text = "".join(traceback.format_exception(info.value))
    assert "_bad_source" in text and "_produce" in text  # producer frames kept
    with pytest.raises(StopIteration):
        next(pf)
    assert not _alive(name)


def test_exception_mid_iteration_is_same_object(baseline: int) -> None:
    raised: list[BaseException] = []

    def _bad_gen() -> Iterator[int]:
        yield 0
        yield 1
        exc = KeyError("corrupt record")
        raised.append(exc)
        raise exc

    pf = Prefetcher(_bad_gen, depth=4, name=_name())
    assert next(pf) == 0 and next(pf) == 1
    with pytest.raises(KeyError) as info:
        next(pf)
    assert info.value is raised[0]
    text = "".join(traceback.format_exception(info.value))
    assert "_bad_gen" in text and "raise exc" in text
    with pytest.raises(StopIteration):
        next(pf)


def test_lazy_start_in_named_thread(baseline: int) -> None:
    name = _name()
    called_in: list[str] = []

    def source() -> Iterator[int]:
        called_in.append(threading.current_thread().name)
        return iter(range(3))

    pf = Prefetcher(source, name=name)
    time.sleep(0.05)
    assert not called_in and not _alive(name)  # nothing started by __init__
    assert next(pf) == 0
    assert called_in == [name]  # source() ran inside the producer thread
    assert all(t.daemon for t in threading.enumerate() if t.name == name)
    pf.close()
    assert not _alive(name)


def test_break_then_close(baseline: int) -> None:
    name = _name()
    pf = Prefetcher(lambda: itertools.count(), name=name)
    for i in pf:
        if i == 5:
            break
    assert _alive(name)
    pf.close()
    assert not _alive(name)
    with pytest.raises(StopIteration):
        next(pf)


def test_with_block_exited_by_exception(baseline: int) -> None:
    name = _name()
    with (
        pytest.raises(RuntimeError, match="step failed"),
        Prefetcher(lambda: itertools.count(), name=name) as pf,
    ):
        next(pf)
        raise RuntimeError("step failed")
    assert not _alive(name)


def test_dropped_without_close_is_finalized(baseline: int) -> None:
    name = _name()
    pf = Prefetcher(lambda: itertools.count(), depth=2, name=name)
    for _ in pf:
        break
    assert _alive(name)
    del pf
    gc.collect()
    assert _gone(name)


def test_close_twice_and_close_before_iteration(baseline: int) -> None:
    name = _name()
    pf = Prefetcher(lambda: itertools.count(), name=name)
    next(pf)
    pf.close()
    pf.close()
    assert not _alive(name)

    called: list[bool] = []
    name2 = _name()

    def source() -> Iterator[int]:
        called.append(True)
        return iter([1])

    pf2 = Prefetcher(source, name=name2)
    pf2.close()
    with pytest.raises(StopIteration):
        next(pf2)
    assert not called and not _alive(name2)  # no thread was ever started


def test_close_runs_generator_finally(baseline: int) -> None:
    finalized = threading.Event()
    closed_in: list[str] = []
    gens: list[Iterator[int]] = []  # keeps the generator alive: only close() can finish it
    name = _name()

    def gen() -> Iterator[int]:
        try:
            yield from itertools.count()
        finally:
            closed_in.append(threading.current_thread().name)
            finalized.set()

    def source() -> Iterator[int]:
        gens.append(gen())
        return gens[0]

    pf = Prefetcher(source, name=name)
    assert next(pf) == 0
    pf.close()
    assert finalized.is_set()  # close() is synchronous: the generator was closed
    assert closed_in == [name]  # ... by the producer thread


def test_close_timeout_warns_then_thread_closes_source(
    baseline: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(prefetch, "_JOIN_TIMEOUT_S", 0.2)
    gate = threading.Event()
    finalized = threading.Event()
    name = _name()

    def source() -> Iterator[int]:
        try:
            yield 0
            gate.wait(5)  # stuck inside next() when close() is called
            yield 1
        finally:
            finalized.set()

    pf = Prefetcher(source, depth=1, name=name)
    assert next(pf) == 0
    with caplog.at_level(logging.WARNING, logger=prefetch.__name__):
        pf.close()
    assert any("did not stop" in r.getMessage() for r in caplog.records)
    assert _alive(name) and not finalized.is_set()
    gate.set()
    assert finalized.wait(2) and _gone(name)


def test_stats_slow_producer(baseline: int) -> None:
    n, delay = 10, 0.02

    def source() -> Iterator[int]:
        for i in range(n):
            time.sleep(delay)
            yield i

    with Prefetcher(source, depth=2, name=_name()) as pf:
        assert list(pf) == list(range(n))
        s = pf.stats()
    assert s["items"] == n and s["depth"] == 2
    assert s["wait_s"] >= 0.5 * n * delay
    assert s["produce_s"] >= 0.9 * n * delay
    assert s["queue_fill"] < 0.5  # consumer always finds the queue (nearly) empty


def test_stats_slow_consumer(baseline: int) -> None:
    depth, n = 4, 40
    with Prefetcher(lambda: iter(range(n)), depth=depth, name=_name()) as pf:
        for _ in pf:
            time.sleep(0.003)
        s = pf.stats()
    assert s["items"] == n
    assert s["queue_fill"] >= 0.75 * depth
    assert s["wait_s"] < 0.5 * n * 0.003


needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@needs_fork
def test_created_before_fork_works_in_child_and_parent(baseline: int) -> None:
    pf = Prefetcher(lambda: iter(range(20)), depth=3, name=_name())
    run_in_child(lambda: list(pf) == list(range(20)))  # no thread was inherited
    assert list(pf) == list(range(20))


@needs_fork
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with a live thread
def test_dead_producer_detected_after_fork(baseline: int) -> None:
    entered, gate = threading.Event(), threading.Event()

    def source() -> Iterator[int]:
        yield 0
        entered.set()
        gate.wait(5)  # parked outside any queue lock while we fork
        yield 1

    with Prefetcher(source, depth=1, name=_name()) as pf:
        assert next(pf) == 0
        assert entered.wait(2)

        def child() -> bool:  # the producer thread does not exist in the child
            t0 = time.monotonic()
            try:
                next(pf)
            except RuntimeError as exc:
                return "without signalling" in str(exc) and time.monotonic() - t0 < 1.0
            return False

        run_in_child(child)
        gate.set()
        assert next(pf) == 1  # the parent is unaffected


@pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or threading.current_thread() is not threading.main_thread(),
    reason="needs POSIX interval timers delivered to the main thread",
)
def test_keyboard_interrupt_while_waiting(baseline: int) -> None:
    name = _name()

    def slow() -> Iterator[int]:
        while True:
            time.sleep(1.0)
            yield 0

    def on_alarm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, on_alarm)
    pf = Prefetcher(slow, name=name)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            next(pf)
        assert time.monotonic() - t0 < 0.6  # did not wait for the 1 s item
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert _alive(name)
    t0 = time.monotonic()
    pf.close()
    assert not _alive(name) and time.monotonic() - t0 < 2.0


def test_poll_runs_while_waiting_and_what_it_raises_ends_the_wait(baseline: int) -> None:
    """A consumer that defers its signals raises them from ``poll`` (packer.packing.interrupts)."""
    name = _name()
    polls: list[float] = []

    def slow() -> Iterator[int]:
        while True:
            time.sleep(1.0)
            yield 0

    def poll() -> None:
        polls.append(time.monotonic())
        if len(polls) == 3:
            raise KeyboardInterrupt

    pf = Prefetcher(slow, name=name, poll=poll)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        next(pf)
    assert len(polls) == 3 and time.monotonic() - t0 < 0.6  # did not wait for the 1 s item
    pf.close()
    assert _gone(name)


def test_close_does_not_hang_on_a_queue_lock_an_interrupt_left_held(
    baseline: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """CPython can raise KeyboardInterrupt between a Condition's acquire and its with block,
    leaving the queue's lock held by the consumer. Here the consumer holds it, as such a frame
    left it; close() used to wait for it for ever. It now gives up on the producer (blocked on
    that lock too) after its join time, with a warning."""
    monkeypatch.setattr(prefetch, "_JOIN_TIMEOUT_S", 0.2)
    name = _name()
    pf = Prefetcher(itertools.count, depth=1, name=name)
    assert next(pf) == 0
    time.sleep(0.05)  # the producer fills the queue and waits to put the next item
    held = pf._shared.queue.mutex
    held.acquire()
    closer = threading.Thread(target=pf.close)
    try:
        with caplog.at_level(logging.WARNING, logger=prefetch.__name__):
            closer.start()
            closer.join(5)
            assert not closer.is_alive(), "close() waited for the queue's lock"
        assert any("did not stop" in r.getMessage() for r in caplog.records)
    finally:
        held.release()  # the producer gets the lock, sees stop and ends
    closer.join()
    assert _gone(name)
