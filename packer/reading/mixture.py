"""Several stores read as one: how many records each gives an epoch, which of them, and in what
interleave. Pure functions, no I/O.

Each store of a mixture is read as an endless sequence of its own epochs (every record once
per epoch of the store, its chunks reshuffled each time), and an epoch of the mixture takes
the next ``quota`` records of each store's sequence. So a store is never read in bursts: its
records come in its quota's share of every batch, and over the mixture's epochs every record
of a store comes as often as every other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from packer.errors import UsageError
from packer.reading import epoch as plan

__all__ = ["check_weights", "quotas", "window_chunks", "source_segment", "mix_order"]

# Seeds the interleave, apart from the seeds of chunk orders and shuffle windows.
_MIX_STREAM = 0x6D6978


def check_weights(weights: Sequence[float] | None, count: int) -> tuple[float, ...] | None:
    """``weights`` as fractions summing to 1 (None stays None: each store in proportion to
    its size); a wrong count or a weight that is not a positive number is refused."""
    if weights is None:
        return None
    values = tuple(weights)
    if len(values) != count:
        raise UsageError(f"{len(values)} weights for {count} stores: give one weight per store")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"a weight must be a positive number, not {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise UsageError(f"a weight must be a positive number, not {value!r}")
    total = math.fsum(values)
    return tuple(v / total for v in values)


def quotas(
    sizes: Sequence[int], weights: Sequence[float] | None, epoch_size: int | None
) -> list[int]:
    """Records each store gives one epoch of the mixture.

    Without ``epoch_size`` the epoch lasts until the store scarcest for its weight has given
    each of its records once (without weights: every store once, all records of all stores);
    with it, the epoch has ``epoch_size`` records, and a store whose quota is larger than the
    store is read more than once (its next epochs, reshuffled). Quotas are the weights'
    shares rounded by largest remainder, so they sum to the epoch exactly.
    """
    if weights is None:
        if epoch_size is None:
            return list(sizes)
        weights = check_weights(sizes, len(sizes)) if sum(sizes) else None
        if weights is None:
            raise UsageError("the stores hold no records: there is nothing to mix")
    if epoch_size is None:
        epoch_size = min(math.floor(n / w) for n, w in zip(sizes, weights, strict=True))
    ideal = [w * epoch_size for w in weights]
    out = [math.floor(x) for x in ideal]
    by_fraction = sorted(range(len(ideal)), key=lambda i: out[i] - ideal[i])
    for i in by_fraction[: epoch_size - sum(out)]:
        out[i] += 1
    return out


def window_chunks(buffer_chunks: int, quotas: Sequence[int]) -> list[int]:
    """Each store's share of the shuffle buffer, in chunks: ``buffer_chunks`` in proportion
    to the records it gives an epoch, and at least one.

    So a mixture's windows hold together about what one store's window holds, and each
    lasts about as many batches: a store giving 30% of every batch empties a window of 30%
    of the chunks as fast as a store read alone empties a whole one. A whole buffer each
    would hold k times the memory, and gathering batches from k whole windows was slower
    (design-notes, "Mixing stores")."""
    total = sum(quotas)
    if len(quotas) == 1 or not total:
        return [buffer_chunks] * len(quotas)
    return [max(1, round(buffer_chunks * q / total)) for q in quotas]


def source_segment(
    chunks: Sequence[plan.Span],
    count: int,
    start: int,
    *,
    seed: int,
    shuffle: bool,
    source: int | None,
) -> list[plan.Span]:
    """Records ``start`` to ``start + count`` of a store's endless sequence of epochs, as
    spans: the store's epoch ``start // records`` in its shuffled chunk order, from the
    record ``start % records`` of it on, then the next epochs as far as ``count`` reaches.

    ``source`` tells the stores of a mixture apart in the seeds (None: a store read alone,
    whose epoch e is exactly its chunk order of epoch e).
    """
    total = sum(len(s) for s in chunks)
    out: list[plan.Span] = []
    while count > 0 and total:
        epoch, offset = divmod(start, total)
        more = () if source is None else (source,)
        order = plan.shuffled_chunks(chunks, seed, epoch, *more) if shuffle else list(chunks)
        take = min(count, total - offset)
        out += plan.cut(order, offset, take)
        start += take
        count -= take
    return out


def mix_order(counts: Sequence[int], key: Sequence[int]) -> np.ndarray:
    """Which store each of a lane's records comes from, in order, given how many each store
    gives the lane: the j-th record of a store giving c lands at a seeded point of
    [j / c, (j + 1) / c) of the lane, so any stretch of the lane holds each store's share of
    it to within two records, and the pattern differs from lane to lane and epoch to epoch.
    """
    total = sum(counts)
    if len(counts) == 1:
        return np.zeros(total, np.int16)
    rng = np.random.default_rng([*key, _MIX_STREAM])
    points = np.concatenate(
        [(np.arange(c) + rng.random(c)) / c if c else np.zeros(0) for c in counts]
    )
    sources = np.repeat(np.arange(len(counts), dtype=np.int16), counts)
    return sources[np.argsort(points, kind="stable")]
