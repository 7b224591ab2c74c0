"""ALFWorld env: built-in generator (six task types), official-data loading, expert, formats."""

from __future__ import annotations

import json
import os
import random
import re
import shutil

import pytest

pytest.importorskip("alfworld")
pytest.importorskip("fast_downward")

from envs import alfworld_gen  # noqa: E402
from envs.alfworld_env import AlfWorld  # noqa: E402

SEEDS = range(6)  # seeds 2k, 2k+1 play task type k: 3 types x (train, held-out)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("alf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(root / "home"))
        mp.setenv("ALFWORLD_DATA", str(root / "no_data"))
        env = AlfWorld({"cache_dir": str(root / "cache"), "source": "generated"})
        for seed in SEEDS:
            env.game_file(seed)
        yield root / "cache"


def make(cache, **options):
    return AlfWorld({"cache_dir": str(cache), "source": "generated", **options})


def expert_run(env, seed, detour=0, rng=None, budget=60):
    _, info = env.reset(seed)
    result = None
    for _ in range(detour):
        result = env.step(rng.choice(info["admissible"]))
        info = result.info
    for _ in range(budget):
        if result is not None and result.done:
            break
        result = env.step(env.expert_action())
    return result


def test_generator_covers_all_six_task_types():
    assert len(alfworld_gen.scenes()) == 120
    for i, task_type in enumerate(alfworld_gen.TASK_TYPES):
        data = alfworld_gen.make_game_data(i, task_type)
        assert data["task"]["task_type"] == task_type
        assert "UNKNOWN GOAL" not in data["grammar"] and data["task"]["text"] in data["grammar"]
        assert "(:goal" in data["pddl_problem"]


def test_expert_solves_generated_games(cache):
    env = make(cache)
    seen = set()
    for seed in SEEDS:
        result = expert_run(env, seed)
        assert result.done and result.info["won"] and result.reward == 1.0, f"seed {seed}"
        seen.add(env.task_type(seed))
        data = json.loads(env.game_file(seed).read_text())
        assert data["solvable"] and data["walkthrough"]
    assert len(seen) == 3


def test_expert_recovers_after_detours(cache):
    env, rng = make(cache), random.Random(0)
    for seed in (0, 3, 5):
        assert expert_run(env, seed, detour=6, rng=rng).info["won"], f"seed {seed}"


def test_same_seed_same_episode(cache):
    def rollout():
        env, rng = make(cache), random.Random(4)
        obs, info = env.reset(2)
        trace = [obs, info["state_key"]]
        for _ in range(6):
            result = env.step(rng.choice(info["admissible"]))
            info = result.info
            trace.append((result.observation, result.reward, info["state_key"]))
        return trace

    assert rollout() == rollout()


def test_train_and_heldout_are_disjoint(cache):
    train = set(AlfWorld.task_seeds("train", 60))
    heldout = set(AlfWorld.task_seeds("heldout", 60))
    assert not train & heldout
    env = make(cache, task_types=["pick_and_place_simple", "pick_two_obj_and_place"])
    assert [env.task_type(s) for s in range(6)] == [
        "pick_and_place_simple",
        "pick_and_place_simple",
        "pick_two_obj_and_place",
        "pick_two_obj_and_place",
        "pick_and_place_simple",
        "pick_and_place_simple",
    ]


def test_invalid_actions_never_reach_the_interpreter(cache, monkeypatch):
    env = AlfWorld({"cache_dir": str(cache), "source": "generated"}, format_penalty=0.2)
    _, info = env.reset(0)

    def boom(command):
        raise AssertionError(f"interpreter called with {command!r}")

    monkeypatch.setattr(env._tw, "step", boom)
    for text in ["fly to the moon", "", "help", "go to cabinet 99", "\x00", None, "3"]:
        result = env.step(text)
        assert result.info["format_error"] and result.reward == -0.2 and not result.done
        assert result.info["state_key"] == info["state_key"]


def test_observation_format(cache):
    env = make(cache)
    obs, info = env.reset(1)
    assert obs.startswith("Goal: ") and "Welcome" not in obs and "Your task is to" not in obs
    assert "Available actions: go to " in obs and "help" not in info["admissible"]
    assert len(obs) < 1500


