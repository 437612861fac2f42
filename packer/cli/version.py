"""``packer --version`` and ``packer version --json``: this packer, what it runs on and the store
formats it reads, for bug reports.

Light on purpose: the libraries are imported only when the report is asked for."""

from __future__ import annotations

from typing import Any

from packer.about import DISTRIBUTION, __version__
from packer.imaging import jpeg_turbo
from packer.store.manifest import FORMAT_VERSION, OLDEST_FORMAT_VERSION

__all__ = ["versions", "version_lines"]

# HashiCorp's Packer installs a `packer` command too; this says which one answered. ASCII, so
# it prints on any console or redirected stream a bug report is copied from.
WHAT = "images -> LMDB/HDF5 shards"


def versions() -> dict[str, Any]:
    """This packer's version, Python's, the versions of the libraries that read, write and decode
    stores (None for an accelerator or extra that is not installed), and the store formats."""
    import platform

    import h5py
    import lmdb
    import numpy
    import PIL

    return {
        "packer": __version__,
        "distribution": DISTRIBUTION,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "lmdb": lmdb.__version__,
        "liblmdb": ".".join(map(str, lmdb.version())),
        "h5py": h5py.__version__,
        "libhdf5": h5py.version.hdf5_version,
        "pillow": PIL.__version__,
        "pillow_jpeg": _pillow_jpeg(),
        "simplejpeg": _installed("simplejpeg"),
        "simplejpeg_off": jpeg_turbo.why_off(),  # None where it decodes the JPEGs
        "numpy": numpy.__version__,
        # From the installed metadata: importing torch takes seconds, to read one string.
        "torch": _installed("torch"),
        "store_format_writes": FORMAT_VERSION,
        "store_formats_read": list(range(OLDEST_FORMAT_VERSION, FORMAT_VERSION + 1)),
    }


def version_lines(v: dict[str, Any]) -> list[str]:
    """``versions()`` as ``packer --version`` prints it: what this is first, then one library a
    line."""
    read = v["store_formats_read"]
    lines = [
        f"packer ({WHAT}) {v['distribution']} {v['packer']}",
        f"python {v['python']} ({v['platform']})",
        f"lmdb {v['lmdb']} (liblmdb {v['liblmdb']})",
        f"h5py {v['h5py']} (libhdf5 {v['libhdf5']})",
        f"pillow {v['pillow']} ({v['pillow_jpeg']})",
        f"simplejpeg {v['simplejpeg']}"
        if v["simplejpeg_off"] is None
        else f"simplejpeg off: {v['simplejpeg_off']}; Pillow decodes JPEGs",
        f"numpy {v['numpy']}",
    ]
    if v["torch"]:
        lines.append(f"torch {v['torch']}")
    lines.append(f"store format {v['store_format_writes']} written; {read[0]} to {read[-1]} read")
    return lines


def _installed(distribution: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _pillow_jpeg() -> str:
    """The JPEG library Pillow was built with: libjpeg-turbo's own version where Pillow says it
    is turbo, else libjpeg's API version."""
    from PIL import features

    if features.check_feature("libjpeg_turbo"):
        return f"libjpeg-turbo {features.version('libjpeg_turbo') or '(version not reported)'}"
    jpeg = features.version("jpg")
    return f"libjpeg {jpeg}" if jpeg else "no JPEG support"
