"""What `harness tune --show` prints about a study, and the sweep.json `harness table` reads for it.

`describe` lists every trial (state, objective value, the largest KL to the reference, parameters),
marks the trials whose policy did not move (harness.experiments.study, `movement`), names the best
trial and warns when it did not move or did not improve on its start, and gives the parameter
importances with the number of complete trials they rest on.

`write_manifest` writes results/<study>/sweep.json in the layout of `harness sweep`'s: the searched
keys are the axes, every trial's points are listed (labelled "trial N"), and the baseline is the
best complete trial (the first trial run while none is complete), labelled "trial N (best)", so the
caption and the rows of `harness table` name it; its `study` entry says the same for programs.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from harness.config.keys import get_dotted
from harness.experiments.base_config import base_manifest
from harness.experiments.study import TuneStudy, movement
from harness.store import METRICS, SWEEP_MANIFEST, atomic_write_json, read_jsonl

UNMOVED = "did not move"  # why a rejected trial was pruned (harness.experiments.study, `unmoved`)
MIN_TRIALS_FOR_IMPORTANCE = 4


def counts(ostudy: optuna.Study) -> dict[TrialState, int]:
    out = {s: 0 for s in TrialState}
    for t in ostudy.get_trials(deepcopy=False):
        out[t.state] += 1
    return out


def show_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else repr(value)


# ----------------------------------------------------------------------------- movement of a trial
def trial_movement(t: FrozenTrial, study: TuneStudy, results: Path) -> tuple[bool | None, float | None]:
    """(moved, largest KL) of a finished trial: False when none of its points moved, None when that
    cannot be told. From the trial's record, or, for a trial recorded before it kept one, from its
    points' metrics.jsonl."""
    if t.state not in (TrialState.COMPLETE, TrialState.PRUNED):
        return None, None
    if "moved" in t.user_attrs:
        moved, kl = list(t.user_attrs["moved"]), t.user_attrs.get("kl_max")
    else:
        if t.state != TrialState.COMPLETE:  # pruned by the pruner: a part of a run says nothing here
            return None, None
        moves = []
        for pid in t.user_attrs.get("points", []):
            rows = read_jsonl(Path(results) / study.name / pid / METRICS)
            moves.append(movement(rows, study.spec.objective.metric, study.spec.unmoved_kl))
        moved = [m.moved for m in moves]
        kls = [m.kl_max for m in moves if m.kl_max is not None]
        kl = max(kls) if kls else None
    if moved and all(m is False for m in moved):
        return False, kl
    return (True if any(m is True for m in moved) else None), kl


def _state_text(t: FrozenTrial, moved: bool | None) -> str:
    state = t.state.name.lower()
    why = t.user_attrs.get("point_status")
    if moved is False and t.state == TrialState.COMPLETE:
        why = UNMOVED
    return state + (f" ({why})" if why and why != state else "")


def _value_text(t: FrozenTrial) -> str:
    if t.value is not None and t.state == TrialState.COMPLETE:
        return f"{t.value:.4g}"
    if "rejected_value" in t.user_attrs:  # pruned because it did not move: its value is not counted
        return f"({t.user_attrs['rejected_value']:.4g})"
    return "-"


def trial_lines(ostudy: optuna.Study, study: TuneStudy | None = None, results: Path | None = None) -> list[str]:
    """Every trial, in number order: state (and why, for pruned and unmoved ones), value, the largest
    KL to the reference over its points' updates, parameters."""
    out = []
    for t in sorted(ostudy.get_trials(deepcopy=False), key=lambda t: t.number):
        moved, kl = trial_movement(t, study, results) if study is not None else (None, None)
        params = " ".join(f"{k}={show_value(v)}" for k, v in t.params.items())
        kl_text = f"{kl:.2g}" if kl is not None else "-"
        out.append(f"  {t.number:>4}  {_state_text(t, moved):<24} {_value_text(t):>9} {kl_text:>8}  {params}")
    return out


