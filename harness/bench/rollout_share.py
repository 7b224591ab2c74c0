"""`harness bench --only rollout_share`: the rollout with `rollout.share_prefix` against without, in one process
(docs/benchmarks.md#learner).

One trainer of the config is built once; its rollout of update 1 is then played with the shared first prefill
off and on, interleaved `repeats` rounds after a warm-up round of each, from the same weights and the same
random streams (every stream of a rollout derives from the seed and the update, `harness.rl.worker`), so both
sides play the same tasks and, where the two prefills round alike, the same episodes. Reported: each side's
median wall and process-CPU seconds, the ratio, the tokens generated, and whether the two sides' actions and
sampler log-probs are equal bit for bit (or how far the log-probs are apart where they are not: the shared
prefill runs other matrix shapes, which a matrix library may round differently).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

from harness.bench.learner import run_header
from harness.bench.timing import NullLogger
from harness.config.loading import validate_run_config
from harness.config.schema import RunConfig
from harness.rl.turns import turn_budget_at
from harness.transcript.records import Episode

SIDES = ("unshared", "shared")


def _side(cfg: RunConfig, shared: bool) -> RunConfig:
    d = cfg.model_dump(mode="json")
    d["rollout"].update({"share_prefix": shared, "concurrent": False})
    d["train"].update({"eval_every": 0, "mi_every": 0})
    return validate_run_config(d, "bench rollout_share")


def _played(episodes: list[Episode]) -> tuple[list[list[list[int]]], list[list[float]]]:
    """Every episode's action ids per turn, and its sampler log-probs flattened."""
    ids = [[list(st.action_ids) for st in ep.steps] for ep in episodes]
    lps = [[float(x) for st in ep.steps for x in st.sampler_logprobs] for ep in episodes]
    return ids, lps


def bench_rollout_share(cfg: RunConfig, repeats: int = 2) -> dict:
    """Both sides on update 1's rollout of `cfg` (module docstring)."""
    from harness.rl.trainer import Trainer

    if cfg.rollout.backend != "hf":
        raise ValueError(
            f"bench rollout_share: rollout.share_prefix runs on rollout.backend hf, not {cfg.rollout.backend!r}"
        )
    sides = {name: _side(cfg, name == "shared") for name in SIDES}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in SIDES}
    played: dict[str, tuple] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(sides["unshared"], Path(tmp), NullLogger())
        try:
            worker = trainer.worker
            for i in range(repeats + 1):  # round 0 warms kernels and the allocator
                for name, side in sides.items():
                    worker.cfg = side  # the only key that differs is read by the episode loop alone
                    t0, c0 = time.perf_counter(), time.process_time()
                    batch = worker.rollout(1, turn_budget_at(0, side.turns))
                    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                    if i:
                        runs[name].append((wall, cpu))
                    played[name] = _played(batch.all_eps)
        finally:
            worker.cfg = sides["unshared"]
            trainer.close()
    med = {
        name: {"rollout_s": statistics.median(w for w, _ in r), "rollout_cpu_s": statistics.median(c for _, c in r)}
        for name, r in runs.items()
    }
    (ids0, lp0), (ids1, lp1) = played["unshared"], played["shared"]
    same_actions = ids0 == ids1
    gap = None
    if same_actions:
        flat0 = torch.tensor([x for row in lp0 for x in row], dtype=torch.float64)
        flat1 = torch.tensor([x for row in lp1 for x in row], dtype=torch.float64)
        gap = float((flat0 - flat1).abs().max()) if flat0.numel() else 0.0
    return {
        **run_header(cfg, repeats),
        "episodes": len(ids0),
        "generated_tokens": {name: sum(len(a) for ep in ids for a in ep) for name, (ids, _) in played.items()},
        **med,
        "rollout_s_ratio": med["shared"]["rollout_s"] / med["unshared"]["rollout_s"],
        "rollout_cpu_s_ratio": med["shared"]["rollout_cpu_s"] / med["unshared"]["rollout_cpu_s"],
        "rollout_s_per_repeat": {name: [w for w, _ in r] for name, r in runs.items()},
        "same_actions": same_actions,
        "same_logprobs": same_actions and lp0 == lp1,
        "logprob_max_gap": gap,
    }
