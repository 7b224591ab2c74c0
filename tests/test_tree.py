"""The test tree mirrors the source tree, and test modules share code only through tests/helpers and
tests/support (fixtures in conftest.py), never by importing one another."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
TEST_FILES = sorted(p for p in TESTS.rglob("test_*.py") if "helpers" not in p.parts and "support" not in p.parts)
TEST_NAMES = {p.stem for p in TEST_FILES}


def imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def is_test_module(name: str) -> bool:
    parts = name.split(".")
    shared = parts[0] == "tests" and len(parts) > 1 and parts[1] in ("helpers", "support")
    return parts[-1].startswith("test_") or parts[-1] == "conftest" or (parts[0] == "tests" and not shared)


def test_no_test_module_imports_another():
    offenders = {
        str(p.relative_to(REPO)): sorted(m for m in imported_modules(p) if is_test_module(m))
        for p in TEST_FILES + sorted(TESTS.rglob("conftest.py")) + sorted((TESTS / "helpers").glob("*.py"))
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders


def test_the_check_catches_a_test_import(tmp_path):
    bad = tmp_path / "test_bad.py"
    bad.write_text("from test_runner import make_sweep\nimport tests.harness.rl.test_update\n")
    assert {m for m in imported_modules(bad) if is_test_module(m)} == {"test_runner", "tests.harness.rl.test_update"}


def test_every_harness_subpackage_has_its_test_folder():
    subpackages = sorted(p.name for p in (REPO / "harness").iterdir() if (p / "__init__.py").exists())
    missing = [s for s in subpackages if not (TESTS / "harness" / s).is_dir()]
    assert subpackages and not missing, missing


def test_test_module_names_are_unique():
    # pytest imports test modules by basename (rootdir-relative, no __init__.py): a repeated name would clash
    repeated = [name for name, n in Counter(p.stem for p in TEST_FILES).items() if n > 1]
    assert not repeated, repeated
