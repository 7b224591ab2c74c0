"""The learner: everything of an update after its rollout (verl's actor, AReaL's trainer side).

It owns the optimizer and turns a `RolloutBatch` (harness.rl.worker) into an update: the metrics of
the episodes (env/*, act/*, reward/*, filter/*), the training batch in the configured layout and
masks with each episode's task type and environment as ids, the teacher's log-probs (algo.distill),
`run_update` (advantages, epochs x minibatches: harness.rl.update), and the diagnostics
(cross-prompt similarity, RAGEN-2's MI proxy). Its weights and optimizer go into the checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path

from envs.mixture_env import member_labels
from harness.config.schema import RunConfig
from harness.diagnostics.collapse import cross_prompt_similarity
from harness.diagnostics.episode_metrics import episode_metrics, group_reward_stats, per_env_metrics
from harness.diagnostics.mi_proxy import distinct_prompt_pairs, mi_proxy
from harness.model.policy import Policy
from harness.rl.act import is_act
from harness.rl.batch import TrainBatch, build_batch, state_id
from harness.rl.checkpoint import load_checkpoint, save_checkpoint
from harness.rl.distill import teacher_stream
from harness.rl.judge import process_metrics
from harness.rl.plan import check_precision, make_plan
from harness.rl.seeding import stream
from harness.rl.update import make_optimizer, run_update
from harness.rl.worker import RolloutBatch
from harness.transcript.records import Episode


class Learner:
    """Trains the policy on the rollout worker's batches (see the module docstring).

    env: the run's environment (task types, observation markers, a mixture's members);
    teacher: the frozen teacher of algo.distill (harness.rl.distill.teacher_model)."""

    def __init__(self, cfg: RunConfig, policy: Policy, env, teacher: Callable[[], AbstractContextManager]):
        self.cfg, self.policy, self.env, self.teacher = cfg, policy, env, teacher
        self.markers = env.observation_markers
        # env.mixture: metrics of every member apart (env/<label>/..., eval_<mode>/<label>/...)
        self.env_of = member_labels(env)
        self.optimizer = make_optimizer(policy, cfg)
        check_precision(cfg, next(policy.model.parameters()).device)  # bfloat16 where the CPU has no units for it

    def learn(self, batch: RolloutBatch, budget: int) -> tuple[dict[str, float], dict[str, float] | None]:
        """(metrics, seconds) of update `batch.update`: the episodes' metrics, the update, the diagnostics.
        seconds (for timings.jsonl) is None when nothing was trained (no usable episode)."""
        c, update = self.cfg, batch.update
        t0 = time.time()
        metrics = self.episode_metrics(batch, budget)
        # an environment error ends an episode early with a meaningless return: never train on it
        kept = [e for e in list(batch.kept) + batch.act_eps if e.steps and e.env_error is None]
        if not kept:
            metrics["train/skipped_empty"] = 1.0
            return metrics, None
        train = self.training_batch(kept)
        if c.algo.distill.coef > 0:  # the teacher's log-probs, with the judge's hints (algo.distill)
            teacher = teacher_stream(self.teacher, self.policy.chat, kept, c, train.stream_mask.shape[1])
            train = replace(train, teacher_logp=teacher.logp, distill_mask=teacher.mask)
        split: dict[str, float] = {}  # logprobs_s, logprobs_cpu_s: the behaviour and reference log-probs' share
        plan = make_plan(c, update, train)  # which passes this update runs (harness.rl.plan)
        metrics.update(run_update(self.policy, self.optimizer, train, c, stream(c.train.seed, update, 99), split, plan))
        metrics.update(self.diagnostics(update, batch.all_eps))
        metrics["train/skipped_empty"] = 0.0
        metrics["perf/train_tokens"] = float(train.attention_mask.sum())
        # wall times vary between identical runs: they go to timings.jsonl, so that
        # metrics.jsonl stays bit-identical for the same config and seed
        seconds = {"rollout_s": batch.seconds, "update_s": time.time() - t0, **split}
        if batch.judge_s is not None:  # included in rollout_s
            seconds["judge_s"] = batch.judge_s
        return metrics, seconds

    def episode_metrics(self, batch: RolloutBatch, budget: int) -> dict[str, float]:
        """Metrics of the rollout: env/* of the RL episodes, filter stats, cost, act/*, reward/*."""
        all_eps, act_eps = batch.all_eps, batch.act_eps
        trained = all_eps + act_eps
        metrics = {
            **(episode_metrics(all_eps, "env", self.markers) if all_eps else {}),
            **(per_env_metrics(all_eps, "env", self.env_of, self.markers) if all_eps and self.env_of else {}),
            **(group_reward_stats(all_eps) if all_eps else {}),
            **batch.fstats,
            "env/turn_budget": float(budget),
            # training cost of this update (DAPO refills and ACT answers included), for compute-matched comparisons
            "perf/episodes": float(len(trained)),
            "perf/rollout_tokens": float(sum(len(s.action_ids) for e in trained for s in e.steps)),
        }
        if act_eps:
            metrics.update(episode_metrics(act_eps, "act", ()))
        if batch.judge_s is not None:  # the step judge's votes (reward.process)
            metrics.update(process_metrics(all_eps))
        if self.cfg.rollout.cross_policy.members:  # share of the turns a stale member generated
            turns = [s.member for e in all_eps for s in e.steps]
            metrics["rollout/stale_turn_frac"] = sum(m > 0 for m in turns) / max(len(turns), 1)
        return metrics

    def diagnostics(self, update: int, eps: list[Episode]) -> dict[str, float]:
        """diag/cross_prompt_similarity every update, RAGEN-2's MI proxy every train.mi_every updates."""
        if not eps:
            return {}
        out = {
            "diag/cross_prompt_similarity": cross_prompt_similarity(
                [" ".join(s.action_text for s in e.steps) for e in eps], [e.task_seed for e in eps]
            )
        }
        if self.cfg.train.mi_every and update % self.cfg.train.mi_every == 0:
            out.update(self._mi(eps))
        return out

    def training_batch(self, episodes: list[Episode], cfg: RunConfig | None = None) -> TrainBatch:
        """The training batch of `episodes` in the configured layout and masks, with each episode's
        task type and environment as ids (`algo.adv.norm` task and env_std)."""
        c = cfg or self.cfg
        return build_batch(
            episodes,
            concatenated=c.context.resolved_layout == "concatenated",
            mask_observations=c.context.mask_observations,
            pad_id=self.policy.chat.pad_id,
            task_ids=[
                state_id(f"{c.env.name}/{'act' if is_act(e) else self.env.task_type(e.task_seed)}") for e in episodes
            ],
            env_ids=[state_id(self._env_id(e)) for e in episodes],
            drop_forced=c.algo.forced_tokens == "drop",
            drop_stale=c.rollout.cross_policy.members > 0 and c.rollout.cross_policy.train_on == "current",
        )

    def _env_id(self, e: Episode) -> str:
        """The environment an episode comes from (a mixture: its member; an ACT question: act)."""
        if self.env_of is None:
            return self.cfg.env.name
        return "act" if is_act(e) else self.env_of(e.task_seed)

    def _mi(self, eps: list[Episode]) -> dict[str, float]:
        """RAGEN-2 MI proxy on first-turn (prompt, response) pairs of distinct tasks."""
        pairs = distinct_prompt_pairs(
            [e.steps[0].obs_ids for e in eps if e.steps],
            [e.steps[0].action_ids for e in eps if e.steps],
            self.cfg.train.mi_prompts,
        )
        if len(pairs[0]) < 2:
            return {}
        return mi_proxy(
            self.policy.model,
            pairs[0],
            pairs[1],
            batch_size=self.cfg.algo.micro_batch_size,
            pad_id=self.policy.chat.pad_id,
            temperature=self.cfg.rollout.temperature,
        )

    # ------------------------------------------------------------------ checkpoints
    def save(self, run_dir: Path, update: int, state: dict) -> None:
        """Write the checkpoint: trainable weights, optimizer and the run's `state`."""
        save_checkpoint(run_dir, update, self.policy.trainable_modules(), self.optimizer, state)

    def resume(self, run_dir: Path) -> tuple[int, dict] | None:
        """Load the checkpoint into the weights and optimizer: (its update, the run's state), or None."""
        return load_checkpoint(run_dir, self.policy.trainable_modules(), self.optimizer)
