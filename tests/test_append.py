"""``pack --append``: new images become new shards of an existing store; what was there
stays exactly as it was, and readers opened before the append go on unharmed."""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import (
    assert_one_line_error,
    packer_command,
    rewrite_manifest,
    store_path,
    write_image,
)

from packer import PackOptions, open_reader, open_store, pack, read_manifest
from packer.cli import cli
from packer.errors import LabelsError, PackInterrupted, UsageError
from packer.packing.pipeline import Progress
from packer.store.verify import verify_store


def folder(root: Path, classes: dict[str, int], first_seed: int) -> Path:
    seed = first_seed
    for name, count in classes.items():
        for i in range(count):
            write_image(root / name / f"{name}_{seed}.jpg", size=(24 + i, 20), seed=seed)
            seed += 1
    return root


def hashes(store: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in store.glob("shard-*")}


@pytest.fixture
def base(tmp_path: Path, backend: str) -> Path:
    source = folder(tmp_path / "old", {"cat": 10, "dog": 10}, 0)
    return pack(
        source, store_path(tmp_path, backend), PackOptions(backend=backend, seed=1, shards=2)
    ).store


def opts(backend: str, **kw: object) -> PackOptions:
    return PackOptions(**{"backend": backend, "seed": 2, "shards": 2, "append": True, **kw})  # type: ignore[arg-type]


def test_append_adds_shards_and_keeps_everything_else(
    base: Path, tmp_path: Path, backend: str
) -> None:
    before, old_hashes = read_manifest(base), hashes(base)
    with open_store(base) as store:
        old_records = [(r.path, r.labels, r.data) for r in store.records()]
    new = folder(tmp_path / "new", {"dog": 3, "eel": 4}, 100)

    result = pack(new, base, opts(backend))

    after = read_manifest(base)
    assert result.to_json()["packed"] == 7 and result.appended_to == 20
    assert result.to_json()["seed"] == 2 and result.to_json()["store_records"] == 27
    assert after.num_records == 27 and len(after.shards) == 4
    assert after.shards[:2] == before.shards
    assert {k: hashes(base)[k] for k in old_hashes} == old_hashes  # old shard files untouched
    assert after.label_columns == [{"name": "class", "classes": ["cat", "dog", "eel"]}]
    assert after.seed == before.seed and after.source["appends"][0]["seed"] == 2
    assert after.stats["label_counts"] == [{"0": 10, "1": 13, "2": 4}]
    assert after.stats["payload_bytes"]["count"] == 27
    with open_store(base) as store:
        records = list(store.records())
    assert [(r.path, r.labels, r.data) for r in records[:20]] == old_records
    classes = after.label_columns[0]["classes"]
    for r in records[20:]:  # every new record carries the store's index of its folder's class
        assert classes[r.labels[0]] == r.path.split("/")[0]
        assert r.data == (new / r.path).read_bytes()
    assert verify_store(base).ok
    assert not list(tmp_path.glob("*.partial"))
    shown = CliRunner().invoke(cli, ["inspect", str(base)])
    assert shown.exit_code == 0 and "appended  7 records as shards 2..3 on " in shown.output


def test_a_reader_opened_before_the_append_keeps_its_manifest(
    base: Path, tmp_path: Path, backend: str
) -> None:
    new = folder(tmp_path / "new", {"eel": 12}, 200)
    with open_reader(base, batch_size=4, seed=0, chunk_size=2, with_paths=True) as old:
        batches = iter(old.epoch(0))
        first = next(batches)
        pack(new, base, opts(backend))
        seen = list(first[2]) + [p for batch in batches for p in batch[2]]
        assert len(seen) == 20 and len(set(seen)) == 20  # its epoch, whole and unchanged
        assert len(list(old.epoch(1))) == 5
    with open_reader(base, batch_size=4, seed=0, chunk_size=2) as grown:
        assert grown.records_per_epoch() == 32
        order = grown.record_order(0)
    # Chunks of old and new shards are mixed: new records are not all at the end.
    new_positions = np.flatnonzero(order >= 20)
    assert len(new_positions) == 12 and new_positions.min() < 20


