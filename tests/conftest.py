"""Test-suite set-up shared by every package's tests.

Everything a test writes goes to a temporary folder: MLflow (sqlite store), the trainer's
content-hashed caches, and HOME (TextWorld and other libraries write under it). The model hub
is never contacted (HF_HUB_OFFLINE=1). HARNESS_TESTING=1 lets tests (and the commands they start)
replace the trainer through HARNESS_TRAIN_FN.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
_TMP = Path(tempfile.mkdtemp(prefix="harness-tests-"))
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)

_home = Path.home()
os.environ.setdefault("HF_HOME", str(_home / ".cache" / "huggingface"))  # keep cached tokenizers visible
os.environ.setdefault("ALFWORLD_DATA", str(_home / ".cache" / "alfworld"))
os.environ["HOME"] = str(_TMP / "home")
(_TMP / "home").mkdir()
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_TMP / 'mlflow.db'}"
os.environ.setdefault("HARNESS_CACHE", str(_TMP / "cache"))
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.pop("HARNESS_TRAIN_FN", None)
os.environ["HARNESS_TESTING"] = "1"  # honour the HARNESS_TRAIN_FN testing hook (harness.experiments.point)
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


try:  # property tests draw the same examples on every run, so CI results do not depend on luck
    from hypothesis import settings as _hsettings

    _hsettings.register_profile("harness", derandomize=True, deadline=None)
    _hsettings.load_profile("harness")
except ImportError:  # pragma: no cover
    pass

# torch threads: the CPU suites run many tiny models; one thread each avoids oversubscription
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: long-running tests (deselected by `make test`)")
    config.addinivalue_line("markers", "gpu: tests that need a CUDA GPU")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT
