"""The off-policy axis in the trainer: three log-probs per token, the mismatch diagnostics, a sampler in
another dtype, and every correction changing the update as its formula says (docs/algorithms.md#off-policy).
The defaults reproduce the trainer as it was before the axis existed."""

from __future__ import annotations

import json
import math
import multiprocessing
from pathlib import Path

import pytest
import torch

from algorithms import POLICY_LOSS
from harness.config.loading import validate_run_config
from harness.config.schema import RunConfig
from harness.experiments.tracking import RunLogger
from harness.model.logprobs import token_logprobs
from harness.rl.batch import build_batch
from harness.rl.behaviour import advantages, behaviour_forward
from harness.rl.mismatch import batch_correction, mismatch_diagnostics
from harness.rl.trainer import Trainer
from harness.rl.update import _minibatch_step, make_optimizer, run_update
from tests.helpers import baseline as baseline_run
from tests.helpers.configs import merge
from tests.helpers.episodes import PAD, episode
from tests.helpers.update import BASE, perturb

LN = math.log


def cfg_of(**algo) -> RunConfig:
    return validate_run_config(merge(BASE, {"algo": algo}), "test")


# ----------------------------------------------------------------------------- a hand-made batch
def _hand_batch(cfg: RunConfig):
    """Two one-row trajectories (concatenated, observations trained). Trajectory A's sampled ratios
    rho = exp(old - rollout) are 3, 0.4, 1, 1.5, 0.8, 1.25 (product 1.8); trajectory B's are all 1.1
    (product 1.1^6 = 1.77). Returns the batch and old_logp (B, T)."""
    batch = build_batch([episode(0), episode(1)], concatenated=True, mask_observations=False, pad_id=PAD)
    ratios = {0: [3.0, 0.4, 1.0, 1.5, 0.8, 1.25], 1: [1.1] * 6}
    old = batch.sampler_logp.clone()
    for row, rs in ratios.items():
        pos = batch.action_mask[row].nonzero().flatten()
        old[row, pos] += torch.tensor(rs).log()
    return batch, old


def test_hand_batch_weights_rejections_and_masked_fractions():
    cfg = cfg_of(correction={"name": "tis_token"})
    batch, old = _hand_batch(cfg)
    assert batch.loss_mask[0].tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1]  # observations 4, 5 and 6 trained
    corr = batch_correction(batch, old, cfg)
    act = batch.action_mask.bool()
    assert torch.allclose(corr.weight[0][act[0]], torch.tensor([2.0, 0.4, 1.0, 1.5, 0.8, 1.25]))  # C = 2
    assert (corr.weight[~act] == 1).all() and corr.keep is None  # observations: no sampler probability
    # mis_seq over trajectories, band [0.5, 1.79]: A (1.8) rejected with its observation tokens, B (1.77) kept
    cfg = cfg_of(correction={"name": "mis_seq", "hi": 1.79})
    corr = batch_correction(batch, old, cfg)
    assert corr.weight is None
    assert corr.keep[0].tolist() == [0.0] * 12 and corr.keep[1].tolist() == [1.0] * 12  # drop: out of the mask
    diag = mismatch_diagnostics(batch, old, corr, cfg)
    assert diag["diag/mismatch_masked_token_frac"].item() == pytest.approx(0.5)  # 9 of 18 trained tokens
    assert diag["diag/mismatch_masked_seq_frac"].item() == pytest.approx(0.5)
    # decoupled with cap 2: the token with ratio 3 leaves; the mean weight is over the 17 tokens left
    cfg = cfg_of(correction={"name": "decoupled", "c": 2.0})
    corr = batch_correction(batch, old, cfg)
    assert corr.keep.sum().item() == corr.keep.numel() - 1 and corr.weight[0, 3].item() == pytest.approx(3.0)
    diag = mismatch_diagnostics(batch, old, corr, cfg)
    assert diag["diag/mismatch_weight_mean"].item() == pytest.approx((0.4 + 1 + 1.5 + 0.8 + 1.25 + 3 + 6.6 + 3) / 17)
    assert diag["diag/mismatch_masked_token_frac"].item() == pytest.approx(1 / 18)
    zero = batch_correction(batch, old, cfg_of(correction={"name": "mis_seq", "hi": 1.79, "rejected": "zero"}))
    assert zero.keep is None and zero.weight[0].tolist() == [0.0] * 12 and zero.weight[1].tolist() == [1.0] * 12


