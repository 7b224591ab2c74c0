"""YAML -> validated RunConfig, with every problem turned into one readable `ConfigError`.

    cfg = load_run_config("configs/frozenlake_tiny.yaml", ["algo.clip.level=sequence"])

Order of work: read the YAML (syntax errors give line and column; duplicate keys are errors),
apply `-o key=value` overrides, fill unset `algo.*` keys from `algo.preset`, validate the
schema (`harness.config.schema.RunConfig`, strict), then check axis strings against the registries
of `algorithms.AXES`, `env.name` against `envs.ENVS` and `env.options` against that
environment's own `Options` model. Each message names the file, the dotted key, the bad value
and the allowed values (with the closest valid name when there is one);
`harness.config.keys` holds the dotted-key helpers and the error texts.
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from algorithms import AXES, PRESETS, Registry
from envs import ENVS
from envs.registry import env_class
from harness.config.errors import ConfigError, warn
from harness.config.keys import (
    MISSING,
    choice_message,
    error_paragraph,
    get_dotted,
    kind_of,
    origin_note,
    set_dotted,
    show_value,
    validation_lines,
)
from harness.config.schema import RunConfig


# ----------------------------------------------------------------------------- YAML
class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key written twice in one mapping (PyYAML keeps the last)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice in one mapping (first on line {seen[key].line + 1})", mark
            )
        seen[key] = key_node.start_mark
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: str | Path, what: str = "config") -> Any:
    """Parse a YAML file; a missing file or bad syntax is a ConfigError with line and column."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{what} file {path} is a directory; give the path of a .yaml file.")
    if not path.is_file():
        hint = "" if path.suffix in (".yaml", ".yml") else " (expected a .yaml file)"
        shown = f"{path} (resolved: {path.resolve()})" if path.resolve() != path else str(path)
        raise ConfigError(f"{what} file not found: {shown}{hint}")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {what} file {path}: {e}") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e)
        context = getattr(e, "context", None)
        detail = f"{problem} ({context})" if context else problem
        raise ConfigError(f"{where}: invalid YAML: {detail}") from None


def parse_override(text: str) -> tuple[str, Any]:
    """'algo.clip.level=sequence' -> ("algo.clip.level", "sequence"); the value is read as YAML,
    so numbers, booleans, null and [lists] get their types."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(
            f"-o/--override {text!r} is not of the form dotted.key=value (e.g. -o algo.clip.level=sequence)"
        )
    try:
        return key, yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        return key, value


# ----------------------------------------------------------------------------- registries
def axis_registries() -> dict[str, Registry]:
    """`algorithms.AXES`: dotted config key -> the registry of its values."""
    return dict(AXES)


def apply_preset(raw: dict, source: str) -> None:
    """Fill the algo keys the user did not set from PRESETS[algo.preset] (the user wins)."""
    name = get_dotted(raw, "algo.preset")
    if name is MISSING or name == "custom" or not isinstance(name, str):
        return
    table = PRESETS
    if name not in table:
        allowed = typing.get_args(RunConfig.model_fields["algo"].annotation.model_fields["preset"].annotation)
        raise ConfigError(
            f"{source}: " + choice_message("algo.preset", name, [c for c in allowed if c in table or c == "custom"])
        )
    kept = {}
    for key, value in table[name].items():
        key = key if key.startswith("algo.") else f"algo.{key}"
        mine = get_dotted(raw, key)
        if mine is MISSING:
            set_dotted(raw, key, value, source)
        elif mine != value:
            kept[key] = (mine, value)
    if kept:
        listing = ", ".join(
            f"{k} = {show_value(mine)} (the preset's: {show_value(v)})" for k, (mine, v) in kept.items()
        )
        warn(
            f"{source_file(source)}: algo.preset {name!r} did not change {len(kept)} key(s) set explicitly, which win "
            f"over the preset: {listing}. Remove them to get the preset's values.",
            once_key=("preset", name, tuple((k, repr(m)) for k, (m, _) in kept.items())),
        )


def source_file(source: str) -> str:
    """The file part of a message source: 'sweep.yaml (point x, seed 0)' -> 'sweep.yaml'."""
    return source.split(" (", 1)[0]


def check_registries(cfg: RunConfig, source: str, origins: Mapping[str, str] | None = None) -> RunConfig:
    """Axis strings against algorithms.AXES; env.name / env.options against envs.ENVS.
    Returns the config with env.options completed by the environment's defaults."""
    origins = origins or {}
    dump = cfg.model_dump(mode="json")
    problems = []
    for key, registry in axis_registries().items():
        value = get_dotted(dump, key)
        if value is not MISSING and value not in registry:
            problems.append(choice_message(key, value, registry.names()) + origin_note(key, origins))
    mixture_problems = _mixture_problems(cfg, origins) if cfg.env.mixture else []
    problems += mixture_problems
    try:
        options_model = env_class(cfg.env.name).Options
    except KeyError as e:  # UnknownChoiceError: its choices also name envs whose package is missing
        problems.append(
            choice_message("env.name", cfg.env.name, getattr(e, "choices", ENVS.names()))
            + origin_note("env.name", origins)
        )
    else:
        try:
            # a mixture's members, once valid, are valid options (their problems: env.mixture.<i>)
            options = None if mixture_problems else options_model.model_validate(cfg.env.options)
        except ValidationError as e:
            problems.extend(validation_lines(e, options_model, "env.options", origins))
        else:
            if options is not None:
                cfg.env.options = options.model_dump(mode="json")
    if problems:
        raise ConfigError(error_paragraph(source, problems))
    return cfg


