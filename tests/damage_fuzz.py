"""Seeded damage to real store shards, each case checked by `verify_store` and both readers.

Used by tests/test_damage_fuzz.py (a few hundred cases in `make test`, thousands under
`make test-slow`). Cases run in helper processes, several cases each, which the runner kills
once a case takes longer than its deadline (a hang) and replaces when one dies (a crash);
each helper works on its own copy of the stores and puts a shard's bytes back after each
case. What a case must show:

- verify: not ok, and a problem names the damaged shard file;
- the reader (``Store.indexed_records``, every record, checksums on) and an epoch of
  ``open_reader``: a PackerError of one line, or exactly the payloads (pixels) the intact
  store gives: the damage hit bytes nothing reads (free pages, padding), or a record's labels
  or path, which its CRC-32 does not cover (counted: not promised);
- within the deadline, and without the helper dying.

Run alone: ``python tests/damage_fuzz.py CASES.json STORES_DIR`` (a helper).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

KINDS = ("flip", "zero", "truncate")


@dataclass(frozen=True)
class Case:
    store: str  # folder name of the store under the stores' folder
    shard: str  # shard file name
    kind: str  # flip: one bit; zero: ``length`` bytes from ``offset``; truncate: to ``offset``
    offset: int
    length: int  # flip: the bit; zero: how many bytes


def make_cases(stores: Path, count: int, seed: int) -> list[Case]:
    """``count`` damages spread over every shard of every store under ``stores``: a third of
    the offsets anywhere in the file, a third in its first 8 KB, a third in its last 8 KB
    (where LMDB's meta pages and HDF5's superblock and object headers, and HDF5's small
    columns, lie)."""
    rng = random.Random(seed)
    shards = sorted(
        (store.name, shard.name, shard.read_bytes())
        for store in stores.iterdir()
        for shard in store.glob("shard-*")
    )
    cases = []
    for i in range(count):
        store, shard, data = shards[i % len(shards)]
        kind = KINDS[rng.randrange(len(KINDS))]
        while True:  # until the damage changes something: zeros over zeros do not
            region = rng.randrange(3)
            size = len(data)
            low, high = [(0, size), (0, min(size, 8192)), (max(0, size - 8192), size)][region]
            offset = rng.randrange(low, high)
            length = rng.randrange(8) if kind == "flip" else rng.choice([1, 8, 512, 4096])
            if kind != "zero" or any(data[offset : offset + length]):
                break
        cases.append(Case(store, shard, kind, offset, length))
    return cases


def run_cases(cases: list[Case], stores: Path, lanes: int, deadline: float) -> list[dict[str, Any]]:
    """Each case's outcome (see ``_check``), ``lanes`` helpers at a time; a case that runs
    past ``deadline`` seconds is "hang", one whose helper dies is "crash"."""
    outcomes: list[dict[str, Any] | None] = [None] * len(cases)
    pending = list(range(len(cases)))[::-1]
    helpers = itertools.count()
    with tempfile.TemporaryDirectory(prefix="packer-fuzz-") as work:
        runners: list[_Helper] = []
        while pending or runners:
            while pending and len(runners) < lanes:
                batch = [pending.pop() for _ in range(min(len(pending), 40))]
                runners.append(_Helper(batch, cases, stores, Path(work) / str(next(helpers))))
            for runner in list(runners):
                for index, outcome in runner.collect(deadline):
                    outcomes[index] = outcome
                if runner.finished:
                    pending.extend(runner.unrun[::-1])
                    runners.remove(runner)
    return [o if o is not None else {"result": "lost", "verify": None} for o in outcomes]


class _Helper:
    """One helper process running a batch of cases, read one line per case."""

    def __init__(self, batch: list[int], cases: list[Case], stores: Path, work: Path) -> None:
        work.mkdir(parents=True)
        spec = work / "cases.json"
        spec.write_text(json.dumps([[i, asdict(cases[i])] for i in batch]))
        shutil.copytree(stores, work / "stores")
        self.unrun = list(batch)
        self.finished = False
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(spec), str(work / "stores")],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,  # unbuffered: a line read leaves no other in a buffer select cannot see
        )
        self._selector = selectors.DefaultSelector()
        assert self.process.stdout is not None
        self._selector.register(self.process.stdout, selectors.EVENT_READ)
        self._since = time.monotonic()
        self._verified: str | None = None  # verify's finding on the case in hand, once made

    def collect(self, deadline: float) -> list[tuple[int, dict[str, Any]]]:
        """Outcomes ready now (waiting a little); ends the helper on a hang or a death."""
        assert self.process.stdout is not None
        got = []
        if self._selector.select(timeout=0.05):
            line = self.process.stdout.readline()
            if line:
                index, outcome = json.loads(line)
                self._since = time.monotonic()
                if "result" not in outcome:  # verify's part: the readers' is to come
                    self._verified = outcome["verify"]
                    return got
                got.append((index, {**outcome, "verify": self._verified}))
                self.unrun.remove(index)
                self._verified = None
            else:  # end of output: done, or died in the case it was on
                code = self.process.wait()
                if self.unrun:
                    crash = {"result": "crash", "code": code, "verify": self._verified}
                    got.append((self.unrun.pop(0), crash))
                self._stop()
        elif time.monotonic() - self._since > deadline:
            got.append((self.unrun.pop(0), {"result": "hang", "verify": self._verified}))
            self.process.kill()
            self.process.wait()
            self._stop()
        return got

    def _stop(self) -> None:
        self._selector.close()
        assert self.process.stdout is not None
        self.process.stdout.close()
        self.finished = True


def verdict(case: Case, outcome: dict[str, Any]) -> str | None:
    """What is wrong with a case's outcome, or None. A reader process killed by LMDB itself
    (SIGABRT, SIGBUS, SIGSEGV) after verify named the shard is LMDB's known limit: its pages
    carry no checksums, and some damaged ones make it abort or fault; counted, not failed."""
    if outcome["verify"] != "names the shard":
        return f"verify: {outcome['verify']} ({outcome.get('result')})"
    if outcome["result"] == "crash" and case.store.startswith("lmdb") and outcome["code"] < 0:
        return None
    if outcome["result"] != "done":
        return outcome["result"]
    for reader in ("records", "epoch"):
        if outcome[reader] not in ("same", "packer error", "other labels or path"):
            return f"{reader}: {outcome[reader]}"
    return None


def summary(cases: list[Case], outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts for the reliability page: cases by kind and store, what verify and the readers
    (records / epoch) made of them."""
    done = [o for o in outcomes if o.get("result") == "done"]
    return {
        "cases": len(cases),
        "by_kind": dict(Counter(c.kind for c in cases)),
        "by_store": dict(Counter(c.store for c in cases)),
        "verify": dict(Counter(o.get("verify") for o in outcomes)),
        "readers": dict(Counter(f"{o['records']} / {o['epoch']}" for o in done)),
        "reader crashes": dict(
            Counter(
                f"{c.store} {o['code']}" for c, o in zip(cases, outcomes) if o["result"] == "crash"
            )
        ),
        "hangs": sum(o["result"] == "hang" for o in outcomes),
        "failures": sum(verdict(c, o) is not None for c, o in zip(cases, outcomes)),
    }