def test_hand_batch_mismatch_diagnostics():
    cfg = cfg_of(correction={"name": "icepop"})
    batch, old = _hand_batch(cfg)
    diag = mismatch_diagnostics(batch, old, batch_correction(batch, old, cfg), cfg)
    rho = [3.0, 0.4, 1.0, 1.5, 0.8, 1.25] + [1.1] * 6
    delta = [LN(r) for r in rho]
    n = len(rho)
    assert diag["diag/mismatch_k1"].item() == pytest.approx(-sum(delta) / n, rel=1e-5)
    assert diag["diag/mismatch_k3"].item() == pytest.approx(sum(r - d - 1 for r, d in zip(rho, delta)) / n, rel=1e-5)
    assert diag["diag/mismatch_chi2"].item() == pytest.approx(sum(r * r for r in rho) / n - 1, rel=1e-5)
    assert diag["diag/mismatch_frac_above"].item() == pytest.approx(1 / n)  # 3 > C = 2
    assert diag["diag/mismatch_frac_below"].item() == pytest.approx(1 / n)  # 0.4 < 1/2
    w = [min(max(r, 0.5), 2.0) for r in rho]  # verl: clipped to [1/C, C]
    w_bar = sum(w) / n
    assert diag["diag/mismatch_ess"].item() == pytest.approx(1 / (sum((x / w_bar) ** 2 for x in w) / n), rel=1e-5)
    # icepop [0.5, 5]: 0.4 gets weight 0; 18 trained tokens, weights 3 + 0 + 1 + 1.5 + .8 + 1.25 + 6 * 1.1 + 6 obs
    assert diag["diag/mismatch_weight_mean"].item() == pytest.approx((3 + 1 + 1.5 + 0.8 + 1.25 + 6.6 + 6) / 18)
    assert diag["diag/mismatch_masked_token_frac"].item() == pytest.approx(1 / 18)
    assert diag["diag/mismatch_masked_seq_frac"].item() == pytest.approx(0.5)
    srt = sorted(delta)
    assert diag["diag/mismatch_delta_p0_1"].item() == pytest.approx(srt[0], rel=1e-5)  # nearest rank
    assert diag["diag/mismatch_delta_p50"].item() == pytest.approx(srt[round(0.5 * (n - 1))], rel=1e-5)
    assert diag["diag/mismatch_delta_p99_9"].item() == pytest.approx(srt[-1], rel=1e-5)


# ----------------------------------------------------------------------------- real rollouts, bf16 sampler
class Rollouts:
    """One trainer per sampler dtype with its rollouts (reused), weights restored before each check."""

    def __init__(self, root: Path):
        self.root, self.trainers = root, {}

    def get(self, dtype: str):
        if dtype not in self.trainers:
            cfg = validate_run_config(merge(BASE, {"rollout": {"sampler_dtype": dtype}}), "test")
            t = Trainer(cfg, self.root / dtype, RunLogger(self.root / f"log-{dtype}"))
            t.initial = {n: p.detach().clone() for n, p in t.policy.model.named_parameters() if p.requires_grad}
            eps = t.worker.episodes(
                t.worker.train_tasks(1, 0), 3, greedy=False, budget=3, generator=torch.Generator().manual_seed(7)
            )
            self.trainers[dtype] = (t, t.learner.training_batch([e for e in eps if e.steps]))
        t, batch = self.trainers[dtype]
        with torch.no_grad():
            for n, p in t.policy.model.named_parameters():
                if p.requires_grad:
                    p.copy_(t.initial[n])
        return t, batch


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory):
    shared = Rollouts(tmp_path_factory.mktemp("mismatch"))
    yield shared
    for t, _ in shared.trainers.values():
        t.close()


