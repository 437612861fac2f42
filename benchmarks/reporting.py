"""What every benchmark's output shares: one header (machine, command, date), Markdown tables,
the page written into docs/benchmarks/, and a bar chart where a person would rather look.

    import reporting                    # the scripts run as python benchmarks/NAME.py
    text = reporting.header("Packing", reporting.command(__file__, argv))
    text += reporting.table(["store", "MB"], [["lmdb", "12.0"]])
    reporting.write(reporting.DOCS / "packing.md", text)

matplotlib draws the charts where it is installed (the ``bench`` extra); without it the page is
written all the same and the chart is left as it was.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks"


def machine() -> str:
    """The machine in one line: cores, architecture, kernel, Python."""
    return (
        f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def command(script: str, argv: Sequence[str] | None = None) -> str:
    """The command that reproduces a run, from the repository's root."""
    args = sys.argv[1:] if argv is None else list(argv)
    return shlex.join(["python", f"benchmarks/{Path(script).name}", *args])


def today() -> str:
    """Today's date in UTC, as a page's header states it."""
    return time.strftime("%Y-%m-%d", time.gmtime())


def load() -> str:
    """The machine's load as a page states it: timings on a shared machine depend on it."""
    return (
        f"Load average at the end of the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores."
    )


def children_cpu() -> float:
    """CPU seconds of this process's live children so far (decode or DataLoader workers, in
    the kernel's ticks: they run for seconds), from Linux's /proc; elsewhere 0."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return 0.0
    me, ticks, total = os.getpid(), os.sysconf("SC_CLK_TCK"), 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[1]) == me:  # fields[1]: the parent's pid
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def header(title: str, run: str, *, on: str | None = None, date: str | None = None) -> str:
    """A results page's top: the title, then machine, command and date, once. A date, not a
    time: the page states current results, and git keeps their history. ``on`` and ``date``
    default to this machine and today; a page rendered from a saved report gives its run's."""
    return (
        f"# {title}\n\nMachine: {on or machine()}. Date: {date or today()}.\n\nCommand: `{run}`\n\n"
    )


def table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table; each cell as given (format numbers before)."""
    lines = [columns, ["---"] * len(columns), *rows]
    return "".join("| " + " | ".join(map(str, line)) + " |\n" for line in lines) + "\n"


def out_option(parser: argparse.ArgumentParser, page: str) -> None:
    """``--out``: where the script writes its results page, by default ``page`` under
    docs/benchmarks/ (a smoke run names another file, so the docs keep the real run)."""
    parser.add_argument(
        "--out", type=Path, default=DOCS / page, help=f"results page (docs/benchmarks/{page})"
    )


def goals(targets: Sequence[dict[str, Any]]) -> str:
    """The goals table: each target's ratio, its bound (``lower``: at most, the default; else
    at least) and its verdict; a target of None is shown, not judged."""
    rows = []
    for t in targets:
        bound = t.get("target")
        rows.append(
            [
                t["name"],
                f"{t['ratio']:.3f}",
                "" if bound is None else f"{'<=' if t.get('lower', True) else '>='} {bound}",
                "shown" if t["pass"] is None else "met" if t["pass"] else "NOT MET",
            ]
        )
    return table(["goal", "ratio", "target", "verdict"], rows)


def write(path: Path, text: str) -> Path:
    """Write a results page (or any file) under docs/, making its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def bar_chart(
    path: Path,
    title: str,
    unit: str,
    groups: Sequence[str],
    series: dict[str, Sequence[float]],
    log: bool = False,
) -> bool:
    """Grouped bars, one colour per series, written as SVG or PNG by ``path``'s suffix; False
    (nothing written) where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{path.name}: not drawn (pip install matplotlib)", file=sys.stderr)
        return False
    plt.rcParams["svg.hashsalt"] = "packer"  # the same figures give the same file
    figure, axes = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        at = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        axes.bar(at, values, width, label=name)
    axes.set_xticks(range(len(groups)), groups)
    axes.set_ylabel(unit)
    axes.set_title(title)
    if log:
        axes.set_yscale("log")
    axes.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(series))
    axes.spines[["top", "right"]].set_visible(False)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None)
    plt.close(figure)
    return True
