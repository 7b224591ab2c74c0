"""What an update computes once, before any gradient step: the behaviour pass and the advantages.

    behaviour log-probs (the policy that sampled, recomputed in eval mode, or the sampler's own where
    the update plan says so), reference log-probs (adapter off, on the plan's schedule), critic values,
    full-vocabulary entropy                                      [behaviour_forward]
    -> advantages on the trajectory token stream, KL-in-reward applied to every reward form the
       estimators read, then the normalisation scope             [advantages]

docs/algorithms.md#advantages and #kl give the math.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import ADV_NORM, ADVANTAGE, KL_ESTIMATOR
from algorithms.types import AdvantageInputs
from algorithms.utils import turn_rewards_to_tokens
from harness.config.schema import RunConfig
from harness.model.logprobs import hidden_states, logprobs_from_hidden, token_logprobs
from harness.model.policy import values_from_hidden
from harness.rl.batch import TrainBatch, groups_shared, model_prefix, pack_units, prefix_units, row_groups
from harness.rl.losses import head_positions, on_device, policy_forward
from harness.rl.plan import DEFAULT_PLAN, UpdatePlan


@dataclass
class Forward:
    """Per-row tensors (B, T) computed once at the start of an update, without gradients.

    entropy: full-vocabulary entropy of the tempered behaviour policy at every token;
    entropy_constrained: the same restricted to the admissible set (constrained decoding), or None."""

    old_logp: torch.Tensor
    ref_logp: torch.Tensor | None  # None in an update whose plan skips the reference
    old_values: torch.Tensor | None
    entropy: torch.Tensor
    entropy_constrained: torch.Tensor | None = None


def forward_slices(batch: TrainBatch, size: int, tokens: int, prefix: str | None = None) -> list[torch.Tensor]:
    """Row groups of a no-gradient pass: `size` rows in order, or packed by length under a token budget
    (algo.micro_batch_tokens; rows are independent here, so each row is its own unit). With a shared
    prefix (`prefix` shares groups, the update plan's), whole groups packed by their packed length (`prefix_units`)."""
    if groups_shared(prefix):
        units, lengths = prefix_units(batch, list(range(batch.num_rows)))
        return [torch.tensor(sorted(g)) for g in pack_units(units, lengths, size, tokens)]
    lengths = [int(x) for x in batch.attention_mask.sum(1).tolist()]
    return [torch.tensor(g) for g in row_groups(lengths, size, tokens)]


def _reference_logp(
    policy,
    mb: TrainBatch,
    temperature: float,
    prefix: str | None = None,
    need: torch.Tensor | None = None,
) -> torch.Tensor:
    with policy.reference() as ref_model:
        dev = next(ref_model.parameters()).device
        rlp, _ = token_logprobs(
            ref_model,
            on_device(mb.input_ids, dev),
            on_device(mb.attention_mask, dev),
            temperature=temperature,
            allowed=on_device(mb.allowed, dev),
            prefix=model_prefix(mb, prefix),
            token_mask=on_device(need, dev),
        )
    return rlp.to(mb.input_ids.device)


def _constrained_forward(
    policy,
    mb: TrainBatch,
    temperature: float,
    with_values: bool,
    prefix: str | None,
    need: torch.Tensor,
):
    """Under constrained decoding: log-probs and entropy of the constrained policy, the
    full-vocabulary entropy and the values (or None), from ONE backbone pass. The two heads read
    the same hidden states, so this computes exactly what two separate passes computed, without
    running the backbone twice. `prefix`: the update plan's shared prefix (`policy_forward`)."""
    home, dev = mb.input_ids.device, next(policy.model.parameters()).device
    ids, attn, allowed = on_device(mb.input_ids, dev), on_device(mb.attention_mask, dev), on_device(mb.allowed, dev)
    hidden = hidden_states(policy.model, ids, attn, model_prefix(mb, prefix))  # (B, T, H)
    need = on_device(need, dev)
    lp, ent_c = logprobs_from_hidden(
        policy.model, hidden, ids, attn, temperature=temperature, with_entropy=True, allowed=allowed, token_mask=need
    )
    _, ent = logprobs_from_hidden(
        policy.model, hidden, ids, attn, temperature=temperature, with_entropy=True, token_mask=need
    )
    v = values_from_hidden(policy.value_head, hidden, attn) if with_values else None
    return on_device(lp, home), on_device(ent_c, home), on_device(ent, home), on_device(v, home)


@torch.no_grad()
def behaviour_forward(policy, batch: TrainBatch, cfg: RunConfig, plan: UpdatePlan = DEFAULT_PLAN) -> Forward:
    """Behaviour and reference log-probs (and values, entropies) over all rows, as `plan` says
    (harness.rl.plan): recomputed in eval mode (LoRA dropout off), so the behaviour policy is the
    deterministic policy that sampled, or taken from the sampler. The reference runs in every update
    whose plan has it: KL to it is a diagnostic (diag/kl_*) even when no KL term is trained."""
    if plan.behaviour in ("sampler", "first_forward"):
        return _sampler_forward(policy, batch, cfg, plan)
    was_training = policy.model.training
    policy.model.eval()
    parts: dict[str, list[torch.Tensor]] = {"old": [], "ref": [], "val": [], "ent": [], "ent_c": []}
    T = batch.input_ids.shape[1]
    temperature = cfg.rollout.temperature
    slices = forward_slices(batch, cfg.algo.micro_batch_size, cfg.algo.micro_batch_tokens, plan.prefix)
    for idx in slices:
        mb = batch.rows(idx)
        pad = (0, T - mb.input_ids.shape[1])
        ent_c = None
        need = head_positions(mb, cfg, plan.needed_positions)  # the positions whose log-probs the update reads
        if mb.allowed is None:
            lp, ent, v = policy_forward(
                policy,
                mb,
                temperature=temperature,
                with_entropy=True,
                with_values=cfg.algo.critic.enabled,
                prefix=plan.prefix,
                token_mask=need,
            )
        else:  # the constrained policy's entropy and the full-vocabulary one, from one backbone pass
            lp, ent_c, ent, v = _constrained_forward(
                policy, mb, temperature, cfg.algo.critic.enabled, plan.prefix, need
            )
        ref = _reference_logp(policy, mb, temperature, plan.prefix, need) if plan.reference else None
        for key, x in (("old", lp), ("ref", ref), ("val", v), ("ent", ent), ("ent_c", ent_c)):
            if x is not None:
                parts[key].append(torch.nn.functional.pad(x, pad))
    policy.model.train(was_training)
    order = torch.cat(slices).argsort()  # back to row order (the identity without a token budget)

    def cat(xs: list[torch.Tensor]) -> torch.Tensor | None:
        return torch.cat(xs, 0)[order] if xs else None

    return Forward(cat(parts["old"]), cat(parts["ref"]), cat(parts["val"]), cat(parts["ent"]), cat(parts["ent_c"]))


def _sampler_forward(policy, batch: TrainBatch, cfg: RunConfig, plan: UpdatePlan) -> Forward:
    """The Forward of the sampler path: the sampler's log-probs and entropies on the action tokens (0
    elsewhere; every consumer masks by the action or loss mask, and the config keeps observation tokens
    out of the loss), and the reference pass alone when the plan has it. Under first_forward the behaviour
    log-probs are not known yet: a zero (B, T) tensor that the update fills with each micro-batch's training
    forward (harness.rl.update)."""
    ref = None
    if plan.reference:
        was_training = policy.model.training
        policy.model.eval()
        T = batch.input_ids.shape[1]
        slices = forward_slices(batch, cfg.algo.micro_batch_size, cfg.algo.micro_batch_tokens, plan.prefix)
        refs = []
        for idx in slices:
            mb = batch.rows(idx)
            refs.append(
                _reference_logp(
                    policy,
                    mb,
                    cfg.rollout.temperature,
                    plan.prefix,
                    head_positions(mb, cfg, plan.needed_positions),
                )
            )
        parts = [torch.nn.functional.pad(x, (0, T - x.shape[1])) for x in refs]
        policy.model.train(was_training)
        ref = torch.cat(parts, 0)[torch.cat(slices).argsort()]
    m = batch.action_mask
    entropy = batch.to_rows(batch.stream_entropy) * m
    constrained = None
    if batch.allowed is not None:
        constrained = batch.to_rows(batch.stream_entropy_constrained) * m
    old = batch.sampler_logp * m if plan.behaviour == "sampler" else torch.zeros_like(batch.sampler_logp)
    return Forward(old, ref, None, entropy, constrained)


def _turn_sums(x_stream: torch.Tensor, turn: torch.Tensor, K: int) -> torch.Tensor:
    """Per-turn sums (N, K) of a stream quantity (N, Ts); tokens with turn -1 are left out."""
    out = torch.zeros(x_stream.shape[0], K + 1, dtype=x_stream.dtype)
    return out.scatter_add_(1, torch.where(turn >= 0, turn, K), x_stream)[:, :K]


def advantages(batch: TrainBatch, fwd: Forward, cfg: RunConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Advantages on the rows (B, T) and critic returns (B, T) or None.

    KL in the reward (`algo.kl.where: reward`) lowers every reward form an estimator can read by the
    same penalty: per-token rewards by beta * KL_k, per-turn rewards by beta times the turn's summed
    KL, and the outcome R_i by beta times the trajectory's summed KL (verl sums its token-level
    rewards into the outcome score the same way), so it reaches grpo, rloo, gigpo and the rest."""
    a = cfg.algo
    token_rewards = turn_rewards_to_tokens(batch.turn_rewards, batch.stream_turn, batch.stream_mask)
    rewards, turn_rewards = batch.rewards, batch.turn_rewards
    if a.kl.where == "reward" and a.kl.estimator != "none":
        kl = a.kl.coef * batch.to_stream(
            KL_ESTIMATOR.get(a.kl.estimator)(fwd.old_logp, fwd.ref_logp) * batch.action_mask
        )
        token_rewards = token_rewards - kl  # (N, Ts)
        turn_rewards = turn_rewards - _turn_sums(kl, batch.stream_turn, turn_rewards.shape[1])  # (N, K)
        rewards = rewards - kl.sum(1)  # (N,)
    inputs = AdvantageInputs(
        mask=batch.stream_mask,
        turn_index=batch.stream_turn,
        rewards=rewards,
        group=batch.group,
        turn_rewards=turn_rewards,
        turn_mask=batch.turn_mask,
        task=batch.task,
        env=batch.env,
        anchor=batch.anchor,
        token_rewards=token_rewards,
        values=batch.to_stream(fwd.old_values) if fwd.old_values is not None else None,
    )
    params = a.adv.params
    out = ADVANTAGE.get(a.adv.estimator)(inputs, params)
    adv = ADV_NORM.get(a.adv.norm)(out.advantages, inputs, params)
    returns = batch.to_rows(out.returns) if out.returns is not None else None
    return batch.to_rows(adv), returns
