"""The static KV engine of the rollout (`rollout.backend: static`): our sampler on a preallocated
KV cache, with fused attention and, on a GPU, CUDA graphs for the decode step.

`KVBatch` (harness.rl.engines.hf) runs the model's own forward over a growing cache with an explicit
(B, 1, L, T) float mask. That is exact and fine on a CPU, but on a GPU a decode step of a small
model is bound by per-kernel launch overhead (HF `generate` spends about 80 ms a step whatever the
model size; issue 18's table). This engine keeps the same contract (`harness.rl.engines.base.KVEngine`:
`reset`, `select`, `feed`, `prefill`: left padding, holes for rows that finished their action,
positions counted over real tokens only, every slot sees itself) and computes the same logits, but:

- the cache is one preallocated buffer per K and V, (layers, rows, kv heads, slots, head dim),
  grown by doubling only when a turn does not fit (which drops the captured graphs);
- the decoder is run layer by layer here, calling the model's own modules (norms, the q/k/v/o
  projections with their LoRA adapters, the MLP, the rotary embedding), with attention through
  `scaled_dot_product_attention`. Grouped-query heads are folded, not repeated: the G query heads
  that share a K/V head become G query rows against it, (B, Hq, L, D) -> (B, Hkv, G*L, D), so no
  kernel copies K and V G times (with `enable_gqa` and a mask, PyTorch may fall back to a kernel
  that repeats them, as its reference implementation does) and any fused kernel that takes a mask
  applies;
- a decode step (one token per row) needs only a key-padding mask (rows, 1, 1, slots): a slot is
  visible when it holds a real token or is the row's own new slot;
- on CUDA the decode step is captured once per (row bucket, slot bucket) as a CUDA graph and
  replayed: rows round up to a power of two, the attended slots up to a multiple of 256, and the
  padded rows and slots are masked out, so a replay computes the same values for the real rows.
  `HARNESS_CUDA_GRAPHS=0` runs the same static-shape step eagerly (for debugging).

Prefill (several tokens a row) runs eagerly with a (rows, 1, L, slots) boolean mask; it is a
small share of a turn. Supported: decoder-only models with full attention whose layers have
`self_attn.{q,k,v,o}_proj` and pre-norms (Qwen2, Qwen3 with its q/k norms, Llama). The graphs
assume the modules stay as captured (same adapter on, same parameters updated in place, as the
optimizer and `SamplerModel` do); `reset` re-checks which LoRA adapters are active and drops the
graphs when that changed. docs/algorithms.md#engines has the account.
"""

from __future__ import annotations

import os
import weakref

import torch
import torch.nn.functional as F

from harness.rl.engines.base import attention_layer_types, left_padded, squeeze_order

SUPPORTED = ("qwen2", "qwen3", "llama")
SLOT_BUCKET = 256  # attended slots of a captured decode step round up to a multiple of this
MIN_SLOTS = 256  # slots allocated at least; the buffer doubles when a turn does not fit


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, L, D); cos, sin (B, L, D): the rotary embedding as HF's Qwen2 / Llama apply it."""
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