def test_appended_images_are_stored_as_the_store_stores_them(tmp_path: Path) -> None:
    old = folder(tmp_path / "old", {"a": 5, "b": 5}, 0)
    store = tmp_path / "raw.h5"
    pack(old, store, PackOptions(backend="hdf5", raw=True, size=(16, 16), seed=0))
    new = folder(tmp_path / "new", {"b": 3}, 50)
    pack(new, store, opts("hdf5"))  # raw and size come from the store
    with open_store(store) as opened:
        assert opened.manifest.storage.shape == [16, 16, 3]
        image, label = opened[12]
        assert image.shape == (16, 16, 3) and int(label[0]) == 1
    with pytest.raises(UsageError, match=r"drop --max-side 8 \(the store has None\)"):
        pack(new, store, opts("hdf5", max_side=8))
    with pytest.raises(UsageError, match="a lmdb store"):
        pack(new, store, opts("lmdb"))


def test_labels_must_be_of_the_same_kind(base: Path, tmp_path: Path, backend: str) -> None:
    new = folder(tmp_path / "new", {"cat": 2}, 300)
    with pytest.raises(LabelsError, match="labels come from none"):
        pack(new, base, opts(backend, labels="none"))
    table = tmp_path / "labels.csv"
    table.write_text("path,class\n" + "".join(f"cat/cat_{300 + i}.jpg,{i}\n" for i in range(2)))
    with pytest.raises(LabelsError, match="labels come from csv"):
        pack(new, base, opts(backend, labels=str(table)))


def test_csv_string_labels_extend_the_class_map(tmp_path: Path) -> None:
    old = folder(tmp_path / "old", {"x": 4}, 0)
    (tmp_path / "old.csv").write_text(
        "path,kind\n" + "".join(f"x/x_{i}.jpg,{'red' if i % 2 else 'blue'}\n" for i in range(4))
    )
    store = tmp_path / "s.lmdb"
    pack(old, store, PackOptions(labels=str(tmp_path / "old.csv"), seed=0))
    new = folder(tmp_path / "new", {"y": 3}, 10)
    (tmp_path / "new.csv").write_text(
        "path,kind\n"
        + "".join(f"y/y_{10 + i}.jpg,{['red', 'green', 'amber'][i]}\n" for i in range(3))
    )
    pack(new, store, opts("lmdb", labels=str(tmp_path / "new.csv")))
    manifest = read_manifest(store)
    assert manifest.label_columns[0]["classes"] == ["blue", "red", "amber", "green"]
    with open_store(store) as opened:
        labels = {r.path: r.labels[0] for r in opened.records()}
    assert labels["y/y_10.jpg"] == 1 and labels["y/y_11.jpg"] == 3 and labels["y/y_12.jpg"] == 2


def test_an_interrupted_append_leaves_the_store_as_it_was_and_resumes(
    base: Path, tmp_path: Path, backend: str
) -> None:
    before, old_hashes = read_manifest(base), hashes(base)
    new = folder(tmp_path / "new", {"eel": 12}, 400)

    def stop(p: Progress) -> None:
        if p.stage == "pack" and p.done == 9:  # in the second of two new shards
            raise KeyboardInterrupt

    with pytest.raises(PackInterrupted, match="1 of 2 shards are finished"):
        pack(new, base, opts(backend), progress=stop)
    assert read_manifest(base) == before and hashes(base) == old_hashes
    assert verify_store(base).ok
    resumed = pack(new, base, opts(backend))
    assert resumed.kept_shards == 1 and read_manifest(base).num_records == 32
    assert verify_store(base).ok


def test_append_needs_an_existing_store(tmp_path: Path) -> None:
    new = folder(tmp_path / "new", {"a": 2}, 0)
    with pytest.raises(Exception, match="no such store"):
        pack(new, tmp_path / "missing.lmdb", opts("lmdb"))


def test_append_to_a_store_whose_stats_predate_totals(
    base: Path, tmp_path: Path, backend: str
) -> None:
    """Stores packed before "total" was recorded have only each size's rounded mean: the
    merged statistics are rebuilt from it."""
    path = base / "manifest.json"
    data = json.loads(path.read_text())
    for name in ("payload_bytes", "height", "width"):
        del data["stats"][name]["total"]
    rewrite_manifest(base, data)
    before = data["stats"]["payload_bytes"]
    pack(folder(tmp_path / "new", {"eel": 3}, 500), base, opts(backend))
    after = read_manifest(base).stats["payload_bytes"]
    with open_store(base) as store:
        added = sum(len(r.data) for r in list(store.records())[20:])
    assert after["count"] == before["count"] + 3
    assert after["total"] == round(before["mean"] * before["count"]) + added


