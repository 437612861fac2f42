"""Shared fixtures: small real image folders made with Pillow, and the backend parameter.
The helpers the tests import are in helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import write_image


@pytest.fixture
def image_dir(tmp_path: Path) -> Path:
    """3 classes x 7 images, JPEG and PNG, sizes 16..40 px: 21 files, each different."""
    root = tmp_path / "images"
    n = 0
    for label in ("cat", "dog", "eel"):
        for i in range(7):
            ext = ".png" if i % 3 == 0 else ".jpg"
            write_image(root / label / f"{label}_{i}{ext}", size=(16 + 3 * i, 40 - 2 * i), seed=n)
            n += 1
    return root


@pytest.fixture(params=["lmdb", "hdf5"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
