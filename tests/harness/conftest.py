"""Fixtures of the harness tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Trainers and rollouts of one test module (`Env` of test_invariance.py), closed after it; the tiny
    base model lives in the session's cache (tests/conftest.py), so every module builds it once."""
    from tests.harness.test_invariance import Env  # at fixture time, after pytest has collected the module

    shared = Env(tmp_path_factory.mktemp("runs"))
    yield shared
    for t in shared.trainers.values():
        t.close()
