"""The rollout engines, behind the turn contracts of `harness.rl.engines.base`:

    hf      KVBatch: the model's own forward over a growing HF cache (default; exact on CPU)
    static  StaticKVBatch: a preallocated cache, fused attention, CUDA graphs for the decode step
    vllm    VLLMSampler: vLLM's engine with the trainer's LoRA adapter (a turn sampler: `sample_turn`)

The episode loop (`harness.rl.rollout`) drives them and holds no engine of its own. Which weights an
engine runs (the trainer's model, a copy in another dtype, a stale snapshot) is the rollout worker's
choice (`harness.rl.sampler_copy`), not the engine's.
"""

from __future__ import annotations

from harness.rl.engines.base import KVEngine
from harness.rl.engines.hf import KVBatch
from harness.rl.engines.static import static_kv_batch


def kv_batch(model, pad_id: int, backend: str = "hf") -> KVEngine:
    """The KV engine of `rollout.backend` for `model`: a fresh `KVBatch` (hf), or the model's
    `StaticKVBatch` (static), kept across calls so its buffers and CUDA graphs are built once."""
    if backend == "static":
        return static_kv_batch(model, pad_id)
    return KVBatch(model, pad_id)
