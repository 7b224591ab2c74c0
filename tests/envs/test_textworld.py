"""TextWorld env: generated games, caching, expert, splits, action formats, format errors."""

from __future__ import annotations

import os
import random
import shutil

import pytest
from pydantic import ValidationError

pytest.importorskip("textworld")

from envs.textworld_env import TextWorld, clean_objective, game_path  # noqa: E402

SEEDS = range(5)  # 5 w2-o3-q4 games, generated once for the module (~1 s each)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A private game cache; $HOME points into tmp (Inform 7 writes under it)."""
    root = tmp_path_factory.mktemp("tw")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(root / "home"))
        options = TextWorld.Options(cache_dir=str(root / "cache"))
        for seed in SEEDS:
            game_path(options, seed)
        yield root / "cache"


def make(cache, **options):
    return TextWorld({"cache_dir": str(cache), **options})


def play_expert(env, seed, detour=0, budget=40, rng=None):
    obs, info = env.reset(seed)
    result = None
    for _ in range(detour):
        result = env.step(rng.choice(info["admissible"]))
        info = result.info
        if result.done:
            return result
    for _ in range(budget):
        result = env.step(env.expert_action())
        if result.done:
            break
    return result


def test_expert_solves_every_generated_game(cache):
    env = make(cache)
    for seed in SEEDS:
        env.reset(seed)
        rewards = []
        for _ in range(12):
            result = env.step(env.expert_action())
            rewards.append(result.reward)
            assert not result.info["format_error"]
            if result.done:
                break
        assert result.done and result.info["won"], f"seed {seed}"
        assert rewards[-1] == 1.0 and sum(rewards) == 1.0


def test_expert_recovers_after_random_detours(cache):
    env = make(cache)
    rng = random.Random(0)
    for seed in SEEDS:
        assert play_expert(env, seed, detour=8, rng=rng).info["won"], f"seed {seed}"


def test_same_seed_same_episode(cache):
    def rollout():
        env, rng = make(cache), random.Random(1)
        obs, info = env.reset(3)
        trace = [(obs, info["state_key"])]
        for _ in range(10):
            result = env.step(rng.choice(info["admissible"] + ["jump"]))
            info = result.info
            trace.append((result.observation, result.reward, result.done, info["state_key"]))
            if result.done:
                break
        return trace

    assert rollout() == rollout()
    a, b = make(cache), make(cache)
    assert a.reset(0)[0] != b.reset(1)[0]  # different seeds, different games


def test_state_key_identifies_the_state(cache):
    env = make(cache)
    _, info0 = env.reset(0)
    look = env.step("look")  # changes nothing in the world
    assert look.info["state_key"] == info0["state_key"]
    moved = env.step(env.expert_action())
    assert moved.info["state_key"] != info0["state_key"]
    assert env.reset(0)[1]["state_key"] == info0["state_key"]


def test_train_and_heldout_are_disjoint():
    train = set(TextWorld.task_seeds("train", 200))
    heldout = set(TextWorld.task_seeds("heldout", 200))
    assert len(train) == len(heldout) == 200 and not train & heldout


def test_non_admissible_text_never_reaches_the_interpreter(cache, monkeypatch):
    env = TextWorld({"cache_dir": str(cache)}, format_penalty=0.1)
    _, info = env.reset(0)

    def boom(command):
        raise AssertionError(f"interpreter called with {command!r}")

    monkeypatch.setattr(env._env, "step", boom)
    for text in [
        "jump over the moon",
        "",
        "   ",
        "\x00\xff;quit",
        "restart",
        "go east; go west",
        "x" * 5000,
        None,
        "<answer>",
        "1",
    ]:
        result = env.step(text)
        assert result.info["format_error"] and not result.done
        assert result.reward == -0.1
        assert result.observation.startswith("Invalid action")
        assert result.info["state_key"] == info["state_key"]
        assert "Available actions:" in result.observation


def test_text_is_normalised_before_matching(cache):
    env = make(cache)
    env.reset(0)
    command = env.expert_action()
    for variant in [
        command.upper() + ".",
        f"  {command}  ",
        f"<answer>{command}</answer>",
        "> " + command.replace(" ", "   "),
    ]:
        assert env.parse_action(variant).action == command


def test_choice_format(cache):
    env = make(cache, action_format="choice")
    obs, info = env.reset(2)
    assert "1. " in obs and info["admissible"] == [str(i) for i in range(1, len(info["commands"]) + 1)]
    assert env.expert_action().isdigit()
    for bad in ["0", str(len(info["commands"]) + 1), "go east", "-1", "1.5", ""]:
        assert env.step(bad).info["format_error"]
    result = None
    for _ in range(12):
        result = env.step(env.expert_action())
        if result.done:
            break
    assert result.info["won"]
    assert "number" in env.instructions


def test_episodes_end_within_a_turn_budget(cache):
    env, rng = make(cache), random.Random(2)
    for seed in SEEDS:
        _, info = env.reset(seed)
        for _ in range(25):  # the rollout's budget; random play must never raise
            result = env.step(rng.choice(info["admissible"] + ["dance", "7"]))
            info = result.info
            if result.done:
                with pytest.raises(RuntimeError):
                    env.step("look")
                break


