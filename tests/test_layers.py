"""The package layering: imports only go downward, and no module imports itself through a cycle.

Read from the source with `ast` (every import statement, function-local ones included), so a
hidden upward import or cycle fails here before it confuses a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# harness/ subpackages, top to bottom: a module may import its own layer and the layers below.
HARNESS_LAYERS = ["cli", "bench", "experiments", "rl", "diagnostics", "model", "transcript", "config", "store"]
# Top-level packages, and what each may import besides itself: a first-party package, or one
# package inside one (analysis reads results through the results-folder owner, harness.store,
# and through nothing else of harness).
PACKAGE_IMPORTS = {
    "harness": {"algorithms", "envs", "analysis"},
    "analysis": {"harness.store"},
    "envs": {"algorithms"},
    "algorithms": set(),
}
# The results-folder owner, which analysis imports, imports nothing first-party outside itself.
STORE = "harness.store"


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGE_IMPORTS:
        for path in sorted((REPO / pkg).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """First-party modules `name` imports anywhere in its source (resolved to modules we have)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t.split(".")[0] in PACKAGE_IMPORTS and t != name:
                found.add(t)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "harness" or len(parts) < 2 or parts[1] not in HARNESS_LAYERS:
        return None
    return HARNESS_LAYERS.index(parts[1])


def test_every_harness_module_sits_in_a_layer():
    loose = [m for m in MODULES if m.startswith("harness.") and _layer(m) is None and m != "harness.__main__"]
    assert not loose, f"modules outside the harness/ layers {HARNESS_LAYERS}: {loose}"


def test_harness_imports_only_go_downward():
    upward = [
        f"{m} -> {t}"
        for m, targets in GRAPH.items()
        for t in targets
        if _layer(m) is not None and _layer(t) is not None and _layer(t) < _layer(m)
    ]
    assert not upward, (
        "upward imports (layers top to bottom: " + " > ".join(HARNESS_LAYERS) + "):\n" + "\n".join(upward)
    )


def _within(module: str, names: set[str]) -> bool:
    """`module` is one of `names` or inside one of them (a package)."""
    return any(module == n or module.startswith(n + ".") for n in names)


def _forbidden(graph: dict[str, set[str]], package: str, allowed: set[str]) -> list[str]:
    """The imports of `package`'s modules that leave `package` and `allowed`."""
    return [
        f"{m} -> {t}"
        for m, targets in graph.items()
        if _within(m, {package})
        for t in targets
        if not _within(t, allowed | {package})
    ]


@pytest.mark.parametrize("package", sorted(PACKAGE_IMPORTS))
def test_top_level_packages_import_only_what_they_may(package):
    allowed = PACKAGE_IMPORTS[package]
    bad = _forbidden(GRAPH, package, allowed)
    assert not bad, f"{package} may import only {sorted(allowed | {package})}:\n" + "\n".join(bad)


def test_the_results_store_imports_nothing_first_party_but_itself():
    bad = _forbidden(GRAPH, STORE, set())
    assert not bad, f"{STORE} is imported by analysis and may import no other first-party module:\n" + "\n".join(bad)


def test_the_package_check_allows_analysis_the_store_and_nothing_else_of_harness():
    graph = {
        "analysis.load": {"harness.store", "harness.store.layout", "analysis.cells"},
        "analysis.table": {"harness.config.errors", "harness"},
        "harness.store.files": {"harness.config"},
    }
    assert sorted(_forbidden(graph, "analysis", PACKAGE_IMPORTS["analysis"])) == [
        "analysis.table -> harness",
        "analysis.table -> harness.config.errors",
    ]
    assert _forbidden(graph, STORE, set()) == ["harness.store.files -> harness.config"]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_checks_catch_an_upward_import_and_a_cycle():
    graph = {"harness.model.a": {"harness.rl.b"}, "harness.rl.b": {"harness.model.a"}}
    assert _cycles(graph) == [["harness.model.a", "harness.rl.b"]]
    assert _layer("harness.rl.b") < _layer("harness.model.a")
