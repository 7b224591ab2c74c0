"""One sweep, one config: which points of a results folder share the sweep's base config.

Two runs of one sweep file with different base settings (e.g. a second run with
`-o train.updates=6`) land in the same folder with the same axis values. Points whose resolved
config differs from the sweep's base in a key that no axis covers are another *config group*:
they are labelled by the keys that differ (`train.updates=14`), never pooled with the sweep's
own points, and compared only with the baseline of their own group.

The reference is `base_config` of sweep.json (the resolved base without the keys the axes and
the seed cover, written by `harness sweep`); for older manifests, the config of a point the
manifest lists (its baseline first).
"""

from __future__ import annotations

import json
from typing import Any

SEED_KEY = "train.seed"
LABEL_KEYS = 2  # differing keys named in a label; the rest are counted


def covers(axis: str, key: str) -> bool:
    """True when dotted `key` is `axis`, lies under it, or holds it."""
    return key == axis or key.startswith(axis + ".") or axis.startswith(key + ".")


def excluded(axes: list[str]) -> list[str]:
    """Keys a point may change without leaving the sweep's config: the axes, the seed, and the
    environment's options when the environment is an axis (as the sweep's axis isolation)."""
    return [*axes, SEED_KEY] + (["env.options"] if "env.name" in axes else [])


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"), default=str)


def signature(flat: dict[str, Any], skip: list[str]) -> dict[str, str]:
    """The flattened config without the skipped keys, values in canonical JSON."""
    return {k: _canon(v) for k, v in flat.items() if not any(covers(a, k) for a in skip)}


def differing(
    sig: dict[str, str], ref: dict[str, str], defaults: dict[str, str] | None = None
) -> list[tuple[str, str]]:
    """(key, this point's value) for every key whose value differs from the reference. A key one side
    lacks takes its schema default where `defaults` (canonical JSON, from sweep.json's `schema_defaults`)
    has it, as the harness reads that config: a point written before a key existed (e.g.
    train.learner.precision) is the same config as one written after it at its default."""
    keys = sorted(set(sig) | set(ref))
    defaults = defaults or {}

    def value(side: dict[str, str], k: str) -> str | None:
        return side.get(k, defaults.get(k))

    return [(k, json.loads(sig[k]) if k in sig else "(unset)") for k in keys if value(sig, k) != value(ref, k)]


def diff_text(diff: list[tuple[str, Any]], limit: int | None = LABEL_KEYS) -> str:
    """'train.updates=14, algo.lr=0.001 (+2 keys)' (limit None: every key), in the order given."""
    shown = diff if limit is None else diff[:limit]
    text = ", ".join(f"{k}={v if isinstance(v, str) else _canon(v)}" for k, v in shown)
    more = len(diff) - len(shown)
    return text + (f" (+{more} keys)" if more else "")


def reference(raw: dict | None, configs: dict[str, dict[str, Any]], manifest_points: list[dict], skip: list[str]):
    """The sweep's base signature: sweep.json's `base_config`, else a listed point's config."""
    if isinstance(raw, dict) and isinstance(raw.get("base_config"), dict):
        return {k: _canon(v) for k, v in raw["base_config"].items() if not any(covers(a, k) for a in skip)}
    listed = sorted(manifest_points, key=lambda p: p.get("is_baseline") is not True)
    for p in listed:
        if str(p["id"]) in configs:
            return signature(configs[str(p["id"])], skip)
    return None


def distinguishing_first(groups: dict[str, list[tuple[str, Any]]]) -> dict[str, list[tuple[str, Any]]]:
    """Each point's differing keys ordered by how many distinct values the key takes across the
    config groups (the sweep's own group counting as the base value), most first, then by name:
    the keys that tell the groups apart lead the label, before keys every other group shares
    (two groups that differ from the base in x and y alike and from each other in train.updates
    are labelled 'train.updates=2, x=...' and 'train.updates=6, x=...', not alike)."""
    diffs = {tuple((k, _canon(v)) for k, v in d) for d in groups.values()}
    keys = {k for d in diffs for k, _ in d}
    values = {k: {dict(d).get(k, "(base)") for d in diffs} for k in keys}
    return {pid: sorted(d, key=lambda kv: (-len(values[kv[0]]), kv[0])) for pid, d in groups.items()}


def config_groups(
    raw: dict | None, configs: dict[str, dict[str, Any]], manifest_points: list[dict], axes: list[str]
) -> dict[str, list[tuple[str, Any]]]:
    """{point id: differing (key, value) pairs, the keys that tell the groups apart first}; an empty
    list = the sweep's own config (also for points without a config.yaml, which have no results to pool)."""
    skip = list(raw.get("base_excluded") or excluded(axes)) if isinstance(raw, dict) else excluded(axes)
    ref = reference(raw, configs, manifest_points, skip)
    if ref is None:
        return {pid: [] for pid in configs}
    raw_defaults = raw.get("schema_defaults") if isinstance(raw, dict) else None
    defaults = {k: _canon(v) for k, v in raw_defaults.items()} if isinstance(raw_defaults, dict) else {}
    return distinguishing_first({pid: differing(signature(flat, skip), ref, defaults) for pid, flat in configs.items()})
