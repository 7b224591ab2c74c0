"""`harness bench` measures both sides of every ratio in one process (smoke, tiny sizes)."""

import math

from harness.bench.run import run_bench
from tests.harness.test_trainer import cfg_with


def test_bench_reports_both_sides_and_ratios():
    cfg = cfg_with(rollout={"tasks_per_update": 2, "group_size": 2, "max_new_tokens": 4})
    out = run_bench(cfg, steps=1, parts=("memory", "trl"))
    mem = out["logprob_peak_memory"]
    assert mem["naive_bytes"] > 0 and mem["chunked_bytes"] > 0
    assert math.isclose(mem["ratio"], mem["chunked_bytes"] / mem["naive_bytes"], rel_tol=1e-6)
    trl = out["update_vs_trl_grpo"]
    assert trl["ours_s"] > 0 and trl["trl_s"] > 0 and trl["episodes"] == 4
    assert math.isclose(trl["ratio"], trl["ours_s"] / trl["trl_s"])


def test_concurrent_bench_times_both_loops_on_the_same_updates():
    from harness.bench.run import bench_concurrent

    cfg = cfg_with(rollout={"tasks_per_update": 2, "group_size": 2, "max_new_tokens": 4})
    out = bench_concurrent(cfg, updates=2, staleness=1, repeats=1)
    assert out["synchronous_s"] > 0 and out["concurrent_s"] > 0 and out["updates"] == 2
    assert math.isclose(out["ratio"], out["concurrent_s"] / out["synchronous_s"])
    assert 0.0 <= out["mean_staleness"] <= 1.0
