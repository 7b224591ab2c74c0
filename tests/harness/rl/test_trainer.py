"""End-to-end tiny runs of the trainer: files, determinism, resume, adapters, every axis wired."""

from __future__ import annotations

import json

import pytest

from tests.helpers.configs import cfg_with
from tests.helpers.configs import train_tiny as run


def test_tiny_run_writes_rows_summary_adapter_and_diagnostics(tmp_path):
    rows, summary = run(cfg_with(), tmp_path / "a")
    assert [r["update"] for r in rows] == [0, 1, 2, 3]
    assert "eval_greedy/success" in rows[0] and "eval_greedy/success" in rows[2] and "eval_greedy/success" in rows[3]
    for key in (
        "loss/policy",
        "diag/kl_k3",
        "diag/grad_norm",
        "diag/clip_frac",
        "env/success",
        "env/group_reward_std",
        "diag/cross_prompt_similarity",
        "diag/kl_spike",
    ):
        assert key in rows[1], key
    assert "diag/mi_estimate" in rows[2] and "diag/mi_estimate" not in rows[1]
    assert rows[1]["diag/logprob_mismatch_max"] < 1e-4  # sampler and trainer agree
    assert 0.0 <= summary["final/eval_greedy/success"] <= 1.0 and "collapsed_at" in summary
    from peft import PeftModel

    from harness.model.cache import cache_dir
    from harness.rl.build import load_policy

    base = load_policy(cfg_with(), cache_dir(), "cpu")
    loaded = PeftModel.from_pretrained(base.model.get_base_model(), tmp_path / "a" / "adapter")
    assert any("lora" in n for n, _ in loaded.named_parameters())


def test_same_config_and_seed_give_identical_metrics(tmp_path):
    a, _ = run(cfg_with(), tmp_path / "a")
    b, _ = run(cfg_with(), tmp_path / "b")
    assert a == b
    c, _ = run(cfg_with(train={"seed": 1}), tmp_path / "c")
    assert c != a


class Interrupt(Exception):
    pass


def test_resume_after_interruption_reproduces_the_uninterrupted_run(tmp_path):
    full, _ = run(cfg_with(train={"checkpoint_every": 2, "updates": 4}), tmp_path / "full")

    def stop_at_3(p):
        if p["update"] == 3:
            raise Interrupt

    cfg = cfg_with(train={"checkpoint_every": 2, "updates": 4})
    with pytest.raises(Interrupt):
        run(cfg, tmp_path / "cut", stop_at_3)  # row 3 written, last checkpoint at 2
    resumed, _ = run(cfg, tmp_path / "cut")
    assert [r["update"] for r in resumed] == [0, 1, 2, 3, 4]
    assert resumed == full
    timings = [json.loads(line)["update"] for line in (tmp_path / "cut" / "timings.jsonl").read_text().splitlines()]
    assert timings == [1, 2, 3, 4]  # the row of update 3 from before the interruption is not kept twice


@pytest.mark.parametrize(
    "over",
    [
        {"algo": {"clip": {"level": "sequence", "eps_low": 3e-3, "eps_high": 4e-3, "seq_mask": True}, "epochs": 2}},
        {"algo": {"clip": {"level": "trajectory"}, "agg": "seq-mean-token-mean", "minibatches": 2}},
        {"algo": {"clip": {"level": "none"}, "agg": "seq-mean-token-sum-norm", "kl": {"estimator": "none"}}},
        {"algo": {"preset": "ppo"}},
        {"algo": {"adv": {"estimator": "gigpo"}, "filter": {"name": "ragen_top_p"}}},
        {
            "algo": {
                "adv": {"estimator": "rloo"},
                "filter": {"name": "dapo", "max_extra_rounds": 1},
                "kl": {"where": "reward", "estimator": "k1"},
            }
        },
        {"algo": {"adv": {"estimator": "reinforce_pp", "norm": "batch"}, "entropy_coef": 0.01}},
        {"context": {"policy": "window", "window": 1, "mask_observations": False}},
        {"context": {"policy": "obs_truncate", "obs_tokens": 4}},
        {"context": {"policy": "single"}, "turns": {"curriculum": [2, 4], "curriculum_every": 1}},
        {"model": {"finetune": "full"}},
        {
            "algo": {"clip": {"level": "cispo", "eps_low": 1.0, "eps_high": 0.28}, "correction": {"name": "tis_token"}},
            "rollout": {"sampler_dtype": "bfloat16"},
        },
        {
            "algo": {"clip": {"level": "sapo"}, "agg": "seq-mean-token-mean", "correction": {"name": "icepop"}},
            "context": {"policy": "window", "mask_observations": False},
            "rollout": {"sampler_dtype": "bfloat16"},
        },
        {
            "model": {"finetune": "full"},
            "algo": {"correction": {"name": "decoupled", "c": 5.0}},
            "rollout": {"sampler_dtype": "bfloat16"},
        },
    ],
)
def test_every_axis_runs_end_to_end(tmp_path, over):
    cfg = cfg_with(train={"updates": 2, "eval_every": 0, "mi_every": 0}, **over)
    rows, summary = run(cfg, tmp_path / "r")
    assert [r["update"] for r in rows] == [0, 1, 2]
    trained = [r for r in rows[1:] if r.get("train/skipped_empty") == 0.0]
    assert trained, "dense rewards and format penalties should give at least one trainable batch"
    for r in trained:
        assert all(v == v for k, v in r.items() if k.startswith("loss/")), r  # no NaN losses
    assert any(r["diag/grad_norm"] > 0 for r in trained)  # the axis combination produced a gradient
    assert all("diag/kl_k3" in r for r in trained)  # KL to the reference is logged even without a KL term


