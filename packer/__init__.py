"""packer: pack a folder of images into pre-shuffled LMDB/HDF5 shards, stream them back fast."""

from __future__ import annotations

from packer.about import __version__
from packer.errors import PackerError
from packer.inspect.convert import convert_store
from packer.inspect.summary import StoreSummary, describe_store
from packer.inspect.unpack import UnpackResult, unpack_store
from packer.packing.options import PackOptions
from packer.packing.pipeline import PackResult, pack
from packer.reading.options import ReaderOptions
from packer.reading.reader import Reader, open_reader
from packer.store.access import Store, open_store
from packer.store.manifest import Manifest, read_manifest
from packer.store.verify import VerifyReport, verify_store

__all__ = [
    "__version__",
    "pack",
    "PackOptions",
    "PackResult",
    "open_reader",
    "ReaderOptions",
    "Reader",
    "open_store",
    "Store",
    "Manifest",
    "read_manifest",
    "describe_store",
    "StoreSummary",
    "verify_store",
    "VerifyReport",
    "unpack_store",
    "UnpackResult",
    "convert_store",
    "PackerError",
]
