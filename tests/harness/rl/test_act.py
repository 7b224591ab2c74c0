"""ACT, agentic critical training (`act`, harness.rl.act; docs/algorithms.md#act): the questions
(expert vs sampled action at expert states, random order, degenerate pairs skipped), the reward, and
both schedules end to end in the trainer with the same episodes per update as RL only. Off by
default (the baseline record of test_mismatch.py is unchanged)."""

from __future__ import annotations

import pytest

from envs import make_env
from harness.config.schema import RunConfig
from harness.rl.act import QuestionVenv, build_questions, same_action
from tests.helpers import baseline as baseline_run
from tests.helpers.configs import merge
from tests.helpers.update import cfg_of


def test_questions_pair_the_expert_with_a_sampled_action(env):
    cfg = cfg_of()
    t = env.trainer(cfg)
    questions, stats = build_questions(cfg, t.policy.model, t.policy.chat, update=3, n=6)
    again, _ = build_questions(cfg, t.policy.model, t.policy.chat, update=3, n=6)
    assert questions == again  # seeded by (train.seed, update)
    assert 0 < len(questions) <= 6 and stats["act/questions"] == len(questions)
    fl = make_env("frozenlake")
    for q in questions:
        assert not same_action(fl, q.expert, q.sampled)
        a, b = q.text.split("\nA: ")[1].split("\nB: ")
        b = b.split("\n")[0]
        assert (a, b) == ((q.expert, q.sampled) if q.correct == "A" else (q.sampled, q.expert))
    assert {q.correct for q in build_questions(cfg, t.policy.model, t.policy.chat, update=4, n=6)[0] + questions} == {
        "A",
        "B",
    }


def test_questions_skip_the_demonstration_seeds_with_an_offset(env, monkeypatch):
    import harness.rl.act as act

    cfg, seen = cfg_of(), []
    real = act._expert_states
    monkeypatch.setattr(act, "_expert_states", lambda c, seeds, rng: seen.append(seeds) or real(c, seeds, rng))
    t = env.trainer(cfg)
    build_questions(cfg, t.policy.model, t.policy.chat, update=3, n=6)
    build_questions(cfg, t.policy.model, t.policy.chat, update=3, n=6, task_offset=40)
    train = type(make_env("frozenlake")).task_seeds("train", 40 + 11 * 18)
    assert seen[0] == train[10 * 18 : 11 * 18] and seen[1] == train[40 + 10 * 18 : 40 + 11 * 18]


def test_the_question_env_rewards_the_expert_letter():
    from harness.rl.act import Question

    qs = [Question("s", "B", "up", "down")]
    venv = QuestionVenv(qs, 3)
    assert [r[0] for r in venv.reset([0, 0, 0])] == ["s"] * 3
    out = venv.step(["B", "A", "maybe"])
    assert [r.reward for r in out] == [1.0, 0.0, -0.0] and all(r.done for r in out)
    assert out[2].info["format_error"] and not out[0].info["format_error"]


QUICK = merge(baseline_run.CONFIG, {"train": {"updates": 3, "eval_every": 0, "mi_every": 0, "eval_episodes": 1}})


@pytest.mark.parametrize(
    "act", [{"mode": "stage", "updates": 1}, {"mode": "mixed", "mix": 0.5}], ids=["stage", "mixed"]
)
def test_end_to_end_at_equal_episodes(tmp_path, act):
    rows = [r for r in baseline_run.run(tmp_path / "on", merge(QUICK, {"act": act})) if "loss/total" in r]
    plain = [r for r in baseline_run.run(tmp_path / "off", QUICK) if "loss/total" in r]
    assert [r["perf/episodes"] for r in rows] == [r["perf/episodes"] for r in plain]  # equal compute
    if act["mode"] == "stage":
        assert "act/success" in rows[0] and "env/success" not in rows[0]  # update 1 is an ACT update
        assert all("env/success" in r and "act/success" not in r for r in rows[1:])
    else:
        assert all("act/success" in r and "env/success" in r for r in rows)


def test_answers_in_the_action_space():
    """act.answer action: the pair is shown as two actions, the answer is parsed by the environment;
    the expert's action wins, the sampled one loses, anything else is a format error."""
    from harness.rl.act import Question, question_text

    fl = make_env("frozenlake")
    q = Question(question_text("s", "up", "left", "action"), "up", "up", "left", "left")
    assert "\nup\nleft\nWrite the better action." in q.text and "A:" not in q.text
    venv = QuestionVenv([q], 4, 0.5, fl.parse_action)
    assert venv.reset([0, 0, 0, 0])[0][1]["admissible"] == ["up", "left"]
    out = venv.step(["up", "<answer>left</answer>", "down", "B"])
    assert [r.reward for r in out] == [1.0, 0.0, -0.5, -0.5]
    assert [r.info["format_error"] for r in out] == [False, False, True, True]


def test_action_answers_end_to_end(env):
    """On the tiny model, letters are never written (every answer a format error, act/success 0); the
    action form is answered with actions, so the critic task carries reward variance."""
    cfg = cfg_of().model_copy(update={"act": cfg_of().act.model_copy(update={"mode": "mixed", "answer": "action"})})
    t = env.trainer(cfg)
    questions, _ = build_questions(cfg, t.policy.model, t.policy.chat, update=2, n=4)
    fl = make_env("frozenlake")
    for q in questions:
        assert q.correct == fl.parse_action(q.expert).action and q.expert in q.text and q.sampled in q.text
    rows = [
        r
        for r in baseline_run.run(
            env.root / "act_action", merge(QUICK, {"act": {"mode": "mixed", "mix": 0.5, "answer": "action"}})
        )
        if "act/format_error_rate" in r
    ]
    assert rows and min(r["act/format_error_rate"] for r in rows) < 1.0


def test_refusals():
    for bad, words in (
        ({"act": {"mode": "stage", "updates": 10}, "train": {"updates": 10}}, "at least one RL update"),
        ({"act": {"mode": "mixed", "mix": 0.9}, "rollout": {"tasks_per_update": 2}}, "no RL task"),
        ({"act": {"mode": "mixed"}, "rollout": {"concurrent": True}}, "rollout.concurrent"),
        ({"act": {"mode": "stage", "answer": "action"}, "env": {"mixture": [{"name": "frozenlake"}]}}, "act.answer"),
    ):
        with pytest.raises(ValueError, match=words):
            RunConfig.model_validate(bad)
