"""Study files for `harness tune`: a base config, a search space over dotted config keys, an objective.

    name: tune_grpo                     # results/<name>/, MLflow experiment, Optuna study name
    base: ../configs/frozenlake_tiny.yaml   # or an inline mapping (as in sweep files)
    overrides: {train.updates: 10}      # optional: dotted keys set on the base for every trial
    space:                              # dotted config key -> distribution
      algo.lr: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}
      rollout.group_size: {type: categorical, choices: [2, 4]}
      algo.epochs: {type: int, low: 1, high: 3, step: 1}
    objective: gain                     # a name (OBJECTIVES) or {metric, direction, at}
    unmoved: reject                     # mark (default) | reject: trials whose policy did not move
    sampler: {name: tpe, seed: 0}       # tpe | random; other keys go to the Optuna sampler
    pruner: {name: median, n_startup_trials: 2}   # median | successive_halving | none
    n_trials: 8                         # finished (complete + pruned) trials the study aims at
    seeds: [0]                          # every trial runs once per seed; the objective is their mean

A trial is one point per seed (results/<name>/<point id>/, the layout of `harness sweep`), whose
id is a slug of the sampled values, the seed and the config hash: a trial that samples a config
run before reuses that point. The objective is `metric` in the point's metrics.jsonl at its last
evaluation (`at: final`), its best one after update 0 (`best`), or the last minus the update-0
evaluation (`gain`: what training changed on the held-out tasks), averaged over seeds. Pruners see
the metric (for `gain`, minus its update-0 value) at every evaluation, at step = update
(+ (updates + 1) x the seed's index, so a step means the same thing in every trial).

A point whose policy did not move (`movement`; docs/algorithms.md#did-not-move): with common random
numbers an unchanged policy repeats its held-out evaluation exactly, so a point did not move when
it has an evaluation after update 0, every evaluation after update 0 equals update 0's on each of
MOVEMENT_METRICS and the objective's metric, and its KL to the reference (`diag/kl_k3`, the mean
k3 estimate over action tokens at the start of each update) never exceeds `unmoved_kl` (a trainer
that logs no KL is judged by its evaluations alone). A trial did not move when none of its points did. With
`unmoved: mark` (the default) it stays complete and --show flags it (and warns when it is the best);
with `unmoved: reject` it ends `pruned` ("did not move"), so it can never be the best trial.

The space is checked before anything runs: each bound and choice goes through the normal config
loader, so an unknown key or an invalid value is a ConfigError. A sweep file given here is told so.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from harness.config.errors import ConfigError
from harness.config.keys import error_paragraph, flatten, iter_config_fields, kind_of, show_value, validation_lines
from harness.config.loading import apply_overrides, read_yaml, validate_run_config
from harness.diagnostics.episode_metrics import EVAL_METRICS, PROBE_METRICS
from harness.experiments.bases import check_base_kind, load_base
from harness.experiments.provenance import config_hash
from harness.experiments.samplers import make_pruner, make_sampler
from harness.experiments.sweep import SEED_KEY, Point, Seed, point_id, variant_slug

Scalar = None | bool | int | float | str


class ParamSpec(BaseModel):
    """One search-space entry (Optuna distributions: FloatDistribution, IntDistribution, Categorical)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["float", "int", "categorical"] = Field(description="Distribution kind.")
    low: float | None = Field(None, description="float / int: lower bound (inclusive).")
    high: float | None = Field(None, description="float / int: upper bound (inclusive).")
    log: bool = Field(False, description="float / int: sample on a log scale (low > 0).")
    step: float | None = Field(None, description="float / int: discretisation step (not with log).")
    choices: list[Scalar] | None = Field(None, description="categorical: the values (null, bool, number, text).")


class ObjectiveSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metric: str = Field("eval_greedy/success", description="A metrics.jsonl key of the held-out evaluation.")
    direction: Literal["maximize", "minimize"] = Field("maximize", description="Optimisation direction.")
    at: Literal["final", "best", "gain"] = Field(
        "final", description="Last evaluation, the best after update 0, or last minus update 0 (gain)."
    )

    def text(self) -> str:
        """How --show names it, e.g. 'gain of eval_sampled/success (last - update 0)'."""
        if self.at == "gain":
            return f"gain of {self.metric} (last - update 0)"
        return f"{self.metric} ({self.at})"


