"""Packing on a real Dask cluster (worker processes on loopback): the same store as a local
pack, and still the same store when a worker is killed in the middle of a shard."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import store_path, write_image

from packer import PackOptions, pack
from packer.errors import UsageError
from packer.store.staging import partial_path

distributed = pytest.importorskip("distributed", reason="Dask is an optional extra: packer[dask]")


@pytest.fixture(scope="module")
def cluster() -> Iterator[distributed.LocalCluster]:
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as local:
        yield local


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dask") / "images"
    for i in range(120):
        write_image(root / f"c{i % 3}" / f"{i:03}.jpg", size=(120, 90), seed=i)
    (root / "c0" / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    return root


def shard_hashes(store: Path) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(store.glob("shard-*"))]


def options(backend: str, **kw: object) -> PackOptions:
    return PackOptions(**{"backend": backend, "seed": 5, "shards": 6, "workers": 1, **kw})  # type: ignore[arg-type]


def test_a_dask_pack_is_the_local_pack(
    cluster: distributed.LocalCluster, source: Path, tmp_path: Path, backend: str
) -> None:
    local = pack(source, store_path(tmp_path, backend, "local"), options(backend))
    on_dask = pack(
        source, store_path(tmp_path, backend), options(backend, dask=cluster.scheduler_address)
    )
    assert shard_hashes(on_dask.store) == shard_hashes(local.store)
    assert len(shard_hashes(local.store)) == 6
    for field in ("num_records", "shards", "stats", "skipped", "label_columns", "seed"):
        assert getattr(on_dask.manifest, field) == getattr(local.manifest, field), field
    assert [p.name for p in on_dask.store.iterdir() if ".writing-" in p.name] == []


def test_a_worker_killed_mid_shard_is_retried(
    cluster: distributed.LocalCluster, source: Path, tmp_path: Path
) -> None:
    slow = options("lmdb", encode="png", shards=4)  # PNG encoding: each shard takes a while
    reference = pack(source, tmp_path / "reference.lmdb", slow)
    out = tmp_path / "out.lmdb"
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = pack(
                source, out, PackOptions(**{**vars(slow), "dask": cluster.scheduler_address})
            )
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = e

    packing = threading.Thread(target=run)
    packing.start()
    deadline = time.monotonic() + 60
    while not list(partial_path(out).glob("*.writing-*")) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert packing.is_alive(), "the pack ended before a worker could be killed"
    with distributed.Client(cluster) as client:
        pids = client.run(os.getpid)
        for pid in pids.values():  # every worker, so the one writing a shard dies mid-shard
            os.kill(pid, signal.SIGKILL)
        packing.join(timeout=180)
        assert set(client.run(os.getpid).values()).isdisjoint(pids.values())  # restarted
    assert not packing.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert shard_hashes(out) == shard_hashes(reference.store)
    assert [p.name for p in out.iterdir() if ".writing-" in p.name] == []


def test_local_cluster_from_the_command_line(source: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from packer.cli import cli

    out = tmp_path / "out.h5"
    done = CliRunner().invoke(
        cli,
        ["pack", str(source), str(out), "--seed", "5", "--shards", "3", "--dask", "local:2", "-q"],
    )
    assert done.exit_code == 0, done.output
    reference = pack(source, tmp_path / "reference.h5", options("hdf5", shards=3))
    assert shard_hashes(out) == shard_hashes(reference.store)


@pytest.mark.parametrize("address", ["local:0", "local:x"])
def test_a_bad_local_cluster_size_is_a_usage_error(
    source: Path, tmp_path: Path, address: str
) -> None:
    with pytest.raises(UsageError, match="local:N"):
        pack(source, tmp_path / "out.lmdb", options("lmdb", dask=address))
    assert not partial_path(tmp_path / "out.lmdb").exists()
