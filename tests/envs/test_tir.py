"""Tool-integrated reasoning (envs/tir_env.py): the generated problems' answers against brute force, the
expert solving every kind at every level through the real sandbox, the tool-call cap, format errors,
wrong answers, errors shown as their last lines, and the split."""

from __future__ import annotations

import pytest

from envs import make_env
from envs.tir_env import KINDS, TIROptions, code_block, make_problem


def _brute(problem) -> int:
    """The answer recomputed independently of the generator's formula, from the problem text."""
    import re

    nums = [int(x) for x in re.findall(r"-?\d+", problem.text)]
    if problem.kind == "counting":
        _, n, p, q, r = nums
        return sum(1 for k in range(1, n + 1) if (k % p == 0 or k % q == 0) and k % r != 0)
    if problem.kind == "system":
        a, b, e, c, d, f = _coefficients(problem.text)
        for x in range(-6000, 6001):
            if b and (e - a * x) % b == 0:
                y = (e - a * x) // b
                if c * x + d * y == f:
                    return x * y + x - y
        raise AssertionError("no solution")
    return problem.answer  # arithmetic and modular: the expert program recomputes them in the sandbox


def _coefficients(text: str) -> tuple[int, ...]:
    import re

    out = []
    for a, sign, b, rhs in re.findall(r"(-?\d*)x ([+-]) (\d*)y = (-?\d+)", text):
        out += [int(a) if a not in ("", "-") else (-1 if a == "-" else 1)]
        out += [(int(b) if b else 1) * (-1 if sign == "-" else 1), int(rhs)]
    assert len(out) == 6, text
    return tuple(out)


@pytest.mark.parametrize("level", [1, 2])
def test_answers_match_brute_force(level):
    o = TIROptions(level=level)
    seen = set()
    for seed in range(60):
        p = make_problem(seed, o)
        seen.add(p.kind)
        if p.kind in ("counting", "system") and (p.kind != "counting" or level == 1):
            assert _brute(p) == p.answer, (seed, p.text)
    assert seen == set(KINDS)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_the_expert_solves_every_kind_through_the_sandbox(level):
    for kind in KINDS:
        env = make_env("tir", {"level": level, "kinds": [kind]})
        for seed in (1, 3):
            obs, info = env.reset(seed)
            assert info["score"] == 0.0 and "\\boxed" not in obs
            first = env.expert_action()
            assert first.startswith("```python\n")
            res = env.step(first)
            assert res.info["score"] == 0.5 and "```output" in res.observation and not res.done
            res = env.step(env.expert_action())
            assert res.done and res.info["won"] and res.reward == 1.0


def test_cap_format_errors_wrong_answers_and_error_lines():
    env = make_env("tir", {"max_calls": 1, "kinds": ["modular"]}, reward_density="dense")
    env.reset(2)
    res = env.step("I think it is seven")
    assert res.info["format_error"] and res.observation.startswith("Invalid action")
    res = env.step(code_block("def f(n):\n    return f(n - 1) if n else 1 // 0\nprint(f(30))\n"))
    out = res.observation.split("```output\n")[1]
    assert out.startswith("Error:") and "ZeroDivisionError" in out and len(out.splitlines()) <= 8
    assert res.info["score"] == 0.0 and res.reward == 0.0
    res = env.step(code_block("print(1)\n"))  # past the cap of 1: not run
    assert "Tool call limit (1) reached" in res.observation and "```output" not in res.observation
    res = env.step("\\boxed{-1}")
    assert res.done and not res.info["won"] and res.reward == 0.0


def test_splits_are_disjoint_and_task_types_are_the_kinds():
    env_cls = type(make_env("tir", {}))
    train, held = env_cls.task_seeds("train", 50), env_cls.task_seeds("heldout", 50)
    assert not set(train) & set(held)
    env = make_env("tir", {})
    assert {env.task_type(s) for s in range(40)} == set(KINDS)
