"""The simulated user (envs/user_env.py): details revealed only when asked, the expert wins every goal
kind, and acting on unconfirmed details (a guessed order id, an item or value the user did not give,
an unconfirmed change) is a violation that makes the episode unwinnable."""

from __future__ import annotations

import pytest

from envs import make_env
from envs.demos import expert_solve_rate
from envs.user_env import UserOptions, call_text, make_task


def test_the_user_reveals_details_only_when_asked():
    env = make_env("user")
    obs, _ = env.reset(3)
    task = make_task(3, UserOptions())
    assert task.order.id not in obs and task.goal.value not in obs
    assert task.order.id in env.step('ask("order")').observation
    assert "don't understand" in env.step('ask("weather")').observation
    assert task.goal.value in env.step('ask("change")').observation


@pytest.mark.parametrize("kind", ["size", "color", "address"])
def test_the_expert_wins_every_kind(kind):
    assert expert_solve_rate("user", {"kinds": [kind]}, list(range(20)), max_turns=12) == 1.0


def _play(env, seed, calls):
    env.reset(seed)
    res = None
    for c in calls:
        res = env.step(c)
    return res


@pytest.mark.parametrize(
    "mistake",
    ["guess the order id", "skip the confirmation", "stage an unasked value", "change another item"],
)
def test_acting_on_unconfirmed_details_is_a_violation(mistake):
    env = make_env("user", {"kinds": ["size"]}, reward_density="dense")
    seed = 5
    task = make_task(seed, UserOptions(kinds=["size"]))
    oid, g = task.order.id, task.goal
    other_item = 1 if g.item != 1 else 2
    other_size = next(s for s in ("S", "M", "L", "XL") if s != g.value)
    right = call_text("change_size", oid, g.item, g.value)
    plans = {
        "guess the order id": ['ask("item")', 'ask("change")', call_text("lookup", oid), right, "confirm()", "apply()"],
        "skip the confirmation": ['ask("order")', 'ask("item")', 'ask("change")', right, "apply()"],
        "stage an unasked value": ['ask("order")', 'ask("item")', call_text("change_size", oid, g.item, other_size)],
        "change another item": [
            'ask("order")',
            'ask("item")',
            'ask("change")',
            call_text("change_size", oid, other_item, g.value),
        ],
    }
    res = _play(env, seed, plans[mistake] + ["finish()"])
    assert res.done and res.info["violation"] and not res.info["won"] and res.info["score"] == 0.0


def test_a_rejected_change_is_not_confirmed():
    env = make_env("user", {"kinds": ["color"]})
    task = make_task(8, UserOptions(kinds=["color"]))
    wrong = next(c for c in ("red", "blue", "green", "black") if c != task.goal.value)
    res = _play(
        env,
        8,
        ['ask("order")', 'ask("item")', call_text("change_color", task.order.id, task.goal.item, wrong), "confirm()"],
    )
    assert "No, that's not what I want." in res.observation
