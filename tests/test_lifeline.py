"""A SIGKILLed `packer inspect --verify` takes its helper process with it (issue 29, item 2)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import child_pids, process_alive, write_image

from packer import PackOptions, pack
from packer.store.manifest import read_manifest


def _holds(pid: int, file: Path) -> bool:
    try:
        return any(os.readlink(fd) == str(file) for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux's /proc")
def test_verify_helper_dies_with_a_sigkilled_inspect(tmp_path: Path) -> None:
    root = tmp_path / "images"
    for i in range(300):  # enough decoding that the helper holds the shard a while
        write_image(root / "c" / f"{i:03d}.jpg", size=(256, 256), seed=i)
    store = tmp_path / "s.h5"
    pack(root, store, PackOptions(backend="hdf5", seed=0, workers=2))
    shard = (store / read_manifest(store).shards[0].file).resolve()
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1  # a changed shard: verify reads it in a helper process
    shard.write_bytes(data)

    for _ in range(3):  # a fast machine may finish reading before the helper is seen
        inspect = subprocess.Popen(
            [sys.executable, "-m", "packer", "inspect", str(store), "--verify"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        helper = None
        while inspect.poll() is None and helper is None:
            helper = next((c for c in child_pids(inspect.pid) if _holds(c, shard)), None)
        if helper is None:
            continue
        # The helper has opened the shard, so it is past its start-up: frozen, it cannot
        # notice anything itself; only the kernel can end it.
        os.kill(helper, signal.SIGSTOP)
        inspect.kill()
        inspect.wait()
        deadline = time.monotonic() + 10
        while process_alive(helper) and time.monotonic() < deadline:
            time.sleep(0.05)
        survived = process_alive(helper)
        if survived:
            os.kill(helper, signal.SIGKILL)
        assert not survived, "the helper outlived its inspect"
        return
    pytest.fail("never saw verify's helper process holding the shard")