def test_a_bf16_sampler_makes_the_mismatch_diagnostics_non_zero(rollouts):
    deltas = {}
    for dtype in ("same", "bfloat16"):
        t, batch = rollouts.get(dtype)
        cfg = t.cfg
        fwd = behaviour_forward(t.policy, batch, cfg)
        m = (batch.loss_mask * batch.action_mask).bool()
        deltas[dtype] = (fwd.old_logp - batch.sampler_logp)[m].abs().max().item()
        metrics = run_update(t.policy, make_optimizer(t.policy, cfg), batch, cfg, torch.Generator().manual_seed(0))
        if dtype == "bfloat16":
            assert t.worker.sampler.dtype == torch.bfloat16 and next(t.policy.model.parameters()).dtype == torch.float32
            assert metrics["diag/mismatch_k3"] > 1e-7 and abs(metrics["diag/mismatch_k1"]) > 1e-6
            assert metrics["diag/mismatch_chi2"] != 0.0 and metrics["diag/mismatch_ess"] < 1.0
            assert metrics["diag/mismatch_delta_p0_1"] < 0.0 < metrics["diag/mismatch_delta_p99_9"]
    assert deltas["same"] < 1e-5 and deltas["bfloat16"] > 1e-3, deltas  # the copy in bf16 samples differently


def _reference(name: str, params: dict, roll, old, sampled, seq):
    """(weight, keep) of a correction straight from its formula, one sequence at a time."""
    delta = torch.where(sampled, old - roll, torch.zeros_like(old)).clamp(-20, 20)
    rho = delta.exp()
    lo, hi, c = params.get("lo"), params.get("hi"), params.get("c")
    weight, keep = torch.ones_like(old), torch.ones_like(old)
    if name == "tis_token":
        weight = torch.where(sampled, rho.clamp(max=c), weight)
    elif name == "icepop":
        weight = torch.where(sampled & ((rho < lo) | (rho > hi)), torch.zeros_like(rho), torch.where(sampled, rho, 1.0))
    elif name == "mis_token":
        keep = torch.where(sampled & ((rho < lo) | (rho > hi)), 0.0, 1.0)
    elif name == "decoupled":
        weight = torch.where(sampled, rho, weight)
        keep = torch.where(sampled & (rho > c), 0.0, 1.0) if c is not None else keep
    for s in seq[seq >= 0].unique().tolist() if name in ("tis_seq", "mis_seq", "geo_seq_mask") else []:
        at = seq == s
        total, n = delta[at & sampled].sum(), (at & sampled).sum()
        if name == "tis_seq":
            weight[at] = min(math.exp(total), c)
        ratio = math.exp(total / max(int(n), 1)) if name == "geo_seq_mask" else math.exp(total)
        if name in ("mis_seq", "geo_seq_mask") and not lo <= ratio <= hi:
            keep[at] = 0.0
    return weight, keep


CORRECTIONS = [  # bands tight enough for a bf16 sampler's mismatch (|delta| ~ 1e-3 .. 5e-2)
    ("tis_token", {"c": 1.002}, "token-mean", "drop"),
    ("tis_seq", {"c": 1.005}, "token-mean", "drop"),
    ("mis_token", {"lo": 0.995, "hi": 1.005}, "token-mean", "drop"),
    ("mis_token", {"lo": 0.995, "hi": 1.005}, "token-mean", "zero"),
    ("mis_seq", {"lo": 0.995, "hi": 1.005}, "seq-mean-token-mean", "drop"),
    ("mis_seq", {"lo": 0.995, "hi": 1.005}, "token-mean", "zero"),
    ("icepop", {"lo": 0.998, "hi": 1.002}, "token-mean", "drop"),
    ("geo_seq_mask", {"lo": 0.9995, "hi": 1.0005}, "token-mean", "drop"),
    ("decoupled", {}, "token-mean", "drop"),
    ("decoupled", {"c": 1.005}, "seq-mean-token-mean", "drop"),
]


