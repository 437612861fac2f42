"""bench_small_images renders its results page from a saved report, through reporting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_small_images.py"

REPORT = {
    "run": {
        "machine": "4 cores, x86_64, Linux, Python 3.11.7",
        "command": "python benchmarks/bench_small_images.py --files 1000 --files 1000000",
        "load": [0.5, 3.3],
        "date": "2026-01-02",
        "cores": 4,
        "repeat": 2,
    },
    "reading": [
        {
            "corpus": "200 32x32 PNG",
            "mean_kb": 2.4,
            "dataloader": 1000,
            "packer": 2500,
            "chosen": "processes",
            "threads": 2000,
            "processes": 2200,
            "ratio": 2.5,
        },
        {
            "corpus": "50 400x350 JPEG",
            "dataloader": 100,
            "packer": 120,
            "chosen": "threads",
            "threads": 120,
            "processes": 60,
            "ratio": 1.2,
        },
    ],
    "simulated": {
        "entries": 10_000_000,
        "peak_mb": 700,
        "bytes_per_entry": 73,
        "list_s": 20.0,
        "label_digest_shuffle_plan_s": 70.0,
    },
    "packing": [
        {
            "files": 1_000_000,
            "pack_s": 400.0,
            "pack_peak_anon_mb": 350,
            "pack_peak_rss_mb": 2100,
            "inspect_s": 1.5,
            "open_s": 0.9,
        },
        {"files": 1000, "pack_peak_anon_mb": 60},
    ],
}


def _render(tmp_path: Path, saved: str) -> str:
    report = tmp_path / "report.json"
    report.write_text(saved, encoding="utf-8")
    out = tmp_path / "page.md"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--from-json", str(report), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return out.read_text(encoding="utf-8")


def test_the_page_states_the_runs_machine_command_and_date_once(tmp_path: Path) -> None:
    page = _render(tmp_path, json.dumps(REPORT))
    lines = page.splitlines()
    assert lines[0] == "# Small images and millions of files"
    assert page.count("Machine: ") == 1 and page.count("Command: ") == 1
    on = "4 cores, x86_64, Linux, Python 3.11.7; load average 0.5–3.3 during the run"
    assert f"Machine: {on}. Date: 2026-01-02." in lines
    assert f"Command: `{REPORT['run']['command']}`" in lines
    prose = " ".join(page.split())  # paragraphs are wrapped; their words are what matter
    assert "`num_workers` = cores (4)" in prose and "Best epoch of 2 after" in prose


def test_the_tables_hold_the_reports_figures_and_goals(tmp_path: Path) -> None:
    page = _render(tmp_path, json.dumps(REPORT))
    lines = page.splitlines()
    assert (
        "| 200 32×32 PNG (2.4 KB) | 1,000 | 2,500 | **2.50** | processes | 2,000 | 2,200 |" in lines
    )
    assert "| 50 400×350 JPEG | 100 | 120 | **1.20** | threads | 120 | 60 |" in lines
    assert "Goal: defaults ≥ 1.5× the DataLoader on every corpus: NOT met on 400x350." in lines
    packs = [line for line in lines if line.startswith("| pack ")]
    assert packs == [  # smallest first, whatever the report's order
        "| pack 1,000 32×32 PNGs, `--check header`, 100 class folders: peak anonymous memory "
        "| **60 MB** |",
        "| pack 1,000,000 such PNGs: peak anonymous memory | **350 MB** |",
        "| pack 1,000,000: wall time | 400 s |",
    ]
    assert "| `packer inspect --json` of the 1,000,000-record store | 1.5 s |" in lines
    assert any(
        line.startswith("| 10,000,000 entries listed") and "**700 MB**" in line for line in lines
    )
    prose = " ".join(page.split())
    assert "10M entries scanned and planned in ≤ 2 GB: met (10,000,000 entries, 700 MB)." in prose
    assert "Pack of 1M small files with a peak ≤ 300 MB: NOT met" in prose
    assert "its RSS, with the shard's mapped pages, is 2.1 GB." in prose


def test_a_runs_saved_output_renders_from_its_last_line(tmp_path: Path) -> None:
    reading_only = {"run": REPORT["run"], "reading": REPORT["reading"][:1], "packing": []}
    saved = "# Small images and millions of files\n\n" + json.dumps(reading_only) + "\n"
    page = _render(tmp_path, saved)
    assert "Goal: defaults ≥ 1.5× the DataLoader on every corpus: met on all 1." in page
    assert "## Packing" not in page


def test_goals_below_their_size_are_not_called_met(tmp_path: Path) -> None:
    row = {**REPORT["packing"][0], "files": 1000, "pack_peak_anon_mb": 60}
    small = {"run": REPORT["run"], "packing": [row]}
    prose = " ".join(_render(tmp_path, json.dumps(small)).split())
    assert "peak ≤ 300 MB: not measured at that size for the memory" in prose
    assert "(1,000 files, 60 MB)" in prose
