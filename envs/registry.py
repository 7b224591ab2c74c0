"""Registry of environments: name -> Env subclass, listed by `harness envs`.

Every module of the `envs` package named `*_env.py` registers its environment on import;
`load_all()` imports them all (called by `envs/__init__.py`). A module whose third-party
package is missing is recorded in `UNAVAILABLE` instead of breaking `import envs`.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import ValidationError

from algorithms.registry import Registry, UnknownChoiceError

ENVS = Registry("env.name", "reference text environments")
UNAVAILABLE: dict[str, str] = {}  # module name -> why it could not be imported


def load_all() -> list[str]:
    """Import every `envs/*_env.py` module (each registers its env); return their names."""
    loaded = []
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if not info.name.endswith("_env"):
            continue
        try:
            importlib.import_module(f"envs.{info.name}")
            loaded.append(info.name)
        except ImportError as e:  # a missing optional package; other errors are bugs
            UNAVAILABLE[info.name] = f"{type(e).__name__}: {e}"
    return loaded


def env_class(name: str):
    """The Env subclass registered under `name`; unknown names list the valid choices."""
    try:
        return ENVS.get(name)
    except UnknownChoiceError as e:
        missing = [f"{m} ({why})" for m, why in UNAVAILABLE.items() if m.startswith(name)]
        if missing:
            raise UnknownChoiceError(e.axis, name, e.choices + missing) from None
        raise


def env_source_classes(name: str) -> list[type]:
    """The classes of this package that define environment `name`: its class and its bases in envs/
    (what a cache key hashes the source of)."""
    return [c for c in env_class(name).__mro__ if c.__module__.startswith("envs.")]


def validate_options(name: str, options: Any = None):
    """`options` (dict or the env's Options) validated; errors name the key and the fields."""
    cls = env_class(name)
    if isinstance(options, cls.Options):
        return options
    try:
        return cls.Options(**(options or {}))
    except ValidationError as e:
        fields = ", ".join(cls.Options.model_fields)
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or '?'}: {err['msg']}" for err in e.errors())
        raise ValueError(
            f"invalid env.options for env {name!r}: {problems}. Valid options: {fields or '(none)'}"
        ) from None


def make_env(name: str, options: dict | None = None, **kwargs):
    """Build one instance of the environment registered under `name`.

    kwargs: reward_density ("sparse" | "dense"), format_penalty (float >= 0)."""
    return env_class(name)(validate_options(name, options), **kwargs)


def describe() -> list[dict]:
    """One dict per environment for `harness envs`: name, doc, source, options, markers."""
    rows = []
    for entry in ENVS:
        cls = entry.fn
        options = [
            {
                "name": fname,
                "type": _type_name(f.annotation),
                "default": f.get_default(call_default_factory=True),
                "description": f.description or "",
            }
            for fname, f in cls.Options.model_fields.items()
        ]
        rows.append(
            {
                "name": entry.name,
                "doc": entry.doc,
                "source": entry.source,
                "options": options,
                "observation_markers": list(cls.observation_markers),
            }
        )
    for module, why in UNAVAILABLE.items():
        rows.append(
            {
                "name": module.removesuffix("_env"),
                "doc": f"unavailable: {why}",
                "source": "",
                "options": [],
                "observation_markers": [],
            }
        )
    return rows


def _type_name(annotation: Any) -> str:
    if get_origin(annotation) is None and hasattr(annotation, "__name__"):
        return annotation.__name__
    args = get_args(annotation)
    if get_origin(annotation) is list and len(args) == 1 and hasattr(args[0], "model_fields"):
        return f"list[{{{', '.join(args[0].model_fields)}}}]"  # a list of option records (a mixture's members)
    return str(annotation).replace("typing.", "")