def test_observations_are_short_and_clean(cache):
    env = make(cache)
    for seed in SEEDS:
        obs, _ = env.reset(seed)
        assert obs.startswith("Goal: ") and obs.count("Goal:") == 1
        assert "$$" not in obs and "\n\n" not in obs and "*** " not in obs
        assert len(obs) < 1500
        step = env.step(env.expert_action()).observation
        assert "Goal:" not in step and ">" not in step.splitlines()[-1]
    assert clean_objective("Welcome to TextWorld! Here is how to play! First, go east.") == "First, go east."


def test_dense_progress_rewards_sum_to_one(cache):
    env = TextWorld({"cache_dir": str(cache), "score": "progress"}, reward_density="dense")
    env.reset(1)
    back = env.step("look")
    assert back.reward == 0.0
    total = 0.0
    for _ in range(12):
        result = env.step(env.expert_action())
        total += result.reward
        assert result.reward > 0
        if result.done:
            break
    assert result.info["won"] and abs(total - 1.0) < 1e-9


def test_cache_is_reused_not_regenerated(cache):
    path = game_path(TextWorld.Options(cache_dir=str(cache)), 0)
    mtime = path.stat().st_mtime_ns
    make(cache).reset(0)
    assert path.stat().st_mtime_ns == mtime
    assert path.with_suffix(".json").is_file()
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]


def test_game_dir_plays_a_folder_of_games(cache, tmp_path):
    folder = tmp_path / "games"
    folder.mkdir()
    for seed in SEEDS:
        src = game_path(TextWorld.Options(cache_dir=str(cache)), seed)
        for suffix in (".z8", ".json"):
            shutil.copy(src.with_suffix(suffix), folder / f"game{seed}{suffix}")
    env = make(cache, game_dir=str(folder), heldout_fraction=0.3)
    train = {env.game_file(s).name for s in TextWorld.task_seeds("train", 10)}
    heldout = {env.game_file(s).name for s in TextWorld.task_seeds("heldout", 10)}
    assert train and heldout and not train & heldout and len(train | heldout) == 5
    for seed in (0, 1):
        assert play_expert(env, seed).info["won"]
    with pytest.raises(ValueError, match="game_dir"):
        make(cache, game_dir=str(tmp_path / "empty"))


def test_errors_propagate_as_exceptions(cache, tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    src = game_path(TextWorld.Options(cache_dir=str(cache)), 0)
    shutil.copy(src, folder / "a.z8")
    (folder / "a.json").write_text("{not json")
    shutil.copy(src, folder / "b.z8")
    (folder / "b.json").write_text("{not json")
    env = make(cache, game_dir=str(folder))
    with pytest.raises(Exception):  # noqa: B017 - whatever TextWorld raises must reach the caller
        env.reset(0)


def test_options_are_validated():
    with pytest.raises(ValidationError):
        TextWorld({"world_size": 0})
    with pytest.raises(ValidationError):
        TextWorld({"worldsize": 2})
    with pytest.raises(ValidationError):
        TextWorld({"action_format": "json"})


@pytest.mark.slow
@pytest.mark.parametrize("size", [(4, 6, 8), (8, 12, 4)])
def test_larger_games_are_generated_and_solved(tmp_path, monkeypatch, size):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    world_size, nb_objects, quest_length = size
    env = TextWorld(
        {
            "cache_dir": str(tmp_path / "cache"),
            "world_size": world_size,
            "nb_objects": nb_objects,
            "quest_length": quest_length,
        }
    )
    rng = random.Random(0)
    for seed in range(3):
        assert play_expert(env, seed, detour=5, budget=60, rng=rng).info["won"]


def test_search_fallback_expert_solves(cache, monkeypatch):
    """The breadth-first expert used when TextWorld's tracked policy is stale."""
    env = make(cache)
    monkeypatch.setattr(TextWorld, "_policy_is_valid", lambda self: False)
    for seed in (0, 1):
        assert play_expert(env, seed, budget=12).info["won"]


def test_close_releases_the_interpreter_and_reset_reopens(cache):
    env = make(cache)
    first = env.reset(0)[0]
    env.close()
    assert env.reset(0)[0] == first


def test_generating_a_game_leaves_the_process_environment_as_it_was(tmp_path):
    before = dict(os.environ)
    game_path(TextWorld.Options(cache_dir=str(tmp_path / "cache")), 7)
    assert dict(os.environ) == before
    assert (tmp_path / "cache" / ".home" / "Inform").is_dir()  # where Inform 7 wrote instead of $HOME


def test_scoped_env_restores_the_variable_after_an_error(monkeypatch):
    from envs.text_game import scoped_env

    monkeypatch.delenv("HARNESS_PROBE", raising=False)
    with pytest.raises(RuntimeError), scoped_env("HARNESS_PROBE", "x"):
        assert os.environ["HARNESS_PROBE"] == "x"
        raise RuntimeError
    assert "HARNESS_PROBE" not in os.environ
    monkeypatch.setenv("HOME", "/original")
    with scoped_env("HOME", None):  # leave it, but undo what the block sets
        os.environ["HOME"] = "/changed"
    assert os.environ["HOME"] == "/original"
