"""`harness bench --only learner`: the learner's default path against the update plan's fast path, in one
process on the same rollout batch (docs/benchmarks.md#learner).

One rollout of `cfg` (update 1) is sampled once; then the update runs on that batch from the same start
weights and a fresh optimizer, the two sides interleaved `repeats` times: `plain` under the default plan
(every pass recomputed) and `plan` under `train.learner` as `fast` sets it. Reported per side: the median
wall and process-CPU seconds of the update and of its behaviour + reference passes, the learner's share of
rollout + update (the rollout measured once), trained tokens per second; and the ratios plan / plain.
The two sides' loss and gradient norm are printed beside them: they agree to float rounding, which is
what the fast path is allowed to change (tests/harness/rl/test_plan.py holds the equality tests).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

from harness.bench.real import load_average
from harness.bench.timing import NullLogger
from harness.config.loading import validate_run_config
from harness.config.schema import RunConfig
from harness.rl.plan import DEFAULT_PLAN, make_plan
from harness.rl.turns import turn_budget_at
from harness.rl.update import make_optimizer, run_update

FAST = {"behaviour": "sampler"}  # the plan side's train.learner


def _params(policy) -> list[torch.Tensor]:
    return policy.actor_parameters() + policy.critic_parameters()


def _timed(policy, cfg, batch, plan, start: dict[str, torch.Tensor]) -> dict:
    """One update on `batch` from the weights `start` with a fresh optimizer: its seconds and metrics."""
    with torch.no_grad():
        for p, (_, w) in zip(_params(policy), start.items()):
            p.copy_(w)
    optimizer = make_optimizer(policy, cfg)
    split: dict[str, float] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    metrics = run_update(policy, optimizer, batch, cfg, torch.Generator().manual_seed(0), split, plan)
    return {
        "update_s": time.perf_counter() - t0,
        "update_cpu_s": time.process_time() - c0,
        "passes_s": split["logprobs_s"],
        "passes_cpu_s": split["logprobs_cpu_s"],
        "loss_total": metrics["loss/total"],
        "grad_norm": metrics["diag/grad_norm"],
    }


def bench_learner(cfg: RunConfig, repeats: int = 3, fast: dict | None = None) -> dict:
    """The two sides on one rollout batch of `cfg` (module docstring)."""
    from harness.rl.trainer import Trainer

    d = cfg.model_dump(mode="json")
    d["train"].update({"eval_every": 0, "mi_every": 0, "learner": {**d["train"]["learner"], **(fast or FAST)}})
    d["rollout"].update({"concurrent": False})
    fast_cfg = validate_run_config(d, "bench learner")
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(fast_cfg, Path(tmp), NullLogger())
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            rollout = trainer.worker.rollout(1, turn_budget_at(0, fast_cfg.turns))
            rollout_s, rollout_cpu_s = time.perf_counter() - t0, time.process_time() - c0
            kept = [e for e in rollout.kept if e.steps and e.env_error is None]
            batch = trainer.learner.training_batch(kept)
            policy = trainer.policy
            start = {str(i): p.detach().clone() for i, p in enumerate(_params(policy))}
            plans = {"plain": DEFAULT_PLAN, "plan": make_plan(fast_cfg, 1, batch)}
            runs: dict[str, list[dict]] = {side: [] for side in plans}
            for _ in range(repeats + 1):  # the first round warms kernels and the allocator: left out
                for side, plan in plans.items():
                    runs[side].append(_timed(policy, fast_cfg, batch, plan, start))
        finally:
            trainer.close()
    out: dict = {
        "model": cfg.model.name,
        "env": cfg.env.name,
        "threads": torch.get_num_threads(),
        "load_average": load_average(),
        "repeats": repeats,
        "rollout_s": rollout_s,
        "rollout_cpu_s": rollout_cpu_s,
        "train_tokens": int(batch.attention_mask.sum()),
        "trained_tokens": int(batch.loss_mask.sum()),
        "plan_passes": {"behaviour": plans["plan"].behaviour, "reference": plans["plan"].reference},
    }
    for side, rows in runs.items():
        timed = rows[1:]
        med = {k: statistics.median(r[k] for r in timed) for k in timed[0] if k.endswith("_s")}
        med["learner_share"] = med["update_s"] / (med["update_s"] + rollout_s)
        med["train_tokens_per_s"] = out["train_tokens"] / med["update_s"]
        med["update_s_per_repeat"] = [r["update_s"] for r in timed]
        med["loss_total"], med["grad_norm"] = timed[-1]["loss_total"], timed[-1]["grad_norm"]
        out[side] = med
    for k in ("update_s", "update_cpu_s", "passes_s"):
        out[f"{k}_ratio"] = out["plan"][k] / out["plain"][k]
    return out