def test_the_same_append_run_again_adds_nothing(base: Path, tmp_path: Path, backend: str) -> None:
    """Issue 29: the same --append twice added every image twice. The store now records a
    digest of each pack's inputs; the second run writes nothing and says so in one line,
    and so does an append of the folder the store was first packed from."""
    new = folder(tmp_path / "new", {"dog": 3, "eel": 4}, 100)
    pack(new, base, opts(backend))
    manifest_bytes, shard_hashes = (base / "manifest.json").read_bytes(), hashes(base)

    again = pack(new, base, opts(backend, seed=9))  # another seed: the same images still
    assert again.already_added is not None and again.already_added.startswith("appended on ")
    assert again.to_json()["packed"] == 0 and again.to_json()["store_records"] == 27
    done = packer_command("pack", new, base, "--append")
    assert done.returncode == 0 and not done.stderr
    assert done.stdout.splitlines() == [
        f"nothing to add: {base} already holds {new}, the same files and labels "
        f"({again.already_added}); nothing was written"
    ]
    first = pack(tmp_path / "old", base, opts(backend))
    assert first.already_added == f"packed on {read_manifest(base).created}"
    assert (base / "manifest.json").read_bytes() == manifest_bytes
    assert hashes(base) == shard_hashes and verify_store(base).ok
    assert not (tmp_path / (base.name + ".append.partial")).exists()

    write_image(new / "eel" / "late.jpg", seed=999)  # the folder changed: a new append
    assert pack(new, base, opts(backend)).to_json()["packed"] == 8


def test_rerun_after_a_kill_that_came_after_the_commit_adds_nothing(
    base: Path, tmp_path: Path, backend: str
) -> None:
    """A kill between the manifest's rename and the process's exit leaves the grown store and
    its emptied staging folder (with the lock file) behind; "run the same command again", the
    documented recovery, must not add the images a second time."""
    new = folder(tmp_path / "new", {"eel": 5}, 600)
    pack(new, base, opts(backend))
    staged = tmp_path / (base.name + ".append.partial")
    staged.mkdir()
    (staged / ".lock").touch()  # what the killed append left
    grown = read_manifest(base)

    done = packer_command("pack", new, base, "--append", "--shards", "2")
    assert done.returncode == 0 and done.stdout.startswith("nothing to add: "), done.stderr
    assert read_manifest(base) == grown and verify_store(base).ok


def test_verify_names_a_source_file_packed_twice(base: Path, tmp_path: Path, backend: str) -> None:
    """A store grown by a packer that did not record its inputs: the same append twice put
    each image in twice, which --verify reports naming the path and both records. The same
    relative path from another folder is not a duplicate."""
    new = folder(tmp_path / "new", {"eel": 3}, 700)
    for _ in range(2):
        pack(new, base, opts(backend))
        data = json.loads((base / "manifest.json").read_text())
        for entry in [data["source"], *data["source"]["appends"]]:
            entry.pop("inputs_sha256", None)  # as the older packer wrote it
        rewrite_manifest(base, data)
    copy = tmp_path / "copy"
    shutil.copytree(new, copy)
    pack(copy, base, opts(backend))

    report = verify_store(base)
    assert not report.ok and len(report.problems) == 3
    with open_store(base) as store:
        paths = [r.path for r in store.records()]
        shards = [s.file for s in store.manifest.shards]
        for problem in report.problems:
            assert problem.index is not None and 23 <= problem.index < 26
            assert problem.path == paths[problem.index]
            earlier = paths.index(problem.path, 20)
            assert problem.reason == (
                f"packed twice: the same source file as record {earlier} "
                f"({shards[store.locate(earlier)[0]]})"
            )
    done = packer_command("inspect", base, "--verify")
    assert done.returncode == 1 and done.stderr.count("packed twice") == 3


def test_an_append_refused_while_another_runs_names_the_store(
    base: Path, tmp_path: Path, backend: str
) -> None:
    new = folder(tmp_path / "new", {"eel": 2}, 800)
    lock = tmp_path / (base.name + ".append.partial") / ".lock"
    lock.parent.mkdir()
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a running append holds it
        done = packer_command("pack", new, base, "--append")
    line = assert_one_line_error(done, f"another pack is writing {base} (it holds {lock})")
    assert f"{base}.append " not in line
