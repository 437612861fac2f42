"""Seeded orders, as pure functions: the same arguments give the same order on every machine."""

from __future__ import annotations

import secrets

import numpy as np

__all__ = ["new_seed", "permutation"]


def new_seed() -> int:
    """A fresh random seed for a pack run without ``--seed``; it is recorded in the manifest."""
    return secrets.randbits(63)


def permutation(n: int, seed: int) -> np.ndarray:
    """The pack-time order of ``n`` sorted source files: a uniform random permutation."""
    return np.random.default_rng(seed).permutation(n)
