"""docs/algorithms.md covers every registered axis value, and its generated list is current."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from algorithms import AXES
from harness.cli.main import GENERATED_BEGIN, GENERATED_END, axes_markdown
from harness.transcript.context import CONTEXT_POLICIES

DOC = Path(__file__).resolve().parents[1] / "docs" / "algorithms.md"
REGISTRIES = {**AXES, "context.policy": CONTEXT_POLICIES}


def _section(axis: str) -> str:
    """The `## N. ...` section of the doc whose heading names `axis` in backticks."""
    text = DOC.read_text()
    for part in re.split(r"(?m)^(?=## )", text):
        if f"`{axis}`" in part.splitlines()[0]:
            return part
    raise AssertionError(f"docs/algorithms.md has no '## ' section whose heading names `{axis}`")


@pytest.mark.parametrize("axis", sorted(REGISTRIES))
def test_every_registered_value_has_an_entry(axis):
    section = _section(axis)
    missing = [name for name in REGISTRIES[axis].names() if f"#### `{name}`" not in section]
    assert not missing, f"docs/algorithms.md, section of `{axis}`: no '#### `name`' entry for {missing}"


def test_generated_value_list_is_current():
    text = DOC.read_text()
    block = text.split(GENERATED_BEGIN, 1)[1].split(GENERATED_END, 1)[0].strip()
    assert block == axes_markdown().strip(), "docs/algorithms.md is stale: run `make docs`"


def test_code_comments_point_inside_the_repository():
    repo = DOC.parents[1]
    offenders = [
        str(p.relative_to(repo))
        for pkg in ("harness", "algorithms", "envs", "analysis", "sweeps", "configs", "docs")
        for p in (repo / pkg).rglob("*")
        if p.suffix in (".py", ".yaml", ".md") and "REFERENCE" in p.read_text()
    ]
    assert not offenders, f"these name a REFERENCE file outside the repository: {offenders}"
