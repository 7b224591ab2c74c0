"""ACT, agentic critical training (`act`; docs/algorithms.md#act).

At expert states of training tasks, the expert's action and an action the policy samples there are
shown in random order, and the policy answers which is better; the reward is 1 for the expert's
(0 for the other, a format error otherwise). The answers are trained with the run's estimator
(GRPO groups of `rollout.group_size` answers per question), in one of two schedules:
- `stage`: the first `act.updates` updates are ACT updates, the rest RL, so the total number of
  updates and episodes equals an RL-only run of `train.updates` (ACT's comparison is against equal
  compute spent on RL);
- `mixed`: every update spends a share `act.mix` of its groups on ACT questions and the rest on RL
  tasks, again at the same episodes per update.

A question is built from a train task seed: the expert plays k steps (k uniform over its episode),
the state there is shown to the policy exactly as a first observation, one action is sampled at the
rollout temperature. When the sampled action parses to the expert's (the pair would carry no
signal; `act/degenerate_frac` logs the share), a random other admissible action takes its place
where the environment lists them (`act/fallback_frac`), otherwise the state is skipped (three
candidate states per question keep the count). Everything is seeded by (train.seed, update).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from envs import ENVS, make_env
from envs.base import StepResult, unwrap_answer
from harness.config.schema import RunConfig
from harness.rl.rollout import sample_prompts

ACT_INSTRUCTIONS = "Two actions are proposed for the state shown. Answer A or B: which action is better?"
ACT_ACTION_INSTRUCTIONS = "Two actions are proposed for the state shown. Write the better of the two."
ACT_SALT = 0xAC7
ACT_GROUP_BASE = 1_000_000  # group ids of ACT questions, apart from the RL groups


@dataclass(frozen=True)
class Question:
    text: str
    correct: str  # "A" or "B" (act.answer letter), or the expert's parsed action (action)
    expert: str
    sampled: str
    other: str = ""  # act.answer action: the sampled action, parsed (the wrong answer)


def question_text(state: str, a: str, b: str, answer: str = "letter") -> str:
    if answer == "action":
        return f"{state}\n\nWhich action is better here?\n{a}\n{b}\nWrite the better action."
    return f"{state}\n\nWhich action is better here?\nA: {a}\nB: {b}\nAnswer A or B."


class QuestionVenv:
    """A vector env over ACT questions (the `collect` interface): task seed i plays question i; one
    turn, reward 1 for the expert's letter (or, with `parse`, the expert's action: `parse` is the
    environment's action parser, and an answer that is neither of the two actions is a format error)."""

    def __init__(self, questions: list[Question], slots: int, format_penalty: float = 0.0, parse=None):
        self.questions, self.n, self.format_penalty, self.parse = questions, slots, format_penalty, parse
        self.current: list[int | None] = [None] * self.n

    def _info(self, q: Question | None, won: bool = False, format_error: bool = False) -> dict:
        return {
            "won": won,
            "score": float(won),
            "admissible": ["A", "B"] if self.parse is None or q is None else [q.expert, q.sampled],
            "state_key": "",
            "format_error": format_error,
        }

    def reset(self, seeds: list[int | None]) -> list:
        out = []
        for i, s in enumerate(seeds):
            self.current[i] = s
            q = None if s is None else self.questions[s]
            out.append(None if q is None else (q.text, self._info(q)))
        return out

    def _answer(self, q: Question, text: str) -> str | None:
        """The answer as a key comparable with q.correct, None when it answers neither option."""
        if self.parse is None:
            answer = unwrap_answer(text).strip().upper()
            return answer if answer in ("A", "B") else None
        parsed = self.parse(text)
        return parsed.action if not parsed.format_error and parsed.action in (q.correct, q.other) else None

    def step(self, actions: list[str | None]) -> list[StepResult | None]:
        out = []
        for i, text in enumerate(actions):
            q = None if text is None or self.current[i] is None else self.questions[self.current[i]]
            if q is None:
                out.append(None)
                continue
            answer = self._answer(q, text)
            if answer is None:
                what = "answer A or B" if self.parse is None else "write one of the two actions"
                out.append(
                    StepResult(f"Invalid action: {what}.", -self.format_penalty, True, self._info(q, False, True))
                )
                continue
            won = answer == q.correct
            out.append(StepResult("Correct." if won else "Wrong.", 1.0 if won else 0.0, True, self._info(q, won)))
            self.current[i] = None
        return out

    def close(self) -> None:
        pass


