"""`harness bench` measures both sides of every ratio in one process (smoke, tiny sizes)."""

import math

import pytest
import torch

from harness.bench.run import run_bench
from tests.helpers.configs import cfg_with


def _small_head_model() -> torch.nn.Module:
    """The Qwen2.5-0.5B-shaped head at a 4,096-token vocabulary: the same code path, ~1/40 of the work."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from harness.bench.engines import SHAPES

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**{**SHAPES["0.5b"], "num_hidden_layers": 1, "vocab_size": 4096})).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _check_both_sides(out: dict, vocab: int) -> None:
    for key in ("logprob_peak_memory", "logprob_peak_memory_qwen05b_head"):
        mem = out[key]
        assert mem["naive_bytes"] > 0 and mem["chunked_bytes"] > 0 and mem["isolated"]
        assert math.isclose(mem["ratio"], mem["chunked_bytes"] / mem["naive_bytes"], rel_tol=1e-6)
    # the naive side holds the (tokens x vocab) log-softmax and its gradient: it must cost more
    head = out["logprob_peak_memory_qwen05b_head"]
    assert head["naive_bytes"] - head["chunked_bytes"] > head["tokens"] * vocab * 4 // 2
    trl = out["update_vs_trl_grpo"]
    assert trl["ours_s"] > 0 and trl["trl_s"] > 0 and trl["episodes"] == 4
    assert math.isclose(trl["ratio"], trl["ours_s"] / trl["trl_s"])


def test_bench_reports_both_sides_and_ratios(monkeypatch):
    """The memory and TRL parts end to end, the Qwen-shaped head at a small vocabulary (the full one
    is the slow test below: 150k x 896 weights, saved and loaded by two fresh processes, ~5 minutes
    of the fast suite on 2 cores)."""
    import harness.bench.run as bench_run

    monkeypatch.setattr(bench_run, "qwen05b_shaped_head_model", _small_head_model)
    cfg = cfg_with(rollout={"tasks_per_update": 2, "group_size": 2, "max_new_tokens": 4})
    _check_both_sides(run_bench(cfg, steps=1, parts=("memory", "trl")), 4096)


@pytest.mark.slow
def test_bench_reports_both_sides_and_ratios_at_the_qwen_head():
    cfg = cfg_with(rollout={"tasks_per_update": 2, "group_size": 2, "max_new_tokens": 4})
    _check_both_sides(run_bench(cfg, steps=1, parts=("memory", "trl")), 151936)


def test_concurrent_bench_times_both_loops_on_the_same_updates():
    from harness.bench.run import bench_concurrent

    cfg = cfg_with(rollout={"tasks_per_update": 2, "group_size": 2, "max_new_tokens": 4})
    out = bench_concurrent(cfg, updates=2, staleness=1, repeats=1)
    assert out["synchronous_s"] > 0 and out["concurrent_s"] > 0 and out["updates"] == 2
    assert math.isclose(out["ratio"], out["concurrent_s"] / out["synchronous_s"])
    assert 0.0 <= out["mean_staleness"] <= 1.0


def test_engine_and_update_benches_report_every_side():
    """The shape parts at the CPU stand-in, tiny sizes: every engine generated the same number of
    tokens (asserted inside), ratios are consistent, the floor exceeds what any engine reaches."""
    from harness.bench.engines import bench_engines, bench_update, kv_bytes, random_model, weight_bytes

    out = bench_engines("small", device="cpu", dtype="float32", batches=(2,), prompt=16, new_tokens=4, repeats=1)
    row = out["by_batch"]["2"]
    for engine in ("generate", "hf", "static"):
        assert row[f"{engine}_tokens_per_s"] > 0
        assert math.isclose(
            row[f"{engine}_fraction_of_floor"], row[f"{engine}_tokens_per_s"] / row["floor_tokens_per_s"]
        )
        assert row[f"{engine}_fraction_of_floor"] < 1
    assert math.isclose(row["static_vs_generate"], row["static_tokens_per_s"] / row["generate_tokens_per_s"])
    model = random_model("small", "cpu", torch.float32)
    assert out["weight_bytes"] == weight_bytes(model) == sum(p.numel() * 4 for p in model.parameters())  # tied: once
    # K and V of 4 layers x 2 kv heads x 64 dims, float32
    assert kv_bytes(model, batch=3, context=10) == 2 * 4 * 3 * 2 * 64 * 10 * 4
    up = bench_update("small", device="cpu", dtype="float32", batch=1, tokens=32, repeats=1)
    for side in ("checkpointing", "no_checkpointing"):
        assert up[side]["tokens_per_s"] > 0 and up[side]["peak_extra_bytes"] > 0


def test_learner_bench_times_every_plan_on_one_batch_and_their_losses_agree():
    """`--only learner`: every side on one rollout batch (or refused by the config, with the reason), each
    side's plan as named, ratios to plain, and every side's loss and gradient norm equal to the plain
    side's up to the rounding of its precision (float32 or bfloat16)."""
    from harness.bench.learner import SIDES, bench_learner

    cfg = cfg_with(rollout={"tasks_per_update": 2, "group_size": 4}, turns={"max": 3})
    out = bench_learner(cfg, repeats=1)
    plain_plan = {
        "behaviour": "recompute",
        "reference": True,
        "shared_prefix": False,
        "prefix_impl": "packed",
        "precision": "float32",
        "needed_positions": False,
        "padding_free": False,
    }
    assert out["plans"]["plain"] == plain_plan
    assert out["plans"]["sampler+shared_prefix"] == {**plain_plan, "behaviour": "sampler", "shared_prefix": True}
    assert out["plans"]["bf16"] == {**plain_plan, "precision": "bfloat16"}
    assert out["plans"]["shared_prefix_kv"] == {**plain_plan, "shared_prefix": True, "prefix_impl": "kv_cache"}
    assert out["plans"]["shared_prefix_seg"] == {**plain_plan, "shared_prefix": True, "prefix_impl": "segmented"}
    assert out["plans"]["padding_free"] == {**plain_plan, "padding_free": True}
    assert out["plans"]["sampler+shared_prefix_seg+needed+padding_free"] == {
        **plain_plan,
        "behaviour": "sampler",
        "shared_prefix": True,
        "prefix_impl": "segmented",
        "needed_positions": True,
        "padding_free": True,
    }
    assert out["train_tokens"] > out["trained_tokens"] > 0
    assert set(out["plans"]) | set(out["refused"]) == {"plain", *SIDES} and not set(out["plans"]) & set(out["refused"])
    if cfg.algo.epochs > 1 or cfg.algo.minibatches > 1:  # the on-policy shortcut needs a one-step update
        assert "first_forward" in out["refused"] and "algo.epochs" in out["refused"]["first_forward"]
    assert set(out["matmul_gflops"]) == {"float32", "bfloat16"} and isinstance(out["cpu_bf16"], str)
    plain = out["plain"]
    for side, plan in out["plans"].items():
        row = out[side]
        tol = 1e-4 if plan["precision"] == "float32" else 5e-2
        assert row["update_s"] > 0 and math.isclose(row.get("update_s_ratio", 1.0), row["update_s"] / plain["update_s"])
        assert math.isclose(row["loss_total"], plain["loss_total"], rel_tol=tol, abs_tol=1e-6 if tol < 1e-3 else 1e-3)
        assert math.isclose(row["grad_norm"], plain["grad_norm"], rel_tol=tol)
    assert out["sampler"]["passes_cpu_s"] < plain["passes_cpu_s"]  # the behaviour pass is gone, the reference stays


