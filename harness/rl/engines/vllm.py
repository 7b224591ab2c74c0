"""`rollout.backend: vllm`: vLLM's engine samples the training rollouts with the trainer's LoRA adapter.

`VLLMSampler` is a turn sampler for `harness.rl.rollout.collect` (`harness.rl.engines.base.TurnSampler`:
it has `sample_turn`): each turn, every live row's whole context goes in as token ids and one action
per row comes back as `TurnOutput`. The rollout worker (harness.rl.worker) wakes it, gives it the
current adapter and puts it back to sleep around every training rollout (`awake`), so the update has
the GPU memory.

vLLM's public offline API used here (docs.vllm.ai: "Offline Inference", "LoRA Adapters",
"Sleep Mode", and the API reference of vllm.LLM, vllm.SamplingParams, vllm.inputs.TokensPrompt,
vllm.lora.request.LoRARequest):
  - `LLM(model, tokenizer, dtype, seed, enable_lora, max_lora_rank, max_loras, enable_prefix_caching,
    enable_sleep_mode, gpu_memory_utilization, logprobs_mode, generation_config)`;
  - `LLM.generate(prompts=[TokensPrompt(prompt_token_ids=...)], sampling_params=[SamplingParams, one per
    prompt], lora_request=LoRARequest(name, int_id, path), use_tqdm=False)`: outputs in prompt order,
    each `.outputs[0]` with `token_ids`, `logprobs` (per generated token a dict token id -> Logprob with
    `.logprob`) and `finish_reason`;
  - `SamplingParams(temperature, top_p, max_tokens, stop_token_ids, ignore_eos, logprobs=0, seed,
    detokenize=False)`; `LLM.sleep(level=1)` / `LLM.wake_up()`.

What the engine gives, against our own sampler's contract (harness.rl.rollout.generate_turn):
  - Exact tokens. Token ids in (TokensPrompt), token ids out (nothing is detokenized or re-encoded).
    A turn stops only at `eot_id` (`stop_token_ids=[eot_id]`, `ignore_eos=True` so neither the
    tokenizer's EOS nor the model's generation config stops it) and keeps it: vLLM appends a sampled
    token to the output before its stop check. `sample_turn` refuses an output that stopped without
    ending on eot_id rather than guess.
  - Log-probs. `logprobs_mode="processed_logprobs"`: vLLM's sampler takes the log-softmax of the
    logits after temperature and top-k / top-p. With `rollout.top_p: 1` (the default) that is exactly
    our convention, log_softmax(logits / T) (harness.rl.sampling). With top_p < 1 vLLM renormalises
    over the nucleus (its value = ours - log(nucleus mass), never lower); the config refuses that with
    an off-policy correction (`vllm_backend_problem`), and `diag/mismatch_*` shows the gap. Greedy
    turns (temperature 0) get vLLM's untempered log_softmax(logits). The default mode
    (raw_logprobs) would be the log-softmax before temperature: ours only at T = 1. These are the
    behaviour log-probs of the mismatch diagnostics and corrections; the trainer recomputes its own.
  - Randomness. Each request's `SamplingParams.seed` is one number drawn (`torch.randint`) from the
    row's stream (or, with one shared generator, one per row in order), so a run is reproducible
    from train.seed up to vLLM's numerics (batch composition and kernels can change low bits).
    vLLM's seeded draws are not our inverse-CDF common random numbers: the same seed gives other
    tokens than rollout.backend hf.
  - Adapter. `sync` writes the PEFT adapter to a fresh folder and the next turns use
    `LoRARequest(f"update{done}", done + 1, folder)`: vLLM caches adapters by integer id, so each
    version needs a new one. The base weights are loaded once from the folder (or hub id) the
    trainer's policy was built from (base model, or its SFT warm-up).
  - Prefix caching. Every turn resends each row's whole context (the engine has no row-persistent
    KV cache); `enable_prefix_caching` reuses the cached blocks of earlier turns and of the prompt a
    group shares. The cache is keyed by adapter, and `LLM.sleep` resets it.
  - Memory. The engine shares the trainer's GPU: it may take `VLLM_FREE_MEMORY_SHARE` of the memory
    free when it starts (weights, activations, KV cache). `sleep(level=1)` offloads its weights to
    CPU memory and discards its KV cache for the trainer's update and evaluation.
Held-out evaluation and ACT questions stay on our own sampler on the trainer's model, so their
common-random-number streams and cached start evaluation are those of every other backend.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from harness.config.errors import UnavailableError
from harness.config.schema import RunConfig
from harness.rl.engines.base import TurnOutput

MISSING = "rollout.backend vllm needs the vllm package (pip install vllm on a CUDA machine); it is not installed here"
# share of the GPU memory free when the engine starts that vLLM may take; the rest stays the trainer's
VLLM_FREE_MEMORY_SHARE = 0.5
# vLLM's LoRA slot sizes (vllm.config.lora.MaxLoRARanks from 8 up; 1 is missing from older versions)
LORA_RANK_SLOTS = (8, 16, 32, 64, 128, 256, 320, 512)
SEED_HIGH = 2**31 - 1  # request seeds in [0, 2**31 - 1): accepted by every vLLM sampling path


def vllm_problem(cfgs: list[RunConfig]) -> str | None:
    """The one-line reason the configs cannot run here (vllm missing), without importing vllm."""
    if any(c.rollout.backend == "vllm" for c in cfgs) and importlib.util.find_spec("vllm") is None:
        return MISSING
    return None


def lora_rank_slot(r: int) -> int:
    """The smallest vLLM `max_lora_rank` that holds an adapter of rank r."""
    return next(s for s in LORA_RANK_SLOTS if s >= r)


def request_seeds(generator: torch.Generator | list[torch.Generator], rows: int) -> list[int]:
    """One vLLM request seed per row: from the row's own stream, or `rows` draws from a shared one."""
    if isinstance(generator, torch.Generator):
        return torch.randint(0, SEED_HIGH, (rows,), generator=generator, device=generator.device).tolist()
    return [int(torch.randint(0, SEED_HIGH, (1,), generator=g, device=g.device)) for g in generator]


