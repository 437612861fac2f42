"""The documents keep their promises: the README names every command, and the reader's
page documents every reader option."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

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
