"""What the CLI draws: a progress line on a terminal (nothing when piped), sizes, bars."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressLine", "human_bytes", "bar"]


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def bar(fraction: float, width: int) -> str:
    """A bar of ``width`` cells, in eighths, for histograms and progress."""
    cells = max(0.0, min(1.0, fraction)) * width
    full = int(cells)
    eighths = int((cells - full) * 8)
    partial = " ▏▎▍▌▋▊▉"[eighths].strip() if full < width else ""
    return ("█" * full + partial).ljust(width)


class ProgressLine:
    """One self-rewriting line on stderr, at most 10 times a second. Silent unless the
    stream is a terminal, so logs and pipes stay clean."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled and self.stream.isatty()
        self._last = 0.0
        self._started: dict[str, float] = {}

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        start = self._started.setdefault(stage, now)
        if now - self._last < 0.1 and done != total:
            return
        self._last = now
        rate = done / (now - start) if now > start else 0.0
        if total:
            eta = (total - done) / rate if rate else 0.0
            line = (
                f"{stage:8} {bar(done / total, 30)} {done}/{total} {rate:,.0f}/s  eta {eta:,.0f}s"
            )
        else:
            line = f"{stage:8} {done:,} files"
        self.stream.write("\r" + line[:120].ljust(80))
        self.stream.flush()

    def finish(self) -> None:
        if self.enabled and self._started:
            self.stream.write("\r" + " " * 80 + "\r")
            self.stream.flush()
