"""Seeding: deterministic kernels without torch's NaN fill of new tensors (harness/rl/seeding.py)."""

from __future__ import annotations

import pytest
import torch

import harness.rl.seeding as seeding
from tests.helpers.configs import cfg_with
from tests.helpers.configs import train_tiny as run


@pytest.fixture
def restore_torch_flags():
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.utils.deterministic.fill_uninitialized_memory = fill


def test_deterministic_kernels_stay_on_and_new_tensors_are_not_filled(restore_torch_flags):
    torch.utils.deterministic.fill_uninitialized_memory = True
    seeding.seed_everything(0)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory is False


@pytest.mark.parametrize(
    "learner",
    [{}, {"precision": "bfloat16", "shared_prefix": True}],
    ids=["default", "bf16+shared_prefix"],
)
def test_runs_with_and_without_the_nan_fill_write_identical_metrics(
    tmp_path, monkeypatch, restore_torch_flags, learner
):
    """The fill would turn any read of uninitialised memory into NaN; without it such a read would give
    whatever the memory held. Equal metrics with and without it: nothing reads uninitialised memory."""
    cfg = cfg_with(train={"updates": 3, "learner": learner})
    calls = []
    original = seeding.seed_everything

    def with_fill(seed: int, deterministic: bool = True) -> None:
        original(seed, deterministic)
        torch.utils.deterministic.fill_uninitialized_memory = True
        calls.append(seed)

    without, _ = run(cfg, tmp_path / "without")
    monkeypatch.setattr(seeding, "seed_everything", with_fill)
    filled, _ = run(cfg, tmp_path / "filled")
    assert calls, "the run did not start through harness.rl.seeding.start_process"
    assert torch.empty(4).isnan().all()  # the fill was on for that run
    assert filled == without
