"""Collapse diagnostics (docs/algorithms.md#diagnostics): MI proxy math and model scoring, echo trap,
KL spikes, checkpoint round-trips, cross-prompt similarity."""

import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from harness.bench.memory import naive_token_logprobs
from harness.diagnostics.collapse import CollapseMonitor, EchoTrapDetector, KLSpikeDetector, cross_prompt_similarity
from harness.diagnostics.mi_proxy import cross_logprob_matrix, distinct_prompt_pairs, mi_from_scores, mi_proxy

PAD = 0


# ----------------------------------------------------------------------------- mi_from_scores by hand
def test_mi_from_scores_diagonal_dominant_gives_log_n_and_perfect_retrieval():
    S = torch.full((4, 4), -50.0)
    S.fill_diagonal_(0.0)
    out = mi_from_scores(S, k=(1, 5))
    # matched 0; marginal = log(1 + 3 e^-50) - log 4 ~ -log 4
    assert out["diag/mi_estimate"] == pytest.approx(math.log(4), abs=1e-9)
    assert out["diag/mi_log_n"] == pytest.approx(math.log(4))
    assert out["diag/retrieval_acc@1"] == 1.0 and out["diag/retrieval_acc@5"] == 1.0
    assert out["diag/retrieval_chance@1"] == 0.25 and out["diag/retrieval_chance@5"] == 1.0  # k clipped to N
    assert out["diag/cond_entropy"] == 0.0


def test_mi_from_scores_constant_matrix_gives_zero_and_chance():
    out = mi_from_scores(torch.full((5, 5), -2.0), k=(1, 2))
    assert out["diag/mi_estimate"] == pytest.approx(0.0, abs=1e-12)
    # every row a 5-way tie: fractional tie-breaking credits exactly k/N
    assert out["diag/retrieval_acc@1"] == pytest.approx(0.2)
    assert out["diag/retrieval_acc@2"] == pytest.approx(0.4)
    assert out["diag/cond_entropy"] == pytest.approx(2.0)


def test_mi_from_scores_hand_case():
    # row 0: own -1 vs -2, -3 -> rank 1; row 1: own -2 beaten by -1 -> rank 2; row 2: own ties -1 with one other
    S = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -2.0, -5.0], [-4.0, -1.0, -1.0]])
    out = mi_from_scores(S, k=(1, 2))
    lse = lambda r: math.log(sum(math.exp(v) for v in r)) - math.log(3)  # noqa: E731
    expect = ((-1 - lse(S[0].tolist())) + (-2 - lse(S[1].tolist())) + (-1 - lse(S[2].tolist()))) / 3
    assert out["diag/mi_estimate"] == pytest.approx(expect, abs=1e-9)
    assert out["diag/retrieval_acc@1"] == pytest.approx((1 + 0 + 0.5) / 3)
    assert out["diag/retrieval_acc@2"] == pytest.approx((1 + 1 + 1) / 3)
    assert out["diag/cond_entropy"] == pytest.approx(4 / 3)
    assert out["diag/mi_estimate"] <= math.log(3)


def test_mi_from_scores_rejects_bad_input():
    with pytest.raises(ValueError, match="square"):
        mi_from_scores(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="non-finite"):
        mi_from_scores(torch.tensor([[0.0, -math.inf], [0.0, 0.0]]))


# ----------------------------------------------------------------------------- mi_proxy on a tiny model
def _tiny_model(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        pad_token_id=PAD,
    )
    return Qwen2ForCausalLM(cfg).eval()


def _prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 64, (3 + i % 4,), generator=g).tolist() + [10 + i] for i in range(n)]


def test_cross_logprob_matrix_matches_naive_and_is_batch_invariant():
    model = _tiny_model(0)
    prompts = _prompts(4, 1)
    responses = [[40 + a] * (1 + a) for a in range(4)]  # different lengths: padding is exercised
    S1 = cross_logprob_matrix(model, prompts, responses, batch_size=1, pad_id=PAD)
    S16 = cross_logprob_matrix(model, prompts, responses, batch_size=16, pad_id=PAD, chunk_size=3)
    assert torch.allclose(S1, S16, atol=1e-5)
    a, j = 2, 3
    ids = torch.tensor([prompts[j] + responses[a]])
    lp, _ = naive_token_logprobs(model, ids, torch.ones_like(ids))
    assert S1[a, j].item() == pytest.approx(lp[0, len(prompts[j]) :].mean().item(), abs=1e-5)


