"""bench_augment renders its results page from a saved JSON report, without rerunning."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_augment.py"


def _report() -> dict[str, object]:
    """A small run's report: two repeats, FFCV on the small corpus only."""
    small = [
        {"packer augment": 300.0, "packer size": 280.0, "packer tv": 150.0, "dataloader tv": 100.0,
         "ffcv": 200.0},
        {"packer augment": 360.0, "packer size": 330.0, "packer tv": 170.0, "dataloader tv": 120.0,
         "ffcv": 240.0},
    ]  # fmt: skip
    large = [
        {"packer augment": 20.0, "packer size": 25.0, "packer tv": 12.0, "dataloader tv": 5.0},
        {"packer augment": 24.0, "packer size": 26.0, "packer tv": 14.0, "dataloader tv": 8.0},
    ]
    cpu = {"packer augment": 0.8, "packer size": 0.7, "packer tv": 1.1, "dataloader tv": 1.6,
           "entropy floor": 0.4}  # fmt: skip

    def corpus(repeats: list[dict[str, float]], images: int, mb: int) -> dict[str, object]:
        rates = {k: max(r[k] for r in repeats) for k in repeats[0]}
        return {"images": images, "MB": mb, "rates": rates, "repeats": repeats,
                "x_dataloader": {"packer augment": 3.0, "dataloader tv": 1.0},
                "skipped": {}, "cpu_ms_per_image": cpu}  # fmt: skip

    results = {"small": corpus(small, 300, 12), "large": corpus(large, 20, 41)}
    results["large"]["skipped"] = {"ffcv": "failed: out of memory"}  # type: ignore[index]
    goal = {"corpus": "large", "run": "packer augment", "against": "dataloader tv",
            "target": 4.0, "ratio": 3.5, "met": False}  # fmt: skip
    return {"machine": "2 cores, x86_64, Linux test", "date": "2026-01-02", "load": 3.0,
            "cores": 2, "command": "python benchmarks/bench_augment.py --repeat 2 --json",
            "versions": {"torch": "2.0", "torchvision": "0.1", "ffcv": "9.9"},
            "results": results, "goals": [goal]}  # fmt: skip


def test_the_page_renders_from_a_saved_report(tmp_path: Path) -> None:
    saved, out = tmp_path / "run.json", tmp_path / "augment.md"
    saved.write_text(json.dumps(_report()))
    done = subprocess.run(
        [sys.executable, SCRIPT, "--from-json", saved, "--out", out],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    lines = page.splitlines()
    assert lines[0] == "# Benchmark: augmented epochs"
    # the saved run's machine, date and command, once; not this machine's, not today's
    assert len(re.findall(r"^Machine: ", page, re.M)) == 1
    assert (
        "Machine: 2 cores, x86_64, Linux test, shared with other jobs (load average about 3" in page
    )
    assert "Date: 2026-01-02." in page and page.count("Command: ") == 1
    assert "Command: `python benchmarks/bench_augment.py --repeat 2 --json`" in page
    assert "torch 2.0, torchvision 0.1, ffcv 9.9" in page
    # best rate in bold, each repeat in brackets; the ratio the run reported, or blank
    rows = {line.split(" | ")[0]: line for line in lines if line.startswith("| packer, `augment")}
    assert list(rows.values()) == [
        "| packer, `augment=[RandomResizedCrop(224), RandomHorizontalFlip()]` "
        "| **360** (300, 360) | 3.00 | **24** (20, 24) | 3.00 |"
    ]
    assert "| FFCV 9.9, `RandomResizedCropRGBImageDecoder` + `RandomHorizontalFlip` " \
        "| **240** (200, 240) |  | skipped (below) |  |" in lines  # fmt: skip
    assert (
        "| large photos: packer augment >= 4.0x DataLoader + torchvision | 3.50 | **not met** |"
        in lines
    )
    assert "| packer `size=` | 0.70 | 0.70 |" in lines
    assert "FFCV on the large photos: failed: out of memory, so it is not compared there." in page
    assert "300 photos of 300–500 × 250–450 px (12 MB, 2 batches an epoch)" in page
    # the floor of any decode of whole JPEGs, and what it bounds against the DataLoader
    assert "| libjpeg-turbo at 1/8 scale (the floor) | 0.40 | 0.40 |" in lines
    assert "costs 0.40 ms per photo, 50% of packer augment's CPU" in page
    assert "at most 4.0× less CPU per image than the DataLoader" in page
    assert "Rates: best of 2" in page


def test_a_run_report_takes_each_goal_as_the_median_of_its_repeats(tmp_path: Path) -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    import bench_augment

    repeats = [  # ratios 2.0, 5.0, 3.0: the median is 3.0, where best / best would be 4.0
        {"packer augment": 200.0, "dataloader tv": 100.0},
        {"packer augment": 400.0, "dataloader tv": 80.0},
        {"packer augment": 300.0, "dataloader tv": 100.0},
    ]
    found = {"images": 20, "MB": 41, "rates": {"packer augment": 400.0, "dataloader tv": 100.0},
             "repeats": repeats, "x_dataloader": {"packer augment": 3.0, "dataloader tv": 1.0},
             "skipped": {"ffcv": "--no-ffcv"}}  # fmt: skip
    report = bench_augment.build_report({"large": found}, "python benchmarks/bench_augment.py")
    assert report["goals"] == [  # the goals against FFCV and packer size= are not computed
        {"goal": "large: packer augment >= 4.0x dataloader tv", "corpus": "large",
         "run": "packer augment", "against": "dataloader tv", "target": 4.0, "ratio": 3.0,
         "met": False}
    ]  # fmt: skip
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", report["date"])
    page = bench_augment.render(json.loads(json.dumps(report)))  # as saved and read back
    assert (
        "| large photos: packer augment >= 4.0x DataLoader + torchvision | 3.00 | **not met** |"
        in page
    )
    assert (
        "| FFCV, `RandomResizedCropRGBImageDecoder` + `RandomHorizontalFlip` | not run (`--no-ffcv`) |  |"
        in page
    )
    assert "FFCV on the" not in page  # left out by choice: no paragraph below says why
