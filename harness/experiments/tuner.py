"""Run an Optuna study (`harness tune`): trials are ordinary points run by `harness.experiments.point.run_point`.

Storage: any RDB URL (`--storage`), by default sqlite:///<results>/<name>/optuna.db, opened with
load_if_exists, so a study resumes and several workers (processes or hosts) share it. Each worker
runs one trial at a time until the study holds `n_trials` finished (complete + pruned) trials,
counting trials other workers are running; when only those are left it waits for them.

Interruptions: Ctrl-C (or SIGTERM) marks the running trial failed and queues its parameters again,
so the next run starts with it and its points resume from their checkpoints. A worker killed
outright leaves its trial `running`; once its heartbeat is older than 2 x `heartbeat_s` any worker
marks it failed and queues it again (Optuna's RetryHeartbeatStaleTrialCallback, 3 times at most).
Completed and pruned trials are never run again. A failed point fails its trial and the study goes
on; three failed trials in a row stop the worker. A study that already holds its target says so.

Trial numbers: every point's MLflow run is tagged with the study and the number of the trial that
ran it last (a trial that resumes an interrupted one's point re-tags its run, and adds
`resumes_trial`), the number --show lists. Each finished trial records whether its policy moved
(harness.experiments.study, `movement`); with `unmoved: reject` one that did not is pruned. After
every trial the study folder's sweep.json is rewritten (harness.experiments.study_report).
"""

from __future__ import annotations

import os
import socket
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from harness.config.errors import ConfigError, UnavailableError
from harness.experiments.point import RunOptions, point_dir, read_status, run_point
from harness.experiments.redact import mask_credentials
from harness.experiments.samplers import make_pruner, make_sampler
from harness.experiments.study import (
    Movement,
    TuneStudy,
    metric_series,
    movement,
    objective_value,
    start_value,
    suggest,
)
from harness.experiments.study_report import (  # noqa: F401 - describe and trial_lines: the --show API
    UNMOVED,
    counts,
    describe,
    show_value,
    trial_lines,
    write_manifest,
)
from harness.experiments.sweep import Point
from harness.experiments.tracking import ensure_experiment
from harness.store import CACHE, METRICS, OPTUNA_DB, read_jsonl

MAX_FAILED_IN_A_ROW = 3
FINISHED_STATES = (TrialState.COMPLETE, TrialState.PRUNED)


class Pruned(optuna.TrialPruned):
    """Raised from the trainer's progress callback; the runner records the point as `pruned`."""

    point_status = "pruned"


class PointFailed(Exception):
    """A point of the trial failed (the trial is marked failed; the study goes on)."""


@dataclass
class TuneOptions:
    results: Path = Path("results")
    storage: str | None = None  # None: sqlite under results/<name>/
    n_trials: int | None = None  # None: the study file's n_trials
    mlflow_uri: str | None = None  # None: MLflow off
    say: Callable[[str], None] = print
    env_info: dict[str, Any] = field(default_factory=dict)


def default_storage(results: Path, name: str) -> str:
    return f"sqlite:///{(Path(results).resolve() / name / OPTUNA_DB)}"


def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # we print our own lines; no tracebacks
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")


def open_storage(url: str, heartbeat_s: int) -> optuna.storages.RDBStorage:
    """An RDBStorage with heartbeats; a bad URL or a missing database driver is a ConfigError."""
    from sqlalchemy.exc import ArgumentError

    _quiet()
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///").split("?")[0]).parent.mkdir(parents=True, exist_ok=True)
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    last: Exception | None = None
    for attempt in range(4):  # two fresh workers may race to create the tables
        try:
            return optuna.storages.RDBStorage(
                url,
                engine_kwargs=kwargs,
                heartbeat_interval=heartbeat_s,
                grace_period=2 * heartbeat_s,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=3),
            )
        except (ImportError, ValueError, ArgumentError) as e:
            raise ConfigError(
                mask_credentials(
                    f"--storage {url}: cannot open it: {type(e).__name__}: {e}. Use an RDB URL such as "
                    f"sqlite:///path/optuna.db or postgresql://user@host/db (with its driver installed)."
                )
            ) from None
        except Exception as e:  # noqa: BLE001 - sqlalchemy errors: retry, then report
            last = e
            time.sleep(0.5 * (attempt + 1))
    raise UnavailableError(mask_credentials(f"cannot open the Optuna storage {url}: {type(last).__name__}: {last}"))


def load_optuna_study(study: TuneStudy, storage: Any, create: bool = True) -> optuna.Study:
    if not create:
        try:
            return optuna.load_study(
                study_name=study.name, storage=storage, sampler=make_sampler(study), pruner=make_pruner(study)
            )
        except KeyError:
            raise ConfigError(
                mask_credentials(
                    f"no study {study.name!r} in {getattr(storage, 'url', storage)}; "
                    f"run `harness tune {study.path}` first."
                )
            ) from None
    ostudy = optuna.create_study(
        study_name=study.name,
        storage=storage,
        sampler=make_sampler(study),
        pruner=make_pruner(study),
        direction=study.spec.objective.direction,
        load_if_exists=True,
    )
    want = optuna.study.StudyDirection[study.spec.objective.direction.upper()]
    if ostudy.direction != want:
        raise ConfigError(
            mask_credentials(
                f"{study.path}: objective.direction = {study.spec.objective.direction!r}, but the study "
                f"{study.name!r} in {storage.url} was created with {ostudy.direction.name.lower()}; "
                f"rename the study or use another --storage."
            )
        )
    return ostudy


