"""scripts/demo_compare.py, the end of `make demo`: the same epoch from the folder and from the
store, every image once each way, with the share of time spent waiting for data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from packer import PackOptions, pack

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


def _run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, timeout=120, check=True
    )


def test_demo_reads_the_same_epoch_from_the_folder_and_the_store(tmp_path: Path) -> None:
    folder = tmp_path / "images"
    _run(SCRIPTS / "make_demo_data.py", folder, "--per-class", 5, "--quiet")
    store = pack(folder, tmp_path / "demo.lmdb", PackOptions(seed=0, workers=1)).store
    script = SCRIPTS / "demo_compare.py"
    rows = json.loads(
        _run(script, folder, store, "--step-ms", 2, "--batch-size", 8, "--json").stdout
    )
    assert list(rows) == [f"{folder}/ (one file at a time)", f"{store} (packer)"]
    for row in rows.values():
        assert row["images"] == 30  # six classes of five
        assert 0 < row["wait_share"] < 1 and row["seconds"] > 0

    table = _run(script, folder, store, "--step-ms", 2, "--batch-size", 8).stdout
    assert "a training step of 2 ms after each batch" in table
    assert sum("of the time" in line for line in table.splitlines()) == 2
