"""`rollout.constrain` over a real BPE vocabulary (SmolLM2's 49,152 tokens): admissible actions of
several tokens, actions that are prefixes of others, and the probabilities the sampler reports, checked
against a full forward pass of the same (random, real-vocabulary) Llama. docs/algorithms.md#chat-prompts."""

from __future__ import annotations

import math

import pytest
import torch

from envs.vector import VectorEnv
from harness.diagnostics.episode_metrics import episode_metrics
from harness.rl.engines.hf import KVBatch
from harness.rl.rollout import collect, generate_turn
from harness.rl.sampling import ActionTrie
from harness.transcript.chat import ChatFormat
from tests.helpers.real_model import smollm2_fixture  # noqa: F401 - the `smollm2` fixture
from tests.helpers.rollout import make_cfg
from tests.helpers.smollm2 import small_llama, tokenizer

COMMANDS = [  # ALFWorld / TextWorld commands; "go to cabinet 1" is a prefix of "go to cabinet 10"
    "go to cabinet 1",
    "go to cabinet 10",
    "go to countertop 2",
    "open cabinet 1",
    "take apple 1 from countertop 2",
    "put apple 1 in/on fridge 1",
    "unlock type J chest with type J keycard",
    "look",
    "inventory",
]
NUMBERS = [str(i) for i in range(1, 13)]  # the "choice" action format
T = 1.0


@pytest.fixture(scope="module")
def chat(smollm2):
    return ChatFormat(tokenizer(smollm2))


@pytest.fixture(scope="module")
def model(chat):
    return small_llama(len(chat.tokenizer), seed=1)


def _logprobs(model, ids: list[int]) -> torch.Tensor:
    """(len(ids), V) tempered log-probs of the next token after each position (one full forward)."""
    with torch.no_grad():
        return (model(input_ids=torch.tensor([ids])).logits[0].float() / T).log_softmax(-1)


def _allowed(chat, admissible: list[str], prefix: list[int]) -> list[int]:
    """The ids that may follow `prefix`: the next id of every admissible action's own tokenisation."""
    seqs = [chat.tokenizer.encode(a) + [chat.eot_id] for a in admissible]
    return sorted({s[len(prefix)] for s in seqs if s[: len(prefix)] == prefix and len(s) > len(prefix)})


def _sample(model, chat, admissible, rows=48):
    prompt = chat.prompt("Reply with one available action.", "Available actions: " + " | ".join(admissible))
    kv = KVBatch(model, chat.pad_id)
    kv.reset(rows)
    trie = ActionTrie([chat.action(a) for a in admissible])
    out = generate_turn(
        kv,
        [prompt] * rows,
        [trie] * rows,
        eot_id=chat.eot_id,
        max_new_tokens=24,
        temperature=T,
        top_p=1.0,
        greedy=False,
        generator=[torch.Generator().manual_seed(i) for i in range(rows)],
    )
    return prompt, out


@pytest.mark.parametrize("admissible", [COMMANDS, NUMBERS], ids=["commands", "numbers"])
def test_real_bpe_actions_round_trip_and_span_several_tokens(chat, admissible):
    tok = chat.tokenizer
    for a in admissible:
        assert tok.decode(tok.encode(a)) == a
        assert chat.decode_action(chat.action(a)) == a
    assert max(len(tok.encode(a)) for a in admissible) >= 2


@pytest.mark.parametrize("admissible", [COMMANDS, NUMBERS], ids=["commands", "numbers"])
def test_constrained_sampler_writes_only_admissible_actions(model, chat, admissible):
    _, out = _sample(model, chat, admissible)
    texts = [chat.decode_action(ids) for ids in out.ids]
    assert all(t in admissible for t in texts), texts
    assert all(ids == chat.action(t) for ids, t in zip(out.ids, texts))  # the action's own tokens + EOT
    assert not any(out.overflow)
    assert len(set(texts)) >= 4  # the random model spreads its choices: more than one path was taken
    if admissible is COMMANDS:
        assert {"go to cabinet 1", "go to cabinet 10"} & set(texts)


