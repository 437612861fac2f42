"""Writing a pack's shards on a Dask cluster: one task per shard.

The client has scanned, shuffled and planned (``packer.packing.pipeline``); each task prepares its
shard's files and writes the whole shard, under a temporary name, to the staging folder,
which every worker must see (a shared filesystem). Only a finished shard is renamed into
place, so a worker that dies mid-shard leaves nothing a retry or the manifest could take for
a shard. The client checks each shard that comes back, records it in the resume ledger, and
``packer.packing.pipeline`` writes the manifest last. The task runs the same ``write_shard`` as a local
pack, so the store is byte-identical to one packed on one machine with the same seed.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from PIL import Image

from packer.about import install_hint
from packer.arguments import check_workers
from packer.errors import PackerError, StoreError, UsageError
from packer.packing.ledger import Ledger, ShardResult
from packer.packing.prepare import prepare_file
from packer.packing.shard_job import PackContext, ShardJob, hashed, to_record, write_shard
from packer.store import open_shard_reader

__all__ = ["write_on_cluster", "connect", "require_dask"]

log = logging.getLogger(__name__)

_TEMP = ".writing-"  # in the name of a shard a task has not finished
_RETRIES = 3  # a task is also re-run, without counting here, when its worker dies


def write_on_cluster(
    jobs: list[ShardJob], context: PackContext, ledger: Ledger, add: Callable[[int], None]
) -> Iterator[tuple[int, ShardResult]]:
    """Run one task per job on the cluster ``context.options.dask`` names; yield each
    finished shard, checked and recorded in the ledger, as it comes back."""
    assert context.options.dask is not None
    with connect(context.options.dask) as client:
        # Imported after connect, which says what to install where Dask is missing.
        from distributed import as_completed

        futures = {
            client.submit(
                _shard_task,
                job,
                context,
                key=f"packer-shard-{job.index}-{uuid.uuid4().hex}",
                retries=_RETRIES,
                pure=False,
            ): job
            for job in jobs
        }
        try:
            for future in as_completed(futures):
                job = futures[future]
                try:
                    result = future.result()
                except PackerError:
                    raise
                except Exception as e:  # noqa: BLE001 - a task's error, named by its shard
                    raise StoreError(f"{job.path.name}: the Dask task failed: {e!r}") from e
                _check(job, result, context.options.backend)
                ledger.finish(job.path, result)
                add(len(job.items))
                yield job.index, result
        finally:
            client.cancel(list(futures))
            for stray in ledger.folder.glob(f"*{_TEMP}*"):  # left by workers that died
                stray.unlink(missing_ok=True)


def _shard_task(job: ShardJob, context: PackContext) -> ShardResult:
    """On a worker: prepare the job's files in order and write its shard."""
    options = context.options
    Image.MAX_IMAGE_PIXELS = options.max_pixels
    records = (
        to_record(
            context.root, item, prepare_file(context.root / item.path, options, True), options
        )
        for item in job.items
    )
    temp = job.path.with_name(f"{job.path.name}{_TEMP}{uuid.uuid4().hex}")
    result = write_shard(job, context, records, to=temp)
    os.replace(temp, job.path)
    return hashed(job.path, result)


def _check(job: ShardJob, result: ShardResult, backend: str) -> None:
    """A shard is taken only if the file is there, of the size hashed, and holds the
    records the task counted."""
    size = job.path.stat().st_size if job.path.exists() else None
    count = None
    if size == result.info.bytes:
        reader = open_shard_reader(backend, job.path)
        try:
            count = len(reader)
        finally:
            reader.close()
    if count != result.info.num_records:
        raise StoreError(
            f"{job.path}: the shard a Dask worker wrote is not what it reported "
            f"({size} bytes, {count} records; reported {result.info.bytes} bytes, "
            f"{result.info.num_records} records); is the store folder shared by every worker?"
        )


def require_dask() -> None:
    """Refuse a Dask pack where the ``dask`` extra is missing: called before the folder is
    scanned, so the user learns what to install at once, not after minutes of work."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise UsageError(
            f"--dask needs Dask's distributed scheduler: {install_hint('dask')}"
        ) from None


@contextmanager
def connect(address: str) -> Iterator[Any]:
    """A Dask client: ``local:N`` starts a cluster of N worker processes on this machine;
    anything else is a scheduler address (``tcp://host:8786``)."""
    require_dask()
    from distributed import Client, LocalCluster

    if address.startswith("local:"):
        try:
            workers = int(address.split(":", 1)[1])
        except ValueError:
            workers = 0
        if workers < 1:
            raise UsageError(f"--dask {address}: write local:N with N at least 1, e.g. local:4")
        check_workers(workers, f"--dask {address}")
        cluster = LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
        )
        with cluster, Client(cluster) as client:
            yield client
        return
    try:
        client = Client(address, timeout="30s")
    except OSError as e:
        raise UsageError(f"--dask {address}: cannot reach the scheduler: {e}") from e
    with client:
        yield client