def _bucket_rows(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _adapter_state(model) -> tuple:
    """Which LoRA layers are switched off or merged (PEFT flags); a change invalidates the graphs."""
    flags = []
    for m in model.modules():
        if hasattr(m, "lora_A"):
            flags.append((bool(getattr(m, "disable_adapters", False)), bool(getattr(m, "merged", False))))
    return tuple(flags)


class StaticKVBatch:
    """Rows of token streams in one preallocated cache; see the module docstring."""

    def __init__(self, model, pad_id: int, *, graphs: bool | None = None, buckets: bool | None = None):
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = base.config
        if cfg.model_type not in SUPPORTED:
            raise ValueError(
                f"rollout.backend static supports model types {', '.join(SUPPORTED)}; this model is "
                f"{cfg.model_type!r}: use rollout.backend hf"
            )
        layer_types = attention_layer_types(cfg)
        if layer_types is not None:
            raise ValueError(
                f"rollout.backend static supports full-attention models only, got layer types {layer_types}"
            )
        self.model, self.pad_id = model, pad_id
        self.decoder, self.head = base.get_decoder(), base.get_output_embeddings()
        self.layers = list(self.decoder.layers)
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.n_q, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        emb = self.decoder.embed_tokens.weight
        self.device, self.dtype = emb.device, emb.dtype
        on_cuda = self.device.type == "cuda"
        env_graphs = os.environ.get("HARNESS_CUDA_GRAPHS", "1") != "0"
        self.graphs_on = (on_cuda and env_graphs) if graphs is None else graphs
        if self.graphs_on and not on_cuda:
            raise ValueError("CUDA graphs need the model on a CUDA device")
        # buckets: decode steps run at the bucketed (static) shapes; always with graphs
        self.buckets = self.graphs_on if buckets is None else (buckets or self.graphs_on)
        self._graphs: dict[tuple[int, int], tuple] = {}
        self._pool = None
        self._adapters = _adapter_state(model)
        self.release()  # empty buffers: the first reset allocates them

    # ------------------------------------------------------------------ buffers
    @property
    def capacity(self) -> tuple[int, int]:
        return (0, 0) if self.k is None else (self.k.shape[1], self.k.shape[3])

    def _ensure(self, rows: int, slots: int) -> None:
        """Room for `rows` rows (their bucket) and `slots` slots, keeping the contents."""
        have_r, have_s = self.capacity
        need_r = max(_bucket_rows(rows) if self.buckets else rows, have_r)
        if self.buckets:
            slots = -(-slots // SLOT_BUCKET) * SLOT_BUCKET
        need_s = have_s if slots <= have_s else max(slots, 2 * have_s, MIN_SLOTS)
        if (need_r, need_s) == (have_r, have_s):
            return
        shape = (len(self.layers), need_r, self.n_kv, need_s, self.head_dim)
        # plain tensors even when the cache grows under a caller's torch.inference_mode: an inference
        # tensor cannot be written in place outside it, which the next `reset` does (an H200 bench
        # whose prompts outgrew the first allocation failed so)
        with torch.inference_mode(False):
            k = torch.zeros(shape, dtype=self.dtype, device=self.device)
            v = torch.zeros(shape, dtype=self.dtype, device=self.device)
            mask = torch.zeros(need_r, need_s, dtype=torch.bool, device=self.device)
            length = torch.zeros(need_r, dtype=torch.long, device=self.device)
        if self.k is not None:
            k[:, :have_r, :, :have_s], v[:, :have_r, :, :have_s] = self.k, self.v
            mask[:have_r, :have_s], length[:have_r] = self.mask, self.length
        self.k, self.v, self.mask, self.length = k, v, mask, length
        self._drop_graphs()  # they hold the old buffers' addresses
        self._decode_inputs = None

    def release(self) -> None:
        """Free the cache and the graphs (the next turn allocates and captures again)."""
        self.k = self.v = None  # (layers, rows_cap, kv heads, slots_cap, head dim)
        self.mask = torch.zeros(0, 0, dtype=torch.bool, device=self.device)  # (rows_cap, slots_cap) real slots
        self.length = torch.zeros(0, dtype=torch.long, device=self.device)  # (rows_cap,) real tokens
        self.rows = self.slots = 0  # rows in use; slots in use (the same for every row)
        self._drop_graphs()
        self._decode_inputs = None

    def _drop_graphs(self) -> None:
        """Forget the captured graphs and their memory pool. Once its last graph is gone PyTorch frees
        a private pool, and a capture into the stale handle fails an internal assert of the caching
        allocator (`use_count > 0`; seen on an H200 after the first LoRA update changed the adapters):
        the next capture takes a new pool."""
        self._graphs.clear()
        self._pool = None

    def reset(self, rows: int) -> None:
        state = _adapter_state(self.model)
        if state != self._adapters:
            self._drop_graphs()
            self._adapters = state
        self._ensure(rows, 1)
        self.mask.zero_()
        self.length.zero_()
        self.rows, self.slots = rows, 0

    def select(self, rows: list[int]) -> None:
        """Keep `rows` (in this order) and squeeze out holes, as `KVBatch.select` does."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        mask, length = self.mask[idx, : self.slots], self.length[idx]
        order = squeeze_order(mask, length)  # (B, T)
        T = order.shape[1]
        n = len(rows)
        for buf in (self.k, self.v):
            sel = buf[:, idx, :, : self.slots]  # (layers, B, H, T_old, D) copy
            g = order[None, :, None, :, None].expand(sel.shape[0], -1, sel.shape[2], -1, sel.shape[4])
            buf[:, :n, :, :T] = sel.gather(3, g)
        self.mask[:n, :T] = mask.gather(1, order)
        self.mask[:n, T:] = False
        self.mask[n:] = False
        self.length[:n] = length
        self.length[n:] = 0
        self.rows, self.slots = n, T

    # ------------------------------------------------------------------ forward
    def _layers_forward(self, x, pos, attend, write, n_rows: int, n_slots: int):
        """x (B, L, H) embeddings; pos (B, L); attend (B, 1, L, n_slots) bool; write(i, k, v) stores
        layer i's new keys/values. Returns the last position's logits (B, V)."""
        cos, sin = self.decoder.rotary_emb(x, pos)  # (B, L, D)
        B, L = x.shape[:2]
        G = self.n_q // self.n_kv  # query heads per K/V head
        if G > 1 and L > 1:  # each query row's mask, once per folded head: (B, 1, G*L, slots)
            attend = attend.unsqueeze(2).expand(B, 1, G, L, n_slots).reshape(B, 1, G * L, n_slots)
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = a.q_proj(h).view(B, L, self.n_q, self.head_dim)
            k = a.k_proj(h).view(B, L, self.n_kv, self.head_dim)
            if hasattr(a, "q_norm"):  # Qwen3: per-head RMSNorm before the rotary embedding
                q, k = a.q_norm(q), a.k_norm(k)
            q, k = _rope(q.transpose(1, 2), cos, sin), _rope(k.transpose(1, 2), cos, sin)
            v = a.v_proj(h).view(B, L, self.n_kv, self.head_dim).transpose(1, 2)
            write(i, k, v)
            keys, values = self.k[i, :n_rows, :, :n_slots], self.v[i, :n_rows, :, :n_slots]
            # query head h = kv * G + g reads K/V head kv (HF's repeat_kv order): fold g into the rows
            o = F.scaled_dot_product_attention(
                q.reshape(B, self.n_kv, G * L, self.head_dim), keys, values, attn_mask=attend, scale=self.scaling
            ).reshape(B, self.n_q, L, self.head_dim)  # (B, Hkv, G*L, D) -> (B, Hq, L, D)
            x = x + a.o_proj(o.transpose(1, 2).reshape(B, L, self.n_q * self.head_dim))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.head(self.decoder.norm(x[:, -1]))

    def feed(self, ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """Append ids (B, L) whose slots are real where `real` (B, L); logits of the last slot (B, V).
        The returned tensor may be a view of a graph's output: use it before the next `feed`."""
        B, L = ids.shape
        if B != self.rows:
            raise ValueError(f"feed: {B} rows for a batch of {self.rows}")
        if L == 1 and self.buckets:
            return self._decode(ids, real)
        T0 = self.slots
        self._ensure(B, T0 + L)
        self.mask[:B, T0 : T0 + L] = real
        pos = (self.length[:B, None] + real.long().cumsum(1) - 1).clamp(min=0)  # (B, L)
        q = torch.arange(L, device=self.device)[:, None] + T0  # (L, 1)
        k = torch.arange(T0 + L, device=self.device)[None, :]  # (1, T0+L)
        attend = (self.mask[:B, None, : T0 + L] & (k <= q)[None]) | (k == q)[None]  # (B, L, T0+L)

        def write(i, kk, vv):
            self.k[i, :B, :, T0 : T0 + L], self.v[i, :B, :, T0 : T0 + L] = kk, vv

        logits = self._layers_forward(self.decoder.embed_tokens(ids), pos, attend[:, None], write, B, T0 + L)
        self.slots, self.length[:B] = T0 + L, self.length[:B] + real.long().sum(1)
        return logits

    def prefill(self, new_ids: list[list[int]]) -> torch.Tensor:
        """Append a ragged list of segments, left-padded; logits after each row's last token."""
        return self.feed(*left_padded(new_ids, self.pad_id, self.device))

    # ------------------------------------------------------------------ the decode step
    def _step_body(self, Bb: int, Tb: int, inp: dict) -> torch.Tensor:
        """One decode step at static shapes: Bb rows, Tb attended slots; inputs read from `inp`'s
        buffers (ids (Bb, 1), pos (Bb, 1), slot (1,), the new slot's realness (Bb, 1)). This is what
        a CUDA graph captures; it is also run as is without graphs (tests, HARNESS_CUDA_GRAPHS=0)."""
        slot = inp["slot"]
        self.mask[:Bb].index_copy_(1, slot, inp["real"][:Bb])
        own = torch.arange(Tb, device=self.device)[None, :] == slot  # (1, Tb)
        attend = (self.mask[:Bb, :Tb] | own)[:, None, None, :]  # (Bb, 1, 1, Tb)

        def write(i, kk, vv):
            self.k[i, :Bb].index_copy_(2, slot, kk)
            self.v[i, :Bb].index_copy_(2, slot, vv)

        x = self.decoder.embed_tokens(inp["ids"][:Bb])
        return self._layers_forward(x, inp["pos"][:Bb], attend, write, Bb, Tb)

    def _new_decode_inputs(self, cap: int) -> dict[str, torch.Tensor]:
        """The decode step's input buffers for `cap` rows (a captured graph reads these addresses)."""
        return {
            "ids": torch.full((cap, 1), self.pad_id, dtype=torch.long, device=self.device),
            "pos": torch.zeros(cap, 1, dtype=torch.long, device=self.device),
            "real": torch.zeros(cap, 1, dtype=torch.bool, device=self.device),
            "slot": torch.zeros(1, dtype=torch.long, device=self.device),
        }

    def _decode(self, ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        B, T0 = ids.shape[0], self.slots
        self._ensure(B, T0 + 1)
        Bb = _bucket_rows(B)
        Tb = min(-(-(T0 + 1) // SLOT_BUCKET) * SLOT_BUCKET, self.capacity[1])
        cap = self.capacity[0]
        if self._decode_inputs is None:
            with torch.inference_mode(False):  # written in place on every step: plain tensors
                self._decode_inputs = self._new_decode_inputs(cap)
        inp = self._decode_inputs
        inp["ids"][:B] = ids
        inp["ids"][B:] = self.pad_id
        inp["real"][:B] = real
        inp["real"][B:] = False
        inp["pos"][:B] = (self.length[:B, None] + real.long() - 1).clamp(min=0)
        inp["pos"][B:] = 0
        inp["slot"].fill_(T0)
        if self.graphs_on:
            out = self._replay(Bb, Tb, inp)
        else:
            out = self._step_body(Bb, Tb, inp)
        self.slots = T0 + 1
        self.length[:B] += real[:, 0].long()
        return out[:B]

    def _replay(self, Bb: int, Tb: int, inp: dict) -> torch.Tensor:
        entry = self._graphs.get((Bb, Tb))
        if entry is None:
            entry = self._capture(Bb, Tb, inp)
            self._graphs[(Bb, Tb)] = entry
        graph, out = entry
        graph.replay()
        return out

    def _capture(self, Bb: int, Tb: int, inp: dict) -> tuple:
        """Capture the decode step at (Bb, Tb). Warm-up runs on a side stream first (as PyTorch's
        CUDA-graph notes ask); they write the new slot's keys, values and mask bit, the same values
        the replay writes again (earlier slots are only read), so they leave no trace."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step_body(Bb, Tb, inp)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._step_body(Bb, Tb, inp)
        # capture records the work without running it: the replay in `_replay` runs it
        return graph, out


_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def static_kv_batch(model, pad_id: int) -> StaticKVBatch:
    """The model's static engine, made on first use and kept with the model (buffers, graphs)."""
    engine = _ENGINES.get(model)
    if engine is None or engine.pad_id != pad_id:
        engine = StaticKVBatch(model, pad_id)
        _ENGINES[model] = engine
    return engine


def release(model) -> None:
    """Free a model's static engine (its cache and graphs), e.g. before a memory-hungry update."""
    engine = _ENGINES.pop(model, None)
    if engine is not None:
        engine.release()
