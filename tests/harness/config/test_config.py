"""Strict config loading: every shipped config loads; every malformed file gets a clear message."""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING
from pathlib import Path

import pytest

from algorithms.types import AdvantageParams, AggParams, ClipParams, CorrectionParams, FilterParams
from harness.config.errors import ConfigError
from harness.config.keys import flatten, iter_config_fields
from harness.config.loading import load_run_config, parse_override, validate_run_config
from harness.config.schema import RENAMED_KEYS, RunConfig
from tests.helpers import REPO  # noqa: E402


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(path: Path, overrides: list[str] = ()) -> str:
    with pytest.raises(ConfigError) as info:
        load_run_config(path, list(overrides))
    return str(info.value)


def test_empty_file_gives_the_schema_defaults(tmp_path):
    cfg = load_run_config(write(tmp_path, ""))
    assert cfg.algo.clip.level == RunConfig().algo.clip.level
    assert cfg.env.name == "frozenlake"


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    cfg = load_run_config(path)
    assert isinstance(cfg, RunConfig)


def test_overrides_are_typed_and_win(tmp_path):
    path = write(tmp_path, "algo:\n  lr: 0.5\n")
    cfg = load_run_config(
        path,
        [
            "algo.lr=1e-3",
            "turns.max=5",
            "context.mask_observations=false",
            "turns.curriculum=[2, 4]",
            "algo.clip.level=sequence",
        ],
    )
    assert cfg.algo.lr == pytest.approx(1e-3)
    assert cfg.turns.max == 5 and cfg.turns.curriculum == [2, 4]
    assert cfg.context.mask_observations is False
    assert cfg.algo.clip.level == "sequence"


def test_parse_override():
    assert parse_override("a.b=3") == ("a.b", 3)
    assert parse_override("a.b=x=y") == ("a.b", "x=y")
    with pytest.raises(ConfigError, match="dotted.key=value"):
        parse_override("no-equals-sign")


def test_env_options_are_completed_with_the_env_defaults(tmp_path):
    import envs

    cfg = load_run_config(write(tmp_path, "env: {name: frozenlake}\n"))
    expected = envs.ENVS.get("frozenlake").Options().model_dump(mode="json")
    assert cfg.env.options == expected


def test_preset_fills_only_the_keys_the_user_did_not_set(tmp_path):
    from algorithms.presets import PRESETS

    path = write(tmp_path, "algo:\n  preset: ppo\n  kl: {where: loss}\n")
    cfg = load_run_config(path)
    flat = flatten(cfg.model_dump(mode="json"))
    for key, value in PRESETS["ppo"].items():
        if key != "kl.where":
            assert flat[f"algo.{key}"] == value, key
    assert cfg.algo.kl.where == "loss"  # the user wins


