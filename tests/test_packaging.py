"""packer as users install and run it: the distribution's name and its one version, `packer
--version`, `python -m packer`, and the install hints for extras a user lacks. The wheel and
sdist themselves are checked by `make dist` and tried installed by `make smoke` (CI runs both).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import h5py
import lmdb
import numpy
import PIL
import pytest
from PIL import features

import packer
from packer import PackerError, PackOptions, pack
from packer.about import DISTRIBUTION, install_hint
from packer.cli import cli
from packer.store.manifest import FORMAT_VERSION

ROOT = Path(__file__).resolve().parents[1]
# The console script pip installed beside this Python, as a user's shell finds it in a venv.
PACKER = Path(sys.executable).parent / "packer"


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120)


def test_one_version_and_the_distribution_name_in_one_place_each() -> None:
    # The installed metadata's version is what the build read from packer.__version__.
    assert importlib.metadata.version(DISTRIBUTION) == packer.__version__
    assert DISTRIBUTION in importlib.metadata.packages_distributions()["packer"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.findall(r'^name = "(.*)"$', pyproject, re.M) == [DISTRIBUTION]
    assert 'version = { attr = "packer.about.__version__" }' in pyproject  # read, not written again
    assert not re.search(r'^version = "', pyproject, re.M)
    # make reinstalls when the version changes: its install stamp hashes the file it is in
    stamp = re.findall(r"^STAMP := .*$", (ROOT / "Makefile").read_text(), re.M)
    assert len(stamp) == 1 and "packer/about.py" in stamp[0]


def test_packer_version_says_which_packer_and_what_it_runs_on() -> None:
    done = run(PACKER, "--version")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # HashiCorp's prints `1.11.2` or `Packer v1.11.2`: ours names itself on the first line.
    assert lines[0] == f"packer (images -> LMDB/HDF5 shards) {DISTRIBUTION} {packer.__version__}"
    jpeg = (
        f"libjpeg-turbo {features.version('libjpeg_turbo')}"
        if features.check_feature("libjpeg_turbo")
        else f"libjpeg {features.version('jpg')}"
    )
    expected = [
        f"lmdb {lmdb.__version__} (liblmdb {'.'.join(map(str, lmdb.version()))})",
        f"h5py {h5py.__version__} (libhdf5 {h5py.version.hdf5_version})",
        f"pillow {PIL.__version__} ({jpeg})",
        f"numpy {numpy.__version__}",
        f"store format {FORMAT_VERSION} written; 1 to {FORMAT_VERSION} read",
    ]
    if importlib.util.find_spec("simplejpeg"):
        expected.append(f"simplejpeg {importlib.metadata.version('simplejpeg')}")
    if importlib.util.find_spec("torch"):
        expected.append(f"torch {importlib.metadata.version('torch')}")
    else:
        assert not any(line.startswith("torch") for line in lines)
    for line in expected:
        assert line in lines, f"{line!r} not in {lines}"

    as_json = json.loads(run(PACKER, "version", "--json").stdout)
    assert as_json["distribution"] == DISTRIBUTION and as_json["packer"] == packer.__version__
    assert as_json["libhdf5"] == h5py.version.hdf5_version
    assert as_json["store_format_writes"] == FORMAT_VERSION
    assert as_json["store_formats_read"] == list(range(1, FORMAT_VERSION + 1))
    assert run(PACKER, "version").stdout == done.stdout


def test_python_dash_m_packer_is_the_packer_command() -> None:
    done = run(sys.executable, "-m", "packer", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: packer ")
    for command in cli.commands:
        assert f"\n  {command} " in done.stdout, command
    assert DISTRIBUTION in done.stdout and "HashiCorp" in done.stdout
    assert (
        run(sys.executable, "-m", "packer", "--version").stdout == run(PACKER, "--version").stdout
    )


# A finder ahead of the others that finds no ``module``: importing it fails as where it is not
# installed (sys.modules[module] = None would leave it looking imported).
_HIDE = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == {module!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Hide())
"""


def _without(module: str, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run in a fresh Python that cannot import ``module``."""
    return run(sys.executable, "-c", _HIDE.format(module=module) + code)


def test_output_torch_without_torch_names_the_extra(image_dir: Path, tmp_path: Path) -> None:
    store = pack(image_dir, tmp_path / "out.lmdb", PackOptions(workers=1)).store
    done = _without(
        "torch",
        f"from packer import open_reader\nopen_reader({str(store)!r}, batch_size=4, output='torch')",
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"ModuleNotFoundError: output='torch' needs PyTorch: {install_hint('torch')}")
    assert install_hint("torch") == "pip install 'packer-image-shards[torch]'"


def test_dask_without_dask_is_one_line_naming_the_extra(image_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.lmdb"
    argv = ["packer", "pack", str(image_dir), str(out), "--dask", "local:1", "-q"]
    done = _without("distributed", f"from packer.cli import main\nsys.argv = {argv!r}\nmain()")
    assert done.returncode == 1
    assert done.stderr == (
        "Error: --dask needs Dask's distributed scheduler: "
        "pip install 'packer-image-shards[dask]'\n"
    )
    assert not out.exists() and list(tmp_path.iterdir()) == [image_dir]


def test_dask_without_dask_is_refused_before_the_scan(image_dir: Path, tmp_path: Path) -> None:
    """The scan of a large folder takes minutes: the missing extra is said before it starts.
    The labels file is broken, so a scan that ran first would fail on it instead."""
    labels = tmp_path / "labels.csv"
    labels.write_text("no,such\ncolumns,here\n")
    code = (
        "from packer import PackOptions, PackerError, pack\n"
        "try:\n"
        f"    pack({str(image_dir)!r}, {str(tmp_path / 'out.lmdb')!r},\n"
        f"         PackOptions(dask='local:1', workers=1, labels={str(labels)!r}))\n"
        "except PackerError as e:\n"
        "    print(e)\n"
    )
    done = _without("distributed", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"--dask needs Dask's distributed scheduler: {install_hint('dask')}\n"
    # Without --dask the same pack fails on the labels: the order above is what the test shows.
    with pytest.raises(PackerError, match="labels.csv"):
        pack(image_dir, tmp_path / "here.lmdb", PackOptions(workers=1, labels=labels))


def test_torch_dataset_without_torch_names_the_extra() -> None:
    done = _without("torch", "from packer.torch_adapter import TorchDataset")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"ModuleNotFoundError: packer.torch_adapter needs PyTorch: {install_hint('torch')}"
    )


def test_every_install_instruction_names_this_distribution() -> None:
    """`packer` on the package index is another project: no message or document may tell a
    user to install it."""
    files = [ROOT / "Makefile", *ROOT.glob("*.md"), *ROOT.glob("docs/*.md")]
    files += [*ROOT.glob("packer/**/*.py"), *ROOT.glob("scripts/*"), *ROOT.glob("benchmarks/*")]
    wrong = []
    for path in files:
        for command in re.findall(r"pip install [^\n`\"]*", path.read_text(encoding="utf-8")):
            names = [w.strip("'") for w in command.split()[2:] if not w.startswith("-")]
            if any(re.fullmatch(r"packer(\[.*\])?", name) for name in names):
                wrong.append(f"{path.relative_to(ROOT)}: {command}")
    assert not wrong


def test_the_changelog_names_this_version_and_format() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert changelog.startswith("# Changelog\n")
    assert f"version {packer.__version__}" in changelog or f"[{packer.__version__}]" in changelog
    assert f"writes format {FORMAT_VERSION}" in changelog
