"""The episode loop: B episodes stepped in lock-step with batched generation.

`collect` plays one episode per task entry and returns one `Episode` per entry, each with one
`StepRecord` per turn holding the exact sampled ids and the sampler's log-probs. Generation
is our own loop (not HF `generate`, `generate_turn`): one forward per generated token for the whole
active batch on a KV engine (`harness.rl.engines`: hf, static); temperature / top-p / greedy /
constrained decoding live in `harness.rl.sampling`. A turn sampler (vLLM, `sample_turn`) samples
whole turns itself.

Token layout (harness.transcript.chat): turn 0's segment is the prompt, later turns append the
observation segment. Observations are tokenized once; action text is decoded only to be sent
to the environment. What the model saw is exactly the recorded ids:
  - append-only policies (full, obs_truncate): the concatenation of obs_ids and action_ids of
    all turns; each episode keeps its KV cache across turns and only the new tokens (the
    previous action's last token, not yet fed, plus the observation segment) are prefilled;
  - window / single: `StepRecord.context_ids` (prefilled from scratch each turn).
  obs_truncate also fills context_ids (the append-only context), for the per-step layout.

Rows are ragged (left padding, holes for rows that finished their action; the KV engine's contract,
`harness.rl.engines.base`); finished episodes leave the batch between turns.

Rewards: the environment's reward (its format penalty included); `turns.overflow_penalty` is
subtracted from a turn that hits `rollout.max_new_tokens` without the end-of-turn token, or
that is the last turn of an episode truncated by the turn budget (AgentRL: exceeding the max
response length or the max turns); at most once per turn.

The turn budget and the note on the last allowed turn: `harness.rl.turns` (ScalingInter-RL).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from harness.config.schema import RunConfig
from harness.rl.engines import kv_batch
from harness.rl.engines.base import KVEngine, TurnOutput
from harness.rl.engines.hf import KVBatch, prefill_shared
from harness.rl.sampling import ActionTrie, allowed_mask, draw
from harness.rl.turns import final_turn_note
from harness.transcript.chat import ChatFormat, LineEnds, first_line
from harness.transcript.context import APPEND_ONLY, build_context, check_prompt_split, shown_observation, system_ids
from harness.transcript.records import Episode, StepRecord


# ----------------------------------------------------------------------------- one turn
def _row_uniforms(generators: list[torch.Generator], active: torch.Tensor) -> torch.Tensor:
    """(B,) float64: a number from each active row's own stream; finished rows draw nothing."""
    u = torch.full((len(generators),), 0.5, dtype=torch.float64)
    for b in active.nonzero().flatten().tolist():
        u[b] = torch.rand((), generator=generators[b], dtype=torch.float64)
    return u


@dataclass
class CrossPolicy:
    """Cross-policy sampling (AgentRL, `rollout.cross_policy`): each (episode, turn) action comes from
    the current policy or, with probability `prob`, from one of the stale `members` drawn uniformly;
    the draws use `generator` (seeded per update by the trainer)."""

    members: list  # stale policies (modules), member j + 1 = members[j]
    prob: float
    generator: torch.Generator

    def draw(self, rows: int) -> list[int]:
        """The member of each live row for this turn: 0 = the current policy, j >= 1 a stale one."""
        stale = torch.rand(rows, generator=self.generator) < self.prob
        which = torch.randint(1, len(self.members) + 1, (rows,), generator=self.generator)
        return torch.where(stale, which, torch.zeros_like(which)).tolist()