def _expert_states(cfg: RunConfig, seeds: list[int], rng: np.random.Generator) -> list[tuple]:
    """(instructions, state observation, expert action, admissible actions or None) at a uniformly drawn
    step of each seed's expert episode."""
    out = []
    for seed in seeds:
        env = make_env(cfg.env.name, cfg.env.options)
        try:
            obs, _ = env.reset(seed)
            trace = []
            done = False
            while not done and len(trace) < cfg.turns.max:
                a = env.expert_action()
                trace.append((obs, a, env.admissible()))
                res = env.step(a)
                obs, done = res.observation, res.done
            if trace:
                state, action, admissible = trace[int(rng.integers(len(trace)))]
                out.append((env.instructions, state, action, admissible))
        finally:
            env.close()
    return out


def same_action(env, a: str, b: str) -> bool:
    pa, pb = env.parse_action(a), env.parse_action(b)
    return not pa.format_error and not pb.format_error and pa.action == pb.action


@torch.no_grad()
def build_questions(
    cfg: RunConfig, model, chat, update: int, n: int, task_offset: int = 0
) -> tuple[list[Question], dict[str, float]]:
    """`n` questions for `update` (fewer only when every candidate state is degenerate) and act/* stats.

    task_offset: train seeds skipped first, as for the RL tasks (env.skip_demo_tasks)."""
    rng = np.random.default_rng([cfg.train.seed, update, ACT_SALT])
    candidates = 3 * n
    # train seeds apart from the RL tasks' blocks of early updates
    start = task_offset + (update * 3 + 1) * candidates
    seeds = ENVS.get(cfg.env.name).task_seeds("train", start + candidates, cfg.env.options)[start:]
    states = _expert_states(cfg, seeds, rng)
    rows = [chat.prompt(instr, state) for instr, state, _, _ in states]
    gens = [torch.Generator().manual_seed(int(x)) for x in rng.integers(0, 2**31 - 1, size=len(rows))]
    out = sample_prompts(
        model,
        chat,
        rows,
        gens,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
    )
    env = make_env(cfg.env.name, cfg.env.options)
    questions, degenerate, fallback = [], 0, 0
    for (_, state, expert, admissible), ids in zip(states, out.ids):
        sampled = chat.decode_action(ids).strip()
        if same_action(env, sampled, expert):
            degenerate += 1
            others = [a for a in admissible or [] if not same_action(env, a, expert)]
            if not others:
                continue  # no other action to pit against the expert's: the state is skipped
            sampled = others[int(rng.integers(len(others)))]  # a random other admissible action instead
            fallback += len(questions) < n
        if len(questions) < n:
            expert_first = bool(rng.integers(2))
            a, b = (expert, sampled) if expert_first else (sampled, expert)
            text = question_text(state, a, b, cfg.act.answer)
            if cfg.act.answer == "action":
                parsed = env.parse_action(sampled)
                other = "" if parsed.format_error else parsed.action  # an unparsable sample is never the answer
                questions.append(Question(text, env.parse_action(expert).action, expert, sampled, other))
            else:
                questions.append(Question(text, "A" if expert_first else "B", expert, sampled))
    env.close()
    return questions, {
        "act/degenerate_frac": degenerate / max(len(states), 1),
        "act/fallback_frac": fallback / max(len(questions), 1),
        "act/questions": float(len(questions)),
    }


def act_questions(cfg: RunConfig) -> int:
    """ACT questions per update in `act.mode: mixed` (a share of the update's groups), else 0."""
    if cfg.act.mode != "mixed":
        return 0
    return max(1, round(cfg.act.mix * cfg.rollout.tasks_per_update))


def act_instructions(cfg: RunConfig) -> str:
    return ACT_ACTION_INSTRUCTIONS if cfg.act.answer == "action" else ACT_INSTRUCTIONS


def is_act(episode) -> bool:
    return episode.instructions in (ACT_INSTRUCTIONS, ACT_ACTION_INSTRUCTIONS)
