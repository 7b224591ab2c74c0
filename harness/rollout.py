"""The rollout engine: B episodes stepped in lock-step with batched generation.

`collect` plays one episode per task entry and returns one `Episode` per entry, each with one
`StepRecord` per turn holding the exact sampled ids and the sampler's log-probs. Generation
is our own loop (not HF `generate`): one forward per generated token for the whole active
batch; temperature / top-p / greedy / constrained decoding live in `harness.sampling`.

Token layout (harness.chat): turn 0's segment is the prompt, later turns append the
observation segment. Observations are tokenized once; action text is decoded only to be sent
to the environment. What the model saw is exactly the recorded ids:
  - append-only policies (full, obs_truncate): the concatenation of obs_ids and action_ids of
    all turns; each episode keeps its KV cache across turns and only the new tokens (the
    previous action's last token, not yet fed, plus the observation segment) are prefilled;
  - window / single: `StepRecord.context_ids` (prefilled from scratch each turn).
  obs_truncate also fills context_ids (the append-only context), for the per-step layout.

Batching with ragged rows (`KVBatch`): every row is a token stream in one shared cache with
left padding and holes (slots of rows that finished their action while others continued),
an explicit 4D attention mask (a key is visible when it is real and not in the future; every
slot sees itself so no softmax row is empty) and explicit position ids (real tokens before the
slot), so each row computes exactly what a single unpadded forward computes. Holes are
squeezed out between turns; finished episodes leave the batch.

Rewards: the environment's reward (its format penalty included); `turns.overflow_penalty` is
subtracted from a turn that hits `rollout.max_new_tokens` without the end-of-turn token, or
that is the last turn of an episode truncated by the turn budget (AgentRL: exceeding the max
response length or the max turns); at most once per turn.

ScalingInter-RL (AgentGym-RL): `turn_budget_at(update, cfg.turns)` gives the budget; at the
last allowed turn `turns.final_turn_note` (default with a curriculum: "Last turn: answer now.")
is appended to the observation on a new line, asking the agent for its final answer.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from harness.chat import ChatFormat
from harness.config import RunConfig, TurnsConfig
from harness.context import APPEND_ONLY, build_context, check_prompt_split, shown_observation, system_ids
from harness.records import Episode, StepRecord
from harness.sampling import ActionTrie, allowed_mask, draw

DEFAULT_FINAL_TURN_NOTE = "Last turn: answer now."


def turn_budget_at(update: int, turns: TurnsConfig) -> int:
    """ScalingInter-RL budget at `update` (0-based): h_1 < ... < h_N, one step every
    `curriculum_every` updates, then h_N; `turns.max` without a curriculum."""
    if not turns.curriculum:
        return turns.max
    return turns.curriculum[min(update // turns.curriculum_every, len(turns.curriculum) - 1)]


def final_turn_note(turns: TurnsConfig) -> str:
    """Text appended to the observation of the last allowed turn ('' = none)."""
    if turns.final_turn_note is not None:
        return turns.final_turn_note
    return DEFAULT_FINAL_TURN_NOTE if turns.curriculum else ""


# ----------------------------------------------------------------------------- batched KV cache
class KVBatch:
    """Rows of token streams sharing one DynamicCache: left padding, holes, explicit masks."""

    def __init__(self, model, pad_id: int):
        self.model, self.pad_id = model, pad_id
        emb = model.get_input_embeddings().weight
        self.device, self.dtype = emb.device, emb.dtype
        self.attn = model.config._attn_implementation
        if self.attn not in ("sdpa", "eager"):
            raise ValueError(f"the rollout engine needs attn_implementation 'sdpa' or 'eager' (explicit "
                             f"4D masks with holes), got {self.attn!r}")
        self.reset(0)

    def reset(self, rows: int) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.mask = torch.zeros(rows, 0, dtype=torch.bool, device=self.device)   # (B, T) real slots
        self.length = torch.zeros(rows, dtype=torch.long, device=self.device)   # (B,) real tokens

    def _layers(self):
        return [layer for layer in self.cache.layers if getattr(layer, "keys", None) is not None
                and layer.keys.numel() > 0]

    def select(self, rows: list[int]) -> None:
        """Keep `rows` (in this order) and squeeze out holes: real slots move right, padding left."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        mask, self.length = self.mask[idx], self.length[idx]
        T = int(self.length.max()) if len(rows) else 0
        # stable sort puts hole slots first, real slots after in their order: (B, T_old)
        order = torch.sort(mask.to(torch.int8), dim=1, stable=True).indices[:, mask.shape[1] - T:]
        self.mask = mask.gather(1, order)  # (B, T)
        for layer in self._layers():
            for name in ("keys", "values"):
                x = getattr(layer, name)[idx]  # (B, H, T_old, D)
                g = order[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3])
                setattr(layer, name, x.gather(2, g))

    def feed(self, ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """Append ids (B, L) whose slots are real where `real` (B, L); logits of the last slot (B, V)."""
        B, L = ids.shape
        Tc = self.mask.shape[1]
        keys = torch.cat([self.mask, real], dim=1)                          # (B, Tc+L)
        pos = (self.length[:, None] + real.long().cumsum(1) - 1).clamp(min=0)  # (B, L)
        q = torch.arange(L, device=self.device)[:, None] + Tc               # (L, 1)
        k = torch.arange(Tc + L, device=self.device)[None, :]               # (1, Tc+L)
        visible = (keys[:, None, :] & (k <= q)[None]) | (k == q)[None]      # (B, L, Tc+L)
        visible = visible[:, None]                                          # (B, 1, L, Tc+L)
        if self.attn == "eager":
            visible = torch.zeros(visible.shape, dtype=self.dtype, device=self.device).masked_fill(
                ~visible, torch.finfo(self.dtype).min)
        out = self.model(input_ids=ids, attention_mask=visible, position_ids=pos, cache=self.cache,
                         use_cache=True, logits_to_keep=1)
        self.mask, self.length = keys, self.length + real.long().sum(1)
        return out.logits[:, -1]

    def prefill(self, new_ids: list[list[int]]) -> torch.Tensor:
        """Append a ragged list of segments, left-padded; logits after each row's last token."""
        L = max(len(x) for x in new_ids)
        ids = torch.full((len(new_ids), L), self.pad_id, dtype=torch.long)
        real = torch.zeros(len(new_ids), L, dtype=torch.bool)
        for b, x in enumerate(new_ids):
            ids[b, L - len(x):] = torch.tensor(x, dtype=torch.long)
            real[b, L - len(x):] = True
        return self.feed(ids.to(self.device), real.to(self.device))


# ----------------------------------------------------------------------------- one turn
@dataclass
class TurnOutput:
    ids: list[list[int]]
    logprobs: list[list[float]]
    raw_logprobs: list[list[float] | None]   # unconstrained log-probs; None for unconstrained rows
    overflow: list[bool]


def generate_turn(kv: KVBatch, new_ids: list[list[int]], tries: list[ActionTrie | None] | None, *,
                  eot_id: int, max_new_tokens: int, temperature: float, top_p: float, greedy: bool,
                  generator: torch.Generator) -> TurnOutput:
    """Prefill `new_ids` (one segment per row) and sample one action per row."""
    logits = kv.prefill(new_ids)                                     # (B, V)
    B, V, dev = logits.shape[0], logits.shape[1], logits.device
    toks = torch.zeros(B, max_new_tokens, dtype=torch.long, device=dev)
    lps, raws = torch.zeros(B, max_new_tokens, device=dev), torch.zeros(B, max_new_tokens, device=dev)
    active = torch.ones(B, dtype=torch.bool, device=dev)
    length = torch.zeros(B, dtype=torch.long, device=dev)
    nodes = [t.root if t is not None and t.root else None for t in tries] if tries else None
    constrained = [n is not None for n in nodes] if nodes else [False] * B
    steps = 0
    for k in range(max_new_tokens):
        allowed = allowed_mask(nodes, V, dev) if nodes else None
        d = draw(logits, temperature=temperature, top_p=top_p, greedy=greedy, generator=generator,
                 allowed=allowed)
        toks[:, k], lps[:, k], raws[:, k] = d.tokens, d.logprobs, d.raw_logprobs
        length += active.long()
        active = active & (d.tokens != eot_id)
        steps = k + 1
        if nodes:
            nodes = [n[t] if n is not None and t != eot_id else None for n, t in zip(nodes, d.tokens.tolist())]
        if steps == max_new_tokens or not bool(active.any()):
            break
        logits = kv.feed(d.tokens[:, None], active[:, None])  # finished rows get a hole
    n = length.tolist()
    ids, lp, raw = toks[:, :steps].tolist(), lps[:, :steps].tolist(), raws[:, :steps].tolist()
    return TurnOutput(ids=[ids[b][:n[b]] for b in range(B)], logprobs=[lp[b][:n[b]] for b in range(B)],
                      raw_logprobs=[raw[b][:n[b]] if constrained[b] else None for b in range(B)],
                      overflow=[ids[b][n[b] - 1] != eot_id for b in range(B)])


# ----------------------------------------------------------------------------- episodes
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


def collect(model, chat: ChatFormat, venv, tasks: list[tuple[int, int]], cfg: RunConfig, *,
            generator: torch.Generator, instructions: str, turn_budget: int | None = None,
            greedy: bool = False, reuse_cache: bool = True, timings: list[dict] | None = None
            ) -> list[Episode]:
    """Play one episode per `tasks` entry (task seed, group id) in lock-step; return them in order.

    venv: a VectorEnv with exactly len(tasks) environments (`reset(seeds)`, `step(actions)`
    with None for environments whose episode has ended). turn_budget: defaults to turns.max
    (pass `turn_budget_at(update, cfg.turns)` for the curriculum). reuse_cache=False prefills
    append-only contexts from scratch every turn (benchmark baseline; same results).
    timings: if a list, one dict per turn is appended (rows, prefill tokens, generated tokens,
    seconds of generation). Deterministic given `generator` on CPU.
    """
    n_env = getattr(venv, "n", len(tasks))
    if n_env != len(tasks):
        raise ValueError(f"collect: the vector env holds {n_env} environments for {len(tasks)} tasks")
    budget = turn_budget if turn_budget is not None else cfg.turns.max
    ro, ctx, note = cfg.rollout, cfg.context, final_turn_note(cfg.turns)
    incremental = ctx.policy in APPEND_ONLY and reuse_cache
    episodes = [Episode(task_seed=s, group=g, instructions=instructions, turn_budget=budget) for s, g in tasks]
    obs, infos = map(list, zip(*venv.reset([s for s, _ in tasks])))
    system = system_ids(chat, instructions)
    check_prompt_split(chat, instructions, obs[0])
    segments: list[list[list[int]]] = [[] for _ in tasks]
    actions: list[list[list[int]]] = [[] for _ in tasks]
    alive = []
    for b, info in enumerate(infos):
        if (err := _env_error(info)) is not None:
            episodes[b].env_error = err
        else:
            alive.append(b)
    kv, encoded = KVBatch(model, chat.pad_id), {}
    kv.reset(len(alive))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for t in range(budget):
                if not alive:
                    break
                last = t == budget - 1
                contexts, new_ids = [], []
                for b in alive:
                    text = shown_observation(chat, obs[b], ctx) + (f"\n{note}" if last and note else "")
                    segments[b].append(chat.observation(text))
                    full = build_context(ctx, system, segments[b], actions[b]) if ctx.policy != "full" else None
                    contexts.append(full)
                    if incremental:
                        prev = actions[b][-1][-1:] if t > 0 else system
                        new_ids.append(prev + segments[b][-1])
                    else:
                        new_ids.append(full if full is not None else
                                       build_context(ctx, system, segments[b], actions[b]))
                if not incremental:
                    kv.reset(len(alive))
                tries = [_trie(chat, infos[b].get("admissible"), encoded) for b in alive] if ro.constrain else None
                t0 = time.perf_counter()
                out = generate_turn(kv, new_ids, tries, eot_id=chat.eot_id, max_new_tokens=ro.max_new_tokens,
                                    temperature=ro.temperature, top_p=ro.top_p, greedy=greedy, generator=generator)
                if timings is not None:
                    timings.append({"turn": t, "rows": len(alive), "prefill_tokens": sum(map(len, new_ids)),
                                    "new_tokens": sum(map(len, out.ids)), "seconds": time.perf_counter() - t0})
                texts = [chat.decode_action(ids) for ids in out.ids]
                row_of = {b: i for i, b in enumerate(alive)}
                results = venv.step([texts[row_of[b]] if b in row_of else None for b in range(len(tasks))])
                keep = []
                for i, b in enumerate(alive):
                    ended = _record(episodes[b], t, i, out, texts[i], contexts[i], segments[b], system,
                                    obs[b], infos[b], results[b], cfg.turns.overflow_penalty, last)
                    actions[b].append(out.ids[i])
                    if not ended:
                        obs[b], infos[b] = results[b].observation, results[b].info
                        keep.append(i)
                alive = [alive[i] for i in keep]
                if incremental and alive:
                    kv.select(keep)
    finally:
        model.train(was_training)
    return episodes


def _record(ep: Episode, t: int, i: int, out: TurnOutput, text: str, context: list[int] | None,
            segments: list[list[int]], system: list[int], observation: str, info_before: dict, res,
            penalty: float, last: bool) -> bool:
    """Append turn t's StepRecord to `ep`; finish the episode when it ends. Returns ended."""
    info = {k: v for k, v in res.info.items() if k != "admissible"}
    err = _env_error(res.info)
    done = bool(res.done) or err is not None
    truncated = last and not done
    overflow = out.overflow[i]
    reward = float(res.reward) - (penalty if (overflow or truncated) else 0.0)
    ep.steps.append(StepRecord(
        turn=t, obs_ids=(system + segments[-1]) if t == 0 else segments[-1], context_ids=context,
        action_ids=out.ids[i], sampler_logprobs=out.logprobs[i], action_text=text, observation=observation,
        reward=reward, done=done, overflow=overflow, format_error=bool(res.info.get("format_error", False)),
        state_key=str(info_before.get("state_key", "")), info=info,
        unconstrained_logprobs=out.raw_logprobs[i]))
    if done or truncated:
        ep.won, ep.score = bool(res.info.get("won", False)), float(res.info.get("score", 0.0))
        ep.truncated, ep.env_error = truncated, err
    return done or truncated
