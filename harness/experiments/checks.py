"""What can be checked before any point of a sweep or trial of a study starts, beyond the config
schema: the sources the default trainer will load. Another trainer (`RunOptions.train_fn`,
HARNESS_TRAIN_FN) reads the config its own way, so nothing is checked for it.
"""

from __future__ import annotations

from harness.config.errors import ConfigError, UnavailableError
from harness.experiments.point import DEFAULT_TRAIN_FN, TrainFn, train_fn_spec
from harness.experiments.study import TuneStudy
from harness.experiments.sweep import Sweep


def check_before_run(sweep: Sweep, train_fn: str | TrainFn | None = None) -> None:
    """Every model.name of the sweep can be loaded, as far as that is known without loading it
    (`harness.model.base.model_source_problem`); a ConfigError naming the file otherwise. The
    packages a rollout.backend needs are installed; an UnavailableError otherwise."""
    if train_fn_spec(train_fn) != DEFAULT_TRAIN_FN:
        return
    check_model_names(sorted({p.config.model.name for p in sweep.points}), str(sweep.path or sweep.name))
    check_backends([p.config for p in sweep.points])


def check_backends(configs: list) -> None:
    """UnavailableError (one line) when a config's rollout.backend needs a package missing here."""
    from harness.rl.engines.vllm import vllm_problem

    problem = vllm_problem(configs)
    if problem:
        raise UnavailableError(problem)


def check_model_names(names: list[str], source: str) -> None:
    from harness.model.base import model_source_problem

    for name in names:
        problem = model_source_problem(name)
        if problem:
            raise ConfigError(f"{source}: model.name: {problem}")


def check_before_tuning(study: TuneStudy, train_fn: str | TrainFn | None = None) -> None:
    """`check_before_run` for a study: the base's model.name and any model.name the space searches."""
    if train_fn_spec(train_fn) != DEFAULT_TRAIN_FN:
        return
    base = [p.config for p in study.points({}, "base")]
    names = {c.model.name for c in base}
    searched = study.spec.space.get("model.name")
    names |= {str(c) for c in (searched.choices or [])} if searched is not None else set()
    check_model_names(sorted(names), str(study.path))
    check_backends(base)
