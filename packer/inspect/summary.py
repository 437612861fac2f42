"""Look at a store without reading its records: the manifest, and whether the shard files
it names are there with the sizes it says. (Reading every record is ``--verify``'s job.)"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.store.access import open_manifest
from packer.store.manifest import Manifest

__all__ = ["StoreSummary", "describe_store"]


@dataclass
class StoreSummary:
    """What ``describe_store`` found: the store's manifest, and each shard file that is
    missing or of the wrong size, one line each, in ``problems``."""

    path: Path
    manifest: Manifest
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every shard file is there, at its size."""
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """The summary ``packer inspect --json`` prints."""
        return {
            "path": str(self.path),
            "ok": self.ok,
            "problems": self.problems,
            "manifest": self.manifest.to_json(),
        }


def describe_store(
    path: Path | str, *, images: str | None = None, labels: str | None = None
) -> StoreSummary:
    """Read the manifest (or describe a plain HDF5 file of arrays) and stat every shard file."""
    path = Path(path)
    manifest = open_manifest(path, images, labels)
    if manifest.backend == "pytables":
        return StoreSummary(path, manifest, [])
    problems = []
    for shard in manifest.shards:
        file = path / shard.file
        if not file.is_file():
            problems.append(f"{shard.file}: missing")
        elif file.stat().st_size != shard.bytes:
            problems.append(
                f"{shard.file}: {file.stat().st_size} bytes on disk, manifest says {shard.bytes}"
            )
    return StoreSummary(path, manifest, problems)
