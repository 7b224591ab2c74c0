"""A corpus of malformed run configs, sweep files, study files and command lines.

Every case must exit with status 2 and print one paragraph that names the file (or, for a
command line, the option) and the key, never a traceback. Cases are data: the files a case
writes into an empty folder, the command line run there, the pieces its message must contain and
the pieces it must not (file contents, internal class names, rendered console markup). They run
in-process through `harness.cli.main.main`, the console-script entry point; a few run through
`python -m harness` to prove the real entry point behaves the same.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.config.keys import iter_config_fields
from harness.config.schema import SEED_MAX
from tests.helpers import REPO  # noqa: E402

BASE = "env: {name: frozenlake}\ntrain: {updates: 3}\n"
STUDY = "name: t\nbase: base.yaml\nspace:\n  algo.lr: {type: float, low: 1.0e-4, high: 1.0e-3}\n"
SECRET = "do-not-echo-this-file-content"


@dataclass(frozen=True)
class Case:
    id: str
    files: dict[str, str | bytes]
    argv: tuple[str, ...]
    expect: tuple[str, ...]
    absent: tuple[str, ...] = field(default=())


def nested(key: str, value: str) -> str:
    """'algo.kl.coef', '.inf' -> YAML text setting that dotted key."""
    *parents, leaf = key.split(".")
    text, indent = "", ""
    for part in parents:
        text += f"{indent}{part}:\n"
        indent += "  "
    return text + f"{indent}{leaf}: {value}\n"


def run_case(id: str, text: str | bytes, *expect: str, o: tuple[str, ...] = (), absent: tuple[str, ...] = ()) -> Case:
    """A run config cfg.yaml checked by `harness run cfg.yaml [-o KEY=VALUE] --dry-run`; the message
    names cfg.yaml, except for a malformed -o, which it names instead."""
    argv = ("run", "cfg.yaml", *[a for kv in o for a in ("-o", kv)], "--dry-run")
    names = () if any("-o/--override" in e for e in expect) else ("cfg.yaml",)
    return Case(f"run-{id}", {"cfg.yaml": text}, argv, (*names, *expect), absent)


def sweep_case(
    id: str, body: str | bytes, *expect: str, base: str = BASE, extra: tuple[str, ...] = (), **files
) -> Case:
    """A sweep file s.yaml (next to base.yaml) checked by `harness sweep s.yaml --dry-run`."""
    files = {"s.yaml": body, "base.yaml": base, **files}
    return Case(f"sweep-{id}", files, ("sweep", "s.yaml", "--dry-run", *extra), expect, (SECRET, "Dict[", "str]"))


def study_case(id: str, body: str, *expect: str, base: str = BASE, **files) -> Case:
    """A study file t.yaml checked by `harness tune t.yaml --show` (which never runs a trial)."""
    files = {"t.yaml": body, "base.yaml": base, **files}
    return Case(f"study-{id}", files, ("tune", "t.yaml", "--show", "--results", "r"), ("t.yaml", *expect), (SECRET,))


def cli_case(id: str, argv: tuple[str, ...], *expect: str, **files) -> Case:
    """A command line; `expect` names the option."""
    files = {"s.yaml": "name: s\nbase: base.yaml\nseeds: [0]\n", "base.yaml": BASE, "afile": "x\n", **files}
    return Case(f"cli-{id}", files, argv, expect)


# ----------------------------------------------------------------------------- generated from the schema
def _annotation_is(info, kind: type) -> bool:
    """`kind` or `kind | None` (not a list of `kind`)."""
    union = isinstance(info.annotation, types.UnionType)
    return info.annotation is kind or (union and kind in typing.get_args(info.annotation))


FLOAT_KEYS = [k for k, info in iter_config_fields() if _annotation_is(info, float)]
INT_KEYS = [k for k, info in iter_config_fields() if _annotation_is(info, int) and not _annotation_is(info, bool)]
GENERATED = [
    *[run_case(f"inf-{k}", nested(k, ".inf"), k, "finite number") for k in FLOAT_KEYS],
    *[run_case(f"nan-{k}", nested(k, ".nan"), k, "finite number") for k in FLOAT_KEYS[::3]],
    *[run_case(f"huge-{k}", nested(k, str(10**15)), k, "less than or equal to") for k in INT_KEYS],
]

# ----------------------------------------------------------------------------- run configs
RUN = [
    run_case("yaml-syntax", "algo: {lr: 1.0e-3\n", "invalid YAML"),
    run_case("yaml-tab", "algo:\n\tlr: 0.1\n", "invalid YAML"),
    run_case("duplicate-key", "algo:\n  lr: 0.1\n  lr: 0.2\n", "cfg.yaml:3", "'lr' appears twice"),
    run_case("top-level-list", "- algo\n- env\n", "expected a mapping", "a list"),
    run_case("plain-text", f"{SECRET} and more words\n", "expected a mapping", "a text", absent=(SECRET,)),
    run_case("binary", b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "cannot read config file"),
    run_case("section-scalar", "algo: grpo\n", "algo = 'grpo'", "a mapping with keys"),
    run_case("subsection-number", "algo: {clip: 5}\n", "algo.clip = 5", "valid mapping", absent=("ClipConfig",)),
    run_case("unknown-section", "algos: {lr: 0.1}\n", "unknown key 'algos'", "Did you mean 'algo'"),
    run_case("unknown-nested", "algo: {clip: {levle: token}}\n", "'algo.clip.levle'", "algo.clip.level"),
    run_case("renamed-key", "algo: {filter: {p: 0.5}}\n", "algo.filter.p was renamed to algo.filter.top_p"),
    run_case("bad-literal", "context: {policy: windowed}\n", "context.policy = 'windowed'", "obs_truncate"),
    run_case("bad-axis", "algo: {clip: {level: tokn}}\n", "algo.clip.level = 'tokn'", "Did you mean 'token'"),
    run_case("bad-env", "env: {name: frozen_lake}\n", "env.name = 'frozen_lake'", "frozenlake"),
    run_case("env-option-unknown", "env: {options: {sizee: 4}}\n", "env.options.sizee", "Valid keys"),
    run_case("env-option-range", "env: {options: {size: 100}}\n", "env.options.size = 100", "less than or equal"),
    run_case("env-option-inf", "env: {options: {p_frozen: .inf}}\n", "env.options.p_frozen = inf", "finite"),
    run_case("env-option-type", "env: {options: {slippery: maybe}}\n", "env.options.slippery = 'maybe'"),
    run_case("sokoban-room", "env: {name: sokoban, options: {size: 4, num_boxes: 4}}\n", "num_boxes=4"),
    run_case("tooluse-calls", "env: {name: tooluse, options: {min_calls: 3, max_calls: 2}}\n", "min_calls=3"),
    run_case("gae-no-critic", "algo: {adv: {estimator: gae}}\n", "algo.adv.estimator 'gae'", "algo.critic.enabled"),
    run_case(
        "gae-per-step",
        "algo: {adv: {estimator: gae}, critic: {enabled: true}}\ncontext: {policy: window}\n",
        "context.layout 'concatenated'",
    ),
    run_case("layout-policy", "context: {policy: window, layout: concatenated}\n", "context.layout 'concatenated'"),
    run_case("curriculum-order", "turns: {max: 8, curriculum: [4, 2]}\n", "turns.curriculum", "strictly increasing"),
    run_case(
        "curriculum-above-max", "turns: {max: 4, curriculum: [2, 8]}\n", "turns.curriculum [2, 8]", "turns.max = 4"
    ),
    run_case("turns-zero", "turns: {max: 0}\n", "turns.max = 0", "greater than or equal to 1"),
    run_case("sft-no-rl-left", "sft: {budget: 100, demos: 5}\n", "sft.budget = 100", "fewer than one RL update"),
    run_case("sft-over-budget", "sft: {budget: 100, demos: 50}\n", "sft.budget = 100", "sft.demos"),
    run_case("temperature-zero", "rollout: {temperature: 0}\n", "rollout.temperature = 0", "greater than 0"),
    run_case("top-p", "rollout: {top_p: 1.5}\n", "rollout.top_p = 1.5", "less than or equal to 1"),
    run_case(
        "vllm-cpu",
        "rollout: {backend: vllm}\ntrain: {device: cpu}\n",
        "rollout.backend 'vllm' with train.device = 'cpu'",
        "set train.device: cuda",
    ),
    run_case(
        "staleness-negative", "rollout: {staleness: -1}\n", "rollout.staleness = -1", "greater than or equal to 0"
    ),
    run_case("cross-prob", "rollout: {cross_policy: {prob: 1.5}}\n", "rollout.cross_policy.prob = 1.5"),
    run_case(
        "concurrent-cross",
        "rollout: {concurrent: true, cross_policy: {members: 1}}\n",
        "rollout.concurrent = true",
        "rollout.cross_policy.members = 1",
    ),
    run_case("obs-sft-negative", "algo: {obs_sft: {coef: -0.1}}\n", "algo.obs_sft.coef = -0.1"),
    run_case("distill-teacher", "algo: {distill: {teacher: oracle}}\n", "algo.distill.teacher = 'oracle'", "reference"),
    run_case("distill-negative", "algo: {distill: {coef: -1}}\n", "algo.distill.coef = -1"),
    run_case(
        "distill-self-no-hint",
        "algo: {distill: {coef: 1, teacher: policy, hint: none}}\n",
        "algo.distill.teacher 'policy'",
        "hint: hindsight",
    ),
    run_case("act-mode", "act: {mode: critic}\n", "act.mode = 'critic'", "stage"),
    run_case("act-stage-too-long", "act: {mode: stage, updates: 50}\ntrain: {updates: 50}\n", "act.updates = 50"),
    run_case("act-mix-one", "act: {mode: mixed, mix: 1.0}\n", "act.mix = 1.0"),
    run_case("process-reward-literal", "reward: {process: prm}\n", "reward.process = 'prm'", "judge"),
    run_case("judge-kind", "reward: {process: judge, judge: {kind: llm}}\n", "reward.judge.kind = 'llm'", "model"),
    run_case("judge-votes-zero", "reward: {judge: {votes: 0}}\n", "reward.judge.votes = 0"),
    run_case("process-weight-negative", "reward: {weight: -1}\n", "reward.weight = -1"),
    run_case(
        "judge-concurrent",
        "reward: {process: judge}\nrollout: {concurrent: true}\n",
        "reward.process 'judge'",
        "rollout.concurrent",
    ),
    run_case("max-new-tokens-zero", "rollout: {max_new_tokens: 0}\n", "rollout.max_new_tokens = 0"),
    run_case("seed-negative", "train: {seed: -1}\n", "train.seed = -1", "greater than or equal to 0"),
    run_case("seed-2-64", f"train: {{seed: {2**64}}}\n", f"train.seed = {2**64}", str(SEED_MAX)),
    run_case("seed-2-32", f"train: {{seed: {2**32}}}\n", "train.seed", str(SEED_MAX)),
    run_case("seed-fraction", "train: {seed: 1.5}\n", "train.seed = 1.5", "integer"),
    run_case("seed-text", "train: {seed: abc}\n", "train.seed = 'abc'", "integer"),
    run_case("init-seed-negative", "model: {tiny: {init_seed: -1}}\n", "model.tiny.init_seed = -1"),
    run_case("init-seed-2-64", f"model: {{tiny: {{init_seed: {2**64}}}}}\n", "model.tiny.init_seed", str(SEED_MAX)),
    run_case("lora-target-typo", "model: {lora: {target_modules: [qproj]}}\n", "'qproj'", "did you mean 'q_proj'"),
    run_case("lora-target-none", "model: {lora: {target_modules: []}}\n", "model.lora.target_modules", "at least 1"),
    run_case("lora-target-empty", "model: {lora: {target_modules: ['']}}\n", "model.lora.target_modules"),
    run_case("lora-dropout", "model: {lora: {dropout: 1.0}}\n", "model.lora.dropout = 1.0", "less than 1"),
    run_case("model-missing-dir", "model: {name: ./no-such-model}\n", "model.name", "no-such-model", "not an existing"),
    run_case("model-empty-name", "model: {name: ''}\n", "model.name = ''", "at least 1"),
    run_case("model-not-cached", "model: {name: no-org/no-such-model}\n", "model.name", "HF_HUB_OFFLINE"),
    run_case("model-bad-id", "model: {name: 'bad id!!'}\n", "model.name", "valid Hugging Face id"),
    run_case("model-is-a-file", "model: {name: ./cfg.yaml}\n", "model.name", "config.json"),
    run_case("dtype", "model: {dtype: float8}\n", "model.dtype = 'float8'", "bfloat16"),
    run_case("lr-negative", "algo: {lr: -1}\n", "algo.lr = -1", "greater than 0"),
    run_case("kl-where", "algo: {kl: {where: lose}}\n", "algo.kl.where = 'lose'", "reward"),
    run_case("dual-clip", "algo: {clip: {dual_c: 0.5}}\n", "algo.clip.dual_c = 0.5", "greater than 1"),
    run_case("preset", "algo: {preset: dapo}\n", "algo.preset = 'dapo'", "reinforce_pp"),
    run_case("epochs-zero", "algo: {epochs: 0}\n", "algo.epochs = 0"),
    run_case("filter-top-p", "algo: {filter: {top_p: 0}}\n", "algo.filter.top_p = 0"),
    run_case("samples-negative", "tracking: {samples: -1}\n", "tracking.samples = -1"),
    run_case("device", "train: {device: tpu}\n", "train.device = 'tpu'", "cuda"),
    run_case(
        "two-problems", "turns: {max: 0}\nalgo: {kl: {where: lose}}\n", "2 problems", "turns.max", "algo.kl.where"
    ),
    run_case(
        "console-markup",
        "algo: {agg: ':x: [bold]b[/bold]'}\n",
        "algo.agg = ':x: [bold]b[/bold]'",
        absent=("\N{CROSS MARK}",),
    ),
    run_case("override-form", "", "-o/--override 'algo.lr'", "dotted.key=value", o=("algo.lr",)),
    run_case("override-empty-key", "", "-o/--override '=5'", o=("=5",)),
    run_case("override-empty-part", "", "-o/--override 'algo..lr=1'", o=("algo..lr=1",)),
    run_case("override-unknown", "", "'algo.clip.epslow'", "set by -o", o=("algo.clip.epslow=0.1",)),
    run_case("override-inf", "", "algo.lr = inf", "finite", "set by -o", o=("algo.lr=.inf",)),
    run_case("override-seed", "", "train.seed = -1", "set by -o", o=("train.seed=-1",)),
    run_case("override-under-scalar", "", "algo.clip.level = {'x': 1}", o=("algo.clip.level.x=1",)),
    run_case(
        "override-under-list",
        "algo: {clip: {level: token}}\n",
        "cannot set 'algo.clip.level.x'",
        o=("algo.clip.level.x=1",),
    ),
    run_case("override-curriculum", "", "turns.curriculum [2, 99]", o=("turns.curriculum=[2, 99]",)),
    run_case("override-lora", "", "'v_projj'", o=("model.lora.target_modules=[v_projj]",)),
]

# ----------------------------------------------------------------------------- sweep files
SWEEP = [
    sweep_case("missing-name", "base: base.yaml\n", "s.yaml", "name is required"),
    sweep_case("bad-name", "name: 'my sweep!'\nbase: base.yaml\n", "s.yaml", "name = 'my sweep!'", "pattern"),
    sweep_case("not-mapping", "- a\n- b\n", "s.yaml", "a sweep file is a mapping"),
    sweep_case("plain-text", f"{SECRET}\n", "s.yaml", "a sweep file is a mapping", "a text"),
    sweep_case("yaml-syntax", "name: s\ngrid: {a: [1, 2}\n", "s.yaml:", "invalid YAML"),
    sweep_case("binary", b"\xff\xfe\x00garbage", "s.yaml", "cannot read sweep file"),
    sweep_case("unknown-key", "name: s\nbase: base.yaml\ngrids: {}\n", "s.yaml", "'grids'", "Did you mean 'grid'"),
    sweep_case("base-number", "name: s\nbase: 42\n", "s.yaml", "base = 42", "a number", "inline mapping"),
    sweep_case("base-list", "name: s\nbase: [1]\n", "s.yaml", "base = [1]", "not a list"),
    sweep_case("base-empty", "name: s\nbase: ''\n", "s.yaml", "base = ''", "empty text"),
    sweep_case("base-is-itself", "name: s\nbase: s.yaml\nseeds: [0]\n", "s.yaml", "base: 's.yaml'", "a cycle"),
    sweep_case(
        "base-is-a-sweep",
        "name: s\nbase: other.yaml\nseeds: [0]\n",
        "s.yaml",
        "base: 'other.yaml'",
        "is a sweep file, not a run config",
        **{"other.yaml": "name: o\nbase: base.yaml\ngrid: {algo.agg: [token-mean]}\nseeds: [0, 1]\n"},
    ),
    sweep_case(
        "base-is-a-study",
        "name: s\nbase: t.yaml\nseeds: [0]\n",
        "s.yaml",
        "is a study file",
        **{"t.yaml": STUDY},
    ),
    sweep_case("base-missing", "name: s\nbase: nothere.yaml\nseeds: [0]\n", "s.yaml", "not found", "nothere.yaml"),
    sweep_case("base-directory", "name: s\nbase: sub\nseeds: [0]\n", "s.yaml", "sub is a directory", sub=None),
    sweep_case(
        "base-text-file",
        "name: s\nbase: notes.txt\nseeds: [0]\n",
        "notes.txt",
        "expected a mapping",
        **{"notes.txt": f"{SECRET} {SECRET}\n"},
    ),
    sweep_case(
        "base-binary",
        "name: s\nbase: img.png\nseeds: [0]\n",
        "img.png",
        "cannot read base config",
        **{"img.png": b"\x89PNG\r\n\x1a\n\x00\xff"},
    ),
    sweep_case(
        "base-invalid", "name: s\nbase: base.yaml\nseeds: [0]\n", "base.yaml", "algo.agg = 'x'", base="algo: {agg: x}\n"
    ),
    sweep_case(
        "inline-base-invalid", "name: s\nbase: {turns: {max: -1}}\nseeds: [0]\n", "s.yaml (base)", "turns.max = -1"
    ),
    sweep_case("grid-not-list", "name: s\nbase: base.yaml\ngrid: {algo.agg: token-mean}\n", "s.yaml", "grid.algo.agg"),
    sweep_case("grid-empty", "name: s\nbase: base.yaml\ngrid: {algo.agg: []}\n", "s.yaml", "algo.agg", "empty list"),
    sweep_case("grid-axis", "name: s\nbase: base.yaml\ngrid: {algo.agg: [nope]}\n", "s.yaml", "algo.agg = 'nope'"),
    sweep_case("grid-unknown-key", "name: s\nbase: base.yaml\ngrid: {algo.lrr: [0.1]}\n", "s.yaml", "'algo.lrr'"),
    sweep_case("grid-seed", "name: s\nbase: base.yaml\ngrid: {train.seed: [1, 2]}\n", "s.yaml", "train.seed", "seeds"),
    sweep_case(
        "grid-inf", "name: s\nbase: base.yaml\ngrid: {algo.lr: [.inf]}\nseeds: [0]\n", "s.yaml", "algo.lr = inf"
    ),
    sweep_case(
        "grid-curriculum",
        "name: s\nbase: base.yaml\ngrid: {turns.curriculum: [[2, 20]]}\nseeds: [0]\n",
        "s.yaml",
        "turns.curriculum [2, 20]",
    ),
    sweep_case(
        "grid-sft-budget",
        "name: s\nbase: base.yaml\ngrid: {sft.budget: [10]}\nseeds: [0]\n",
        "s.yaml",
        "sft.budget = 10",
        "fewer than one RL update",
    ),
    sweep_case(
        "grid-lora-target",
        "name: s\nbase: base.yaml\ngrid: {model.lora.target_modules: [[q_proj], [qkv]]}\nseeds: [0]\n",
        "s.yaml",
        "'qkv'",
    ),
    sweep_case(
        "zip-lengths",
        "name: s\nbase: base.yaml\nzip:\n  - {algo.clip.eps_low: [0.1, 0.2], algo.clip.eps_high: [0.3]}\n",
        "s.yaml",
        "zip group 1",
        "different lengths",
    ),
    sweep_case(
        "zip-and-grid",
        "name: s\nbase: base.yaml\ngrid: {algo.lr: [0.1]}\nzip: [{algo.lr: [0.2]}]\n",
        "s.yaml",
        "algo.lr appears in more than one",
    ),
    sweep_case("points-not-list", "name: s\nbase: base.yaml\npoints: {a: 1}\n", "s.yaml", "points"),
    sweep_case("point-not-mapping", "name: s\nbase: base.yaml\npoints: [5]\n", "s.yaml", "points.0 = 5"),
    sweep_case("point-label", "name: s\nbase: base.yaml\npoints: [{label: 5, turns.max: 3}]\n", "s.yaml", "label"),
    sweep_case(
        "duplicate-labels",
        "name: s\nbase: base.yaml\npoints: [{label: a, turns.max: 3}, {label: a, turns.max: 4}]\n",
        "s.yaml",
        "label 'a' is used twice",
    ),
    sweep_case(
        "identical-points",
        "name: s\nbase: base.yaml\npoints: [{label: a, turns.max: 3}, {label: b, turns.max: 3}]\n",
        "s.yaml",
        "'a' and 'b' resolve to the same config",
    ),
    sweep_case("baseline-number", "name: s\nbase: base.yaml\nbaseline: 3\n", "s.yaml", "baseline = 3", "a number"),
    sweep_case(
        "baseline-label",
        "name: s\nbase: base.yaml\npoints: [{label: a, turns.max: 3}]\nbaseline: b\nseeds: [0]\n",
        "s.yaml",
        "baseline 'b'",
    ),
    sweep_case(
        "baseline-overrides",
        "name: s\nbase: base.yaml\ngrid: {turns.max: [3]}\nbaseline: {turns.max: 5}\nseeds: [0]\n",
        "s.yaml",
        "matches no point",
    ),
    sweep_case(
        "axis-isolation",
        "name: s\nbase: base.yaml\npoints:\n  - {label: a, algo.agg: token-mean}\n  - {label: p, algo.preset: ppo}\n"
        "seeds: [0]\n",
        "s.yaml",
        "not a declared axis",
    ),
    sweep_case("seed-negative", "name: s\nbase: base.yaml\nseeds: [-1]\n", "s.yaml", "seeds.0 = -1"),
    sweep_case("seed-2-64", f"name: s\nbase: base.yaml\nseeds: [{2**64}]\n", "s.yaml", "seeds.0", str(SEED_MAX)),
    sweep_case("seeds-empty", "name: s\nbase: base.yaml\nseeds: []\n", "s.yaml", "seeds", "at least 1"),
    sweep_case("seeds-duplicate", "name: s\nbase: base.yaml\nseeds: [0, 0]\n", "s.yaml", "seeds", "duplicates"),
    sweep_case("seeds-text", "name: s\nbase: base.yaml\nseeds: '0,1'\n", "s.yaml", "seeds = '0,1'", "list"),
    sweep_case("seeds-fraction", "name: s\nbase: base.yaml\nseeds: [0.5]\n", "s.yaml", "seeds.0 = 0.5"),
    sweep_case("description-list", "name: s\nbase: base.yaml\ndescription: [a]\n", "s.yaml", "description"),
    sweep_case(
        "model-missing-dir",
        "name: s\nbase: base.yaml\ngrid: {model.name: [./no-model-here]}\nseeds: [0]\n",
        "s.yaml",
        "model.name",
        "no-model-here",
    ),
    sweep_case(
        "override-seed",
        "name: s\nbase: base.yaml\nseeds: [0]\n",
        "-o train.seed=5",
        "--seeds 5",
        extra=("-o", "train.seed=5"),
    ),
    sweep_case(
        "override-value",
        "name: s\nbase: base.yaml\nseeds: [0]\n",
        "algo.lr = 'x'",
        "-o algo.lr",
        extra=("-o", "algo.lr=x"),
    ),
    sweep_case("override-form", "name: s\nbase: base.yaml\nseeds: [0]\n", "-o/--override 'algo'", extra=("-o", "algo")),
    sweep_case(
        "seeds-option-negative", "name: s\nbase: base.yaml\n", "--seeds -1", "out of range", extra=("--seeds=-1",)
    ),
    sweep_case(
        "seeds-option-huge", "name: s\nbase: base.yaml\n", "--seeds", str(SEED_MAX), extra=(f"--seeds={2**64}",)
    ),
    sweep_case("seeds-option-text", "name: s\nbase: base.yaml\n", "--seeds 'a,b'", extra=("--seeds", "a,b")),
    sweep_case(
        "seeds-option-dup", "name: s\nbase: base.yaml\n", "--seeds [1, 1]", "duplicates", extra=("--seeds", "1,1")
    ),
    sweep_case("seeds-option-empty", "name: s\nbase: base.yaml\n", "--seeds []", extra=("--seeds", ",")),
]

# ----------------------------------------------------------------------------- study files
SPACE = "name: t\nbase: base.yaml\nspace:\n  {key}: {spec}\n"


def space_case(id: str, key: str, spec: str, *expect: str) -> Case:
    return study_case(f"space-{id}", SPACE.format(key=key, spec=spec), f"space.{key}", *expect)


STUDY_CASES = [
    study_case("not-mapping", "- a\n", "a study file is a mapping"),
    study_case("plain-text", f"{SECRET}\n", "a study file is a mapping"),
    study_case("missing-name", "base: base.yaml\nspace: {algo.lr: {type: float, low: 0.1, high: 0.2}}\n", "name"),
    study_case("missing-space", "name: t\nbase: base.yaml\n", "space is required"),
    study_case("empty-space", "name: t\nbase: base.yaml\nspace: {}\n", "space", "at least 1"),
    study_case("unknown-key", STUDY + "trials: 3\n", "'trials'", "Did you mean 'n_trials'"),
    space_case("unknown-key", "algo.lrr", "{type: float, low: 0.1, high: 0.2}", "Did you mean 'algo.lr'"),
    space_case("seed", "train.seed", "{type: int, low: 0, high: 3}", "seeds"),
    space_case("type", "algo.lr", "{type: normal, low: 0.1, high: 0.2}", "'normal'", "categorical"),
    space_case("high-inf", "algo.lr", "{type: float, low: 0.1, high: .inf}", "high = inf", "finite"),
    space_case("int-high-inf", "algo.epochs", "{type: int, low: 1, high: .inf}", "high = inf", "finite"),
    space_case("low-nan", "algo.lr", "{type: float, low: .nan, high: 0.2}", "low = nan"),
    space_case("low-above-high", "algo.lr", "{type: float, low: 0.3, high: 0.2}", "greater than high"),
    space_case("log-zero", "algo.lr", "{type: float, low: 0, high: 0.2, log: true}", "log scale needs low > 0"),
    space_case("categorical-bounds", "algo.agg", "{type: categorical, low: 1, choices: [token-mean]}", "low"),
    space_case("categorical-empty", "algo.agg", "{type: categorical, choices: []}", "non-empty list"),
    space_case("categorical-dup", "algo.agg", "{type: categorical, choices: [token-mean, token-mean]}", "duplicates"),
    space_case("float-on-int", "algo.epochs", "{type: float, low: 1, high: 3}", "use type: int"),
    space_case("int-fraction", "algo.epochs", "{type: int, low: 1.5, high: 3}", "whole numbers"),
    space_case("bad-choice", "algo.agg", "{type: categorical, choices: [token-mean, nope]}", "'nope'"),
    space_case("step-negative", "algo.lr", "{type: float, low: 0.1, high: 0.2, step: -0.1}", "step must be > 0"),
    space_case("log-step", "algo.lr", "{type: float, low: 0.1, high: 0.2, log: true, step: 0.05}", "log and step"),
    space_case("bound-out-of-range", "rollout.top_p", "{type: float, low: 0.5, high: 2.0}", "rollout.top_p"),
    space_case("bound-seed", "model.tiny.init_seed", f"{{type: int, low: 0, high: {2**64}}}", str(SEED_MAX)),
    study_case(
        "space-model-missing",
        SPACE.format(key="model.name", spec="{type: categorical, choices: [tiny, ./no-model]}"),
        "model.name",
        "no-model",
        "not an existing directory",
    ),
    study_case("objective-typo", STUDY + "objective: {metric: eval_greedy/sucess}\n", "objective.metric", "success'?"),
    study_case("objective-train-metric", STUDY + "objective: {metric: env/success}\n", "objective.metric", "eval_"),
    study_case("objective-direction", STUDY + "objective: {direction: up}\n", "objective.direction = 'up'"),
    study_case("objective-at", STUDY + "objective: {at: last}\n", "objective.at = 'last'", "best"),
    study_case("sampler-name", STUDY + "sampler: {name: cmaes}\n", "sampler.name = 'cmaes'", "tpe"),
    study_case("sampler-plain-bad", STUDY + "sampler: cmaes\n", "sampler.name = 'cmaes'"),
    study_case("sampler-number", STUDY + "sampler: 5\n", "sampler must be a name"),
    study_case(
        "sampler-option-type", STUDY + "sampler: {name: tpe, n_startup_trials: abc}\n", "sampler.n_startup_trials"
    ),
    study_case("sampler-bool", STUDY + "sampler: {name: tpe, multivariate: 3}\n", "sampler.multivariate = 3"),
    study_case("sampler-seed", STUDY + "sampler: {name: random, seed: -1}\n", "sampler.seed = -1", str(SEED_MAX)),
    study_case("sampler-unknown-option", STUDY + "sampler: {name: tpe, startup: 3}\n", "unknown option 'startup'"),
    study_case("sampler-callable", STUDY + "sampler: {name: tpe, gamma: 0.1}\n", "sampler.gamma = 0.1", "callable"),
    study_case("pruner-name", STUDY + "pruner: {name: hyperband}\n", "pruner.name = 'hyperband'", "median"),
    study_case("pruner-option-type", STUDY + "pruner: {name: median, n_warmup_steps: 1.5}\n", "pruner.n_warmup_steps"),
    study_case("pruner-unknown-option", STUDY + "pruner: {name: median, n_startup: 2}\n", "unknown option 'n_startup'"),
    study_case("pruner-invalid", STUDY + "pruner: {name: median, n_startup_trials: -1}\n", "pruner"),
    study_case("n-trials-zero", STUDY + "n_trials: 0\n", "n_trials = 0"),
    study_case("seeds-negative", STUDY + "seeds: [-1]\n", "seeds.0 = -1"),
    study_case("seeds-duplicate", STUDY + "seeds: [1, 1]\n", "duplicates"),
    study_case("heartbeat-zero", STUDY + "heartbeat_s: 0\n", "heartbeat_s = 0"),
    study_case("base-is-itself", STUDY.replace("base.yaml", "t.yaml"), "base: 't.yaml'", "a cycle"),
    study_case("base-number", STUDY.replace("base.yaml", "42"), "base = 42", "a number"),
    study_case("base-missing", STUDY.replace("base.yaml", "nope.yaml"), "nope.yaml", "not found"),
    study_case(
        "base-is-a-sweep",
        STUDY.replace("base.yaml", "s.yaml"),
        "is a sweep file",
        **{"s.yaml": "name: s\nbase: base.yaml\nseeds: [0]\n"},
    ),
    study_case("overrides-seed", STUDY + "overrides: {train.seed: 5}\n", "overrides.train.seed = 5", "seeds: [5]"),
    study_case("overrides-value", STUDY + "overrides: {turns.max: 0}\n", "turns.max = 0", "the study's overrides"),
]

# ----------------------------------------------------------------------------- command lines
CLI = [
    cli_case("run-missing-file", ("run", "nothere.yaml"), "nothere.yaml", "not found"),
    cli_case("run-directory", ("run", "sub", "--dry-run"), "sub is a directory", sub=None),
    cli_case("run-results-file", ("run", "base.yaml", "--results", "afile"), "--results/--out afile", "is a file"),
    cli_case("run-out-file", ("run", "base.yaml", "--out", "afile"), "--results/--out afile", "is a file"),
    cli_case("run-missing-argument", ("run",), "Missing argument"),
    cli_case("run-override-missing-value", ("run", "base.yaml", "-o"), "'-o' requires an argument"),
    cli_case("sweep-missing-file", ("sweep", "nothere.yaml", "--dry-run"), "nothere.yaml", "not found"),
    cli_case("sweep-directory", ("sweep", "sub", "--dry-run"), "sweep file sub is a directory", sub=None),
    cli_case("sweep-workers-zero", ("sweep", "s.yaml", "--workers", "0"), "'--workers'"),
    cli_case("sweep-workers-text", ("sweep", "s.yaml", "--workers", ":x:"), "'--workers'"),
    cli_case("sweep-backend", ("sweep", "s.yaml", "--backend", "slurm"), "--backend 'slurm'", "local, ray"),
    cli_case("sweep-address-local", ("sweep", "s.yaml", "--address", "h:1"), "--address"),
    cli_case("sweep-retries", ("sweep", "s.yaml", "--retries", "-1"), "'--retries'"),
    cli_case(
        "sweep-transfer",
        ("sweep", "s.yaml", "--backend", "ray", "--transfer", "nfs"),
        "--transfer 'nfs'",
        "objects, shared-fs",
    ),
    cli_case("sweep-transfer-local", ("sweep", "s.yaml", "--transfer", "objects"), "--transfer", "--backend ray"),
    cli_case("sweep-max-point-mb", ("sweep", "s.yaml", "--backend", "ray", "--max-point-mb", "0"), "'--max-point-mb'"),
    cli_case(
        "sweep-max-point-mb-shared",
        ("sweep", "s.yaml", "--backend", "ray", "--transfer", "shared-fs", "--max-point-mb", "10"),
        "--max-point-mb applies to --transfer objects",
    ),
    cli_case("sweep-results-file", ("sweep", "s.yaml", "--results", "afile"), "--results afile", "is a file"),
    cli_case("sweep-unknown-option", ("sweep", "s.yaml", "--bogus"), "No such option: --bogus"),
    cli_case("unknown-command", ("swep", "s.yaml"), "No such command 'swep'"),
    cli_case("tune-n-trials", ("tune", "t.yaml", "--n-trials", "0"), "'--n-trials'"),
    cli_case("tune-missing-file", ("tune", "nothere.yaml"), "study file not found", "nothere.yaml"),
    cli_case(
        "tune-results-file",
        ("tune", "t.yaml", "--results", "afile", "--no-mlflow"),
        "--results afile",
        "is a file",
        **{"t.yaml": STUDY},
    ),
    cli_case("axes-write-doc-missing", ("axes", "--write-doc", "nothere.md"), "--write-doc nothere.md"),
    cli_case("axes-write-doc-no-block", ("axes", "--write-doc", "base.yaml"), "base.yaml", "GENERATED"),
    cli_case("table-missing", ("table", "nothere"), "nothere is not a results folder"),
    cli_case("bench-missing-config", ("bench", "nothere.yaml"), "nothere.yaml", "not found"),
]

CASES = GENERATED + RUN + SWEEP + STUDY_CASES + CLI


def write_files(folder: Path, files: dict[str, str | bytes | None]) -> None:
    for name, content in files.items():
        if content is None:
            (folder / name).mkdir()
        elif isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            (folder / name).write_text(content)


def invoke(argv: list[str]) -> tuple[int | str, str, str]:
    """(exit status, stdout, stderr) of `harness ARGV` in this process; an exception that escapes
    `main` is reported as status 'traceback' with the exception in stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
            code: int | str = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException as e:  # noqa: BLE001 - exactly what the corpus must never see
            code = "traceback"
            err.write(f"Traceback: {type(e).__name__}: {e}")
    return code, out.getvalue(), err.getvalue()


