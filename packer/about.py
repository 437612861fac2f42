"""What this packer is: its version, what it is called where it is installed from, and the hint
that tells a user what to install."""

from __future__ import annotations

from types import ModuleType

__all__ = ["__version__", "DISTRIBUTION", "install_hint", "require_torch"]

# The one place the version is written: the build reads it (pyproject.toml), pack records it in
# every manifest, `packer --version` prints it. CHANGELOG.md says what each one changed.
__version__ = "0.1.0"

# The name on the package index: `packer` there is an unrelated project from 2013. The import
# name and the command stay `packer`; pyproject.toml's [project] name must match (tested).
DISTRIBUTION = "packer-image-shards"


def install_hint(extra: str | None = None, *, upgrade: bool = False) -> str:
    """The command that installs this packer, with ``extra`` (torch, dask) where one is needed."""
    what = f"'{DISTRIBUTION}[{extra}]'" if extra else DISTRIBUTION
    return f"pip install {'--upgrade ' if upgrade else ''}{what}"


def require_torch(what: str) -> ModuleType:
    """PyTorch, imported; where it is not installed, ModuleNotFoundError saying that ``what``
    needs it and the command that installs it (a missing module torch itself imports is
    raised as it is)."""
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        raise ModuleNotFoundError(
            f"{what} needs PyTorch: {install_hint('torch')}", name="torch"
        ) from None
    return torch
