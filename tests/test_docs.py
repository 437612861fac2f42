"""The documents keep their promises: the README names every command, and the reader's
page documents every reader option."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from packer.cli import cli
from packer.reading.options import ReaderOptions

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
READING = (ROOT / "docs" / "reading.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_command_is_in_the_readme(command: str) -> None:
    assert f"packer {command}" in README


def test_every_reader_option_is_documented() -> None:
    internal = {"worker"}  # set by packer.torch_adapter, not by users
    for field in dataclasses.fields(ReaderOptions):
        if field.name not in internal:
            assert f"`{field.name}`" in READING, field.name


def test_the_readme_is_a_newcomers_page() -> None:
    assert len(README.encode()) <= 15_000
    for link in re.findall(r"\]\(([^)#]+)\)", README):  # every page it links to is there
        if not link.startswith("http"):
            assert (ROOT / link).exists(), link


def test_the_two_commands_for_a_fresh_clone() -> None:
    assert "make demo" in README and "make test" in README
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


# History lives in git and the changelog: the pages state current results, each benchmark page
# its machine, command and date once. A time of day ("the run of 12:09 UTC") or a commit hash
# ("at 652824a") in their prose is a diary entry. Code blocks are left out: they show output.
_TIME_OF_DAY = re.compile(r"(?<![\d:.])([01]?\d|2[0-3]):[0-5]\d(?![\d:])")
_COMMIT = re.compile(r"(?<![\w/.:-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
_DIARY = re.compile(r"tried and not kept|timed by hand|earlier the same day", re.I)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _prose(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_pages_are_not_a_diary(page: Path) -> None:
    prose = _prose(page.read_text(encoding="utf-8"))
    for pattern in (_TIME_OF_DAY, _COMMIT, _DIARY):
        assert not pattern.search(prose), f"{page.name}: {pattern.search(prose)}"


def test_the_diary_check_finds_a_diary() -> None:
    diary = "The run of 12:09 UTC, at 652824a and its parent (timed by hand)."
    assert _TIME_OF_DAY.search(diary) and _COMMIT.search(diary) and _DIARY.search(diary)
    clean = "xxh3_128:ee11d3dc9400 in a code span, 2026-11-24, local:2, tcp://host:8786, 1:1"
    assert not (_TIME_OF_DAY.search(clean) or _COMMIT.search(clean))


def test_every_page_is_on_the_site() -> None:
    """mkdocs.yml's nav names every page under docs/ (a strict build refuses one left out)."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in (ROOT / "docs").rglob("*.md"):
        assert page.relative_to(ROOT / "docs").as_posix() in config, page


def _parts(thing: Any) -> Iterator[tuple[str, Any]]:
    """``thing``, and for a class its own public methods and properties."""
    yield thing.__name__, thing
    if inspect.isclass(thing):
        for name, value in vars(thing).items():
            if not name.startswith("_") and (
                inspect.isfunction(value) or isinstance(value, property)
            ):
                yield f"{thing.__name__}.{name}", value


def test_everything_the_reference_shows_has_a_docstring() -> None:
    """docs/reference.md is written from these docstrings: none may be missing."""
    import packer
    from packer import errors, recipes
    from packer.torch_adapter import TorchDataset

    shown = [getattr(packer, name) for name in packer.__all__ if name != "__version__"]
    shown += [TorchDataset, recipes.endless_batches, errors]
    shown += [
        c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__
    ]
    missing = [name for thing in shown for name, part in _parts(thing) if not inspect.getdoc(part)]
    assert not missing
    reference = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    for name in packer.__all__:
        if name not in ("__version__", "PackerError"):  # PackerError: with the other errors
            assert f"::: packer.{name}" in reference, name


def test_the_changelog_links_nothing_by_a_relative_path() -> None:
    """CHANGELOG.md is shown both at the repository's root and inside the docs site
    (docs/changelog.md includes it): a relative link can resolve in only one of the two, and
    the site's strict build fails on it. Pages are named in plain text there."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    relative = re.findall(r"\]\((?!https?://|#)([^)]+)\)", text)
    assert relative == []


def test_every_pip_install_of_packer_names_its_distribution() -> None:
    """`packer` on the package index is another project: the README and the docs install
    this one as packer-image-shards (or from a checkout), never by the bare name."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    wrong = [
        f"{page.name}: {line.strip()}"
        for page in pages
        for line in page.read_text(encoding="utf-8").splitlines()
        if re.search(r"pip install (--upgrade )?['\"]?packer(?![\w-])", line)
    ]
    assert wrong == []
    assert re.search(
        r"pip install (--upgrade )?['\"]?packer(?![\w-])", "pip install 'packer[torch]'"
    )


def test_reader_options_docstring_names_every_option() -> None:
    """help(packer.ReaderOptions) is where a notebook user finds the reader's options: its
    Attributes section names each field once, in order, and nothing else."""
    doc = inspect.getdoc(ReaderOptions) or ""
    attributes = doc.split("Attributes:", 1)[1]
    named = re.findall(r"^    (\w+): ", attributes, re.M)
    assert named == [f.name for f in dataclasses.fields(ReaderOptions)]
