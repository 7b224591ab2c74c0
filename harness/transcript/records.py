"""What a rollout produces: one StepRecord per turn, one Episode per trajectory.

Token ids are kept exactly as sampled (actions) or as tokenized once (prompt, observations);
training sequences are assembled from these ids only (see `harness.rl.batch`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepRecord:
    turn: int  # 0-based turn index
    obs_ids: list[int]  # observation segment that preceded this action (turn 0: the prompt)
    context_ids: list[int] | None  # the exact context the policy saw (per-step layout); None = the
    # append-only concatenation of earlier segments (concatenated layout)
    action_ids: list[int]  # exactly the sampled ids, end-of-turn token included when emitted
    sampler_logprobs: list[float]  # log-probs the sampler assigned to action_ids
    action_text: str  # decoded action (for the environment and logs only)
    observation: str  # the observation text shown before this action
    reward: float = 0.0  # reward of this turn (penalties included)
    done: bool = False
    overflow: bool = False  # hit max_new_tokens without an end-of-turn token
    format_error: bool = False
    state_key: str = ""  # environment state before the action (GiGPO anchor)
    info: dict[str, Any] = field(default_factory=dict)
    # constrained decoding only (rollout.constrain): log-probs of action_ids under the
    # unconstrained tempered distribution; sampler_logprobs are then under the constrained
    # (renormalised) one. None when the turn was not constrained.
    unconstrained_logprobs: list[float] | None = None
    # constrained decoding only: for each action token, the token ids it was drawn from (the
    # trie's continuations at that point); the trainer's log-softmax is taken over this set.
    allowed_ids: list[list[int]] | None = None
    # cross-policy sampling (rollout.cross_policy): the pool member that generated this action
    # (0 = the current policy; sampler_logprobs are that member's)
    member: int = 0
    # our sampler: the entropy of the tempered distribution at each action token, over the vocabulary and
    # over the set it was drawn from (constrained decoding; else equal); None where not recorded
    sampler_entropy: list[float] | None = None
    sampler_entropy_constrained: list[float] | None = None
    score_before: float | None = None  # the environment's progress score before the action (the rule judge)
    # process rewards (reward.process, harness.rl.judge): the judge's verdict row and the reward it adds
    judge: dict[str, Any] | None = None
    process_reward: float = 0.0

    @property
    def train_reward(self) -> float:
        """The reward the trainer sees: the environment's plus the process reward (when there is one)."""
        return self.reward + self.process_reward if self.process_reward else self.reward


@dataclass
class Episode:
    task_seed: int
    group: int  # group id: the G rollouts of one task share it
    instructions: str
    steps: list[StepRecord] = field(default_factory=list)
    won: bool = False
    truncated: bool = False  # turn budget reached before the episode ended
    env_error: str | None = None
    score: float = 0.0
    turn_budget: int = 0  # turn budget the episode ran under (curriculum), 0 = unknown
    final_observation: str | None = None  # what the environment showed after the last action

    @property
    def outcome(self) -> float:
        """Trajectory return R_i: the sum of per-turn rewards (penalties included)."""
        return float(sum(s.reward for s in self.steps))

    @property
    def train_return(self) -> float:
        """The return the trainer sees (group filters, advantages): `outcome` plus process rewards."""
        return float(sum(s.train_reward for s in self.steps))

    @property
    def num_turns(self) -> int:
        return len(self.steps)
