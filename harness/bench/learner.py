"""`harness bench --only learner`: the learner's default path against the update plan's fast path, in one
process on the same rollout batch (docs/benchmarks.md#learner).

One rollout of `cfg` (update 1) is sampled once; then the update runs on that batch from the same start
weights and a fresh optimizer, the sides interleaved `repeats` times: `plain` under the default plan
(every pass recomputed, no shared prefix) and each of `SIDES` under its `train.learner`. Reported per
side: the median wall and process-CPU seconds of the update and of its behaviour + reference passes, the
learner's share of rollout + update (the rollout measured once), tokens per second through the update;
the ratios to `plain`; and each side's loss and gradient norm, which agree to float rounding, all the fast
paths are allowed to change (tests/harness/rl/test_plan.py holds the equality tests).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from harness.bench.real import load_average, matmul_gflops
from harness.bench.timing import NullLogger
from harness.config.errors import ConfigError
from harness.config.loading import validate_run_config
from harness.config.schema import RunConfig
from harness.rl.batch import groups_shared, is_padding_free, shared_impl
from harness.rl.plan import DEFAULT_PLAN, cpu_bf16, make_plan
from harness.rl.turns import turn_budget_at
from harness.rl.update import make_optimizer, run_update

DTYPES = (torch.float32, torch.bfloat16)

# the sides after `plain` (the default plan): their train.learner
SIDES = {
    "sampler": {"behaviour": "sampler"},
    "shared_prefix": {"shared_prefix": True},
    "sampler+shared_prefix": {"behaviour": "sampler", "shared_prefix": True},
    # bfloat16 compute recomputes the behaviour pass in its own precision (the sampler's are float32)
    "bf16": {"precision": "bfloat16"},
    "bf16+shared_prefix": {"precision": "bfloat16", "shared_prefix": True},
    # verl's on-policy shortcut: only where the update is one step (algo.epochs 1, algo.minibatches 1)
    "first_forward": {"behaviour": "first_forward"},
    "bf16+first_forward": {"precision": "bfloat16", "behaviour": "first_forward"},
    "bf16+first_forward+shared_prefix": {"precision": "bfloat16", "behaviour": "first_forward", "shared_prefix": True},
    # the lm_head only where the update reads a log-prob
    "needed": {"logprob_positions": "needed"},
    "bf16+first_forward+needed": {"precision": "bfloat16", "behaviour": "first_forward", "logprob_positions": "needed"},
    "bf16+first_forward+shared_prefix+needed": {
        "precision": "bfloat16",
        "behaviour": "first_forward",
        "shared_prefix": True,
        "logprob_positions": "needed",
    },
    # the shared prefix through a key-value cache (train.learner.prefix_impl), beside the packed sides above
    "shared_prefix_kv": {"shared_prefix": True, "prefix_impl": "kv_cache"},
    "bf16+shared_prefix_kv": {"precision": "bfloat16", "shared_prefix": True, "prefix_impl": "kv_cache"},
    # the packed prefix with its attention computed per segment (train.learner.prefix_impl: segmented)
    "shared_prefix_seg": {"shared_prefix": True, "prefix_impl": "segmented"},
    "bf16+first_forward+shared_prefix_seg+needed": {
        "precision": "bfloat16",
        "behaviour": "first_forward",
        "shared_prefix": True,
        "prefix_impl": "segmented",
        "logprob_positions": "needed",
    },
    # every micro-batch as one packed row, nothing padded (train.learner.padding_free), on the default path and
    # beside the segmented prefix
    "padding_free": {"padding_free": True},
    "needed+padding_free": {"logprob_positions": "needed", "padding_free": True},
    "sampler+shared_prefix_seg+needed+padding_free": {
        "behaviour": "sampler",
        "shared_prefix": True,
        "prefix_impl": "segmented",
        "logprob_positions": "needed",
        "padding_free": True,
    },
    "bf16+first_forward+shared_prefix_kv+needed": {
        "precision": "bfloat16",
        "behaviour": "first_forward",
        "shared_prefix": True,
        "prefix_impl": "kv_cache",
        "logprob_positions": "needed",
    },
}


def run_header(cfg: RunConfig, repeats: int) -> dict:
    """What every in-process comparison reports first: the model, the environment, the threads, the load
    average when it ends and its rounds."""
    return {
        "model": cfg.model.name,
        "env": cfg.env.name,
        "threads": torch.get_num_threads(),
        "load_average": load_average(),
        "repeats": repeats,
    }


def _params(policy) -> list[torch.Tensor]:
    return policy.actor_parameters() + policy.critic_parameters()


def _timed(policy, cfg, batch, plan, start: list[torch.Tensor]) -> dict:
    """One update on `batch` from the weights `start` with a fresh optimizer: its seconds and metrics."""
    with torch.no_grad():
        for p, w in zip(_params(policy), start):
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


def _side_config(cfg: RunConfig, learner: dict) -> RunConfig:
    d = cfg.model_dump(mode="json")
    # every side from the default learner, whatever the config's own train.learner (a recipe's fast path)
    d["train"].update({"eval_every": 0, "mi_every": 0, "learner": learner})
    d["rollout"].update({"concurrent": False})
    return validate_run_config(d, "bench learner")


@contextmanager
def _one_batch(cfg: RunConfig) -> Iterator[tuple]:
    """A trainer of `cfg` and one rollout batch of it (update 1): (policy, batch, rollout seconds, CPU seconds)."""
    from harness.rl.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, Path(tmp), NullLogger())
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            rollout = trainer.worker.rollout(1, turn_budget_at(0, cfg.turns))
            rollout_s, rollout_cpu_s = time.perf_counter() - t0, time.process_time() - c0
            kept = [e for e in rollout.kept if e.steps and e.env_error is None]
            if not kept:
                raise RuntimeError(f"bench learner: the rollout of {cfg.env.name} kept no usable episode to train on")
            yield trainer.policy, trainer.learner.training_batch(kept), rollout_s, rollout_cpu_s
        finally:
            trainer.close()


def bench_weight_casts(cfg: RunConfig, repeats: int = 2) -> dict:
    """The config's own learner path (its train.learner, in bfloat16) with the frozen weights cast once an
    update (harness.model.precision) against autocast casting them at every product, the code before: one
    rollout batch, a warm-up, then `repeats` interleaved rounds; medians and their ratio. The two sides
    must give the same loss and gradient norm bit for bit (`same_numbers`)."""
    from harness.model.precision import autocast_only

    c = _side_config(cfg, cfg.train.learner.model_dump(mode="json"))
    if c.train.learner.precision == "float32":
        raise ValueError("bench weight casts: the config's learner runs in float32; nothing is cast")
    with _one_batch(c) as (policy, batch, rollout_s, _):
        start = [p.detach().clone() for p in _params(policy)]
        plan = make_plan(c, 1, batch)
        runs: dict[str, list[dict]] = {"cached": [], "autocast": []}
        for i in range(repeats + 1):  # round 0 warms kernels and the allocator
            for side in runs:
                with nullcontext() if side == "cached" else autocast_only():
                    r = _timed(policy, c, batch, plan, start)
                if i:
                    runs[side].append(r)
    keys = ("update_s", "update_cpu_s")
    med = {s: {k: statistics.median(r[k] for r in rows) for k in keys} for s, rows in runs.items()}
    return {
        **run_header(cfg, repeats),
        "rollout_s": rollout_s,
        **med,
        "update_s_ratio": med["cached"]["update_s"] / med["autocast"]["update_s"],
        "update_cpu_s_ratio": med["cached"]["update_cpu_s"] / med["autocast"]["update_cpu_s"],
        "learner_share": {s: m["update_s"] / (m["update_s"] + rollout_s) for s, m in med.items()},
        "same_numbers": all(
            (a["loss_total"], a["grad_norm"]) == (b["loss_total"], b["grad_norm"])
            for a, b in zip(runs["cached"], runs["autocast"])
        ),
    }


def bench_learner(cfg: RunConfig, repeats: int = 2, sides: dict | None = None, baseline: str = "plain") -> dict:
    """The sides on one rollout batch of `cfg` (module docstring): one warm-up update of the `baseline`
    side, then `repeats` rounds of every side in turn; ratios against `baseline`. `baseline` is `plain` (the
    default path, always run then) or one of `sides`: where plain costs minutes an update (TextWorld), two
    fast paths can be compared without it."""
    cfgs, refused = ({"plain": _side_config(cfg, {})} if baseline == "plain" else {}), {}
    for side, learner in (sides or SIDES).items():
        try:
            cfgs[side] = _side_config(cfg, learner)
        except ConfigError as e:  # a path this config cannot take (e.g. the shortcut with two epochs)
            refused[side] = str(e)
    if baseline not in cfgs:
        why = f" (refused: {refused[baseline]})" if baseline in refused else ""
        raise ValueError(f"bench learner: the baseline side {baseline!r} is not among the sides run{why}")
    # built from a side that reads the sampler's entropies, so its rollout records them for every side
    recording = next((c for c in cfgs.values() if c.train.learner.behaviour != "recompute"), cfgs[baseline])
    with _one_batch(recording) as (policy, batch, rollout_s, rollout_cpu_s):
        start = [p.detach().clone() for p in _params(policy)]
        plans = {k: DEFAULT_PLAN if k == "plain" else make_plan(c, 1, batch) for k, c in cfgs.items()}
        _timed(policy, cfgs[baseline], batch, plans[baseline], start)  # warms kernels and the allocator
        runs: dict[str, list[dict]] = {side: [] for side in plans}
        for _ in range(repeats):
            for side, plan in plans.items():
                runs[side].append(_timed(policy, cfgs[side], batch, plan, start))
    out: dict = {
        **run_header(cfg, repeats),
        "baseline": baseline,
        "rollout_s": rollout_s,
        "rollout_cpu_s": rollout_cpu_s,
        "train_tokens": int(batch.attention_mask.sum()),
        "trained_tokens": int(batch.loss_mask.sum()),
        "plans": {
            k: {
                "behaviour": p.behaviour,
                "reference": p.reference,
                # the config keys as they read (prefix_impl packed where no prefix is shared)
                "shared_prefix": groups_shared(p.prefix),
                "prefix_impl": shared_impl(p.prefix) or "packed",
                "padding_free": is_padding_free(p.prefix),
                "precision": p.precision,
                "needed_positions": p.needed_positions,
            }
            for k, p in plans.items()
        },
        "refused": refused,
        "cpu_bf16": cpu_bf16(),
        # the dtypes' matmul rate at this thread count (GFLOP per CPU-second): the compute floor of each side
        "matmul_gflops": {str(d).removeprefix("torch."): matmul_gflops(1024, d, 3, time.process_time) for d in DTYPES},
    }
    for side in sorted(runs, key=lambda k: k != baseline):  # the baseline first: the others' ratios read it
        rows = runs[side]
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k.endswith("_s")}
        med["learner_share"] = med["update_s"] / (med["update_s"] + rollout_s)
        med["train_tokens_per_s"] = out["train_tokens"] / med["update_s"]
        med["update_s_per_repeat"] = [r["update_s"] for r in rows]
        med["loss_total"], med["grad_norm"] = rows[-1]["loss_total"], rows[-1]["grad_norm"]
        if side != baseline:
            for k in ("update_s", "update_cpu_s", "passes_cpu_s"):
                med[f"{k}_ratio"] = med[k] / out[baseline][k]
        out[side] = med
    return out
