"""The package's layout: each flow is one folder, and imports run one way (no circles), counting
every import a module makes, lazy ones and those for type checking too."""

from __future__ import annotations

import ast
from pathlib import Path

import packer

ROOT = Path(packer.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every packer module and the packer modules it imports."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from packer.x import y`: y is a module of its own where one is named so
                targets = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t if t in modules else node.module for t in targets]
            else:
                continue
            found.update(t for t in targets if t in modules and t != name)
        graph[name] = found
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the modules round it, or None."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    path: list[str] = []

    def walk(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (found := walk(target)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := walk(module)):
            return found
    return None


def test_no_import_circles() -> None:
    # The package's __init__ imports the public API from every flow, so a module that imported
    # `packer` itself would close a circle through it.
    circle = _circle(_imports())
    assert circle is None, " -> ".join(circle)


def test_the_check_finds_a_circle() -> None:
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None


FLOWS = {"cli", "packing", "reading", "store", "imaging", "inspect"}
# Lower floors never import higher ones: the store knows nothing of packing or reading, and
# nothing but the CLI imports the CLI.
FLOORS = [{"imaging"}, {"store"}, {"packing", "reading"}, {"inspect"}, {"cli"}]


def _flow(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in FLOWS else None


def test_flows_import_downwards() -> None:
    floor = {flow: i for i, flows in enumerate(FLOORS) for flow in flows}
    upward = [
        f"{m} -> {t}"
        for m, targets in _imports().items()
        for t in targets
        if _flow(m) and _flow(t) and _flow(m) != _flow(t) and floor[_flow(t)] >= floor[_flow(m)]
    ]
    assert not upward, upward


def test_each_flow_is_a_folder() -> None:
    top = {p.stem for p in ROOT.glob("*.py")}
    assert {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()} >= FLOWS
    # The top level keeps the public surface and what every flow shares, nothing of one flow.
    assert top == {
        "__init__",
        "__main__",
        "about",
        "arguments",
        "augment",
        "errors",
        "fork_gate",
        "gpu_decode",
        "lifeline",
        "prefetch",
        "recipes",
        "torch_adapter",
    }