# ----------------------------------------------------------------------------- one trial
class Tuner:
    def __init__(self, study: TuneStudy, opts: TuneOptions, ostudy: optuna.Study):
        self.study, self.opts, self.ostudy = study, opts, ostudy
        self.current: int | None = None  # number of the trial this worker runs
        self.outcome: str = ""
        self.worker = f"{socket.gethostname()}:{os.getpid()}"

    def objective(self, trial: optuna.Trial) -> float:
        self.current, self.outcome = trial.number, "failed"
        overrides = suggest(trial, self.study.spec.space)
        points = self.study.points(overrides, f"trial {trial.number}")
        trial.set_user_attr("points", [p.id for p in points])
        trial.set_user_attr("worker", self.worker)
        frozen = _trial(self.ostudy, trial.number)
        resumes = trial.user_attrs.get("resumes", frozen.system_attrs.get("failed_trial") if frozen else None)
        again = f" (again, for trial {resumes})" if resumes is not None else ""
        self.opts.say(f"trial {trial.number}{again}: " + " ".join(f"{k}={show_value(v)}" for k, v in overrides.items()))
        tags = {"study": self.study.name, "trial": str(trial.number)}
        if resumes is not None:
            tags["resumes_trial"] = str(resumes)
        done = [self._point_value(trial, p, i, tags) for i, p in enumerate(points)]
        values = [v for v, _ in done]
        trial.set_user_attr("values", values)
        self._judge_movement(trial, [m for _, m in done], statistics.fmean(values))
        self.outcome = "complete"
        return statistics.fmean(values)

    def _judge_movement(self, trial: optuna.Trial, moves: list[Movement], value: float) -> None:
        """Record whether the trial's policy moved (harness.experiments.study); with `unmoved: reject` a
        trial none of whose points moved ends pruned, so it can never be the best trial."""
        trial.set_user_attr("moved", [m.moved for m in moves])
        kl = [m.kl_max for m in moves if m.kl_max is not None]
        if kl:
            trial.set_user_attr("kl_max", max(kl))
        if not moves or any(m.moved is not False for m in moves):
            return
        trial.set_user_attr("unmoved", True)
        if self.study.spec.unmoved == "reject":
            self.outcome = "pruned"
            trial.set_user_attr("point_status", UNMOVED)
            trial.set_user_attr("rejected_value", value)
            raise optuna.TrialPruned(f"the policy did not move (objective {value:.4g} not counted)")

    def _progress(self, trial: optuna.Trial, step0: int, run_dir: Path) -> Callable[[dict], None]:
        obj = self.study.spec.objective
        start: list[float] = []  # the update-0 evaluation, for a gain

        def report(info: dict) -> None:
            value = info.get(obj.metric)
            if not (isinstance(value, (int, float)) and isinstance(info.get("update"), int)):
                return
            value = float(value)
            if obj.at == "gain":
                if not start:
                    evals = metric_series(read_jsonl(run_dir / METRICS), obj.metric)
                    start.append(start_value(evals, obj.metric, str(run_dir)))
                value -= start[0]
            trial.report(value, step0 + info["update"])
            if trial.should_prune():
                raise Pruned(f"pruned at update {info['update']}: {obj.text()} = {value:g}")

        return report

    def _point_value(
        self, trial: optuna.Trial, point: Point, index: int, tags: dict[str, str]
    ) -> tuple[float, Movement]:
        run_dir = point_dir(self.opts.results, self.study.name, point)
        if read_status(run_dir) == "pruned":  # the same config was pruned in an earlier trial
            self.outcome = "pruned"
            raise optuna.TrialPruned(f"point {point.id} was pruned in an earlier trial")
        opts = RunOptions(
            self.opts.results,
            self.opts.mlflow_uri,
            retry_failed=True,
            env_info=self.opts.env_info,
            tags=tags,
        )
        step0 = index * (point.config.train.updates + 1)
        # another worker running this very config: wait for it to let go, then use its result
        res = run_point(point, self.study.name, opts, self._progress(trial, step0, run_dir), wait=True)
        status = read_status(run_dir) if res["status"] == "skipped" else res["status"]
        if status in ("pruned", "diverged"):
            self.outcome = "pruned"
            trial.set_user_attr("point_status", status)
            raise optuna.TrialPruned(f"point {point.id} {status}: {res.get('error') or ''}".rstrip(": "))
        if status != "done":
            raise PointFailed(f"point {point.id} {status}: {res.get('error')} (see {run_dir})")
        rows, spec = read_jsonl(run_dir / METRICS), self.study.spec
        return objective_value(rows, spec.objective, str(run_dir)), movement(
            rows, spec.objective.metric, spec.unmoved_kl
        )

    def requeue_current(self) -> None:
        """After Ctrl-C: queue the interrupted trial's parameters, so the next run resumes its points."""
        if self.current is None:
            return
        for t in self.ostudy.get_trials(deepcopy=False):
            if t.number == self.current and t.state in (TrialState.FAIL, TrialState.RUNNING):
                self.ostudy.enqueue_trial(t.params, user_attrs={"resumes": t.number})


