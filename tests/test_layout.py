"""The package's floors: a module imports only its own family or the floors below, and no import cycle
exists, counting imports inside functions (which hide cycles from Python but not from a reader)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "predictor"

# Lowest first. A family may import any family on a lower floor, never one above.
FLOORS: list[set[str]] = [
    {"config", "errors", "text"},
    # Renders our kustomize tree for tools/ and `simulate`; needs nothing above the core.
    {"deploy"},
    {"observability"},
    {"storage"},
    # HTML pages of compare's and simulate's reports; writes through storage's atomic files.
    {"report"},
    {"audio"},
    {"engine"},
    {"artifact"},
    {"shadow"},
    {"serving"},
    {"events"},
    {"api"},
    {"simulate"},
    {"server", "cli", "__main__"},
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every predictor module this file imports, at any depth of the file (functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("predictor.")}
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and (node.module == "predictor" or node.module.startswith("predictor."))
        ):
            # `from predictor.audio import codecs` imports a module, `from predictor.errors import X`
            # a name: both candidates are kept and _graph resolves each to the module that exists.
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in _imports(path):
            # `from predictor.audio import codecs` names a module; `from predictor.x import f` a name.
            while imported not in modules and "." in imported:
                imported = imported.rsplit(".", 1)[0]
            if imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def _family(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "predictor"


def _floor(module: str) -> int:
    family = _family(module)
    if family == "predictor":  # the package's own __init__: a docstring
        return 0
    for floor, families in enumerate(FLOORS):
        if family in families:
            return floor
    raise AssertionError(f"{module}: family {family!r} is on no floor; add it to FLOORS")


def test_every_module_sits_on_a_known_floor():
    for module in _graph():
        _floor(module)


def test_no_module_imports_a_higher_floor():
    graph = _graph()

    upward = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if _floor(target) > _floor(module)
    )

    assert upward == []


def test_no_import_cycles_counting_function_level_imports():
    graph = _graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])

    assert cycles == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: _module_name(p))
def test_every_module_opens_with_a_docstring_saying_what_it_owns(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))

    doc = ast.get_docstring(tree)

    assert doc and len(doc.split()) >= 4, f"{path.relative_to(PACKAGE.parent)} needs an opening docstring"
