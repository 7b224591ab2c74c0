"""Step judges and process rewards (docs/algorithms.md#process-rewards).

A judge reads one step, (state, action, next state), and returns a vote in {+1, 0, -1}; with m votes
per step the step's vote is their majority (a tie gives 0). Two kinds behind one interface:

- `RuleJudge`: the environment's own state, cheap and deterministic. -1 when the action could not be
  parsed (the environment answered with an error); otherwise the sign of the change of the
  environment's progress score (`Env.score`: FrozenLake 1 - distance to the goal / start distance,
  TextWorld points or progress, ALFWorld and tool use their subgoal share), so a step toward the goal
  is +1, a step away or into a hole -1, a step that changes nothing 0.
- `ModelJudge`: a frozen causal LM prompted with `JUDGE_INSTRUCTIONS` + the step, m sampled answers,
  each parsed for its first "+1", "-1" or "0" (anything else is 0), then the majority. Batched like
  the rollout (one KV-cached batch for every vote of every step). Prompts, answers and votes go to
  samples.jsonl.

Process rewards (OpenClaw-RL's evaluative signal; Wang et al. 2026, `openclaw-combine`), `reward.process: judge`:
- form `episode`: R = outcome + w * mean_t(vote_t), the bonus on the last step (SWE-PRM);
- form `step`: r_t += w * vote_t (for step-level estimators).
The bonus is kept apart from the environment's reward (`StepRecord.process_reward`): env/* metrics
stay the environment's, the group filter and the advantages see the sum (`train_reward`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from harness.config.schema import JudgeConfig, RunConfig
from harness.rl.rollout import sample_prompts
from harness.transcript.records import Episode

JUDGE_INSTRUCTIONS = (
    "You judge one step of an agent. Read the state, the agent's action and the next state. "
    "Answer +1 if the action made progress toward the goal, -1 if it did not or caused an error, "
    "0 if you cannot tell. Then, optionally, write Hint: and what the agent should have known."
)
VOTE = re.compile(r"[+-]1|0")
HINT = re.compile(r"Hint:\s*(.+)", re.DOTALL)
JUDGE_STREAM_SALT = 0x10D6_E5A1  # keeps the judge's sampling streams apart from every other stream


@dataclass(frozen=True)
class Step:
    """What a judge sees of one turn."""

    state: str
    action: str
    next_state: str | None  # None: the episode ended without a next observation being shown
    format_error: bool
    score_before: float | None
    score_after: float | None


@dataclass
class Verdict:
    vote: int  # majority of `votes`
    votes: list[int]
    answers: list[str] = field(default_factory=list)  # model judge: the raw answers
    prompt: str | None = None  # model judge: the prompt text
    hint: str | None = None  # hindsight hint for on-policy distillation (algo.distill), None = no usable hint

    def row(self) -> dict:
        out: dict = {"vote": self.vote, "votes": self.votes}
        if self.prompt is not None:
            out.update(prompt=self.prompt, answers=self.answers)
        if self.hint is not None:
            out["hint"] = self.hint
        return out


def majority(votes: list[int]) -> int:
    """The most frequent vote; 0 on a tie between +1 and -1 (or any tie involving 0)."""
    counts = {v: votes.count(v) for v in (1, 0, -1)}
    best = max(counts.values())
    winners = [v for v, c in counts.items() if c == best]
    return winners[0] if len(winners) == 1 else 0


def parse_vote(text: str) -> int:
    m = VOTE.search(text)
    return int(m.group()) if m else 0


def parse_hint(text: str) -> str | None:
    m = HINT.search(text)
    hint = " ".join(m.group(1).split()) if m else ""
    return hint or None


def rule_hint(vote: int, action: str, format_error: bool) -> str | None:
    """What the rule judge knows in hindsight about a step, as a sentence for the teacher's context;
    None for a step that changed nothing (no information: the step leaves the distillation term)."""
    if format_error:
        return f"'{action}' is not a valid action here."
    if vote > 0:
        return f"the action '{action}' brings you closer to the goal."
    if vote < 0:
        return f"the action '{action}' takes you away from the goal."
    return None


def episode_steps(ep: Episode) -> list[Step]:
    """The judge's view of every turn of `ep` (next state = the following turn's observation, or the
    final observation when the episode recorded it)."""
    out = []
    for t, s in enumerate(ep.steps):
        nxt = ep.steps[t + 1].observation if t + 1 < len(ep.steps) else ep.final_observation
        out.append(Step(s.observation, s.action_text, nxt, s.format_error, s.score_before, _float(s.info.get("score"))))
    return out


def _float(x) -> float | None:
    return None if x is None else float(x)


class RuleJudge:
    name = "rule"

    def __init__(self, cfg: JudgeConfig):
        self.m = cfg.votes  # a rule gives the same vote every time: m copies, the same majority

    def __call__(self, steps: list[Step], key: tuple[int, ...] = ()) -> list[Verdict]:
        out = []
        for s in steps:
            if s.format_error:
                v = -1
            elif s.score_before is None or s.score_after is None:
                v = 0
            else:
                d = s.score_after - s.score_before
                v = 1 if d > 1e-12 else -1 if d < -1e-12 else 0
            out.append(Verdict(v, [v] * self.m, hint=rule_hint(v, s.action, s.format_error)))
        return out


class ModelJudge:
    """A frozen causal LM as the judge. `frozen()` is a context manager that yields the model in eval mode
    under no_grad (the policy's reference: adapter off; or a model of its own); it is never trained."""

    name = "model"

    def __init__(
        self, cfg: JudgeConfig, frozen: Callable[[], AbstractContextManager], chat, seed: int, own_model: bool = False
    ):
        self.cfg, self.frozen, self.chat, self.seed = cfg, frozen, chat, seed
        self.own_model = own_model  # a model of its own (reward.judge.model), not the policy's reference

    def prompt_text(self, s: Step) -> str:
        nxt = s.next_state if s.next_state is not None else "(the episode ended)"
        return f"State:\n{s.state}\nAction: {s.action}\nNext state:\n{nxt}\nAnswer (+1, -1 or 0):"

    @torch.no_grad()
    def __call__(self, steps: list[Step], key: tuple[int, ...] = ()) -> list[Verdict]:
        """`key` (update, rollout round) seeds one sampling stream per answer row, so the answers are
        reproducible, survive a resume, and do not depend on the rest of the batch."""
        if not steps:
            return []
        m, cfg = self.cfg.votes, self.cfg
        texts = [self.prompt_text(s) for s in steps]
        rows = [self.chat.prompt(JUDGE_INSTRUCTIONS, t) for t in texts for _ in range(m)]
        gens = [
            torch.Generator().manual_seed(
                int(np.random.SeedSequence([JUDGE_STREAM_SALT, self.seed, *key, i]).generate_state(1)[0])
            )
            for i in range(len(rows))
        ]
        with self.frozen() as model:
            out = sample_prompts(
                model,
                self.chat,
                rows,
                gens,
                max_new_tokens=cfg.max_new_tokens,
                temperature=max(cfg.temperature, 1e-6),
                greedy=cfg.temperature == 0,
            )
        answers = [self.chat.decode_action(ids) for ids in out.ids]
        verdicts = []
        for k, text in enumerate(texts):
            mine = answers[k * m : (k + 1) * m]
            votes = [parse_vote(a) for a in mine]
            vote = majority(votes)
            # OpenClaw-RL keeps the longest hint among the answers that agree with the verdict
            hints = [h for a, v in zip(mine, votes) if v == vote and (h := parse_hint(a))]
            verdicts.append(Verdict(vote, votes, mine, text, max(hints, key=len) if hints else None))
        return verdicts


def process_bonus(votes: list[int], weight: float, form: str) -> list[float]:
    """Per-turn process reward of one episode from its step votes (see the module docstring)."""
    if not votes:
        return []
    if form == "step":
        return [weight * v for v in votes]
    return [0.0] * (len(votes) - 1) + [weight * sum(votes) / len(votes)]


def judge_episodes(judge, episodes: list[Episode], cfg: RunConfig, key: tuple[int, ...] = ()) -> None:
    """Judge every turn of `episodes` in one batch; set each StepRecord's `judge` row and `process_reward`."""
    spans, steps = [], []
    for ep in episodes:
        s = episode_steps(ep)
        spans.append((len(steps), len(steps) + len(s)))
        steps += s
    verdicts = judge(steps, key)
    r = cfg.reward
    on = r.process == "judge"  # otherwise the judge runs for its hints only (algo.distill)
    for ep, (a, b) in zip(episodes, spans):
        mine = verdicts[a:b]
        for st, v, bonus in zip(ep.steps, mine, process_bonus([v.vote for v in mine], r.weight, r.form)):
            st.judge, st.process_reward = v.row(), (bonus if on else 0.0)


def process_metrics(episodes: list[Episode]) -> dict[str, float]:
    """reward/*: shares of +1 and -1 step votes, the mean process reward per episode, and the share of
    episodes whose judged return ranks differently from the outcome (sign of disagreement)."""
    votes = [s.judge["vote"] for e in episodes for s in e.steps if s.judge is not None]
    n = max(len(votes), 1)
    return {
        "reward/vote_pos_frac": sum(v > 0 for v in votes) / n,
        "reward/vote_neg_frac": sum(v < 0 for v in votes) / n,
        "reward/process_per_episode": sum(s.process_reward for e in episodes for s in e.steps) / max(len(episodes), 1),
    }


def build_judge(cfg: RunConfig, policy):
    """The judge `reward.judge` names, or None when process rewards are off. The model judge is the
    policy's frozen starting point (its reference: base + SFT warm-up, adapter off) unless
    `reward.judge.model` names one, loaded frozen in the policy's dtype on its device, with its own
    tokenizer and turn format."""
    d = cfg.algo.distill
    hints = d.coef > 0 and d.hint == "hindsight"
    if cfg.reward.process == "none" and not hints:
        return None
    j = cfg.reward.judge
    if j.kind == "rule":
        return RuleJudge(j)
    if j.model is None:
        return ModelJudge(j, policy.reference, policy.chat, cfg.train.seed)
    from harness.model.base import chat_format, load_pretrained

    dev = next(policy.model.parameters()).device
    model, tok = load_pretrained(j.model, next(policy.model.parameters()).dtype)
    model = model.to(dev).eval().requires_grad_(False)

    @contextmanager
    def frozen():
        with torch.no_grad():
            yield model

    d = cfg.algo.distill
    if d.coef > 0 and d.teacher == "judge" and tok.get_vocab() != policy.chat.tokenizer.get_vocab():
        from harness.config.errors import ConfigError

        raise ConfigError(
            f"algo.distill.teacher 'judge' with reward.judge.model {j.model!r}: its tokenizer differs from the "
            f"policy's, so it cannot score the policy's tokens; use a judge of the policy's family or "
            f"algo.distill.teacher: reference"
        )
    return ModelJudge(j, frozen, chat_format(tok, j.model), cfg.train.seed, own_model=True)