# Named objectives (`objective: gain`). Sampled success is the policy RL trains (greedy decoding of
# the tiny model starts high and moves little), and a gain rewards what training changed, not
# where the base model already was.
OBJECTIVES: dict[str, dict[str, str]] = {
    "gain": {"metric": "eval_sampled/success", "at": "gain"},
    "sampled_gain": {"metric": "eval_sampled/success", "at": "gain"},
    "greedy_gain": {"metric": "eval_greedy/success", "at": "gain"},
    "sampled_final": {"metric": "eval_sampled/success", "at": "final"},
    "greedy_final": {"metric": "eval_greedy/success", "at": "final"},
    "sampled_best": {"metric": "eval_sampled/success", "at": "best"},
    "greedy_best": {"metric": "eval_greedy/success", "at": "best"},
}


def named_objective(value: Any) -> Any:
    """`objective: NAME` -> its mapping (direction maximize); a mapping is returned as it is."""
    if not isinstance(value, str):
        return value
    if value in OBJECTIVES:
        return {**OBJECTIVES[value], "direction": "maximize"}
    near = difflib.get_close_matches(value, list(OBJECTIVES), n=1, cutoff=0.5)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise ValueError(
        f"objective = {show_value(value)} is not an objective name.{hint} Choose one of: "
        f"{', '.join(OBJECTIVES)}; or write a mapping {{metric, direction, at: final | best | gain}}"
    )


class NamedSpec(BaseModel):
    """`name` plus the keyword arguments of the Optuna class it names; a plain string is the name alone."""

    model_config = ConfigDict(extra="allow")

    name: str

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class StudySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="Study, results folder, MLflow experiment.")
    description: str = Field("", description="What the study is for.")
    base: dict[str, Any] | str = Field(default_factory=dict, description="Base config: inline or a relative path.")
    overrides: dict[str, Any] = Field(default_factory=dict, description="Dotted keys set on the base for every trial.")
    space: dict[str, ParamSpec] = Field(min_length=1, description="Dotted config key -> distribution.")
    objective: ObjectiveSpec = Field(
        default_factory=ObjectiveSpec, description="What to optimise: a name (OBJECTIVES) or {metric, direction, at}."
    )
    unmoved: Literal["mark", "reject"] = Field(
        "mark",
        description="A trial whose policy did not move (module doc): mark (it stays complete; --show flags it "
        "and warns when it is the best) or reject (it ends pruned, so it cannot be the best trial).",
    )
    unmoved_kl: float = Field(
        1.0e-3, ge=0.0, le=1.0, description="KL to the reference (diag/kl_k3) at or below which a point did not move."
    )
    sampler: NamedSpec = Field(default_factory=lambda: NamedSpec(name="tpe", seed=0), description="tpe | random.")
    pruner: NamedSpec = Field(
        default_factory=lambda: NamedSpec(name="median"), description="median | successive_halving | none."
    )
    n_trials: int = Field(10, ge=1, le=1_000_000, description="Finished (complete + pruned) trials the study aims at.")
    seeds: list[Seed] = Field([0], min_length=1, description="Seeds of every trial; the objective is their mean.")
    heartbeat_s: int = Field(
        30,
        ge=1,
        le=86_400,
        description="Optuna heartbeat: a trial silent for 2x this is stale (its worker died) and is queued again.",
    )

    _base_kind = field_validator("base", mode="before")(check_base_kind)
    _objective_name = field_validator("objective", mode="before")(named_objective)

    @field_validator("sampler", "pruner", mode="before")
    @classmethod
    def _plain_name(cls, value: Any, info: ValidationInfo) -> Any:
        """`sampler: random` is `sampler: {name: random}`."""
        if isinstance(value, str):
            return {"name": value}
        if not isinstance(value, dict):
            raise ValueError(
                f"{info.field_name} must be a name or a mapping with `name` and options, not {kind_of(value)}"
            )
        return value

    @model_validator(mode="after")
    def _distinct_seeds(self) -> StudySpec:
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds {self.seeds} contain duplicates")
        return self


@dataclass
class TuneStudy:
    spec: StudySpec
    path: Path
    base: dict[str, Any]

    @property
    def name(self) -> str:
        return self.spec.name

    def points(self, overrides: dict[str, Any], what: str = "trial") -> list[Point]:
        """One validated point per seed for these sampled values (ConfigError when invalid)."""
        out = []
        for seed in self.spec.seeds:
            source = f"{self.path} ({what}, seed {seed})"
            cfg = validate_run_config(
                apply_overrides(self.base, {**overrides, SEED_KEY: seed}, source),
                source,
                {k: "the search space" for k in overrides},
            )
            chash = config_hash(cfg)
            slug = variant_slug(overrides, None)
            out.append(Point(point_id(slug, seed, chash), slug, None, seed, dict(overrides), cfg, chash))
        return out


