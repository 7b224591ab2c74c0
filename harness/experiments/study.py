"""Study files for `harness tune`: a base config, a search space over dotted config keys, an objective.

    name: tune_grpo                     # results/<name>/, MLflow experiment, Optuna study name
    base: ../configs/frozenlake_tiny.yaml   # or an inline mapping (as in sweep files)
    overrides: {train.updates: 10}      # optional: dotted keys set on the base for every trial
    space:                              # dotted config key -> distribution
      algo.lr: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}
      rollout.group_size: {type: categorical, choices: [2, 4]}
      algo.epochs: {type: int, low: 1, high: 3, step: 1}
    objective: {metric: eval_greedy/success, direction: maximize, at: final}   # at: final | best
    sampler: {name: tpe, seed: 0}       # tpe | random; other keys go to the Optuna sampler
    pruner: {name: median, n_startup_trials: 2}   # median | successive_halving | none
    n_trials: 8                         # finished (complete + pruned) trials the study aims at
    seeds: [0]                          # every trial runs once per seed; the objective is their mean

A trial is one point per seed (results/<name>/<point id>/, the layout of `harness sweep`), whose
id is a slug of the sampled values, the seed and the config hash: a trial that samples a config
run before reuses that point. The objective is `metric` in the point's metrics.jsonl at its last
evaluation (`final`) or its best one after update 0 (`best`), averaged over seeds. Pruners see the
metric at every evaluation, at step = update (+ (updates + 1) x the seed's index, so a step means
the same thing in every trial). The space is checked before anything runs: each bound and choice
goes through the normal config loader, so an unknown key or an invalid value is a ConfigError.
"""

from __future__ import annotations

import collections.abc
import difflib
import inspect
import math
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from harness.config.errors import ConfigError
from harness.config.schema import SEED_MAX, SEED_MIN
from harness.diagnostics.episode_metrics import EVAL_METRICS
from harness.experiments.loading import (
    apply_overrides,
    check_base_kind,
    error_paragraph,
    flatten,
    iter_config_fields,
    kind_of,
    load_base,
    read_yaml,
    show_value,
    validate_run_config,
    validation_lines,
)
from harness.experiments.provenance import config_hash
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
    at: Literal["final", "best"] = Field("final", description="Last evaluation, or the best after update 0.")


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
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec, description="What to optimise.")
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
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "successive_halving", "none")


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


def objective_metrics() -> list[str]:
    """The held-out evaluation metrics the trainer writes to metrics.jsonl (and reports to pruners)."""
    return [f"eval_{mode}/{name}" for mode in ("greedy", "sampled") for name in EVAL_METRICS]


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


# ----------------------------------------------------------------------------- sampler / pruner
def _construct(cls: type, options: dict[str, Any], where: str, src: Path, build: Any = None) -> Any:
    """cls(**options) (or build(**options)), with options checked against cls's signature."""
    params = [n for n in inspect.signature(cls).parameters if n != "self"]
    unknown = [k for k in options if k not in params]
    if unknown:
        raise ConfigError(
            f"{src}: {where}: unknown option {unknown[0]!r} for {cls.__name__}; valid options: {', '.join(params)}."
        )
    for name, value in options.items():
        problem = _option_problem(cls, name, value)
        if problem:
            raise ConfigError(f"{src}: {where}.{name} = {show_value(value)}: {problem}")
    try:
        return (build or cls)(**options)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{src}: {where}: {cls.__name__}({show_value(options)}) is invalid: {e}") from None


def _option_problem(cls: type, name: str, value: Any) -> str | None:
    """Why `value` does not fit the annotated type of `cls`'s parameter `name` (None when it does)."""
    if name == "seed" and value is not None and not (isinstance(value, int) and SEED_MIN <= value <= SEED_MAX):
        return f"a seed is a whole number from {SEED_MIN} to {SEED_MAX}."
    annotation = inspect.signature(cls).parameters[name].annotation
    if annotation is inspect.Parameter.empty:
        return None
    try:
        namespace = {**vars(typing), **vars(collections.abc), **vars(sys.modules[cls.__module__])}
        hint = eval(annotation, namespace) if isinstance(annotation, str) else annotation  # Optuna's own text
        TypeAdapter(hint).validate_python(value, strict=True)
    except ValidationError as e:
        shown = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
        return f"{e.errors(include_url=False)[0]['msg']} ({cls.__name__} takes {name}: {shown})."
    except Exception:  # noqa: BLE001 - an annotation we cannot evaluate: let the class check the value
        return None
    return None


def _reseeded(cls: type) -> type:
    """The sampler seeded afresh for every trial from (seed, trial number): parallel workers draw
    different values, and a resumed study draws what an uninterrupted one would."""

    class PerTrialSeed(cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, seed: int | None = None, **kwargs: Any) -> None:
            super().__init__(*args, seed=seed, **kwargs)
            self._harness_seed = seed

        def before_trial(self, study: Any, trial: Any) -> None:
            if self._harness_seed is not None:
                seed = (int(self._harness_seed) * 1_000_003 + trial.number) % 2**32
                for sampler in (self, getattr(self, "_random_sampler", None)):
                    rng = getattr(sampler, "_rng", None)  # optuna's LazyRandomState
                    if rng is not None and hasattr(rng, "rng"):
                        rng.rng.seed(seed)
            super().before_trial(study, trial)

    PerTrialSeed.__name__ = cls.__name__
    return PerTrialSeed


def make_sampler(study: TuneStudy) -> Any:
    import optuna

    s = study.spec.sampler
    classes = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}
    if s.name not in classes:
        raise ConfigError(
            f"{study.path}: sampler.name = {s.name!r} is not a valid choice; choose one of: {', '.join(SAMPLERS)}."
        )
    cls = classes[s.name]
    return _construct(cls, {"seed": 0, **s.options()}, "sampler", study.path, build=_reseeded(cls))


def make_pruner(study: TuneStudy) -> Any:
    import optuna

    p = study.spec.pruner
    classes = {
        "median": optuna.pruners.MedianPruner,
        "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
        "none": optuna.pruners.NopPruner,
    }
    if p.name not in classes:
        raise ConfigError(
            f"{study.path}: pruner.name = {p.name!r} is not a valid choice; choose one of: {', '.join(PRUNERS)}."
        )
    return _construct(classes[p.name], p.options(), "pruner", study.path)


# ----------------------------------------------------------------------------- objective values
def objective_value(rows: list[dict], spec: ObjectiveSpec, where: str) -> float:
    """The objective from one point's metrics.jsonl rows (see the module doc)."""
    evals = [
        (r.get("update", 0), float(r[spec.metric]))
        for r in rows
        if isinstance(r.get(spec.metric), (int, float)) and not math.isnan(float(r[spec.metric]))
    ]
    if not evals:
        known = sorted({k for r in rows for k in r if k.startswith("eval_")}) or sorted({k for r in rows for k in r})
        raise ConfigError(
            f"objective.metric {spec.metric!r} is not in {where}/metrics.jsonl; metrics there: {', '.join(known[:40])}."
        )
    if spec.at == "final":
        return evals[-1][1]
    trained = [v for u, v in evals if u > 0] or [v for _, v in evals]
    return max(trained) if spec.direction == "maximize" else min(trained)
