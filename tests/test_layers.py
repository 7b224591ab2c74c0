"""The package layering: imports only go downward, each harness layer imports only the other packages
it is allowed, and no module imports itself through a cycle.

Read from the source with `ast` (every import statement, function-local ones included, and every module
named by a "package.module:attribute" string, the form in which the code names what it imports at run
time, such as the trainer), so a hidden upward import or cycle fails here before it confuses a reader.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# harness/ subpackages, top to bottom: a module may import its own layer and the layers below, so every
# layer may import harness.store, the bottom one.
HARNESS_LAYERS = ["cli", "bench", "experiments", "rl", "diagnostics", "model", "transcript", "config", "store"]
# What each harness layer may import from the other top-level packages (a package, or one module of it).
LAYER_IMPORTS: dict[str, set[str]] = {
    # `harness axes` and `harness envs` print the registries; the table / plot / report commands
    "cli": {"algorithms", "envs", "analysis"},
    # rollout and sandbox benchmarks step the environments
    "bench": {"envs"},
    # task sets of `harness eval` and of sweeps (env registry); the optional fields of eval_tasks.jsonl;
    # the per-task scores and the verdict rule that decide the looks of a sweep with a seed budget
    "experiments": {"envs", "analysis.tasks", "analysis.sequential"},
    # the math of every axis; the environments it trains on
    "rl": {"algorithms", "envs"},
    "diagnostics": set(),
    "model": set(),
    # the Registry type of the context policies
    "transcript": {"algorithms.registry"},
    # validation: axis registries, presets, the params dataclasses and the algorithms' own checks;
    # env.name and env.options against the environment registry
    "config": {"algorithms", "envs"},
    # imported by analysis: nothing first-party outside itself
    "store": set(),
}
# Top-level packages, and what each may import besides itself: a first-party package, or one
# package inside one (analysis reads results through the results-folder owner, harness.store,
# and through nothing else of harness). harness: the union of its layers' allowances.
PACKAGE_IMPORTS = {
    "harness": set().union(*LAYER_IMPORTS.values()),
    "analysis": {"harness.store"},
    "envs": {"algorithms"},
    "algorithms": set(),
}
# The results-folder owner, which analysis imports, imports nothing first-party outside itself.
STORE = "harness.store"
# A string naming a module the code imports at run time: "harness.rl.trainer:train".
STRING_IMPORT = re.compile(r"(?:" + "|".join(PACKAGE_IMPORTS) + r")(?:\.\w+)+:\w+")


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


def _string_imports(tree: ast.AST) -> list[str]:
    """Modules named by "pkg.module:attr" strings (a whole string constant, not a sentence quoting one)."""
    return [
        node.value.partition(":")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and STRING_IMPORT.fullmatch(node.value)
    ]


def _imports_in(name: str, source: str, is_package: bool) -> set[str]:
    """First-party modules the module `name` with `source` imports (resolved to modules we have)."""
    tree = ast.parse(source)
    package = name if is_package else name.rpartition(".")[0]
    targets: list[str] = _string_imports(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets += [base] + [f"{base}.{a.name}" for a in node.names]
    found: set[str] = set()
    for t in targets:
        while t and t not in MODULES:
            t = t.rpartition(".")[0]
        if t and t.split(".")[0] in PACKAGE_IMPORTS and t != name:
            found.add(t)
    return found


GRAPH = {name: _imports_in(name, path.read_text(), path.name == "__init__.py") for name, path in MODULES.items()}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "harness" or len(parts) < 2 or parts[1] not in HARNESS_LAYERS:
        return None
    return HARNESS_LAYERS.index(parts[1])


def test_every_harness_module_sits_in_a_layer():
    loose = [m for m in MODULES if m.startswith("harness.") and _layer(m) is None and m != "harness.__main__"]
    assert not loose, f"modules outside the harness/ layers {HARNESS_LAYERS}: {loose}"


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{m} -> {t}"
        for m, targets in graph.items()
        for t in targets
        if _layer(m) is not None and _layer(t) is not None and _layer(t) < _layer(m)
    ]


def test_harness_imports_only_go_downward():
    upward = _upward(GRAPH)
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


def test_every_harness_layer_has_an_allowance():
    assert sorted(LAYER_IMPORTS) == sorted(HARNESS_LAYERS)


@pytest.mark.parametrize("layer", HARNESS_LAYERS)
def test_each_harness_layer_imports_only_its_allowance(layer):
    """Besides harness itself, a layer imports only what LAYER_IMPORTS grants it."""
    allowed = LAYER_IMPORTS[layer] | {"harness"}
    bad = _forbidden(GRAPH, f"harness.{layer}", allowed)
    assert not bad, f"harness.{layer} may import, outside harness, only {sorted(LAYER_IMPORTS[layer])}:\n" + "\n".join(
        bad
    )


def test_harness_modules_outside_the_layers_import_nothing_but_harness():
    bad = [
        f"{m} -> {t}"
        for m, targets in GRAPH.items()
        if _within(m, {"harness"}) and _layer(m) is None
        for t in targets
        if not _within(t, {"harness"})
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("layer", [layer for layer in HARNESS_LAYERS if LAYER_IMPORTS[layer]])
def test_every_layer_allowance_is_used(layer):
    """The table says what the code does: an allowance no module uses is taken out of it."""
    used = {t for m, targets in GRAPH.items() if _within(m, {f"harness.{layer}"}) for t in targets}
    unused = [a for a in sorted(LAYER_IMPORTS[layer]) if not any(_within(t, {a}) for t in used)]
    assert not unused, f"harness.{layer} is allowed {unused} but imports nothing of it: remove it from LAYER_IMPORTS"


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


def test_the_layer_check_catches_an_import_outside_the_allowance():
    graph = {
        "harness.model.a": {"algorithms.types", "harness.config.schema"},
        "harness.transcript.b": {"algorithms.registry", "algorithms.utils"},
    }
    assert _forbidden(graph, "harness.model", LAYER_IMPORTS["model"] | {"harness"}) == [
        "harness.model.a -> algorithms.types"
    ]
    assert _forbidden(graph, "harness.transcript", LAYER_IMPORTS["transcript"] | {"harness"}) == [
        "harness.transcript.b -> algorithms.utils"
    ]


def test_string_loaded_modules_are_imports():
    """The trainer is loaded by name ("harness.rl.trainer:train"): such strings count as imports, so an
    upward one fails the layering check like an import statement would."""
    assert "harness.rl.trainer" in GRAPH["harness.experiments.point"]
    source = (
        'TRAIN = "harness.experiments.point:run_point"\n'
        'def load(spec="harness.cli.main:main"):\n'
        "    return spec\n"
        'DOC = "not an import: harness.rl.trainer:train, in a sentence"\n'
    )
    found = _imports_in("harness.rl.fake", source, is_package=False)
    assert found == {"harness.experiments.point", "harness.cli.main"}
    assert sorted(_upward({"harness.rl.fake": found})) == [
        "harness.rl.fake -> harness.cli.main",
        "harness.rl.fake -> harness.experiments.point",
    ]


def test_string_loaded_modules_exist():
    """A module named by a string resolves to a module of the repository (a typo would escape the checks)."""
    missing = [
        f"{name}: {target!r}"
        for name, path in MODULES.items()
        for target in _string_imports(ast.parse(path.read_text()))
        if target not in MODULES
    ]
    assert not missing, "string imports of modules that do not exist:\n" + "\n".join(missing)


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
