"""YAML -> validated RunConfig, with every problem turned into one readable `ConfigError`.

    cfg = load_run_config("configs/frozenlake_tiny.yaml", ["algo.clip.level=sequence"])

Order of work: read the YAML (syntax errors give line and column; duplicate keys are errors),
apply `-o key=value` overrides, fill unset `algo.*` keys from `algo.preset`, validate the
schema (`harness.config.schema.RunConfig`, strict), then check axis strings against the registries
of `algorithms.AXES`, `env.name` against `envs.ENVS` and `env.options` against that
environment's own `Options` model. Each message names the file, the dotted key, the bad value
and the allowed values (with the closest valid name when there is one).
"""

from __future__ import annotations

import copy
import difflib
import re
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from algorithms import AXES, PRESETS, Registry
from envs import ENVS
from envs.registry import env_class
from harness.config.errors import ConfigError, warn
from harness.config.schema import RENAMED_KEYS, RunConfig

MISSING = object()


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


# ----------------------------------------------------------------------------- dotted keys
def get_dotted(tree: Mapping, key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return MISSING
        node = node[part]
    return node


def set_dotted(tree: dict, key: str, value: Any, source: str = "") -> None:
    parts = key.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.get(part, MISSING)
        if child is MISSING or child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = f"{source}: " if source else ""
            raise ConfigError(f"{where}cannot set {key!r}: {'.'.join(parts[: i + 1])!r} is {child!r}, not a mapping")
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and empty mappings are leaves."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def covers(axis: str, key: str) -> bool:
    """True when dotted `key` is `axis` or lies under it ("env.options" covers "env.options.size")."""
    return key == axis or key.startswith(axis + ".") or axis.startswith(key + ".")


# ----------------------------------------------------------------------------- schema walking
def _as_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):  # Optional[Model]
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _model_at(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    model: type[BaseModel] | None = root
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        model = _as_model(model.model_fields[part].annotation)
    return model


def _field_at(root: type[BaseModel], loc: tuple) -> FieldInfo | None:
    parent = _model_at(root, loc[:-1])
    if parent is None or not loc or not isinstance(loc[-1], str):
        return None
    return parent.model_fields.get(loc[-1])


def literal_choices(annotation: Any) -> list[Any] | None:
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    return None


def iter_config_fields(model: type[BaseModel] = RunConfig, prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every leaf field of the schema as (dotted key, FieldInfo), in declaration order."""
    for name, info in model.model_fields.items():
        sub = _as_model(info.annotation)
        if sub is not None and typing.get_origin(info.annotation) is None:
            yield from iter_config_fields(sub, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", info


# ----------------------------------------------------------------------------- error text
def show_value(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def kind_of(value: Any) -> str:
    """What a YAML value is, in words, without echoing it (a file read as YAML may hold anything)."""
    kinds = {str: "a text", list: "a list", bool: "a boolean", int: "a number", float: "a number"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def _suggest(name: Any, choices: list[str]) -> str:
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def _origin_note(key: str, origins: Mapping[str, str]) -> str:
    for axis, origin in origins.items():
        if covers(axis, key):
            return f" (set by {origin})"
    return ""


def choice_message(key: str, value: Any, choices: list[str]) -> str:
    return (
        f"{key} = {show_value(value)} is not a valid choice; choose one of: "
        f"{', '.join(map(str, choices))}.{_suggest(value, choices)}"
    )


def _describe_error(err: Mapping[str, Any], root: type[BaseModel], prefix: str) -> str:
    loc = tuple(err["loc"])
    key = ".".join([p for p in prefix.split(".") if p] + [str(p) for p in loc]) or "(top level)"
    kind, value = err["type"], err.get("input")
    if kind == "extra_forbidden" and key in RENAMED_KEYS:
        return f"{key} was renamed to {RENAMED_KEYS[key]}; write {RENAMED_KEYS[key]}: {show_value(value)} instead."
    if kind == "extra_forbidden":
        parent = _model_at(root, loc[:-1])
        valid = list(parent.model_fields) if parent else []
        level = key.rpartition(".")[0] or "the top level"
        near = _suggest(loc[-1], valid)
        if near and "." in key:
            near = near.replace("'", f"'{key.rpartition('.')[0]}.", 1)
        return f"unknown key {key!r}.{near} Valid keys under {level}: {', '.join(valid)}."
    field = _field_at(root, loc)
    choices = literal_choices(field.annotation) if field is not None else None
    if kind == "literal_error" and choices:
        return choice_message(key, value, [str(c) for c in choices])
    if kind == "missing":
        return f"{key} is required."
    msg = _plain(str(err["msg"]).removeprefix("Value error, "))
    if not loc and not prefix:  # a cross-field check of the whole config
        return msg if msg.endswith(".") else msg + "."
    sub = _model_at(root, loc)
    if sub is not None and kind == "value_error":  # a cross-field check of one section names its keys
        return msg if msg.endswith(".") else msg + "."
    if sub is not None and kind in ("model_type", "model_attributes_type", "dict_type"):
        msg += f" (a mapping with keys: {', '.join(sub.model_fields)})"
    return f"{key} = {show_value(value)}: {msg}."


def _plain(msg: str) -> str:
    """A pydantic message without the schema's class names ("a valid dictionary or instance of
    ClipConfig" -> "a valid mapping")."""
    msg = re.sub(r" or instance of \w+", "", msg)
    return msg.replace("a valid dictionary", "a valid mapping")


def validation_lines(
    err: ValidationError, root: type[BaseModel] = RunConfig, prefix: str = "", origins: Mapping[str, str] | None = None
) -> list[str]:
    """One line per problem pydantic found, each naming the dotted key and the allowed values."""
    lines = []
    for e in err.errors(include_url=False):
        key = ".".join([p for p in prefix.split(".") if p] + [str(p) for p in e["loc"]])
        lines.append(_describe_error(e, root, prefix) + _origin_note(key, origins or {}))
    return lines


def error_paragraph(source: str, lines: list[str]) -> str:
    if len(lines) == 1:
        return f"{source}: {lines[0]}"
    return f"{source}: {len(lines)} problems:\n" + "\n".join(f"  - {line}" for line in lines)


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
            problems.append(choice_message(key, value, registry.names()) + _origin_note(key, origins))
    mixture_problems = _mixture_problems(cfg, origins) if cfg.env.mixture else []
    problems += mixture_problems
    try:
        options_model = env_class(cfg.env.name).Options
    except KeyError as e:  # UnknownChoiceError: its choices also name envs whose package is missing
        problems.append(
            choice_message("env.name", cfg.env.name, getattr(e, "choices", ENVS.names()))
            + _origin_note("env.name", origins)
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
                    f"{key}: {err['msg'].removeprefix('Value error, ')}" + _origin_note("env.mixture", origins)
                )
        except KeyError as e:  # an unknown member env: the message lists the environments
            problems.append(f"env.mixture.{i}.name: {e}" + _origin_note("env.mixture", origins))
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
