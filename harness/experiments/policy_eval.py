"""The model side of `harness eval`: a point's policy, its environments, and chunks of episodes."""

from __future__ import annotations

from pathlib import Path

import torch

from harness.config.schema import RunConfig
from harness.model.cache import cache_dir
from harness.model.pipeline import attach_adapter, base_model, sft_warmup
from harness.rl import evaluate as evaluation
from harness.rl.demos import Demonstrations
from harness.rl.trainer import planned_updates
from harness.rl.turns import turn_budget_at
from harness.rl.venvs import VenvPool
from harness.store import ADAPTER


class PolicyEvaluator:
    """Builds the point's policy once; `play(tasks, samples, done)` evaluates a chunk of tasks.

    `point_cfg` is the point's own config: it decides the policy (a tiny model's cache key covers
    the env options, so a variant's options would name another model). `cfg` is what the episodes
    are played with: the point's config, or a variant of its environment (`--games`, `--env-option`)."""

    def __init__(self, point: Path, point_cfg: RunConfig, cfg: RunConfig, checkpoint: str, device: str):
        from envs import make_env
        from envs.mixture_env import member_labels

        self.cfg = cfg
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        demos = Demonstrations.of(point_cfg)  # played only if the point's model is not in the cache
        source, info = base_model(point_cfg, cache_dir(), demos)
        source, info = sft_warmup(point_cfg, source, info, cache_dir(), self.device, demos)
        if checkpoint == "adapter" and point_cfg.model.finetune == "full":  # the trained weights are the whole model
            source = str(point / ADAPTER)
        self.policy = attach_adapter(point_cfg, source, info, self.device)
        if checkpoint == "adapter" and point_cfg.model.finetune == "lora":
            from peft import set_peft_model_state_dict
            from peft.utils.save_and_load import load_peft_weights

            set_peft_model_state_dict(self.policy.model, load_peft_weights(str(point / ADAPTER), device=self.device))
        self.policy.model.eval()
        env = make_env(cfg.env.name, cfg.env.options)
        self.instructions, self.markers = env.instructions, env.observation_markers
        self.env_of = member_labels(env)
        env.close()
        self.budget = turn_budget_at(max(planned_updates(cfg) - 1, 0), cfg.turns)  # the last update's budget
        self._venv = VenvPool(cfg.env)

    def play(self, tasks: list[int], samples: int, done: set) -> list[dict]:
        """Rows of every episode of `tasks` not in `done` ((mode, task, sample) triples)."""
        rows = []
        for mode, todo in (
            ("greedy", [(t, 0) for t in tasks if ("greedy", t, 0) not in done]),
            ("sampled", [(t, k) for t in tasks for k in range(samples) if ("sampled", t, k) not in done]),
        ):
            if todo:
                plan = evaluation.EvalPlan(greedy=[t for t, _ in todo], sampled=todo)
                rows += evaluation.evaluate(
                    self.policy,
                    self.cfg,
                    self._venv,
                    plan,
                    update=-1,
                    budget=self.budget,
                    instructions=self.instructions,
                    markers=self.markers,
                    modes=(mode,),
                    env_of=self.env_of,
                )[1]
        return rows

    def __enter__(self) -> PolicyEvaluator:
        return self

    def __exit__(self, *exc) -> None:
        self._venv.close()