def generate_turn(
    kv: KVEngine,
    new_ids: list[list[int]],
    tries: list[ActionTrie | None] | None,
    *,
    eot_id: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    greedy: bool,
    generator: torch.Generator | list[torch.Generator],
    line_ends: LineEnds | None = None,
    with_entropy: bool = False,
    share: bool = False,
) -> TurnOutput:
    """Prefill `new_ids` (one segment per row) and sample one action per row.

    generator: one stream for the whole batch, or one per row (common random numbers: a row draws
    one number from its own stream per token it generates, so its tokens never depend on the other
    rows). line_ends (`rollout.stop: line`): a row also stops at the token that ends its first line
    of text, kept whole (docs/algorithms.md#chat-prompts). with_entropy: also each token's entropies
    (`TurnOutput.entropy`, for train.learner.behaviour: sampler). share (rollout.share_prefix, into an empty
    cache): rows with the same segment prefill it once (`harness.rl.engines.hf.prefill_shared`)."""
    logits = prefill_shared(kv, new_ids) if share else kv.prefill(new_ids)  # (B, V)
    B, V, dev = logits.shape[0], logits.shape[1], logits.device
    toks = torch.zeros(B, max_new_tokens, dtype=torch.long, device=dev)
    lps, raws = torch.zeros(B, max_new_tokens, device=dev), torch.zeros(B, max_new_tokens, device=dev)
    ents, ents_c = torch.zeros(B, max_new_tokens, device=dev), torch.zeros(B, max_new_tokens, device=dev)
    active = torch.ones(B, dtype=torch.bool, device=dev)
    length = torch.zeros(B, dtype=torch.long, device=dev)
    ended = torch.zeros(B, dtype=torch.bool, device=dev)  # stopped before max_new_tokens
    if line_ends is not None and line_ends.vocab != V:
        raise ValueError(f"line_ends covers {line_ends.vocab} token ids, the model's logits {V}")
    lines = line_ends.to(dev) if line_ends is not None else None
    wrote = torch.zeros(B, dtype=torch.bool, device=dev)  # the row has written text (line stop)
    nodes = [t.root if t is not None and t.root else None for t in tries] if tries else None
    constrained = [n is not None for n in nodes] if nodes else [False] * B
    sets: list[list[list[int]]] = [[] for _ in range(B)]
    steps = 0
    for k in range(max_new_tokens):
        allowed = allowed_mask(nodes, V, dev) if nodes else None
        if nodes:
            for b, node in enumerate(nodes):
                if constrained[b]:
                    sets[b].append(sorted(node) if node is not None else [])
        shared, u = (
            (generator, None) if isinstance(generator, torch.Generator) else (None, _row_uniforms(generator, active))
        )
        d = draw(
            logits,
            temperature=temperature,
            top_p=top_p,
            greedy=greedy,
            generator=shared,
            allowed=allowed,
            uniforms=u,
            with_entropy=with_entropy,
        )
        toks[:, k], lps[:, k], raws[:, k] = d.tokens, d.logprobs, d.raw_logprobs
        if with_entropy:
            ents[:, k], ents_c[:, k] = d.entropy, d.entropy_constrained
        length += active.long()
        stop = d.tokens == eot_id
        if lines is not None:
            ends, wrote = lines.step(d.tokens, wrote)
            stop |= ends
        ended |= active & stop
        active = active & ~stop
        steps = k + 1
        if nodes:
            nodes = [n[t] if n is not None and t != eot_id else None for n, t in zip(nodes, d.tokens.tolist())]
        if steps == max_new_tokens or not bool(active.any()):
            break
        logits = kv.feed(d.tokens[:, None], active[:, None])  # finished rows get a hole
    n = length.tolist()
    ids, lp, raw = toks[:, :steps].tolist(), lps[:, :steps].tolist(), raws[:, :steps].tolist()
    ent, ent_c = (ents[:, :steps].tolist(), ents_c[:, :steps].tolist()) if with_entropy else (None, None)
    return TurnOutput(
        ids=[ids[b][: n[b]] for b in range(B)],
        logprobs=[lp[b][: n[b]] for b in range(B)],
        raw_logprobs=[raw[b][: n[b]] if constrained[b] else None for b in range(B)],
        overflow=(~ended).tolist(),
        allowed=[sets[b][: n[b]] if constrained[b] else None for b in range(B)],
        entropy=[ent[b][: n[b]] for b in range(B)] if ent is not None else None,
        entropy_constrained=[ent_c[b][: n[b]] for b in range(B)] if ent_c is not None else None,
    )


# ----------------------------------------------------------------------------- episodes


