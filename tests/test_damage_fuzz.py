"""Seeded damage to the shards of real stores, both backends, original bytes and raw pixels:
every damage is named by `verify` and is a PackerError to the readers (or changes nothing
they return), in bounded time, with no crash (issue 29's goals; see tests/damage_fuzz.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from damage_fuzz import make_cases, run_cases, summary, verdict
from helpers import write_image

from packer import PackOptions, pack

DEADLINE = 60  # seconds for one case: a healthy one takes well under one


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lmdb-original, hdf5-original, lmdb-raw, hdf5-raw: 24 JPEGs and PNGs, 2 shards each."""
    tmp = tmp_path_factory.mktemp("fuzz")
    root = tmp / "images"
    for i in range(24):
        ext = ".png" if i % 4 == 0 else ".jpg"
        write_image(root / f"c{i % 2}" / f"{i:02d}{ext}", size=(20 + i, 16 + i % 5), seed=i)
    folder = tmp / "stores"
    for backend in ("lmdb", "hdf5"):
        for payload, extra in (("original", {}), ("raw", {"raw": True, "size": (16, 16)})):
            out = folder / f"{backend}-{payload}"
            options = PackOptions(backend=backend, seed=3, workers=1, shards=2, **extra)  # type: ignore[arg-type]
            pack(root, out, options)
    return folder


def _run(stores: Path, count: int, seed: int) -> None:
    cases = make_cases(stores, count, seed)
    outcomes = run_cases(cases, stores, lanes=2, deadline=DEADLINE)
    failed = [(c, o, verdict(c, o)) for c, o in zip(cases, outcomes) if verdict(c, o) is not None]
    print(json.dumps(summary(cases, outcomes), indent=1))
    assert not failed, "\n".join(f"{c}: {v} {o}" for c, o, v in failed[:20])


def test_shard_damage_is_always_found_never_fatal(stores: Path) -> None:
    _run(stores, count=100, seed=29)  # 2,000 in the slow test below


@pytest.mark.slow
def test_shard_damage_is_always_found_never_fatal_at_length(stores: Path) -> None:
    _run(stores, count=2000, seed=2029)