@pytest.mark.parametrize("name,params,agg,rejected", CORRECTIONS, ids=lambda x: str(x))
def test_each_correction_changes_the_update_as_its_formula_says(rollouts, name, params, agg, rejected):
    """The policy loss of a minibatch cut in micro-batches of 2 rows equals the loss written from the
    formula over the whole batch: sum(w L keep) / sum(keep) under token-mean, the row means of the kept
    tokens under seq-mean-token-mean; `rejected: zero` keeps the rejected tokens in the denominator."""
    t, batch = rollouts.get("bfloat16")
    cfg = cfg_of(correction={"name": name, "rejected": rejected, **params}, agg=agg, micro_batch_size=2)
    policy = t.policy
    fwd = behaviour_forward(policy, batch, cfg)
    adv, returns = advantages(batch, fwd, cfg)
    perturb(policy, 5)  # ratios away from 1, so the clipped surrogate is not just -A
    sums: dict = {}
    policy.model.train()
    _minibatch_step(policy, batch, torch.arange(batch.num_rows), adv, returns, fwd, cfg, sums)
    got = torch.stack(sums["loss/policy"]).sum().item()
    with torch.no_grad():
        logp, _ = token_logprobs(
            policy.model, batch.input_ids, batch.attention_mask, temperature=cfg.rollout.temperature
        )
    policy.model.eval()
    lm = batch.loss_mask
    pl, _ = POLICY_LOSS.get("token")(logp, fwd.old_logp, adv, lm, batch.action_id, batch.traj_id, cfg.algo.clip.params)
    sampled = (lm * batch.action_mask).bool()
    seq = batch.traj_id
    defaults = {"c": 2.0} if name.startswith("tis") else {}  # decoupled: no cap unless set
    weight, keep = _reference(name, {**defaults, **params}, batch.sampler_logp, fwd.old_logp, sampled, seq)
    if rejected == "zero":
        weight, keep = weight * keep, torch.ones_like(keep)
    assert (weight != 1).any() or (keep == 0).any(), "the band is too wide to act on this batch"
    mask = lm * keep
    if agg == "token-mean":
        expected = (pl * weight * mask).sum() / mask.sum()
    else:
        rows = mask.sum(1) > 0
        expected = ((pl * weight * mask).sum(1)[rows] / mask.sum(1)[rows]).mean()
    plain = (pl * lm).sum() / lm.sum() if agg == "token-mean" else None
    assert got == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
    if plain is not None:
        assert abs(got - plain.item()) > 1e-7  # the correction changed the update


# ----------------------------------------------------------------------------- the defaults change nothing
def test_the_defaults_give_exactly_the_metrics_of_the_trainer_before_the_off_policy_axis(tmp_path):
    """`rollout.sampler_dtype: same` and `algo.correction: none`: every metric of the recorded run
    (tests/helpers/baseline.py) is reproduced bit for bit; only diag/mismatch_* keys are new."""
    config, record = baseline_run.record()
    if record is None:  # a third kind of CPU: add its record with the writer in tests/helpers/baseline.py
        pytest.skip(f"no record for this CPU code path {baseline_run.machine()}; see tests/helpers/baseline.py")
    if record.get("superseded"):  # a later, documented behaviour change reaches this path's run
        pytest.skip(f"the record of this CPU code path is superseded: {record['superseded']}")
    rows = baseline_run.run(tmp_path / "run", config)
    assert [r["update"] for r in rows] == [r["update"] for r in record["rows"]]
    for old, new in zip(record["rows"], rows):
        differ = {k: (v, new.get(k)) for k, v in old.items() if v != new.get(k) and not (v != v and new.get(k) != v)}
        assert not differ, differ
        assert all(k.startswith("diag/mismatch_") for k in set(new) - set(old)), sorted(set(new) - set(old))


