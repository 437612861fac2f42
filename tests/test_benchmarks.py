"""The benchmark scripts still run, and their pages say machine, command and date once."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name != "reporting.py")
sys.path.insert(0, str(BENCHMARKS))
import reporting  # noqa: E402


def _run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_starts(script: str) -> None:
    done = _run(BENCHMARKS / script, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:")


def test_the_scripts_that_moved_are_gone_from_scripts() -> None:
    moved = [p.name for p in (ROOT / "scripts").glob("*.py") if p.name.startswith("bench_")]
    assert moved == [] and not (ROOT / "scripts" / "ab_pack.py").exists()


def test_a_results_page_states_machine_command_and_date_once() -> None:
    text = reporting.header("Title", reporting.command("benchmarks/bench_x.py", ["--quick"]))
    assert text.startswith("# Title\n")
    assert re.search(r"^Machine: \d+ cores, .*\. Date: \d{4}-\d\d-\d\d\.$", text, re.M)
    assert "Command: `python benchmarks/bench_x.py --quick`" in text
    assert not re.search(r"\d\d:\d\d", text)  # a date, never a run's time
    assert reporting.table(["a", "b"], [[1, "x"]]) == "| a | b |\n| --- | --- |\n| 1 | x |\n\n"


def test_store_size_writes_its_page(tmp_path: Path) -> None:
    out = tmp_path / "store-size.md"
    done = _run(BENCHMARKS / "bench_store_size.py", "--mb", 0.05, "--out", out)
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    rows = [line for line in page.splitlines() if re.match(r"\| \d+x\d+ ", line)]
    assert len(rows) == 5
    for row in rows:  # a store is never smaller than the files it holds
        lmdb_ratio, hdf5_ratio = (float(cell) for cell in row.strip("| ").split(" | ")[3:])
        assert lmdb_ratio > 1 and hdf5_ratio > 1
    chart = out.with_suffix(".svg")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not chart.exists()  # the page is written all the same
    else:
        assert chart.read_text().startswith("<?xml") and f"]({chart.name})" in page