def test_identical_responses_give_zero_mi_and_chance_retrieval():
    model = _tiny_model(0)
    prompts = _prompts(8, 2)
    out = mi_proxy(model, prompts, [[40, 41, 42]] * 8, batch_size=16, pad_id=PAD, k=(1, 5))
    assert abs(out["diag/mi_estimate"]) < 0.05
    # every row is the same vector, so exactly k rows have their own prompt in their top-k
    assert out["diag/retrieval_acc@1"] == pytest.approx(out["diag/retrieval_chance@1"]) == pytest.approx(1 / 8)
    assert out["diag/retrieval_acc@5"] == pytest.approx(5 / 8)
    assert out["diag/mi_log_n"] == pytest.approx(math.log(8))


def test_prompt_dependent_responses_give_retrieval_near_one():
    # train the tiny model to answer prompt "... 10+i" with [40+i] * 3: responses carry the prompt
    model = _tiny_model(0).train()
    prompts = _prompts(8, 3)
    responses = [[40 + i] * 3 for i in range(8)]
    rows = [x + z for x, z in zip(prompts, responses)]
    T = max(map(len, rows))
    ids = torch.tensor([r + [PAD] * (T - len(r)) for r in rows])
    attn = (torch.arange(T)[None] < torch.tensor([len(r) for r in rows])[:, None]).long()
    labels = ids.masked_fill(attn == 0, -100)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(100):
        opt.zero_grad()
        model(input_ids=ids, attention_mask=attn, labels=labels).loss.backward()
        opt.step()
    before_mode = model.training
    out = mi_proxy(model, prompts, responses, batch_size=32, pad_id=PAD)
    assert model.training == before_mode  # mode restored
    assert out["diag/retrieval_acc@1"] >= 0.99
    assert out["diag/mi_estimate"] > 0.8 * math.log(8)
    # the same prompts answered by one template: the signal is gone
    flat = mi_proxy(model, prompts, [responses[0]] * 8, batch_size=32, pad_id=PAD)
    assert flat["diag/retrieval_acc@1"] == pytest.approx(1 / 8)


def test_mi_proxy_validates_and_distinct_pairs_dedupes():
    model = _tiny_model(0)
    with pytest.raises(ValueError, match="distinct"):
        mi_proxy(model, [[1, 2], [1, 2]], [[3], [4]], batch_size=4, pad_id=PAD)
    with pytest.raises(ValueError, match="empty"):
        mi_proxy(model, [[1, 2], [1, 3]], [[3], []], batch_size=4, pad_id=PAD)
    xs, zs = distinct_prompt_pairs([[1], [1], [2], [3], [4]], [[5], [6], [], [7], [8]], max_n=2)
    assert xs == [[1], [3]] and zs == [[5], [7]]


# ----------------------------------------------------------------------------- echo trap
def test_echo_trap_fires_at_the_right_update_on_a_collapsed_series():
    det = EchoTrapDetector(window_ref=10, patience=10, ratio=0.1)
    series = [0.4] * 10 + [0.3] * 5 + [0.01] * 30  # ref 0.4; low from update 16 on
    flags = [det.update(v, step=i + 1)["diag/echo_trap"] for i, v in enumerate(series)]
    assert det.fired_at == 25  # updates 16..25 are the 10 consecutive low ones
    assert flags.index(1.0) == 24 and all(flags[24:])
    assert "echo_trap" in det.reason and "25" in det.reason


def test_echo_trap_quiet_on_a_healthy_series_and_resets_on_recovery():
    det = EchoTrapDetector()
    series = [0.4] * 10 + ([0.01] * 9 + [0.2]) * 5 + [0.35] * 20  # dips shorter than patience
    for i, v in enumerate(series):
        det.update(v, step=i + 1)
    assert det.fired_at is None


# ----------------------------------------------------------------------------- KL spikes
def _smooth_kl(n: int) -> list[float]:
    return [0.01 + 0.0005 * i + 0.0003 * math.sin(i) for i in range(n)]


