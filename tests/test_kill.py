"""Fault injection: a real ``packer pack`` killed with SIGKILL at random moments, then run
again until it finishes (scripts/kill_pack.py; run it with more kills for the figures in
docs/reliability.md). The store must come out whole, identical, with nothing lost."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from packer import open_store
from packer.store.staging import partial_path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kill_pack.py"


def _kill_pack(workdir: Path, *args: str) -> dict[str, Any]:
    """scripts/kill_pack.py's report of a run in ``workdir``; it must pass its own checks."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--images", "200", "--workdir", str(workdir)]
        + ["--json"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_sigkill_at_random_moments_loses_nothing(tmp_path: Path, backend: str) -> None:
    report = _kill_pack(tmp_path, "--kills", "6", "--backend", backend, "--seed", "3")
    assert report["ok"] and report["identical_to_uninterrupted"] and report["verifies"]
    assert report["missing"] == report["duplicated"] == report["unexpected"] == 0
    assert sum(report["kills_landed"].values()) == 6

    # Independently of the script: every source file Pillow opens is in the store once.
    store = Path(report["store"])
    assert not partial_path(store).exists()
    valid: Counter[str] = Counter()
    for path in (tmp_path / "images").rglob("*"):
        if path.is_file():
            try:
                with Image.open(path) as im:
                    im.load()
            except OSError:
                continue
            valid[hashlib.sha256(path.read_bytes()).hexdigest()] += 1
    with open_store(store) as opened:
        packed = Counter(hashlib.sha256(r.data).hexdigest() for r in opened.records())
        skipped = {s["path"] for s in opened.manifest.skipped}
    assert packed == valid and len(valid) == 200
    assert skipped == {"class_0/truncated.jpeg", "class_1/notes.txt"}


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_ctrl_c_and_sigterm_at_random_moments_end_the_pack_cleanly(
    tmp_path: Path, sig: str
) -> None:
    """Each interrupted pack ends by itself with status 130 and a one-line message (it could
    hang on a lock the interrupt left held), and the resumed store is whole."""
    report = _kill_pack(tmp_path, "--kills", "4", "--signal", sig, "--seed", "5")
    assert report["signal"] == f"SIG{sig}" and report["hangs"] == 0 and report["bad_ends"] == {}
    assert report["identical_to_uninterrupted"] and report["verifies"]
    assert report["missing"] == report["duplicated"] == report["unexpected"] == 0
