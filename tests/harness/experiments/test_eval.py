"""`harness eval`: a finished point's policy on held-out tasks or a folder of TextWorld games."""

from __future__ import annotations

import json

import pytest

from harness.cli.main import main
from harness.config.loading import dump_config
from harness.experiments.evaluation import EvalRequest, run_eval
from harness.rl.evaluate import episode_stream, plan
from harness.store import read_jsonl
from tests.helpers.configs import cfg_with
from tests.helpers.configs import train_tiny as run


@pytest.fixture(scope="module")
def point(tmp_path_factory):
    """A finished tiny FrozenLake point (adapter trained for 2 updates)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HARNESS_CACHE", str(tmp_path_factory.mktemp("cache")))
    folder = tmp_path_factory.mktemp("results") / "s" / "p"
    cfg = cfg_with(train={"updates": 2, "eval_every": 0, "mi_every": 0})
    rows, _ = run(cfg, folder)
    (folder / "config.yaml").write_text(dump_config(cfg))
    yield folder, rows
    mp.undo()


def test_evaluation_plan_and_streams_are_the_same_for_every_point():
    p = plan([11, 13, 15], 7)
    assert p.greedy == [11, 13, 15] and p.sampled[-1] == (11, 2)
    a, b = episode_stream(13, 1), episode_stream(13, 1)
    assert a.initial_seed() == b.initial_seed() != episode_stream(13, 0).initial_seed()


def test_eval_of_a_finished_point_matches_its_own_final_evaluation(point, capsys):
    folder, rows = point
    with pytest.raises(SystemExit) as done:
        main(["eval", str(folder), "--samples", "2"])
    assert done.value.code in (0, None)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("eval adapter-heldout4-x2 of adapter: greedy success")
    summary = json.loads((folder / "eval" / "adapter-heldout4-x2.json").read_text())
    assert summary["results"]["greedy"]["tasks"] == 4 and summary["results"]["sampled"]["episodes"] == 8
    # the training run evaluated the same tasks with the same greedy decoding and the same streams
    final = [r for r in read_jsonl(folder / "eval_tasks.jsonl") if r["update"] == 2 and r["mode"] == "greedy"]
    mine = {
        r["task"]: r["success"]
        for r in read_jsonl(folder / "eval" / "adapter-heldout4-x2.tasks.jsonl")
        if r["mode"] == "greedy"
    }
    assert final and {r["task"]: r["success"] for r in final} == {r["task"]: mine[r["task"]] for r in final}


def test_eval_resumes_without_replaying_finished_episodes(point):
    folder, _ = point
    req = EvalRequest(point=folder, checkpoint="start", samples=3, name="resume", chunk=2)
    run_eval(req, log=lambda _: None)
    rows_path = folder / "eval" / "resume.tasks.jsonl"
    full = read_jsonl(rows_path)
    kept = [r for r in full if r["task"] == full[0]["task"]]  # as if interrupted after one task
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    run_eval(req, log=lambda _: None)
    again = read_jsonl(rows_path)
    assert len(again) == len(full) == 4 * (1 + 3)
    key = lambda r: (r["mode"], r["task"], r["sample"])  # noqa: E731
    assert sorted(map(key, again)) == sorted(map(key, full))
    assert {key(r): r["success"] for r in again} == {key(r): r["success"] for r in full}  # same streams


def test_eval_on_a_variant_of_the_environment_keeps_the_points_policy(point, capsys):
    """`--env-option checker=lenient` plays the FrozenLake probe's lenient checker with the policy the
    point trained: no other tiny model is built (its cache key covers env.options), greedy success on
    the same maps is the point's own where the strict and lenient episodes agree, and the probe's
    per-episode truth appears in the rows and the summary."""
    import os
    from pathlib import Path

    folder, _ = point
    cache = Path(os.environ["HARNESS_CACHE"])
    before = sorted(str(p.relative_to(cache)) for p in cache.rglob("DONE.json"))
    assert before  # the point built its model
    with pytest.raises(SystemExit) as done:
        main(["eval", str(folder), "--env-option", "checker=lenient"])
    assert done.value.code in (0, None)
    # the point's model, not a new one
    assert sorted(str(p.relative_to(cache)) for p in cache.rglob("DONE.json")) == before
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("eval adapter-heldout4-x1-checker-lenient of adapter: greedy success")
    assert "true success" in line and "exploit rate" in line
    summary = json.loads((folder / "eval" / "adapter-heldout4-x1-checker-lenient.json").read_text())
    assert summary["env_options"]["checker"] == "lenient"
    assert set(summary["results"]["greedy"]) >= {"success", "true_success", "exploit_rate"}
    rows = read_jsonl(folder / "eval" / "adapter-heldout4-x1-checker-lenient.tasks.jsonl")
    strict = {r["task"]: r for r in read_jsonl(folder / "eval_tasks.jsonl") if r["update"] == 2}
    for r in rows:  # a truly won lenient episode never touched a hole: the strict one won the same way
        if r["mode"] == "greedy" and r["true_success"]:
            assert strict[r["task"]]["success"] == 1


@pytest.mark.parametrize(
    "argv,message",
    [
        (["eval", "{point}", "--env-option", "checker"], "--env-option 'checker' is not of the form key=value"),
        (["eval", "{point}", "--env-option", "env.options.checker=lenient"], "key of env.options"),
        (["eval", "{point}", "--env-option", "checker=sloppy"], "env.options.checker = 'sloppy'"),
        (["eval", "{tmp}"], "not a point folder"),
        (["eval", "{point}", "--samples", "0"], "--samples 0"),
        (["eval", "{point}", "--checkpoint", "best"], "--checkpoint 'best'"),
        (["eval", "{point}", "--games", "{tmp}"], "needs a TextWorld point"),
        (["eval", "{point}", "--device", "tpu"], "--device 'tpu'"),
    ],
)
def test_bad_input_is_one_paragraph_exit_2(point, tmp_path, capsys, argv, message):
    folder, _ = point
    with pytest.raises(SystemExit) as err:
        main([a.format(tmp=tmp_path, point=folder) for a in argv])
    out = capsys.readouterr().err
    assert err.value.code == 2 and message in out and "Traceback" not in out
