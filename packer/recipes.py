"""Glue for training frameworks that want something other than one loop per epoch.

Keras' ``model.fit(generator, steps_per_epoch=len(reader))`` pulls batches from a single
endless generator and never says when an epoch starts; ``endless_batches`` gives it one that
walks the reader's epochs in turn, each still exactly once through the store. Nothing here
imports a framework.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from packer.errors import UsageError
from packer.reading.reader import Reader

__all__ = ["endless_batches"]


def endless_batches(
    reader: Reader, convert: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None
) -> Generator[tuple[Any, ...], None, None]:
    """Batches forever: epoch 0, then 1, 2, ... (or from where a loaded state points).

    Each epoch is the reader's own, so every record comes once per epoch and the order is
    the one ``reader.epoch(e)`` gives. ``convert(batch)`` maps each batch on the way out
    (e.g. to float inputs). ``len(reader)`` is the number of batches in one epoch: pass it as
    ``steps_per_epoch`` and a framework's epochs line up with the reader's.

    Raises:
        UsageError: an epoch yields no batch (an empty store or share), which would
            otherwise spin forever.
    """
    while True:
        empty = True
        for batch in reader:  # iter(reader): the next epoch, resume-aware
            empty = False
            yield batch if convert is None else convert(batch)
        if empty:
            raise UsageError(
                f"{reader.path}: an epoch yielded no batch (empty share?), so there is nothing to repeat"
            )