# A dozen malformed files: (YAML, overrides, substrings the message must contain).
MALFORMED = {
    "unknown-top-level-key": (
        "algorithm:\n  agg: token-mean\n",
        [],
        ["unknown key 'algorithm'", "Did you mean 'algo'", "model, env, turns"],
    ),
    "unknown-nested-key": (
        "algo:\n  clip:\n    levle: token\n",
        [],
        ["'algo.clip.levle'", "Did you mean 'algo.clip.level'", "eps_low"],
    ),
    "bad-axis-value": (
        "algo:\n  clip:\n    level: tokn\n",
        [],
        ["algo.clip.level = 'tokn'", "token", "sequence", "none", "Did you mean 'token'"],
    ),
    "bad-aggregation": (
        "algo:\n  agg: token_mean\n",
        [],
        ["algo.agg = 'token_mean'", "seq-mean-token-mean", "Did you mean 'token-mean'"],
    ),
    "bad-literal": (
        "context:\n  policy: windowed\n",
        [],
        ["context.policy = 'windowed'", "full", "window", "obs_truncate", "single"],
    ),
    "bad-type": ("turns:\n  max: many\n", [], ["turns.max = 'many'", "integer"]),
    "out-of-range": ("rollout:\n  temperature: 0\n", [], ["rollout.temperature = 0", "greater than 0"]),
    "yaml-syntax": ("algo:\n  clip: {level: token\nturns: 3\n", [], ["cfg.yaml:", "invalid YAML"]),
    "duplicate-key": (
        "algo:\n  agg: token-mean\n  agg: seq-mean-token-sum\n",
        [],
        ["cfg.yaml:3", "'agg' appears twice"],
    ),
    "top-level-list": ("- algo\n- env\n", [], ["expected a mapping", "algo"]),
    "section-not-mapping": ("algo: grpo\n", [], ["algo = 'grpo'", "a mapping with keys", "clip"]),
    "unknown-env": ("env:\n  name: frozen_lake\n", [], ["env.name = 'frozen_lake'", "frozenlake", "sokoban"]),
    "unknown-env-option": (
        "env:\n  name: frozenlake\n  options: {sizee: 4}\n",
        [],
        ["env.options.sizee", "Valid keys under env.options"],
    ),
    "conflict-gae-needs-critic": ("algo:\n  adv: {estimator: gae}\n", [], ["gae", "critic", "algo.critic.enabled"]),
    "bad-override-value": (
        "",
        ["algo.adv.estimator=grpoo"],
        ["algo.adv.estimator = 'grpoo'", "rloo", "set by -o algo.adv.estimator"],
    ),
    "unknown-override-key": ("", ["algo.clip.epslow=0.1"], ["'algo.clip.epslow'", "eps_low", "set by -o"]),
    "bad-preset": ("algo:\n  preset: dapo\n", [], ["algo.preset = 'dapo'", "ppo", "grpo"]),
    "critic-without-returns": (
        "algo:\n  adv: {estimator: grpo}\n  critic: {enabled: true}\n",
        [],
        ["algo.critic.enabled: true needs an estimator", "'gae'", "'reinforce_pp'", "not 'grpo'"],
    ),
    # rollout.backend vllm: one case per combination the vLLM backend refuses (harness.rl.engines.vllm)
    "vllm-full-finetune": (
        "rollout:\n  backend: vllm\ntrain:\n  device: cuda\nmodel:\n  finetune: full\n",
        [],
        ["rollout.backend 'vllm' with model.finetune = 'full'", "only a LoRA adapter", "model.finetune: lora"],
    ),
    "vllm-lora-lm-head": (
        "rollout:\n  backend: vllm\ntrain:\n  device: cuda\n",
        ["model.lora.target_modules=[q_proj,lm_head]"],
        ["model.lora.target_modules containing ['lm_head']", "remove them", "rollout.backend: hf"],
    ),
    "vllm-lora-rank": (
        "rollout:\n  backend: vllm\ntrain:\n  device: cuda\n",
        ["model.lora.r=1024"],
        ["model.lora.r = 1024", "largest LoRA rank is 512", "lower model.lora.r"],
    ),
    "vllm-cpu": (
        "rollout:\n  backend: vllm\ntrain:\n  device: cpu\n",
        [],
        ["rollout.backend 'vllm' with train.device = 'cpu'", "set train.device: cuda"],
    ),
    "vllm-constrain": (
        "rollout:\n  backend: vllm\ntrain:\n  device: cuda\n",
        ["rollout.constrain=true"],
        ["rollout.constrain = true", "trie-constrained decoding", "set rollout.constrain: false"],
    ),
    "vllm-cross-policy": (
        "rollout:\n  backend: vllm\ntrain:\n  device: cuda\n",
        ["rollout.cross_policy.members=2"],
        ["rollout.cross_policy.members = 2", "set rollout.cross_policy.members: 0"],
    ),
    "vllm-sampler-dtype": (
        "rollout:\n  backend: vllm\ntrain:\n  device: cuda\n",
        ["rollout.sampler_dtype=bfloat16"],
        ["rollout.sampler_dtype = 'bfloat16'", "set rollout.sampler_dtype: same"],
    ),
    "vllm-staleness": (
        "rollout:\n  backend: vllm\ntrain:\n  device: cuda\n",
        ["rollout.staleness=1"],
        ["rollout.staleness = 1", "latest adapter", "set rollout.staleness: 0"],
    ),
    "vllm-concurrent": (
        "rollout:\n  backend: vllm\ntrain:\n  device: cuda\n",
        ["rollout.concurrent=true", "rollout.staleness=0"],
        ["rollout.concurrent = true", "set rollout.concurrent: false"],
    ),
    "vllm-top-p-correction": (
        "rollout:\n  backend: vllm\ntrain:\n  device: cuda\n",
        ["rollout.top_p=0.9", "algo.correction.name=tis_token"],
        ["rollout.top_p = 0.9", "algo.correction.name = 'tis_token'", "renormalised over the top-p nucleus"],
    ),
    "bad-correction": (
        "algo:\n  correction: {name: tis}\n",
        [],
        ["algo.correction.name = 'tis'", "tis_token", "icepop", "decoupled", "Did you mean"],
    ),
    "correction-band-without-band": (
        "algo:\n  correction: {name: tis_token, lo: 0.5}\n",
        [],
        ["algo.correction.lo is set, but correction 'tis_token' has no band", "mis_token", "geo_seq_mask"],
    ),
    "correction-band-excludes-one": (
        "",
        ["algo.correction.name=icepop", "algo.correction.lo=1.5"],
        ["[1.5, 5] of 'icepop' must contain 1", "algo.correction.lo <= 1"],
    ),
    "correction-cap-below-one": ("algo:\n  correction: {c: 0.5}\n", [], ["algo.correction.c = 0.5", "1"]),
    "correction-rejected-literal": (
        "algo:\n  correction: {rejected: keep}\n",
        [],
        ["algo.correction.rejected = 'keep'", "drop, zero"],
    ),
    "sampler-dtype": ("rollout:\n  sampler_dtype: fp16\n", [], ["rollout.sampler_dtype = 'fp16'", "bfloat16"]),
    "dual-clip-on-cispo": (
        "algo:\n  clip: {level: cispo, dual_c: 3}\n",
        [],
        ["algo.clip.dual_c = 3", "level 'cispo' has no surrogate", "algo.clip.dual_c: null"],
    ),
    "sapo-temperature": ("algo:\n  clip: {level: sapo, tau_neg: 0}\n", [], ["algo.clip.tau_neg = 0", "greater than 0"]),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_file_gives_a_clear_message(tmp_path, name):
    text, overrides, expected = MALFORMED[name]
    message = error_of(write(tmp_path, text), overrides)
    assert str(tmp_path / "cfg.yaml") in message
    for piece in expected:
        assert piece in message, f"{piece!r} missing from:\n{message}"
    assert "Traceback" not in message and "\n\n" not in message  # one paragraph


def test_missing_file(tmp_path):
    message = error_of(tmp_path / "nope.yaml")
    assert "not found" in message and "nope.yaml" in message


def test_several_problems_are_reported_together(tmp_path):
    message = error_of(write(tmp_path, "turns: {max: 0}\nalgo: {kl: {where: lose}}\n"))
    assert "2 problems" in message and "turns.max" in message and "algo.kl.where" in message


def test_validate_run_config_accepts_a_mapping():
    cfg = validate_run_config({"algo": {"agg": "seq-mean-token-sum"}}, "inline")
    assert cfg.algo.agg == "seq-mean-token-sum"


def test_every_config_field_is_documented():
    undocumented = [key for key, info in iter_config_fields() if not (info.description or "").strip()]
    assert not undocumented


@pytest.mark.parametrize("old", sorted(RENAMED_KEYS))
def test_a_renamed_key_names_its_new_key(tmp_path, old):
    section, _, leaf = old.rpartition(".")
    text = (
        "".join(f"{'  ' * i}{part}:\n" for i, part in enumerate(section.split(".")))
        + f"{'  ' * len(section.split('.'))}{leaf}: 0.5\n"
    )
    msg = error_of(write(tmp_path, text))
    assert f"{old} was renamed to {RENAMED_KEYS[old]}" in msg
    assert f"{old} was renamed" in error_of(write(tmp_path, ""), [f"{old}=0.5"])


# Each axis's params dataclass and where it is built: (config section, attribute of the section).
PARAMS = {
    ClipParams: ("algo.clip", "params"),
    AdvantageParams: ("algo.adv", "params"),
    FilterParams: ("algo.filter", "params"),
    CorrectionParams: ("algo.correction", "params"),
    AggParams: ("algo", "agg_params"),
}
COUNTS = {AggParams: {"num_tokens", "num_seqs"}}  # counted per minibatch, not config keys


def _section(cfg: RunConfig, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("cls", list(PARAMS), ids=lambda c: c.__name__)
def test_axis_params_carry_the_config_key_names_and_no_defaults(cls):
    """One name per setting, one declaration per default: every params field is a key of its config
    section (the aggregation counts aside), and none has a default of its own."""
    section = _section(RunConfig(), PARAMS[cls][0])
    fields = dataclasses.fields(cls)
    names = {f.name for f in fields} - COUNTS.get(cls, set())
    assert names <= set(type(section).model_fields), (
        f"{cls.__name__} fields not named as in {PARAMS[cls][0]}: {sorted(names - set(type(section).model_fields))}"
    )
    defaulted = [f.name for f in fields if f.default is not MISSING or f.default_factory is not MISSING]
    assert not defaulted, f"{cls.__name__} declares defaults of its own: {defaulted} (the config section owns them)"


@pytest.mark.parametrize("cls", list(PARAMS), ids=lambda c: c.__name__)
def test_each_section_builds_its_params_from_its_own_values(cls):
    where, attr = PARAMS[cls]
    section = _section(RunConfig(), where)
    params = getattr(section, attr)
    assert type(params) is cls
    for f in dataclasses.fields(cls):
        expected = None if f.name in COUNTS.get(cls, set()) else getattr(section, f.name)
        assert getattr(params, f.name) == expected, f"{where}.{attr}.{f.name}"


def test_axis_params_are_built_from_the_loaded_config(tmp_path):
    cfg = load_run_config(
        write(
            tmp_path,
            "algo:\n  clip: {eps_low: 0.1, eps_high: 0.3, dual_c: 3.0, tau_neg: 1.2}\n"
            "  adv: {gigpo_gamma: 0.5, gigpo_episode_stats: steps}\n"
            "  filter: {top_p: 0.7, top_k: 0.25}\n"
            "  correction: {name: icepop, hi: 4.0}\n"
            "  agg_len: 64\n",
        )
    )
    assert cfg.algo.clip.params == ClipParams(eps_low=0.1, eps_high=0.3, dual_c=3.0, tau_pos=1.0, tau_neg=1.2)
    adv = cfg.algo.adv.params
    assert (adv.gigpo_gamma, adv.gigpo_episode_stats, adv.gamma) == (0.5, "steps", 1.0)
    assert cfg.algo.filter.params == FilterParams(top_p=0.7, top_k=0.25)
    assert cfg.algo.correction.params == CorrectionParams(c=None, lo=None, hi=4.0)
    assert cfg.algo.agg_params == AggParams(num_tokens=None, num_seqs=None, agg_len=64)


# The bounds of the axis parameters, declared once in the config sections (the params dataclasses and the
# axis functions no longer repeat them): each is an error when the config loads.
PARAM_BOUNDS = [
    ("algo.clip.eps_low=-0.1", "greater than or equal to 0"),
    ("algo.clip.dual_c=0.5", "greater than 1"),
    ("algo.clip.tau_neg=0", "greater than 0"),
    ("algo.filter.top_p=0", "greater than 0"),
    ("algo.filter.top_k=1.5", "less than or equal to 1"),
    ("algo.agg_len=0", "greater than or equal to 1"),
    ("algo.adv.gigpo_mode=std", "choose one of: mean_std_norm, mean_norm"),
    ("algo.adv.gigpo_episode_stats=trajectory", "choose one of: trajectories, steps"),
]


@pytest.mark.parametrize("override,allowed", PARAM_BOUNDS, ids=[o for o, _ in PARAM_BOUNDS])
def test_the_bounds_of_the_axis_params_are_checked_when_the_config_loads(tmp_path, override, allowed):
    key, _, value = override.partition("=")
    msg = error_of(write(tmp_path, ""), [override])
    assert f"{key} = " in msg and value in msg and allowed in msg, msg


def test_the_gae_point_of_the_advantage_sweep_whitens_as_the_ppo_preset():
    from harness.experiments.sweep import load_sweep

    sweep = load_sweep(REPO / "sweeps" / "advantage.yaml")
    gae = [p for p in sweep.points if p.config.algo.adv.estimator == "gae"]
    assert gae and all(p.config.algo.adv.norm == "batch" for p in gae)
