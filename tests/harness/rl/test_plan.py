"""The update plan (harness.rl.plan, docs/trainer.md#update-plan): the sampler's log-probs and entropies
against the recomputed behaviour pass on real rollouts of the tiny policy, the loss and the step they
give, the reference schedule, the config checks, and the default plan leaving metrics and hashes alone."""

from __future__ import annotations

import pytest
import torch

from harness.config.errors import ConfigError
from harness.config.loading import validate_run_config
from harness.experiments.provenance import config_hash
from harness.model.logprobs import token_logprobs
from harness.model.precision import autocast_only
from harness.rl.batch import model_prefix, pack_units, prefix_keys, prefix_units
from harness.rl.behaviour import behaviour_forward
from harness.rl.plan import DEFAULT_PLAN, make_plan
from harness.rl.update import _micro_batches, make_optimizer, run_update
from tests.helpers.update import GRPO, perturb, raw_config

# float32 rounding between the sampler's KV-cached pass and the whole-sequence pass, measured on these
# rollouts at about 4e-6 (log-probs) and 1e-6 (entropies); a different policy is off by ~1e-1
TOL = 5e-5


def learner_cfg(kl=("k3", "loss"), constrain=False, **learner):
    raw = raw_config({**GRPO, "kl": kl, "constrain": constrain})
    raw["train"] = {**raw["train"], "learner": learner}
    return validate_run_config(raw, "test")


@pytest.mark.parametrize("constrain", [False, True])
def test_the_sampler_path_gives_the_recomputed_behaviour_within_float_rounding(env, constrain):
    cfg = learner_cfg(constrain=constrain, behaviour="sampler")
    t = env.trainer(cfg)
    batch = env.batch(t, cfg)
    plan = make_plan(cfg, 1, batch)
    assert plan.behaviour == "sampler" and plan.reference
    recomputed, sampled = behaviour_forward(t.policy, batch, cfg), behaviour_forward(t.policy, batch, cfg, plan)
    m = batch.action_mask.bool()
    gap = (recomputed.old_logp - sampled.old_logp)[m].abs().max().item()
    assert 0 < gap < TOL  # the same policy, computed another way
    assert (recomputed.entropy - sampled.entropy)[m].abs().max().item() < TOL
    assert torch.equal(recomputed.ref_logp, sampled.ref_logp)  # the reference pass is the same pass
    assert sampled.old_values is None
    if constrain:
        assert (recomputed.entropy_constrained - sampled.entropy_constrained)[m].abs().max().item() < TOL
        assert sampled.entropy_constrained[m].mean() < sampled.entropy[m].mean()
    else:
        assert recomputed.entropy_constrained is None and sampled.entropy_constrained is None


def test_only_a_sampler_path_run_records_entropies_and_without_them_the_update_recomputes(env):
    cfg = learner_cfg(behaviour="sampler")
    t = env.trainer(cfg)
    assert t.worker.records_entropy  # the run's setting asks the sampler for them
    args = dict(greedy=False, budget=cfg.turns.max, generator=torch.Generator().manual_seed(7))
    bare = t.worker.episodes(t.worker.train_tasks(1, 0), cfg.rollout.group_size, record_entropy=False, **args)
    assert all(s.sampler_entropy is None for e in bare for s in e.steps)
    batch = t.learner.training_batch([e for e in bare if e.steps and e.env_error is None], cfg)
    assert batch.stream_entropy is None and make_plan(cfg, 1, batch).behaviour == "recompute"
    assert torch.equal(batch.input_ids, env.batch(t, cfg).input_ids)  # recording changes no sampled token


def _step(env, cfg, plan):
    """Metrics and the trained weights of one update from the shared start, under `plan`."""
    t = env.trainer(cfg)
    batch = env.batch(t, cfg)
    metrics = run_update(
        t.policy, make_optimizer(t.policy, cfg), batch, cfg, torch.Generator().manual_seed(0), None, plan
    )
    return metrics, _weights(t)


def _weights(t) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in t.policy.actor_parameters()])


