"""CRC-32: packer's checksum against zlib's, and one-pass checks of fixed-size rows."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from packer.store import record
from packer.store.record import checksum
from packer.store.row_checks import each_row_intact, joined_crc, rows_intact


def _rows(n: int, shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rows = np.random.default_rng(seed).integers(0, 256, (n, *shape), dtype=np.uint8)
    return rows, np.array([zlib.crc32(row.tobytes()) for row in rows], np.uint32)


@pytest.mark.parametrize("shape", [(1,), (3,), (8, 8, 1), (64, 64, 3)])
@pytest.mark.parametrize("n", [1, 2, 5, 47, 300])
def test_joined_crc_is_the_crc_of_the_rows_end_to_end(shape: tuple[int, ...], n: int) -> None:
    rows, crc32 = _rows(n, shape, seed=n)
    assert joined_crc(crc32, rows[0].nbytes) == zlib.crc32(rows.tobytes())


@pytest.mark.parametrize("damaged", [[0], [46], [3, 4], [0, 20, 46]])
def test_exactly_the_damaged_rows_are_found(damaged: list[int]) -> None:
    rows, crc32 = _rows(47, (16, 16, 3))
    assert rows_intact(rows, crc32).all()
    for i in damaged:
        rows[i, 5, 7, 1] ^= 0x10
    intact = rows_intact(rows, crc32)
    assert sorted(np.flatnonzero(~intact)) == damaged
    assert np.array_equal(intact, each_row_intact(rows, crc32))


def test_two_swapped_rows_are_both_found() -> None:
    rows, crc32 = _rows(10, (4, 4, 3))
    rows[[2, 7]] = rows[[7, 2]]
    assert sorted(np.flatnonzero(~rows_intact(rows, crc32))) == [2, 7]


def test_a_wrong_stored_crc_is_found_too() -> None:
    rows, crc32 = _rows(10, (4, 4, 3))
    crc32[9] ^= 1
    assert sorted(np.flatnonzero(~rows_intact(rows, crc32))) == [9]


def test_rows_that_are_not_contiguous_are_checked_one_by_one() -> None:
    rows, crc32 = _rows(12, (6, 6, 3))
    every_other = np.ascontiguousarray(rows)[::2]
    assert not every_other.flags.c_contiguous
    assert rows_intact(every_other, crc32[::2]).all()
    assert rows_intact(rows[:0], crc32[:0]).shape == (0,)


@pytest.mark.parametrize("size", [0, 1, 7, 4096, 5 * 1024 + 1, 1 << 20])
def test_checksum_gives_zlibs_values(size: int) -> None:
    """Stores are checked with ISA-L's CRC-32 where it is installed and zlib's elsewhere, so
    the two must agree on every value: bytes, views at an odd offset, array rows."""
    data = np.random.default_rng(size).integers(0, 256, size + 3, dtype=np.uint8)
    assert checksum(data.tobytes()) == zlib.crc32(data.tobytes())
    view = memoryview(data.tobytes())[3:]
    assert checksum(view) == zlib.crc32(view)
    assert checksum(data[3:].data) == zlib.crc32(data[3:].tobytes())


def test_the_fast_crc_is_used_where_it_is_installed() -> None:
    isal_zlib = pytest.importorskip("isal.isal_zlib", reason="isal has no wheel for this platform")
    assert record._crc32 is isal_zlib.crc32
