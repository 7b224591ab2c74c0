"""Sweep files: one base config and the axes to vary, expanded into points.

    name: clipping                     # results/<name>/, MLflow experiment
    description: ...                   # optional
    base: ../configs/frozenlake_tiny.yaml   # or an inline mapping
    grid:                              # cartesian product of dotted key -> values
      algo.agg: [token-mean, seq-mean-token-mean]
    zip:                               # optional: groups of keys varied together
      - {algo.clip.eps_low: [0.2, 0.003], algo.clip.eps_high: [0.28, 0.004]}
    points:                            # explicit points, added to the grid's (not crossed with it)
      - {label: gspo, algo.clip.level: sequence, algo.clip.eps_low: 3.0e-4}
      - {label: gspo-again, algo.clip.level: sequence, algo.clip.eps_low: 3.0e-4, seed_offset: 1000}
    seeds: [0, 1, 2]                   # or a budget: {start: 3, step: 2, max: 15} (harness.experiments.seed_budget)
    baseline: gspo                     # a label, or an override mapping; default: the first point
    equivalence_margin: 0.05           # optional: the verdict column's equivalence margin (analysis)

Variants = product(grid keys, zip groups) + points (one base-only variant when none is given);
points = variants x seeds. A point's optional `seed_offset` (default 0) shifts its seeds: it runs
train.seed = s + offset for every s of the sweep's seeds, so that two labels of one config (an A/A
test, sweeps/aa_calibration.yaml) are independent runs rather than the same run twice; the table
then compares them unpaired by seed (analysis.columns). Not allowed with a seed budget, whose looks
run seeds 0 .. n_k - 1. A point's id is a readable slug of its overrides (or its label), its
seed and 8 hex digits of the hash of its canonical resolved config: `agg=token-mean__seed=1__3f2a1b9c`.
Axis isolation: a point may differ from the baseline (same seed) only in declared axes
(grid / zip / points keys, the seed, and `env.options` when `env.name` is declared); anything
else is an error. Keys an `algo.preset` fills count as changes: a point that switches presets
must also list the keys the preset changes.
"""

from __future__ import annotations

import difflib
import itertools
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from envs.registry import env_class
from harness.config.errors import ConfigError, warn
from harness.config.keys import covers, error_paragraph, flatten, get_dotted, kind_of, show_value, validation_lines
from harness.config.loading import apply_overrides, parse_override, read_yaml, validate_run_config
from harness.config.schema import SEED_MAX, SEED_MIN, RunConfig
from harness.diagnostics.episode_metrics import EVAL_METRICS, PROBE_METRICS
from harness.experiments.base_config import base_manifest, base_signature, excluded_keys
from harness.experiments.bases import check_base_kind, load_base
from harness.experiments.provenance import config_hash
from harness.experiments.seed_budget import SeedBudget, check_until, parse_seed_budget

SEED_KEY = "train.seed"
OFFSET_KEY = "seed_offset"  # a point's seed shift (module docstring); never a config key
SLUG_MAX = 64
Seed = Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # a sweep's (or a run's --name) results folder


def _held_out(value: str) -> str:
    """`value` if it names a metric of the held-out evaluation, else a ValueError with the choices."""
    names = [f"eval_{mode}/{name}" for mode in ("greedy", "sampled") for name in EVAL_METRICS + PROBE_METRICS]
    if value not in names:
        near = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise ValueError(f"not a metric of the held-out evaluation.{hint} Choose one of: {', '.join(names)}")
    return value