# ---- the helper process ------------------------------------------------------------------


def _damage(file: Path, case: Case) -> None:
    data = bytearray(file.read_bytes())
    if case.kind == "flip":
        data[case.offset] ^= 1 << case.length
    elif case.kind == "zero":
        end = min(len(data), case.offset + case.length)
        data[case.offset : end] = bytes(end - case.offset)
    else:
        del data[case.offset :]
    file.write_bytes(bytes(data))


def _records_digest(store: Path) -> tuple[str, str]:
    """Digests of every record's payload, and of every record's labels and path."""
    from packer.store.access import open_store

    payloads, meta = hashlib.sha256(), hashlib.sha256()
    with open_store(store) as opened:
        for i, record in opened.indexed_records():
            payloads.update(b"%d:" % i + bytes(record.data))
            meta.update(repr((i, record.labels, record.path)).encode())
    return payloads.hexdigest(), meta.hexdigest()


def _epoch_digest(store: Path) -> tuple[str, str]:
    """Digests of one epoch's images, and of its labels."""
    from packer import open_reader

    images, labels = hashlib.sha256(), hashlib.sha256()
    with open_reader(store, batch_size=8, seed=0, workers=1) as reader:
        for batch, batch_labels in reader.epoch(0):
            for image in batch:  # an array of images of one shape, or a list of them
                images.update(image.tobytes())
            labels.update(batch_labels.tobytes())
    return images.hexdigest(), labels.hexdigest()


def _read(read: Any, store: Path, reference: tuple[str, str]) -> str:
    """ "packer error", "same", "other labels or path" (a damage the payload CRCs do not
    cover), or what is wrong: "WRONG" payloads or pixels, a raw exception."""
    from packer.errors import PackerError

    try:
        payloads, meta = read(store)
    except PackerError as e:
        lines = len(str(e).splitlines())
        return "packer error" if lines == 1 else f"error of {lines} lines"
    except Exception as e:  # noqa: BLE001 - any other exception is what the fuzz looks for
        return f"raw {type(e).__name__}: {e}"
    if payloads != reference[0]:
        return "WRONG"
    return "same" if meta == reference[1] else "other labels or path"


def _verify(store: Path, case: Case) -> str:
    """What `inspect --verify` makes of the damage: its report, or the one-line error it
    stops with (a manifest the shard files contradict)."""
    from packer.errors import PackerError
    from packer.store.verify import verify_store

    try:
        report = verify_store(store, workers=1)
    except PackerError as e:
        named = case.shard in str(e) and "\n" not in str(e)
        return "names the shard" if named else f"does not name it: {e}"
    if any(p.shard == case.shard for p in report.problems):
        return "names the shard"
    return "ok" if report.ok else "does not name it"


def _helper(spec: Path, stores: Path) -> None:
    references: dict[str, dict[str, Any]] = {}
    for index, fields in json.loads(spec.read_text()):
        case = Case(**fields)
        store = stores / case.store
        if case.store not in references:
            references[case.store] = {
                "records": _records_digest(store),
                "epoch": _epoch_digest(store),
            }
        file = store / case.shard
        intact = file.read_bytes()
        try:
            _damage(file, case)
            print(json.dumps([index, {"verify": _verify(store, case)}]), flush=True)
            reference = references[case.store]
            outcome = {
                "result": "done",
                "records": _read(_records_digest, store, reference["records"]),
                "epoch": _read(_epoch_digest, store, reference["epoch"]),
            }
        finally:
            file.write_bytes(intact)
        print(json.dumps([index, outcome]), flush=True)


if __name__ == "__main__":
    _helper(Path(sys.argv[1]), Path(sys.argv[2]))