def test_the_sampler_path_gives_the_same_loss_and_step(env):
    cfg = learner_cfg(behaviour="sampler")
    plain, plain_w = _step(env, cfg, DEFAULT_PLAN)
    t = env.trainer(cfg)
    fast, fast_w = _step(env, cfg, make_plan(cfg, 1, env.batch(t, cfg)))
    for key in ("loss/policy", "loss/kl", "loss/total", "diag/kl_k3", "diag/entropy", "diag/grad_norm"):
        assert fast[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
    assert plain["diag/logprob_mismatch"] > 0 and fast["diag/logprob_mismatch"] == 0  # the sampler is the behaviour
    start = _weights(env.trainer(cfg))  # the trainer resets its weights to the shared start
    assert (fast_w - plain_w).abs().max().item() < 1e-5 < (plain_w - start).abs().max().item()
    assert fast["plan/behaviour_recomputed"] == 0 and fast["plan/reference"] == 1
    assert not any(k.startswith("plan/") for k in plain)  # the default plan adds nothing to the metrics


def test_the_reference_runs_on_its_schedule_and_its_diagnostics_only_then(env):
    raw = raw_config(GRPO)
    raw["algo"]["kl"] = {**raw["algo"]["kl"], "coef": 0.0}  # the KL is a diagnostic alone
    raw["train"] = {**raw["train"], "learner": {"reference_every": 3}}
    cfg = validate_run_config(raw, "test")
    t = env.trainer(cfg)
    batch = env.batch(t, cfg)
    assert [make_plan(cfg, u, batch).reference for u in range(1, 8)] == [True, False, False, True, False, False, True]
    skipped, _ = _step(env, cfg, make_plan(cfg, 2, batch))
    assert skipped["plan/reference"] == 0 and skipped["plan/behaviour_recomputed"] == 1
    assert not any(k.startswith("diag/kl_") for k in skipped) and "diag/entropy" in skipped
    ran, _ = _step(env, cfg, make_plan(cfg, 4, batch))
    assert "diag/kl_k3" in ran and ran["plan/reference"] == 1
    assert skipped["loss/policy"] == ran["loss/policy"]  # the reference feeds no trained term here


@pytest.mark.parametrize(
    "section,key,value,named",
    [
        ("rollout", "sampler_dtype", "bfloat16", "rollout.sampler_dtype"),
        ("rollout", "staleness", 1, "rollout.staleness"),
        ("context", "mask_observations", False, "context.mask_observations"),
        ("algo", "correction", {"name": "tis_token"}, "algo.correction.name"),
    ],
)
def test_the_sampler_path_is_refused_where_the_sampler_is_not_the_trainer(section, key, value, named):
    raw = raw_config(GRPO)
    raw[section] = {**raw.get(section, {}), key: value}
    raw["train"] = {**raw["train"], "learner": {"behaviour": "sampler"}}
    with pytest.raises(ConfigError, match=named) as e:
        validate_run_config(raw, "test")
    assert "train.learner.behaviour" in str(e.value)


@pytest.mark.parametrize("where", ["loss", "reward"])
def test_a_reference_schedule_is_refused_where_the_kl_is_trained(where):
    with pytest.raises(ConfigError, match="train.learner.reference_every = 2"):
        learner_cfg(kl=("k3", where), reference_every=2)


def test_the_default_plan_leaves_the_config_hash_alone():
    cfg = learner_cfg()
    dump = cfg.model_dump(mode="json")
    del dump["train"]["learner"]  # a config written before the plan existed
    assert config_hash(cfg) == config_hash(dump)
    assert config_hash(learner_cfg(behaviour="sampler")) != config_hash(cfg)
    assert "learner" in cfg.model_dump(mode="json")["train"]  # the caller's dump is left whole


# ----------------------------------------------------------------------------- the shared prefix
def test_prefix_units_merge_a_group_and_count_its_prefix_once(env):
    cfg = learner_cfg()
    batch = env.batch(env.trainer(cfg), cfg)
    rows = list(range(batch.num_rows))
    units, lengths = prefix_units(batch, rows)
    keys = prefix_keys(batch)
    assert sorted(k for u in units for k in u) == rows and len(units) == len(set(keys.tolist()))
    for unit, packed in zip(units, lengths):
        assert len({int(keys[k]) for k in unit}) == 1  # one group per unit
        ids = [batch.input_ids[k, : int(batch.attention_mask[k].sum())].tolist() for k in unit]
        P = 0
        while all(len(x) > P for x in ids) and len({x[P] for x in ids}) == 1:
            P += 1
        assert packed == P + sum(len(x) - P for x in ids)
        assert P > 0 or len(unit) == 1  # a group's rows share at least their prompt
    assert pack_units([[0, 1], [2], [3, 4]], [10, 6, 4], size=99, tokens=20) == [[0, 1, 2], [3, 4]]  # 2 x 10
    assert pack_units([[0, 1], [2], [3, 4]], [10, 6, 4], size=3, tokens=0) == [[0, 1, 2], [3, 4]]  # rows <= 3


def _logprobs_and_grads(t, batch, cfg, prefix: str | None, plan=DEFAULT_PLAN):
    """Log-probs, entropies and the gradient of their sum over the loss mask, from zeroed gradients; the
    forward in `plan`'s precision, the backward outside it (as the update runs them); a shared prefix
    computed as `prefix` (train.learner.prefix_impl) names, None: none."""
    for p in t.policy.actor_parameters():
        p.grad = None
    with plan.compute(t.policy.model):
        lp, ent = token_logprobs(
            t.policy.model,
            batch.input_ids,
            batch.attention_mask,
            temperature=cfg.rollout.temperature,
            with_entropy=True,
            allowed=batch.allowed,
            prefix=model_prefix(batch, prefix),
        )
    (lp * batch.loss_mask).sum().backward()
    return lp, ent, torch.cat([p.grad.flatten() for p in t.policy.actor_parameters()])


@pytest.mark.parametrize("impl", ["packed", "segmented", "kv_cache"])
@pytest.mark.parametrize("layout,constrain", [("concatenated", False), ("concatenated", True), ("per-step", False)])
def test_the_shared_prefix_gives_the_plain_log_probs_entropies_and_gradients(env, layout, constrain, impl):
    raw = raw_config({**GRPO, "layout": layout, "constrain": constrain})
    cfg = validate_run_config(raw, "test")
    t = env.trainer(cfg)
    batch = env.batch(t, cfg)
    perturb(t.policy, 4)  # off the start: the gradients below are not all zero
    t.policy.model.train()
    out = {}
    for prefix in (None, impl):
        out[prefix is None] = _logprobs_and_grads(t, batch, cfg, prefix)
    (lp0, ent0, g0), (lp1, ent1, g1) = out[True], out[False]
    m = batch.attention_mask.bool()
    assert (lp0 - lp1)[m].abs().max().item() < TOL and (ent0 - ent1)[m].abs().max().item() < TOL
    assert ((g0 - g1).norm() / g0.norm()).item() < 1e-4 and g0.norm() > 0


# the plan/* keys a run with a shared prefix logged before train.learner.prefix_impl existed: packed runs
# keep exactly these (their metrics.jsonl byte for byte), kv_cache and segmented runs add plan/prefix_<impl>
PLAN_KEYS = {
    "plan/behaviour_recomputed",
    "plan/behaviour_first_forward",
    "plan/reference",
    "plan/shared_prefix",
    "plan/bf16",
    "plan/needed_positions",
}


@pytest.mark.parametrize("impl", ["packed", "segmented", "kv_cache"])
def test_the_shared_prefix_update_gives_the_plain_loss_and_step(env, impl):
    cfg = learner_cfg(shared_prefix=True, prefix_impl=impl)
    plain, plain_w = _step(env, cfg, DEFAULT_PLAN)
    batch = env.batch(env.trainer(cfg), cfg)
    plan = make_plan(cfg, 1, batch)
    assert plan.prefix == impl and plan.behaviour == "recompute"
    shared, shared_w = _step(env, cfg, plan)
    for key in ("loss/policy", "loss/kl", "loss/total", "diag/kl_k3", "diag/entropy", "diag/grad_norm"):
        assert shared[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
    start = _weights(env.trainer(cfg))
    assert (shared_w - plain_w).abs().max().item() < 1e-5 < (plain_w - start).abs().max().item()
    assert shared["plan/shared_prefix"] == 1
    logged = {k for k in shared if k.startswith("plan/")}
    assert logged == (PLAN_KEYS if impl == "packed" else PLAN_KEYS | {f"plan/prefix_{impl}"})
    assert shared.get(f"plan/prefix_{impl}", 1) == 1
    # micro-batches are whole groups, each one packed sequence: under a budget smaller than any row, the
    # plain path gives each trajectory a pass of its own, the shared prefix each group
    rows = torch.arange(batch.num_rows)
    micros = _micro_batches(batch, rows, 64, 1, prefix=impl)
    assert len(micros) == len(set(prefix_keys(batch).tolist())) < len(_micro_batches(batch, rows, 64, 1))
    assert sorted(torch.cat(micros).tolist()) == rows.tolist()


# ----------------------------------------------------------------------------- the learner's precision
# bfloat16 keeps 8 bits of mantissa: a logit of size ~10 moves by up to ~0.04; measured on these rollouts
# the log-probs move by ~1e-2 at most
BF16_TOL = 0.1


@pytest.mark.parametrize("prefix", [None, "packed", "segmented", "kv_cache"])
def test_bfloat16_compute_gives_the_float32_log_probs_and_gradients_within_its_rounding(env, prefix):
    impl = {"prefix_impl": prefix} if prefix else {}
    cfg = learner_cfg(precision="bfloat16", shared_prefix=prefix is not None, **impl)
    t = env.trainer(cfg)
    batch = env.batch(t, cfg)
    perturb(t.policy, 4)  # off the start: the gradients below are not all zero
    t.policy.model.train()
    plan = make_plan(cfg, 1, batch)
    assert plan.precision == "bfloat16"
    out = {}
    for bf16 in (False, True):
        lp, ent, g = _logprobs_and_grads(t, batch, cfg, plan.prefix, plan if bf16 else DEFAULT_PLAN)
        assert lp.dtype == torch.float32 and ent.dtype == torch.float32  # log-softmax stays float32
        out[bf16] = lp, ent, g
    assert all(p.grad.dtype == p.dtype == torch.float32 for p in t.policy.actor_parameters())  # master weights
    (lp0, ent0, g0), (lp1, ent1, g1) = out[False], out[True]
    m = batch.attention_mask.bool()
    gap = (lp0 - lp1)[m].abs().max().item()
    assert TOL < gap < BF16_TOL  # it ran in bfloat16 (far beyond float32 rounding), and only rounding moved
    assert (ent0 - ent1)[m].abs().max().item() < BF16_TOL
    cos = torch.nn.functional.cosine_similarity(g0, g1, dim=0).item()
    assert cos > 0.99 and ((g0 - g1).norm() / g0.norm()).item() < 0.1, cos


def test_the_fused_head_recomputes_its_logits_in_bfloat16_in_backward():
    """The gradient of the fused lm_head under autocast is that of the bfloat16 logits the forward took its
    log-sum-exp from: the same as autograd through the unfused bfloat16 computation."""
    from harness.model.logprobs import _chunk_logprobs

    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(50, 16, generator=g))
    h = torch.randn(12, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (12,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = _chunk_logprobs(head, h, targets, 0.7, True)
    ((lp + 0.3 * ent).sum()).backward()
    fused = h.grad.clone(), head.weight.grad.clone()
    h.grad, head.weight.grad = None, None
    logits = (h.bfloat16() @ head.weight.bfloat16().t()).float() / 0.7
    ref = logits.log_softmax(-1)
    lp_ref = ref.gather(-1, targets[:, None]).squeeze(-1)
    ent_ref = -(ref.exp() * ref).sum(-1)
    assert (lp - lp_ref).abs().max() < 1e-5
    ((lp_ref + 0.3 * ent_ref).sum()).backward()
    assert fused[0].dtype == fused[1].dtype == torch.float32
    for a, b in zip(fused, (h.grad, head.weight.grad)):
        assert ((a - b).norm() / b.norm()).item() < 2e-2  # the bfloat16 products of backward, both sides


def test_a_bfloat16_update_gives_the_float32_loss_and_step_within_its_rounding(env):
    cfg = learner_cfg(precision="bfloat16")
    plain, plain_w = _step(env, cfg, DEFAULT_PLAN)
    batch = env.batch(env.trainer(cfg), cfg)
    plan = make_plan(cfg, 1, batch)
    assert plan.behaviour == "recompute" and plan.precision == "bfloat16"
    low, low_w = _step(env, cfg, plan)
    for key in ("loss/policy", "loss/total", "diag/entropy", "diag/grad_norm"):
        assert low[key] == pytest.approx(plain[key], rel=5e-2, abs=1e-3), key
    assert low["plan/bf16"] == 1 and low["plan/behaviour_recomputed"] == 1
    start = _weights(env.trainer(cfg))
    # Adam's step divides by the gradient's scale, so coordinates whose gradient is near 0 take a full-size
    # step whichever way rounding tips them: the steps agree in direction, not to the last digit
    cos = torch.nn.functional.cosine_similarity(plain_w - start, low_w - start, dim=0).item()
    assert 0 < (low_w - plain_w).norm() < 0.25 * (plain_w - start).norm() and cos > 0.97, cos


@pytest.mark.parametrize("prefix", [None, "packed", "segmented", "kv_cache"])
def test_cached_bfloat16_weights_give_autocast_s_log_probs_and_gradients_bit_for_bit(env, prefix):
    impl = {"prefix_impl": prefix} if prefix else {}
    cfg = learner_cfg(precision="bfloat16", shared_prefix=prefix is not None, **impl)
    t = env.trainer(cfg)
    batch = env.batch(t, cfg)
    perturb(t.policy, 4)
    t.policy.model.train()
    plan = make_plan(cfg, 1, batch)
    cached = _logprobs_and_grads(t, batch, cfg, plan.prefix, plan)
    with autocast_only():
        plain = _logprobs_and_grads(t, batch, cfg, plan.prefix, plan)
    for a, b in zip(cached, plain):
        assert torch.equal(a, b)
    assert (cached[0] - _logprobs_and_grads(t, batch, cfg, plan.prefix, DEFAULT_PLAN)[0]).abs().max() > TOL  # bf16 ran


def test_a_bfloat16_update_with_cached_weights_is_autocast_s_update_bit_for_bit(env):
    cfg = learner_cfg(precision="bfloat16", behaviour="first_forward", shared_prefix=True, logprob_positions="needed")
    plan = make_plan(cfg, 1, env.batch(env.trainer(cfg), cfg))
    assert plan.precision == "bfloat16" and plan.behaviour == "first_forward" and plan.prefix == "packed"
    cached, cached_w = _step(env, cfg, plan)
    with autocast_only():
        plain, plain_w = _step(env, cfg, plan)
    assert cached.keys() == plain.keys()
    assert all(cached[k] == plain[k] or (cached[k] != cached[k] and plain[k] != plain[k]) for k in cached)
    assert torch.equal(cached_w, plain_w)


def test_the_copies_stand_in_only_inside_the_context_and_are_kept_only_for_an_update(env):
    from harness.model.precision import casts_kept, frozen_linears_in

    cfg = learner_cfg(precision="bfloat16")
    model = env.trainer(cfg).policy.model
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and not m.weight.requires_grad]
    assert linears
    before = {id(m): m.weight for m in linears}
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    assert head.weight is embed.weight  # the tiny model ties them: the table must stay float32 for lookups
    with frozen_linears_in(model, torch.bfloat16):
        assert all(m.weight.dtype == torch.bfloat16 and not m.weight.requires_grad for m in linears)
        assert embed.weight.dtype == torch.float32 and head.weight.dtype == torch.bfloat16
        first = linears[0].weight
        assert torch.equal(first, before[id(linears[0])].detach().to(torch.bfloat16))
        assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)  # LoRA untouched
    assert all(m.weight is before[id(m)] for m in linears) and head.weight is embed.weight
    with casts_kept(model):
        with frozen_linears_in(model, torch.bfloat16):
            kept = linears[0].weight.data_ptr()
        with frozen_linears_in(model, torch.bfloat16):
            assert linears[0].weight.data_ptr() == kept  # cast once within the update
    saved = linears[0].weight.detach().clone()
    try:
        linears[0].weight.data.add_(1.0)  # a write the version counter does not see, between updates
        with casts_kept(model), frozen_linears_in(model, torch.bfloat16):
            assert torch.equal(linears[0].weight, before[id(linears[0])].detach().to(torch.bfloat16))
    finally:
        linears[0].weight.data.copy_(saved)  # the env's trainers share the frozen base
    with autocast_only(), frozen_linears_in(model, torch.bfloat16):  # the baseline the equality tests use
        assert all(m.weight is before[id(m)] and m.weight.dtype == torch.float32 for m in linears)
    with frozen_linears_in(model, torch.bfloat16):  # and only inside it
        assert linears[0].weight.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="inside"), frozen_linears_in(model, torch.bfloat16):
        raise RuntimeError("inside")
    assert all(m.weight is before[id(m)] for m in linears)  # restored on an error too