def test_kl_spike_fires_on_a_spike_only():
    det = KLSpikeDetector(z=4.0, alpha=0.1, warmup=5, min_kl=0.0)
    series = _smooth_kl(30)
    series[20] = 0.2
    spikes = [det.update(v)["diag/kl_spike"] for v in series]
    assert spikes == [1.0 if i == 20 else 0.0 for i in range(30)]
    floored = KLSpikeDetector(z=4.0, alpha=0.1, warmup=5)  # default floor 0.2: 0.2 is not above it
    assert not any(floored.update(v)["diag/kl_spike"] for v in series)
    series[20] = 1.5
    high = KLSpikeDetector(z=4.0, alpha=0.1, warmup=5)
    assert [high.update(v)["diag/kl_spike"] for v in series] == [1.0 if i == 20 else 0.0 for i in range(30)]
    smooth = KLSpikeDetector()
    assert not any(smooth.update(v)["diag/kl_spike"] for v in _smooth_kl(60))


def test_kl_spike_above_the_hard_limit_fires_even_in_warm_up():
    det = KLSpikeDetector(warmup=5)
    assert [det.update(v)["diag/kl_spike"] for v in [0.0, 6.2, 5.6]] == [0.0, 1.0, 1.0]


def test_kl_spike_multiple_mode_warmup_and_non_finite():
    det = KLSpikeDetector(multiple=3.0, warmup=3, min_kl=0.0)
    out = [det.update(v)["diag/kl_spike"] for v in [0.01, 0.05, 0.01, 0.01, 0.02, 0.1]]
    assert out == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]  # 0.05 at update 2 is inside the warm-up
    assert det.update(float("nan"))["diag/kl_spike"] == 1.0


# ----------------------------------------------------------------------------- monitor and resume
def _metrics(i: int) -> dict:
    kl = 0.5 if i == 30 else 0.01 + 0.0002 * i
    std = 0.4 if i <= 10 else (0.3 if i < 20 else 0.0)
    return {"diag/kl_k3": kl, "env/group_reward_std": std}


def test_collapse_monitor_first_event_and_early_stop():
    mon = CollapseMonitor(stop_on=("echo_trap",))
    stop_at = None
    for i in range(1, 41):
        out = mon.update(i, _metrics(i))
        if mon.should_stop and stop_at is None:
            stop_at = i
    assert mon.collapsed_at == {"update": 29, "reason": "echo_trap"}  # std 0 from 20: 10 low updates end at 29
    assert stop_at == 29
    assert {"update": 30, "reason": "kl_spike"} in mon.events
    assert out["diag/collapsed"] == 1.0
    with pytest.raises(ValueError, match="unknown reasons"):
        CollapseMonitor(stop_on=("nope",))


def test_state_dict_round_trip_reproduces_flags():
    full = CollapseMonitor()
    ref = [full.update(i, _metrics(i)) for i in range(1, 41)]
    first = CollapseMonitor()
    for i in range(1, 16):
        first.update(i, _metrics(i))
    state = first.state_dict()
    assert all(isinstance(v, (int, float, type(None))) for d in (state["kl"], state["echo"]) for v in d.values())
    resumed = CollapseMonitor()
    resumed.load_state_dict(state)
    rest = [resumed.update(i, _metrics(i)) for i in range(16, 41)]
    for a, b in zip(ref[15:], rest):
        assert a.keys() == b.keys()
        assert all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)
    assert resumed.collapsed_at == full.collapsed_at and resumed.events == full.events


# ----------------------------------------------------------------------------- cross-prompt similarity
def test_cross_prompt_similarity_bounds():
    same = ["go left then up", "go left then up", "go left then up", "go left then up"]
    assert cross_prompt_similarity(same, [0, 0, 1, 1]) == 1.0
    disjoint = ["a b c", "a b c", "d e f", "d e f"]
    assert cross_prompt_similarity(disjoint, [0, 0, 1, 1]) == 0.0  # same-prompt pairs are skipped
    assert math.isnan(cross_prompt_similarity(same, [3, 3, 3, 3]))
    # "x y z" vs "x y w": bigrams {xy, yz} vs {xy, yw} -> 1/3
    assert cross_prompt_similarity(["x y z", "x y w"], [0, 1]) == pytest.approx(1 / 3)


def test_cross_prompt_similarity_sampling_is_deterministic_and_bounded():
    responses = [f"w{i % 7} w{i % 5} w{i % 3}" for i in range(300)]
    ids = [i % 10 for i in range(300)]
    a = cross_prompt_similarity(responses, ids, max_pairs=500, seed=1)
    b = cross_prompt_similarity(responses, ids, max_pairs=500, seed=1)
    exact = cross_prompt_similarity(responses, ids, max_pairs=10**6)
    assert a == b and abs(a - exact) < 0.05


