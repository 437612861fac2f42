"""packer as users install it: the distribution's name, and the install hints for
extras a user lacks.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

from packer import PackOptions, pack
from packer.about import DISTRIBUTION, install_hint

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120)


def test_the_distribution_name_is_written_in_one_place() -> None:
    assert DISTRIBUTION in importlib.metadata.packages_distributions()["packer"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.findall(r'^name = "(.*)"$', pyproject, re.M) == [DISTRIBUTION]


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
    assert last == (
        "ModuleNotFoundError: output='torch' and packer.torch_adapter need PyTorch: "
        f"{install_hint('torch')}"
    )
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


def test_every_install_instruction_names_this_distribution() -> None:
    """`packer` on the package index is another project: no message or document may tell a
    user to install it."""
    files = [ROOT / "Makefile", *ROOT.glob("*.md"), *ROOT.glob("docs/*.md")]
    files += [*ROOT.glob("packer/**/*.py"), *ROOT.glob("scripts/*")]
    wrong = []
    for path in files:
        for command in re.findall(r"pip install [^\n`\"]*", path.read_text(encoding="utf-8")):
            names = [w.strip("'") for w in command.split()[2:] if not w.startswith("-")]
            if any(re.fullmatch(r"packer(\[.*\])?", name) for name in names):
                wrong.append(f"{path.relative_to(ROOT)}: {command}")
    assert not wrong
