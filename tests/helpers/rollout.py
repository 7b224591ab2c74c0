"""Rollouts without a trainer: a tiny chat format and Qwen2 model, fake environments with the
VectorEnv contract, and `run` = harness.rl.rollout.collect with the tests' defaults."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from envs.base import Env, ParsedAction, StepResult
from harness.config.schema import RunConfig
from harness.rl.rollout import collect
from harness.transcript.chat import EOS, IM_END, SPECIAL_TOKENS, ChatFormat

CORPUS = [
    "count the steps and answer go or stop",
    "go left go right ab ab abab cab",
    "You are counting. Say go until done.",
    "state 0 1 2 3 4 5 6 7 8 9 x y z ab",
    "stop go",
] * 20


def tiny_chat() -> ChatFormat:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return ChatFormat(PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=EOS))


# the shape of the rollout and engine tests' models
TINY_SHAPE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=2048,
)


def tiny_model(vocab: int, attn: str = "sdpa", seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, **TINY_SHAPE))
    model.config._attn_implementation = attn
    return model.eval()


class Biased(torch.nn.Module):
    """A causal LM plus a bigram bias table: logits[j] += table[input_ids[j]] (steers sampling)."""

    def __init__(self, inner, table: torch.Tensor):
        super().__init__()
        self.inner, self.table, self.config = inner, table, inner.config

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, input_ids, logits_to_keep=0, **kw):
        out = self.inner(input_ids=input_ids, logits_to_keep=logits_to_keep, **kw)
        k = out.logits.shape[1]
        out.logits = out.logits + self.table[input_ids[:, -k:]]
        return out


class CounterEnv(Env):
    """Episode of 1 + seed % 4 turns; observations of seed-dependent length; optional admissible list."""

    admissible_actions: list[str] | None = None
    fail_at: int | None = None

    @property
    def instructions(self) -> str:
        return "You are counting. Say go until done."

    def _obs(self) -> str:
        return f"state {self.k} " + "x y z " * ((self.seed + self.k) % 5)

    def _info(self, fmt=False):
        return {
            "won": self.k >= self.length,
            "score": self.k / self.length,
            "admissible": self.admissible_actions,
            "state_key": f"{self.seed}:{self.k}",
            "format_error": fmt,
        }

    def reset(self, seed):
        self.seed, self.k, self.length = seed, 0, 1 + seed % 4
        return self._obs(), self._info()

    def step(self, text):
        if self.fail_at is not None and self.k == self.fail_at:
            raise RuntimeError("interpreter crashed")
        self.k += 1
        done = self.k >= self.length
        return StepResult(self._obs(), 1.0 if done else 0.0, done, self._info(fmt="stop" in text))

    def parse_action(self, text):
        return ParsedAction(text.strip(), False)

    def expert_action(self):
        return "go"


class EndlessEnv(CounterEnv):
    def reset(self, seed):
        obs, info = super().reset(seed)
        self.length = 10**6
        return obs, self._info()


class FakeVectorEnv:
    """The VectorEnv contract: reset(seeds), step(actions with None = skip); exceptions -> env_error."""

    def __init__(self, cls, n, **attrs):
        self.envs = [cls() for _ in range(n)]
        for e in self.envs:
            for k, v in attrs.items():
                setattr(e, k, v)
        self.n = n
        self.instructions = self.envs[0].instructions

    def reset(self, seeds):
        return [e.reset(s) for e, s in zip(self.envs, seeds)]

    def step(self, actions):
        out = []
        for e, a in zip(self.envs, actions):
            if a is None:
                out.append(None)
                continue
            try:
                out.append(e.step(a))
            except Exception as exc:  # noqa: BLE001 - mirrors VectorEnv
                out.append(StepResult("", 0.0, True, {"env_error": repr(exc)}))
        return out


def eot_biased(chat, attn="sdpa", eot_bias=3.0):
    V = len(chat.tokenizer)
    table = torch.zeros(V, V)
    table[:, chat.eot_id] = eot_bias
    return Biased(tiny_model(V, attn), table)


def run(model, chat, tasks, cfg=None, env=CounterEnv, seed=0, **kw):
    cfg = cfg or make_cfg()
    venv = FakeVectorEnv(env, len(tasks), **kw.pop("env_attrs", {}))
    return collect(
        model,
        chat,
        venv,
        tasks,
        cfg,
        generator=torch.Generator().manual_seed(seed),
        instructions=venv.instructions,
        **kw,
    )


def make_cfg(**over) -> RunConfig:
    cfg = RunConfig()
    cfg.rollout.max_new_tokens = over.pop("max_new_tokens", 8)
    for key, value in over.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section), name, value)
    return cfg


def concatenated(ep):
    """The concatenated training sequence and (position predicting it, token, sampler log-prob)."""
    seq, targets = [], []
    for st in ep.steps:
        seq += st.obs_ids
        for a, lp in zip(st.action_ids, st.sampler_logprobs):
            targets.append((len(seq) - 1, a, lp))
            seq.append(a)
    return seq, targets


def full_forward_logprobs(model, seq, temperature):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq])).logits[0].float()  # (T, V)
    return (logits / temperature).log_softmax(-1)


def max_logprob_error(model, seq, targets, temperature):
    lps = full_forward_logprobs(model, seq, temperature)
    return max(abs(lps[p, a].item() - lp) for p, a, lp in targets)


TASKS = [(s, s // 3) for s in range(9)]  # 3 groups of 3; lengths 1..4 turns, ragged observations
