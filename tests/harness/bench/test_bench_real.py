"""`harness bench --only real` and the equal-work TRL comparison, on the tiny model (fast).

The figures themselves are machine-dependent; what is checked is what makes them comparable:
every side generated the same number of tokens, the engines sampled the same tokens, the ratios
are the ratios of the reported sides, and the update split adds up to the update."""

import math

import pytest
import torch

from harness.bench.real import (
    Engines,
    bench_real,
    bench_sampling,
    compute_floor,
    linear_flops_per_token,
    logprob_gap,
    matmul_gflops,
    random_prompts,
    sample_ours,
)
from harness.bench.run import bench_trl, never_ends
from harness.model.base import load_pretrained
from harness.model.cache import cache_dir
from harness.model.pipeline import base_model
from harness.rl.demos import Demonstrations
from tests.helpers.configs import TINY, cfg_with


@pytest.fixture(scope="module")
def tiny():
    cfg = cfg_with()
    source, _ = base_model(cfg, cache_dir(), Demonstrations.of(cfg))
    model, tok = load_pretrained(source, torch.float32)
    return model.eval(), tok


def test_flops_per_token_counts_every_linear_weight_once(tiny):
    model, _ = tiny
    s = TINY["model"]["tiny"]
    h, inter, layers, vocab = s["hidden_size"], s["intermediate_size"], s["num_layers"], model.config.vocab_size
    kv = model.config.num_key_value_heads * (h // model.config.num_attention_heads)
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter  # q, o; k, v; gate, up, down
    assert linear_flops_per_token(model) == 2 * (layers * per_layer + vocab * h)  # tied head once


def test_floor_is_the_matmul_rate_over_the_flops_per_token(tiny):
    model, _ = tiny
    assert matmul_gflops(n=256, repeats=2) > 0
    floor = compute_floor(model, n=256)
    for unit in ("s", "cpu_s"):
        rate = floor[f"matmul_float32_gflop_per_{unit}"]
        assert math.isclose(floor[f"floor_tokens_per_{unit}"], rate * 1e9 / floor["flops_per_token"])
    fwd = floor["forward_1x256"]
    assert fwd["tokens"] == 256 and fwd["gflop_s"] > 0


def test_sampling_engines_do_equal_work_and_sample_the_same_tokens(tiny):
    model, _ = tiny
    floor = {"floor_tokens_per_s": 1e6, "floor_tokens_per_cpu_s": 2e6}
    out = bench_sampling(model, floor, batches=(3, 1), prompt=8, new_tokens=5, repeats=1)
    for batch in (3, 1):
        row = out["by_batch"][str(batch)]
        for e in ("generate", "hf", "static", "static:bfloat16"):
            assert row[f"{e}_generated_tokens"] == batch * 5  # forced: no row ended early
            for unit, f in (("s", 1e6), ("cpu_s", 2e6)):
                tps = row[f"{e}_tokens_per_{unit}"]
                assert tps > 0 and math.isfinite(tps)
                assert math.isclose(row[f"{e}_fraction_of_floor_per_{unit}"], tps / f)
                # prompt + new - 1 tokens ran for every 5 generated
                assert math.isclose(
                    row[f"{e}_fraction_of_floor_all_per_{unit}"], row[f"{e}_fraction_of_floor_per_{unit}"] * 12 / 5
                )
        for e in ("hf", "static", "static:bfloat16"):
            for unit in ("s", "cpu_s"):
                assert math.isclose(
                    row[f"{e}_vs_generate_per_{unit}"],
                    row[f"{e}_tokens_per_{unit}"] / row[f"generate_tokens_per_{unit}"],
                )
        assert row["hf_static_rows_equal"] == 1.0  # same stream, same logits: the same tokens
        gap = row["static:bfloat16_logprob_gap"]
        assert 0 < gap["mean_abs_delta"] < 1 and gap["k3"] >= 0
    agree = out["greedy_agreement"]
    assert agree["reference"] == "generate" and agree["hf_rows_equal"] == 1.0 and agree["static_rows_equal"] == 1.0


def test_logprob_gap_is_zero_for_the_model_itself_and_positive_for_a_bf16_copy(tiny):
    model, _ = tiny
    prompts = random_prompts(model.config.vocab_size, 3, 6, seed=0)
    ours = sample_ours(model, "hf", prompts, 4, seed=0)
    same = logprob_gap(model, prompts, ours.ids, ours.logprobs)
    assert same["mean_abs_delta"] < 1e-5 and abs(same["k3"]) < 1e-9
    bf16 = Engines(model)
    half = bf16.sample("hf:bfloat16", prompts, 4, 0)
    assert bf16.model_for("hf:bfloat16").dtype == torch.bfloat16 and model.dtype == torch.float32
    assert logprob_gap(model, prompts, half.ids, half.logprobs)["mean_abs_delta"] > 1e-4


def test_never_ends_forces_every_action_to_the_token_limit(tiny):
    model, tok = tiny
    eot = model.generation_config.eos_token_id
    eot = eot[0] if isinstance(eot, list) else eot
    ids = torch.tensor([tok("hello")["input_ids"]])
    with never_ends(model, eot), torch.no_grad():
        logits = model(input_ids=ids).logits
        assert (logits[..., eot] == torch.finfo(logits.dtype).min).all()
        assert (logits.argmax(-1) != eot).all()
    with torch.no_grad():  # the hook is gone afterwards
        assert (model(input_ids=ids).logits[..., eot] > torch.finfo(logits.dtype).min).all()


def test_real_part_on_the_tiny_model_reports_every_side():
    cfg = cfg_with(rollout={"tasks_per_update": 2, "group_size": 2, "max_new_tokens": 4})
    out = bench_real(cfg, sizes={"batches": (2,), "prompt": 8, "new_tokens": 3, "repeats": 1, "matmul": 256}, updates=1)
    assert out["parameters"] > 0 and out["floor"]["floor_tokens_per_s"] > 0
    assert out["sampling"]["by_batch"]["2"]["static_generated_tokens"] == 6
    (row,) = out["update_split"]["updates"]
    assert row["episodes"] == 4 and row["generated_tokens"] > 0
    for clock in ("", "_cpu"):
        parts = [row[f"{k}{clock}_s"] for k in ("rollout", "logprobs", "update")]
        total = row["wall_s" if not clock else "cpu_s"]
        assert all(0 < x < total for x in parts) and math.isclose(sum(parts), total)
    assert row["cpu_s"] < row["wall_s"] * out["threads"] + 1  # threads busy at most all the time
    split = out["update_split"]
    assert split["peak_rss_gib"] >= split["rss_before_gib"] > 0
    assert math.isclose(split["updates_per_hour"], 3600 / split["median"]["wall_s"])
    assert math.isclose(split["updates_per_cpu_hour"], 3600 / split["median"]["cpu_s"])


def test_trl_comparison_generates_the_same_tokens_on_both_sides():
    cfg = cfg_with(rollout={"tasks_per_update": 2, "group_size": 2, "max_new_tokens": 6})
    out = bench_trl(cfg, steps=1)
    assert out["ours_completion_tokens"] == out["trl_completion_tokens"] == out["forced_completion_tokens"] == 24
    assert math.isclose(out["ratio"], out["ours_s"] / out["trl_s"])
    assert math.isclose(out["ratio_cpu"], out["ours_cpu_s"] / out["trl_cpu_s"])
    assert math.isclose(out["ours_tokens_per_s"], 24 / out["ours_s"])
    assert math.isclose(out["trl_tokens_per_s"], 24 / out["trl_s"])
    assert out["ours_prompt_tokens_per_episode"] > 0 and out["trl_prompt_tokens_per_episode"] > 0
