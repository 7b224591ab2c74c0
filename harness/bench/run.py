"""Speed and memory as ratios against a baseline measured in the same process.

Nothing here is pass/fail: each benchmark reports both sides and their ratio; the targets
below are what we aim for.

- rollout throughput, batched (B=16) vs one episode at a time          target >= 5x
- generation cost of turn 8 vs turn 1, concatenated layout, KV reuse   target <= 1.5x
- one update vs TRL's GRPOTrainer step, same model / LoRA and the same number of generated
  tokens on both sides (every completion forced to rollout.max_new_tokens)   target <= 1.0x the time
- peak memory of the log-prob computation vs a naive log-softmax      target <= 0.25x
- a training loop with the concurrent rollout process vs the synchronous loop (--only concurrent)
- generation engines at a real model's shape (harness.bench.engines): HF `generate` vs our sampler
  (hf and static backends) and the memory-bandwidth floor           target (GPU, 0.5B, B=256):
                                                                      static >= 10x generate and
                                                                      >= 20% of the floor
- one call of the code sandbox vs the same interpreter run bare (per-call overhead, --only sandbox)
- the update at a real model's shape: tokens/s and peak memory, with and without activation
  checkpointing                                                      target (GPU, 0.5B, 8 x 2048):
                                                                      peak <= 16 GiB
- a real model on this machine (--only real, harness.bench.real): the matmul floor, HF `generate`
  vs our engines at batches 32 and 1, seconds per update split into rollout / log-probs / update
                                                                      target (CPU, SmolLM2-135M, B=32):
                                                                      sampler >= 40% of the floor and
                                                                      >= 1x generate
On a GPU the shape parts default to Qwen2.5-0.5B's shape in bf16 (batches 64 and 256, 512-token
prompts, 256 new tokens; update 8 x 2048); on a CPU to a small stand-in in float32 (batches 4 and
16, 128 + 32 tokens; update 2 x 256), so that `harness bench` prints the same figures everywhere.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from harness.bench.timing import NullLogger
from harness.config.schema import RunConfig


def bench_device(cfg: RunConfig) -> str:
    """train.device, with auto = cuda when there is one (both sides of every ratio use it)."""
    if cfg.train.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.train.device


def bench_rollout(policy, cfg: RunConfig, batch: int = 16) -> dict:
    from harness.bench.rollout import bench_batched_vs_sequential, bench_turn_cost

    thr = bench_batched_vs_sequential(policy.model, policy.chat, cfg, batch=batch, turns=4)
    turn = bench_turn_cost(policy.model, policy.chat, cfg, batch=batch, turns=8)
    return {"rollout_batched_vs_sequential": thr, "turn8_vs_turn1": turn}


def bench_logprob_memory(model, batch: int = 8, length: int = 512) -> dict:
    """Peak memory of the chunked log-probs (forward + backward, from the hidden states on) vs
    a naive full-vocabulary log-softmax, on `model` with random token ids."""
    from harness.bench.memory import peak_memory_ratio

    g = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (batch, length), generator=g).to(next(model.parameters()).device)
    return peak_memory_ratio(model, ids, torch.ones_like(ids), chunk_size=256)


def qwen05b_shaped_head_model() -> torch.nn.Module:
    """One decoder layer with Qwen2.5-0.5B's width and vocabulary (896, 151,936), random weights:
    the log-prob memory question is about the output layer, which this reproduces exactly."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from harness.bench.engines import SHAPES

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**{**SHAPES["0.5b"], "num_hidden_layers": 1})).eval()
    for p in model.parameters():  # frozen, as under LoRA: the gradient flows into the hidden states
        p.requires_grad_(False)
    return model