# ----------------------------------------------------------------------------- importances
def importance_lines(ostudy: optuna.Study, complete: list[FrozenTrial]) -> list[str]:
    """fANOVA importances (Optuna's default) and the number of complete trials they rest on, or one
    line saying why they are not shown: with fewer than MIN_TRIALS_FOR_IMPORTANCE complete trials, or
    a constant objective, a ranking of parameters would be noise."""
    if len(complete) < MIN_TRIALS_FOR_IMPORTANCE:
        return [
            f"parameter importances: not shown: {len(complete)} complete trial(s); at least "
            f"{MIN_TRIALS_FOR_IMPORTANCE} are needed for a ranking that is not noise"
        ]
    values = {t.value for t in complete}
    if len(values) == 1:
        return [f"parameter importances: not shown: every complete trial has the same objective ({values.pop():.4g})"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # fANOVA's random forest with a fixed seed: the same study prints the same ranking
            evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
            importances = optuna.importance.get_param_importances(ostudy, evaluator=evaluator)
    except Exception as e:  # noqa: BLE001 - e.g. a parameter with a single value
        return [f"parameter importances: not available: {type(e).__name__}: {e}"]
    width = max((len(k) for k in importances), default=0)
    return (
        ["parameter importances:"]
        + [f"  {k:<{width}}  {v:.3f}" for k, v in importances.items()]
        + [f"  (fANOVA over the {len(complete)} complete trials; pruned, rejected and failed trials do not count)"]
    )


# ----------------------------------------------------------------------------- the description
def describe(study: TuneStudy, ostudy: optuna.Study, results: Path) -> list[str]:
    """The study's counts, every trial, the best trial (values, points), warnings, importances."""
    n = counts(ostudy)
    obj = study.spec.objective
    summary = ", ".join(f"{k} {s.name.lower()}" for s, k in n.items() if k)
    lines = [
        f"study {study.name}: {sum(n.values())} trials ({summary or 'none yet'}); objective: {obj.direction} "
        f"{obj.text()}, mean over seeds {study.spec.seeds}"
    ]
    trials = ostudy.get_trials(deepcopy=False)
    if trials:
        lines += ["trials:", f"  {'#':>4}  {'state':<24} {'value':>9} {'KL max':>8}  parameters"]
        lines += trial_lines(ostudy, study, results)
    rejected = [t.number for t in trials if t.user_attrs.get("point_status") == UNMOVED]
    if rejected:
        lines.append(
            f"{len(rejected)} trial(s) did not move and were rejected (pruned, value in parentheses): "
            f"{', '.join(map(str, rejected))}"
        )
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if not complete:
        return lines + ["no complete trial yet"]
    best = ostudy.best_trial
    name = obj.metric if obj.at == "final" else obj.text()
    lines.append(f"best trial {best.number}: {name} = {best.value:.4g}")
    lines += [f"  {k} = {show_value(v)}" for k, v in best.params.items()]
    lines += [f"  point: {Path(results) / study.name / p}" for p in best.user_attrs.get("points", [])]
    return lines + best_warnings(study, ostudy, best, complete, results) + importance_lines(ostudy, complete)


def best_warnings(
    study: TuneStudy, ostudy: optuna.Study, best: FrozenTrial, complete: list[FrozenTrial], results: Path
) -> list[str]:
    """A best trial that did not move, or (for a gain) that did not improve on its start."""
    obj, out = study.spec.objective, []
    if trial_movement(best, study, results)[0] is False:
        moved = [t for t in complete if trial_movement(t, study, results)[0] is not False]
        other = max(moved, key=lambda t: t.value if obj.direction == "maximize" else -t.value) if moved else None
        out.append(
            f"warning: the best trial did not move: every held-out evaluation after update 0 equals update 0's and "
            f"its KL to the reference stays at or below {study.spec.unmoved_kl:g}; it wins by not training. "
            + (f"The best trial that moved is trial {other.number} ({other.value:.4g}). " if other else "")
            + "`unmoved: reject` in the study file prunes such trials; an objective of gain rewards learning."
        )
    if obj.at == "gain" and ((best.value <= 0) if obj.direction == "maximize" else (best.value >= 0)):
        out.append(f"warning: no complete trial improved on its start: the best gain is {best.value:+.4g}")
    return out


# ----------------------------------------------------------------------------- sweep.json
def study_manifest(study: TuneStudy, ostudy: optuna.Study) -> dict[str, Any] | None:
    """sweep.json for the study folder (module doc); None before any trial has points."""
    trials = sorted(
        (t for t in ostudy.get_trials(deepcopy=False) if t.user_attrs.get("points")), key=lambda t: t.number
    )
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if not trials:
        return None
    obj = study.spec.objective
    if complete:
        base = ostudy.best_trial
        note, tag = f"the best complete trial ({obj.text()} = {base.value:.4g})", "best"
    else:
        base = trials[0]
        note, tag = "the first trial run (no trial is complete yet)", "first; none complete"
    axes = list(study.spec.space)
    variants: dict[str, dict[str, Any]] = {}
    points: dict[str, dict[str, Any]] = {}
    base_variant, ref = None, None
    for t in trials:
        try:
            tpoints = study.points(dict(t.params), f"trial {t.number}")
        except Exception:  # noqa: BLE001 - a trial the current code no longer accepts: left out
            continue
        if [p.id for p in tpoints] != list(t.user_attrs["points"]):
            continue  # its points were written by other code (other config hashes)
        for p in tpoints:
            if t.number == base.number:
                base_variant, ref = p.variant, p.config.model_dump(mode="json")
            label = variants.setdefault(p.variant, {"variant": p.variant, "label": f"trial {t.number}"})["label"]
            points.setdefault(
                p.id,
                {
                    "id": p.id,
                    "variant": p.variant,
                    "label": label,
                    "seed": p.seed,
                    "overrides": p.overrides,
                    "config_hash": p.config_hash,
                },
            )
    if ref is None:
        return None
    for v in variants.values():
        v["is_baseline"] = v["variant"] == base_variant
        v["overrides"] = next(p["overrides"] for p in points.values() if p["variant"] == v["variant"])
        if v["is_baseline"]:  # the table's caption and row say which trial is the baseline, and why
            v["label"] = f"trial {base.number} ({tag})"
    for p in points.values():
        p["is_baseline"] = p["variant"] == base_variant
        p["label"] = variants[p["variant"]]["label"]
    return {
        "name": study.name,
        "description": study.spec.description,
        "source": str(study.path),
        "command": f"harness tune {study.path}",
        "axes": axes,
        "baseline": {a: get_dotted(ref, a) for a in axes},
        "baseline_variant": base_variant,
        "seeds": list(study.spec.seeds),
        "metric": f"final/{obj.metric}",
        **base_manifest(ref, axes),
        "variants": list(variants.values()),
        "points": list(points.values()),
        "study": {
            "baseline_trial": base.number,
            "baseline_note": f"an Optuna study: the baseline is trial {base.number}, {note}; "
            f"every Δ is a trial minus it (`harness tune {study.path} --show` lists the trials)",
        },
    }


def write_manifest(study: TuneStudy, ostudy: optuna.Study, results: Path) -> None:
    """results/<study>/sweep.json (module doc); a folder that cannot be written is left as it is."""
    manifest = study_manifest(study, ostudy)
    if manifest is None:
        return
    try:
        atomic_write_json(Path(results) / study.name / SWEEP_MANIFEST, manifest)
    except OSError:
        pass
