"""Held-out evaluation with common random numbers, shared by the trainer and `harness eval`.

Every point of a sweep plays the same held-out tasks, and sampled episode k of task j draws its
tokens from its own random stream, seeded by (j, k) only: not by the training seed, the update
or the rest of the batch. Differences between points, seeds and updates are therefore paired by
(task, sample): greedy episodes exactly (deterministic decoding), sampled ones through common
random numbers (docs/algorithms.md#diagnostics).

`plan(heldout, episodes)` lays the evaluation out: `episodes` sampled episodes cycle through the
held-out tasks (sample index k = i // len(heldout)); greedy decoding plays each distinct task once.
`RunEvaluation` is a training run's: the plan of its held-out tasks after each update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from envs.registry import env_class, env_source_classes
from envs.stage import report
from harness.config.schema import RunConfig
from harness.diagnostics.episode_metrics import episode_metrics, final_info, per_env_metrics
from harness.rl.rollout import collect
from harness.rl.turns import turn_budget_at
from harness.transcript.records import Episode

EVAL_STREAM_SALT = 0x5EED_E7A1  # keeps evaluation streams apart from every training stream


@dataclass(frozen=True)
class EvalPlan:
    greedy: list[int]  # task seeds, each once
    sampled: list[tuple[int, int]]  # (task seed, sample index)


def plan(heldout: list[int], episodes: int) -> EvalPlan:
    sampled = [(heldout[i % len(heldout)], i // len(heldout)) for i in range(episodes)]
    return EvalPlan(greedy=list(dict.fromkeys(t for t, _ in sampled)), sampled=sampled)


def episode_stream(task: int, sample: int) -> torch.Generator:
    """The sampling stream of evaluation episode (task, sample): the same in every point and run."""
    seed = int(np.random.SeedSequence([EVAL_STREAM_SALT, task, sample]).generate_state(1)[0])
    return torch.Generator().manual_seed(seed)


def task_row(update: int, mode: str, sample: int, ep: Episode, env: str | None = None) -> dict:
    """One row of eval_tasks.jsonl (with the member's label as `env` in a mixture)."""
    row = {
        "update": int(update),
        "mode": mode,
        "task": int(ep.task_seed),
        "sample": int(sample),
        "success": int(ep.won),
        "return": float(ep.outcome),
        "turns": int(ep.num_turns),
    }
    final = final_info(ep)
    if "true_won" in final:  # a reward-hacking probe: the truth and the exploit, per episode
        row["true_success"] = int(bool(final["true_won"]))
        row["exploit_rate"] = int(bool(final.get("exploit", False)))  # named as its metric, like success
    if "deadlock" in final:  # Sokoban with `deadlock` on: the episode ended dead-locked
        row["deadlock_rate"] = int(bool(final["deadlock"]))
    if env is not None:
        row["env"] = env
    return row


def evaluate(
    policy,
    cfg: RunConfig,
    venv: Callable[[int], object],
    eval_plan: EvalPlan,
    *,
    update: int,
    budget: int,
    instructions: str,
    markers: tuple[str, ...] = (),
    modes: tuple[str, ...] = ("greedy", "sampled"),
    env_of: Callable[[int], str] | None = None,
) -> tuple[dict[str, float], list[dict]]:
    """Play the plan greedily and sampled; return (eval_greedy/... and eval_sampled/... metrics,
    one row per episode). `venv(n)` gives a vector env of n instances. env_of (a mixture's task
    seed -> member label): the metrics of each environment too, as eval_<mode>/<env>/..."""
    metrics: dict[str, float] = {}
    rows: list[dict] = []
    total = sum(len(eval_plan.greedy) if m == "greedy" else len(eval_plan.sampled) for m in modes)
    stage = f"held-out evaluation at update {update} (episodes)"
    report(stage, 0, total)
    for mode in modes:
        tasks = [(t, 0) for t in eval_plan.greedy] if mode == "greedy" else eval_plan.sampled
        streams = [episode_stream(t, k) for t, k in tasks]
        eps = collect(
            policy.model,
            policy.chat,
            venv(len(tasks)),
            [(t, i) for i, (t, _) in enumerate(tasks)],
            cfg,
            turn_budget=budget,
            greedy=mode == "greedy",
            generator=streams,
            instructions=instructions,
        )
        metrics.update(episode_metrics(eps, f"eval_{mode}", markers))
        if env_of is not None:
            metrics.update(per_env_metrics(eps, f"eval_{mode}", env_of, markers))
        rows += [
            task_row(update, mode, k, ep, env_of(ep.task_seed) if env_of else None) for (_, k), ep in zip(tasks, eps)
        ]
        report(stage, len(rows), total)
    return metrics, rows


class RunEvaluation:
    """The held-out evaluation of a training run, with the trainer's policy: `run(update)` plays the plan
    of the config's held-out tasks at the turn budget update `update` trained with (update u trains at
    turn_budget_at(u - 1); the evaluation before RL uses the first); the one before RL is cached."""

    def __init__(self, cfg: RunConfig, policy, venv, *, instructions: str, markers: tuple[str, ...], env_of=None):
        self.cfg, self.policy, self.venv = cfg, policy, venv
        self.instructions, self.markers, self.env_of = instructions, markers, env_of
        self.heldout = env_class(cfg.env.name).task_seeds("heldout", cfg.env.heldout_tasks, cfg.env.options)

    def budget(self, update: int) -> int:
        return turn_budget_at(max(update - 1, 0), self.cfg.turns)

    def run(self, update: int) -> tuple[dict[str, float], list[dict]]:
        """(eval_<mode>/... metrics, one row per episode) after `update` (0: before RL, from the cache)."""
        if update == 0:
            from harness.model.cache import cache_dir

            return cached_start(self.cfg, self.policy.info, cache_dir(), lambda: self._play(0))
        return self._play(update)

    def _play(self, update: int) -> tuple[dict[str, float], list[dict]]:
        return evaluate(
            self.policy,
            self.cfg,
            self.venv,
            plan(self.heldout, self.cfg.train.eval_episodes),
            update=update,
            budget=self.budget(update),
            instructions=self.instructions,
            markers=self.markers,
            env_of=self.env_of,
        )


# Config sections and keys that cannot change the evaluation before RL: the algorithm, the
# training loop (except how many episodes are evaluated and where), logging. The adapter starts as
# an exact zero update, so every point that shares the rest shares its starting evaluation.
_NOT_AT_START = ("algo", "tracking")
_TRAIN_KEYS_AT_START = ("eval_episodes", "device")


def start_key(cfg: RunConfig, policy_info: dict) -> str:
    """Content hash of everything the evaluation before RL depends on."""
    from harness.model.cache import code_version, content_hash
    from harness.rl import rollout, sampling, turns
    from harness.rl.engines import base, hf, static
    from harness.transcript import chat, context

    dump = cfg.model_dump(mode="json")
    for section in _NOT_AT_START:
        dump.pop(section)
    for key in (
        "sampler_dtype",
        "staleness",
        "cross_policy",
    ):  # the evaluation plays the trainer's model, never the sampler's
        dump["rollout"].pop(key)
    dump["train"] = {k: dump["train"][k] for k in _TRAIN_KEYS_AT_START}
    # the environment as what decides its tasks and models (a mixture's weights only decide which
    # tasks RL trains on; env.mixture is already in env.options)
    dump["env"]["options"] = env_class(cfg.env.name).cache_options(cfg.env.options)
    dump["env"].pop("mixture")
    models = {k: policy_info.get(k) for k in ("base", "sft")}
    # the environment's own source too: a model given by name does not cover it
    envs_code = env_source_classes(cfg.env.name)
    code = code_version(
        rollout, turns, base, hf, static, sampling, chat, context, episode_metrics, evaluate, start_key, *envs_code
    )
    return content_hash({"config": dump, "models": models, "code": code})


def cached_start(cfg: RunConfig, policy_info: dict, cache_dir, compute) -> tuple[dict[str, float], list[dict]]:
    """(metrics, rows) of the evaluation before RL, from `cache_dir/start_eval/<key>` or `compute()`."""
    import json
    from pathlib import Path

    from harness.model.cache import build_once

    def build(out: Path) -> dict:
        metrics, rows = compute()
        (out / "rows.json").write_text(json.dumps(rows))
        (out / "metrics.json").write_text(json.dumps(metrics))
        return {"episodes": len(rows)}

    entry, _ = build_once(Path(cache_dir) / "start_eval", start_key(cfg, policy_info), build)
    return json.loads((entry / "metrics.json").read_text()), json.loads((entry / "rows.json").read_text())
