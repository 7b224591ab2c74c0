"""The `base:` of a sweep or study file: the path of a run config (relative to the file) or an
inline mapping. Problems get a message that says what the base is instead: the file itself (a
cycle), another sweep or study file, a directory, a missing file (with its resolved path), or a
value of the wrong kind. File contents are never shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.config.errors import ConfigError
from harness.config.keys import kind_of
from harness.config.loading import read_yaml, validate_run_config

# top-level keys of sweep and study files (`harness.experiments.sweep` / `.study`); a run config has none
SWEEP_KEYS = ("grid", "zip", "points", "seeds", "baseline")
STUDY_KEYS = ("space", "objective", "sampler", "pruner", "n_trials")
BASE_TYPE_ERROR = "must be the path of a run config (relative to this file) or an inline mapping of config sections"


def check_base_kind(value: Any) -> Any:
    """The `base:` of a sweep or study file is a path or a mapping (a pydantic before-validator)."""
    if not isinstance(value, (str, dict)) or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{BASE_TYPE_ERROR}, not {kind_of(value) if value != '' else 'an empty text'}")
    return value


def load_base(base: dict | str, path: Path, kind: str) -> dict:
    """The raw base config of a sweep or study file at `path`, checked against its own file."""
    if isinstance(base, dict):
        validate_run_config(base, f"{path} (base)")
        return base
    base_path = path.parent / base
    if base_path.resolve() == path.resolve():
        raise ConfigError(
            f"{path}: base: {base!r} is this {kind} file itself (a cycle); point base at a run config "
            f"(e.g. configs/frozenlake_tiny.yaml) or write the config inline."
        )
    raw = read_yaml(base_path, what=f"base config (from {path})")
    keys = set(raw) if isinstance(raw, dict) else set()
    if keys & {"base", *SWEEP_KEYS, *STUDY_KEYS}:
        other = "study" if keys & set(STUDY_KEYS) else "sweep"
        raise ConfigError(
            f"{path}: base: {base!r} ({base_path.resolve()}) is a {other} file, not a run config; point base "
            f"at a run config (e.g. configs/frozenlake_tiny.yaml) or write the config inline."
        )
    validate_run_config(raw, str(base_path))  # a broken base is reported against its own file
    return raw or {}