def test_bfloat16_is_refused_with_the_sampler_behaviour():
    with pytest.raises(ConfigError, match="train.learner.precision = 'bfloat16'") as e:
        learner_cfg(behaviour="sampler", precision="bfloat16")
    assert "train.learner.behaviour: recompute" in str(e.value)


# ----------------------------------------------------------------------------- the on-policy shortcut
@pytest.mark.parametrize("constrain", [False, True])
def test_the_first_forward_gives_the_recomputed_behaviour_loss_and_step(env, constrain):
    cfg = learner_cfg(constrain=constrain, behaviour="first_forward")
    assert cfg.algo.epochs == cfg.algo.minibatches == 1
    plain, plain_w = _step(env, cfg, DEFAULT_PLAN)
    t = env.trainer(cfg)
    plan = make_plan(cfg, 1, env.batch(t, cfg))
    assert plan.behaviour == "first_forward" and t.worker.records_entropy
    fast, fast_w = _step(env, cfg, plan)
    for key in ("loss/policy", "loss/kl", "loss/total", "diag/kl_k3", "diag/entropy", "diag/grad_norm"):
        assert fast[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
    # the behaviour log-probs are the training forward's: against the sampler's they differ by the
    # same float rounding as the recomputed pass's (both whole-sequence passes of the same weights)
    assert fast["diag/logprob_mismatch"] == pytest.approx(plain["diag/logprob_mismatch"], rel=0.5)
    assert 0 < fast["diag/logprob_mismatch"] < TOL
    start = _weights(env.trainer(cfg))
    assert (fast_w - plain_w).abs().max().item() < 1e-5 < (plain_w - start).abs().max().item()
    assert fast["plan/behaviour_first_forward"] == 1 and fast["plan/behaviour_recomputed"] == 0


def test_the_first_forward_in_bfloat16_keeps_the_ratio_at_one(env):
    """With bfloat16 compute the first forward's log-probs are the behaviour's in that precision: every
    ratio is exactly 1 (no token clipped), while the float32 behaviour against the bfloat16 training
    forward would put their rounding gap into the ratio."""
    cfg = learner_cfg(behaviour="first_forward", precision="bfloat16")
    t = env.trainer(cfg)
    fast, _ = _step(env, cfg, make_plan(cfg, 1, env.batch(t, cfg)))
    clipped = [k for k in fast if k.startswith("diag/clip")]
    assert clipped and all(fast[k] == 0 for k in clipped), {k: fast[k] for k in clipped}
    assert fast["plan/bf16"] == 1 and fast["plan/behaviour_first_forward"] == 1
    # the gap the ratio is spared: the bfloat16 forward against the float32 sampler, ~1e-2 per token
    assert TOL < fast["diag/logprob_mismatch_max"] < BF16_TOL


@pytest.mark.parametrize(
    "algo,named",
    [
        ({"epochs": 2}, "algo.epochs = 2"),
        ({"minibatches": 2}, "algo.minibatches = 2"),
        ({"critic": {"enabled": True}, "adv": {"estimator": "gae", "norm": "batch"}}, "algo.critic.enabled"),
        ({"kl": {"estimator": "k1", "where": "reward", "coef": 0.1}}, "algo.kl.where = 'reward'"),
        ({"clip": {**GRPO["clip"], "seq_mask": True}}, "algo.clip.seq_mask"),
        ({"correction": {"name": "tis_token"}}, "algo.correction.name"),
    ],
)
def test_the_first_forward_is_refused_where_the_behaviour_is_needed_before_the_step(algo, named):
    raw = raw_config(GRPO)
    raw["algo"] = {**raw["algo"], **algo}
    raw["train"] = {**raw["train"], "learner": {"behaviour": "first_forward"}}
    with pytest.raises(ConfigError, match=named) as e:
        validate_run_config(raw, "test")
    assert "train.learner.behaviour 'first_forward'" in str(e.value)


def test_the_first_forward_is_refused_under_lora_dropout():
    raw = raw_config(GRPO)
    raw["model"] = {**raw.get("model", {}), "lora": {**raw.get("model", {}).get("lora", {}), "dropout": 0.1}}
    raw["train"] = {**raw["train"], "learner": {"behaviour": "first_forward"}}
    with pytest.raises(ConfigError, match="model.lora.dropout"):
        validate_run_config(raw, "test")


def test_bfloat16_on_a_cpu_without_its_instructions_is_named_in_a_warning(monkeypatch):
    import harness.rl.plan as plan_module
    from harness.config.errors import ConfigWarning

    cfg = learner_cfg(precision="bfloat16")
    monkeypatch.setattr(plan_module, "cpu_bf16", lambda: "")  # the machine's CPU flags, not a component
    with pytest.warns(ConfigWarning, match="train.learner.precision: bfloat16 on a CPU without"):
        plan_module.check_precision(cfg, "cpu")
    monkeypatch.setattr(plan_module, "cpu_bf16", lambda: "avx512_bf16")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan_module.check_precision(cfg, "cpu")
        plan_module.check_precision(learner_cfg(), "cpu")


# ----------------------------------------------------------------------------- log-probs where they are read
@pytest.mark.parametrize("constrain,obs_sft", [(False, False), (True, False), (False, True)])
def test_needed_positions_give_the_read_log_probs_and_the_same_update(env, constrain, obs_sft):
    from harness.rl.losses import head_positions

    cfg = learner_cfg(constrain=constrain, logprob_positions="needed")
    if obs_sft:
        raw = raw_config({**GRPO, "mask": False})
        raw["algo"]["obs_sft"] = {"coef": 0.1}
        raw["train"] = {**raw["train"], "learner": {"logprob_positions": "needed"}}
        cfg = validate_run_config(raw, "test")
    t = env.trainer(cfg)
    batch = env.batch(t, cfg)
    need = head_positions(batch, cfg, True)
    assert head_positions(batch, cfg, False) is None  # the default plan computes every position
    assert 0 < int(need.sum()) < int(batch.attention_mask[:, 1:].sum())  # some positions are skipped
    assert bool((need | ~batch.loss_mask.bool()).all()) and bool((need | ~batch.action_mask.bool()).all())
    plan = make_plan(cfg, 1, batch)
    assert plan.needed_positions
    every, only = behaviour_forward(t.policy, batch, cfg), behaviour_forward(t.policy, batch, cfg, plan)
    assert (every.old_logp - only.old_logp)[need].abs().max().item() < TOL
    assert (every.ref_logp - only.ref_logp)[need].abs().max().item() < TOL
    assert (only.old_logp[~need] == 0).all() and (only.entropy[~need] == 0).all()
    outside = ~need & batch.attention_mask.bool()
    outside[:, 0] = False  # position 0 has no log-prob on either path
    assert (every.old_logp[outside] != 0).any()  # the default plan did compute them: two paths compared
    plain, plain_w = _step(env, cfg, DEFAULT_PLAN)
    fast, fast_w = _step(env, cfg, make_plan(cfg, 1, env.batch(env.trainer(cfg), cfg)))
    keys = ["loss/policy", "loss/kl", "loss/total", "diag/kl_k3", "diag/entropy", "diag/grad_norm"]
    for key in keys + (["loss/obs_sft"] if obs_sft else []):
        assert fast[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
    assert (fast_w - plain_w).abs().max().item() < 1e-5
    assert fast["plan/needed_positions"] == 1


def test_keys_added_to_the_learner_later_leave_earlier_hashes_alone():
    """precision, logprob_positions, prefix_impl and padding_free came after runs with other train.learner values were
    written: at their defaults they are left out of the hash, so those runs keep their point ids."""
    cfg = learner_cfg(shared_prefix=True)
    dump = cfg.model_dump(mode="json")
    for key in ("precision", "logprob_positions", "prefix_impl", "padding_free"):
        del dump["train"]["learner"][key]  # the section as written before the four keys existed
    assert config_hash(cfg) == config_hash(dump)
    assert config_hash(learner_cfg(shared_prefix=True, precision="bfloat16")) != config_hash(cfg)
    assert config_hash(learner_cfg(shared_prefix=True, logprob_positions="needed")) != config_hash(cfg)
    assert config_hash(learner_cfg(shared_prefix=True, prefix_impl="kv_cache")) != config_hash(cfg)
    assert config_hash(learner_cfg(padding_free=True)) != config_hash(learner_cfg())
    assert "prefix_impl" in cfg.model_dump(mode="json")["train"]["learner"]  # the caller's dump is left whole


def test_prefix_impl_leaves_a_default_learner_default():
    """A default config is hashed without its train.learner section (the section at its default, prefix_impl
    included), and the learner stays default, so it logs no plan/* and keeps its point id."""
    cfg = learner_cfg()
    assert cfg.train.learner.prefix_impl == "packed" and cfg.train.learner.is_default
    dump = cfg.model_dump(mode="json")
    del dump["train"]["learner"]  # a default config's hash, before and after the key: without the section
    assert config_hash(cfg) == config_hash(dump)
    assert not learner_cfg(shared_prefix=True, prefix_impl="kv_cache").train.learner.is_default


KV_HEAD, FREE_HEAD = "train.learner.prefix_impl = 'kv_cache'", "train.learner.padding_free = true"


@pytest.mark.parametrize(
    "section,learner,named,head",
    [
        ({}, {"prefix_impl": "kv_cache"}, "with train.learner.shared_prefix = false", KV_HEAD),
        (
            {"gradient_checkpointing": True},
            {"shared_prefix": True, "prefix_impl": "kv_cache"},
            "gradient_checkpointing",
            KV_HEAD,
        ),
        ({}, {"padding_free": True, "shared_prefix": True}, "prefix_impl = 'packed'", FREE_HEAD),
        (
            {},
            {"padding_free": True, "shared_prefix": True, "prefix_impl": "kv_cache"},
            "prefix_impl = 'kv_cache'",
            FREE_HEAD,
        ),
        ({"gradient_checkpointing": True}, {"padding_free": True}, "gradient_checkpointing", FREE_HEAD),
    ],
)
def test_prefix_impl_and_padding_free_are_refused_where_they_cannot_run(section, learner, named, head):
    raw = raw_config(GRPO)
    raw["model"] = {**raw["model"], **section}
    raw["train"] = {**raw["train"], "learner": learner}
    with pytest.raises(ConfigError, match=named) as e:
        validate_run_config(raw, "test")
    assert head in str(e.value)


# ----------------------------------------------------------------------------- padding-free micro-batches
@pytest.mark.parametrize(
    "learner,layout",
    [({}, "padding_free"), ({"shared_prefix": True, "prefix_impl": "segmented"}, "segmented_padding_free")],
)
def test_the_padding_free_update_gives_the_padded_loss_step_and_micro_batches(env, learner, layout):
    """train.learner.padding_free: the same micro-batches as the padded path it replaces, each run as one packed
    row; the update's loss, diagnostics and step equal the plain update's within float rounding, and the run
    logs plan/padding_free (and plan/prefix_segmented with the shared prefix)."""
    cfg = learner_cfg(padding_free=True, **learner)
    padded_cfg = learner_cfg(**learner)
    plain, plain_w = _step(env, cfg, DEFAULT_PLAN)
    batch = env.batch(env.trainer(cfg), cfg)
    plan = make_plan(cfg, 1, batch)
    assert plan.prefix == layout
    free, free_w = _step(env, cfg, plan)
    for key in ("loss/policy", "loss/kl", "loss/total", "diag/kl_k3", "diag/entropy", "diag/grad_norm"):
        assert free[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
    start = _weights(env.trainer(cfg))
    assert (free_w - plain_w).abs().max().item() < 1e-5 < (plain_w - start).abs().max().item()
    extra = {"plan/padding_free"} | ({"plan/prefix_segmented"} if learner else set())
    assert {k for k in free if k.startswith("plan/")} == PLAN_KEYS | extra
    assert free["plan/padding_free"] == 1 and free["plan/shared_prefix"] == float(bool(learner))
    rows = torch.arange(batch.num_rows)
    padded = make_plan(padded_cfg, 1, batch).prefix
    for size, tokens in ((64, 1), (64, 0), (3, 0), (64, 256)):
        got = _micro_batches(batch, rows, size, tokens, prefix=layout)
        assert [m.tolist() for m in got] == [m.tolist() for m in _micro_batches(batch, rows, size, tokens, padded)]
