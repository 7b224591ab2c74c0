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


# ----------------------------------------------------------------------------- deadlocks
# the box in the middle can still reach O (left, then down); pushed up it lands on the top row,
# a dead cell: no push takes it off that row and no target is on it
TO_DEADLOCK = "#####\n#___#\n#_X_#\n#OP_#\n#####"


def deadlock_env(text: str, **options) -> Sokoban:
    env = envs.make_env("sokoban", options)
    env.reset(0)
    env.level, env.player, env.boxes = level_from(text)
    return env


def test_dead_cells_are_detected_and_live_ones_are_not():
    assert not deadlock_env(TO_DEADLOCK).deadlocked()
    assert deadlock_env("#####\n#X__#\n#__O#\n#_P_#\n#####").deadlocked()  # a corner
    assert deadlock_env("#####\n#_X_#\n#__P#\n#O__#\n#####").deadlocked()  # a wall without a target
    assert not deadlock_env("#####\n#_√_#\n#__P#\n#___#\n#####").deadlocked()  # a box on its target


@pytest.mark.parametrize("density", ["sparse", "dense"])
def test_deadlock_end_stops_the_episode_with_the_penalty(density):
    env = envs.make_env("sokoban", {"deadlock": "end", "deadlock_penalty": 0.5}, reward_density=density)
    env.reset(0)
    env.level, env.player, env.boxes = level_from(TO_DEADLOCK)
    assert env.step("left").reward == 0.0  # a plain walk: no penalty
    env.player = level_from(TO_DEADLOCK)[1]
    r = env.step("up")
    assert r.done and r.reward == -0.5 and r.info["deadlock"] and not r.info["won"]
    assert "Deadlock: a box can no longer reach a target." in r.observation
    unpenalised = deadlock_env(TO_DEADLOCK, deadlock="end").step("up")
    assert unpenalised.done and unpenalised.reward == 0.0 and unpenalised.info["deadlock"]


def test_deadlock_report_logs_and_changes_nothing_else():
    r = deadlock_env(TO_DEADLOCK, deadlock="report").step("up")
    assert not r.done and r.reward == 0.0 and r.info["deadlock"] and "Deadlock" not in r.observation
    assert "deadlock" not in deadlock_env(TO_DEADLOCK).step("up").info  # off: the info is unchanged
    # along random walks on generated levels, "report" gives the same observations, rewards and ends as "off"
    import random

    rng = random.Random(0)
    dead = 0
    for seed in range(30):
        off, rep = envs.make_env("sokoban"), envs.make_env("sokoban", {"deadlock": "report"})
        assert off.reset(seed)[0] == rep.reset(seed)[0]
        for _ in range(12):
            a = rng.choice(["up", "down", "left", "right"])
            x, y = off.step(a), rep.step(a)
            assert (x.observation, x.reward, x.done) == (y.observation, y.reward, y.done)
            assert {k: v for k, v in y.info.items() if k != "deadlock"} == x.info
            dead += y.info["deadlock"]
            if x.done:
                break
    assert dead > 0  # the walks did reach dead-locked states


def test_expert_never_deadlocks_and_the_penalty_needs_end():
    seeds = Sokoban.task_seeds("heldout", 60)
    assert expert_solve_rate("sokoban", {"deadlock": "end", "deadlock_penalty": 1.0}, seeds, max_turns=20) == 1.0
    # the options change what an episode gives (its end, its return), so the evaluation before RL,
    # cached across points by its inputs, is not shared between them
    from harness.config.loading import validate_run_config
    from harness.rl.evaluate import start_key

    def key(**options):
        raw = {"env": {"name": "sokoban", "options": options}}
        return start_key(validate_run_config(raw, "t.yaml"), {"base": "tiny:x", "sft": None})

    assert len({key(), key(deadlock="report"), key(deadlock="end"), key(deadlock="end", deadlock_penalty=0.5)}) == 4
    for mode in ("off", "report"):
        with pytest.raises(ValueError, match="deadlock_penalty=0.5 needs deadlock: end"):
            envs.make_env("sokoban", {"deadlock": mode, "deadlock_penalty": 0.5})
    with pytest.raises(ValueError, match="deadlock"):
        envs.make_env("sokoban", {"deadlock": "stop"})


def test_deadlock_rate_metric_and_task_rows():
    from harness.diagnostics.episode_metrics import episode_metrics
    from harness.rl.evaluate import task_row
    from harness.transcript.records import Episode, StepRecord

    def ep(info):
        return Episode(0, 0, "", [StepRecord(0, [1], None, [2], [0.0], "up", "o", info=info)], won=False)

    eps = [ep({"deadlock": True}), ep({"deadlock": False}), ep({"deadlock": False}), ep({"deadlock": True})]
    assert episode_metrics(eps, "eval_sampled")["eval_sampled/deadlock_rate"] == 0.5
    # only the episodes that report it count (a mixture's other members, deadlock off)
    assert episode_metrics(eps + [ep({}), ep({})], "env")["env/deadlock_rate"] == 0.5
    assert "env/deadlock_rate" not in episode_metrics([ep({})], "env")
    assert task_row(10, "sampled", 0, eps[0])["deadlock_rate"] == 1
    assert "deadlock_rate" not in task_row(10, "sampled", 0, ep({}))
