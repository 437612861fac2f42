"""Fault injection: kill a real ``packer pack`` with SIGKILL at random moments, many times.

After each kill it checks that nothing stands under the store's name unless the store is
complete and verifies; then it runs the same command again, to be killed again or to
finish. At the end the store must be byte-identical to an uninterrupted pack with the same
seed, and hold every valid source image exactly once (by sha256 of its bytes).

With ``--signal INT`` (Ctrl-C) or ``TERM``, sent once the pack command has begun (not while
Python imports it), each interrupted pack must also end by itself within a minute, with exit
status 130 and a line on stderr that says it was interrupted (never a traceback), unless it
finished first.

    python scripts/kill_pack.py --kills 200 --images 600 --backend lmdb --json
    python scripts/kill_pack.py --kills 200 --signal INT --json
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from packer import open_store
from packer.store.manifest import PACK_PLAN

PACKER = [sys.executable, "-m", "packer"]


def make_source(root: Path, count: int, seed: int) -> set[str]:
    """``count`` real JPEG/PNG images in 4 class folders, plus a few broken files; returns
    the sha256 of every valid image's bytes."""
    rng = np.random.default_rng(seed)
    valid = set()
    for i in range(count):
        height, width = (int(v) for v in rng.integers(48, 160, 2))
        pixels = rng.integers(0, 256, (height, width, 3), np.uint8)
        out = io.BytesIO()
        fmt = "PNG" if i % 5 == 0 else "JPEG"
        Image.fromarray(pixels).save(out, fmt)
        path = root / f"class_{i % 4}" / f"{i:05}.{fmt.lower()}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(out.getvalue())
        valid.add(hashlib.sha256(out.getvalue()).hexdigest())
    (root / "class_0" / "truncated.jpeg").write_bytes(out.getvalue()[:200])
    (root / "class_1" / "notes.txt").write_text("not an image")
    return valid


def shard_hashes(store: Path) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(store.glob("shard-*"))]


def record_hashes(store: Path) -> Counter[str]:
    with open_store(store) as opened:
        return Counter(hashlib.sha256(record.data).hexdigest() for record in opened.records())


def where(out: Path, partial: Path) -> str:
    """What a kill interrupted, judged by what it left."""
    if out.exists():
        return "after the commit"
    shards = [p for p in partial.glob("shard-*") if not p.name.endswith(".done.json")]
    if not shards:
        return "before any shard"
    if len(shards) > len(list(partial.glob("*.done.json"))):
        return "while writing or hashing a shard"
    return "between shards"


