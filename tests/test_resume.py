"""Resuming an interrupted pack: finished shards are kept, the rest redone, and the store is
the one an uninterrupted pack would have written, byte for byte."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import store_path, write_image

from packer import PackOptions, pack, read_manifest
from packer.errors import IncompleteStoreError, PackInterrupted, ResumeError
from packer.packing.pipeline import Progress
from packer.store.manifest import PACK_PLAN
from packer.store.staging import partial_path

NUM_IMAGES = 48


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    for i in range(NUM_IMAGES):
        ext = ".png" if i % 4 == 0 else ".jpg"
        write_image(root / f"class_{i % 3}" / f"{i:03}{ext}", size=(40 + i, 30), seed=i)
    (root / "class_0" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return root


def opts(backend: str, **kw: Any) -> PackOptions:
    return PackOptions(**{"backend": backend, "seed": 7, "shards": 6, "workers": 1, **kw})


def shard_hashes(store: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(store.glob("shard-*"))
    }


def comparable(store: Path) -> dict[str, Any]:
    """The manifest, less what differs between two runs of one pack: the time and run flags."""
    data = json.loads((store / "manifest.json").read_text())
    del data["created"], data["manifest_checksum"]
    for run_only in ("resume", "workers", "overwrite"):
        del data["options"][run_only]
    return data


def interrupt_after(records: int) -> Callable[[Progress], None]:
    def progress(p: Progress) -> None:
        if p.stage == "pack" and p.done == records:
            raise KeyboardInterrupt

    return progress


def interrupted_pack(source: Path, out: Path, options: PackOptions, records: int) -> str:
    with pytest.raises(PackInterrupted) as info:
        pack(source, out, options, progress=interrupt_after(records))
    return str(info.value)


def test_an_interrupted_pack_resumes_to_the_same_store(
    source: Path, tmp_path: Path, backend: str
) -> None:
    reference = pack(source, store_path(tmp_path, backend, "reference"), opts(backend))
    out = store_path(tmp_path, backend)
    message = interrupted_pack(source, out, opts(backend), records=20)  # in the third shard
    partial = partial_path(out)
    assert "2 of 6 shards are finished and kept in" in message
    assert "run the same command again to resume" in message
    assert not out.exists()
    kept = sorted(p.name for p in partial.glob("shard-*.done.json"))
    assert kept == [f"shard-0000{i}.{out.suffix[1:]}.done.json" for i in (0, 1)]
    shards = [p.name for p in partial.glob("shard-*") if not p.name.endswith(".done.json")]
    assert len(shards) == 2  # the half-written third shard was removed

    with pytest.raises(IncompleteStoreError, match=r"with 2 of 6 shards finished\); run the same"):
        read_manifest(out)

    done: list[int] = []
    resumed = pack(source, out, opts(backend), progress=lambda p: done.append(p.done))
    assert resumed.kept_shards == 2 and resumed.kept_records == done[0] - 1
    assert done[-1] == NUM_IMAGES + 1  # progress counts on from the kept shards
    assert not partial.exists()
    assert shard_hashes(out) == shard_hashes(reference.store)
    assert comparable(out) == comparable(reference.store)
    assert resumed.to_json()["packed"] == reference.to_json()["packed"] == NUM_IMAGES
    assert [s.path for s in resumed.skipped] == ["class_0/broken.jpg"]


def test_repeated_interruptions_lose_nothing(source: Path, tmp_path: Path, backend: str) -> None:
    reference = pack(source, store_path(tmp_path, backend, "reference"), opts(backend))
    out = store_path(tmp_path, backend)
    for records in (3, 12, 12, 30, 41):  # some stop before a shard finishes, some twice in one
        interrupted_pack(source, out, opts(backend), records)
    pack(source, out, opts(backend, resume=True))
    assert shard_hashes(out) == shard_hashes(reference.store)


def test_a_random_seed_is_kept_for_the_resume(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.lmdb"
    interrupted_pack(source, out, opts("lmdb", seed=None), records=20)
    saved = json.loads((partial_path(out) / PACK_PLAN).read_text())
    resumed = pack(source, out, opts("lmdb", seed=None))
    assert resumed.kept_shards == 2
    assert resumed.manifest.seed == saved["seed"]
    reference = pack(source, tmp_path / "reference.lmdb", opts("lmdb", seed=saved["seed"]))
    assert shard_hashes(out) == shard_hashes(reference.store)


def test_other_options_start_over_or_are_refused_with_resume(
    source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out.lmdb"
    interrupted_pack(source, out, opts("lmdb"), records=20)
    with pytest.raises(ResumeError, match=r"--max-side was None, now 32") as info:
        pack(source, out, opts("lmdb", max_side=32, resume=True))
    assert "pack without --resume to start over" in str(info.value)
    assert (partial_path(out) / PACK_PLAN).exists()  # the refused resume touched nothing
    with pytest.raises(ResumeError, match=r"packed with --seed 7, not 8"):
        pack(source, out, opts("lmdb", seed=8, resume=True))

    with caplog.at_level(logging.WARNING, logger="packer"):
        result = pack(source, out, opts("lmdb", max_side=32))
    assert "starting over, since the options differ" in caplog.text
    assert result.kept_shards == 0
    assert read_manifest(out).storage.max_side == 32


def test_changed_inputs_are_refused_with_resume(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.lmdb"
    interrupted_pack(source, out, opts("lmdb"), records=20)
    write_image(source / "class_1" / "new.jpg", seed=99)
    with pytest.raises(ResumeError, match=r"it had 49 files, now 50"):
        pack(source, out, opts("lmdb", resume=True))
    (source / "class_1" / "new.jpg").unlink()
    (source / "class_2" / "002.jpg").rename(source / "class_1" / "002.jpg")  # a new label
    with pytest.raises(ResumeError, match=r"paths, sizes or labels"):
        pack(source, out, opts("lmdb", resume=True))


def test_resume_without_an_unfinished_pack_is_refused(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.lmdb"
    with pytest.raises(ResumeError, match="there is no unfinished pack"):
        pack(source, out, opts("lmdb", resume=True))
    assert not partial_path(out).exists() and not out.exists()


def test_a_damaged_finished_shard_is_redone(source: Path, tmp_path: Path, backend: str) -> None:
    reference = pack(source, store_path(tmp_path, backend, "reference"), opts(backend))
    out = store_path(tmp_path, backend)
    interrupted_pack(source, out, opts(backend), records=30)
    first = sorted(partial_path(out).glob("shard-00000.*"))[0]
    with open(first, "ab") as f:  # a shard that is not what its record says: redone
        f.write(b"junk")
    resumed = pack(source, out, opts(backend))
    assert resumed.kept_shards == 2  # shards 1 and 2 kept; shard 0 redone
    assert shard_hashes(out) == shard_hashes(reference.store)


def test_a_pack_that_fails_on_a_bad_image_keeps_nothing(source: Path, tmp_path: Path) -> None:
    """Fixing the file changes the inputs, so finished shards could never be resumed."""
    from packer.errors import BadImageError

    out = tmp_path / "out.lmdb"
    with pytest.raises(BadImageError):
        pack(source, out, opts("lmdb", on_error="fail", shuffle=False))
    assert not partial_path(out).exists()
