"""The manifest's checksum of its own bytes (format 4): any edit of any byte or field of a
manifest is refused when the store is opened, so ``inspect --verify`` reports it; stores of
older formats, which have no such checksum, still open."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import assert_one_line_error, packer_command, write_image

from packer import PackOptions, pack
from packer.cli import cli
from packer.errors import ManifestError
from packer.store.manifest import manifest_bytes, read_manifest
from packer.store.verify import verify_store

_VARIANTS = {
    "lmdb": {"backend": "lmdb"},
    "hdf5": {"backend": "hdf5"},
    "lmdb-raw": {"backend": "lmdb", "raw": True, "size": (8, 8)},
    "hdf5-raw": {"backend": "hdf5", "raw": True, "size": (8, 8)},
}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("manifest-checksum")
    for i in range(6):
        write_image(root / "src" / ("cat" if i % 2 else "dog") / f"{i}.jpg", seed=i)
    made = {}
    for name, extra in _VARIANTS.items():
        out = root / (name + (".lmdb" if extra["backend"] == "lmdb" else ".h5"))
        pack(root / "src", out, PackOptions(seed=5, workers=1, shards=2, **extra))  # type: ignore[arg-type]
        made[name] = out
    return made


def _refused(store: Path) -> str:
    """The one-line error opening ``store`` gives; it must name the manifest."""
    with pytest.raises(ManifestError) as info:
        read_manifest(store)
    message = str(info.value)
    assert str(store / "manifest.json") in message
    return message


@pytest.fixture
def store(stores: dict[str, Path], request: pytest.FixtureRequest) -> Iterator[Path]:
    """One packed store whose manifest a test may damage: restored afterwards."""
    path = stores[request.param]
    original = (path / "manifest.json").read_bytes()
    yield path
    (path / "manifest.json").write_bytes(original)


def _variants(test: Any) -> Any:
    return pytest.mark.parametrize("store", list(_VARIANTS), indirect=True)(test)


@_variants
def test_the_manifest_ends_with_a_checksum_of_every_byte_before_it(store: Path) -> None:
    raw = (store / "manifest.json").read_bytes()
    data = json.loads(raw)
    assert list(data)[-1] == "manifest_checksum"
    assert raw.endswith(b'"\n}\n') and manifest_bytes(data) == raw
    assert verify_store(store).ok


# The damages the adversarial trial made that --verify passed (issue 29).
_EDITS = {
    "label_columns emptied": lambda m: m.update(label_columns=[]),
    "an option changed": lambda m: m["options"].update(quality=50),
    "stats changed": lambda m: m["stats"]["payload_bytes"].update(max=1),
    "payload_bytes changed": lambda m: m["shards"][0].update(payload_bytes=7),
}


@_variants
@pytest.mark.parametrize("edit", list(_EDITS))
def test_an_edited_field_is_reported_by_verify_in_one_line(store: Path, edit: str) -> None:
    data = json.loads((store / "manifest.json").read_text())
    _EDITS[edit](data)
    _write_as_packer_formats(store, data)
    if edit == "label_columns emptied" and "raw" in store.name:  # one process is enough
        done = packer_command("inspect", store, "--verify")
        assert_one_line_error(done, store / "manifest.json", "changed after packer wrote it")
    else:
        result = CliRunner().invoke(cli, ["inspect", str(store), "--verify"])
        assert result.exit_code == 1 and "changed after packer wrote it" in result.stderr


def _write_as_packer_formats(store: Path, data: dict[str, Any]) -> None:
    """JSON laid out as packer lays it out, the old checksum kept: only the edit differs."""
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    (store / "manifest.json").write_text(text, encoding="utf-8")


def _byte_damages(original: bytes, positions: list[int], rng: random.Random) -> Iterator[bytes]:
    """The byte at each of ``positions`` replaced by another (seeded), then a seeded sample of
    bytes inserted and removed."""
    for i in positions:
        yield original[:i] + bytes([original[i] ^ rng.randrange(1, 256)]) + original[i + 1 :]
    for i in rng.sample(range(len(original) + 1), 40):
        yield original[:i] + bytes([rng.randrange(256)]) + original[i:]
        yield original[: max(i - 1, 0)] + original[i:]


def _each_refused(store: Path, damages: Iterator[bytes]) -> None:
    path = store / "manifest.json"
    original = path.read_bytes()
    for damaged in damages:
        if damaged != original:  # removing one of two equal bytes (of "\n}\n") changes nothing
            path.write_bytes(damaged)
            _refused(store)


@_variants
def test_single_byte_damages_are_refused(store: Path) -> None:
    """250 bytes of the manifest (seeded), each replaced by another, and 80 bytes inserted or
    removed: every damage is refused naming the manifest."""
    original = (store / "manifest.json").read_bytes()
    rng = random.Random(29)
    positions = rng.sample(range(len(original)), 250)
    _each_refused(store, _byte_damages(original, positions, rng))


@pytest.mark.slow
@_variants
def test_every_single_byte_damage_is_refused(store: Path) -> None:
    original = (store / "manifest.json").read_bytes()
    rng = random.Random(29)
    _each_refused(store, _byte_damages(original, list(range(len(original))), rng))


def _nodes(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path to every value inside a JSON document."""
    children = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in children:
        yield (*at, key)
        yield from _nodes(child, (*at, key))


def _changed(value: Any, rng: random.Random) -> Any:
    """Another value of the same kind (or of another, now and then)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice([-1, 1, 1000])
    if isinstance(value, float):
        return value * 1.5 + 0.5
    if isinstance(value, str):
        return value[:-1] if value and rng.random() < 0.5 else value + "x"
    if isinstance(value, list):
        return value[:-1] if value else [0]
    if isinstance(value, dict):
        return dict(list(value.items())[:-1]) if value else {"x": 1}
    return 0  # null


@_variants
def test_every_field_damage_is_refused_and_fails_verify(store: Path) -> None:
    """Every value of the manifest changed (or its key removed), one at a time, the rest as
    packer wrote it: each is refused by read_manifest, and ``inspect --verify`` exits 1
    naming the manifest (a seeded sample through the command, all through read_manifest)."""
    path = store / "manifest.json"
    original = json.loads(path.read_text())
    _write_as_packer_formats(store, original)
    assert read_manifest(store) is not None  # the harness alone changes nothing
    rng = random.Random(4)
    nodes = list(_nodes(original))
    through_cli = set(rng.sample(range(len(nodes)), 25))
    for k, node in enumerate(nodes):
        data = json.loads(json.dumps(original))
        parent = data
        for key in node[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and rng.random() < 0.2:
            del parent[node[-1]]
        else:
            parent[node[-1]] = _changed(parent[node[-1]], rng)
        _write_as_packer_formats(store, data)
        _refused(store)
        if k in through_cli:
            result = CliRunner().invoke(cli, ["inspect", str(store), "--verify"])
            assert result.exit_code == 1, (node, result.output)
            assert str(path) in result.stderr, (node, result.stderr)


@_variants
def test_a_format_4_manifest_without_its_checksum_is_refused(store: Path) -> None:
    data = json.loads((store / "manifest.json").read_text())
    del data["manifest_checksum"]
    _write_as_packer_formats(store, data)
    assert "manifest_checksum is missing" in _refused(store)


@_variants
def test_a_format_3_store_without_a_manifest_checksum_still_opens_and_verifies(
    store: Path,
) -> None:
    data = json.loads((store / "manifest.json").read_text())
    del data["manifest_checksum"]
    data["format_version"] = 3
    _write_as_packer_formats(store, data)
    assert read_manifest(store).format_version == 3
    assert verify_store(store).ok