@pytest.mark.parametrize("policy", ["full", "window"])
def test_constrained_decoding_trains_the_constrained_policy(tmp_path, policy):
    """With rollout.constrain the trainer's behaviour log-probs equal the sampler's (constrained,
    renormalised) ones, so the log-prob mismatch stays at float error and no action is unparsable."""
    cfg = cfg_with(
        rollout={"constrain": True}, context={"policy": policy}, train={"updates": 2, "eval_every": 0, "mi_every": 0}
    )
    rows, _ = run(cfg, tmp_path / "r")
    for r in rows[1:]:
        assert r["diag/logprob_mismatch_max"] < 1e-4
        assert r["env/format_error_rate"] == 0.0
        assert 0.0 < r["env/constrained_mass"] <= 1.0
    assert rows[0]["eval_greedy/format_error_rate"] == 0.0


def test_evaluation_runs_at_the_turn_budget_the_update_trained_with(tmp_path):
    """Update u trains at turn_budget_at(u - 1); the evaluation after it must use that budget too."""
    cfg = cfg_with(turns={"max": 4, "curriculum": [1, 4], "curriculum_every": 1},
                   train={"updates": 1, "eval_every": 1, "mi_every": 0})  # fmt: skip
    rows, _ = run(cfg, tmp_path / "r")
    assert rows[1]["env/turn_budget"] == 1.0
    for row in rows[:2]:  # before RL and after update 1: both at the first budget
        assert row["eval_greedy/turns"] <= 1.0 and row["eval_sampled/turns"] <= 1.0


def test_forced_tokens_drop_runs_and_changes_only_the_denominators(tmp_path):
    base = {"rollout": {"constrain": True}, "train": {"updates": 1, "eval_every": 0, "mi_every": 0}}
    count, _ = run(cfg_with(**base), tmp_path / "count")
    drop, _ = run(cfg_with(algo={"forced_tokens": "drop"}, **base), tmp_path / "drop")
    assert drop[1]["diag/trained_tokens"] < count[1]["diag/trained_tokens"]  # FrozenLake moves end in forced tokens
    assert drop[1]["env/return"] == count[1]["env/return"]  # same rollout: only the loss mask differs


def test_the_evaluation_before_rl_is_computed_once_and_shared(tmp_path, monkeypatch):
    """Points that differ only in algorithm keys and seeds start from the same policy: their update-0
    evaluations are one cached result, equal to what a fresh computation gives."""
    from harness.model.cache import cache_dir
    from harness.rl import evaluate

    base = {"train": {"updates": 1, "eval_every": 0, "mi_every": 0}}
    a, _ = run(cfg_with(**base), tmp_path / "a")
    other = cfg_with(algo={"lr": 3e-3, "clip": {"level": "sequence"}}, train={**base["train"], "seed": 4})
    b, _ = run(other, tmp_path / "b")
    assert a[0] == b[0]
    rows = lambda d: [r for r in (d / "eval_tasks.jsonl").read_text().splitlines() if '"update": 0' in r]  # noqa: E731
    assert rows(tmp_path / "a") == rows(tmp_path / "b")
    entries = list((cache_dir() / "start_eval").iterdir())
    fresh = cache_dir().parent / "fresh"
    monkeypatch.setenv("HARNESS_CACHE", str(fresh))
    c, _ = run(cfg_with(**base), tmp_path / "c")  # builds the model and the start evaluation anew
    assert c[0] == a[0] and rows(tmp_path / "c") == rows(tmp_path / "a")
    assert len([e for e in entries if not e.name.startswith(".")]) >= 1
    assert evaluate.start_key(cfg_with(**base), {"base": "x"}) != evaluate.start_key(
        cfg_with(env={"heldout_tasks": 5}, **base), {"base": "x"}
    )
