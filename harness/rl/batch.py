"""Training sequences from rollout records: layouts, masks, and the trajectory stream.

Two token forms are kept side by side:
- the *stream*: one row per trajectory, the append-only concatenation
  prompt, a_1, o_2, a_2, ... (N, Ts). Advantage estimators read it (docs/algorithms.md#advantages works on
  trajectories), and in the concatenated layout it is also the training row.
- the *rows*: what the model is trained on (B, T). Concatenated layout: rows = stream.
  Per-step layout: one row per turn = the exact context the policy saw + that turn's action.
`stream_pos (B,T)` maps each trained row token to its stream token, so per-trajectory
quantities (advantages, KL-in-reward) move between the two forms by one gather / scatter.

Masks (docs/algorithms.md#layout): `action_mask` = 1 on policy-emitted tokens (EOT included). With
`mask_observations=False` the loss mask also covers observation segments after the prompt,
each counted once (per-step: the observation right before the action); the prompt
(instructions + first observation) is never trained on. A trained observation token belongs
to the action it precedes: it takes the advantage of that action's first token and its
`action_id` (so sequence-level ratios never pool observations of different actions).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace

import torch

from harness.model.logprobs import PADDING_FREE, SEGMENTED_PADDING_FREE, common_prefix
from harness.transcript.records import Episode

LONG = torch.long


def _pad(rows: list[list], value, dtype) -> torch.Tensor:
    T = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), max(T, 1)), value, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def pack_by_tokens(units: list[list[int]], lengths: list[int], budget: int) -> list[list[int]]:
    """Token-budget micro-batches (`algo.micro_batch_tokens`): the units (lists of row indices, kept
    together) are taken longest first and packed greedily while rows x longest row <= `budget`; a unit
    over the budget gets a pass of its own. Sorting by length is what removes the padding."""
    order = sorted(range(len(units)), key=lambda u: -lengths[u])  # stable: ties keep their order
    out: list[list[int]] = []
    cur: list[int] = []
    cur_len = 0
    for u in order:
        rows = len(cur) + len(units[u])
        if cur and rows * max(cur_len, lengths[u]) > budget:
            out.append(cur)
            cur, cur_len = [], 0
        cur = cur + units[u]
        cur_len = max(cur_len, lengths[u])
    return out + ([cur] if cur else [])


def row_groups(lengths: list[int], size: int, tokens: int) -> list[list[int]]:
    """Rows of a no-gradient pass, each row its own unit: `size` rows at a time in order, or, with a
    token budget (`tokens` > 0, algo.micro_batch_tokens), packed by length (`pack_by_tokens`); each
    group in row order."""
    if tokens <= 0:
        return [list(range(k, min(k + size, len(lengths)))) for k in range(0, len(lengths), size)]
    return [sorted(p) for p in pack_by_tokens([[k] for k in range(len(lengths))], lengths, tokens)]


def prefix_keys(batch: TrainBatch) -> torch.Tensor:
    """(B,) the group of each row's trajectory: the rows that share a prompt (train.learner.shared_prefix)."""
    return batch.group[batch.traj_id.max(1).values]


def model_prefix(batch: TrainBatch, prefix: str | None) -> tuple[torch.Tensor, str] | None:
    """The model's `prefix` argument (harness.model.logprobs.hidden_states) for the rows of `batch`: their
    `prefix_keys` (B,) and `prefix`, the update plan's layout (train.learner.prefix_impl, padding_free), or None
    where the plan shares no prefix and pads (the default). Under the padding-free layout without a shared
    prefix every row is a key of its own: a sequence alone in the packed row."""
    if prefix is None:
        return None
    if prefix == PADDING_FREE:
        return torch.arange(batch.num_rows), prefix
    return prefix_keys(batch), prefix


def groups_shared(prefix: str | None) -> bool:
    """Whether the update plan's layout `prefix` shares a group's prefix, so that micro-batches hold whole
    groups (`prefix_units`); the plain padded layout and the padding-free one without a shared prefix keep
    the rows' own micro-batches."""
    return prefix is not None and prefix != PADDING_FREE