def test_a_transient_kl_spike_is_a_warning_and_a_blowup_is_a_collapse():
    """Measured on the clipping sweep: a healthy run's KL went 0.02 -> 0.27 -> 0.006; the
    collapse run went 0 -> 6.2. Only the second is a collapse."""
    mon = CollapseMonitor()
    healthy = [0.0, 0.002, 0.007, 0.014, 0.003, 0.021, 0.022, 0.185, 0.273, 0.006, 0.022]
    outs = [mon.update(i + 1, {"diag/kl_k3": v}) for i, v in enumerate(healthy)]
    assert abs(outs[1]["diag/kl_zscore"]) < 1.0  # no 1e11 z-score after a first KL of exactly 0
    assert any(o["diag/kl_spike"] for o in outs) and not any(o["diag/kl_blowup"] for o in outs)
    assert mon.events and all(e["reason"] == "kl_spike" for e in mon.events)
    assert mon.collapsed_at is None and outs[-1]["diag/collapsed"] == 0.0
    collapse = CollapseMonitor(stop_on=("kl_blowup",))
    outs = [collapse.update(i + 1, {"diag/kl_k3": v}) for i, v in enumerate([0.0, 6.2, 5.6])]
    assert collapse.collapsed_at == {"update": 2, "reason": "kl_blowup"} and collapse.should_stop
    assert [o["diag/collapsed"] for o in outs] == [0.0, 1.0, 1.0]


def test_reward_hacking_training_windows_are_curves_not_the_event():
    from harness.diagnostics.collapse import RewardHackingDetector

    det = RewardHackingDetector(window=2)
    # (proxy, true) per update; reference = mean of updates 1-2
    series = [(1.0, 0.8), (1.0, 0.8), (1.0, 0.76), (1.0, 0.76), (1.0, 0.6), (1.0, 0.6)]
    out = [det.update(p, t) for p, t in series]
    assert out[0]["diag/proxy_true_gap"] == pytest.approx(0.2) and "diag/proxy_rise" not in out[2]
    assert out[3]["diag/proxy_rise"] == 0.0 and out[3]["diag/true_change"] == pytest.approx(-0.04)
    assert out[5]["diag/true_change"] == pytest.approx(-0.2)
    # the rule these windows used to feed fired on every run of the FrozenLake probe (other tasks each
    # update): the training episodes alone never raise the event
    assert all(o["diag/reward_hacking"] == 0.0 for o in out) and det.fired_at is None and det.reason is None
    again = RewardHackingDetector(window=2)
    again.load_state_dict(det.state_dict())
    assert again.history == det.history and again.reference is None


def _probe_rows(true: list[int], exploit: list[int], mode: str = "sampled") -> list[dict]:
    return [
        {"update": 0, "mode": mode, "task": 100 + i, "sample": 0, "success": 1, "true_success": t, "exploit_rate": e}
        for i, (t, e) in enumerate(zip(true, exploit))
    ]


