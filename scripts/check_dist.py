"""Check what `make dist` built before anyone installs it: the wheel holds every module of the
package, py.typed, the `packer` entry point, the license and the metadata users rely on; the
sdist holds what builds, documents and tests it. Run by `make dist`, after twine's check.

    python scripts/check_dist.py dist
"""

from __future__ import annotations

import email
import sys
import tarfile
import zipfile
from pathlib import Path

from packer import __version__
from packer.about import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[1]
# Every module and data file of the package, as the checkout has them.
PACKAGE = sorted(
    p.relative_to(ROOT).as_posix()
    for p in (ROOT / "packer").rglob("*")
    if p.suffix in (".py", ".typed") and "__pycache__" not in p.parts
)
SDIST_EXTRA = ["CHANGELOG.md", "LICENSE", "README.md", "pyproject.toml", "docs/install.md"]
SDIST_EXTRA += [
    "tests/conftest.py",
    "tests/helpers.py",
    "scripts/smoke_installed.py",
    "mkdocs.yml",
    "benchmarks/reporting.py",
]
METADATA = {
    "Name": DISTRIBUTION,
    "Version": __version__,
    "License-Expression": "MIT",
    "License-File": "LICENSE",
    "Requires-Python": ">=3.10",
}
CLASSIFIERS = ["Typing :: Typed", "Operating System :: POSIX :: Linux", "Programming Language ::"]


def check_wheel(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        info = f"{DISTRIBUTION.replace('-', '_')}-{__version__}.dist-info"
        required = [
            *PACKAGE,
            *(f"{info}/{n}" for n in ("licenses/LICENSE", "METADATA", "entry_points.txt")),
        ]
        problems = [f"missing {name}" for name in required if name not in names]
        stray = [n for n in names if n not in PACKAGE and not n.startswith(info + "/")]
        problems += [f"not in the checkout's package: {name}" for name in sorted(stray)]
        if problems:
            return problems
        meta = email.message_from_bytes(wheel.read(f"{info}/METADATA"))
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    for field, want in METADATA.items():
        if meta.get(field) != want:
            problems.append(f"METADATA {field} is {meta.get(field)!r}, not {want!r}")
    classifiers = meta.get_all("Classifier") or []
    for want in CLASSIFIERS:
        if not any(c.startswith(want) for c in classifiers):
            problems.append(f"METADATA has no classifier {want!r}")
    if not meta.get_all("Project-URL"):
        problems.append("METADATA has no Project-URL")
    if "packer = packer.cli:main" not in entry_points:
        problems.append("entry_points.txt has no `packer = packer.cli:main`")
    return problems


def check_sdist(path: Path) -> list[str]:
    top = f"{DISTRIBUTION.replace('-', '_')}-{__version__}/"
    with tarfile.open(path) as sdist:
        names = {n.removeprefix(top) for n in sdist.getnames()}
    return [f"missing {name}" for name in PACKAGE + SDIST_EXTRA if name not in names]


def main(dist: Path) -> int:
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        print(f"check_dist: want one wheel and one sdist in {dist}, found {wheels + sdists}")
        return 1
    failed = False
    for path, check in ((wheels[0], check_wheel), (sdists[0], check_sdist)):
        problems = check(path)
        failed |= bool(problems)
        for problem in problems:
            print(f"check_dist: {path.name}: {problem}")
        if not problems:
            print(f"check_dist: {path.name}: OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "dist")))
