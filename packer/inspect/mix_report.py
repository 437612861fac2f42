"""What an epoch of a mixture of stores would hold, per store and class, computed from the
reader's own plan and the stores' labels without reading a payload: so the proportions can
be checked before a long run. Used by ``packer inspect A B --mix 0.7,0.3``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packer.inspect.look import all_labels
from packer.reading.options import ReaderOptions
from packer.reading.reader import Reader
from packer.store.access import Store

__all__ = ["mixture_epoch"]


def mixture_epoch(
    paths: Sequence[Path | str],
    weights: Sequence[float] | None,
    *,
    epoch_size: int | None = None,
    seed: int = 0,
    epoch: int = 0,
    images: str | None = None,
    labels: str | None = None,
) -> dict[str, Any]:
    """Per store: its records in ``epoch`` of the mixture, their share, how many times over
    the store that is, how many distinct records, and the count of each class of its first
    label column (each store's own class names)."""
    options = ReaderOptions(
        batch_size=1, seed=seed, rank=0, world_size=1, images=images, labels=labels
    )
    with Reader(paths, options, weights=weights, epoch_size=epoch_size) as planner:
        order = planner.record_order(epoch)
        if order.ndim == 1:  # one store
            order = np.stack([np.zeros(len(order), np.int64), order], axis=1)
        total = len(order)
        sources = []
        for number, (name, path) in enumerate(zip(planner.names, planner.paths, strict=True)):
            indices = order[order[:, 0] == number, 1]
            with Store(path, images=images, labels=labels) as store:
                columns = store.manifest.label_columns
                found = all_labels(store)[indices, 0] if columns else np.zeros(0, np.int64)
            values, counts = np.unique(found, return_counts=True)
            classes = columns[0].get("classes") if columns else None
            size = planner.manifests[number].num_records
            sources.append(
                {
                    "name": name,
                    "path": str(path),
                    "store_records": size,
                    "weight": planner.weights[number]
                    if planner.weights
                    else size / max(sum(m.num_records for m in planner.manifests), 1),
                    "records": len(indices),
                    "share": len(indices) / total if total else 0.0,
                    "passes": len(indices) / size if size else 0.0,
                    "distinct": len(np.unique(indices)),
                    "label_column": columns[0]["name"] if columns else None,
                    "classes": {
                        (classes[v] if classes and 0 <= v < len(classes) else str(v)): int(c)
                        for v, c in zip(values.tolist(), counts.tolist(), strict=True)
                    },
                }
            )
    return {"epoch": epoch, "seed": seed, "records": total, "sources": sources}
