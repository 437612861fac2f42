"""PyTorch, optional: batches as tensors, pinned, and copied to the GPU on a side stream so the
copy overlaps the training step. Imported only for ``output="torch"``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from packer.about import require_torch
from packer.reading.batching import Batch

# Reached by output="torch": say what to install.
torch = require_torch("output='torch'")

__all__ = ["BatchMover"]

log = logging.getLogger(__name__)


def _tensor(value: Any) -> Any:
    if isinstance(value, list):
        return [_tensor(v) for v in value]
    return torch.from_numpy(value) if hasattr(value, "__array_interface__") else value


class BatchMover:
    """Runs in the prefetch thread: NumPy -> tensors -> pinned -> device, on a side stream.

    For CUDA the copy is queued on a stream of its own with ``non_blocking=True`` from pinned
    memory, so it overlaps the training step; the returned ``ready`` callable, run by the
    consumer before it hands the batch out, makes the training stream wait for that copy
    (and tells the caching allocator the tensors are used there).
    """

    def __init__(self, pin_memory: bool, device: str | None) -> None:
        self.device = torch.device(device) if device else None
        cuda = self.device is not None and self.device.type == "cuda"
        self.pin = pin_memory and torch.cuda.is_available()
        if pin_memory and not self.pin:
            log.warning("pin_memory=True ignored: no CUDA device is available")
        self.stream = torch.cuda.Stream(self.device) if cuda else None

    def __call__(self, batch: Batch) -> tuple[Batch, Callable[[], None] | None]:
        images, labels = _tensor(batch.images), torch.from_numpy(batch.labels)
        if batch.sources is not None:  # a mixture's store of each record: small, kept on the CPU
            batch = replace(batch, sources=torch.from_numpy(batch.sources))
        if self.pin:
            images = (
                [i.pin_memory() for i in images]
                if isinstance(images, list)
                else images.pin_memory()
            )
            labels = labels.pin_memory()
        if self.stream is None:
            if self.device is not None:
                images = (
                    [i.to(self.device) for i in images]
                    if isinstance(images, list)
                    else images.to(self.device)
                )
                labels = labels.to(self.device)
            return replace(batch, images=images, labels=labels), None
        with torch.cuda.stream(self.stream):
            images = (
                [i.to(self.device, non_blocking=True) for i in images]
                if isinstance(images, list)
                else images.to(self.device, non_blocking=True)
            )
            labels = labels.to(self.device, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.stream)

        def ready() -> None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(copied)
            for tensor in images if isinstance(images, list) else [images]:
                tensor.record_stream(current)
            labels.record_stream(current)

        return replace(batch, images=images, labels=labels), ready
