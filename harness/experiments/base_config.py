"""One sweep, one config: the base config of a sweep (its resolved config without the keys the
axes and the seed cover), and the points of a results folder that were run with another one.

A second run of the same sweep file with other base settings (e.g. `-o train.updates=6`) lands
in the same results folder. Its points get other ids, so nothing is overwritten, but a table
that grouped points by axis values would pool both configs. `harness sweep` writes the base
config into sweep.json (`analysis` keeps every other config apart) and warns when the folder
already holds points of another base.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from harness.config.keys import covers, flatten, show_value
from harness.experiments.provenance import config_hash
from harness.store import CONFIG

SEED_KEY = "train.seed"
SHOWN_KEYS = 3  # differing keys named in the warning


def excluded_keys(axes: list[str]) -> list[str]:
    """Keys a point may change without leaving the sweep's base: the axes, the seed, and the
    environment's options when the environment is an axis (the sweep's axis isolation); a mixture
    (env.mixture) sets env.name and env.options from its members."""
    keys = list(dict.fromkeys([*axes, SEED_KEY]))
    if any(covers("env.mixture", a) or covers(a, "env.mixture") for a in axes):
        return keys + ["env.name", "env.options"]
    return keys + (["env.options"] if "env.name" in axes else [])


def base_signature(config: dict[str, Any], axes: list[str]) -> dict[str, Any]:
    """The flattened config without the keys `excluded_keys` names."""
    skip = excluded_keys(axes)
    return {k: v for k, v in flatten(config).items() if not any(covers(a, k) for a in skip)}


def schema_defaults() -> dict[str, Any]:
    """Every config key at its schema default, flattened: what a config that lacks a key means by it (a
    point written before the key existed). sweep.json carries them so `analysis`, which reads no schema,
    pools such a point with those written after the key at its default."""
    from harness.config.schema import RunConfig

    return flatten(RunConfig().model_dump(mode="json"))


def differing_keys(a: dict[str, Any], b: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """The keys where flattened configs `a` and `b` differ, a key one side lacks taking its default."""
    return [k for k in sorted(set(a) | set(b)) if a.get(k, defaults.get(k)) != b.get(k, defaults.get(k))]


def base_manifest(config: dict[str, Any], axes: list[str]) -> dict[str, Any]:
    """What sweep.json records about the base: the signature, the keys left out, its hash, and every key's
    schema default (`schema_defaults`)."""
    sig = base_signature(config, axes)
    return {
        "base_config": sig,
        "base_excluded": excluded_keys(axes),
        "base_hash": config_hash(sig),
        "schema_defaults": schema_defaults(),
    }


def other_configs(folder: Path, own_ids: set[str], base: dict[str, Any], axes: list[str]) -> dict[str, list[str]]:
    """{description of how the base differs: [point ids]} for every point folder of `folder` not
    in `own_ids` whose config.yaml differs from `base` (a base signature) outside the axes."""
    found: dict[str, list[str]] = {}
    if not folder.is_dir():
        return found
    defaults = schema_defaults()
    for d in sorted(p for p in folder.iterdir() if p.is_dir() and p.name not in own_ids):
        try:
            cfg = yaml.safe_load((d / CONFIG).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        if not isinstance(cfg, dict):
            continue
        sig = base_signature(cfg, axes)
        diff = differing_keys(sig, base, defaults)
        if diff:
            text = ", ".join(
                f"{k} = {show_value(sig[k]) if k in sig else '(unset)'} there, "
                f"{show_value(base[k]) if k in base else '(unset)'} here"
                for k in diff[:SHOWN_KEYS]
            ) + (f" and {len(diff) - SHOWN_KEYS} more keys" if len(diff) > SHOWN_KEYS else "")
            found.setdefault(text, []).append(d.name)
    return found


def warning_text(folder: Path, found: dict[str, list[str]]) -> str:
    """One paragraph: which points of other base configs the folder holds and what happens to them."""
    n = sum(len(v) for v in found.values())
    how = "; ".join(f"{len(ids)} with {text}" for text, ids in found.items())
    return (
        f"warning: {folder} already holds {n} point(s) of another base config ({how}). They stay where they are "
        f"and are never pooled with this run's points: `harness table`, `plot` and `report` show them apart, "
        f"labelled by the keys that differ. Use --results DIR to keep runs of different configs in separate folders."
    )
