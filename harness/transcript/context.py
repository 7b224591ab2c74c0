"""Context policies (`context.policy`, docs/algorithms.md#turns): what the policy sees at each turn.

Every context is built from token-id segments, never from re-encoded history:

    system   <|im_start|>system\\n{instructions}<|im_end|>
    seg_t    chat.observation(shown observation t)  (\\n<|im_start|>user\\n...<|im_start|>assistant\\n)
    a_t      the action ids exactly as sampled

so that `system + seg_0` is the prompt (`chat.prompt`; `check_prompt_split` verifies the
tokenizer splits there). At turn t (0-based) the policies give:

    full          system seg_0 a_0 seg_1 a_1 ... seg_t                  (append-only)
    obs_truncate  the same, each observation cut to `context.obs_tokens`  (append-only; AgentRL)
                  tokens followed by the " [truncated]" marker
    window        system seg_j a_j ... seg_t with j = max(0, t - window): the last `window`
                  completed turns and the current observation (Agent-R1's sliding window)
    single        system seg_t   (verl-agent history_length 0)

Append-only policies reuse the KV cache across turns in the rollout engine; the others are
prefilled from scratch every turn and their StepRecords carry `context_ids` (per-step layout).
In every policy the context ends with the current observation segment (turn 0: the prompt).
"""

from __future__ import annotations

from algorithms.registry import Registry
from harness.config.schema import ContextConfig
from harness.transcript.chat import IM_END, IM_START, TRUNCATED, ChatFormat

CONTEXT_POLICIES = Registry("context.policy", "what the policy sees at each turn")
APPEND_ONLY = frozenset({"full", "obs_truncate"})


def system_ids(chat: ChatFormat, instructions: str) -> list[int]:
    """The system segment; `system_ids + chat.observation(o)` is the prompt of observation o."""
    return chat.encode(f"{IM_START}system\n{instructions}{IM_END}")


def check_prompt_split(chat: ChatFormat, instructions: str, observation: str) -> None:
    """Raise if the tokenizer merges across the special token that ends the system segment."""
    if system_ids(chat, instructions) + chat.observation(observation) != chat.prompt(instructions, observation):
        raise ValueError(
            "the tokenizer does not split the prompt at <|im_end|>: system segment + "
            "observation segment != chat.prompt(...); the rollout engine needs special "
            "tokens to be atomic (add them with special=True)"
        )


def truncate_observation(chat: ChatFormat, text: str, max_tokens: int) -> str:
    """`text` cut to its first `max_tokens` tokens (tokenized alone) plus " [truncated]".

    Returns `text` unchanged when it fits. The cut is made on ids and decoded back to text so
    that the observation segment is tokenized in its usual framing; the cut is shortened until
    the re-encoded body fits in `max_tokens` tokens.
    """
    ids = chat.encode_text(text)
    if len(ids) <= max_tokens:
        return text
    n = max_tokens
    while n > 0:
        head = chat.tokenizer.decode(ids[:n], skip_special_tokens=False)
        if len(chat.encode_text(head)) <= max_tokens:
            return head + TRUNCATED
        n -= 1
    return TRUNCATED.lstrip()


def shown_observation(chat: ChatFormat, text: str, ctx: ContextConfig) -> str:
    """The observation text as this policy shows it (obs_truncate cuts it)."""
    if ctx.policy == "obs_truncate":
        return truncate_observation(chat, text, ctx.obs_tokens)
    return text


def _interleave(system: list[int], segments: list[list[int]], actions: list[list[int]], first: int) -> list[int]:
    out = list(system)
    for j in range(first, len(segments)):
        out += segments[j]
        if j < len(actions):
            out += actions[j]
    return out


@CONTEXT_POLICIES.register(
    "full", doc="instructions and every observation and action so far (append-only; concatenated layout)"
)
def full_context(
    system: list[int], segments: list[list[int]], actions: list[list[int]], ctx: ContextConfig
) -> list[int]:
    """segments: t+1 observation segments (shown form); actions: the t earlier actions."""
    return _interleave(system, segments, actions, 0)


@CONTEXT_POLICIES.register(
    "obs_truncate",
    doc="full history with each observation cut to context.obs_tokens tokens plus a [truncated] marker",
    source="AgentRL (OS task)",
)
def obs_truncate_context(system, segments, actions, ctx):
    return _interleave(system, segments, actions, 0)  # segments are already cut (shown_observation)


@CONTEXT_POLICIES.register(
    "window",
    doc="instructions + the last context.window turns + the current observation",
    source="Agent-R1 (sliding window)",
)
def window_context(system, segments, actions, ctx):
    return _interleave(system, segments, actions, max(0, len(segments) - 1 - ctx.window))


@CONTEXT_POLICIES.register(
    "single", doc="instructions + the current observation only", source="verl-agent history_length 0"
)
def single_context(system, segments, actions, ctx):
    return list(system) + list(segments[-1])


def build_context(
    ctx: ContextConfig, system: list[int], segments: list[list[int]], actions: list[list[int]]
) -> list[int]:
    """The context ids the policy sees at turn len(segments) - 1."""
    if len(actions) != len(segments) - 1:
        raise ValueError(f"need one action per earlier turn: {len(segments)} segments, {len(actions)} actions")
    return CONTEXT_POLICIES.get(ctx.policy)(system, segments, actions, ctx)
