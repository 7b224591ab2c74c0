"""The rollout worker: everything of an update before the learner (verl's rollout worker, AReaL's
rollout side, prime-rl's orchestrator).

It owns the train task order, the samplers (the trainer's model, its copy in rollout.sampler_dtype
or k updates stale, the cross-policy pool: harness.rl.sampler_copy; vLLM's engine), the group filter
with DAPO's refills, the step judge (process rewards) and ACT's questions, and turns update u into
one `RolloutBatch` (`rollout`). The trainer calls it in its own process; the concurrent mode runs one
in a rollout process of its own (`RolloutWorker.standalone`, harness.rl.concurrent).

Every random stream is derived from (train.seed, update, round), so the batch of an update does not
depend on which process generates it or on what ran before.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from algorithms import GROUP_FILTER
from algorithms.types import EmptyBatchError
from envs import ENVS, make_env
from harness.config.schema import RunConfig
from harness.model.cache import cache_dir
from harness.model.policy import Policy
from harness.model.sft import demo_seeds_used
from harness.rl.act import ACT_GROUP_BASE, ACT_SALT, QuestionVenv, act_instructions, act_questions, build_questions
from harness.rl.build import build_policy, resolve_device
from harness.rl.demos import Demonstrations
from harness.rl.engines.vllm import VLLMSampler
from harness.rl.judge import build_judge, judge_episodes
from harness.rl.rollout import CrossPolicy, collect
from harness.rl.sampler_copy import SamplerModel, StalePool
from harness.rl.seeding import start_process, stream
from harness.rl.venvs import VenvPool
from harness.transcript.records import Episode


@dataclass
class RolloutBatch:
    """One update's rollouts: what the learner trains on."""

    update: int
    kept: list[Episode]  # RL episodes the group filter kept (at most tasks x group size)
    all_eps: list[Episode]  # every RL episode generated, DAPO refills included
    fstats: dict[str, float]  # filter/* (round 0) and act/* statistics
    seconds: float  # wall time of the rollout (judge included)
    act_eps: list[Episode] = field(default_factory=list)  # ACT answers, trained with the RL episodes
    judge_s: float | None = None  # seconds the step judge took (None: no judge)
    version: int = 0  # concurrent mode: learner updates applied to the weights that generated it


