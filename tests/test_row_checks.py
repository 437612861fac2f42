"""One-pass CRC-32 checks of fixed-size rows, against zlib row by row."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from packer.row_checks import each_row_intact, joined_crc, rows_intact


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
