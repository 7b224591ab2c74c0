"""The GPU check script (harness.bench.gpu_check) on a CPU: the parts that need no GPU."""

from __future__ import annotations

import json

import pytest
import torch

from harness.bench import gpu_check


def test_targets_read_the_bench_report():
    bench = {
        "engines": {"by_batch": {"256": {"static_vs_generate": 12.5, "static_fraction_of_floor": 0.15}}},
        "update_at_shape": {"checkpointing": {"peak_gib": 9.0}},
    }
    t = gpu_check.targets(bench)
    assert t["static engine vs HF generate, batch 256"] == {"target": ">= 10.0", "measured": 12.5, "met": True}
    assert t["static engine, fraction of the bandwidth floor, batch 256"]["met"] is False
    assert t["update peak memory at 8 x 2048, GiB"]["met"] is True
    assert all(v["met"] is None for v in gpu_check.targets({}).values())  # a part that did not run


def test_pytest_counts():
    assert gpu_check._pytest_counts("1 failed, 16 passed, 3 skipped, 1 deselected in 13.41s") == {
        "failed": 1,
        "passed": 16,
        "skipped": 3,
        "deselected": 1,
    }


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the check runs for real")
def test_without_a_gpu_the_check_says_so_and_writes_its_report(tmp_path):
    out = tmp_path / "report.json"
    rc = gpu_check.main(["--wheels", str(tmp_path / "none"), "--out", str(out)])
    report = json.loads(out.read_text())
    assert rc == 2 and report["error"].startswith("no CUDA device visible to torch")
    assert report["wheels"]["status"] == "skipped" and report["environment"]["cuda_available"] is False


def test_every_named_wheel_is_pinned():
    assert all("==" in w for w in gpu_check.WHEELS)