@torch.no_grad()
def sample_prompts(
    model,
    chat: ChatFormat,
    rows: list[list[int]],
    generators: list[torch.Generator],
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    greedy: bool = False,
) -> TurnOutput:
    """One turn for each prompt in `rows` (token ids) from a fresh KV batch, in eval mode (the model's
    mode is restored), one sampling stream per row: the single-turn generations of the model judge
    and of ACT's sampled actions."""
    was_training = model.training
    model.eval()
    try:
        kv = KVBatch(model, chat.pad_id)
        kv.reset(len(rows))
        return generate_turn(
            kv,
            rows,
            None,
            eot_id=chat.eot_id,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            greedy=greedy,
            generator=generators,
        )
    finally:
        model.train(was_training)


def _trie(chat: ChatFormat, admissible, cache: dict[str, list[int]]) -> ActionTrie | None:
    if not admissible:
        return None
    for a in admissible:
        if a not in cache:
            cache[a] = chat.action(a)
    return ActionTrie([cache[a] for a in admissible])


def _env_error(info: dict) -> str | None:
    err = info.get("env_error")
    return None if err in (None, False, "") else str(err)


@dataclass
class _Play:
    """One episode in progress: its record, the current observation and the segments so far."""

    episode: Episode
    obs: str
    info: dict
    segments: list[list[int]]  # observation segments as shown (observation format, turn 0 included)
    actions: list[list[int]]  # sampled action ids
    stream: torch.Generator | None = None  # the episode's own sampling stream (common random numbers)
    system: list[int] = field(default_factory=list)  # the system segment (a mixture's differ per member)
    close: list[int] = field(default_factory=list)  # the end-of-turn id closing the last action (stop: line)