# ----------------------------------------------------------------------------- loading and checks
def _base(spec: StudySpec, path: Path) -> dict:
    raw = load_base(spec.base, path, "study")
    overrides = flatten(spec.overrides)
    if SEED_KEY in overrides:
        raise ConfigError(
            f"{path}: overrides.{SEED_KEY} = {show_value(overrides[SEED_KEY])}: a study's seeds come from "
            f"its `seeds:` list; write seeds: [{overrides[SEED_KEY]}] instead."
        )
    if overrides:
        raw = apply_overrides(raw, overrides, f"{path} (overrides)")
        validate_run_config(raw, f"{path} (overrides)", {k: "the study's overrides" for k in overrides})
    return raw


def load_study(path: str | Path) -> TuneStudy:
    """Read and check a study file: schema, search space (every bound and choice through the config
    loader), sampler and pruner options."""
    path = Path(path)
    raw = read_yaml(path, what="study")
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: a study file is a mapping with keys {', '.join(StudySpec.model_fields)}; got {kind_of(raw)}"
        )
    if "space" not in raw and (own := [k for k in SWEEP_ONLY_KEYS if k in raw]):
        raise ConfigError(
            f"{path}: this is a sweep file (it has {', '.join(own)} and no `space`); run it with "
            f"`harness sweep {path}`. A study file for `harness tune` has a `space` and an `objective`."
        )
    try:
        spec = StudySpec.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(error_paragraph(str(path), validation_lines(e, StudySpec))) from None
    study = TuneStudy(spec, path, _base(spec, path))
    problems = [p for key, param in spec.space.items() for p in _param_problems(study, key, param)]
    problems += _objective_problems(spec.objective)
    if problems:
        raise ConfigError(error_paragraph(str(path), problems))
    make_sampler(study)
    make_pruner(study)
    return study


# top-level keys of a sweep file (harness.experiments.sweep.SweepSpec) that no study file has
SWEEP_ONLY_KEYS = ("grid", "zip", "points", "baseline", "metric", "tables", "equivalence_margin")


def objective_metrics() -> list[str]:
    """The held-out evaluation metrics the trainer writes to metrics.jsonl (and reports to pruners)."""
    return [f"eval_{mode}/{name}" for mode in ("greedy", "sampled") for name in EVAL_METRICS + PROBE_METRICS]


def _objective_problems(objective: ObjectiveSpec) -> list[str]:
    names = objective_metrics()
    if objective.metric in names:
        return []
    near = difflib.get_close_matches(objective.metric, names, n=1, cutoff=0.6)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    return [
        f"objective.metric = {show_value(objective.metric)} is not a metric of the held-out evaluation.{hint} "
        f"Choose one of: {', '.join(names)}."
    ]


def _schema_fields() -> dict[str, Any]:
    return dict(iter_config_fields())


def _param_problems(study: TuneStudy, key: str, p: ParamSpec) -> list[str]:
    where = f"space.{key}"
    if key == SEED_KEY:
        return [f"{where}: the seed is set by the study's `seeds` list, not searched."]
    fields = _schema_fields()
    if key not in fields and not key.startswith("env.options."):
        near = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        return [f"{where}: unknown config key {key!r}.{hint} Every key: `harness config-docs`."]
    problems = _shape_problems(where, p)
    if problems:
        return problems
    info = fields.get(key)
    if p.type == "float" and info is not None and info.annotation is int:
        return [f"{where}: {key} is an integer setting; use type: int."]
    values = p.choices if p.type == "categorical" else [_num(p, p.low), _num(p, p.high)]
    for value in values or []:
        try:
            study.points({key: value}, f"space {key} = {show_value(value)}")
        except ConfigError as e:
            return [f"{where}: the value {show_value(value)} is not valid for the config: {e}"]
    return []


def _num(p: ParamSpec, value: float | None) -> float | int | None:
    return int(value) if p.type == "int" and value is not None else value


