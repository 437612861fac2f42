#!/usr/bin/env python3
"""Compare two versions of packer on the same pack, side by side: BASE against NEW.

Each version is a git revision checked out in a worktree of its own (NEW defaults to the
working tree). Rounds alternate between them, each round one fresh process per version that
packs bench_pack's image folder ``--packs`` + 1 times (the first, which imports h5py and
the like, is not counted) and reports its median and fastest pack and its median CPU. A
small change is worth a few percent on a shared machine whose runs wander by ten: only the
medians over several rounds, made in turn, tell it from the noise.

    python benchmarks/ab_pack.py c8f8c5d~1 c8f8c5d --backend lmdb     # that commit's gain
    python benchmarks/ab_pack.py HEAD --backend hdf5 --check full --rounds 6
    python benchmarks/ab_pack.py HEAD --source ~/photos    # another folder than the bench's
    python benchmarks/ab_pack.py main --out /tmp/ab.md     # the result as a page, for a review

Its result is a comparison of two revisions, so it has no page under docs/: ``--out`` writes
one where asked (a pull request, a commit message's source), with every round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reporting  # noqa: E402
from bench_pack import DEFAULT_IMAGES, prepare_data  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# One process of one round: packs, then prints one JSON line (its packer is the first on
# sys.path: the version's checkout).
CHILD = r"""
import json, resource, shutil, statistics, sys, time
from packer import PackOptions
from packer import pack
source, out, backend, check, packs = sys.argv[1:6]
seconds, cpu = [], []
def used():
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
for i in range(int(packs) + 1):
    shutil.rmtree(out, ignore_errors=True)
    before, started = used(), time.perf_counter()
    pack(source, out, PackOptions(backend=backend, check=check, seed=0))
    if i:
        seconds.append(time.perf_counter() - started)
        cpu.append(used() - before)
shutil.rmtree(out, ignore_errors=True)
print(json.dumps({"median": statistics.median(seconds), "best": min(seconds), "cpu": statistics.median(cpu)}))
"""


def checkout(revision: str | None, into: Path) -> Path:
    """A directory whose ``packer`` package is ``revision`` (None: this working tree)."""
    if revision is None:
        return REPO
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(into), revision],
        check=True,
    )
    return into


def one_round(code: Path, source: Path, out: Path, args: argparse.Namespace) -> dict[str, float]:
    argv = [sys.executable, "-c", CHILD, str(source), str(out), args.backend, args.check]
    done = subprocess.run(
        [*argv, str(args.packs)],
        env={**os.environ, "PYTHONPATH": str(code)},
        cwd=out.parent,  # not the repository: ``python -c`` puts its folder first on sys.path
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(done.stdout.splitlines()[-1]))


def page(
    command: str,
    args: argparse.Namespace,
    versions: dict[str, str | None],
    rounds: list[dict[str, dict[str, float]]],
) -> str:
    """The result: every round's figures, then new/base of the medians over the rounds."""
    label = {name: versions[name] or "the working tree" for name in versions}
    text = reporting.header("Two revisions' packs, side by side", command)
    text += (
        f"base: {label['base']}; new: {label['new']}. {args.backend}, `--check {args.check}`; "
        f"each round one fresh process per revision, in turn, packing {args.packs} times after "
        "an uncounted first pack; seconds are the median and best pack of the process, CPU its "
        "median CPU seconds a pack.\n\n"
    )
    rows = [
        [str(r), *(f"{got[n]['median']:.3f}, {got[n]['best']:.3f}, {got[n]['cpu']:.3f}"
                   for n in versions)]
        for r, got in enumerate(rounds, 1)
    ]  # fmt: skip
    text += reporting.table(
        ["round", "base: median, best s, CPU s", "new: median, best s, CPU s"], rows
    )
    base, new = (statistics.median(got[n]["median"] for got in rounds) for n in versions)
    return text + (
        f"Median over the rounds: base {base:.3f} s, new {new:.3f} s; new/base {new / base:.3f}.\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("base", help="git revision to compare against")
    parser.add_argument("new", nargs="?", help="git revision (default: the working tree)")
    parser.add_argument("--backend", default="lmdb", choices=["lmdb", "hdf5"])
    parser.add_argument("--check", default="header", choices=["header", "full"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--packs", type=int, default=5, help="packs counted per process")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/packer-bench"))
    parser.add_argument(
        "--source", type=Path, help="pack this folder instead of bench_pack's images"
    )
    parser.add_argument("--out", type=Path, help="also write the result as a page here")
    args = parser.parse_args(argv)
    root = args.source or prepare_data(args.workdir / "images", DEFAULT_IMAGES, (300, 640)).root
    scratch = Path(tempfile.mkdtemp(prefix="packer-ab-"))
    versions = {"base": args.base, "new": args.new}
    codes: dict[str, Path] = {}
    try:
        for name, revision in versions.items():
            codes[name] = checkout(revision, scratch / name)
        rounds: list[dict[str, dict[str, float]]] = []
        for r in range(args.rounds):
            got = {
                name: one_round(codes[name], root, scratch / f"out-{name}", args)
                for name in versions
            }
            rounds.append(got)
            print(
                f"round {r + 1}: "
                + " | ".join(
                    f"{name} median {g['median']:.3f} s, best {g['best']:.3f}, CPU {g['cpu']:.3f}"
                    for name, g in got.items()
                ),
                file=sys.stderr,
            )
        text = page(reporting.command(__file__, argv), args, versions, rounds)
        if args.out:
            reporting.write(args.out, text)
        print(text)
    finally:
        for name, revision in versions.items():
            if revision is not None and name in codes:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(codes[name])],
                    check=False,
                )
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