class RolloutWorker:
    """Generates the training episodes of every update (see the module docstring)."""

    def __init__(self, cfg: RunConfig, policy: Policy, source: str, device: str):
        self.cfg, self.policy = cfg, policy
        # rollout.sampler_dtype, rollout.staleness
        self.sampler = SamplerModel(policy.model, cfg.rollout.sampler_dtype, cfg.rollout.staleness)
        xp = cfg.rollout.cross_policy  # cross-policy sampling: the pool's stale members
        self.pool = StalePool(policy.model, cfg.rollout.sampler_dtype, xp.members, xp.refresh_every)
        # rollout.backend vllm: training rollouts on vLLM's engine (evaluation and ACT stay on our sampler)
        self.vllm = VLLMSampler(cfg, source, device) if cfg.rollout.backend == "vllm" else None
        self.judge = build_judge(cfg, policy)  # reward.process (None when off)
        self.act_questions = act_questions(cfg)  # ACT questions per update in act.mode mixed (else 0)
        # train.learner.behaviour sampler: the update reads the sampler's entropies (harness.rl.plan)
        self.records_entropy = cfg.train.learner.behaviour in ("sampler", "first_forward")
        self.env = make_env(cfg.env.name, cfg.env.options)  # task facts (instructions, task types, parser)
        self.venvs = VenvPool(cfg.env)  # vector envs by batch size (the trainer's evaluation uses them too)
        # env.skip_demo_tasks: RL's train tasks start after the demonstrations' train seeds
        self.task_offset = demo_seeds_used(policy.info) if cfg.env.skip_demo_tasks else 0
        off, seeds = self.task_offset, ENVS.get(cfg.env.name).task_seeds
        self.train_pool = (
            seeds("train", off + cfg.env.train_tasks, cfg.env.options)[off:] if cfg.env.train_tasks else None
        )

    @classmethod
    def standalone(cls, cfg: RunConfig) -> RolloutWorker:
        """A worker in a process of its own (the concurrent rollout's): seeded and threaded as the
        trainer's process, with its own policy built from the caches the trainer filled."""
        start_process(cfg.train.seed, cfg.train.threads)  # a spawned process starts unseeded
        device = resolve_device(cfg.train.device)
        policy, source = build_policy(cfg, cache_dir(), device, Demonstrations.of(cfg))
        return cls(cfg, policy, source, device)

    def close(self) -> None:
        if self.vllm is not None:
            self.vllm.close()
        self.venvs.close()
        self.env.close()

    def state_dict(self) -> dict:
        """The samplers' weight snapshots (checkpoint keys), so a resumed run samples as an uninterrupted one."""
        return {"sampler_snapshots": self.sampler.state_dict(), "pool_snapshots": self.pool.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state.get("sampler_snapshots"))
        self.pool.load_state_dict(state.get("pool_snapshots"))

    # ------------------------------------------------------------------ one update
    def rollout(self, update: int, budget: int) -> RolloutBatch:
        """The batch of `update` (1-based) at turn budget `budget`: an ACT stage update's questions, or
        the filtered RL rollout (with ACT's share in act.mode mixed)."""
        t0 = time.time()
        self.sampler.record()  # the weights this update starts from (rollout.staleness)
        self.pool.record(update)  # rollout.cross_policy
        judge_s = None if self.judge is None else 0.0
        act = self.cfg.act
        if act.mode == "stage" and update <= act.updates:  # an ACT update instead of an RL one
            act_eps, act_stats = self._act_rollout(update, self.cfg.rollout.tasks_per_update)
            return RolloutBatch(update, [], [], act_stats, time.time() - t0, act_eps, judge_s)
        # rollout.backend vllm: the engine wakes with the adapter of the updates so far, sleeps for the update
        with self.vllm.awake(self.policy, update - 1) if self.vllm is not None else nullcontext():
            kept, all_eps, fstats, judge_s = self._filtered_rollout(update, budget)
        act_eps: list[Episode] = []
        if self.act_questions:  # act.mode mixed
            act_eps, act_stats = self._act_rollout(update, self.act_questions)
            fstats = {**fstats, **act_stats}
        return RolloutBatch(update, kept, all_eps, fstats, time.time() - t0, act_eps, judge_s)

    def train_tasks(self, update: int, round_: int) -> list[int]:
        """The task seeds of `update`'s rollout round `round_` (round > 0: DAPO refills)."""
        k = self.cfg.rollout.tasks_per_update
        if self.train_pool is not None:
            rng = np.random.default_rng([self.cfg.train.seed, update, round_])
            return [
                self.train_pool[i] for i in rng.choice(len(self.train_pool), size=k, replace=k > len(self.train_pool))
            ]
        # a fresh task for every group: the (update, round) block of the train seed sequence, after the run's
        # own horizon of blocks when each seed plays its own tasks (env.task_order: seeded)
        rounds = 1 + self.cfg.algo.filter.max_extra_rounds
        start = self.task_offset + (update * rounds + round_) * k
        if self.cfg.env.task_order == "seeded":
            start += self.cfg.train.seed * (self.cfg.train.updates + 1) * rounds * k
        seeds = ENVS.get(self.cfg.env.name).task_seeds("train", start + k, self.cfg.env.options)
        return seeds[start:]

    def episodes(
        self,
        seeds: list[int],
        group_size: int,
        *,
        greedy: bool,
        generator,
        budget: int,
        first_group: int = 0,
        cross: CrossPolicy | None = None,
        record_entropy: bool | None = None,
    ) -> list[Episode]:
        """`group_size` episodes of each task seed, played by the sampler (groups from `first_group` on).
        record_entropy: the sampler's entropies per token (default: where the update plan reads them)."""
        tasks = [(s, first_group + j) for j, s in enumerate(seeds) for _ in range(group_size)]
        return collect(
            self.vllm if self.vllm is not None else self.sampler.model(),
            self.policy.chat,
            self.venvs(len(tasks)),
            tasks,
            self.cfg,
            turn_budget=budget,
            greedy=greedy,
            generator=generator,
            instructions=self.env.instructions,
            cross=cross,
            record_entropy=self.records_entropy if record_entropy is None else record_entropy,
        )

    def _filtered_rollout(self, update: int, budget: int) -> tuple[list[Episode], list[Episode], dict, float | None]:
        """Rollout + group filter; dapo's dynamic sampling refills up to max_extra_rounds."""
        c, G = self.cfg, self.cfg.rollout.group_size
        kept: list[Episode] = []
        stats: dict[str, float] = {}
        all_eps: list[Episode] = []
        judge_s = None if self.judge is None else 0.0
        rl_tasks = c.rollout.tasks_per_update - self.act_questions  # act.mode mixed: ACT takes the rest
        for round_ in range(1 + c.algo.filter.max_extra_rounds):
            eps = self.episodes(
                self.train_tasks(update, round_)[:rl_tasks],
                G,
                greedy=False,
                budget=budget,
                generator=stream(c.train.seed, update, round_),
                first_group=round_ * c.rollout.tasks_per_update,
                cross=self._cross(update, round_),
            )
            if self.judge is not None:  # process rewards before the filter: it sees the rewards the trainer sees
                t_judge = time.time()
                judge_episodes(self.judge, eps, c, (update, round_))
                judge_s += time.time() - t_judge  # a wall time: timings.jsonl, not metrics
            all_eps += eps
            keep, st = self._filter(eps)
            if round_ == 0:
                stats = st
            kept += [e for e, k in zip(eps, keep) if k]
            if len(kept) >= rl_tasks * G:
                break
        stats["filter/rounds"] = float(round_ + 1)
        return kept[: rl_tasks * G], all_eps, stats, judge_s

    def _cross(self, update: int, round_: int) -> CrossPolicy | None:
        """Cross-policy sampling of this rollout round (None when rollout.cross_policy is off)."""
        members = self.pool.members()
        if not members:
            return None
        xp = self.cfg.rollout.cross_policy
        return CrossPolicy(members, xp.prob, stream(self.cfg.train.seed, update, round_, 7))

    def _filter(self, eps: list[Episode]) -> tuple[list[bool], dict[str, float]]:
        f = self.cfg.algo.filter
        rewards = torch.tensor([e.train_return for e in eps], dtype=torch.float32)
        group = torch.tensor([e.group for e in eps])
        try:
            res = GROUP_FILTER.get(f.name)(rewards, group, f.params)
            keep, st = res.keep.tolist(), res.stats
        except EmptyBatchError as err:
            keep, st = [False] * len(eps), err.stats
        return keep, {f"filter/{k}": float(v) for k, v in st.items()}

    def _act_rollout(self, update: int, n: int) -> tuple[list[Episode], dict[str, float]]:
        """ACT questions of `update` (harness.rl.act) answered `group_size` times each by the policy."""
        c, G = self.cfg, self.cfg.rollout.group_size
        model = self.sampler.model()
        questions, stats = build_questions(c, model, self.policy.chat, update, n, self.task_offset)
        tasks = [(q, ACT_GROUP_BASE + q) for q in range(len(questions)) for _ in range(G)]
        if not tasks:
            return [], stats
        parse = self.env.parse_action if c.act.answer == "action" else None
        eps = collect(
            model,
            self.policy.chat,
            QuestionVenv(questions, len(tasks), c.env.format_penalty, parse),
            tasks,
            c,
            turn_budget=1,
            greedy=False,
            generator=stream(c.train.seed, update, ACT_SALT),
            instructions=act_instructions(c),
            record_entropy=self.records_entropy,
        )
        return eps, stats