def test_a_float32_sampler_copy_samples_exactly_as_the_trainer(tmp_path):
    """The copy takes the trainer's weights before every rollout: a same-dtype copy changes no metric
    (a copy left with its initial weights would sample update 2 from the untrained adapter)."""
    quick = merge(baseline_run.CONFIG, {"train": {"eval_every": 0, "mi_every": 0, "eval_episodes": 1}})
    same = baseline_run.run(tmp_path / "same", quick)
    copy = baseline_run.run(tmp_path / "copy", merge(quick, {"rollout": {"sampler_dtype": "float32"}}))
    assert json.dumps(same) == json.dumps(copy)
    assert same[2]["diag/kl_k3"] > 0  # the adapter moved before update 2's rollout


def test_evaluation_before_rl_is_shared_across_sampler_dtypes(tmp_path):
    from harness.rl.evaluate import start_key

    cfg = validate_run_config(BASE, "test")
    bf16 = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"sampler_dtype": "bfloat16"})})
    assert start_key(cfg, {}) == start_key(bf16, {})  # the evaluation plays the trainer's model


# ----------------------------------------------------------------------------- stale rollouts
QUICK = merge(
    baseline_run.CONFIG,
    {"train": {"updates": 3, "eval_every": 0, "mi_every": 0, "eval_episodes": 1}},
)


@pytest.fixture(scope="module")
def sync_rows(tmp_path_factory) -> list[dict]:
    """The synchronous trainer's rows on QUICK, shared by the tests that compare against it."""
    return baseline_run.run(tmp_path_factory.mktemp("sync") / "run", QUICK)


def test_staleness_k_lags_by_exactly_k_updates(tmp_path, sync_rows):
    """With staleness 2 the rollouts of updates 1-3 all come from the weights before RL: update 1 is
    the synchronous one, the later ones differ, and the sampler's log-probs lag the trainer's (non-zero
    mismatch), while the synchronous run has none. (Staleness 0 is the default config itself; the
    concurrent mode's k = 0 identity is tested below.)"""
    sync = sync_rows
    stale = baseline_run.run(tmp_path / "stale", merge(QUICK, {"rollout": {"staleness": 2}}))
    assert json.dumps(stale[1]) == json.dumps(sync[1])  # update 1 samples from the same weights
    for u in (2, 3):
        assert stale[u]["env/success"] != sync[u]["env/success"] or stale[u]["diag/kl_k3"] != sync[u]["diag/kl_k3"]
        assert abs(sync[u]["diag/mismatch_k1"]) < 1e-5 and abs(stale[u]["diag/mismatch_k1"]) > 1e-4


def test_stale_rollouts_sample_from_the_weights_of_k_updates_ago(tmp_path):
    """The sampler of update u holds the trainable weights recorded at the start of update u - k."""
    from harness.rl.sampler_copy import SamplerModel

    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    frozen = model[0].bias
    frozen.requires_grad_(False)
    s = SamplerModel(model, "same", staleness=2)
    seen = []
    for u in range(1, 6):
        s.record()
        seen.append(s.model()[0].weight[0, 0].item())
        with torch.no_grad():
            model[0].weight.fill_(float(u))  # "update u"
    first = seen[0]
    assert seen == [first, first, first, 1.0, 2.0]  # update u samples with the weights after u - 3 ... u - k - 1
    assert s.model() is not model and model[0].weight[0, 0].item() == 5.0


