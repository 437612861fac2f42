"""CRC-32 checks of many fixed-size rows (raw pixels) in one pass.

Checking each row with its own CRC-32 call releases and retakes the GIL once per row;
beside a busy Python thread each retake can wait a whole switch interval (5 ms), so a
window of small rows checks at a few hundred rows a second. CRC-32 is linear: the CRC of
rows laid end to end follows from the rows' stored CRCs. One pass over the whole block,
one release of the GIL, checks them all; only a mismatch pays for finding the bad rows one
by one.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np

from packer.store.record import checksum

__all__ = ["rows_intact", "each_row_intact", "joined_crc"]


def rows_intact(rows: np.ndarray, crc32: np.ndarray) -> np.ndarray:
    """Where each row (first axis) of ``rows`` matches its CRC-32 in ``crc32``."""
    if not rows.flags.c_contiguous or not len(rows):
        return each_row_intact(rows, crc32)
    if checksum(rows.data) == joined_crc(crc32, rows[0].nbytes):
        return np.ones(len(rows), bool)
    return each_row_intact(rows, crc32)


def each_row_intact(rows: np.ndarray, crc32: np.ndarray) -> np.ndarray:
    return np.fromiter((checksum(row) for row in rows), np.uint32, len(rows)) == crc32


def joined_crc(crc32: np.ndarray, row_bytes: int) -> int:
    """The CRC-32 of rows of ``row_bytes`` bytes each laid end to end, from their CRC-32s:
    crc(A + B) = shift(crc(A)) ^ crc(B), ``shift`` a linear map of 32 bits that depends
    only on len(B) (zlib's crc32_combine).

    Joined in pairs, level by level, each level a few NumPy operations over all its pairs
    (no Python per row): at level k every right-hand part is 2**k rows long, so one
    ``shift`` serves them all. A zero put in front of an odd count adds nothing: shift(0)
    is 0."""
    crcs = np.asarray(crc32, np.uint32)
    level = 0
    while len(crcs) > 1:
        if len(crcs) % 2:
            crcs = np.concatenate((np.zeros(1, np.uint32), crcs))
        crcs = _shifted(crcs[0::2], _shift_tables(row_bytes, level)) ^ crcs[1::2]
        level += 1
    return int(crcs[0]) if len(crcs) else 0


def _shifted(values: np.ndarray, tables: tuple[np.ndarray, ...]) -> np.ndarray:
    """``shift`` applied to each of ``values``, by its four byte-indexed tables."""
    t0, t1, t2, t3 = tables
    return t0[values & 255] ^ t1[values >> 8 & 255] ^ t2[values >> 16 & 255] ^ t3[values >> 24]


_BITS = np.left_shift(np.uint32(1), np.arange(32, dtype=np.uint32))


@functools.lru_cache(maxsize=64)
def _shift_tables(row_bytes: int, level: int) -> tuple[np.ndarray, ...]:
    """``shift`` for 2**level rows of ``row_bytes`` as four byte-indexed tables (a 32x32
    bit matrix).

    Level 0: continuing a CRC over B from a start value s gives shift(s) ^ crc(B), so
    shift's column for bit k is crc32(B, 1 << k) ^ crc32(B), with B any ``row_bytes``
    bytes. Level k + 1 is level k applied twice."""
    if level == 0:
        zeros = bytes(row_bytes)
        base = zlib.crc32(zeros)
        columns = np.array([zlib.crc32(zeros, 1 << bit) ^ base for bit in range(32)], np.uint32)
    else:
        half = _shift_tables(row_bytes, level - 1)
        columns = _shifted(_shifted(_BITS, half), half)
    values = np.arange(256)
    tables = []
    for byte in range(4):
        table = np.zeros(256, np.uint32)
        for bit in range(8):
            table ^= np.where(values >> bit & 1, columns[8 * byte + bit], 0).astype(np.uint32)
        tables.append(table)
    return tuple(tables)
