"""Fixtures of the harness tests."""

from __future__ import annotations

import pytest

from tests.helpers.rollout import tiny_chat
from tests.helpers.update import Env


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Trainers and rollouts of one test module (tests.helpers.update.Env), closed after it; the tiny
    base model lives in the session's cache (tests/conftest.py), so every module builds it once."""
    shared = Env(tmp_path_factory.mktemp("runs"))
    yield shared
    shared.close()


@pytest.fixture(scope="module")
def chat():
    """The tiny chat format of the rollout tests (a byte-level BPE trained on a small corpus)."""
    return tiny_chat()
