"""The command line in a subprocess, with the test environment: the checkout on PYTHONPATH, so the
fake trainers of tests/support resolve by name through the HARNESS_TRAIN_FN hook."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

FAKE_TRAINER = "tests.support.fake_trainer:train"
TUNE_FAKE_TRAINER = "tests.support.tune_fake_trainer:train"


def cli_env(**env: str) -> dict[str, str]:
    """This process's environment, PYTHONPATH = the checkout, then `env`."""
    return {**os.environ, "PYTHONPATH": str(REPO), **env}


def harness_cli(*args: str, cwd: Path = REPO, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """`python -m harness *args` in `cwd` with cli_env(**env); text output captured."""
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        env=cli_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
