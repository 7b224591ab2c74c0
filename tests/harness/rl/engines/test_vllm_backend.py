"""rollout.backend vllm (harness.rl.engines.vllm).

Everywhere: the pieces that do not need vLLM (request seeds, turn outputs, rank slots), that a valid
config loads, and that a machine without vLLM gets one clear message (the config refusals are cases
of test_config.py). Where vLLM imports and a CUDA GPU is present (`gpu` marker): the engine's exact
tokens and log-probs against the trainer's recomputation, the adapter swap, sleep / wake, and a
two-update run of the real command line.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.config.errors import UnavailableError
from harness.config.loading import load_run_config
from harness.config.schema import vllm_backend_problem
from harness.rl.engines.vllm import (
    MISSING,
    SEED_HIGH,
    VLLMSampler,
    lora_rank_slot,
    request_seeds,
    turn_from_tokens,
)
from tests.helpers import REPO  # noqa: E402

TINY = REPO / "configs" / "frozenlake_tiny.yaml"
VLLM = ["rollout.backend=vllm", "train.device=cuda"]
HAS_VLLM = importlib.util.find_spec("vllm") is not None
# the engine and the trainer in bfloat16 (vLLM's LoRA kernels take 16-bit dtypes); a tiny base that
# pre-trains in seconds
GPU_OVERRIDES = [*VLLM, "model.dtype=bfloat16", "model.tiny.pretrain_demos=64"]
MEAN_ABS_LOGP_DIFF = 0.05  # bfloat16 engine vs bfloat16 trainer, mean over the sampled tokens


def harness_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


# ----------------------------------------------------------------------------- everywhere
def test_a_supported_config_loads():
    cfg = load_run_config(TINY, VLLM)
    assert cfg.rollout.backend == "vllm" and vllm_backend_problem(cfg) is None


def test_request_seeds_come_from_each_rows_own_stream():
    rows = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
    seeds = request_seeds(rows, 3)
    assert all(0 <= s < SEED_HIGH for s in seeds) and len(set(seeds)) == 3
    # a row's seed depends on its own stream only, and the stream advances by one draw per turn
    again = request_seeds([torch.Generator().manual_seed(s) for s in (9, 2, 7)], 3)
    assert again[1] == seeds[1] and again[0] != seeds[0]
    assert request_seeds(rows, 3) != seeds
    shared = request_seeds(torch.Generator().manual_seed(5), 4)
    assert shared == request_seeds(torch.Generator().manual_seed(5), 4) and len(shared) == 4


def test_turn_output_keeps_the_end_of_turn_token():
    eot = 7
    out = turn_from_tokens([[3, 4, eot], [5, 6, 8]], [[-0.1, -0.2, -0.3], [-1.0, -2.0, -3.0]], eot)
    assert out.ids == [[3, 4, eot], [5, 6, 8]]
    assert out.logprobs[0] == [-0.1, -0.2, -0.3]
    assert out.overflow == [False, True]  # row 1 ran out of max_new_tokens without eot
    assert out.raw_logprobs == [None, None] and out.allowed is None
    with pytest.raises(RuntimeError, match="2 tokens and 1 log-probs"):
        turn_from_tokens([[3, eot]], [[-0.5]], eot)


def test_lora_rank_slots():
    assert [lora_rank_slot(r) for r in (1, 8, 9, 16, 300, 512)] == [8, 8, 16, 16, 320, 512]


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here: the missing-package message cannot show")
def test_without_vllm_a_run_is_one_clear_message(tmp_path):
    out = harness_cli("run", str(TINY), *[a for kv in VLLM for a in ("-o", kv)], "--no-mlflow", "--out", str(tmp_path))
    assert out.returncode == 1, out.stderr
    assert MISSING in out.stderr and "Traceback" not in out.stderr
    assert not any(tmp_path.iterdir())  # nothing started
    with pytest.raises(UnavailableError, match="needs the vllm package"):
        VLLMSampler(load_run_config(TINY, VLLM), "unused", "cuda")


# ----------------------------------------------------------------------------- where vLLM runs
NO_VLLM = "vLLM is not installed (it needs a CUDA machine); rollout.backend vllm is untested here"
vllm_gpu = pytest.mark.skipif(
    not (HAS_VLLM and torch.cuda.is_available()), reason=NO_VLLM if not HAS_VLLM else "needs a CUDA GPU"
)


@pytest.fixture
def vllm_module():
    return pytest.importorskip("vllm", reason=NO_VLLM)


def _trainer_logprobs(policy, prompt: list[int], actions: list[list[int]], temperature: float) -> list[list[float]]:
    """The trainer's log-probs of each row's action after `prompt` (harness.model.logprobs)."""
    from harness.model.logprobs import token_logprobs

    out = []
    for action in actions:
        ids = torch.tensor([prompt + action], device="cuda")
        with torch.no_grad():
            logp, _ = token_logprobs(policy.model, ids, torch.ones_like(ids), temperature=temperature)
        out.append(logp[0, len(prompt) :].float().tolist())
    return out


def _mean_abs(a: list[list[float]], b: list[list[float]]) -> float:
    pairs = [(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb, strict=True)]
    return sum(abs(x - y) for x, y in pairs) / len(pairs)


@pytest.mark.gpu
@vllm_gpu
def test_engine_tokens_logprobs_and_adapter_swap(vllm_module):
    from harness.model.cache import cache_dir
    from harness.model.pipeline import attach_adapter, base_model
    from harness.rl.demos import Demonstrations

    cfg = load_run_config(TINY, GPU_OVERRIDES)
    source, info = base_model(cfg, cache_dir(), Demonstrations.of(cfg))
    policy = attach_adapter(cfg, source, info, "cuda")
    engine = VLLMSampler(cfg, source, "cuda")
    prompt = policy.chat.prompt("Reach the goal.", "S F F\nF H F\nF F G")
    sample = {"eot_id": policy.chat.eot_id, "max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0, "greedy": False}

    def turn():
        streams = [torch.Generator().manual_seed(s) for s in range(6)]
        return engine.sample_turn([prompt] * 6, None, generator=streams, **sample)

    try:
        assert engine.sleeping  # built asleep: the evaluation before RL runs on our sampler
        engine.wake()
        engine.sync(policy, 0)
        first = turn()
        for ids, over in zip(first.ids, first.overflow):
            assert 1 <= len(ids) <= 8 and policy.chat.eot_id not in ids[:-1]
            assert over == (ids[-1] != policy.chat.eot_id)
        assert _mean_abs(first.logprobs, _trainer_logprobs(policy, prompt, first.ids, 1.0)) < MEAN_ABS_LOGP_DIFF
        assert turn().ids == first.ids  # the request seeds come from the rows' streams

        # the adapter after an "update": the engine must sample from it, not from the base
        g = torch.Generator(device="cuda").manual_seed(0)
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.data.normal_(0.0, 0.5, generator=g)
        engine.sync(policy, 1)
        second = turn()
        assert (second.ids, second.logprobs) != (first.ids, first.logprobs)
        assert _mean_abs(second.logprobs, _trainer_logprobs(policy, prompt, second.ids, 1.0)) < MEAN_ABS_LOGP_DIFF

        engine.sleep()  # weights to CPU, KV cache dropped; after waking, the same adapter samples the same
        engine.wake()
        assert turn().ids == second.ids
    finally:
        engine.close()


@pytest.mark.gpu
@pytest.mark.slow
@vllm_gpu
def test_two_update_run_of_the_command_line(tmp_path, vllm_module):
    overrides = [
        *GPU_OVERRIDES,
        "train.updates=2",
        "train.eval_every=0",
        "train.eval_episodes=8",
        "env.heldout_tasks=8",
        "train.threads=0",
    ]
    out = harness_cli(
        "run", str(TINY), *[a for kv in overrides for a in ("-o", kv)], "--no-mlflow", "--out", str(tmp_path)
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (metrics,) = tmp_path.rglob("metrics.jsonl")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    trained = [r for r in rows if "diag/logprob_mismatch" in r]
    assert len(trained) == 2
    # the sampler's log-probs in the batch are vLLM's, the recomputation the trainer's: close, not equal
    assert all(0 < r["diag/logprob_mismatch"] < MEAN_ABS_LOGP_DIFF for r in trained)
