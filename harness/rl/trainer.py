"""The shared trainer: every sweep point runs through `train`.

Loop (one row of metrics.jsonl per update; row 0 = the held-out evaluation before RL):

    policy (+ SFT warm-up, from the run's demonstrations) -> resume checkpoint if present
    for each update:
        rollout worker (harness.rl.worker): tasks -> rollout -> group filter (dapo may refill)
            synchronously, or ahead of the learner in a rollout process (harness.rl.concurrent)
        -> learner (harness.rl.learner): training batch -> update -> diagnostics
        -> metrics.jsonl + MLflow; held-out eval every k; checkpoint every k
    final evaluation, adapter saved in PEFT format, summary returned to the runner
"""

from __future__ import annotations

import time
from pathlib import Path

from harness.config.schema import RunConfig
from harness.diagnostics.collapse import CollapseMonitor
from harness.diagnostics.episode_metrics import sample_rows
from harness.model.cache import cache_dir
from harness.rl import evaluate as evaluation
from harness.rl.build import build_policy, resolve_device
from harness.rl.concurrent import ConcurrentRollout, rollout_metrics
from harness.rl.demos import Demonstrations
from harness.rl.distill import teacher_model
from harness.rl.learner import Learner
from harness.rl.preflight import check_fits_env
from harness.rl.seeding import start_process
from harness.rl.stages import ProgressFn, StageForwarder
from harness.rl.turns import turn_budget_at
from harness.rl.worker import RolloutWorker


