"""The two packages' floors: the runtime (predictor) and the offline tools (tts_ops). A module imports
only its own family or the floors below, the runtime imports nothing of the tools, and no import cycle
exists, counting imports inside functions (which hide cycles from Python but not from a reader)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNTIME, OPS = "predictor", "tts_ops"

# Lowest first. A family may import any family on a lower floor of its own package, never one above.
FLOORS: dict[str, list[set[str]]] = {
    # What `serve`, `publish`, `fetch` and `synth` run; the image carries this package alone.
    RUNTIME: [
        {"config", "errors", "text", "ssml", "deferred"},
        {"observability"},
        {"storage"},
        {"audio"},
        {"engine"},
        {"artifact"},
        {"shadow"},
        {"serving"},
        {"events"},
        {"api"},
        {"server", "cli", "__main__"},
    ],
    # May import any of the runtime (compare reads shadow records, manifests checks Settings).
    OPS: [
        # Our kustomize tree rendered; the HTML page that compare's and simulate's reports share.
        {"kustomize", "report_page"},
        # mirroring: Istio's Envoy route for our VirtualService (the shadow tests' data plane).
        {"compare", "simulate", "manifests", "image", "mirroring"},
        # Pods of the image run with the manifests' settings.
        {"podrun"},
        {"cli", "__main__"},
    ],
}


def _files() -> list[Path]:
    return sorted(p for package in FLOORS for p in (ROOT / package).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    return module.split(".")[0]


def _ours(name: str) -> bool:
    return _package(name) in FLOORS


def _imports(path: Path) -> set[str]:
    """Every module of either package this file imports, at any depth of the file (functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if _ours(a.name)}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _ours(node.module):
            # `from predictor.audio import codecs` imports a module, `from predictor.errors import X`
            # a name: both candidates are kept and _graph resolves each to the module that exists.
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in _files()}
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
    return parts[1] if len(parts) > 1 else parts[0]


def _floor(module: str) -> int:
    package, family = _package(module), _family(module)
    if family == package:  # the package's own __init__: a docstring
        return 0
    for floor, families in enumerate(FLOORS[package]):
        if family in families:
            return floor
    raise AssertionError(f"{module}: family {family!r} is on no floor of {package}; add it to FLOORS")


def test_both_packages_have_modules():
    packages = {_package(m) for m in _graph()}

    assert packages == {RUNTIME, OPS}


def test_every_module_sits_on_a_known_floor():
    for module in _graph():
        _floor(module)


def test_no_module_imports_a_higher_floor_of_its_package():
    graph = _graph()

    upward = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if _package(target) == _package(module) and _floor(target) > _floor(module)
    )

    assert upward == []


def test_the_runtime_imports_nothing_of_the_offline_tools():
    graph = _graph()

    into_ops = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if _package(module) == RUNTIME and _package(target) == OPS
    )

    assert into_ops == []


def test_the_runtime_names_the_offline_tools_in_no_import_string():
    # importlib.import_module("tts_ops...") or __import__ would dodge the AST check above.
    dynamic = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / RUNTIME).rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value == OPS or node.value.startswith(OPS + "."))
    )

    assert dynamic == []


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


@pytest.mark.parametrize("path", _files(), ids=lambda p: _module_name(p))
def test_every_module_opens_with_a_docstring_saying_what_it_owns(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))

    doc = ast.get_docstring(tree)

    assert doc and len(doc.split()) >= 4, f"{path.relative_to(ROOT)} needs an opening docstring"
