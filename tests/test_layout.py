"""The tree's imports point one way, down: orchestration -> assets -> transforms and windows, and no
module imports one that imports it back, directly or through others. Imports inside functions count:
a late import hides a cycle from Python, not from the reader."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("transforms", "windows", "assets", "orchestration", "examples")
# What each package must never import (the bundled apps, examples/, sit beside the framework: see
# tests/transforms/test_registry.py for what the framework may take from them).
NEVER = {
    "transforms": ("dagster", "assets", "orchestration"),
    "windows": ("dagster", "assets", "orchestration"),
    "assets": ("orchestration",),
}


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
    return names


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Each module's imports of the project's modules (a name resolved to the longest module it names;
    a package's own modules importing the package's parents are not counted), and all its imported names."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges, names = {}, {}
    for module, path in modules.items():
        names[module] = _imported_names(path)
        targets = {resolve(n) for n in names[module]} - {None, module}
        edges[module] = {t for t in targets if not module.startswith(t + ".")}
    return edges, names


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_cycles_and_only_those():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_module_imports_one_that_imports_it_back():
    edges, _ = import_graph()
    assert len(edges) > 50  # the whole tree was read
    assert cycles(edges) == []


def test_each_layer_imports_only_the_layers_below_it():
    _, names = import_graph()
    wrong = {module: sorted(n for n in imported if n.split(".")[0] in NEVER[module.split(".")[0]])
             for module, imported in names.items() if module.split(".")[0] in NEVER}
    assert {m: n for m, n in wrong.items() if n} == {}
