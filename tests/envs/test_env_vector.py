"""VectorEnv: lock-step stepping, truncation, worker processes equal in-process, and faults
(exceptions, dead and hung workers) contained to their own episodes."""

from __future__ import annotations

import random

import pytest

from envs.vector import VectorEnv
from tests.support import faulty_env  # noqa: E402,F401  (registers the "faulty" env)

NAMES = ["frozenlake", "sokoban", "tooluse"]
MOVES = {
    "frozenlake": ["up", "down", "left", "right", "jump"],
    "sokoban": ["up", "down", "left", "right", "<answer>up</answer>", "?"],
    "tooluse": ['get_key("n")', 'get_city("Ann")', 'set_key("out", 1)', "finish()", "x"],
}


def rollout(venv: VectorEnv, name: str, seeds: list[int], turns: int) -> list:
    """Expert and random actions mixed (fixed rng), recording everything the caller sees."""
    rng = random.Random(0)
    trace = [venv.reset(seeds)]
    for _ in range(turns):
        expert = venv.expert_actions()
        actions = [None if e is None else e if rng.random() < 0.5 else rng.choice(MOVES[name]) for e in expert]
        results = venv.step(actions)
        trace.append([None if r is None else (r.observation, r.reward, r.done, r.info) for r in results])
        if not any(venv.active):
            break
    return trace


@pytest.mark.parametrize("name", NAMES)
def test_workers_give_the_same_results_as_in_process(name):
    seeds = list(range(0, 10, 2))
    with VectorEnv(name, None, "dense", 0.1, n=5, workers=0, max_turns=12) as local:
        expected = rollout(local, name, seeds, 15)
        instructions = local.instructions
    with VectorEnv(name, None, "dense", 0.1, n=5, workers=2, max_turns=12) as remote:
        assert remote.instructions == instructions
        assert rollout(remote, name, seeds, 15) == expected
        assert remote.stats["env_errors"] == 0


@pytest.mark.parametrize("name", NAMES)
def test_max_turns_truncates_and_skips_finished_instances(name):
    venv = VectorEnv(name, n=3, max_turns=4)
    venv.reset([0, 2, 4])
    bad = "<<not an action>>"  # format errors never end an episode by themselves
    for turn in range(1, 5):
        results = venv.step([bad, bad, None if turn > 1 else bad])
        assert results[2] is None if turn > 1 else results[2] is not None
        assert results[0].done == results[0].info["truncated"] == (turn == 4)
    assert venv.active == [False, False, True] and venv.stats["truncated"] == 2
    assert venv.step([bad, None, None]) == [None, None, None]  # over: skipped
    assert venv.reset([None, 6, None])[0] is None and venv.active[1]


def test_exceptions_in_reset_and_step_are_contained_in_process():
    venv = VectorEnv("faulty", {"fail_seed": 7}, n=3)
    reset = venv.reset([1, 7, 3])
    assert reset[1][1]["env_error"] == "ValueError: cannot build task 7"
    assert venv.active == [True, False, True]
    results = venv.step(["boom", "ok", "ok"])
    assert results[0].done and results[0].info["env_error"] == "RuntimeError: boom"
    assert results[1] is None and results[2].observation == "count 1"
    assert venv.stats["env_errors"] == 2
    assert venv.reset([1, 3, 5])[0][0] == "count 0"  # the broken instance is rebuilt


@pytest.mark.parametrize("fault", ["die", "segv"])
def test_a_dead_worker_ends_only_its_episodes_and_is_restarted(fault):
    with VectorEnv("faulty", n=4, workers=2) as venv:  # worker 0: 0, 2; worker 1: 1, 3
        venv.reset([0, 1, 2, 3])
        venv.step(["ok"] * 4)
        results = venv.step([fault, "ok", "ok", None])
        assert results[0].done and "worker process died" in results[0].info["env_error"]
        assert results[2].done and "env_error" in results[2].info  # same worker
        assert results[1].observation == "count 2" and not results[1].done
        assert results[3] is None and venv.active == [False, True, False, True]
        assert venv.stats["worker_restarts"] == 1
        assert venv.step([None, "ok", None, "ok"])[3].observation == "count 2"
        reset = venv.reset([0, 1, 2, 3])  # the restarted worker serves new episodes
        assert [obs for obs, _ in reset] == ["count 0"] * 4


def test_a_hung_worker_times_out():
    with VectorEnv("faulty", n=2, workers=2, timeout_s=1.0) as venv:
        venv.reset([0, 1])
        results = venv.step(["hang", "ok"])
        assert "timed out" in results[0].info["env_error"] and results[0].done
        assert results[1].observation == "count 1"
        assert venv.reset([0, 1])[0][0] == "count 0"
