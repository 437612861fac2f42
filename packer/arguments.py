"""Arguments every flow takes: worker counts, seeds, sizes, progress callbacks. Checked here, so
that the CLI, ``pack`` and ``open_reader`` refuse the same values with the same words."""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from packer.errors import UsageError

__all__ = [
    "CountProgress",
    "parse_size",
    "parse_hw",
    "default_workers",
    "check_seed",
    "check_workers",
]

# A progress callback of the commands that go through a store's records: called as
# ``progress(done, total)``, records done so far of the store's total.
CountProgress = Callable[[int, int], None]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def default_workers() -> int:
    """All cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# Workers (processes or threads) past this many per core only cost memory: every knob of
# that kind is refused above it, where --workers 10000 forked processes until memory ran out.
WORKERS_PER_CORE = 4


def check_workers(workers: int, given: str | None = None) -> None:
    """Refuse more than WORKERS_PER_CORE workers a core this process may use; ``given``:
    how the user asked for them, for the message (default ``--workers N``)."""
    cores = default_workers()
    limit = WORKERS_PER_CORE * cores
    if workers > limit:
        raise UsageError(
            f"{given or f'--workers {workers}'}: more than {WORKERS_PER_CORE} workers per "
            f"core on this machine's {cores} cores; give at most {limit}"
        )


MAX_SEED = (1 << 63) - 1  # a manifest keeps its seed as a signed 64-bit integer


def check_seed(seed: int | None) -> None:
    """Refuse a seed NumPy's generators cannot take (negative) or a manifest cannot keep."""
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise UsageError(f"--seed must be a whole number from 0 to {MAX_SEED}, not {seed}")


def parse_size(text: str) -> int:
    """'1GB' -> 10**9, '512MiB' -> 512 * 2**20, '1000' -> 1000 bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS or float(match.group(1)) <= 0:
        raise UsageError(f"size {text!r} not understood; write e.g. 1GB, 512MB or 256MiB")
    return int(float(match.group(1)) * _UNITS[unit])


def parse_hw(text: str) -> tuple[int, int]:
    """'224x224' or '224' -> (height, width)."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+))?\s*", text)
    if not match:
        raise UsageError(f"size {text!r} not understood; write HEIGHTxWIDTH, e.g. 224x224")
    height = int(match.group(1))
    width = int(match.group(2) or height)
    if height < 1 or width < 1:
        raise UsageError(f"size {text!r} must be at least 1x1")
    return height, width