def _mixture_problems(cfg: RunConfig, origins: Mapping[str, str]) -> list[str]:
    """What is wrong with env.mixture, each problem naming env.mixture.<i>.<key> (the schema has made
    the members env.options of env `mixture`; once they are valid, the options check below fills them
    in like any environment's)."""
    from envs.mixture_env import MixtureMember, MixtureOptions

    problems, members = [], []
    for i, raw in enumerate(cfg.env.mixture):
        try:
            members.append(MixtureMember.model_validate(raw))
        except ValidationError as e:
            for err in e.errors(include_url=False):
                key = ".".join(["env.mixture", str(i), *map(str, err["loc"])])
                problems.append(
                    f"{key}: {err['msg'].removeprefix('Value error, ')}" + origin_note("env.mixture", origins)
                )
        except KeyError as e:  # an unknown member env: the message lists the environments
            problems.append(f"env.mixture.{i}.name: {e}" + origin_note("env.mixture", origins))
    if problems:
        return problems
    try:
        MixtureOptions(members=members)
    except ValidationError as e:
        return [f"env.mixture: {err['msg'].removeprefix('Value error, ')}" for err in e.errors(include_url=False)]
    return []


# ----------------------------------------------------------------------------- entry points
def validate_run_config(raw: Any, source: str, origins: Mapping[str, str] | None = None) -> RunConfig:
    """A raw mapping (already merged with overrides) -> a fully checked RunConfig."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: expected a mapping of config sections ({', '.join(RunConfig.model_fields)}) "
            f"at the top level, got {kind_of(raw)}"
        )
    raw = copy.deepcopy(raw)
    apply_preset(raw, source)
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(error_paragraph(source, validation_lines(e, origins=origins))) from None
    return check_registries(cfg, source, origins)


def apply_overrides(raw: dict, overrides: Mapping[str, Any], source: str) -> dict:
    raw = copy.deepcopy(raw)
    for key, value in overrides.items():
        set_dotted(raw, key, value, source)
    return raw


def load_run_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read a config file, apply `key=value` overrides, validate everything (see module doc)."""
    raw = read_yaml(path)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        validate_run_config(raw, str(path))
    parsed = dict(parse_override(o) for o in overrides)
    raw = apply_overrides(raw, parsed, str(path))
    origins = {k: f"-o {k}={show_value(v)}" for k, v in parsed.items()}
    return validate_run_config(raw, str(path), origins)


def dump_config(cfg: RunConfig) -> str:
    """The resolved config as YAML (what config.yaml of a point holds)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, default_flow_style=False)