def turn_from_tokens(token_ids: list[list[int]], logprobs: list[list[float]], eot_id: int) -> TurnOutput:
    """The `TurnOutput` of one turn from each row's generated ids and their log-probs."""
    for b, (ids, lps) in enumerate(zip(token_ids, logprobs)):
        if not ids or len(ids) != len(lps):
            raise RuntimeError(f"vLLM returned {len(ids)} tokens and {len(lps)} log-probs for row {b}")
    return TurnOutput(
        ids=[list(ids) for ids in token_ids],
        logprobs=[list(lps) for lps in logprobs],
        raw_logprobs=[None] * len(token_ids),
        overflow=[ids[-1] != eot_id for ids in token_ids],
    )


def import_vllm():
    """The vllm module, or UnavailableError with `MISSING`."""
    try:
        import vllm
    except ImportError:
        raise UnavailableError(MISSING) from None
    return vllm


def memory_share(device: torch.device | str) -> float:
    """`gpu_memory_utilization` (a fraction of the whole GPU) = VLLM_FREE_MEMORY_SHARE of what is free now."""
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return round(VLLM_FREE_MEMORY_SHARE * free / total, 3)


class VLLMSampler:
    """vLLM's engine on the policy's base model, with the trainer's adapter (see the module docstring)."""

    training = False  # collect's external engine: never put in train mode

    def __init__(self, cfg: RunConfig, source: str, device: torch.device | str):
        self.vllm = import_vllm()
        if torch.device(device).type != "cuda" or not torch.cuda.is_available():
            raise UnavailableError(
                f"rollout.backend vllm needs a CUDA GPU; train.device = {cfg.train.device!r} gives {device}"
            )
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest

        self._prompt, self._lora_request = TokensPrompt, LoRARequest
        self.llm = self.vllm.LLM(
            model=source,
            tokenizer=source,
            dtype=cfg.model.dtype,
            seed=cfg.train.seed,
            enable_lora=True,
            max_lora_rank=lora_rank_slot(cfg.model.lora.r),
            max_loras=1,
            enable_prefix_caching=True,
            enable_sleep_mode=True,
            gpu_memory_utilization=memory_share(device),
            logprobs_mode="processed_logprobs",
            generation_config="vllm",  # no sampling defaults from the model's generation_config.json
        )
        self.scratch = Path(tempfile.mkdtemp(prefix="harness-vllm-"))
        self.lora = None  # the LoRARequest of the adapter in use (None before the first sync)
        self.sleeping = False
        self.sleep()  # until the first training rollout (the evaluation before RL runs on our sampler)

    # ------------------------------------------------------------------ adapter and memory
    def sync(self, policy, done: int) -> None:
        """Use the policy's adapter after `done` optimizer updates from the next turn on. Only the
        PEFT adapter is written (adapter_config.json + weights): no tokenizer or value head."""
        folder = self.scratch / f"update{done}"
        policy.model.save_pretrained(str(folder))
        old, self.lora = self.lora, self._lora_request(f"update{done}", done + 1, str(folder))
        if old is not None and old.lora_path != str(folder):
            shutil.rmtree(old.lora_path, ignore_errors=True)  # its id is never requested again

    def sleep(self) -> None:
        """Weights to CPU memory, KV cache (and prefix cache) dropped: the GPU is the trainer's."""
        if not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake(self) -> None:
        if self.sleeping:
            torch.cuda.empty_cache()  # hand the trainer's cached blocks back before vLLM reallocates
            self.llm.wake_up()
            self.sleeping = False

    @contextmanager
    def awake(self, policy, done: int) -> Iterator[VLLMSampler]:
        """Awake with the adapter after `done` updates for the body (a training rollout), asleep after."""
        self.wake()
        self.sync(policy, done)
        try:
            yield self
        finally:
            self.sleep()

    def close(self) -> None:
        self.llm = None
        shutil.rmtree(self.scratch, ignore_errors=True)

    # ------------------------------------------------------------------ one turn
    def sample_turn(
        self,
        new_ids: list[list[int]],
        tries,
        *,
        generator: torch.Generator | list[torch.Generator],
        eot_id: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        greedy: bool,
    ) -> TurnOutput:
        """One action per row from its whole context `new_ids` (the contract of `generate_turn`);
        wakes the engine if it sleeps."""
        if tries is not None and any(t is not None for t in tries):
            raise ValueError("rollout.backend vllm cannot constrain decoding (rollout.constrain)")
        self.wake()
        params = [
            self.vllm.SamplingParams(
                temperature=0.0 if greedy else temperature,
                top_p=1.0 if greedy else top_p,
                max_tokens=max_new_tokens,
                stop_token_ids=[eot_id],
                ignore_eos=True,
                logprobs=0,  # the sampled token's log-prob only
                seed=seed,
                detokenize=False,
            )
            for seed in request_seeds(generator, len(new_ids))
        ]
        prompts = [self._prompt(prompt_token_ids=list(ids)) for ids in new_ids]
        outs = self.llm.generate(prompts, params, lora_request=self.lora, use_tqdm=False)
        ids, lps = [], []
        for out in outs:
            o = out.outputs[0]
            toks = list(o.token_ids)
            if o.finish_reason == "stop" and toks and toks[-1] != eot_id:
                raise RuntimeError(f"vLLM stopped a turn without returning its stop token {eot_id} (finish 'stop')")
            ids.append(toks)
            lps.append([float(step[t].logprob) for step, t in zip(o.logprobs or [], toks)])
        return turn_from_tokens(ids, lps, eot_id)
