"""Dotted config keys (`algo.clip.level`): reading and setting them in raw YAML mappings, walking
the schema by them, and the one-line error texts that name them (file, key, bad value, allowed
values, the closest valid name). The loader (`harness.config.loading`) and the sweep and study
files (`harness.experiments`) build their messages from these.
"""

from __future__ import annotations

import copy
import difflib
import re
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from harness.config.errors import ConfigError
from harness.config.schema import RENAMED_KEYS, RunConfig

MISSING = object()


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


def origin_note(key: str, origins: Mapping[str, str]) -> str:
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
        lines.append(_describe_error(e, root, prefix) + origin_note(key, origins or {}))
    return lines


def error_paragraph(source: str, lines: list[str]) -> str:
    if len(lines) == 1:
        return f"{source}: {lines[0]}"
    return f"{source}: {len(lines)} problems:\n" + "\n".join(f"  - {line}" for line in lines)
