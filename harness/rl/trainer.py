"""The shared trainer: every sweep point runs through `train`.

Loop (one row of metrics.jsonl per update; row 0 = the held-out evaluation before RL):

    load policy (+ SFT warm-up) -> resume checkpoint if present
    for each update:
        tasks (seeded by (seed, update)) -> rollout (G episodes per task, lock-step; the sampler is
        the trainer's model, its copy in rollout.sampler_dtype, or vLLM's engine with the adapter)
        -> group filter (dapo may refill) -> training batch (layout + masks)
        -> update (advantages, epochs x minibatches)       [harness.rl.losses]
        -> diagnostics -> metrics.jsonl + MLflow; held-out eval every k; checkpoint every k
    final evaluation, adapter saved in PEFT format, summary returned to the runner
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from algorithms import GROUP_FILTER
from algorithms.types import EmptyBatchError, FilterParams
from envs import ENVS, make_env
from envs.mixture_env import member_labels
from envs.stage import STAGE_LOGGER
from harness.config.schema import RunConfig, axis_params
from harness.diagnostics.collapse import CollapseMonitor, cross_prompt_similarity
from harness.diagnostics.episode_metrics import episode_metrics, group_reward_stats, per_env_metrics, sample_rows
from harness.diagnostics.mi_proxy import distinct_prompt_pairs, mi_proxy
from harness.model.cache import cache_dir
from harness.model.pipeline import attach_adapter, base_model, sft_warmup
from harness.model.sft import demo_seeds_used
from harness.rl import evaluate as evaluation
from harness.rl.act import (
    ACT_GROUP_BASE,
    ACT_SALT,
    QuestionVenv,
    act_instructions,
    act_questions,
    build_questions,
    is_act,
)
from harness.rl.batch import TrainBatch, build_batch, state_id
from harness.rl.checkpoint import load_checkpoint, save_checkpoint
from harness.rl.concurrent import ConcurrentRollout, rollout_metrics
from harness.rl.distill import teacher_model, teacher_stream
from harness.rl.judge import build_judge, judge_episodes, process_metrics
from harness.rl.preflight import check_fits_env
from harness.rl.rollout import CrossPolicy, collect, turn_budget_at
from harness.rl.sampler_copy import SamplerModel, StalePool
from harness.rl.seeding import seed_everything
from harness.rl.update import make_optimizer, run_update
from harness.rl.venvs import VenvPool
from harness.rl.vllm_backend import VLLMSampler
from harness.transcript.records import Episode

ProgressFn = Callable[[dict], None]


def planned_updates(cfg: RunConfig) -> int:
    """train.updates, or what the SFT/RL split budget leaves for RL (Practitioner's Guide)."""
    if cfg.sft.budget is None:
        return cfg.train.updates
    rl_episodes = cfg.sft.budget - cfg.sft.demos * cfg.sft.demo_cost
    return int(rl_episodes // (cfg.rollout.tasks_per_update * cfg.rollout.group_size))


def _generator(seed: int, *salt: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int(np.random.SeedSequence([seed, *salt]).generate_state(1)[0]))
    return g


class StageForwarder(logging.Handler):
    """Forwards the set-up progress records of `envs.stage` (games, demonstrations, pre-training,
    the starting evaluation) to the trainer's progress callback as {"stage", "done", "total",
    "update": 0} (update 0: before the first update, for callbacks that only read "update"), at
    most one every `every_s` seconds per stage (and always its last one)."""

    def __init__(self, progress: ProgressFn, every_s: float = 2.0):
        super().__init__(logging.INFO)
        self.forward, self.every_s, self.last = progress, every_s, {}

    def emit(self, record: logging.LogRecord) -> None:
        stage = getattr(record, "stage", None)
        if stage is None:
            return
        done, total = int(getattr(record, "done", 0)), getattr(record, "total", None)
        now = time.monotonic()
        if total is not None and done >= total or now - self.last.get(stage, -1e9) >= self.every_s:
            self.last[stage] = now
            self.forward({"stage": stage, "done": done, "total": total, "update": 0})

    def attach(self) -> StageForwarder:
        logging.getLogger(STAGE_LOGGER).addHandler(self)
        return self

    def detach(self) -> None:
        logging.getLogger(STAGE_LOGGER).removeHandler(self)


class Trainer:
    def __init__(self, cfg: RunConfig, run_dir: Path, logger, progress: ProgressFn | None = None):
        self.cfg, self.run_dir, self.logger = cfg, Path(run_dir), logger
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.progress = progress or (lambda _: None)
        # set-up progress (tiny model, SFT, games, the starting evaluation) until the first update
        self.stages = StageForwarder(self.progress).attach()
        try:
            self._setup(cfg)
        except BaseException:
            self.stages.detach()
            raise

    def _setup(self, cfg: RunConfig) -> None:
        seed_everything(cfg.train.seed)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        device = cfg.train.device
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        # the policy, built in three steps (harness.model.pipeline)
        source, info = base_model(cfg, cache_dir())
        source, info = sft_warmup(cfg, source, info, cache_dir(), self.device)
        self.policy = attach_adapter(cfg, source, info, self.device)
        # rollout.sampler_dtype, rollout.staleness
        self.sampler = SamplerModel(self.policy.model, cfg.rollout.sampler_dtype, cfg.rollout.staleness)
        xp = cfg.rollout.cross_policy  # cross-policy sampling: the pool's stale members
        self.pool = StalePool(self.policy.model, cfg.rollout.sampler_dtype, xp.members, xp.refresh_every)
        # rollout.backend vllm: training rollouts on vLLM's engine (evaluation and ACT stay on our sampler)
        self.vllm = VLLMSampler(cfg, source, self.device) if cfg.rollout.backend == "vllm" else None
        self.judge = build_judge(cfg, self.policy)  # reward.process (None when off)
        self._judge_s = 0.0  # seconds the judge took in this update (timings.jsonl)
        self.teacher = teacher_model(cfg, self.policy, self.judge)  # algo.distill (used when coef > 0)
        self.act_questions = act_questions(cfg)  # ACT questions per update in act.mode mixed (else 0)
        self.env = make_env(cfg.env.name, cfg.env.options)  # task facts (instructions, task types)
        self.instructions = self.env.instructions
        self.markers = self.env.observation_markers
        # env.mixture: metrics of every member apart (env/<label>/..., eval_<mode>/<label>/...)
        self.env_of = member_labels(self.env)
        # env.skip_demo_tasks: RL's train tasks start after the demonstrations' train seeds
        self.task_offset = demo_seeds_used(info) if cfg.env.skip_demo_tasks else 0
        off = self.task_offset
        self.train_pool = (
            ENVS.get(cfg.env.name).task_seeds("train", off + cfg.env.train_tasks, cfg.env.options)[off:]
            if cfg.env.train_tasks
            else None
        )
        self.heldout = ENVS.get(cfg.env.name).task_seeds("heldout", cfg.env.heldout_tasks, cfg.env.options)
        check_fits_env(cfg, self.policy.chat, self.heldout)  # before any rollout
        self.optimizer = make_optimizer(self.policy, cfg)
        self.updates = planned_updates(cfg)
        self.best = {"update": 0, "success": -1.0}
        self._venv = VenvPool(cfg.env)  # vector envs by batch size
        self.concurrent: ConcurrentRollout | None = None  # rollout.concurrent, started by run()
        self.monitor = CollapseMonitor(stop_on=("echo_trap",) if cfg.train.early_stop_on_collapse else ())

    # ------------------------------------------------------------------ rollouts
    def close(self) -> None:
        self.stages.detach()
        if self.concurrent is not None:
            self.concurrent.close()
        if self.vllm is not None:
            self.vllm.close()
        self._venv.close()
        self.env.close()

    def _train_tasks(self, update: int, round_: int) -> list[int]:
        k = self.cfg.rollout.tasks_per_update
        if self.train_pool is not None:
            rng = np.random.default_rng([self.cfg.train.seed, update, round_])
            return [
                self.train_pool[i] for i in rng.choice(len(self.train_pool), size=k, replace=k > len(self.train_pool))
            ]
        # a fresh task for every group: the (update, round) block of the train seed sequence
        start = self.task_offset + (update * (1 + self.cfg.algo.filter.max_extra_rounds) + round_) * k
        seeds = ENVS.get(self.cfg.env.name).task_seeds("train", start + k, self.cfg.env.options)
        return seeds[start:]

    def _rollout(
        self,
        seeds: list[int],
        group_size: int,
        *,
        greedy: bool,
        generator,
        budget: int,
        first_group: int = 0,
        cross: CrossPolicy | None = None,
    ) -> list[Episode]:
        tasks = [(s, first_group + j) for j, s in enumerate(seeds) for _ in range(group_size)]
        return collect(
            self.vllm if self.vllm is not None else self.sampler.model(),
            self.policy.chat,
            self._venv(len(tasks)),
            tasks,
            self.cfg,
            turn_budget=budget,
            greedy=greedy,
            generator=generator,
            instructions=self.instructions,
            cross=cross,
        )

    def _filtered_rollout(self, update: int, budget: int) -> tuple[list[Episode], list[Episode], dict]:
        """Rollout + group filter; dapo's dynamic sampling refills up to max_extra_rounds."""
        c, G = self.cfg, self.cfg.rollout.group_size
        kept: list[Episode] = []
        stats: dict[str, float] = {}
        all_eps: list[Episode] = []
        rl_tasks = c.rollout.tasks_per_update - self.act_questions  # act.mode mixed: ACT takes the rest
        for round_ in range(1 + c.algo.filter.max_extra_rounds):
            eps = self._rollout(
                self._train_tasks(update, round_)[:rl_tasks],
                G,
                greedy=False,
                budget=budget,
                generator=_generator(c.train.seed, update, round_),
                first_group=round_ * c.rollout.tasks_per_update,
                cross=self._cross(update, round_),
            )
            if self.judge is not None:  # process rewards before the filter: it sees the rewards the trainer sees
                t_judge = time.time()
                judge_episodes(self.judge, eps, c, (update, round_))
                self._judge_s += time.time() - t_judge  # a wall time: timings.jsonl, not metrics
            all_eps += eps
            keep, st = self._filter(eps)
            if round_ == 0:
                stats = st
            kept += [e for e, k in zip(eps, keep) if k]
            if len(kept) >= rl_tasks * G:
                break
        stats["filter/rounds"] = float(round_ + 1)
        return kept[: rl_tasks * G], all_eps, stats

    def _cross(self, update: int, round_: int) -> CrossPolicy | None:
        """Cross-policy sampling of this rollout round (None when rollout.cross_policy is off)."""
        members = self.pool.members()
        if not members:
            return None
        xp = self.cfg.rollout.cross_policy
        return CrossPolicy(members, xp.prob, _generator(self.cfg.train.seed, update, round_, 7))

    def _filter(self, eps: list[Episode]) -> tuple[list[bool], dict[str, float]]:
        f = self.cfg.algo.filter
        rewards = torch.tensor([e.train_return for e in eps], dtype=torch.float32)
        group = torch.tensor([e.group for e in eps])
        try:
            res = GROUP_FILTER.get(f.name)(rewards, group, axis_params(FilterParams, f))
            keep, st = res.keep.tolist(), res.stats
        except EmptyBatchError as err:
            keep, st = [False] * len(eps), err.stats
        return keep, {f"filter/{k}": float(v) for k, v in st.items()}

    # ------------------------------------------------------------------ evaluation
    def eval_budget(self, update: int) -> int:
        """The turn budget of the evaluation after `update`: the one that update trained with
        (update u trains at turn_budget_at(u - 1); the evaluation before RL uses the first)."""
        return turn_budget_at(max(update - 1, 0), self.cfg.turns)

    def evaluate(self, update: int) -> tuple[dict[str, float], dict[str, float]]:
        """Held-out evaluation with common random numbers (`harness.rl.evaluate`); one row per
        episode goes to eval_tasks.jsonl for paired comparisons. The evaluation before RL is the
        starting policy's, the same for every point that shares it: it is computed once and cached.
        The rows also feed the reward-hacking check (held-out, paired with the evaluation before RL);
        its diag/... metrics are returned apart from the evaluation's, as they are not evaluation metrics."""
        if update == 0:
            metrics, rows = evaluation.cached_start(self.cfg, self.policy.info, cache_dir(), lambda: self._evaluate(0))
        else:
            metrics, rows = self._evaluate(update)
        self.logger.log_eval_tasks(update, rows)
        return metrics, self.monitor.heldout(update, rows)

    def _evaluate(self, update: int) -> tuple[dict[str, float], list[dict]]:
        eval_plan = evaluation.plan(self.heldout, self.cfg.train.eval_episodes)
        return evaluation.evaluate(
            self.policy,
            self.cfg,
            self._venv,
            eval_plan,
            update=update,
            budget=self.eval_budget(update),
            instructions=self.instructions,
            markers=self.markers,
            env_of=self.env_of,
        )

    # ------------------------------------------------------------------ loop
    def run(self) -> dict:
        c = self.cfg
        modules = self.policy.trainable_modules()
        start, state = 0, {"best": self.best, "init_eval": None, "cost": {"episodes": 0.0, "generated_tokens": 0.0}}
        resumed = load_checkpoint(self.run_dir, modules, self.optimizer)
        if resumed is not None:
            start, state = resumed
            self.best = state["best"]
            self.monitor.load_state_dict(state["collapse"])
            self.sampler.load_state_dict(state.get("sampler_snapshots"))
            self.pool.load_state_dict(state.get("pool_snapshots"))
            self.logger.truncate_after(start)
        if c.rollout.concurrent and start < self.updates:  # starts generating while we evaluate
            self.concurrent = ConcurrentRollout(c, self.policy.model, start, self.updates, rollout_worker)
        if resumed is None:
            init, _ = self.evaluate(0)  # the check's reference: nothing to log yet
            state["init_eval"] = init
            self.logger.log(0, init)
            self._track_best(0, init)
        last_eval: dict[str, float] = state.get("last_eval") or state["init_eval"] or {}
        self.stages.detach()  # set-up is over: from here on the updates are the progress
        t_start = time.time()
        cost = state.setdefault("cost", {"episodes": 0.0, "generated_tokens": 0.0})
        wall_before = cost.get("wall_s", 0.0)  # wall time of earlier attempts (resume)
        for update in range(start + 1, self.updates + 1):
            metrics = self._one_update(update)
            cost["episodes"] += metrics["perf/episodes"]
            cost["generated_tokens"] += metrics["perf/rollout_tokens"]
            cost["wall_s"] = wall_before + time.time() - t_start
            if c.train.eval_every and update % c.train.eval_every == 0 or update == self.updates:
                last_eval, hacking = self.evaluate(update)
                state["last_eval"] = last_eval
                metrics.update(last_eval)
                metrics.update(hacking)
                self._track_best(update, last_eval)
            metrics.update(self.monitor.update(update, metrics))
            self.logger.log(update, metrics)
            # eval metrics ride along on evaluation updates (pruners of `harness tune` read them)
            self.progress(
                {
                    "update": update,
                    "updates": self.updates,
                    "success": metrics.get("env/success", 0.0),
                    "elapsed": time.time() - t_start,
                    **{k: v for k, v in metrics.items() if k.startswith("eval_")},
                }
            )
            if (c.train.checkpoint_every and update % c.train.checkpoint_every == 0) or update == self.updates:
                self._checkpoint(update, modules, state)
            if self.monitor.should_stop:
                self._checkpoint(update, modules, state)
                break
        if self.updates == 0 and resumed is None:
            state["collapse"] = self.monitor.state_dict()
            save_checkpoint(self.run_dir, 0, modules, self.optimizer, state)
        self.policy.save_adapter(self.run_dir / "adapter")
        return self._summary(state, last_eval)

    def _checkpoint(self, update: int, modules, state: dict) -> None:
        """Save weights, optimizer and the loop's state (best, collapse monitor, sampler snapshots)."""
        state["best"], state["collapse"] = self.best, self.monitor.state_dict()
        state["sampler_snapshots"] = self.sampler.state_dict()
        state["pool_snapshots"] = self.pool.state_dict()
        save_checkpoint(self.run_dir, update, modules, self.optimizer, state)

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

    def _one_update(self, update: int) -> dict[str, float]:
        budget = turn_budget_at(update - 1, self.cfg.turns)
        if self.concurrent is not None:  # rollout.concurrent: generated ahead by the rollout process
            got = self.concurrent.take(update)
            metrics = self._learn(update, budget, got.kept, got.all_eps, got.fstats, got.seconds)
            self.concurrent.publish(update, self.policy.model)
            return {**metrics, **rollout_metrics(got)}
        t0 = time.time()
        self.sampler.record()  # the weights this update starts from (rollout.staleness)
        self.pool.record(update)  # rollout.cross_policy
        act = self.cfg.act
        if act.mode == "stage" and update <= act.updates:  # an ACT update instead of an RL one
            act_eps, act_stats = self._act_rollout(update, self.cfg.rollout.tasks_per_update)
            return self._learn(update, budget, [], [], act_stats, time.time() - t0, act_eps)
        # rollout.backend vllm: the engine wakes with the adapter of the updates so far, sleeps for the update
        with self.vllm.awake(self.policy, update - 1) if self.vllm is not None else nullcontext():
            kept, all_eps, fstats = self._filtered_rollout(update, budget)
        act_eps: list[Episode] = []
        if self.act_questions:  # act.mode mixed
            act_eps, act_stats = self._act_rollout(update, self.act_questions)
            fstats = {**fstats, **act_stats}
        return self._learn(update, budget, kept, all_eps, fstats, time.time() - t0, act_eps)

    def _act_rollout(self, update: int, n: int) -> tuple[list[Episode], dict[str, float]]:
        """ACT questions of `update` (harness.rl.act) answered `group_size` times each by the policy."""
        c, G = self.cfg, self.cfg.rollout.group_size
        model = self.sampler.model()
        questions, stats = build_questions(c, model, self.policy.chat, update, n, self.task_offset)
        tasks = [(q, ACT_GROUP_BASE + q) for q in range(len(questions)) for _ in range(G)]
        if not tasks:
            return [], stats
        eps = collect(
            model,
            self.policy.chat,
            QuestionVenv(
                questions, len(tasks), c.env.format_penalty, self.env.parse_action if c.act.answer == "action" else None
            ),
            tasks,
            c,
            turn_budget=1,
            greedy=False,
            generator=_generator(c.train.seed, update, ACT_SALT),
            instructions=act_instructions(c),
        )
        return eps, stats

    def _learn(
        self, update: int, budget: int, kept, all_eps, fstats, t_roll: float, act_eps: list[Episode] | None = None
    ) -> dict[str, float]:
        """Everything of an update after its rollout: metrics of the episodes, the training batch, the
        update, diagnostics. `act_eps`: ACT answers trained with the RL episodes (their metrics act/*)."""
        c = self.cfg
        t0 = time.time()
        act_eps = act_eps or []
        trained = all_eps + act_eps
        metrics = {
            **(episode_metrics(all_eps, "env", self.markers) if all_eps else {}),
            **(per_env_metrics(all_eps, "env", self.env_of, self.markers) if all_eps and self.env_of else {}),
            **(group_reward_stats(all_eps) if all_eps else {}),
            **fstats,
            "env/turn_budget": float(budget),
            # training cost of this update (DAPO refills and ACT answers included), for compute-matched comparisons
            "perf/episodes": float(len(trained)),
            "perf/rollout_tokens": float(sum(len(s.action_ids) for e in trained for s in e.steps)),
        }
        if act_eps:
            metrics.update(episode_metrics(act_eps, "act", ()))
        kept = list(kept) + act_eps
        if self.judge is not None:
            metrics.update(process_metrics(all_eps))
        if c.rollout.cross_policy.members:  # share of the turns a stale member generated
            turns = [s.member for e in all_eps for s in e.steps]
            metrics["rollout/stale_turn_frac"] = sum(m > 0 for m in turns) / max(len(turns), 1)
        self.logger.log_samples(update, sample_rows(all_eps or act_eps, c.tracking.samples))
        # an environment error ends an episode early with a meaningless return: never train on it
        kept = [e for e in kept if e.steps and e.env_error is None]
        if not kept:
            metrics["train/skipped_empty"] = 1.0
            return metrics
        batch = self.training_batch(kept)
        if c.algo.distill.coef > 0:  # the teacher's log-probs, with the judge's hints (algo.distill)
            teacher = teacher_stream(self.teacher, self.policy.chat, kept, c, batch.stream_mask.shape[1])
            batch = replace(batch, teacher_logp=teacher.logp, distill_mask=teacher.mask)
        metrics.update(run_update(self.policy, self.optimizer, batch, c, _generator(c.train.seed, update, 99)))
        if all_eps:
            metrics["diag/cross_prompt_similarity"] = cross_prompt_similarity(
                [" ".join(s.action_text for s in e.steps) for e in all_eps], [e.task_seed for e in all_eps]
            )
        if c.train.mi_every and update % c.train.mi_every == 0 and all_eps:
            metrics.update(self._mi(all_eps))
        metrics["train/skipped_empty"] = 0.0
        metrics["perf/train_tokens"] = float(batch.attention_mask.sum())
        # wall times vary between identical runs: they go to timings.jsonl, so that
        # metrics.jsonl stays bit-identical for the same config and seed
        seconds = {"rollout_s": t_roll, "update_s": time.time() - t0}
        if self.judge is not None:  # included in rollout_s
            seconds["judge_s"], self._judge_s = self._judge_s, 0.0
        self.logger.log_timings(update, seconds)
        return metrics

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

    def _track_best(self, update: int, ev: dict[str, float]) -> None:
        s = ev.get("eval_greedy/success", 0.0)
        if s > self.best["success"]:
            self.best = {"update": update, "success": s}

    def _summary(self, state: dict, last_eval: dict[str, float]) -> dict:
        init = state.get("init_eval") or {}
        out = {f"final/{k}": v for k, v in last_eval.items()}
        out.update({f"init/{k}": v for k, v in init.items()})
        out["best/eval_greedy/success"] = self.best["success"]
        out["best/update"] = float(self.best["update"])
        out["updates"] = float(self.updates)
        out["collapsed_at"] = self.monitor.collapsed_at
        out["collapse_events"] = self.monitor.events
        # training cost: episodes and generated tokens of the rollouts trained on (refills included)
        # and wall time of the training loop, evaluations included
        out.update({f"cost/{k}": float(v) for k, v in state.get("cost", {}).items()})
        return out


def rollout_worker(cfg: RunConfig, folder: Path) -> Trainer:
    """The trainer a concurrent rollout process samples with (harness.rl.concurrent)."""
    return Trainer(cfg, folder, logger=None)


def train(cfg: RunConfig, run_dir: Path, logger, progress: ProgressFn | None = None) -> dict:
    """Run (or resume) one point; return its summary metrics."""
    trainer = Trainer(cfg, run_dir, logger, progress)
    try:
        return trainer.run()
    finally:
        trainer.close()