# ----------------------------------------------------------------------------- the study
def run_study(study: TuneStudy, opts: TuneOptions) -> optuna.Study:
    """Run trials until the study holds n_trials finished ones (see the module doc)."""
    opts.results = Path(opts.results)
    (opts.results / study.name).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HARNESS_CACHE", str(opts.results / CACHE))
    if not opts.env_info:
        from harness.experiments.provenance import environment

        opts.env_info = environment()
    if opts.mlflow_uri:
        try:
            ensure_experiment(opts.mlflow_uri, study.name)
        except Exception as e:  # noqa: BLE001 - points retry and warn by themselves
            opts.say(mask_credentials(f"warning: MLflow store {opts.mlflow_uri} not ready: {type(e).__name__}: {e}"))
    storage = open_storage(opts.storage or default_storage(opts.results, study.name), study.spec.heartbeat_s)
    ostudy = load_optuna_study(study, storage)
    tuner, target, failed_in_a_row, waiting_said = (
        Tuner(study, opts, ostudy),
        opts.n_trials or study.spec.n_trials,
        0,
        False,
    )
    ran = 0
    while True:
        optuna.storages.fail_stale_trials(ostudy)
        n = counts(ostudy)
        finished = sum(n[s] for s in FINISHED_STATES)
        if finished >= target:
            if not ran and not waiting_said:
                opts.say(
                    f"study {study.name}: target reached: it holds {finished} finished trials and the target is "
                    f"{target} ({'--n-trials' if opts.n_trials else 'n_trials'}); nothing to run. "
                    f"`--n-trials {finished + 5}` runs 5 more."
                )
            write_manifest(study, ostudy, opts.results)
            return ostudy
        if finished + n[TrialState.RUNNING] >= target:
            if not waiting_said:
                opts.say(f"waiting for {n[TrialState.RUNNING]} trial(s) running in other workers")
                waiting_said = True
            time.sleep(min(5.0, study.spec.heartbeat_s))
            continue
        tuner.current, tuner.outcome = None, ""
        t0 = time.monotonic()
        try:
            ostudy.optimize(tuner.objective, n_trials=1, catch=(PointFailed,), gc_after_trial=False)
        except KeyboardInterrupt:
            tuner.requeue_current()
            raise
        ran += 1
        _say_trial(ostudy, tuner, opts, time.monotonic() - t0)
        write_manifest(study, ostudy, opts.results)
        failed_in_a_row = failed_in_a_row + 1 if tuner.outcome == "failed" else 0
        if failed_in_a_row >= MAX_FAILED_IN_A_ROW:
            raise UnavailableError(
                f"{failed_in_a_row} trials failed in a row (last: trial {tuner.current}); see the "
                f"traceback.txt of its points under {opts.results / study.name}"
            )


def _trial(ostudy: optuna.Study, number: int | None) -> optuna.trial.FrozenTrial | None:
    return next((t for t in ostudy.get_trials(deepcopy=False) if t.number == number), None)


def _say_trial(ostudy: optuna.Study, tuner: Tuner, opts: TuneOptions, wall_s: float) -> None:
    t = _trial(ostudy, tuner.current)
    if t is None:
        return
    value = f" value {t.value:.4g}" if t.value is not None and t.state == TrialState.COMPLETE else ""
    if "rejected_value" in t.user_attrs:
        value = f" (value {t.user_attrs['rejected_value']:.4g} not counted)"
    elif t.user_attrs.get("unmoved"):
        value += f" ({UNMOVED}: see `harness tune {tuner.study.path} --show`)"
    state = t.state.name.lower()
    why = t.user_attrs.get("point_status", state)
    opts.say(f"trial {t.number} {state}{' (' + why + ')' if why != state else ''}{value} in {wall_s:.1f} s")


def show_study(study: TuneStudy, results: Path, storage_url: str | None) -> list[str]:
    """What --show prints (harness.experiments.study_report.describe); refreshes the study's sweep.json."""
    url = storage_url or default_storage(results, study.name)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///").split("?")[0]).exists():
        raise ConfigError(
            f"no study {study.name!r} yet: {url} does not exist; run `harness tune {study.path}` "
            f"first (or pass its --storage / --results)."
        )
    ostudy = load_optuna_study(study, open_storage(url, study.spec.heartbeat_s), create=False)
    write_manifest(study, ostudy, results)
    return describe(study, ostudy, results)
