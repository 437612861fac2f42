"""packer: pack a folder of images into pre-shuffled LMDB/HDF5 shards, stream them back fast."""

from __future__ import annotations

# The one place the version is written: the build reads it (pyproject.toml), pack records it in
# every manifest, `packer --version` prints it. CHANGELOG.md says what each one changed.
__version__ = "0.1.0"

# Imported after __version__, which pack.py records in every manifest.
from packer.errors import PackerError  # noqa: E402
from packer.packing.options import PackOptions  # noqa: E402
from packer.packing.pipeline import PackResult, pack  # noqa: E402
from packer.reading.reader import Reader, open_reader  # noqa: E402
from packer.store.access import Store, open_store  # noqa: E402
from packer.store.manifest import Manifest, read_manifest  # noqa: E402

__all__ = [
    "__version__",
    "pack",
    "PackOptions",
    "PackResult",
    "open_reader",
    "Reader",
    "open_store",
    "Store",
    "Manifest",
    "read_manifest",
    "PackerError",
]
