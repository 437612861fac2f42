"""Checking raw rows' CRC-32s: a call per row against one pass per block, zlib's CRC-32
against packer's (ISA-L's, from the isal package, where installed).

    python benchmarks/bench_row_checks.py      # writes docs/benchmarks/components/row-checks.md
    python benchmarks/bench_row_checks.py --rows 200 --budget 0.05 --out /tmp/rows.md   # smoke test

Each way runs alone, then beside a busy Python thread (as a reader's producer runs beside
the training loop and its decode threads): a call per row gives up the GIL once per row
and must win it back each time, one pass over the block gives it up once.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import reporting

from packer.store import record
from packer.store.row_checks import each_row_intact, joined_crc, rows_intact


@contextmanager
def busy_python_thread() -> Iterator[None]:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def rows_per_s(check: Callable[[], np.ndarray], rows: int, budget_s: float = 1.0) -> float:
    """Best rate of repeated checks within about ``budget_s`` (at least 3 runs)."""
    best, spent, runs = float("inf"), 0.0, 0
    while runs < 3 or spent < budget_s:
        started = time.perf_counter()
        assert check().all()
        took = time.perf_counter() - started
        best, spent, runs = min(best, took), spent + took, runs + 1
    return rows / best


def page(command: str, args: argparse.Namespace, report: dict[str, dict[str, float]]) -> str:
    """The results page: the table, and what one pass gains beside a busy thread."""
    text = reporting.header("Checking raw rows", command)
    text += (
        f"{args.rows:,} rows of {args.shape} pixels, checked against their stored CRC-32s; rows "
        "a second, the best of repeated checks over about "
        f"{args.budget:g} s. Each way runs alone, then "
        "beside a busy Python thread, as a reader's producer runs beside the training loop and "
        "its decode threads: a call per row gives up the GIL once per row and must win it back "
        "each time, one pass over the block gives it up once. "
        f"{reporting.load()}\n\n"
    )
    rows = [
        [name, f"{r['alone_rows_per_s']:,.0f}", f"{r['beside_busy_thread_rows_per_s']:,.0f}"]
        for name, r in report.items()
    ]
    text += reporting.table(["", "alone", "beside a busy Python thread"], rows)
    per_row, one_pass = (
        report[name]["beside_busy_thread_rows_per_s"]
        for name in report
        if name.startswith("packer")
    )
    return text + (
        f"Beside a busy thread, packer's one pass checks {one_pass / per_row:,.1f}× as many rows "
        "a second as its call per row.\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--shape", default="64x64x3", help="one row's HxWxC")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of checks per way")
    parser.add_argument("--json", action="store_true", help="print JSON; write no page")
    reporting.out_option(parser, "components/row-checks.md")
    args = parser.parse_args(argv)
    shape = tuple(int(x) for x in args.shape.split("x"))
    rows = np.random.default_rng(0).integers(0, 256, (args.rows, *shape), dtype=np.uint8)
    crc32 = np.array([zlib.crc32(row.tobytes()) for row in rows], np.uint32)
    row_bytes = rows[0].nbytes
    mine = "ISA-L" if record._crc32 is not zlib.crc32 else "zlib: isal is not installed"
    ways = {
        "zlib, a call per row": lambda: np.fromiter(map(zlib.crc32, rows), np.uint32) == crc32,
        "zlib, one pass": lambda: np.full(
            len(rows), zlib.crc32(rows.data) == joined_crc(crc32, row_bytes)
        ),
        f"packer ({mine}), a call per row": lambda: each_row_intact(rows, crc32),
        f"packer ({mine}), one pass": lambda: rows_intact(rows, crc32),
    }
    report: dict[str, dict[str, float]] = {name: {} for name in ways}
    for name, check in ways.items():
        report[name]["alone_rows_per_s"] = rows_per_s(check, args.rows, args.budget)
    with busy_python_thread():
        for name, check in ways.items():
            report[name]["beside_busy_thread_rows_per_s"] = rows_per_s(
                check, args.rows, args.budget
            )
    if args.json:
        print(json.dumps({"rows": args.rows, "shape": list(shape), "results": report}))
        return
    text = page(reporting.command(__file__, argv), args, report)
    reporting.write(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
