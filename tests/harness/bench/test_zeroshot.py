"""The zero-shot table's arithmetic (harness.bench.zeroshot): Wilson intervals against hand-computed values,
the episode bootstrap, the per-action admissible mass, the variants' keys and the command's bad input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.bench.zeroshot import VARIANTS, cluster_bootstrap, main, summarise, variant_config, wilson
from harness.transcript.records import Episode, StepRecord

CONFIG = str(Path(__file__).resolve().parents[3] / "configs" / "smollm2_frozenlake.yaml")


def test_wilson_hand_computed():
    # k = 0, n = 32: upper bound z^2 / (n + z^2) = 3.8416 / 35.8416
    assert wilson(0, 32) == pytest.approx((0.0, 3.8416 / 35.8416), abs=1e-9)
    # k = 16, n = 32: symmetric around 1/2, half-width z sqrt(1/4n + z^2/4n^2) / (1 + z^2/n)
    half = 1.96 * math.sqrt(0.25 / 32 + 1.96**2 / (4 * 32**2)) / (1 + 1.96**2 / 32)
    assert wilson(16, 32) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-9)
    lo, hi = wilson(3, 10)  # the textbook example: 0.108 to 0.603
    assert (round(lo, 3), round(hi, 3)) == (0.108, 0.603)


def test_episode_bootstrap_brackets_the_rate_and_is_seeded():
    errors, turns = [0, 8, 1, 0, 8, 2], [8, 8, 8, 4, 8, 8]
    lo, hi = cluster_bootstrap(errors, turns)
    assert lo < sum(errors) / sum(turns) < hi and cluster_bootstrap(errors, turns) == (lo, hi)
    # no error (or only errors) in 32 episodes: the percentile interval would be the point [0, 0]; it is
    # Wilson's over the 32 episodes instead, 0 to 0.107
    lo, hi = cluster_bootstrap([0] * 32, [6] * 32)
    assert lo == 0.0 and round(hi, 3) == 0.107
    lo, hi = cluster_bootstrap([6] * 32, [6] * 32)
    assert round(lo, 3) == 0.893 and hi == 1.0


def _step(fmt: bool, raw=None, lps=(-0.1,), n=1):
    return StepRecord(
        turn=0,
        obs_ids=[],
        context_ids=None,
        action_ids=[1] * n,
        sampler_logprobs=list(lps),
        action_text="",
        observation="",
        format_error=fmt,
        unconstrained_logprobs=raw,
    )


def test_summary_counts_turns_episodes_and_the_action_mass():
    a = Episode(0, 0, "", [_step(True), _step(False)], won=False)
    b = Episode(1, 1, "", [_step(False)], won=True)
    row = summarise("frozenlake", "chat", "sampled", [a, b], 2.0)
    assert (row.turns, row.format_errors, row.successes, row.episodes) == (3, 1, 1, 2)
    assert row.format_error_rate == pytest.approx(1 / 3) and row.admissible_mass is None
    # constrained actions: prod_k Z_k = exp(sum raw - sum constrained): 0.5 * 0.8 and 1.0
    c = Episode(2, 2, "", [_step(False, [math.log(0.25), math.log(0.8)], [math.log(0.5), 0.0], n=2)], won=True)
    d = Episode(3, 3, "", [_step(False, [math.log(0.3)], [math.log(0.3)])], won=False)
    row = summarise("frozenlake", "chat+constrain", "sampled", [c, d], 1.0)
    assert row.admissible_mass == pytest.approx((0.5 * 0.8 + 1.0) / 2)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variants_set_prompt_stop_and_constraint(variant):
    cfg = variant_config(CONFIG, [], variant)
    want = VARIANTS[variant]
    assert cfg.env.options["prompt"] == want["prompt"]
    assert (cfg.rollout.stop, cfg.rollout.constrain) == (want["rollout.stop"], want["rollout.constrain"])


def test_bad_arguments_say_what_is_allowed(capsys):
    assert main([CONFIG, "--variants", "chatty"]) == 2
    err = capsys.readouterr().err
    assert "chatty" in err and "chat+constrain" in err
    assert main(["configs/no_such_file.yaml"]) == 2
    assert "no_such_file" in capsys.readouterr().err
