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
on; three failed trials in a row stop the worker.
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
from harness.experiments.study import TuneStudy, objective_value, suggest
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
        self.opts.say(f"trial {trial.number}{again}: " + " ".join(f"{k}={_show(v)}" for k, v in overrides.items()))
        values = [self._point_value(trial, p, i) for i, p in enumerate(points)]
        trial.set_user_attr("values", values)
        self.outcome = "complete"
        return statistics.fmean(values)

    def _progress(self, trial: optuna.Trial, step0: int) -> Callable[[dict], None]:
        metric = self.study.spec.objective.metric

        def report(info: dict) -> None:
            value = info.get(metric)
            if isinstance(value, (int, float)) and isinstance(info.get("update"), int):
                trial.report(float(value), step0 + info["update"])
                if trial.should_prune():
                    raise Pruned(f"pruned at update {info['update']}: {metric} = {value:g}")

        return report

    def _point_value(self, trial: optuna.Trial, point: Point, index: int) -> float:
        run_dir = point_dir(self.opts.results, self.study.name, point)
        if read_status(run_dir) == "pruned":  # the same config was pruned in an earlier trial
            self.outcome = "pruned"
            raise optuna.TrialPruned(f"point {point.id} was pruned in an earlier trial")
        opts = RunOptions(
            self.opts.results,
            self.opts.mlflow_uri,
            retry_failed=True,
            env_info=self.opts.env_info,
            tags={"study": self.study.name, "trial": str(trial.number)},
        )
        step0 = index * (point.config.train.updates + 1)
        # another worker running this very config: wait for it to let go, then use its result
        res = run_point(point, self.study.name, opts, self._progress(trial, step0), wait=True)
        status = read_status(run_dir) if res["status"] == "skipped" else res["status"]
        if status in ("pruned", "diverged"):
            self.outcome = "pruned"
            trial.set_user_attr("point_status", status)
            raise optuna.TrialPruned(f"point {point.id} {status}: {res.get('error') or ''}".rstrip(": "))
        if status != "done":
            raise PointFailed(f"point {point.id} {status}: {res.get('error')} (see {run_dir})")
        return objective_value(read_jsonl(run_dir / METRICS), self.study.spec.objective, str(run_dir))

    def requeue_current(self) -> None:
        """After Ctrl-C: queue the interrupted trial's parameters, so the next run resumes its points."""
        if self.current is None:
            return
        for t in self.ostudy.get_trials(deepcopy=False):
            if t.number == self.current and t.state in (TrialState.FAIL, TrialState.RUNNING):
                self.ostudy.enqueue_trial(t.params, user_attrs={"resumes": t.number})


# ----------------------------------------------------------------------------- the study
def _counts(ostudy: optuna.Study) -> dict[TrialState, int]:
    counts = {s: 0 for s in TrialState}
    for t in ostudy.get_trials(deepcopy=False):
        counts[t.state] += 1
    return counts


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
    while True:
        optuna.storages.fail_stale_trials(ostudy)
        counts = _counts(ostudy)
        finished = sum(counts[s] for s in FINISHED_STATES)
        if finished >= target:
            return ostudy
        if finished + counts[TrialState.RUNNING] >= target:
            if not waiting_said:
                opts.say(f"waiting for {counts[TrialState.RUNNING]} trial(s) running in other workers")
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
        _say_trial(ostudy, tuner, opts, time.monotonic() - t0)
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
    state = t.state.name.lower()
    why = t.user_attrs.get("point_status", state)
    opts.say(f"trial {t.number} {state}{' (' + why + ')' if why != state else ''}{value} in {wall_s:.1f} s")


def _show(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else repr(value)


# ----------------------------------------------------------------------------- --show
MIN_TRIALS_FOR_IMPORTANCE = 4


def trial_lines(ostudy: optuna.Study) -> list[str]:
    """Every trial, in number order: state (and why, for pruned ones), value, parameters."""
    out = []
    for t in sorted(ostudy.get_trials(deepcopy=False), key=lambda t: t.number):
        state = t.state.name.lower()
        why = t.user_attrs.get("point_status")
        value = f"{t.value:.4g}" if t.value is not None and t.state == TrialState.COMPLETE else "-"
        params = " ".join(f"{k}={_show(v)}" for k, v in t.params.items())
        out.append(f"  {t.number:>4}  {state + (f' ({why})' if why and why != state else ''):<18} {value:>8}  {params}")
    return out


def importance_lines(ostudy: optuna.Study, complete: list[optuna.trial.FrozenTrial]) -> list[str]:
    """fANOVA importances (Optuna's default), or one line saying why they are not shown: with
    fewer than MIN_TRIALS_FOR_IMPORTANCE complete trials, or a constant objective, a ranking of
    parameters would be noise."""
    if len(complete) < MIN_TRIALS_FOR_IMPORTANCE:
        return [
            f"parameter importances: not shown: {len(complete)} complete trial(s); at least "
            f"{MIN_TRIALS_FOR_IMPORTANCE} are needed for a ranking that is not noise"
        ]
    values = {t.value for t in complete}
    if len(values) == 1:
        return [f"parameter importances: not shown: every complete trial has the same objective ({values.pop():.4g})"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # fANOVA's random forest with a fixed seed: the same study prints the same ranking
            evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
            importances = optuna.importance.get_param_importances(ostudy, evaluator=evaluator)
    except Exception as e:  # noqa: BLE001 - e.g. a parameter with a single value
        return [f"parameter importances: not available: {type(e).__name__}: {e}"]
    width = max((len(k) for k in importances), default=0)
    return ["parameter importances:"] + [f"  {k:<{width}}  {v:.3f}" for k, v in importances.items()]


def describe(study: TuneStudy, ostudy: optuna.Study, results: Path) -> list[str]:
    """The study's counts, every trial, the best trial (values, points) and parameter importances."""
    counts = _counts(ostudy)
    obj = study.spec.objective
    summary = ", ".join(f"{n} {s.name.lower()}" for s, n in counts.items() if n)
    lines = [
        f"study {study.name}: {sum(counts.values())} trials ({summary or 'none yet'}); objective: {obj.direction} "
        f"{obj.metric} ({obj.at}), mean over seeds {study.spec.seeds}"
    ]
    if sum(counts.values()):
        lines += ["trials:", f"  {'#':>4}  {'state':<18} {'value':>8}  parameters"] + trial_lines(ostudy)
    complete = [t for t in ostudy.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not complete:
        return lines + ["no complete trial yet"]
    best = ostudy.best_trial
    lines.append(f"best trial {best.number}: {obj.metric} = {best.value:.4g}")
    lines += [f"  {k} = {_show(v)}" for k, v in best.params.items()]
    lines += [f"  point: {Path(results) / study.name / p}" for p in best.user_attrs.get("points", [])]
    return lines + importance_lines(ostudy, complete)


def show_study(study: TuneStudy, results: Path, storage_url: str | None) -> list[str]:
    url = storage_url or default_storage(results, study.name)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///").split("?")[0]).exists():
        raise ConfigError(
            f"no study {study.name!r} yet: {url} does not exist; run `harness tune {study.path}` "
            f"first (or pass its --storage / --results)."
        )
    ostudy = load_optuna_study(study, open_storage(url, study.spec.heartbeat_s), create=False)
    return describe(study, ostudy, results)
