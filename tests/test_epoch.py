"""The epoch plan, as pure functions: exactly once, equal shares, seeded orders."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.reading.epoch import (
    OPENING_LEAD,
    Span,
    chunk_spans,
    opening_order,
    share_size,
    shuffled_chunks,
    take_share,
    window_order,
    windows,
)


def _records(spans: list[Span]) -> list[tuple[int, int]]:
    return [(s.shard, i) for s in spans for i in range(s.start, s.stop)]


def test_chunks_cover_every_shard_and_never_cross_one() -> None:
    spans = chunk_spans([5, 0, 3], 2)
    assert spans == [Span(0, 0, 2), Span(0, 2, 4), Span(0, 4, 5), Span(2, 0, 2), Span(2, 2, 3)]
    with pytest.raises(ValueError, match="chunk_size must be at least 1"):
        chunk_spans([1], 0)


def test_chunk_order_is_seeded_by_the_pair() -> None:
    spans = chunk_spans([100], 1)
    a = shuffled_chunks(spans, 1, 2)
    assert a == shuffled_chunks(spans, 1, 2)
    assert a != shuffled_chunks(spans, 2, 1) and a != shuffled_chunks(spans, 1, 3)
    assert sorted(a, key=lambda s: s.start) == spans


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=5),
    chunk=st.integers(1, 9),
    parts=st.integers(1, 7),
    workers=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 5),
)
def test_ranks_and_workers_read_every_record_exactly_once(
    sizes: list[int], chunk: int, parts: int, workers: int, seed: int, epoch: int
) -> None:
    order = shuffled_chunks(chunk_spans(sizes, chunk), seed, epoch)
    everything = _records(order)
    total = len(everything)
    seen: list[tuple[int, int]] = []
    dropped_share = []
    for remainder in ("uneven", "drop", "pad"):
        shares = [take_share(order, rank, parts, remainder) for rank in range(parts)]
        lengths = [len(_records(s)) for s in shares]
        if remainder == "drop":
            assert lengths == [total // parts] * parts
            dropped_share = [r for s in shares for r in _records(s)]
            assert len(set(dropped_share)) == len(dropped_share)  # disjoint
        elif remainder == "pad":
            padded = [r for s in shares for r in _records(s)]
            assert lengths == [-(-total // parts)] * parts
            assert set(padded) == set(everything)  # everything, a few twice
        else:
            assert max(lengths) - min(lengths) <= 1
            for share in shares:  # each rank's share split among its DataLoader workers
                for worker in range(workers):
                    seen += _records(take_share(share, worker, workers, "uneven"))
            assert Counter(seen) == Counter(everything)  # every record exactly once
    assert sum(share_size(total, parts, p, "uneven") for p in range(parts)) == total


def test_windows_and_their_order() -> None:
    spans = chunk_spans([10], 3)
    assert [sum(len(s) for s in w) for w in windows(spans, 2)] == [6, 4]
    order = window_order(6, (0, 0, 0, 1, 0, 1), 0)
    assert sorted(order.tolist()) == list(range(6))
    assert window_order(6, (0, 0, 0, 1, 0, 1), 0).tolist() == order.tolist()
    assert (
        window_order(60, (0, 0, 0, 1, 0, 1), 1).tolist()
        != window_order(60, (0, 1, 0, 1, 0, 1), 1).tolist()
    )


@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=10),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=200, deadline=None)
def test_an_opening_window_yields_each_record_once_after_its_span_opens(
    sizes: list[int], seed: int
) -> None:
    order = opening_order(sizes, (seed, 0), 0)
    assert sorted(order.tolist()) == list(range(sum(sizes)))
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    span_of = [k for k, n in enumerate(sizes) for _ in range(n)]
    for position, record in enumerate(order.tolist()):
        assert position >= int(starts[span_of[record]] * OPENING_LEAD)
    assert opening_order(sizes, (seed, 0), 0).tolist() == order.tolist()


def test_an_opening_window_mixes_its_spans_as_it_goes() -> None:
    """Its first records come from the first span alone; then each span's records spread
    over more than twice its length, and any later stretch draws from several spans."""
    order = opening_order([100] * 8, (3, 0), 0)
    span = order // 100
    assert set(span[:75].tolist()) == {0}
    where = np.argsort(order)  # each record's position
    assert all(np.ptp(where[k * 100 : (k + 1) * 100]) > 200 for k in range(8))
    assert all(len(set(span[a : a + 100].tolist())) >= 4 for a in range(200, 800, 100))
    assert order.tolist() != opening_order([100] * 8, (4, 0), 0).tolist()