def _shape_problems(where: str, p: ParamSpec) -> list[str]:
    if p.type == "categorical":
        extra = [k for k in ("low", "high", "step") if getattr(p, k) is not None] + (["log"] if p.log else [])
        if extra:
            return [f"{where}: {', '.join(extra)} apply to float and int, not categorical (which takes choices)."]
        if not p.choices:
            return [f"{where}: categorical needs a non-empty list of choices."]
        if len({repr(c) for c in p.choices}) != len(p.choices):
            return [f"{where}: choices {p.choices} contain duplicates."]
        return []
    if p.choices is not None:
        return [f"{where}: choices apply to categorical, not {p.type} (which takes low, high, log, step)."]
    if p.low is None or p.high is None:
        return [f"{where}: {p.type} needs both low and high."]
    if p.type == "int" and any(v is not None and float(v) != int(v) for v in (p.low, p.high, p.step)):
        return [f"{where}: int bounds and step must be whole numbers (low = {p.low:g}, high = {p.high:g})."]
    if p.low > p.high:
        return [f"{where}: low = {p.low:g} is greater than high = {p.high:g}."]
    if p.log and p.low <= 0:
        return [f"{where}: log scale needs low > 0, got low = {p.low:g}."]
    if p.log and p.step is not None and not (p.type == "int" and p.step == 1):
        return [f"{where}: log and step cannot be combined (drop step, or log: false)."]
    if p.step is not None and p.step <= 0:
        return [f"{where}: step must be > 0, got {p.step:g}."]
    return []


def suggest(trial: Any, space: dict[str, ParamSpec]) -> dict[str, Any]:
    """Sample every parameter with `trial.suggest_*`; returns dotted key -> value."""
    out: dict[str, Any] = {}
    for key, p in space.items():
        if p.type == "categorical":
            out[key] = trial.suggest_categorical(key, p.choices)
        elif p.type == "int":
            out[key] = trial.suggest_int(key, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
        else:
            out[key] = trial.suggest_float(key, p.low, p.high, step=p.step, log=p.log)
    return out


# ----------------------------------------------------------------------------- objective values
MOVEMENT_METRICS = ("eval_greedy/success", "eval_sampled/success")
KL_METRIC = "diag/kl_k3"


def metric_series(rows: list[dict], metric: str) -> list[tuple[int, float]]:
    """(update, value) of every row that holds a finite number for `metric`, in file order."""
    return [
        (int(r.get("update", 0)), float(r[metric]))
        for r in rows
        if isinstance(r.get(metric), (int, float)) and not math.isnan(float(r[metric]))
    ]


def objective_value(rows: list[dict], spec: ObjectiveSpec, where: str) -> float:
    """The objective from one point's metrics.jsonl rows (see the module doc)."""
    evals = metric_series(rows, spec.metric)
    if not evals:
        known = sorted({k for r in rows for k in r if k.startswith("eval_")}) or sorted({k for r in rows for k in r})
        raise ConfigError(
            f"objective.metric {spec.metric!r} is not in {where}/metrics.jsonl; metrics there: {', '.join(known[:40])}."
        )
    if spec.at == "final":
        return evals[-1][1]
    if spec.at == "gain":
        return evals[-1][1] - start_value(evals, spec.metric, where)
    trained = [v for u, v in evals if u > 0] or [v for _, v in evals]
    return max(trained) if spec.direction == "maximize" else min(trained)


def start_value(evals: list[tuple[int, float]], metric: str, where: str) -> float:
    """The update-0 evaluation of `metric` (a gain needs it)."""
    start = [v for u, v in evals if u == 0]
    if not start:
        raise ConfigError(
            f"objective at: gain needs the update-0 evaluation of {metric!r}, and {where}/metrics.jsonl has none."
        )
    return start[0]


@dataclass(frozen=True)
class Movement:
    """Whether one point's policy moved (module doc): its evidence and the verdict."""

    evaluations: int  # evaluations after update 0
    changed: bool  # some evaluation after update 0 differs from update 0's
    kl_max: float | None  # the largest diag/kl_k3 over the updates (None: not logged)
    kl_limit: float

    @property
    def moved(self) -> bool | None:
        """False: did not move; True: moved; None: cannot tell (no evaluation after update 0)."""
        if self.evaluations == 0:
            return None
        return self.changed or (self.kl_max is not None and self.kl_max > self.kl_limit)


def movement(rows: list[dict], objective_metric: str, kl_limit: float) -> Movement:
    """The evidence of one point's metrics.jsonl rows (module doc)."""
    evaluations, changed = 0, False
    for metric in dict.fromkeys((*MOVEMENT_METRICS, objective_metric)):
        evals = metric_series(rows, metric)
        start = [v for u, v in evals if u == 0]
        later = [v for u, v in evals if u > 0]
        if start and later:
            evaluations = max(evaluations, len(later))
            changed = changed or any(v != start[0] for v in later)
    kl = [v for _, v in metric_series(rows, KL_METRIC)]
    return Movement(evaluations, changed, max(kl) if kl else None, kl_limit)