def shared_impl(prefix: str | None) -> str | None:
    """The train.learner.prefix_impl with which the layout `prefix` shares a group's prefix (None: it shares none)."""
    return prefix.removesuffix("_padding_free") if groups_shared(prefix) else None


def is_padding_free(prefix: str | None) -> bool:
    """Whether the layout `prefix` runs each micro-batch as one unpadded row (train.learner.padding_free)."""
    return prefix in (PADDING_FREE, SEGMENTED_PADDING_FREE)


def prefix_units(batch: TrainBatch, rows: list[int], units: list[list[int]] | None = None):
    """The rows' units for a shared-prefix pass: `units` (lists of positions into `rows`; default each row
    its own) merged by group, and each merged unit's packed length (its rows' common prefix once plus
    every row's rest): what one packed sequence costs (harness.model.logprobs.shared_prefix_hidden_states).
    Under train.learner.prefix_impl kv_cache the same count is the tokens its two passes run (the prefix once,
    then the rests), so it serves as the cost of either; only attention's share of the cost differs."""
    keys = prefix_keys(batch)[rows].tolist()
    merged: dict[int, list[int]] = {}
    for unit in units if units is not None else [[k] for k in range(len(rows))]:
        merged.setdefault(keys[unit[0]], []).extend(unit)
    out, lengths = list(merged.values()), []
    for unit in out:
        idx = torch.tensor([rows[k] for k in unit])
        n = batch.attention_mask[idx].sum(1)
        P = common_prefix(batch.input_ids[idx], n)
        lengths.append(P + int((n - P).sum()))
    return out, lengths


def pack_units(units: list[list[int]], lengths: list[int], size: int, tokens: int) -> list[list[int]]:
    """Micro-batches of packed units (each becomes one sequence): longest first, while units x longest
    <= `tokens` (algo.micro_batch_tokens), or, without a token budget, while the rows stay <= `size`;
    a unit over the budget gets a pass of its own."""
    order = sorted(range(len(units)), key=lambda u: -lengths[u])
    out: list[list[int]] = []
    cur: list[int] = []
    n_units, cur_len = 0, 0
    for u in order:
        over = (n_units + 1) * max(cur_len, lengths[u]) > tokens if tokens > 0 else len(cur) + len(units[u]) > size
        if cur and over:
            out.append(cur)
            cur, n_units, cur_len = [], 0, 0
        cur, n_units, cur_len = cur + units[u], n_units + 1, max(cur_len, lengths[u])
    return out + ([cur] if cur else [])


def state_id(key: str) -> int:
    """Stable integer id of an environment state key (GiGPO anchor), same in every process."""
    return zlib.crc32(key.encode("utf-8"))


@dataclass
class _Stream:
    ids: list[int]
    action: list[int]  # 1 on action tokens
    turn: list[int]  # turn of action tokens, -1 elsewhere
    obs_turn: list[int]  # turn an observation token precedes (trainable obs), -1 elsewhere
    action_start: list[int]  # stream position of the first token of each turn's action
    sampler_logp: list[float]
    allowed: list[list[int] | None]  # constrained decoding: ids each action token was drawn from
    # the sampler's entropies on action tokens (0 elsewhere); None when a step did not record them
    entropy: list[float] | None
    entropy_constrained: list[float] | None


def episode_stream(ep: Episode) -> _Stream:
    recorded = all(st.sampler_entropy is not None for st in ep.steps)
    s = _Stream([], [], [], [], [], [], [], [] if recorded else None, [] if recorded else None)
    for t, st in enumerate(ep.steps):
        obs_turn = t if t > 0 else -1  # the prompt (turn 0's observation) is never trained on
        s.ids += st.obs_ids
        s.action += [0] * len(st.obs_ids)
        s.turn += [-1] * len(st.obs_ids)
        s.obs_turn += [obs_turn] * len(st.obs_ids)
        s.sampler_logp += [0.0] * len(st.obs_ids)
        s.allowed += [None] * len(st.obs_ids)
        if recorded:
            s.entropy += [0.0] * len(st.obs_ids)
            s.entropy_constrained += [0.0] * len(st.obs_ids)
            s.entropy += list(st.sampler_entropy)
            s.entropy_constrained += list(st.sampler_entropy_constrained or st.sampler_entropy)
        s.action_start.append(len(s.ids))
        s.ids += st.action_ids
        s.action += [1] * len(st.action_ids)
        s.turn += [t] * len(st.action_ids)
        s.obs_turn += [-1] * len(st.action_ids)
        s.sampler_logp += list(st.sampler_logprobs)
        s.allowed += list(st.allowed_ids) if st.allowed_ids is not None else [None] * len(st.action_ids)
    return s