def collect(
    model,
    chat: ChatFormat,
    venv,
    tasks: list[tuple[int, int]],
    cfg: RunConfig,
    *,
    generator: torch.Generator | list[torch.Generator],
    instructions: str,
    turn_budget: int | None = None,
    greedy: bool = False,
    reuse_cache: bool = True,
    timings: list[dict] | None = None,
    cross: CrossPolicy | None = None,
    record_entropy: bool = False,
) -> list[Episode]:
    """Play one episode per `tasks` entry (task seed, group id) in lock-step; return them in order.

    venv: a VectorEnv with exactly len(tasks) environments (`reset(seeds)`, `step(actions)`
    with None for environments whose episode has ended). turn_budget: defaults to turns.max
    (pass `harness.rl.turns.turn_budget_at(update, cfg.turns)` for the curriculum). reuse_cache=False prefills
    append-only contexts from scratch every turn (benchmark baseline; same results).
    timings: if a list, one dict per turn is appended (rows, prefill tokens, generated tokens,
    seconds of generation). Deterministic given `generator` on CPU: one stream shared by the batch,
    or one per task entry (each episode then samples from its own stream). An episode whose reset
    reports info["env_error"] comes back with no steps and `env_error` set.
    cross: cross-policy sampling; each turn the live rows are split by their drawn member and each
    member generates for its rows from the full context (no KV reuse across turns, since the other
    members' actions are not in a member's cache).
    record_entropy: our sampler also records each action token's entropies (StepRecord.sampler_entropy),
    which train.learner.behaviour: sampler reads; off elsewhere, as they cost two passes over the
    vocabulary a token.
    """
    n_env = getattr(venv, "n", len(tasks))
    if n_env != len(tasks):
        raise ValueError(f"collect: the vector env holds {n_env} environments for {len(tasks)} tasks")
    budget = turn_budget if turn_budget is not None else cfg.turns.max
    streams = generator if isinstance(generator, list) else [None] * len(tasks)
    plays = [
        _Play(
            Episode(task_seed=s, group=g, instructions=info.get("instructions", instructions), turn_budget=budget),
            obs,
            info,
            [],
            [],
            gen,
        )
        for (s, g), (obs, info), gen in zip(tasks, venv.reset([s for s, _ in tasks]), streams)
    ]
    systems: dict[str, list[int]] = {}  # one system segment per distinct instructions (env.mixture)
    for p in plays:
        if p.episode.instructions not in systems:
            systems[p.episode.instructions] = system_ids(chat, p.episode.instructions)
            check_prompt_split(chat, p.episode.instructions, p.obs)
        p.system = systems[p.episode.instructions]
    for p in plays:
        p.episode.env_error = _env_error(p.info)
    alive = [p for p in plays if p.episode.env_error is None]
    pooled = cross is not None and bool(cross.members)
    # an engine outside torch (rollout.backend vllm) samples a turn from each row's whole context
    # and reuses prefixes itself; everything else runs on one of our KV engines
    external = getattr(model, "sample_turn", None)
    incremental = cfg.context.policy in APPEND_ONLY and reuse_cache and not pooled and external is None
    kv, encoded = (None if external else kv_batch(model, chat.pad_id, cfg.rollout.backend)), {}
    if kv is not None:
        kv.reset(len(alive))
    was_training = bool(getattr(model, "training", False))
    if external is None:
        model.eval()
    try:
        with torch.no_grad():
            for t in range(budget):
                if not alive:
                    break
                last = t == budget - 1
                contexts, new_ids = _turn_inputs(chat, cfg, alive, t, last, incremental)
                if not incremental and kv is not None:
                    kv.reset(len(alive))
                tries = (
                    [_trie(chat, p.info.get("admissible"), encoded) for p in alive] if cfg.rollout.constrain else None
                )
                t0 = time.perf_counter()
                sample = {
                    "eot_id": chat.eot_id,
                    "max_new_tokens": cfg.rollout.max_new_tokens,
                    "temperature": cfg.rollout.temperature,
                    "top_p": cfg.rollout.top_p,
                    "greedy": greedy,
                }
                if cfg.rollout.stop == "line":  # refused with the vLLM engine (config check)
                    sample["line_ends"] = chat.line_ends(model.config.vocab_size)
                streams_now = generator if isinstance(generator, torch.Generator) else [p.stream for p in alive]
                if external is not None:
                    out = external(new_ids, tries, generator=streams_now, **sample)
                elif pooled:
                    out = _pooled_turn(
                        model, cross, chat.pad_id, new_ids, tries, streams_now, sample, cfg.rollout.backend
                    )
                else:
                    # the cache is empty in the first turn, and in every turn of a context rebuilt each turn
                    share = cfg.rollout.share_prefix and (t == 0 or not incremental)
                    out = generate_turn(
                        kv, new_ids, tries, generator=streams_now, with_entropy=record_entropy, share=share, **sample
                    )
                if timings is not None:
                    timings.append(
                        {
                            "turn": t,
                            "rows": len(alive),
                            "prefill_tokens": sum(map(len, new_ids)),
                            "new_tokens": sum(map(len, out.ids)),
                            "seconds": time.perf_counter() - t0,
                        }
                    )
                texts = [chat.decode_action(ids) for ids in out.ids]
                sent = [first_line(x) for x in texts] if cfg.rollout.stop == "line" else texts
                row = {id(p): i for i, p in enumerate(alive)}
                results = venv.step([sent[row[id(p)]] if id(p) in row else None for p in plays])
                results = [r for p, r in zip(plays, results) if id(p) in row]  # aligned with alive
                keep = [
                    i
                    for i, p in enumerate(alive)
                    if not _record(p, t, i, out, texts[i], contexts[i], results[i], cfg.turns.overflow_penalty, last)
                ]
                alive = [alive[i] for i in keep]
                if incremental and alive:
                    kv.select(keep)
    finally:
        if external is None:
            model.train(was_training)
    return [p.episode for p in plays]


def _pooled_turn(
    model, cross: CrossPolicy, pad_id: int, new_ids, tries, streams, sample: dict, backend: str = "hf"
) -> TurnOutput:
    """One turn of cross-policy sampling: draw each row's member, let each member generate for its
    rows from their full contexts, and put the rows back in order (`TurnOutput.members`)."""
    who = cross.draw(len(new_ids))
    parts: dict[int, tuple[list[int], TurnOutput]] = {}
    for m in sorted(set(who)):
        rows = [i for i, w in enumerate(who) if w == m]
        kv = kv_batch(model if m == 0 else cross.members[m - 1], pad_id, backend)
        kv.reset(len(rows))
        gen = streams if isinstance(streams, torch.Generator) else [streams[i] for i in rows]
        sub_tries = [tries[i] for i in rows] if tries else None
        parts[m] = (rows, generate_turn(kv, [new_ids[i] for i in rows], sub_tries, generator=gen, **sample))
    merged: dict[str, list] = {k: [None] * len(who) for k in ("ids", "logprobs", "raw_logprobs", "overflow", "allowed")}
    for rows, out in parts.values():
        for j, i in enumerate(rows):
            for k in merged:
                vals = getattr(out, k)
                merged[k][i] = vals[j] if vals is not None else None
    any_allowed = any(out.allowed for _, out in parts.values())
    return TurnOutput(
        ids=merged["ids"],
        logprobs=merged["logprobs"],
        raw_logprobs=merged["raw_logprobs"],
        overflow=merged["overflow"],
        allowed=merged["allowed"] if any_allowed else None,
        members=who,
    )


