"""Sokoban env: generator (solvable, unsolved, seeded), push rules, symbols, difficulty."""

from __future__ import annotations

import pytest

import envs
from envs.demos import expert_solve_rate
from envs.sokoban_env import Level, Sokoban, _render, generate, solve


def level_from(text: str):
    rows = text.split("\n")
    size = len(rows)
    cells = {r * size + c: ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    floor = frozenset(i for i, ch in cells.items() if ch != "#")
    targets = frozenset(i for i, ch in cells.items() if ch in "O√S")
    player = next(i for i, ch in cells.items() if ch in "PS")
    boxes = tuple(sorted(i for i, ch in cells.items() if ch in "X√"))
    return Level(size, floor, targets), player, boxes


def env_at(text: str) -> Sokoban:
    env = envs.make_env("sokoban")
    env.reset(0)
    env.level, env.player, env.boxes = level_from(text)
    return env


def test_push_rules_and_symbols():
    grid = "#####\n#PX_#\n#_O_#\n#___#\n#####"
    env = env_at(grid)
    assert env.render() == grid
    assert env.step("up").observation == grid  # wall: no-op
    r = env.step("right")  # push the box right, onto floor
    assert r.observation == "#####\n#_PX#\n#_O_#\n#___#\n#####" and not r.done
    assert env.step("right").observation == r.observation  # box against the wall: no-op


def test_box_on_target_and_player_on_target_symbols():
    env = env_at("#####\n#_P_#\n#_X_#\n#_O_#\n#####")
    r = env.step("down")
    assert r.observation.endswith("#####\n#___#\n#_P_#\n#_√_#\n#####") and r.done
    assert r.info["won"] and r.reward == 1.0
    assert _render(*level_from("#####\n#S__#\n#√X_#\n#_O_#\n#####")) == "#####\n#S__#\n#√X_#\n#_O_#\n#####"


@pytest.mark.parametrize("size,boxes,steps", [(6, 1, 30), (6, 2, 30), (7, 2, 50), (8, 3, 60)])
def test_generated_levels_are_unsolved_and_solvable(size, boxes, steps):
    for seed in range(40):
        level, player, box_cells = generate(seed, size, boxes, steps)
        assert len(box_cells) == boxes == len(level.targets)
        assert not set(box_cells) <= level.targets and player not in box_cells
        assert box_cells == generate(seed, size, boxes, steps)[2]  # seeded
        assert solve(level, player, box_cells)


def test_expert_on_harder_rooms():
    opts = {"size": 7, "num_boxes": 2, "reverse_steps": 50}
    seeds = Sokoban.task_seeds("train", 100, opts)
    assert expert_solve_rate("sokoban", opts, seeds, max_turns=60) == 1.0


def test_expert_recovers_after_a_detour_and_handles_deadlocks():
    recovered = 0
    for seed in range(0, 40, 2):
        env = envs.make_env("sokoban")
        env.reset(seed)
        r = None
        for a in ["left", "up", "right", "down"]:  # wander off the expert path
            r = env.step(a)
            if r.done:
                break
        if r.done or solve(env.level, env.player, env.boxes) is None:
            continue  # solved by chance, or the detour dead-locked the box
        for _ in range(40):
            r = env.step(env.expert_action())
            if r.done:
                break
        assert r.info["won"]
        recovered += 1
    assert recovered >= 10
    dead = env_at("#####\n#X__#\n#__O#\n#_P_#\n#####")  # box in a corner
    assert dead.expert_action() == "up"  # any move; no solution exists


def test_room_size_is_validated():
    with pytest.raises(ValueError, match="num_boxes"):
        envs.make_env("sokoban", {"size": 4, "num_boxes": 3})