def _single_turn(cfg: RunConfig) -> RunConfig:
    """The single-turn case of the comparison: one turn, no evaluation, no MI proxy, no constraint
    (TRL samples unconstrained)."""
    d = cfg.model_dump()
    d["turns"].update({"max": 1, "curriculum": []})
    d["train"].update({"eval_every": 0, "mi_every": 0})
    d["algo"].update({"epochs": 1, "minibatches": 1})
    d["rollout"].update({"constrain": False})
    return RunConfig.model_validate(d)


@contextmanager
def never_ends(model, token_id: int) -> Iterator[None]:
    """Every forward of `model` gives `token_id` the lowest logit, so no action ends before
    rollout.max_new_tokens: what HF's `min_new_tokens` does to the end token during generation,
    here for our sampler (the update sees the same logits, so its work is unchanged)."""
    head = model.get_output_embeddings()

    def hook(_module, _inputs, logits):
        logits[..., token_id] = torch.finfo(logits.dtype).min
        return logits

    handle = head.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def ours_update_seconds(cfg: RunConfig, steps: int) -> tuple[list[tuple[float, float]], list[int], list[int]]:
    """(wall, CPU) seconds of our rollout + update per step (first step is warm-up), and per timed step the
    completion tokens and all tokens trained (prompts included); every action is forced to
    rollout.max_new_tokens tokens (`never_ends`)."""
    from harness.rl.trainer import Trainer

    cfg = _single_turn(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        tr = Trainer(cfg, Path(tmp), NullLogger())
        try:
            times, tokens, trained = [], [], []
            with never_ends(tr.policy.model, tr.policy.chat.eot_id):
                for k in range(steps + 1):
                    t0, c0 = time.perf_counter(), time.process_time()
                    m = tr.one_update(k + 1)
                    times.append((time.perf_counter() - t0, time.process_time() - c0))
                    tokens.append(int(m.get("perf/rollout_tokens", 0)))
                    trained.append(int(m.get("perf/train_tokens", 0)))
        finally:
            tr.close()
    return times[1:], tokens[1:], trained[1:]


def trl_step_seconds(cfg: RunConfig, steps: int) -> tuple[list[tuple[float, float]], list[int], float]:
    """(wall, CPU) seconds per GRPOTrainer step on the same base model, LoRA config and batch shape (first
    step is warm-up), the completion tokens of each timed step (every completion forced to
    rollout.max_new_tokens by `min_new_tokens`), and the mean prompt length in tokens."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from envs import make_env
    from harness.model.cache import cache_dir
    from harness.rl.build import load_policy
    from harness.transcript.chat import prompt_text

    policy = load_policy(cfg, cache_dir(), "cpu")
    # the plain base model; TRL adds the same LoRA adapter itself (peft_config below)
    base = policy.model.unload() if hasattr(policy.model, "unload") else policy.model
    env = make_env(cfg.env.name, cfg.env.options)
    prompts = []
    for seed in type(env).task_seeds("train", cfg.rollout.tasks_per_update * (steps + 1), cfg.env.options):
        obs, _ = env.reset(seed)
        prompts.append(prompt_text(env.instructions, obs))
    valid = {"up", "down", "left", "right"}
    completion_tokens: list[int] = []  # per reward call (one per step)

    def reward(completions, completion_ids=None, **_):  # cheap and env-like: 1 for a valid move
        completion_tokens.append(sum(len(ids) for ids in completion_ids or []))
        return [float(c.strip().lower() in valid) for c in completions]

    times: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, *a, **k):
            times.append((time.perf_counter() - self.t0, time.process_time() - self.c0))

    ro, lora = cfg.rollout, cfg.model.lora
    n = ro.tasks_per_update * ro.group_size
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=n,
            num_generations=ro.group_size,
            max_completion_length=ro.max_new_tokens,
            generation_kwargs={"min_new_tokens": ro.max_new_tokens},  # equal work: no early end
            max_steps=steps + 1,
            report_to=[],
            use_cpu=bench_device(cfg) == "cpu",
            beta=cfg.algo.kl.coef,
            temperature=ro.temperature,
            learning_rate=cfg.algo.lr,
            save_strategy="no",
            disable_tqdm=True,
            logging_steps=10**6,
            seed=cfg.train.seed,
        )
        trainer = GRPOTrainer(
            model=base,
            reward_funcs=reward,
            args=args,
            processing_class=policy.tokenizer,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            callbacks=[Clock()],
            peft_config=LoraConfig(
                r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules)
            ),
        )
        trainer.train()
    prompt_tokens = statistics.mean(len(policy.tokenizer(p)["input_ids"]) for p in prompts)
    return times[1:], completion_tokens[1:], prompt_tokens


def bench_trl(cfg: RunConfig, steps: int) -> dict:
    """One update of ours vs one GRPOTrainer step, the same number of generated tokens on both
    sides; seconds of wall time and of this process's CPU time (less sensitive to other load)."""
    ours, tokens, trained = ours_update_seconds(cfg, steps)
    trl, trl_tokens, trl_prompt = trl_step_seconds(cfg, steps)
    n = cfg.rollout.tasks_per_update * cfg.rollout.group_size
    ours_s, trl_s = statistics.median(t[0] for t in ours), statistics.median(t[0] for t in trl)
    ours_cpu, trl_cpu = statistics.median(t[1] for t in ours), statistics.median(t[1] for t in trl)
    ours_tok, trl_tok = statistics.median(tokens), statistics.median(trl_tokens)
    return {
        "ours_s": ours_s,
        "trl_s": trl_s,
        "ratio": ours_s / trl_s,
        "ours_cpu_s": ours_cpu,
        "trl_cpu_s": trl_cpu,
        "ratio_cpu": ours_cpu / trl_cpu,
        "ours_completion_tokens": ours_tok,  # per step, measured
        "trl_completion_tokens": trl_tok,
        "forced_completion_tokens": n * cfg.rollout.max_new_tokens,
        "ours_tokens_per_s": ours_tok / ours_s,  # generated tokens per second of a whole step
        "trl_tokens_per_s": trl_tok / trl_s,
        "ours_prompt_tokens_per_episode": (statistics.median(trained) - ours_tok) / n,
        "trl_prompt_tokens_per_episode": trl_prompt,
        "episodes": n,
        "steps": steps,
    }


# sizes of the shape parts (harness.bench.engines) on each kind of device
SHAPE_SIZES = {
    "cuda": {
        "shape": "0.5b",
        "dtype": "bfloat16",
        "batches": (64, 256),
        "prompt": 512,
        "new_tokens": 256,
        "update_batch": 8,
        "update_tokens": 2048,
        "repeats": 1,  # HF generate at batch 256 takes ~20 s a run (issue 18: ~80 ms a step)
    },
    "cpu": {
        "shape": "small",
        "dtype": "float32",
        "batches": (4, 16),
        "prompt": 128,
        "new_tokens": 32,
        "update_batch": 2,
        "update_tokens": 256,
        "repeats": 2,
    },
}


def run_bench(
    cfg: RunConfig, steps: int = 3, parts: tuple[str, ...] = ("rollout", "memory", "trl"), shape: str | None = None
) -> dict:
    """Every benchmark in one process; each entry reports both sides and the ratio. `shape`: the
    model shape of the parts engines and update (default: SHAPE_SIZES for the device)."""
    from harness.model.cache import cache_dir
    from harness.rl.build import load_policy

    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    out: dict = {"threads": torch.get_num_threads()}
    device = bench_device(cfg)
    out["device"] = device
    if "rollout" in parts or "memory" in parts:  # the others build their own models
        policy = load_policy(cfg, cache_dir(), device)
        policy.model.eval()
    if "rollout" in parts:
        out.update(bench_rollout(policy, cfg))
    if "memory" in parts:
        out["logprob_peak_memory"] = bench_logprob_memory(policy.model)
        out["logprob_peak_memory_qwen05b_head"] = bench_logprob_memory(qwen05b_shaped_head_model().to(device), 2, 512)
    if "trl" in parts:
        out["update_vs_trl_grpo"] = bench_trl(cfg, steps)
    if "real" in parts or "real_update" in parts:
        from harness.bench.real import bench_real

        key = "real" if "real" in parts else "real_update"
        out[key] = bench_real(cfg, updates=steps, sampling="real" in parts)
    if "learner" in parts:
        from harness.bench.learner import bench_learner

        out["learner_plans"] = bench_learner(cfg, repeats=steps)
    if "rollout_share" in parts:
        from harness.bench.rollout_share import bench_rollout_share

        out["rollout_share_prefix"] = bench_rollout_share(cfg, repeats=steps)
    if "sandbox" in parts:
        from harness.bench.sandbox import bench_sandbox

        out["sandbox"] = bench_sandbox()
    if "concurrent" in parts:
        out["concurrent_vs_synchronous"] = bench_concurrent(cfg, steps)
    if "engines" in parts or "update" in parts:
        from harness.bench.engines import bench_engines, bench_update

        size = dict(SHAPE_SIZES["cuda" if device == "cuda" else "cpu"])
        if shape is not None:
            size["shape"] = shape
        if "engines" in parts:
            out["engines"] = bench_engines(
                size["shape"],
                device=device,
                dtype=size["dtype"],
                batches=size["batches"],
                prompt=size["prompt"],
                new_tokens=size["new_tokens"],
                repeats=size["repeats"],
            )
        if "update" in parts:
            out["update_at_shape"] = bench_update(
                size["shape"],
                device=device,
                dtype=size["dtype"],
                batch=size["update_batch"],
                tokens=size["update_tokens"],
                repeats=size["repeats"],
            )
    return out


def _train_seconds(cfg: RunConfig) -> tuple[float, list[dict]]:
    """Wall time of the whole training loop (`harness.rl.trainer.train`) and its metric rows."""
    from harness.rl.trainer import train

    class Rows(NullLogger):
        def __init__(self):
            self.rows: list[dict] = []

        def log(self, update, metrics) -> None:
            self.rows.append({"update": update, **metrics})

    logger = Rows()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        train(cfg, Path(tmp), logger)
        return time.perf_counter() - t0, logger.rows


def bench_concurrent(cfg: RunConfig, updates: int, staleness: int = 1, repeats: int = 2) -> dict:
    """The same `updates` with the rollout in the learner's process (synchronous) and in a concurrent
    rollout process (`rollout.concurrent`, lag <= `staleness`), interleaved `repeats` times; the
    evaluation only before RL (cached) and after the last update, identical on both sides. Ratio =
    concurrent / synchronous wall time (< 1: the overlap pays for the second process)."""
    d = cfg.model_dump()
    d["train"].update({"updates": updates, "eval_every": 0, "checkpoint_every": 0, "mi_every": 0})
    d["tracking"].update({"mlflow": False})
    sync_cfg = RunConfig.model_validate(d)
    d["rollout"].update({"concurrent": True, "staleness": staleness})
    conc_cfg = RunConfig.model_validate(d)
    _train_seconds(sync_cfg)  # warm-up: caches (tiny model, SFT, start evaluation)
    sync, conc, lags = [], [], []
    for _ in range(repeats):
        sync.append(_train_seconds(sync_cfg)[0])
        seconds, rows = _train_seconds(conc_cfg)
        conc.append(seconds)
        lags += [r["rollout/staleness"] for r in rows if "rollout/staleness" in r]
    return {
        "updates": updates,
        "staleness_bound": staleness,
        "synchronous_s": statistics.median(sync),
        "concurrent_s": statistics.median(conc),
        "ratio": statistics.median(conc) / statistics.median(sync),
        "mean_staleness": sum(lags) / max(len(lags), 1),
        "repeats": repeats,
    }
