"""Scale: tens of thousands of files through pack, verify and the reader (`make test-slow`)."""

from __future__ import annotations

import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from helpers import store_path
from PIL import Image

from packer import PackOptions, open_reader, pack
from packer.store.verify import verify_store

pytestmark = pytest.mark.slow


def _folder(root: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    for i in range(n):
        folder = root / f"c{i % 10}" / f"{i // 1000:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(folder / f"{i}.png")


def _read(store: Path, traced: bool) -> tuple[int, Counter[str]]:
    """(peak traced bytes while reading one epoch, paths seen); the paths are collected
    only on the untraced pass, so the test's own bookkeeping is not counted as the reader's."""
    seen: Counter[str] = Counter()
    if traced:
        tracemalloc.start()
    with open_reader(store, batch_size=256, chunk_size=256, buffer_chunks=4, with_paths=True) as r:
        for _, _, paths in r:
            if not traced:
                seen.update(paths)
    peak = tracemalloc.get_traced_memory()[1] if traced else 0
    tracemalloc.stop()
    return peak, seen


def test_many_files_pack_verify_and_read_once_in_bounded_memory(
    tmp_path: Path, backend: str
) -> None:
    peaks = []
    for n in (3_000, 30_000):
        root = tmp_path / f"images-{n}"
        _folder(root, n)
        out = store_path(tmp_path, backend, f"s{n}")
        result = pack(root, out, PackOptions(backend=backend, seed=0, shard_size=200_000))
        assert result.manifest.num_records == n and len(result.manifest.shards) > 1
        assert verify_store(out).ok
        _, seen = _read(out, traced=False)
        assert len(seen) == n and set(seen.values()) == {1}  # every record once
        peaks.append(_read(out, traced=True)[0])
    # Ten times the records, the same buffers: memory is set by the buffers, not the store.
    assert peaks[1] < 1.5 * peaks[0] + 2_000_000, peaks