def test_learner_bench_compares_two_fast_paths_without_the_plain_one():
    """`baseline=`: where the plain path costs minutes an update (TextWorld), two sides are timed against each
    other and plain is not run; a baseline that is not among the sides is an error naming it."""
    from harness.bench.learner import SIDES, bench_learner

    cfg = cfg_with(rollout={"tasks_per_update": 2, "group_size": 4}, turns={"max": 3})
    sides = {k: SIDES[k] for k in ("shared_prefix", "shared_prefix_kv")}
    out = bench_learner(cfg, repeats=1, sides=sides, baseline="shared_prefix")
    assert out["baseline"] == "shared_prefix" and "plain" not in out and set(out["plans"]) == set(sides)
    assert "update_s_ratio" not in out["shared_prefix"]
    kv = out["shared_prefix_kv"]
    assert math.isclose(kv["update_s_ratio"], kv["update_s"] / out["shared_prefix"]["update_s"])
    assert math.isclose(kv["loss_total"], out["shared_prefix"]["loss_total"], rel_tol=1e-4, abs_tol=1e-6)
    with pytest.raises(ValueError, match="'bf16'"):
        bench_learner(cfg, repeats=1, sides=sides, baseline="bf16")


def test_the_weight_cast_bench_times_the_config_s_bfloat16_path_both_ways_with_the_same_numbers():
    """`bench_weight_casts`: the config's own learner path with the frozen weights cast once an update and
    with autocast casting them itself, on one batch; the two sides' losses and gradient norms are equal bit
    for bit, and a float32 learner is refused (nothing to cast)."""
    from harness.bench.learner import bench_weight_casts

    small = {"rollout": {"tasks_per_update": 2, "group_size": 4}, "turns": {"max": 3}}
    cfg = cfg_with(**small, train={"learner": {"precision": "bfloat16"}})
    out = bench_weight_casts(cfg, repeats=1)
    assert out["same_numbers"] is True
    for side in ("cached", "autocast"):
        assert out[side]["update_s"] > 0 and 0 < out["learner_share"][side] < 1
    assert math.isclose(out["update_s_ratio"], out["cached"]["update_s"] / out["autocast"]["update_s"])
    with pytest.raises(ValueError, match="float32"):
        bench_weight_casts(cfg_with(**small), repeats=1)


def test_rollout_share_bench_plays_the_same_episodes_on_both_sides(monkeypatch):
    """`--only rollout_share`: update 1's rollout with and without the shared first prefill, the same tasks and
    streams on both sides: the same actions (the shared prefill ran: the rows of a group share their prompt),
    the log-probs within rounding, both sides timed, and a backend without the shared prefill refused."""
    from harness.bench.rollout_share import bench_rollout_share
    from harness.rl import rollout

    shared, prefill = [], rollout.prefill_shared
    monkeypatch.setattr(rollout, "prefill_shared", lambda kv, ids: shared.append(len(ids)) or prefill(kv, ids))
    cfg = cfg_with(rollout={"tasks_per_update": 2, "group_size": 4}, turns={"max": 3})
    out = bench_rollout_share(cfg, repeats=1)
    assert shared == [8, 8]  # the shared side's two rounds (warm-up and timed), once each, into the empty cache
    assert out["episodes"] == 8 and out["same_actions"]
    assert out["logprob_max_gap"] is not None and out["logprob_max_gap"] < 1e-4
    assert out["generated_tokens"]["shared"] == out["generated_tokens"]["unshared"] > 0
    for side in ("shared", "unshared"):
        assert out[side]["rollout_s"] > 0 and len(out["rollout_s_per_repeat"][side]) == 1
    assert out["rollout_s_ratio"] == out["shared"]["rollout_s"] / out["unshared"]["rollout_s"]
    with pytest.raises(ValueError, match="rollout.backend hf"):
        bench_rollout_share(cfg_with(rollout={"backend": "static"}))
