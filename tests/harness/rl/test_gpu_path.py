"""The trainer on the GPU path: the static engine in a training run, and (on a GPU) CUDA with
bf16 parameters, activation checkpointing and CUDA graphs."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import REPO  # noqa: E402
from tests.helpers.configs import cfg_with
from tests.helpers.configs import train_tiny as run


def test_static_backend_trains_like_the_default(tmp_path):
    """Two updates with rollout.backend static sample the same episodes as the default engine
    (same rewards, tokens and successes) and give the same losses up to float rounding."""
    hf, _ = run(cfg_with(train={"updates": 2, "eval_every": 2}), tmp_path / "hf")
    st, _ = run(cfg_with(train={"updates": 2, "eval_every": 2}, rollout={"backend": "static"}), tmp_path / "st")
    assert len(hf) == len(st) == 3 and "env/success" in hf[1] and "eval_greedy/success" in hf[2]
    for a, b in zip(hf, st):
        for key in ("env/success", "env/return", "perf/rollout_tokens", "eval_greedy/success", "eval_sampled/success"):
            assert a.get(key) == b.get(key), key
        for key in ("loss/policy", "diag/kl_k3", "diag/entropy"):
            if key in a:
                assert math.isclose(a[key], b[key], rel_tol=1e-3, abs_tol=1e-5), (key, a[key], b[key])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["hf", "static"])
def test_trainer_on_cuda_in_bf16_with_checkpointing(tmp_path, backend):
    cfg = cfg_with(
        model={"dtype": "bfloat16", "gradient_checkpointing": True},
        rollout={"backend": backend},
        train={"device": "cuda", "updates": 2, "eval_every": 2, "threads": 0},
    )
    rows, summary = run(cfg, tmp_path / backend)
    assert [r["update"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        for key in ("loss/policy", "diag/grad_norm", "diag/kl_k3"):
            assert math.isfinite(r[key]), (key, r[key])
    assert summary.get("status", "done") != "failed"


RECIPES = [
    "frozenlake",
    "sokoban",
    *(pytest.param(e, marks=pytest.mark.slow) for e in ("tooluse", "textworld", "alfworld")),
]


@pytest.mark.parametrize("env", RECIPES)
def test_gpu_recipes_run_with_a_local_model_folder(tmp_path, env):
    """The Qwen2.5 recipes (configs/qwen05b_*.yaml) run end to end through the pretrained-model
    path (a local folder), LoRA on every projection, activation checkpointing and the static
    engine; here on CPU, float32, with the tiny model's folder standing in for Qwen2.5 and one
    small update (the recipes' own sizes need a GPU)."""
    from harness.config.loading import load_run_config
    from harness.model.cache import cache_dir
    from harness.model.tiny import tiny_base
    from harness.rl.demos import Demonstrations

    folder, _ = tiny_base(cfg_with(), cache_dir(), Demonstrations.of(cfg_with()))
    overrides = {
        "model.name": str(folder),
        "model.dtype": "float32",
        "train.device": "cpu",
        "train.threads": 1,
        "train.updates": 1,
        "train.eval_episodes": 4,
        "env.heldout_tasks": 4,
        "rollout.tasks_per_update": 2,
        "rollout.group_size": 2,
        "tracking.mlflow": False,
    }
    if env in ("textworld", "alfworld"):  # the stand-in's byte-level tokenizer spells long commands in more tokens
        overrides["rollout.max_new_tokens"] = 64
    cfg = load_run_config(REPO / "configs" / f"qwen05b_{env}.yaml", [f"{k}={v}" for k, v in overrides.items()])
    assert cfg.rollout.backend == "static" and cfg.model.gradient_checkpointing and cfg.model.dtype == "float32"
    rows, _ = run(cfg, tmp_path / env)
    assert [r["update"] for r in rows] == [0, 1] and math.isfinite(rows[1]["loss/policy"])