def test_the_corpus_is_large_and_ids_are_unique():
    assert len(CASES) >= 150
    assert len({c.id for c in CASES}) == len(CASES)
    assert len(RUN) + len(SWEEP) + len(STUDY_CASES) + len(CLI) >= 150  # written by hand, besides the generated


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_malformed_input_exits_2_with_one_paragraph(case, tmp_path, monkeypatch):
    write_files(tmp_path, case.files)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "1000")  # typer's usage panel on one line per message
    code, out, err = invoke(list(case.argv))
    assert code == 2, f"exit {code}\nstdout: {out}\nstderr: {err}"
    assert "Traceback" not in err + out
    error = err[err.find("error: ") :] if "error: " in err else err
    assert "\n\n" not in error.strip(), error  # one paragraph
    for piece in case.expect:
        assert piece in err, f"{piece!r} missing from:\n{err}"
    for piece in case.absent:
        assert piece not in err + out, f"{piece!r} must not be shown:\n{err}"


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["run", "cfg.yaml", "--dry-run"], "cfg.yaml: train.seed = -1"),
        (["sweep", "s.yaml", "--dry-run", "--seeds=-1"], "--seeds -1"),
    ],
)
def test_the_real_entry_point_gives_the_same_one_paragraph(argv, expect, tmp_path):
    write_files(
        tmp_path,
        {
            "cfg.yaml": "train: {seed: -1}\n",
            "base.yaml": BASE,
            "s.yaml": "name: s\nbase: base.yaml\nseeds: [0]\n",
        },
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "1000"}
    out = subprocess.run(
        [sys.executable, "-m", "harness", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error: ") and "Traceback" not in out.stderr
    assert expect in out.stderr and out.stderr.strip().count("\n") == 0