def test_goal_every_turn_repeats_the_goal_and_changes_nothing_else(cache):
    """The option adds the reset's goal line above each later observation; off (the default),
    the goal appears once. The game itself (actions, feedback, rewards, outcome) is the same."""
    plain, restated = make(cache), make(cache, goal_every_turn=True)
    first, _ = plain.reset(3)
    first_r, _ = restated.reset(3)
    assert first == first_r and first.count("Goal: ") == 1
    goal = first.splitlines()[0]
    turns = 0
    while True:
        action = plain.expert_action()
        assert restated.expert_action() == action
        a, b = plain.step(action), restated.step(action)
        turns += 1
        assert "Goal: " not in a.observation
        assert b.observation == f"{goal}\n{a.observation}"
        assert (a.reward, a.done, a.info["won"]) == (b.reward, b.done, b.info["won"])
        if a.done:
            break
    assert a.info["won"] and turns >= 2


def test_choice_format(cache):
    env = make(cache, action_format="choice")
    obs, info = env.reset(4)
    assert "\n1. " in obs and info["admissible"][0] == "1"
    assert env.step("0").info["format_error"]
    result = None
    for _ in range(40):
        result = env.step(env.expert_action())
        if result.done:
            break
    assert result.info["won"]


def test_random_play_with_nonsense_keeps_the_episode_consistent(cache):
    """Random admissible actions mixed with nonsense: nonsense is a format error that neither ends the
    episode nor changes the admissible list; every step returns an observation and admissible actions."""
    env, rng = make(cache), random.Random(3)
    _, info = env.reset(5)
    nonsense = 0
    for _ in range(15):
        action = rng.choice(info["admissible"] + ["nonsense"])
        result = env.step(action)
        assert isinstance(result.observation, str) and result.observation
        if action == "nonsense":
            nonsense += 1
            assert result.info["format_error"] and not result.done and result.reward <= 0
            assert result.info["admissible"] == info["admissible"]
        else:
            assert not result.info["format_error"]
        info = result.info
        if result.done:
            break
        assert info["admissible"]
    assert nonsense > 0  # the seed above draws nonsense at least once


def test_official_data_folder_is_used_when_present(cache, tmp_path, monkeypatch):
    """An ALFWORLD_DATA layout (json_2.1.1/<split>/<task>/<trial>/game.tw-pddl)."""
    root = tmp_path / "alfworld_data"
    for split, seeds in (("train", (0, 2)), ("valid_unseen", (1,))):
        for seed in seeds:
            src = make(cache).game_file(seed)
            task = json.loads(src.read_text())["task"]["task_type"]
            trial = root / "json_2.1.1" / split / f"{task}-X-None-Y-{seed}" / "trial_1"
            trial.mkdir(parents=True)
            shutil.copy(src, trial / "game.tw-pddl")
    skipped = root / "json_2.1.1" / "train" / "pick_and_place_simple-Sliced-1" / "trial_1"
    skipped.mkdir(parents=True)
    (skipped / "game.tw-pddl").write_text('{"solvable": true}')
    monkeypatch.setenv("ALFWORLD_DATA", str(root))
    env = AlfWorld({"cache_dir": str(cache), "data_dir": str(root)})
    assert env.source == "official"
    assert len(env._splits["train"]) == 2 and len(env._splits["heldout"]) == 1
    order = [p.parts[-3].split("-")[0] for p in env._splits["train"]]
    assert order == ["pick_and_place_simple", "look_at_obj_in_light"]  # types interleaved
    assert expert_run(env, 0).info["won"] and expert_run(env, 1).info["won"]


def test_missing_official_data_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="alfworld-download"):
        AlfWorld({"source": "official", "data_dir": str(tmp_path / "nothing")})
    with pytest.raises(Exception, match="task types"):
        AlfWorld({"task_types": ["pick_and_fly"]})


def test_parser_caches_keep_behaviour_and_sys_argv(cache, monkeypatch):
    import sys

    from envs.alfworld_env import _memoized

    calls = []
    parse = _memoized(lambda text, rule_name="x": calls.append(text) or [{"t": text}])
    a, b = parse("abc", rule_name="x"), parse("abc", rule_name="x")
    assert a == b and a is not b and a[0] is not b[0] and calls == ["abc"]
    monkeypatch.setattr(sys, "argv", ["harness", "run"])
    make(cache).reset(3)  # fast-downward's translator rewrites sys.argv; we restore it
    assert sys.argv == ["harness", "run"]


def test_playing_leaves_the_process_environment_as_it_was(cache, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)  # `import alfworld` would set it process-wide
    before = dict(os.environ)
    assert expert_run(make(cache), 0).info["won"]
    assert dict(os.environ) == before


