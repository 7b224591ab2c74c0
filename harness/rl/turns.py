"""The turn budget of each update: ScalingInter-RL's curriculum (AgentGym-RL).

`turn_budget_at(update, cfg.turns)` gives the budget; at the last allowed turn
`turns.final_turn_note` (default with a curriculum: "Last turn: answer now.") is appended to the
observation on a new line, asking the agent for its final answer (`final_turn_note`).
"""

from __future__ import annotations

from harness.config.schema import TurnsConfig

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