def test_a_stale_run_is_bit_reproducible_and_resumes_exactly(tmp_path):
    """Deterministic mode: two runs with staleness 2 (and a cross-policy pool) agree bit for bit, and a
    run interrupted at update 3 (last checkpoint at 2, snapshots restored from it) continues exactly
    as the uninterrupted one."""
    from harness.rl.trainer import train

    pool = {"members": 2, "prob": 0.5, "refresh_every": 1}  # cross-policy snapshots travel in the checkpoint too
    cfg = merge(
        QUICK, {"rollout": {"staleness": 2, "cross_policy": pool}, "train": {"updates": 4, "checkpoint_every": 2}}
    )
    a = baseline_run.run(tmp_path / "a", cfg)
    b = baseline_run.run(tmp_path / "b", cfg)
    assert json.dumps(a) == json.dumps(b)

    class Interrupt(Exception):
        pass

    def stop_at_3(p):
        if p["update"] == 3:
            raise Interrupt

    logger = RunLogger(tmp_path / "c")
    with pytest.raises(Interrupt):
        train(RunConfig.model_validate(cfg), tmp_path / "c", logger, stop_at_3)
    logger.close("interrupted")
    resumed = baseline_run.run(tmp_path / "c", cfg)
    assert [r["update"] for r in resumed] == [0, 1, 2, 3, 4]
    assert json.dumps(resumed) == json.dumps(a)


# ----------------------------------------------------------------------------- concurrent rollout
def _without(rows: list[dict], key: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k != key} for r in rows]


def test_concurrent_rollout_with_staleness_zero_is_the_synchronous_trainer(tmp_path, sync_rows):
    """The rollout process waits for every update when k = 0: every metric equals the synchronous
    run's bit for bit, and the logged staleness is 0."""
    sync = sync_rows
    conc = baseline_run.run(tmp_path / "conc", merge(QUICK, {"rollout": {"concurrent": True}}))
    assert [r.get("rollout/staleness") for r in conc[1:]] == [0.0, 0.0, 0.0]
    assert json.dumps(_without(conc, "rollout/staleness")) == json.dumps(sync)


def test_concurrent_rollout_stays_within_its_staleness_bound(tmp_path, sync_rows):
    """k = 2: every batch comes from an adapter at most 2 updates old; batch 1 always comes from the
    weights before RL, so update 1 is the synchronous one."""
    sync = sync_rows
    conc = baseline_run.run(tmp_path / "conc", merge(QUICK, {"rollout": {"concurrent": True, "staleness": 2}}))
    lags = [r["rollout/staleness"] for r in conc[1:]]
    assert len(lags) == 3 and all(0.0 <= x <= 2.0 for x in lags) and lags[0] == 0.0
    assert json.dumps(_without(conc, "rollout/staleness")[1]) == json.dumps(sync[1])


def test_an_interrupted_concurrent_run_resumes_exactly_and_stops_its_rollout_process(tmp_path):
    from harness.rl.trainer import train

    cfg = merge(QUICK, {"rollout": {"concurrent": True}, "train": {"updates": 4, "checkpoint_every": 2}})
    full = baseline_run.run(tmp_path / "full", cfg)

    class Interrupt(Exception):
        pass

    def stop_at_3(p):
        if p["update"] == 3:
            raise Interrupt

    before = {c.pid for c in multiprocessing.active_children()}
    logger = RunLogger(tmp_path / "cut")
    with pytest.raises(Interrupt):
        train(RunConfig.model_validate(cfg), tmp_path / "cut", logger, stop_at_3)
    logger.close("interrupted")
    assert {c.pid for c in multiprocessing.active_children()} <= before  # the rollout process is gone
    resumed = baseline_run.run(tmp_path / "cut", cfg)
    assert json.dumps(resumed) == json.dumps(full)


def test_concurrent_rollout_and_cross_policy_are_refused_together():
    with pytest.raises(Exception, match="cross-policy sampling runs in the synchronous or deterministic modes"):
        validate_run_config(merge(BASE, {"rollout": {"concurrent": True, "cross_policy": {"members": 1}}}), "t")