def test_search_expert_wins_by_looking_not_by_knowing(cache):
    """The search expert wins every type, takes only objects the last observation showed, and
    searches each receptacle at most once before it holds the target."""
    env = make(cache, expert="search")
    for seed in SEEDS:
        obs, _ = env.reset(seed)
        actions, shown = [], obs.split("Available actions:")[0]
        result = None
        for _ in range(40):
            action = env.expert_action()
            if action.startswith("take "):
                assert action.split(" from ")[0][len("take ") :] in shown, (seed, action, shown)
            actions.append(action)
            result = env.step(action)
            shown = result.observation.split("Available actions:")[0]  # the feedback, not the commands
            if result.done:
                break
        assert result.info["won"], f"seed {seed}: {actions}"
        first_take = next(i for i, a in enumerate(actions) if a.startswith("take "))
        visits = [a for a in actions[:first_take] if a.startswith("go to ")]
        assert len(visits) == len(set(visits)), actions


def test_search_expert_finds_what_the_planner_reaches_directly(cache):
    """The planner goes straight to the object; the search expert, which has to look for it,
    needs at least as many steps to win."""
    for seed in SEEDS:
        counts = []
        for expert in ("planner", "search"):
            env = make(cache, expert=expert)
            env.reset(seed)
            steps, result = 0, None
            while result is None or not result.done:
                result, steps = env.step(env.expert_action()), steps + 1
            assert result.info["won"]
            counts.append(steps)
        assert counts[1] >= counts[0], (seed, counts)


def test_search_expert_recovers_after_detours(cache):
    env, rng = make(cache, expert="search"), random.Random(1)
    for seed in (0, 1, 3, 5):
        assert expert_run(env, seed, detour=6, rng=rng).info["won"], f"seed {seed}"


def test_search_expert_needs_generated_games(cache, tmp_path):
    root = tmp_path / "alfworld_data"
    trial = root / "json_2.1.1" / "train" / "pick_and_place_simple-X-None-Y-0" / "trial_1"
    trial.mkdir(parents=True)
    shutil.copy(make(cache).game_file(0), trial / "game.tw-pddl")
    (root / "json_2.1.1" / "valid_unseen").mkdir(parents=True)
    with pytest.raises(ValueError, match="expert='search' needs generated games"):
        AlfWorld({"cache_dir": str(cache), "data_dir": str(root), "expert": "search"})
    with pytest.raises(Exception, match="expert"):
        AlfWorld({"expert": "oracle"})


def _relocated(path, folder):
    """The same game with every target object moved to another receptacle that can hold it:
    the first observation is unchanged, only the hidden state differs."""
    data = json.loads(path.read_text())
    task, problem = data["task"], data["pddl_problem"]
    kinds = re.findall(r"\(receptacleType (\S+) (\S+)Type\)", problem)
    locations = dict(re.findall(r"\(receptacleAtLocation (\S+) (\S+)\)", problem))
    targets = re.findall(rf"\(objectType (\w+) {task['object_target']}Type\)", problem)
    now = {re.search(rf"\(inReceptacle {o} (\S+)\)", problem)[1] for o in targets}
    elsewhere = [
        r
        for r, kind in kinds
        if alfworld_gen.fits(task["object_target"], kind) and kind != task["parent_target"] and r not in now
    ]
    if not elsewhere:
        return None
    for o in targets:
        problem = re.sub(rf"\(inReceptacle {o} \S+\)", f"(inReceptacle {o} {elsewhere[0]})", problem)
        problem = re.sub(rf"\(objectAtLocation {o} \S+\)", f"(objectAtLocation {o} {locations[elsewhere[0]]})", problem)
    data.update(pddl_problem=problem, walkthrough=None)
    out = folder / path.name
    out.write_text(json.dumps(data))
    return out


def test_search_expert_does_not_know_where_hidden_objects_are(cache, tmp_path, monkeypatch):
    """Moving the target object changes the planner's first step, never the search expert's: the
    first observation is the same, and that is all the search expert has seen."""
    planner_moved = 0
    for seed in SEEDS:
        moved = _relocated(make(cache).game_file(seed), tmp_path)
        if moved is None:
            continue
        first = {}
        for expert in ("planner", "search"):
            for path in (None, moved):
                env = make(cache, expert=expert)
                if path is not None:
                    monkeypatch.setattr(env, "game_file", lambda s, p=path: p)
                obs, _ = env.reset(seed)
                first[expert, path] = (obs, env.expert_action())
                if path is not None:  # the moved game is still won
                    assert expert_run(env, seed).info["won"], (expert, seed)
        assert first["search", None] == first["search", moved], seed
        assert first["planner", None][0] == first["planner", moved][0]  # same first observation
        planner_moved += first["planner", None][1] != first["planner", moved][1]
    assert planner_moved >= 2  # the test can tell: the planner heads for the object's new place
