"""What the loaders check before anything runs: finite floats and bounded sizes in every schema,
the real seed range, configs that cannot train (no RL update left, a curriculum above turns.max),
seeds set where a sweep ignores them, model names and LoRA targets, the tune objective, and the
warnings a config gets when it loads but probably does not do what its author meant.
(The malformed-input corpus, tests/harness/cli/test_malformed_inputs.py, runs each through the CLI.)"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from annotated_types import Le
from pydantic import BaseModel, ValidationError

from envs import ENVS
from envs.registry import env_class
from harness.cli.main import main
from harness.config.errors import ConfigError, ConfigWarning, warn
from harness.config.keys import iter_config_fields
from harness.config.loading import load_run_config, validate_run_config
from harness.config.schema import QWEN2_LINEAR_MODULES, SEED_MAX
from harness.diagnostics.episode_metrics import EVAL_METRICS, episode_metrics
from harness.experiments.samplers import make_pruner, make_sampler
from harness.experiments.study import ParamSpec, load_study, objective_metrics
from harness.experiments.sweep import load_sweep
from harness.experiments.tracking import config_warnings_recorded
from harness.model.base import ModelError, check_lora_targets, model_source_problem
from harness.rl.seeding import seed_everything
from harness.rl.trainer import planned_updates
from harness.store import read_jsonl

BASE = "env: {name: frozenlake}\ntrain: {updates: 3}\n"


def write(folder: Path, name: str, text: str) -> Path:
    (folder / name).write_text(text)
    return folder / name


def cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


# ----------------------------------------------------------------------------- floats and sizes
def _float_fields(model: type[BaseModel]) -> list[str]:
    return [k for k, info in model.model_fields.items() if info.annotation in (float, float | None)]


def test_every_config_float_must_be_finite_and_every_size_is_bounded():
    for key, info in iter_config_fields():
        if info.annotation in (float, float | None):
            for bad in (float("inf"), float("-inf"), float("nan")):
                with pytest.raises(ConfigError, match="finite number"):
                    validate_run_config(_nested(key, bad), "t")
        if info.annotation in (int, int | None):
            assert any(isinstance(m, Le) for m in info.metadata), f"{key} has no upper bound"


def test_every_env_option_and_study_bound_must_be_finite():
    classes = [env_class(name).Options for name in ENVS.names() if _importable(name)] + [ParamSpec]
    checked = 0
    for cls in classes:
        for name in _float_fields(cls):
            with pytest.raises(ValidationError, match="finite number"):
                cls.model_validate({"type": "float", name: float("inf")} if cls is ParamSpec else {name: float("inf")})
            checked += 1
    assert checked >= 4  # frozenlake.p_frozen, textworld.heldout_fraction, low, high, step


def _importable(env: str) -> bool:
    try:
        env_class(env)
        return True
    except Exception:  # noqa: BLE001 - an environment whose package is missing
        return False


def _nested(key: str, value: object) -> dict:
    out: dict = {}
    node = out
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return out


# ----------------------------------------------------------------------------- seeds
def test_the_seed_range_is_what_the_seeded_libraries_accept():
    seed_everything(SEED_MAX)  # python, numpy (legacy), torch, and PYTHONHASHSEED for children
    torch.Generator().manual_seed(SEED_MAX)
    np.random.default_rng([SEED_MAX, 1, 2])
    with pytest.raises(ValueError):
        np.random.default_rng([-1, 1, 2])  # the trainer's per-update generators: no negative seeds
    child = [sys.executable, "-c", "pass"]
    assert subprocess.run(child, env={**os.environ, "PYTHONHASHSEED": str(SEED_MAX)}).returncode == 0
    bad = subprocess.run(child, env={**os.environ, "PYTHONHASHSEED": str(SEED_MAX + 1)}, capture_output=True)
    assert bad.returncode != 0  # environment worker processes would not start
    seed_everything(0)
    for key in ("train.seed", "model.tiny.init_seed"):
        validate_run_config(_nested(key, SEED_MAX), "t")
        for bad_seed in (-1, SEED_MAX + 1, 2**64):
            with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
                validate_run_config(_nested(key, bad_seed), "t")


def test_seeds_of_sweeps_and_studies_are_checked_at_load(tmp_path):
    write(tmp_path, "base.yaml", BASE)
    path = write(tmp_path, "s.yaml", "name: s\nbase: base.yaml\nseeds: [0]\n")
    assert [p.seed for p in load_sweep(path, seeds=[SEED_MAX]).points] == [SEED_MAX]
    for seeds in ([-1], [2**64]):
        with pytest.raises(ConfigError, match="--seeds"):
            load_sweep(path, seeds=seeds)
    with pytest.raises(ConfigError, match=r"-o train\.seed=5: a sweep's seeds come from its `seeds:` list"):
        load_sweep(path, ["train.seed=5"])


# ----------------------------------------------------------------------------- configs that cannot train
def test_an_sft_budget_must_leave_at_least_one_rl_update():
    per_update = 4 * 8
    ok = {"sft": {"budget": 10 * 5 + per_update, "demos": 5}, "rollout": {"tasks_per_update": 4, "group_size": 8}}
    assert planned_updates(validate_run_config(ok, "t")) == 1
    ok["sft"]["budget"] -= 1
    with pytest.raises(
        ConfigError, match=r"sft\.budget = 81 leaves 31 RL episodes .* raise sft\.budget to at least 82"
    ):
        validate_run_config(ok, "t")


def test_a_curriculum_may_not_go_above_turns_max():
    cfg = validate_run_config({"turns": {"max": 12, "curriculum": [4, 8, 12]}}, "t")
    assert cfg.turns.curriculum == [4, 8, 12]
    with pytest.raises(ConfigError, match=r"turns\.curriculum \[4, 8, 12\] goes above turns\.max = 8"):
        validate_run_config({"turns": {"max": 8, "curriculum": [4, 8, 12]}}, "t")


# ----------------------------------------------------------------------------- models
def test_model_names_are_checked_before_anything_is_built(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert model_source_problem("tiny") is None
    assert "is not an existing directory" in model_source_problem(str(tmp_path / "nope"))
    assert "config.json" in model_source_problem(str(tmp_path))  # a folder without a model
    write(tmp_path, "config.json", "{}")
    assert model_source_problem(str(tmp_path)) is None
    hub = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    assert "not in the local Hugging Face cache" in model_source_problem("some-org/some-model")
    snapshot = hub / "models--some-org--some-model" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (hub / "models--some-org--some-model" / "refs").mkdir()
    (hub / "models--some-org--some-model" / "refs" / "main").write_text("abc")
    assert model_source_problem("some-org/some-model") is None  # found in the offline cache


def _qwen2() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=64, num_key_value_heads=1, **shape))


def test_lora_targets_are_checked_on_the_built_model_and_at_load_for_tiny():
    model = _qwen2()
    leaves = {
        n.rpartition(".")[2] for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))
    }
    assert leaves == set(QWEN2_LINEAR_MODULES)  # the names the tiny config is checked against at load
    check_lora_targets(model, ["q_proj", "self_attn.v_proj", "model.layers.0.mlp.up_proj"])
    with pytest.raises(ModelError, match=r"'qproj' matches no linear or embedding module .* Did you mean 'q_proj'\?"):
        check_lora_targets(model, ["q_proj", "qproj"])
    with pytest.raises(ConfigError, match=r"'mlp' is not a module of the tiny Qwen2 model"):
        validate_run_config({"model": {"lora": {"target_modules": ["mlp"]}}}, "t")
    other = validate_run_config({"model": {"name": "some/model", "lora": {"target_modules": ["c_attn"]}}}, "t")
    assert other.model.lora.target_modules == ["c_attn"]  # another architecture: checked once built


# ----------------------------------------------------------------------------- studies
STUDY = "name: t\nbase: base.yaml\nspace:\n  algo.lr: {type: float, low: 1.0e-4, high: 1.0e-3}\n"


def test_objective_metrics_are_the_evaluation_metrics_the_trainer_writes():
    written = set(episode_metrics([], "eval_greedy"))
    assert written == {f"eval_greedy/{n}" for n in EVAL_METRICS if n != "constrained_mass"}
    assert "eval_sampled/success" in objective_metrics() and "eval_greedy/constrained_mass" in objective_metrics()


def test_an_objective_metric_typo_is_found_at_load(tmp_path):
    write(tmp_path, "base.yaml", BASE)
    path = write(tmp_path, "t.yaml", STUDY + "objective: {metric: eval_sampled/sucess}\n")
    with pytest.raises(ConfigError, match=r"objective\.metric = 'eval_sampled/sucess' .* 'eval_sampled/success'\?"):
        load_study(path)


def test_sampler_and_pruner_may_be_plain_names(tmp_path):
    import optuna

    write(tmp_path, "base.yaml", BASE)
    study = load_study(write(tmp_path, "t.yaml", STUDY + "sampler: random\npruner: none\n"))
    assert isinstance(make_sampler(study), optuna.samplers.RandomSampler)
    assert isinstance(make_pruner(study), optuna.pruners.NopPruner)
    study = load_study(write(tmp_path, "t.yaml", STUDY + "sampler: {name: tpe, seed: 3, n_startup_trials: 2}\n"))
    assert isinstance(make_sampler(study), optuna.samplers.TPESampler)  # the mapping form still works


# ----------------------------------------------------------------------------- messages
def test_a_missing_base_shows_the_resolved_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sweeps").mkdir()
    write(tmp_path / "sweeps", "s.yaml", "name: s\nbase: ../config/base.yaml\nseeds: [0]\n")
    with pytest.raises(ConfigError) as err:
        load_sweep(Path("sweeps/s.yaml"))
    assert f"resolved: {tmp_path.resolve() / 'config' / 'base.yaml'}" in str(err.value)


# ----------------------------------------------------------------------------- warnings
def test_an_explicit_key_that_overrides_a_preset_is_a_warning(tmp_path):
    path = write(tmp_path, "cfg.yaml", "algo: {adv: {estimator: grpo}, kl: {where: loss}}\n")
    with pytest.warns(ConfigWarning) as seen:
        cfg = load_run_config(path, ["algo.preset=rloo"])
    assert cfg.algo.adv.estimator == "grpo" and cfg.algo.kl.estimator == "k1"  # explicit keys win, others filled
    (message,) = [str(w.message) for w in seen]
    assert "algo.preset 'rloo' did not change 2 key(s)" in message
    assert "algo.adv.estimator = 'grpo' (the preset's: 'rloo')" in message and "algo.kl.where = 'loss'" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        load_run_config(path, ["algo.preset=grpo"])  # the explicit keys agree with the preset: no warning


def test_the_cli_shows_each_warning_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "base.yaml", "algo: {adv: {estimator: grpo}}\n")
    write(tmp_path, "s.yaml", "name: s\nbase: base.yaml\ngrid: {turns.max: [3, 4, 5]}\n")
    code, err = cli(["sweep", "s.yaml", "--dry-run", "-o", "algo.preset=rloo"])
    assert code == 0, err
    assert err.count("warning: s.yaml: no `seeds:` list, so every point runs once, with seed 0") == 1
    assert err.count("algo.preset 'rloo' did not change 1 key(s)") == 1  # base + 3 points: one warning
    code, err = cli(["sweep", "s.yaml", "--dry-run", "--seeds", "0,1"])
    assert code == 0 and "warning" not in err  # --seeds given: nothing to warn about


def test_config_warnings_in_a_point_go_to_stderr_and_its_events(tmp_path, capfd):
    with pytest.warns(UserWarning, match="unrelated") as others:  # other warnings are left to the usual display
        with config_warnings_recorded(tmp_path / "events.jsonl", "p1"):
            warn("turns.max: too short")
            warnings.warn("unrelated", UserWarning, stacklevel=1)
    assert not [w for w in others if issubclass(w.category, ConfigWarning)]
    (row,) = read_jsonl(tmp_path / "events.jsonl")
    assert row["event"] == "warning" and row["message"] == "turns.max: too short"
    assert "warning: p1: turns.max: too short" in capfd.readouterr().err