def planned_updates(cfg: RunConfig) -> int:
    """train.updates, or what the SFT/RL split budget leaves for RL (Practitioner's Guide)."""
    if cfg.sft.budget is None:
        return cfg.train.updates
    rl_episodes = cfg.sft.budget - cfg.sft.demos * cfg.sft.demo_cost
    return int(rl_episodes // (cfg.rollout.tasks_per_update * cfg.rollout.group_size))


class Trainer:
    """One run: a rollout worker and a learner wired together, with evaluation, logs and checkpoints."""

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
        # the run's only seeding in this process (the runner does not seed): nothing before it draws
        # a random number, so every caller of `train` (runner, tests, bench) starts from the same state
        start_process(cfg.train.seed, cfg.train.threads)
        self.device = resolve_device(cfg.train.device)
        self.demos = Demonstrations.of(cfg)  # played on demand, once: tiny model, SFT warm-up, pre-flight
        self.policy, source = build_policy(cfg, cache_dir(), self.device, self.demos)
        self.worker = RolloutWorker(cfg, self.policy, source, self.device)
        # algo.distill's teacher (used when coef > 0) may be the step judge's model
        self.learner = Learner(cfg, self.policy, self.worker.env, teacher_model(cfg, self.policy, self.worker.judge))
        w, lr = self.worker, self.learner
        self.evaluation = evaluation.RunEvaluation(
            cfg, self.policy, w.venvs, instructions=w.env.instructions, markers=lr.markers, env_of=lr.env_of
        )
        check_fits_env(cfg, self.policy.chat, self.evaluation.heldout, self.demos)  # before any rollout
        self.updates = planned_updates(cfg)
        self.best = {"update": 0, "success": -1.0}
        self.concurrent: ConcurrentRollout | None = None  # rollout.concurrent, started by run()
        self.monitor = CollapseMonitor(stop_on=("echo_trap",) if cfg.train.early_stop_on_collapse else ())

    def close(self) -> None:
        self.stages.detach()
        if self.concurrent is not None:
            self.concurrent.close()
        self.worker.close()

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, update: int) -> tuple[dict[str, float], dict[str, float]]:
        """Held-out evaluation with common random numbers (`harness.rl.evaluate`); one row per
        episode goes to eval_tasks.jsonl for paired comparisons. The evaluation before RL is the
        starting policy's, the same for every point that shares it: it is computed once and cached.
        The rows also feed the reward-hacking check (held-out, paired with the evaluation before RL);
        its diag/... metrics are returned apart from the evaluation's, as they are not evaluation metrics."""
        metrics, rows = self.evaluation.run(update)
        self.logger.log_eval_tasks(update, rows)
        return metrics, self.monitor.heldout(update, rows)

    # ------------------------------------------------------------------ loop
    def run(self) -> dict:
        """Resume or start, run the remaining updates, save the adapter; return the run's summary."""
        t = self.cfg.train
        start, state, resumed = self._start()
        last_eval: dict[str, float] = state.get("last_eval") or state["init_eval"] or {}
        self.stages.detach()  # set-up is over: from here on the updates are the progress
        t_start = time.time()
        cost = state.setdefault("cost", {"episodes": 0.0, "generated_tokens": 0.0})
        wall_before = cost.get("wall_s", 0.0)  # wall time of earlier attempts (resume)
        for update in range(start + 1, self.updates + 1):
            metrics = self.one_update(update)
            cost["episodes"] += metrics["perf/episodes"]
            cost["generated_tokens"] += metrics["perf/rollout_tokens"]
            cost["wall_s"] = wall_before + time.time() - t_start
            if t.eval_every and update % t.eval_every == 0 or update == self.updates:
                last_eval, hacking = self.evaluate(update)
                state["last_eval"] = last_eval
                metrics.update({**last_eval, **hacking})
                self._track_best(update, last_eval)
            metrics.update(self.monitor.update(update, metrics))
            self.logger.log(update, metrics)
            # eval metrics ride along on evaluation updates (pruners of `harness tune` read them)
            evals = {k: v for k, v in metrics.items() if k.startswith("eval_")}
            success, elapsed = metrics.get("env/success", 0.0), time.time() - t_start
            self.progress({"update": update, "updates": self.updates, "success": success, "elapsed": elapsed, **evals})
            due = t.checkpoint_every and update % t.checkpoint_every == 0 or update == self.updates
            if due or self.monitor.should_stop:
                self._checkpoint(update, state)
            if self.monitor.should_stop:
                break
        if self.updates == 0 and not resumed:
            state["collapse"] = self.monitor.state_dict()
            self.learner.save(self.run_dir, 0, state)
        self.policy.save_adapter(self.run_dir / "adapter")
        return self._summary(state, last_eval)

    def _start(self) -> tuple[int, dict, bool]:
        """(the last update done, the loop's state, whether a checkpoint was resumed): the checkpoint's,
        or a fresh start with the evaluation before RL; the concurrent rollout starts meanwhile."""
        start, state = 0, {"best": self.best, "init_eval": None, "cost": {"episodes": 0.0, "generated_tokens": 0.0}}
        resumed = self.learner.resume(self.run_dir)
        if resumed is not None:
            start, state = resumed
            self.best = state["best"]
            self.monitor.load_state_dict(state["collapse"])
            self.worker.load_state_dict(state)
            self.logger.truncate_after(start)
        if self.cfg.rollout.concurrent and start < self.updates:  # starts generating while we evaluate
            self.concurrent = ConcurrentRollout(self.cfg, self.policy.model, start, self.updates)
        if resumed is None:
            init, _ = self.evaluate(0)  # the check's reference: nothing to log yet
            state["init_eval"] = init
            self.logger.log(0, init)
            self._track_best(0, init)
        return start, state, resumed is not None

    def one_update(self, update: int) -> dict[str, float]:
        """Update `update` (1-based): its batch from the worker (or the rollout process), then the learner."""
        budget = turn_budget_at(update - 1, self.cfg.turns)
        # rollout.concurrent: generated ahead by the rollout process
        batch = self.concurrent.take(update) if self.concurrent is not None else self.worker.rollout(update, budget)
        self.logger.log_samples(update, sample_rows(batch.all_eps or batch.act_eps, self.cfg.tracking.samples))
        metrics, seconds = self.learner.learn(batch, budget)
        if seconds is not None:
            self.logger.log_timings(update, seconds)
        if self.concurrent is not None:
            self.concurrent.publish(update, self.policy.model)
            metrics.update(rollout_metrics(batch))
        return metrics

    def _checkpoint(self, update: int, state: dict) -> None:
        """Save weights, optimizer and the loop's state (best, collapse monitor, sampler snapshots)."""
        state["best"], state["collapse"] = self.best, self.monitor.state_dict()
        state.update(self.worker.state_dict())
        self.learner.save(self.run_dir, update, state)

    def _track_best(self, update: int, ev: dict[str, float]) -> None:
        s = ev.get("eval_greedy/success", 0.0)
        if s > self.best["success"]:
            self.best = {"update": update, "success": s}

    def _summary(self, state: dict, last_eval: dict[str, float]) -> dict:
        init = state.get("init_eval") or {}
        out = {f"final/{k}": v for k, v in last_eval.items()}
        out.update({f"init/{k}": v for k, v in init.items()})
        out.update({"best/eval_greedy/success": self.best["success"], "best/update": float(self.best["update"])})
        out.update({"updates": float(self.updates), "collapsed_at": self.monitor.collapsed_at})
        out["collapse_events"] = self.monitor.events
        # training cost: episodes and generated tokens of the rollouts trained on (refills included)
        # and wall time of the training loop, evaluations included
        out.update({f"cost/{k}": float(v) for k, v in state.get("cost", {}).items()})
        # which weights RL started from: tiny:<key>, packaged:<name>-<hash>, a folder or a hub id; sft:<key>
        out.update({f"model/{k}": self.policy.info[k] for k in ("base", "sft") if k in self.policy.info})
        return out


def train(cfg: RunConfig, run_dir: Path, logger, progress: ProgressFn | None = None) -> dict:
    """Run (or resume) one point; return its summary metrics."""
    trainer = Trainer(cfg, run_dir, logger, progress)
    try:
        return trainer.run()
    finally:
        trainer.close()
