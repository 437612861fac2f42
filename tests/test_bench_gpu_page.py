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
    packer = now["resnet50/packer"]["epochs"][-1]
    goals = {g["name"]: g for g in bench_gpu.goals(now)}
    # the CPUs out-decode the GPU on this machine: packer's training is set against the
    # GPU's limit, and its wait_share is judged
    assert bench_gpu.decode_limit(now) >= now["resnet50/limit"]
    training = goals["ResNet-50: packer training / the GPU's limit"]
    assert training["ratio"] == packer["images_per_s"] / now["resnet50/limit"]
    assert f"| {training['ratio']:.3f} | >= 0.9 |" in page
    waited = goals["ResNet-50: packer's wait_share, where the CPUs could feed the GPU"]
    assert waited["ratio"] == packer["reader_wait_share"]
    assert waited["pass"] == (packer["reader_wait_share"] < 0.02)
    assert "more than the GPU trains on" in page
    assert (bench_gpu.PICTURE).is_file()


def test_where_the_cpus_bound_training_its_rate_is_set_against_their_decode_limit() -> None:
    """A machine whose cores decode less than the GPU trains on: packer's training against
    that decode limit, and wait_share shown, not judged (it cannot reach 2% there)."""
    [run] = json.loads(bench_gpu.REPORT.read_text())
    run["resnet50/limit"] = bench_gpu.decode_limit(run) + 1000
    goals = {g["name"]: g for g in bench_gpu.goals(run)}
    training = goals["ResNet-50: packer training / the CPUs' decode limit"]
    packer = run["resnet50/packer"]["epochs"][-1]["images_per_s"]
    assert training["ratio"] == packer / bench_gpu.decode_limit(run)
    assert (
        goals["ResNet-50: packer's wait_share, where the CPUs could feed the GPU"]["pass"] is None
    )
    assert "the CPUs bound training here" in bench_gpu.page([run], drawn=False)


def test_a_run_without_its_trace_or_example_renders_what_it_has() -> None:
    """A run cut short by its budget: the tables it measured, no trace section, no example."""
    [run] = json.loads(bench_gpu.REPORT.read_text())
    for key in ("trace", "train_example", "resnet18/limit", "resnet18/packer"):
        run.pop(key)
    page = bench_gpu.page([run], drawn=False)
    assert "## The copy beside the step" not in page and "## The example script" not in page
    assert "## ResNet-18" not in page
    for label in bench_gpu.NAMES.values():
        assert f"| {label} |" in page


def test_the_training_process_cpu_per_image_is_shown_where_a_run_kept_it() -> None:
    """A run that kept each epoch's CPU time shows the training process's share per image,
    loader alone; a run from before that figure was kept shows no such column."""
    [run] = json.loads(bench_gpu.REPORT.read_text())
    for key, case in run.items():
        if key.startswith("decode/"):
            for epoch in case["epochs"]:
                epoch.pop("cpu_s", None)
    assert "training process alone" not in bench_gpu.page([run], drawn=False)
    last = run["decode/packer"]["epochs"][-1]
    last["cpu_s"] = last["images"] * 42e-6  # 42 us an image
    page = bench_gpu.page([run], drawn=False)
    assert "| training process alone (CPU µs/image) |" in page
    rows = {line.split(" | ")[0][2:]: line for line in page.splitlines() if " | " in line}
    assert "| 42 |" in rows[bench_gpu.NAMES["packer"]]  # in each model's table
    assert rows[bench_gpu.NAMES["dataloader"]].count("| - |") == 1  # none kept for it


def test_the_trace_section_says_what_bounded_the_traced_steps() -> None:
    """A busy training stream ran at the GPU's rate; gaps in it are decoding where the CPUs
    bound training, and the loop where they out-decode the GPU (data was not late)."""
    [run] = json.loads(bench_gpu.REPORT.read_text())
    cpus = bench_gpu.decode_limit(run)
    for busy, limit, said in [
        (0.96, cpus - 1, "at its own rate"),
        (0.41, cpus + 1, "Decoding bounded these steps"),
        (0.41, cpus - 1, "the loop that queues its kernels was late"),
    ]:
        run["trace"]["training_stream_busy_share"] = busy
        run["resnet50/limit"] = limit
        assert said in bench_gpu.page([run], drawn=False)
