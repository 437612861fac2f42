"""What this packer is called where it is installed from, and the hint that tells a user what to
install."""

from __future__ import annotations

__all__ = ["DISTRIBUTION", "install_hint"]

# The name on the package index: `packer` there is an unrelated project from 2013. The import
# name and the command stay `packer`; pyproject.toml's [project] name must match (tested).
DISTRIBUTION = "packer-image-shards"


def install_hint(extra: str | None = None, *, upgrade: bool = False) -> str:
    """The command that installs this packer, with ``extra`` (torch, dask) where one is needed."""
    what = f"'{DISTRIBUTION}[{extra}]'" if extra else DISTRIBUTION
    return f"pip install {'--upgrade ' if upgrade else ''}{what}"