@dataclass
class TrainBatch:
    # rows (B, T)
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor  # float: trained tokens
    action_mask: torch.Tensor  # float: policy-emitted tokens
    action_id: torch.Tensor  # unique id per turn-action (on its tokens and on the trained observation
    # tokens that precede it), -1 elsewhere
    traj_id: torch.Tensor  # trajectory index (0..N-1) of each token, -1 on padding
    sampler_logp: torch.Tensor  # sampler log-probs on action tokens, 0 elsewhere
    stream_pos: torch.Tensor  # flat index into the (N, Ts) stream for trained tokens, -1 elsewhere
    allowed: torch.Tensor | None  # (B, T, K) constrained decoding: ids each token was drawn from,
    # -1 padding (all -1 = unconstrained); None when nothing was constrained
    # stream (N, Ts) and per-trajectory fields
    stream_mask: torch.Tensor  # action tokens of the stream
    stream_turn: torch.Tensor  # turn index of stream action tokens, -1 elsewhere
    rewards: torch.Tensor  # (N,) trajectory return
    turn_rewards: torch.Tensor  # (N, K) per-turn rewards (outcome included at its turn)
    turn_mask: torch.Tensor  # (N, K)
    group: torch.Tensor  # (N,)
    task: torch.Tensor  # (N,)
    env: torch.Tensor  # (N,)
    anchor: torch.Tensor  # (N, K) state ids before each turn
    concatenated: bool
    # (B, T) float: the observation tokens observation SFT trains on (`algo.obs_sft`): segments after
    # the prompt, each once, not those following a format error; None in hand-made batches
    obs_mask: torch.Tensor | None = None
    # (N, Ts) on-policy distillation (`algo.distill`, harness.rl.distill): the teacher's log-probs of the
    # distilled action tokens and their mask; None when distillation is off
    teacher_logp: torch.Tensor | None = None
    distill_mask: torch.Tensor | None = None
    # (N, Ts) the sampler's entropies on the stream's action tokens (over the vocabulary; over the set
    # drawn from), 0 elsewhere; None when some step was sampled by an engine that does not record them
    stream_entropy: torch.Tensor | None = None
    stream_entropy_constrained: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    def to_rows(self, x_stream: torch.Tensor) -> torch.Tensor:
        """(N, Ts) -> (B, T): each trained row token takes its stream token's value, 0 elsewhere."""
        flat = x_stream.reshape(-1)
        pos = self.stream_pos.clamp(min=0)
        return torch.where(self.stream_pos >= 0, flat[pos], torch.zeros((), dtype=flat.dtype))

    def to_stream(self, x_rows: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (N, Ts): scatter trained action-token values back (each stream token once)."""
        out = torch.zeros(self.stream_mask.numel(), dtype=x_rows.dtype)
        sel = (self.stream_pos >= 0) & self.action_mask.bool()
        out[self.stream_pos[sel]] = x_rows[sel]
        return out.view_as(self.stream_mask)

    def rows(self, idx: torch.Tensor) -> TrainBatch:
        """A row subset (mini- or micro-batch), trimmed to its longest row."""
        T = int(self.attention_mask[idx].sum(1).max().item()) if len(idx) else 1
        row_fields = (
            "input_ids",
            "attention_mask",
            "loss_mask",
            "action_mask",
            "action_id",
            "traj_id",
            "sampler_logp",
            "stream_pos",
            "allowed",
            "obs_mask",
        )
        return replace(self, **{f: getattr(self, f)[idx, :T] for f in row_fields if getattr(self, f) is not None})


def build_batch(
    episodes: list[Episode],
    *,
    concatenated: bool,
    mask_observations: bool,
    pad_id: int,
    task_ids: list[int] | None = None,
    env_ids: list[int] | None = None,
    drop_forced: bool = False,
    drop_stale: bool = False,
) -> TrainBatch:
    """Assemble rows and the stream from episodes (ids only: nothing is re-tokenized).

    task_ids / env_ids (N,): the task type and environment of each episode (`adv.norm` task and
    env_std). drop_forced: leave the tokens constrained decoding forced (a single admissible
    continuation) out of the loss mask (`algo.forced_tokens: drop`). drop_stale: leave the actions a
    stale cross-policy member generated (and their trained observation tokens) out of the loss mask
    (`rollout.cross_policy.train_on: current`)."""
    streams = [episode_stream(ep) for ep in episodes]
    Ts = max(len(s.ids) for s in streams)
    rows: dict[str, list[list]] = {k: [] for k in ("ids", "loss", "act", "aid", "traj", "slp", "pos", "allow", "obs")}
    next_action = 0
    for i, (ep, s) in enumerate(zip(episodes, streams)):
        trainable_obs = [0 if mask_observations else int(o >= 0) for o in s.obs_turn]
        # observation SFT (ECHO): observations after the prompt, except the environment's complaint
        # about a malformed action (the observation after a format error)
        world = [t > 0 and not ep.steps[t - 1].format_error for t in range(len(ep.steps))]
        if concatenated:
            rows["obs"].append([int(o > 0 and world[o]) for o in s.obs_turn])
            # a trained observation token belongs to the action it precedes (one ratio segment)
            aid = [
                next_action + t if t >= 0 else next_action + o if tr else -1
                for t, o, tr in zip(s.turn, s.obs_turn, trainable_obs)
            ]
            pos = [i * Ts + k if (s.action[k] or trainable_obs[k]) else -1 for k in range(len(s.ids))]
            # observation tokens point at the first token of the action they precede
            pos = [i * Ts + s.action_start[s.obs_turn[k]] if trainable_obs[k] else p for k, p in enumerate(pos)]
            _append_row(
                rows,
                s.ids,
                [max(a, o) for a, o in zip(s.action, trainable_obs)],
                s.action,
                aid,
                i,
                s.sampler_logp,
                pos,
                s.allowed,
            )
        else:
            for t, st in enumerate(ep.steps):
                ctx = st.context_ids if st.context_ids is not None else s.ids[: s.action_start[t]]
                n_obs = min(len(st.obs_ids), len(ctx)) if (t > 0 and not mask_observations) else 0
                L, A = len(ctx), len(st.action_ids)
                n_world = min(len(st.obs_ids), L) if world[t] else 0
                rows["obs"].append([0] * (L - n_world) + [1] * n_world + [0] * A)
                loss = [0] * (L - n_obs) + [1] * n_obs + [1] * A
                act = [0] * L + [1] * A
                aid = [-1] * (L - n_obs) + [next_action + t] * (n_obs + A)
                start = i * Ts + s.action_start[t]
                pos = [-1] * (L - n_obs) + [start] * n_obs + list(range(start, start + A))
                _append_row(
                    rows,
                    ctx + st.action_ids,
                    loss,
                    act,
                    aid,
                    i,
                    [0.0] * L + list(st.sampler_logprobs),
                    pos,
                    [None] * L + s.allowed[s.action_start[t] :][:A],
                )
        next_action += len(ep.steps)
    batch = _finish(episodes, streams, rows, Ts, concatenated, pad_id, task_ids, env_ids)
    if drop_stale:
        batch = without_actions(batch, stale_actions(episodes))
    return without_forced(batch) if drop_forced else batch


def stale_actions(episodes: list[Episode]) -> list[int]:
    """Action ids (numbered over the batch's episodes and turns, as `TrainBatch.action_id`) of the
    turns a stale cross-policy member generated."""
    out, base = [], 0
    for ep in episodes:
        out += [base + t for t, st in enumerate(ep.steps) if st.member > 0]
        base += len(ep.steps)
    return out


def without_actions(batch: TrainBatch, action_ids: list[int]) -> TrainBatch:
    """The batch with every token of these actions out of the loss mask."""
    if not action_ids:
        return batch
    drop = torch.isin(batch.action_id, torch.tensor(action_ids, dtype=batch.action_id.dtype))
    return replace(batch, loss_mask=batch.loss_mask * ~drop)


def _append_row(rows, ids, loss, act, aid, traj, slp, pos, allow) -> None:
    for key, val in zip(
        ("ids", "loss", "act", "aid", "traj", "slp", "pos", "allow"),
        (ids, loss, act, aid, [traj] * len(ids), slp, pos, allow),
    ):
        rows[key].append(val)


def _pad_allowed(rows: list[list[list[int] | None]]) -> torch.Tensor | None:
    """(B, T, K) ids per position (-1 padding), or None when no position was constrained."""
    K = max((len(a) for r in rows for a in r if a is not None), default=0)
    if K == 0:
        return None
    T = max(len(r) for r in rows)
    out = torch.full((len(rows), T, K), -1, dtype=LONG)
    for b, r in enumerate(rows):
        for t, a in enumerate(r):
            if a:
                out[b, t, : len(a)] = torch.tensor(a, dtype=LONG)
    return out


def forced_tokens(batch: TrainBatch) -> torch.Tensor:
    """(B, T) bool: tokens that were the only admissible continuation under constrained decoding."""
    if batch.allowed is None:
        return torch.zeros_like(batch.loss_mask, dtype=torch.bool)
    return (batch.allowed >= 0).sum(-1) == 1


def without_forced(batch: TrainBatch) -> TrainBatch:
    """The batch with forced tokens out of the loss mask (they carry log-prob 0 and no gradient, so
    this only changes aggregation denominators and sequence-level ratio lengths)."""
    return replace(batch, loss_mask=batch.loss_mask * ~forced_tokens(batch))


def _finish(episodes, streams, rows, Ts, concatenated, pad_id, task_ids, env_ids) -> TrainBatch:
    N = len(episodes)
    K = max(max(ep.num_turns for ep in episodes), 1)
    turn_rewards = _pad([[st.train_reward for st in ep.steps] for ep in episodes], 0.0, torch.float32)
    turn_mask = _pad([[1] * ep.num_turns for ep in episodes], 0, LONG)
    anchor = _pad([[state_id(st.state_key) for st in ep.steps] for ep in episodes], 0, LONG)
    ids = rows["ids"]
    return TrainBatch(
        input_ids=_pad(ids, pad_id, LONG),
        attention_mask=_pad([[1] * len(r) for r in ids], 0, LONG),
        loss_mask=_pad(rows["loss"], 0, torch.float32),
        action_mask=_pad(rows["act"], 0, torch.float32),
        action_id=_pad(rows["aid"], -1, LONG),
        traj_id=_pad(rows["traj"], -1, LONG),
        sampler_logp=_pad(rows["slp"], 0.0, torch.float32),
        stream_pos=_pad(rows["pos"], -1, LONG),
        obs_mask=_pad(rows["obs"], 0, torch.float32),
        # only constrained rollouts carry admissible sets: skip the per-token scan otherwise
        allowed=(
            _pad_allowed(rows["allow"])
            if any(st.allowed_ids is not None for ep in episodes for st in ep.steps)
            else None
        ),
        stream_mask=_pad([s.action for s in streams], 0, torch.float32)[:, :Ts],
        stream_turn=_pad([s.turn for s in streams], -1, LONG)[:, :Ts],
        rewards=torch.tensor([ep.train_return for ep in episodes], dtype=torch.float32),
        turn_rewards=turn_rewards[:, :K],
        turn_mask=turn_mask[:, :K],
        anchor=anchor[:, :K],
        group=torch.tensor([ep.group for ep in episodes], dtype=LONG),
        task=torch.tensor(task_ids if task_ids is not None else [0] * N, dtype=LONG),
        env=torch.tensor(env_ids if env_ids is not None else [0] * N, dtype=LONG),
        concatenated=concatenated,
        stream_entropy=_stream_field(streams, "entropy", Ts),
        stream_entropy_constrained=_stream_field(streams, "entropy_constrained", Ts),
    )


def _stream_field(streams: list[_Stream], name: str, Ts: int) -> torch.Tensor | None:
    """(N, Ts) float stream field, or None when some episode lacks it."""
    vals = [getattr(s, name) for s in streams]
    return None if any(v is None for v in vals) else _pad(vals, 0.0, torch.float32)[:, :Ts]