def _turn_inputs(
    chat: ChatFormat, cfg: RunConfig, alive: list[_Play], t: int, last: bool, incremental: bool
) -> tuple[list, list[list[int]]]:
    """Append turn t's shown observation segment to every live episode; return the contexts to
    record (None for policy full) and the ids to prefill (new tokens only when incremental).

    `rollout.stop: line`: an action that did not end with the end-of-turn token is closed by one, put
    before the next observation segment as template text (never trained as an action token)."""
    note = final_turn_note(cfg.turns)
    contexts, new_ids = [], []
    for p in alive:
        text = shown_observation(chat, p.obs, cfg.context) + (f"\n{note}" if last and note else "")
        p.segments.append(chat.observation(text))
        p.close = _closing(chat, cfg, p.actions[-1]) if t > 0 else []
        context = None
        if cfg.context.policy != "full" or not incremental:
            actions = [a + _closing(chat, cfg, a) for a in p.actions]
            context = build_context(cfg.context, p.system, p.segments, actions)
        contexts.append(None if cfg.context.policy == "full" else context)
        # incremental: the previous action's last token was sampled but never fed
        new_ids.append(
            (p.actions[-1][-1:] + p.close if t > 0 else p.system) + p.segments[-1] if incremental else context
        )
    return contexts, new_ids


def _closing(chat: ChatFormat, cfg: RunConfig, action: list[int]) -> list[int]:
    """[end-of-turn id] when `rollout.stop: line` and `action` did not end with it, else []."""
    return [chat.eot_id] if cfg.rollout.stop == "line" and action[-1:] != [chat.eot_id] else []


def _record(
    p: _Play,
    t: int,
    i: int,
    out: TurnOutput,
    text: str,
    context: list[int] | None,
    res,
    penalty: float,
    last: bool,
) -> bool:
    """Append turn t's StepRecord; advance or finish the episode. Returns True when it ended."""
    ep, info = p.episode, {k: v for k, v in res.info.items() if k != "admissible"}
    err = _env_error(res.info)
    env_truncated = bool(res.info.get("truncated", False)) and err is None  # VectorEnv max_turns
    done = (bool(res.done) and not env_truncated) or err is not None
    truncated = env_truncated or (last and not done)
    overflow = out.overflow[i]
    reward = float(res.reward) - (penalty if (overflow or truncated) else 0.0)
    ep.steps.append(
        StepRecord(
            turn=t,
            obs_ids=(p.system + p.segments[-1]) if t == 0 else p.close + p.segments[-1],
            context_ids=context,
            action_ids=out.ids[i],
            sampler_logprobs=out.logprobs[i],
            action_text=text,
            observation=p.obs,
            reward=reward,
            done=done,
            overflow=overflow,
            format_error=bool(res.info.get("format_error", False)),
            state_key=str(p.info.get("state_key", "")),
            info=info,
            unconstrained_logprobs=out.raw_logprobs[i],
            allowed_ids=out.allowed[i] if out.allowed else None,
            member=out.members[i] if out.members else 0,
            sampler_entropy=out.entropy[i] if out.entropy is not None else None,
            sampler_entropy_constrained=out.entropy_constrained[i] if out.entropy_constrained is not None else None,
            score_before=None if p.info.get("score") is None else float(p.info["score"]),
        )
    )
    p.actions.append(out.ids[i])
    if done or truncated:
        ep.won, ep.score = bool(res.info.get("won", False)), float(res.info.get("score", 0.0))
        ep.truncated, ep.env_error, ep.final_observation = truncated, err, res.observation
        return True
    p.obs, p.info = res.observation, res.info
    return False
