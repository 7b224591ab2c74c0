"""`env:`, `turns:` and `context:`: the environment, the turn budget and what the policy sees.

`env.name` and `env.options` are checked against the environment registry by the loader
(`harness.config.loading.check_registries`); the sections here check only their own keys.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from harness.config.fields import MAX_COUNT, MAX_TOKENS, MAX_TURNS, F, Strict


class EnvConfig(Strict):
    name: str = F("frozenlake", "Environment (see `harness envs`).")
    options: dict[str, Any] = F({}, "Environment options, validated by the environment's own schema.")
    mixture: list[dict[str, Any]] = F(
        [],
        "Multi-task training (AgentRL): a weighted mixture [{name, options, weight, label}, ...]; when set, "
        "env.name becomes `mixture` and env.options its members (leave both unset). Each group is from one "
        "environment; task type = environment for algo.adv.norm task; metrics and held-out evaluation per "
        "environment (weight 0: evaluated, never trained).",
    )
    reward_density: Literal["sparse", "dense"] = F(
        "sparse", "sparse: outcome only; dense: score increments per turn (Practitioner's Guide, Wang et al. 2025)."
    )
    format_penalty: float = F(
        0.0, "Reward subtracted for an unparsable action (RAGEN uses a negative format reward).", ge=0
    )
    train_tasks: int = F(
        0, "Size of the training task pool (0 = a fresh task seed for every group).", ge=0, le=MAX_COUNT
    )
    task_order: Literal["shared", "seeded"] = F(
        "shared",
        "Which fresh train tasks each seed plays (env.train_tasks = 0). shared: every train.seed plays the same "
        "task sequence (seeds differ in sampling and initialisation only; paired across points and seeds); "
        "seeded: train.seed s plays its own disjoint block of the train seeds, so seed-to-seed variation includes "
        "the tasks (docs/trainer.md#task-order). A pool (env.train_tasks > 0) is always drawn with train.seed.",
    )
    heldout_tasks: int = F(64, "Held-out tasks used for evaluation (disjoint from training tasks).", ge=1, le=MAX_COUNT)
    skip_demo_tasks: bool = F(
        False,
        "RL's train tasks (rollouts, ACT questions, the env.train_tasks pool) start after the train seeds "
        "the model's expert demonstrations came from (tiny-model pre-training, SFT warm-up), so RL never "
        "trains on a task the model imitated. Off: they start at the first train seed and overlap the demonstrations.",
    )
    workers: int = F(
        0,
        "Worker processes stepping environments (0 = in-process). Use >0 for TextWorld, whose interpreter can crash.",
        ge=0,
        le=1_024,
    )

    @model_validator(mode="before")
    @classmethod
    def _mixture(cls, data: Any) -> Any:
        """env.mixture set: the environment is `mixture` with the members as its options (the
        members are validated, with messages naming env.mixture.<i>, by the config loader)."""
        if not isinstance(data, dict) or not data.get("mixture"):
            return data
        options = data.get("options") or {}
        if not isinstance(options, dict) or set(options) - {"members"}:
            raise ValueError(
                "env.options: leave it unset with env.mixture (each member's options go in "
                f"env.mixture.<i>.options); got {options!r}"
            )
        return {**data, "name": "mixture", "options": {"members": data["mixture"]}}


class TurnsConfig(Strict):
    max: int = F(8, "Turn budget: an episode reaching it is truncated.", ge=1, le=MAX_TURNS)
    curriculum: list[int] = F(
        [],
        "ScalingInter-RL budgets h_1 < ... < h_N (AgentGym-RL, Xi et al. 2025), each at most turns.max; "
        "empty = fixed budget turns.max.",
    )
    curriculum_every: int = F(80, "Updates between curriculum steps (paper: 80).", ge=1, le=MAX_COUNT)
    overflow_penalty: float = F(
        0.0,
        "Reward subtracted when the budget or max_new_tokens is exceeded (AgentRL, Zhang et al. 2025, uses 0.2).",
        ge=0,
    )
    final_turn_note: str | None = F(
        None,
        "Appended (on a new line) to the observation of the last allowed "
        "turn, asking for a final answer (ScalingInter-RL). null = 'Last turn: "
        "answer now.' when a curriculum is set, none otherwise; '' = never.",
    )

    @model_validator(mode="after")
    def _increasing(self) -> TurnsConfig:
        c = self.curriculum
        if any(b <= a for a, b in zip(c, c[1:])) or any(h < 1 for h in c):
            raise ValueError(f"turns.curriculum must be positive and strictly increasing, got {c}")
        if c and c[-1] > self.max:
            raise ValueError(
                f"turns.curriculum {c} goes above turns.max = {self.max}; turns.max is the largest budget an "
                f"episode may get: raise turns.max to {c[-1]} or lower the curriculum"
            )
        return self


class ContextConfig(Strict):
    policy: Literal["full", "window", "obs_truncate", "single"] = F(
        "full",
        "What the policy sees each turn: full history; instructions + last `window` turns "
        "(Agent-R1); every observation cut to `obs_tokens` tokens with a [truncated] marker (AgentRL); "
        "instructions + current observation only (verl-agent history_length 0).",
    )
    window: int = F(2, "Turns kept by the window policy.", ge=1, le=MAX_TURNS)
    obs_tokens: int = F(64, "Token limit per observation for obs_truncate.", ge=1, le=MAX_TOKENS)
    mask_observations: bool = F(
        True,
        "True (every published recipe): train only on the policy's action "
        "tokens. False: observation tokens are trained on too (RAGEN "
        "enable_response_mask=false; risks hallucinated observations).",
    )
    layout: Literal["auto", "concatenated", "per-step"] = F(
        "auto",
        "Training sequences: one per trajectory (concatenated, append-only contexts only) or one "
        "per turn (per-step). auto = concatenated for policy full, per-step otherwise.",
    )

    @model_validator(mode="after")
    def _layout(self) -> ContextConfig:
        if self.layout == "concatenated" and self.policy != "full":
            raise ValueError(
                f"context.layout 'concatenated' needs context.policy 'full' (an append-only "
                f"context); policy {self.policy!r} needs layout 'per-step' or 'auto'"
            )
        return self

    @property
    def resolved_layout(self) -> str:
        if self.layout != "auto":
            return self.layout
        return "concatenated" if self.policy == "full" else "per-step"