class SweepSpec(BaseModel):
    """The schema of a sweep file (strict: unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="Sweep name: the results folder and the MLflow experiment.")
    description: str = Field("", description="What question the sweep answers.")
    base: dict[str, Any] | str = Field(
        default_factory=dict, description="Base config: inline mapping or a path relative to the sweep file."
    )
    grid: dict[str, list[Any]] = Field(default_factory=dict, description="Dotted key -> values (cartesian).")
    zip: list[dict[str, list[Any]]] = Field(
        default_factory=list, description="Groups of dotted keys -> equal-length lists, varied together."
    )
    points: list[dict[str, Any]] = Field(
        default_factory=list, description="Explicit override mappings, each with an optional label."
    )
    seeds: list[Seed] = Field(
        [0],
        min_length=1,
        description="Seeds; every variant runs once per seed. Or a seed budget {start, step, max, spending}: "
        "seeds are added at each look only to the variants still undetermined (docs/user-guide.md#sequential-seeds).",
    )
    until: str | None = Field(
        None, description="With a seed budget: what stops adding seeds; only `verdict` (the default)."
    )
    baseline: dict[str, Any] | str | None = Field(None, description="Reference variant: a label or overrides.")
    metric: str = Field(
        "eval_greedy/success",
        description="The held-out metric the sweep's table leads with (its start, final, gain and Δ columns).",
    )

    tables: list[str] = Field(
        default_factory=list,
        description="More held-out metrics tabulated under the lead one in docs/results.md (e.g. a probe's "
        "eval_sampled/exploit_rate next to its true success).",
    )
    equivalence_margin: float | None = Field(
        None,
        description="Margin of the verdict column, in the metric's units: a contrast whose 90% interval lies "
        "inside ±margin is 'equivalent' (docs/algorithms.md#statistics). null: analysis's default, 0.05.",
    )

    _base_kind = field_validator("base", mode="before")(check_base_kind)

    @field_validator("metric")
    @classmethod
    def _held_out_metric(cls, value: str) -> str:
        return _held_out(value)

    @field_validator("tables")
    @classmethod
    def _held_out_metrics(cls, values: list[str]) -> list[str]:
        return [_held_out(v) for v in values]

    @field_validator("equivalence_margin", mode="before")
    @classmethod
    def _margin(cls, value: Any, info: ValidationInfo) -> Any:
        rate = str(info.data.get("metric", "")).endswith(("success", "_rate"))
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < (1 if rate else math.inf)
        if value is not None and not ok:
            bound = "a number between 0 and 1 (exclusive), the metric being a rate" if rate else "a positive number"
            raise ValueError(f"must be {bound}, e.g. 0.05 (or leave it out for the default 0.05)")
        return value

    @field_validator("baseline", mode="before")
    @classmethod
    def _baseline_kind(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, (str, dict)):
            raise ValueError(f"must be the label of a point or a mapping of its overrides, not {kind_of(value)}")
        return value


@dataclass(frozen=True)
class Point:
    id: str
    variant: str  # slug without the seed; equal across seeds of one variant
    label: str | None
    seed: int
    overrides: dict[str, Any]  # dotted key -> value, without the seed
    config: RunConfig
    config_hash: str
    is_baseline: bool = False
    seed_offset: int = 0  # train.seed = the sweep's seed + this (the point's `seed_offset`)


@dataclass
class Sweep:
    name: str
    description: str
    path: Path | None
    axes: list[str]
    baseline: str  # the baseline's variant slug
    seeds: list[int]
    points: list[Point] = field(default_factory=list)
    command: str = ""  # the command line that expands to these points
    metric: str = "eval_greedy/success"  # the held-out metric its table leads with
    tables: list[str] = field(default_factory=list)  # more held-out metrics for docs/results.md
    equivalence_margin: float | None = None  # the verdict column's margin; None: analysis's default
    budget: SeedBudget | None = None  # a seed budget (sequential seeds); None: every point runs `seeds`

    def base_config(self) -> dict[str, Any]:
        """The base signature of the sweep (harness.experiments.base_config): the baseline's
        resolved config without the keys the axes and the seed cover."""
        ref = next(p for p in self.points if p.variant == self.baseline).config.model_dump(mode="json")
        return base_signature(ref, self.axes)

    def task_neutral_options(self) -> list[str]:
        """The env options (dotted) that change how the points' episodes are played or paid but not
        which tasks their held-out splits hold, as their environments declare them
        (`task_neutral_options`, e.g. Sokoban's deadlock handling). `analysis` pairs two points that
        differ only in these by task, as it pairs points of one environment; any other option
        difference makes their held-out tasks another set."""
        return sorted(
            {
                f"env.options.{k}"
                for p in self.points
                for k in getattr(env_class(p.config.env.name), "task_neutral_options", ())
            }
        )

    def manifest(self) -> dict[str, Any]:
        """What results/<name>/sweep.json holds (read by `analysis`): the axes (without the seed),
        the baseline as {axis: value} of its resolved config, the command, the base config
        (to keep points of other bases apart), and every point with its overrides."""
        axes = [a for a in self.axes if a != SEED_KEY]
        ref = next(p for p in self.points if p.variant == self.baseline).config.model_dump(mode="json")
        variants = {}
        for p in self.points:
            variants.setdefault(
                p.variant,
                {
                    "variant": p.variant,
                    "label": p.label,
                    "overrides": p.overrides,
                    "is_baseline": p.is_baseline,
                    **({"seed_offset": p.seed_offset} if p.seed_offset else {}),
                },
            )
        return {
            "name": self.name,
            "description": self.description,
            "source": str(self.path or ""),
            "command": self.command,
            "axes": axes,
            "baseline": {a: get_dotted(ref, a) for a in axes},
            "baseline_variant": self.baseline,
            "seeds": self.seeds,
            "metric": f"final/{self.metric}",
            **({"tables": [f"final/{m}" for m in self.tables]} if self.tables else {}),
            **({"equivalence_margin": self.equivalence_margin} if self.equivalence_margin is not None else {}),
            **({"sequential": {**self.budget.as_dict(), "until": "verdict"}} if self.budget else {}),
            **({"task_neutral": neutral} if (neutral := self.task_neutral_options()) else {}),
            **base_manifest(ref, self.axes),
            "variants": list(variants.values()),
            "points": [
                {
                    "id": p.id,
                    "variant": p.variant,
                    "label": p.label,
                    "seed": p.seed,
                    "overrides": p.overrides,
                    "config_hash": p.config_hash,
                    "is_baseline": p.is_baseline,
                }
                for p in self.points
            ],
        }


# the keys two manifests must share to describe one sweep (same base, axes, baseline and metric)
SAME_SWEEP_KEYS = ("name", "axes", "base_hash", "baseline_variant", "metric")


def merge_manifest(old: Any, new: dict[str, Any]) -> dict[str, Any]:
    """sweep.json for a run into a folder that already has one.

    A run of part of a sweep (`--seeds 2`, say, beside a run of seeds 0 and 1 of the same file)
    must not drop the points the other run listed: when the old manifest describes the same sweep
    (SAME_SWEEP_KEYS agree), its points the new run does not list are kept, after the new ones,
    and the seeds are the union (the sweep's seeds: a point's seed less its variant's seed_offset).
    The command is that of the manifest whose seeds are the union,
    else the new one with its --seeds widened to the union. Otherwise the new manifest replaces
    the old (points of another base are kept apart by `analysis`, which warns about them)."""
    if not isinstance(old, dict) or any(old.get(k) != new.get(k) for k in SAME_SWEEP_KEYS):
        return new
    ids = {p["id"] for p in new["points"]}
    kept = [p for p in old.get("points") or [] if isinstance(p, dict) and p.get("id") and p["id"] not in ids]
    if not kept:
        return new
    out = dict(new)
    # a point's seed less its variant's seed_offset is the sweep's seed it was run for
    offsets = {
        v.get("variant"): v.get("seed_offset") or 0
        for m in (old, new)
        for v in m.get("variants") or []
        if isinstance(v, dict) and isinstance(v.get("seed_offset") or 0, int)
    }
    seeds = sorted(
        set(new["seeds"])
        | {int(p["seed"]) - offsets.get(p.get("variant"), 0) for p in kept if isinstance(p.get("seed"), int)}
    )
    out["seeds"] = seeds
    known = {v["variant"] for v in new["variants"]}
    out["variants"] = list(new["variants"]) + [
        v for v in old.get("variants") or [] if isinstance(v, dict) and v.get("variant") not in known
    ]
    order = {v.get("variant"): i for i, v in enumerate(out["variants"])}  # variants, then seeds, as a sweep lists them
    points = list(new["points"]) + kept
    out["points"] = sorted(points, key=lambda p: (order.get(p.get("variant"), len(order)), _seed_key(p)))
    same = [m for m in (new, old) if sorted(m.get("seeds") or []) == seeds and m.get("command")]
    out["command"] = same[0]["command"] if same else _with_seeds(new.get("command") or "", seeds)
    return out


def _seed_key(point: dict[str, Any]) -> int:
    seed = point.get("seed")
    return seed if isinstance(seed, int) else SEED_MAX + 1


def _with_seeds(command: str, seeds: list[int]) -> str:
    """`command` with the value of its --seeds replaced by `seeds` (added when it has none)."""
    if not command:
        return command
    words = shlex.split(command)
    text = ",".join(map(str, seeds))
    at = words.index("--seeds") + 1 if "--seeds" in words else len(words)
    if at < len(words):
        words[at] = text
    else:
        words += ["--seeds", text]
    return shlex.join(words)


# ----------------------------------------------------------------------------- slugs
def short_key(key: str) -> str:
    """algo.clip.level -> clip.level, algo.agg -> agg, env.options.size -> options.size, turns.max."""
    key = key.removeprefix("algo.")
    parts = key.split(".")
    return ".".join(parts[1:]) if len(parts) >= 3 else key


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "null"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "-".join(_fmt(v) for v in value) or "empty"
    if isinstance(value, dict):
        return "-".join(f"{k}={_fmt(v)}" for k, v in value.items()) or "empty"
    return str(value)


def slugify(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]+", "-", text).strip("-") or "x"


def variant_slug(overrides: dict[str, Any], label: str | None) -> str:
    if label:
        return slugify(label)[:SLUG_MAX]
    if not overrides:
        return "base"
    slug = slugify("__".join(f"{short_key(k)}={_fmt(v)}" for k, v in overrides.items()))
    if len(slug) > SLUG_MAX:  # drop whole key=value parts, never cut a value in two
        cut = slug[:SLUG_MAX].rfind("__")
        slug = slug[:cut] + "__etc" if cut > 0 else slug[:SLUG_MAX]
    return slug.rstrip("_.-=")


def point_id(variant: str, seed: int, chash: str) -> str:
    return f"{variant}__seed={seed}__{chash}"


# ----------------------------------------------------------------------------- expansion
# top-level keys of a study file (harness.experiments.study.StudySpec) that no sweep file has
STUDY_KEYS = ("space", "objective", "unmoved", "sampler", "pruner", "n_trials", "overrides", "heartbeat_s")


def _read_spec(path: Path) -> tuple[SweepSpec, SeedBudget | None]:
    """The validated sweep file, and its seed budget when `seeds:` is a mapping (the spec then
    lists seeds 0 .. max - 1, every point a look may run)."""
    raw = read_yaml(path, what="sweep")
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: a sweep file is a mapping with keys {', '.join(SweepSpec.model_fields)}; got {kind_of(raw)}"
        )
    study_keys = [k for k in STUDY_KEYS if k in raw]
    if study_keys and not any(k in raw for k in ("grid", "zip", "points")):
        raise ConfigError(
            f"{path}: this is a study file (it has {', '.join(study_keys)}); run it with `harness tune {path}`. "
            f"A sweep file for `harness sweep` lists its points under grid, zip or points."
        )
    budget = parse_seed_budget(raw["seeds"], str(path)) if isinstance(raw.get("seeds"), dict) else None
    if budget is not None:
        raw = {**raw, "seeds": list(range(budget.max))}
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(error_paragraph(str(path), validation_lines(e, SweepSpec))) from None
    check_until(spec.until, budget, str(path))
    return spec, budget


def _seed_offset(point: dict[str, Any], i: int, src: str) -> int:
    """The point's `seed_offset` (popped from `point`; 0 when absent), a whole number >= 0."""
    offset = point.pop("seed_offset", 0)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ConfigError(
            f"{src}: points[{i}].seed_offset = {show_value(offset)} must be a whole number >= 0: the point runs "
            f"train.seed = s + seed_offset for each of the sweep's seeds s (e.g. 1000 for a second, independent "
            f"copy of a variant)."
        )
    return offset


def _variants(spec: SweepSpec, src: str) -> list[tuple[str | None, dict[str, Any], str]]:
    """(label, overrides, origin) for every variant, before seeds; a point's `seed_offset` is moved
    into its overrides under OFFSET_KEY (`_split_offset` takes it out again)."""
    factors: list[list[dict[str, Any]]] = [[{k: v} for v in values] for k, values in spec.grid.items()]
    for i, group in enumerate(spec.zip):
        lengths = {k: len(v) for k, v in group.items()}
        if len(set(lengths.values())) > 1:
            raise ConfigError(
                f"{src}: zip group {i + 1} has lists of different lengths: "
                + ", ".join(f"{k} ({n})" for k, n in lengths.items())
            )
        factors.append([dict(zip(group, values)) for values in zip(*group.values())])
    for k, values in list(spec.grid.items()) + [(k, v) for g in spec.zip for k, v in g.items()]:
        if not values:
            raise ConfigError(f"{src}: {k} has an empty list of values; give at least one.")
    grid_keys = [k for f in factors for k in f[0]] if factors else []
    dup = {k for k in grid_keys if grid_keys.count(k) > 1}
    if dup:
        raise ConfigError(f"{src}: {', '.join(sorted(dup))} appears in more than one grid/zip entry.")
    out: list[tuple[str | None, dict[str, Any], str]] = []
    if factors:
        for combo in itertools.product(*factors):
            overrides = {k: v for part in combo for k, v in part.items()}
            out.append((None, overrides, "the sweep's grid/zip"))
    for i, point in enumerate(spec.points):
        point = dict(point)
        label = point.pop("label", None)
        if label is not None and not isinstance(label, str):
            raise ConfigError(f"{src}: points[{i}].label = {show_value(label)} must be a string.")
        offset = _seed_offset(point, i, src)
        out.append(
            (label, {**flatten(point), **({OFFSET_KEY: offset} if offset else {})}, f"the sweep's point {label or i}")
        )
    if not out:
        out.append((None, {}, "the base config"))
    for label, overrides, _ in out:
        if SEED_KEY in overrides:
            raise ConfigError(
                f"{src}: {SEED_KEY} is set by the sweep's `seeds` list; remove it from "
                f"{'point ' + repr(label) if label else 'the grid'} (a point runs other seeds with seed_offset)."
            )
    labels = [label for label, _, _ in out if label]
    dup = {label for label in labels if labels.count(label) > 1}
    if dup:
        raise ConfigError(f"{src}: point label {sorted(dup)[0]!r} is used twice; labels must be unique.")
    return out


def _split_offset(overrides: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """(the config overrides, the seed offset) of a variant from `_variants`."""
    rest = {k: v for k, v in overrides.items() if k != OFFSET_KEY}
    return rest, int(overrides.get(OFFSET_KEY, 0))


def declared_axes(spec: SweepSpec, variants: list[tuple[str | None, dict, str]]) -> list[str]:
    axes: list[str] = []
    for _, overrides, _ in variants:
        axes += [k for k in overrides if k not in axes and k != OFFSET_KEY]
    return axes + [SEED_KEY]


def _isolation_covers(axes: list[str]) -> list[str]:
    """Keys a declared axis may change besides itself (the same keys the base config leaves out)."""
    return excluded_keys(axes)


def _pick_baseline(spec: SweepSpec, src: str, base: dict, by_variant: dict[str, dict[str, Any]]) -> str:
    """by_variant: slug -> {"label", "overrides", "hash"(seed 0 of seeds)}"""
    if spec.baseline is None:
        return next(iter(by_variant))
    if isinstance(spec.baseline, str):
        for slug, v in by_variant.items():
            if spec.baseline in (v["label"], slug):
                return slug
        names = [v["label"] or slug for slug, v in by_variant.items()]
        raise ConfigError(f"{src}: baseline {spec.baseline!r} names no point; choose one of: {', '.join(names)}.")
    overrides = {**flatten(spec.baseline), SEED_KEY: spec.seeds[0]}
    cfg = validate_run_config(apply_overrides(base, overrides, src), f"{src} (baseline)")
    chash = config_hash(cfg)
    for slug, v in by_variant.items():
        if v["hash"] == chash:
            return slug
    raise ConfigError(
        f"{src}: baseline {spec.baseline} matches no point of the sweep; give the overrides of "
        f"one point or its label ({', '.join(v['label'] or s for s, v in by_variant.items())})."
    )


def _check_isolation(src: str, baseline: str, first_seed: dict[str, RunConfig], covered: list[str]) -> None:
    ref = flatten(first_seed[baseline].model_dump(mode="json"))
    for slug, cfg in first_seed.items():
        flat = flatten(cfg.model_dump(mode="json"))
        for key in sorted(set(ref) | set(flat)):
            if ref.get(key) != flat.get(key) and not any(covers(a, key) for a in covered):
                raise ConfigError(
                    f"{src}: point {slug!r} differs from the baseline {baseline!r} in {key} "
                    f"({show_value(flat.get(key))} vs {show_value(ref.get(key))}), which is not a declared axis "
                    f"(axis isolation). Declare it in the point's overrides or the grid: "
                    f"{', '.join(a for a in covered if a != SEED_KEY)}."
                )


def _seeds(spec: SweepSpec, src: str, given: list[int] | None) -> list[int]:
    """The seeds to run: `given` (--seeds) or the file's; warns when neither names any."""
    if given is not None:
        bad = [s for s in given if not SEED_MIN <= s <= SEED_MAX]
        if bad:
            raise ConfigError(
                f"{src}: --seeds {','.join(map(str, given))}: seed {bad[0]} is out of range; a seed is a whole "
                f"number from {SEED_MIN} to {SEED_MAX}."
            )
    elif "seeds" not in spec.model_fields_set:
        warn(
            f"{src}: no `seeds:` list, so every point runs once, with seed 0; add e.g. `seeds: [0, 1, 2]` "
            f"(or pass --seeds 0,1,2) to measure the spread over seeds."
        )
    seeds = list(spec.seeds if given is None else given)
    if len(set(seeds)) != len(seeds) or not seeds:
        origin = "--seeds" if given is not None else "seeds"
        raise ConfigError(f"{src}: {origin} {seeds} are empty or contain duplicates.")
    return seeds


def _with_base_overrides(base: dict, src: str, base_overrides: list[str] | tuple[str, ...]) -> dict:
    """The base config with the command line's -o KEY=VALUE applied (never the seed)."""
    parsed = dict(parse_override(o) for o in base_overrides)
    if SEED_KEY in parsed:
        raise ConfigError(
            f"{src}: -o {SEED_KEY}={parsed[SEED_KEY]}: a sweep's seeds come from its `seeds:` list or "
            f"--seeds; use --seeds {parsed[SEED_KEY]} instead."
        )
    base = apply_overrides(base, parsed, f"{src} (--override)")
    origins = {k: f"-o {k}={show_value(v)}" for k, v in parsed.items()}
    validate_run_config(base, f"{src} (base with --override {' '.join(base_overrides)})", origins)
    return base


def load_sweep(
    path: str | Path, base_overrides: list[str] | tuple[str, ...] = (), seeds: list[int] | None = None
) -> Sweep:
    """Read, validate and expand a sweep file (every point's config is fully checked).

    base_overrides: `key=value` strings applied to the base config of every point (before the
    point's own overrides), e.g. a short smoke run of a whole sweep with `train.updates=1`; they
    change the config hash, so such points never mix with the full ones. seeds: replace the
    file's seeds."""
    path = Path(path)
    spec, budget = _read_spec(path)
    src = str(path)
    budget = budget if seeds is None else None  # --seeds runs those seeds, each variant all of them
    spec = spec.model_copy(update={"seeds": _seeds(spec, src, seeds)})
    base = load_base(spec.base, path, "sweep")
    if base_overrides:
        base = _with_base_overrides(base, src, base_overrides)
    variants = _variants(spec, src)
    if budget is not None and len(variants) < 2:
        raise ConfigError(
            f"{src}: seeds = {show_value(budget.as_dict())} is a seed budget, which adds seeds until each variant's "
            f"contrast to the baseline is decided; this sweep has one variant, so there is nothing to decide. List "
            f"its seeds (seeds: [0, 1, 2]) or add variants (grid, zip or points)."
        )
    axes = declared_axes(spec, variants)
    points: list[Point] = []
    by_variant: dict[str, dict[str, Any]] = {}
    first_seed: dict[str, RunConfig] = {}
    hashes: dict[str, str] = {}
    for label, overrides, origin in variants:
        overrides, offset = _split_offset(overrides)
        if offset and budget is not None:
            raise ConfigError(
                f"{src}: point {label!r} has seed_offset {offset}, but the sweep's seeds are a seed budget, whose "
                f"looks run seeds 0 .. n - 1 of every variant; list the seeds instead (seeds: [0, 1, 2])."
            )
        slug = variant_slug(overrides, label)
        if slug in by_variant:  # two unlabelled variants whose slugs were cut to the same text
            slug = f"{slug[: SLUG_MAX - 7]}-{config_hash(overrides, 6)}"
        for i, seed in enumerate(s + offset for s in spec.seeds):
            source = f"{src} (point {slug}, seed {seed})"
            if not SEED_MIN <= seed <= SEED_MAX:
                raise ConfigError(
                    f"{source}: seed {seed - offset} + seed_offset {offset} = {seed} is out of range; a seed is a "
                    f"whole number from {SEED_MIN} to {SEED_MAX}."
                )
            origins = {k: origin for k in overrides}
            cfg = validate_run_config(apply_overrides(base, {**overrides, SEED_KEY: seed}, source), source, origins)
            chash = config_hash(cfg)
            if chash in hashes:
                raise ConfigError(
                    f"{src}: points {hashes[chash]!r} and {slug!r} resolve to the same config "
                    f"(seed {seed}); remove one, or give one a seed_offset to run it as an independent copy."
                )
            hashes[chash] = slug
            if i == 0:
                by_variant[slug] = {"label": label, "overrides": overrides, "hash": chash}
                first_seed[slug] = cfg
            points.append(
                Point(point_id(slug, seed, chash), slug, label, seed, dict(overrides), cfg, chash, seed_offset=offset)
            )
    baseline = _pick_baseline(spec, src, base, by_variant)
    _check_isolation(src, baseline, first_seed, _isolation_covers(axes))
    points = [Point(**{**p.__dict__, "is_baseline": p.variant == baseline}) for p in points]
    command = ["harness", "sweep", str(path)] + [a for o in base_overrides for a in ("-o", o)]
    command += ["--seeds", ",".join(map(str, seeds))] if seeds is not None else []
    return Sweep(
        spec.name,
        spec.description,
        path,
        axes,
        baseline,
        list(spec.seeds),
        points,
        shlex.join(command),
        spec.metric,
        list(spec.tables),
        spec.equivalence_margin,
        budget,
    )


def single_point(config_path: str | Path, overrides: list[str], name: str | None = None) -> Sweep:
    """`harness run CONFIG -o k=v`: a one-point sweep named after the config file."""
    from harness.config.loading import load_run_config

    cfg = load_run_config(config_path, overrides)
    parsed = {k: v for k, v in (parse_override(o) for o in overrides) if k != SEED_KEY}
    slug = variant_slug(parsed, None)
    chash = config_hash(cfg)
    point = Point(point_id(slug, cfg.train.seed, chash), slug, None, cfg.train.seed, parsed, cfg, chash, True)
    if name is not None and not re.fullmatch(NAME_PATTERN, name):
        suggestion = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._-") or "run"
        raise ConfigError(
            f"--name {name!r} is not a results folder name: use letters, digits, '_', '.' and '-', starting "
            f"with a letter or digit (no path separators, no '..'), e.g. --name {suggestion}; "
            f"the run goes to <--out>/<name>/<point id>/."
        )
    name = name or slugify(Path(config_path).stem)
    command = shlex.join(["harness", "run", str(config_path)] + [a for o in overrides for a in ("-o", o)])
    return Sweep(name, "", Path(config_path), list(parsed) + [SEED_KEY], slug, [cfg.train.seed], [point], command)
