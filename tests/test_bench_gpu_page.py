"""bench_gpu's reading of a profiler trace, and its page rendered from the saved GPU runs
(docs/benchmarks/gpu.json): both run here, without a GPU."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_gpu  # noqa: E402

MB = 1 << 20


def _event(cat: str, name: str, start: float, end: float, stream: int, **args: int) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "ts": start,
        "dur": end - start,
        "tid": stream,
        "args": {"stream": stream, **args},
    }


def test_a_trace_gives_the_copy_stream_and_how_much_of_each_copy_ran_beside_training() -> None:
    events = [
        _event("kernel", "conv", 1000, 1100, 7),
        _event("kernel", "bn", 1100, 1200, 7),
        _event("kernel", "relu", 1250, 1400, 7),
        _event("kernel", "tiny", 1300, 1310, 9),  # another stream, less busy: not training
        _event("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 1150, 1300, 20, bytes=2 * MB),
        _event("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 1000, 1010, 20, bytes=4),
        _event("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 1000, 1400, 21, bytes=8 * MB),
        {"ph": "i", "name": "marker", "ts": 0},  # not a span
    ]
    timeline = bench_gpu.gpu_timeline(events)
    assert timeline["copies"] == [{"stream": "20", "start": 150, "end": 300}]  # from the first
    summary = bench_gpu.summarize_timeline(timeline)
    assert summary["training_stream"] == "7" and summary["copy_streams"] == ["20"]
    assert summary["copies"] == 1 and summary["copy_ms_mean"] == 0.15
    # the copy [150, 300] beside training spans [0, 200] and [250, 400]: 100 of its 150 us
    assert summary["copy_overlapped_share"] == pytest.approx(0.667, abs=1e-3)
    # training busy 350 of the 400 us from its first kernel to its last
    assert summary["training_stream_busy_share"] == pytest.approx(0.875)
    picture = bench_gpu.compact(timeline)
    assert picture == {"training": [[0.0, 0.2], [0.25, 0.4]], "copies": [[0.15, 0.3]]}


def test_a_trace_without_gpu_work_says_so_rather_than_failing() -> None:
    summary = bench_gpu.summarize_timeline(bench_gpu.gpu_timeline([]))
    assert summary["copies"] == 0 and summary["copy_overlapped_share"] is None


def test_the_page_is_what_the_saved_runs_render_to() -> None:
    """The committed page and its saved runs agree: a page edited by hand, or a run saved
    without rendering, fails here."""
    reports = json.loads(bench_gpu.REPORT.read_text())
    page = bench_gpu.page(reports, drawn=True)
    assert bench_gpu.PAGE.read_text() == page
    assert len(re.findall(r"^Machine: ", page, re.M)) == 1
    assert len(re.findall(r"^Command: ", page, re.M)) == 1
    assert re.search(r"^Machine: NVIDIA H\d+ .*Date: \d{4}-\d\d-\d\d\.$", page, re.M)
    # every goal judged or shown, against the figures of the newest run
    now = reports[0]
    packer = now["resnet50/packer"]["epochs"][-1]["images_per_s"]
    goals = {g["name"]: g for g in bench_gpu.goals(now)}
    decode = goals["ResNet-50: packer training / the CPUs' decode limit"]
    assert decode["ratio"] == packer / bench_gpu.decode_limit(now)
    assert f"| {decode['ratio']:.3f} | >= 0.9 |" in page
    # the CPUs bound this machine, so wait_share at the GPU's rate is shown, not judged
    assert bench_gpu.decode_limit(now) < now["resnet50/limit"]
    assert (
        goals["ResNet-50: packer's wait_share, where the CPUs could feed the GPU"]["pass"] is None
    )
    assert (bench_gpu.PICTURE).is_file()


def test_a_run_with_every_case_renders_alone() -> None:
    """A new run saved on its own (every case this script now runs, the hybrid too) renders
    a page whose tables name each loader and whose findings say what both decoders gave."""
    newest, earlier = json.loads(bench_gpu.REPORT.read_text())
    run = {**earlier, **newest}  # the earlier run's ResNet-18 rows, the newest's ResNet-50
    run["resnet50/hybrid"] = run["resnet18/hybrid"] = run["resnet50/nvjpeg"]
    page = bench_gpu.page([run], drawn=False)
    assert "earlier default" not in page and "gpu-timeline.svg" not in page
    for label in bench_gpu.NAMES.values():
        assert f"| {label} |" in page
    hybrid = run["resnet50/hybrid"]["epochs"][-1]["images_per_s"]
    assert f"fed ResNet-50 at {hybrid:,} images/s" in page
