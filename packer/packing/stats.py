"""Streaming summaries of a store's records: constant memory however many records pass."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Distribution", "RecordStats"]


@dataclass
class Distribution:
    """Count, min, max, mean and a power-of-two histogram of non-negative integers."""

    count: int = 0
    total: int = 0
    min: int | None = None
    max: int | None = None
    histogram: Counter[int] = field(default_factory=Counter)  # 2**k -> values in [2**k, 2**(k+1))

    def add(self, value: int) -> None:
        # Once per record per column, in the writer's thread: plain comparisons, and the
        # bucket from the bit length (exact, where a float log2 rounds near powers of two).
        self.count += 1
        self.total += value
        if self.min is None or value < self.min:
            self.min = value
        if self.max is None or value > self.max:
            self.max = value
        self.histogram[1 << value.bit_length() >> 1] += 1  # 0 for 0

    def merge(self, other: Distribution) -> None:
        self.count += other.count
        self.total += other.total
        if other.min is not None:
            self.min = other.min if self.min is None else min(self.min, other.min)
        if other.max is not None:
            self.max = other.max if self.max is None else max(self.max, other.max)
        self.histogram.update(other.histogram)

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "total": self.total,
            "min": self.min,
            "max": self.max,
            "mean": round(self.total / self.count, 1) if self.count else None,
            "histogram": {str(k): v for k, v in sorted(self.histogram.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Distribution:
        histogram = Counter({int(k): int(v) for k, v in data["histogram"].items()})
        # Stores packed before "total" was recorded have only the rounded mean.
        total = data.get("total", round((data["mean"] or 0) * data["count"]))
        return cls(int(data["count"]), int(total), data["min"], data["max"], histogram)


@dataclass
class RecordStats:
    num_label_columns: int
    payload_bytes: Distribution = field(default_factory=Distribution)
    height: Distribution = field(default_factory=Distribution)
    width: Distribution = field(default_factory=Distribution)
    formats: Counter[str] = field(default_factory=Counter)
    label_counts: list[Counter[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.label_counts = [Counter() for _ in range(self.num_label_columns)]

    def add(
        self, nbytes: int, shape: tuple[int, int, int], fmt: str, labels: tuple[int, ...]
    ) -> None:
        self.payload_bytes.add(nbytes)
        self.height.add(shape[0])
        self.width.add(shape[1])
        self.formats[fmt] += 1
        for counter, label in zip(self.label_counts, labels):
            counter[label] += 1

    def merge(self, other: RecordStats) -> None:
        """Add ``other``'s records, as if each had been added here."""
        for name in ("payload_bytes", "height", "width"):
            getattr(self, name).merge(getattr(other, name))
        self.formats.update(other.formats)
        for mine, theirs in zip(self.label_counts, other.label_counts):
            mine.update(theirs)

    def to_json(self) -> dict[str, Any]:
        return {
            "payload_bytes": self.payload_bytes.to_json(),
            "height": self.height.to_json(),
            "width": self.width.to_json(),
            "formats": dict(sorted(self.formats.items())),
            # JSON keys are strings; per column, label value -> count
            "label_counts": [{str(k): v for k, v in sorted(c.items())} for c in self.label_counts],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecordStats:
        stats = cls(len(data["label_counts"]))
        for name in ("payload_bytes", "height", "width"):
            setattr(stats, name, Distribution.from_json(data[name]))
        stats.formats = Counter({str(k): int(v) for k, v in data["formats"].items()})
        stats.label_counts = [
            Counter({int(k): int(v) for k, v in column.items()}) for column in data["label_counts"]
        ]
        return stats