def verifies(store: Path) -> bool:
    done = subprocess.run(
        PACKER + ["inspect", str(store), "--verify", "--json"], capture_output=True
    )
    return done.returncode == 0


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    source, out = work / "images", work / f"out.{'lmdb' if args.backend == 'lmdb' else 'h5'}"
    partial = out.with_name(out.name + ".partial")
    valid = make_source(source, args.images, args.seed)
    options = ["--seed", str(args.seed), "--shards", str(args.shards), "-q"]
    options += ["--workers", str(args.workers)]

    def packing(store: Path) -> list[str]:
        """The pack command into ``store``; with --resume where a plan is left to resume."""
        resume = ["--resume"] if store == out and (partial / PACK_PLAN).exists() else []
        return PACKER + ["pack", str(source), str(store), *options, *resume]

    started = time.perf_counter()
    reference = work / ("reference" + out.suffix)
    subprocess.run(packing(reference), check=True)
    duration = time.perf_counter() - started

    rng = random.Random(args.seed)
    landed: Counter[str] = Counter()  # where the kills landed
    resumes_with_kept = 0
    hangs, bad_ends = 0, Counter[str]()
    for kill in range(1, args.kills + 1):
        command = packing(out)
        resumes_with_kept += bool("--resume" in command and list(partial.glob("*.done.json")))
        proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        if args.signal == "KILL":
            time.sleep(rng.uniform(0.2, 1.1) * duration)
        else:  # once the pack has begun: Python's own start-up is not packer's to handle
            _wait_until_begun(proc)
            time.sleep(rng.uniform(0.0, 0.6) * duration)
        proc.send_signal(getattr(signal, f"SIG{args.signal}"))
        try:
            _, err = proc.communicate(timeout=_END_WITHIN_S)
        except subprocess.TimeoutExpired:
            hangs += 1
            proc.kill()
            _, err = proc.communicate()
        else:
            if args.signal != "KILL" and not _ended_well(proc.returncode, err, out.exists()):
                bad_ends[f"exit {proc.returncode}: {err.strip()[-200:]}"] += 1
        if args.verbose:
            sys.stderr.write(err)
        landed[where(out, partial)] += 1
        if out.exists():  # the pack won the race: it must be whole, then it starts again
            if not verifies(out) or shard_hashes(out) != shard_hashes(reference):
                raise SystemExit(f"kill {kill}: {out} exists but is not the complete store")
            shutil.rmtree(out)
        if args.verbose:
            print(f"kill {kill}: {sorted(p.name for p in partial.glob('*'))}")
    subprocess.run(packing(out), check=True, timeout=600)

    packed = record_hashes(out)
    return {
        "backend": args.backend,
        "images": args.images,
        "shards": args.shards,
        "signal": f"SIG{args.signal}",
        "kills": args.kills,
        "kills_landed": dict(landed),
        "hangs": hangs,
        "bad_ends": dict(bad_ends),
        "resumed_with_kept_shards": resumes_with_kept,
        "identical_to_uninterrupted": shard_hashes(out) == shard_hashes(reference),
        "verifies": verifies(out),
        "valid_images": len(valid),
        "missing": len(valid - set(packed)),
        "duplicated": sum(n - 1 for n in packed.values() if n > 1),
        "unexpected": len(set(packed) - valid),
        "uninterrupted_pack_s": round(duration, 2),
        "store": str(out),
    }


_END_WITHIN_S = 60  # an interrupted pack that has not ended by then counts as a hang


def _wait_until_begun(proc: subprocess.Popen[str]) -> None:
    """Until the pack command has begun: it catches SIGTERM from then on (the SigCgt mask in
    /proc/PID/status, Linux), or has ended. Elsewhere, a second."""
    status = Path(f"/proc/{proc.pid}/status")
    deadline = time.monotonic() + _END_WITHIN_S
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            caught = next(ln for ln in status.read_text().splitlines() if ln.startswith("SigCgt"))
        except (OSError, StopIteration):
            time.sleep(1.0)
            return
        if int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1:
            return
        time.sleep(0.005)


def _ended_well(returncode: int, err: str, complete: bool) -> bool:
    """Interrupted: status 130 and a last line saying so (after a resume's notice, if any);
    or the store was complete first. Never a traceback."""
    lines = err.strip().splitlines() or [""]
    if "Traceback" in err:
        return False
    return complete or (returncode == 130 and "interrupted: nothing was" in lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--backend", choices=["lmdb", "hdf5"], default="lmdb")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--signal", choices=["KILL", "INT", "TERM"], default="KILL", help="sent to each pack"
    )
    parser.add_argument("--workdir", type=Path, help="keep everything here (default: a temp dir)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        result = run(args, args.workdir)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = run(args, Path(tmp))
    lost = result["missing"] + result["duplicated"] + result["unexpected"]
    ended = not result["hangs"] and not result["bad_ends"]
    ok = result["identical_to_uninterrupted"] and result["verifies"] and not lost and ended
    if args.json:
        print(json.dumps({**result, "ok": ok}, indent=1))
    else:
        print(
            f"{result['kills']} {result['signal']}s of packer pack ({result['backend']}, "
            f"{result['images']} images, {result['shards']} shards): "
            f"{result['resumed_with_kept_shards']} resumes kept finished shards; final store "
            f"identical to an uninterrupted pack: {result['identical_to_uninterrupted']}; "
            f"verifies: {result['verifies']}; missing {result['missing']}, duplicated "
            f"{result['duplicated']}; hangs {result['hangs']}, other ends "
            f"{sum(result['bad_ends'].values())}"
        )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
