"""Fixtures of the analysis tests (the builders are in synthetic.py)."""

from pathlib import Path

import pytest
from synthetic import make_clip_sweep


@pytest.fixture
def clip_sweep(tmp_path: Path) -> Path:
    """3 clip levels x 3 seeds, one failed point; see synthetic.make_clip_sweep."""
    return make_clip_sweep(tmp_path / "clip")