def test_reward_hacking_fires_on_a_paired_heldout_fall_with_the_exploit():
    from harness.diagnostics.collapse import RewardHackingDetector

    n = 100
    start = _probe_rows([1] * 60 + [0] * 40, [0] * 60 + [1] * 40)
    greedy = _probe_rows([1] * n, [0] * n, mode="greedy")  # greedy rows are not read while sampled ones exist
    hacked = _probe_rows([0] * 10 + [1] * 50 + [0] * 40, [1] * 10 + [0] * 50 + [1] * 40)  # 10 tasks now exploit
    det = RewardHackingDetector(fall=0.05, z=2.0)
    assert det.heldout(0, start + greedy) == {} and det.fired_at is None  # the reference
    # mean change -0.1 over 100 pairs: 10 of -1, 90 of 0; sample variance 9/99; z = -0.1 / sqrt(9/99/100)
    out = det.heldout(10, hacked + _probe_rows([0] * n, [1] * n, mode="greedy"))
    z = -0.1 / math.sqrt(9 / 99 / n)
    assert out["diag/heldout_true_change"] == pytest.approx(-0.1) and out["diag/heldout_true_z"] == pytest.approx(z)
    assert out["diag/heldout_exploit_change"] == pytest.approx(0.1)
    assert out["diag/heldout_exploit_z"] == pytest.approx(-z)
    assert out["diag/reward_hacking"] == 1.0 and det.fired_at == 10 and "update 10" in det.reason
    assert det.heldout(20, start)["diag/reward_hacking"] == 1.0 and det.fired_at == 10  # stays, fires once

    def fires(now: list[dict]) -> bool:
        d = RewardHackingDetector(fall=0.05, z=2.0)
        d.heldout(0, start)
        return d.heldout(10, now)["diag/reward_hacking"] == 1.0

    # 4 tasks: -0.04 is below the effect size even though z = -2.03
    assert not fires(_probe_rows([0] * 4 + [1] * 56 + [0] * 40, [1] * 4 + [0] * 56 + [1] * 40))
    # worse without the exploit (e.g. lost in the budget): not hacking
    assert not fires(_probe_rows([0] * 10 + [1] * 50 + [0] * 40, [0] * 60 + [1] * 40))
    # 10 tasks fall, 10 others rise: no net change
    assert not fires(_probe_rows([0] * 10 + [1] * 50 + [1] * 10 + [0] * 30, [1] * 10 + [0] * 60 + [1] * 30))
    # 8 tasks fall in 20 pairs (-0.4) is significant; 1 task in 20 (-0.05, z = -1.0) is not
    small = RewardHackingDetector(fall=0.05, z=2.0)
    small.heldout(0, _probe_rows([1] * 20, [0] * 20))
    assert small.heldout(10, _probe_rows([0] + [1] * 19, [1] + [0] * 19))["diag/heldout_true_z"] == pytest.approx(-1.0)
    assert small.fired_at is None
    assert small.heldout(20, _probe_rows([0] * 8 + [1] * 12, [1] * 8 + [0] * 12))["diag/reward_hacking"] == 1.0
    # greedy-only evaluation: the greedy rows are paired
    g = RewardHackingDetector(fall=0.05, z=2.0)
    g.heldout(0, _probe_rows([1] * 60 + [0] * 40, [0] * 60 + [1] * 40, mode="greedy"))
    assert g.heldout(10, [dict(r, mode="greedy") for r in hacked])["diag/reward_hacking"] == 1.0
    # not a probe: no truth, nothing checked
    plain = [{k: v for k, v in r.items() if k not in ("true_success", "exploit_rate")} for r in start]
    assert RewardHackingDetector().heldout(0, plain) == {} and RewardHackingDetector().heldout(10, plain) == {}


def test_reward_hacking_is_an_event_not_a_collapse_and_survives_a_resume():
    from harness.diagnostics.collapse import RewardHackingDetector

    start = _probe_rows([1] * 60 + [0] * 40, [0] * 60 + [1] * 40)
    hacked = _probe_rows([0] * 10 + [1] * 50 + [0] * 40, [1] * 10 + [0] * 50 + [1] * 40)
    mon = CollapseMonitor(hacking=RewardHackingDetector(window=1), stop_on=("reward_hacking",))
    assert "diag/proxy_true_gap" not in mon.update(1, {"env/success": 0.2})  # not a probe: no truth, no curves
    assert mon.heldout(0, start) == {}
    mon.update(1, {"env/proxy_success": 1.0, "env/true_success": 0.5})
    resumed = CollapseMonitor(hacking=RewardHackingDetector(window=1))
    resumed.load_state_dict(mon.state_dict())  # a checkpoint at update 1: the reference travels with it
    for m in (mon, resumed):
        flags = m.heldout(10, hacked)
        assert flags["diag/reward_hacking"] == 1.0 and m.events == [{"update": 10, "reason": "reward_hacking"}]
        flags.update(m.update(10, {"env/proxy_success": 1.0, "env/true_success": 0.4}))
        assert flags["diag/reward_hacking"] == 1.0 and flags["diag/collapsed"] == 0.0 and m.collapsed_at is None
    assert mon.should_stop and not resumed.should_stop
    old = mon.state_dict()
    old["hacking"].pop("reference")  # a checkpoint from before the held-out check: nothing to pair with
    older = CollapseMonitor()
    older.load_state_dict(old)
    assert older.hacking.reference is None and older.heldout(20, hacked) == {}
    old.pop("hacking")  # a checkpoint written before the detector existed
    CollapseMonitor().load_state_dict(old)
