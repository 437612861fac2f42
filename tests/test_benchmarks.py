"""The benchmark scripts still run, and their pages say machine, command and date once."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

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


# Each page-writing script at a size that takes seconds: its page is written where --out says,
# with the header, its own command and a table of figures.
SMOKE = {
    "bench_blocks.py": ["--quick", "--raw-images", 300, "--repeat", 1],
    "bench_row_checks.py": ["--rows", 200, "--budget", 0.02],
    "bench_decode_pool.py": ["--images", 40, "--side", 64, "--repeat", 1],
    "bench_array_export.py": ["--side", 64, "--repeat", 5],
    "bench_resize.py": ["--folder-images", 40, "--images", 5, "--repeat", 1],
    "bench_hdf5_layout.py": ["--total-mb", 2, "--repeat", 1],
    "bench_lmdb_write.py": ["--count", 20, "--repeat", 1],
    "bench_dask.py": ["--images", 30, "--shards", 2, "--workers", 1],
    "bench_gather_paths.py": ["--images", 200, "--epochs", 1, "--repeat", 1],
    "bench_loader_cpu.py": ["--images", 60, "--repeat", 1, "--workers", 1],
}
NEEDS_TORCH = {"bench_loader_cpu.py"}
# Where a script keeps generated images between runs: a temporary folder here.
WORKDIR = {"bench_blocks.py", "bench_resize.py", "bench_gather_paths.py", "bench_loader_cpu.py"}


def _figures(page: str) -> list[list[str]]:
    """The cells of every table row of ``page`` below a header row."""
    rows = [line.strip("| ").split(" | ") for line in page.splitlines() if line.startswith("| ")]
    return [row for row in rows if not set(row) <= {"---"} and row != rows[0]]


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_a_component_script_writes_its_page(script: str, tmp_path: Path) -> None:
    if script in NEEDS_TORCH:
        pytest.importorskip("torch", reason=f"{script} measures a DataLoader")
    out = tmp_path / "page.md"
    args = [*SMOKE[script], "--out", out]
    if script in WORKDIR:
        args += ["--workdir", tmp_path / "work"]
    done = _run(BENCHMARKS / script, *args)
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert page.startswith("# ") and page.count("Machine: ") == 1
    assert f"Command: `{reporting.command(script, map(str, args))}`" in page
    figures = [cell for row in _figures(page) for cell in row if re.fullmatch(r"[\d,.]+", cell)]
    assert figures and all(float(cell.replace(",", "")) >= 0 for cell in figures)
    assert done.stdout.startswith(page)  # and it is printed


def test_a_component_script_json_writes_no_page(tmp_path: Path) -> None:
    out = tmp_path / "page.md"
    done = _run(BENCHMARKS / "bench_array_export.py", "--side", 32, "--json", "--out", out)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["side"] == 32 and not out.exists()


def test_every_page_writing_script_defaults_to_a_page_on_the_site() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for script in SMOKE:
        done = _run(BENCHMARKS / script, "--help")
        page = re.search(r"docs/benchmarks/(\S+\.md)", done.stdout.replace("\n", " "))
        assert page, f"{script}: --out does not default to a page under docs/benchmarks/"
        assert (reporting.DOCS / page[1]).is_file() and f"benchmarks/{page[1]}" in nav


def test_small_records_ratios_are_at_least_one(tmp_path: Path) -> None:
    out = tmp_path / "small.md"
    args = ["--quick", "--raw-images", 300, "--repeat", 1, "--workdir", tmp_path, "--out", out]
    done = _run(BENCHMARKS / "bench_blocks.py", *args)
    assert done.returncode == 0, done.stderr
    rows = _figures(out.read_text())
    sizes = [row for row in rows if re.fullmatch(r"[\d,.]+ (B|KB|MB)", row[0])]
    assert len(sizes) == 4  # --quick's four record sizes
    for row in sizes:  # a store is never smaller than the files it holds
        assert float(row[3]) >= 1 and float(row[4]) >= 1


@pytest.mark.slow
@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="ab_pack checks revisions out by git")
def test_ab_pack_writes_its_result_where_asked(tmp_path: Path) -> None:
    source = tmp_path / "images" / "a"
    source.mkdir(parents=True)
    for i in range(8):
        Image.new("RGB", (32, 24), (i * 30, 0, 0)).save(source / f"{i}.png")
    out = tmp_path / "ab.md"
    args = ["HEAD", "--source", tmp_path / "images", "--rounds", 2, "--packs", 1, "--out", out]
    done = _run(BENCHMARKS / "ab_pack.py", *args)
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert [row[0] for row in _figures(page)] == ["1", "2"]
    assert re.search(r"new/base \d+\.\d{3}\.$", page, re.M)


def test_the_storage_page_sets_decoded_epochs_against_the_lower_limit() -> None:
    """bench_storage needs root and a loop device, so its page is rendered here from a report:
    each decoded epoch is set against min(limit, that epoch's cold decode limit), with the
    seconds it waited for its first batch, and a case that failed says so."""
    import bench_storage

    def epochs(*seconds: float) -> dict[str, object]:
        return {"images": 100, "epoch_seconds": list(seconds), "first_batch_seconds": [0.4, 0.05]}

    def backend(decoded: dict[str, object]) -> dict[str, object]:
        limit = {"seconds": 0.5, "mb_per_s": 120.0}  # 200 images/s
        return {"limit": limit, "raw": epochs(0.5, 0.625), "decoded": decoded}

    report = {
        "photos": 100,
        "store_bytes": 10**9,
        "memory": "476M",
        "decode_limit": 300.0,  # warm: shown, not a limit
        # cold, by epoch: 125 images/s (the lower limit), then 200 (the device's, too)
        "cold_decode": {"lmdb": epochs(0.8, 0.5), "hdf5": epochs(0.8, 0.5)},
        "profiles": {
            "hdd": {
                "lmdb": backend(epochs(2.0, 1.0)),
                "hdf5": backend({"failed": "out of memory"}),
                "loop": {"images": 10, "seconds": 1.0},
                "dataloader": {"images": 20, "seconds": 1.0},
            }
        },
    }
    page = bench_storage.render(report, "python benchmarks/bench_storage.py")
    row = "| hdd | LMDB | 120 MB/s, 200 images/s | 1.00, 0.80 | 50, 100 | 0.40, 0.50 | 0.4, 0.1 |"
    assert row in page
    assert "| hdd | HDF5 | 120 MB/s, 200 images/s | 1.00, 0.80 | failed | failed | failed |" in page
    assert "| hdd | 10 images/s | 20 images/s | 67 images/s | 3.3x |" in page
    assert "fits in memory" not in page  # no cold-fit cases in this report: no table
    assert "LMDB 125, 200; HDF5 125, 200. Warm and unthrottled, from the page cache: 300" in page
    # The cores (125 images/s) were the lower limit of the first epoch, not the device (200).
    assert "the cores, not the device, were the lower limit" in page
    report["cold_decode"]["lmdb"] = {"failed": "exit 1"}  # type: ignore[index]
    failed = bench_storage.render(report, "python benchmarks/bench_storage.py")
    assert (
        "| hdd | LMDB | 120 MB/s, 200 images/s | 1.00, 0.80 | failed | failed | failed |" in failed
    )
    report["cold_decode"]["lmdb"] = epochs(0.8, 0.5)  # type: ignore[index]

    # A store that fits in memory, read cold: its first epoch against the lower limit, and
    # against the same epoch with read_ahead=0.
    report["profiles"]["hdd"]["lmdb"]["cold fit"] = {  # type: ignore[index]
        "decoded": epochs(1.0, 0.5),
        "decoded-no-read-ahead": epochs(1.5, 0.5),
    }
    report["profiles"]["hdd"]["hdf5"]["cold fit"] = {  # type: ignore[index]
        "decoded": {"failed": "exit 1"},
        "decoded-no-read-ahead": epochs(1.5, 0.5),
    }
    page = bench_storage.render(report, "python benchmarks/bench_storage.py")
    assert "| LMDB | 1.0, 0.5 | 0.80 | 1.5, 0.5 | 1.50x |" in page

    # With the device the lower limit (cores at 250 images/s cold), the first epoch's 2.0 s
    # is 1.5 s beyond the device's 0.5 s; one window is 8 chunks of 2 records of 10 MB (a
    # chunk: 1/64 of the store), 1.3 s at 120 MB/s.
    report["cold_decode"]["lmdb"] = epochs(0.4, 0.4)  # type: ignore[index]
    page = bench_storage.render(report, "python benchmarks/bench_storage.py")
    assert "seconds beyond it: hdd LMDB 1.5 s (a window: 1.3 s)." in page
    assert "one window (8 chunks, 160 MB)" in page
    assert "| HDF5 | failed | | | |" in page


def test_photos_numbered_from_first_are_not_the_first_photos(tmp_path: Path) -> None:
    """bench_mix_storage's store B is made of photos numbered after A's: other files, other
    bytes, so the mixture reads two stores rather than one twice."""
    import bench_storage

    bench_storage.make_folder(tmp_path / "a", 2)
    bench_storage.make_folder(tmp_path / "b", 2, first=2)
    a = sorted((tmp_path / "a").rglob("*.jpg"))
    b = sorted((tmp_path / "b").rglob("*.jpg"))
    assert [p.name for p in a] == ["0000000.jpg", "0000001.jpg"]
    assert [p.name for p in b] == ["0000002.jpg", "0000003.jpg"]
    assert not {p.read_bytes() for p in a} & {p.read_bytes() for p in b}


def test_the_mixture_storage_page_sets_each_mixed_epoch_against_one_store() -> None:
    """bench_mix_storage needs root and a loop device too: its page is rendered from a
    report. Each mixed epoch is set against the same epoch of one store of its backend; a case
    that failed says so, and the verdict counts every backend of the profiles that ran."""
    import bench_mix_storage

    def epochs(*rates: float) -> dict[str, object]:
        return {"epochs": [{"seconds": 1.0, "mb_per_s": rate} for rate in rates]}

    report: dict[str, Any] = {
        "photos": 100,
        "store_bytes": 10**9,
        "memory": "476M",
        "profiles": {
            "hdd": {
                "lmdb": {
                    "limit": {"mb_per_s": 120.0},
                    "alone": epochs(100.0, 120.0),
                    "mixed": epochs(99.0, 108.0),
                },
                "hdf5": {
                    "limit": {"mb_per_s": 119.0},
                    "alone": epochs(100.0, 110.0),
                    "mixed": epochs(100.0, 99.0),
                },
            },
            "nas": {
                "lmdb": {
                    "limit": {"mb_per_s": 110.0},
                    "alone": epochs(100.0),
                    "mixed": {"failed": "exit 1"},
                },
            },
        },
    }
    page = bench_mix_storage.render(report, "python benchmarks/bench_mix_storage.py")
    assert "| hdd | LMDB | 120 | 100, 120 | 99, 108 | 0.99, 0.90 |" in page
    assert "| hdd | HDF5 | 119 | 100, 110 | 100, 99 | 1.00, 0.90 |" in page
    assert "| nas | LMDB | 110 | 100 | exit 1 | - |" in page
    assert "Not met (worst 0.90)." in page
    hdd = report["profiles"]["hdd"]
    hdd["lmdb"]["mixed"] = epochs(96.0, 118.0)
    page = bench_mix_storage.render(report, "python benchmarks/bench_mix_storage.py")
    assert "Not met (worst 0.90)." in page  # HDF5's second epoch still misses
    hdd["hdf5"]["mixed"] = epochs(100.0, 107.0)
    page = bench_mix_storage.render(report, "python benchmarks/bench_mix_storage.py")
    assert "Met (worst 0.96)." in page


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
def test_bench_mix_cpu_seconds_count_a_child_process() -> None:
    """bench_mix's images per CPU second count the reader's decode processes: a child that
    spins while this process sleeps shows in cpu_seconds (time.process_time would not)."""
    import time

    import bench_mix

    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # started
        before, mine = bench_mix.cpu_seconds(), time.process_time()
        time.sleep(1.0)
        spent, own = bench_mix.cpu_seconds() - before, time.process_time() - mine
    finally:
        child.kill()
        child.wait()
    assert own < 0.1 and spent >= 0.2, (own, spent)


def test_bench_mix_judges_the_goal_on_the_medians_of_pairs() -> None:
    """A lucky best turn does not meet bench_mix's goal, and an unlucky one does not miss it:
    the verdict is the worse of the two medians of pairs (images/s and per CPU second)."""
    import bench_mix

    def case(name: str, best: float, wall: float, cpu: float) -> dict[str, object]:
        return {
            "case": name,
            "wall": {"ratio_of_best": best, "median_of_pair_ratios": wall},
            "cpu": {"ratio_of_best": best, "median_of_pair_ratios": cpu},
        }

    met, missed = bench_mix.verdict(
        [case("lucky", 1.13, 0.88, 0.97), case("unlucky", 0.80, 0.99, 0.96)]
    )
    assert met == ["unlucky"]
    assert missed == ["lucky (worst 0.88)"]
