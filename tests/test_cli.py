"""The `packer` command: through click's runner, and as a real process for signals and pipes."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import write_image

from packer.cli import cli
from packer.cli.terminal import ProgressLine
from packer.imaging import jpeg_turbo
from packer.store import record


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("command", ["pack", "inspect"])
def test_every_command_has_help_with_an_example(command: str) -> None:
    code, out, _ = run(command, "--help")
    assert code == 0 and "Example:" in out and f"packer {command}" in out


def test_pack_then_inspect_text_and_json(image_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.lmdb"
    code, text, _ = run("pack", str(image_dir), str(out), "--seed", "3", "--workers", "2")
    assert code == 0, text
    assert text.startswith(f"packed 21 images into {out} (lmdb, 1 shard,")
    code, text, _ = run("inspect", str(out))
    assert code == 0
    assert "records   21 in 1 shard(s)" in text and "seed 3" in text
    for name in ("cat", "dog", "eel"):
        assert f"    {name}         7  " in text
    assert re.search(r"^ +16 px\.\.31 px +\d+  █", text, re.M)  # the size histogram
    code, text, _ = run("inspect", str(out), "--json")
    data = json.loads(text)
    assert data["ok"] is True and data["manifest"]["num_records"] == 21
    assert data["manifest"]["label_columns"][0]["classes"] == ["cat", "dog", "eel"]


def test_pack_json_summary(image_dir: Path, tmp_path: Path) -> None:
    code, text, _ = run(
        "pack", str(image_dir), str(tmp_path / "o.h5"), "--json", "--shards", "2", "--workers", "2"
    )
    data = json.loads(text)
    assert code == 0 and data["backend"] == "hdf5" and data["packed"] == 21 and data["shards"] == 2
    assert data["skipped"] == 0 and data["images_per_s"] > 0


def test_skipped_files_are_listed_in_the_summary(image_dir: Path, tmp_path: Path) -> None:
    (image_dir / "cat" / "notes.txt").write_text("not an image")
    code, text, _ = run("pack", str(image_dir), str(tmp_path / "o.lmdb"), "--workers", "2")
    assert code == 0
    assert "skipped 1 files:" in text
    assert "  cat/notes.txt: not an image (Pillow cannot identify it)" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["out.zip"], "name it .lmdb or .h5, or pass --backend"),
        (["out.lmdb", "--size", "big"], "size 'big' not understood"),
        (["out.lmdb", "--size", "100000x100000"], "10,000,000,000 pixels, over the limit"),
        (["out.lmdb", "--shard-size", "lots"], "size 'lots' not understood"),
        (["out.lmdb", "--raw", "--encode", "png"], "cannot be combined with --encode"),
        (["out.lmdb", "--compression", "gzip"], "HDF5 stores only"),
    ],
)
def test_bad_option_values_get_one_line_errors(
    image_dir: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    code, _, err = run("pack", str(image_dir), str(tmp_path / args[0]), *args[1:])
    assert code == 1
    assert err.strip().splitlines() == [err.strip()] and message in err


def test_inspect_reports_a_missing_shard(image_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.lmdb"
    run("pack", str(image_dir), str(out), "--shards", "2", "--workers", "2")
    (out / "shard-00001.lmdb").unlink()
    code, _, err = run("inspect", str(out))
    assert code == 1 and "PROBLEM   shard-00001.lmdb: missing" in err
    code, text, _ = run("inspect", str(out), "--json")
    assert code == 1 and json.loads(text)["problems"] == ["shard-00001.lmdb: missing"]


def test_inspect_of_nothing(tmp_path: Path) -> None:
    code, _, err = run("inspect", str(tmp_path / "nope.lmdb"))
    assert code == 1 and err.strip() == f"Error: {tmp_path / 'nope.lmdb'}: no such store"


def test_real_process_piped_output_has_no_progress_bar(image_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "packer",
            "pack",
            str(image_dir),
            str(tmp_path / "o.h5"),
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # quiet when piped
    assert proc.stdout.startswith("packed 21 images")


@pytest.fixture
def slow_source(tmp_path: Path) -> Path:
    """Enough work (PNG re-encoding on one worker) that a pack runs for seconds."""
    root = tmp_path / "slow"
    for i in range(300):
        write_image(root / f"c{i % 3}" / f"{i}.png", size=(160, 160), seed=i)
    return root


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_pack_leaves_no_store(
    slow_source: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    out = tmp_path / "o.lmdb"
    partial = tmp_path / "o.lmdb.partial"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "packer",
            "pack",
            str(slow_source),
            str(out),
            "--encode",
            "png",
            "--workers",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not list(partial.glob("shard-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the pack ended before it could be interrupted"
    time.sleep(0.3)  # well into writing the shard
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert f"interrupted: nothing was written to {out}" in err
    assert not out.exists() and not partial.exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a named pipe")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_before_any_shard_ends_with_the_same_line(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Interrupted while it reads its labels (a named pipe nobody writes: the pack waits
    there, before any shard): one line and status 130, as later in a pack; click printed
    "Aborted!" with status 1."""
    for i in range(3):
        write_image(tmp_path / "src" / "a" / f"{i}.png", size=(32, 32), seed=i)
    labels, out = tmp_path / "labels.csv", tmp_path / "o.lmdb"
    os.mkfifo(labels)
    command = [sys.executable, "-m", "packer", "pack", str(tmp_path / "src"), str(out)]
    proc = subprocess.Popen(
        [*command, "--labels", str(labels)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.0)  # started, and waiting for the pipe
    assert proc.poll() is None, "the pack ended before it could be interrupted"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err == f"packer: interrupted: nothing was written to {out}\n"
    assert not out.exists() and not (tmp_path / "o.lmdb.partial").exists()


def test_a_killed_pack_resumes_with_the_same_command(slow_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.lmdb"
    partial = tmp_path / "o.lmdb.partial"
    command = [sys.executable, "-m", "packer", "pack", str(slow_source), str(out)]
    command += ["--encode", "png", "--workers", "1", "--shards", "10", "--seed", "1"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(partial.glob("*.done.json")) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the pack ended before it could be killed"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "shards are finished and kept in" in err and not out.exists()

    resumed = subprocess.run(command + ["--resume", "--json"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["kept_shards"] >= 1 and summary["packed"] == 300
    assert "resuming the unfinished pack" in resumed.stderr
    assert not partial.exists()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_draws_on_a_terminal_only() -> None:
    terminal, pipe = _Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        line = ProgressLine(stream)
        line("scan", 5000, None)
        line("pack", 10, 10)
        line.finish()
    assert pipe.getvalue() == ""
    drawn = terminal.getvalue()
    assert "scan     5,000 files" in drawn and "10/10" in drawn and "█" * 30 in drawn
    assert drawn.endswith("\r")  # the line is cleared for what is printed next
    assert ProgressLine(_Terminal(), enabled=False).enabled is False  # --quiet


def test_inspect_modes(image_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.lmdb"
    run("pack", str(image_dir), str(out), "--seed", "1", "--workers", "2")
    code, text, _ = run("inspect", str(out), "--verify")
    assert code == 0 and text.startswith(f"{out}: OK: 21 records in 1 shard(s) checked")
    code, text, _ = run("inspect", str(out), "--verify", "--workers", "1", "--json")
    assert code == 0 and json.loads(text)["records_checked"] == 21
    code, text, _ = run("inspect", str(out), "--head", "2", "--json")
    listed = json.loads(text)
    assert code == 0 and [r["index"] for r in listed] == [0, 1]
    code, text, _ = run("inspect", str(out), "--extract", "1", str(tmp_path / "one.jpg"))
    assert code == 0 and (tmp_path / "one.jpg").read_bytes()[:2] in (b"\xff\xd8", b"\x89P")
    code, text, _ = run(
        "inspect", str(out), "--grid", str(tmp_path / "g.png"), "--count", "4", "--class", "dog"
    )
    assert code == 0 and (tmp_path / "g.png").is_file() and "4 images" in text
    code, text, _ = run("inspect", str(out), "--shuffle", "--chunk-size", "4", "--json")
    assert code == 0 and {"stored", "reader"} <= set(json.loads(text))
    code, _, err = run("inspect", str(out), "--verify", "--bench")
    assert code == 1 and "choose one of --verify, --bench" in err


def test_inspect_verify_names_a_damaged_record(image_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.h5"
    run("pack", str(image_dir), str(out), "--seed", "1", "--workers", "2")
    shard = out / "shard-00000.h5"
    data = bytearray(shard.read_bytes())
    source = (image_dir / "cat" / "cat_1.jpg").read_bytes()
    at = data.find(source[100:140])
    data[at] ^= 0x10
    shard.write_bytes(bytes(data))
    code, text, err = run("inspect", str(out), "--verify")
    assert code == 1 and "PROBLEM" in text
    assert "(cat/cat_1.jpg): checksum" in err or "(cat/cat_1.jpg)" in err


def test_unpack_and_convert_commands(image_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.lmdb"
    run("pack", str(image_dir), str(out), "--workers", "2")
    code, text, _ = run("unpack", str(out), str(tmp_path / "back"))
    assert code == 0 and text.startswith("wrote 21 files")
    code, text, _ = run("unpack", str(out), str(tmp_path / "again"), "--workers", "1", "--json")
    assert code == 0 and json.loads(text)["files"] == 21
    code, _, err = run("unpack", str(out), str(tmp_path / "never"), "--workers", "-1")
    assert code == 2 and "--workers" in err and not (tmp_path / "never").exists()
    for source in image_dir.rglob("*.*"):
        assert (
            tmp_path / "back" / source.relative_to(image_dir)
        ).read_bytes() == source.read_bytes()
    code, text, _ = run("convert", str(out), str(tmp_path / "o.h5"), "--json")
    assert code == 0 and json.loads(text)["backend"] == "hdf5" and json.loads(text)["records"] == 21
    code, _, err = run("convert", str(out), str(tmp_path / "o.h5"))
    assert code == 1 and "already exists" in err


def test_inspect_bench_says_what_decodes_and_checks(image_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.lmdb"
    assert run("pack", str(image_dir), str(out), "--seed", "0", "--workers", "2")[0] == 0
    code, text, _ = run("inspect", str(out), "--bench")
    assert code == 0 and "device" in text and "reader" in text and "decoded" in text
    wanted = "libjpeg-turbo" if jpeg_turbo.ENABLED else "Pillow: "
    assert f"JPEGs decoded by {wanted}" in text and f"CRC-32 by {record.CRC32_BY}" in text
    code, text, _ = run("inspect", str(out), "--bench", "--json")
    assert code == 0 and json.loads(text)["accelerators"]["crc32"] == record.CRC32_BY
