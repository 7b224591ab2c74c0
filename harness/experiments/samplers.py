"""The Optuna sampler and pruner of a study file (`sampler:` / `pruner:`): a name and the keyword
arguments of the class it names, each checked against the type annotated in that class's
signature, so a wrong option is a ConfigError when the file loads, not an error in a trial.
"""

from __future__ import annotations

import collections.abc
import inspect
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from harness.config.errors import ConfigError
from harness.config.keys import show_value
from harness.config.schema import SEED_MAX, SEED_MIN

SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "successive_halving", "none")


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


def make_sampler(study: Any) -> Any:
    """The sampler of a `harness.experiments.study.TuneStudy` (`study.spec.sampler`)."""
    import optuna

    s = study.spec.sampler
    classes = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}
    if s.name not in classes:
        raise ConfigError(
            f"{study.path}: sampler.name = {s.name!r} is not a valid choice; choose one of: {', '.join(SAMPLERS)}."
        )
    cls = classes[s.name]
    return _construct(cls, {"seed": 0, **s.options()}, "sampler", study.path, build=_reseeded(cls))


def make_pruner(study: Any) -> Any:
    """The pruner of a `harness.experiments.study.TuneStudy` (`study.spec.pruner`)."""
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