@pytest.mark.parametrize("admissible", [COMMANDS, NUMBERS], ids=["commands", "numbers"])
def test_reported_probabilities_are_the_models_over_the_admissible_tokens(model, chat, admissible):
    """Per token: the set drawn from is the admissible continuations (each a prefix of an action's
    text), the sampler's log-prob is the model's renormalised over that set, the raw one the model's."""
    prompt, out = _sample(model, chat, admissible, rows=16)
    tok = chat.tokenizer
    for ids, lps, raws, sets in zip(out.ids, out.logprobs, out.raw_logprobs, out.allowed):
        full = _logprobs(model, prompt + ids)
        for k, tid in enumerate(ids):
            allowed = _allowed(chat, admissible, ids[:k])
            assert sets[k] == allowed
            for t in allowed:  # in text: each allowed token keeps the reply on an admissible action
                text = tok.decode(ids[:k] + [t]) if t != chat.eot_id else None
                assert (
                    tok.decode(ids[:k]) in admissible
                    if t == chat.eot_id
                    else any(a.startswith(text) for a in admissible)
                )
            row = full[len(prompt) - 1 + k]
            assert raws[k] == pytest.approx(row[tid].item(), abs=1e-4)
            assert lps[k] == pytest.approx((row[tid] - row[allowed].logsumexp(0)).item(), abs=1e-4)


def test_constrained_policy_is_a_distribution_over_the_actions(model, chat):
    """Teacher-forcing every admissible action through the constrained policy: the action probabilities
    sum to 1, and each is the model's own probability of the action over the product of the per-token
    admissible masses Z (so mean over sampled actions of prod Z estimates the model's mass on them)."""
    prompt = chat.prompt("Reply with one available action.", "Available actions: " + " | ".join(COMMANDS))
    total_c, total = 0.0, 0.0
    for a in COMMANDS:
        ids = chat.action(a)
        full = _logprobs(model, prompt + ids)
        log_c, log_p, log_z = 0.0, 0.0, 0.0
        for k, tid in enumerate(ids):
            row, allowed = full[len(prompt) - 1 + k], _allowed(chat, COMMANDS, ids[:k])
            z = row[allowed].logsumexp(0).item()
            log_c, log_p, log_z = log_c + row[tid].item() - z, log_p + row[tid].item(), log_z + z
        assert log_p == pytest.approx(log_c + log_z, abs=1e-4)
        total_c, total = total_c + math.exp(log_c), total + math.exp(log_p)
    assert total_c == pytest.approx(1.0, abs=1e-4)
    assert 0 < total < 1


def test_constrained_mass_metric_on_a_frozenlake_rollout(model, chat):
    """Through the episode loop on FrozenLake's chat prompts: every action is a move, and
    `constrained_mass` is the mean over action tokens of the model's probability of the admissible set."""
    tasks = [(s, s) for s in range(4)]
    cfg = make_cfg(max_new_tokens=8, rollout__constrain=True, rollout__stop="line")
    cfg.turns.max = 3
    venv = VectorEnv("frozenlake", {"prompt": "chat"}, n=len(tasks))
    episodes = collect(
        model,
        chat,
        venv,
        tasks,
        cfg,
        generator=[torch.Generator().manual_seed(i) for i in range(len(tasks))],
        instructions=venv.instructions,
    )
    moves = ["up", "down", "left", "right"]
    masses = []
    for ep in episodes:
        stream: list[int] = []
        for s in ep.steps:
            assert s.action_text in moves and not s.format_error and s.action_ids == chat.action(s.action_text)
            stream += s.obs_ids
            full = _logprobs(model, stream + s.action_ids)
            for k in range(len(s.action_ids)):
                row = full[len(stream) - 1 + k]
                masses.append(row[_allowed(chat, moves, s.action_ids[:k])].logsumexp(0).exp().item())
            stream += s.action_ids
    got = episode_metrics(episodes, "x")["x/constrained_mass"]
    assert got == pytest.approx(sum(masses) / len(masses), abs=1e-5)
