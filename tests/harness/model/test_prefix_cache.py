"""The shared prefix's other implementations against the plain pass and the packed one (train.learner.prefix_impl):
through a key-value cache (harness.model.prefix_cache, kv_cache) and packed with its attention computed per
segment (harness.model.segmented, segmented), on a tiny random Qwen2 with a LoRA adapter: hidden states,
log-probs, entropies and LoRA gradients, in float32 (sdpa and eager) and under bfloat16 autocast."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from harness.model import logprobs
from harness.model.base import peft_reads_deprecated_attributes
from harness.model.logprobs import common_prefix, hidden_states, token_logprobs
from tests.helpers.rollout import tiny_model

VOCAB = 300
IMPLS = ["kv_cache", "segmented"]
# float32: the four paths multiply the same numbers in other groupings (other matrix shapes, a softmax over
# other key sets padded with masked slots); measured gaps to the plain and packed passes are at most 1e-6 on
# hidden states (of size ~1), 5e-7 on log-probs and entropies, 3e-7 relative on the LoRA gradient, so 1e-5
# is rounding with margin; a wrong position, prefix mask, row-to-cache map or a detached cache fails it
TOL = 1e-5
# bfloat16 keeps 8 bits of mantissa (relative rounding 4e-3): measured against float32, hidden states move by
# up to 6e-2, log-probs by 2e-3, the gradient by 7e-3 relative; against the bfloat16 plain and packed passes
# about a tenth of that
BF16_TOL = 0.1


def _model(attn: str):
    base = tiny_model(VOCAB, attn=attn, seed=0)  # the rollout tests' shape
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"])
    lora.init_lora_weights = False  # B random too: every LoRA matrix gets a gradient
    with peft_reads_deprecated_attributes():
        return get_peft_model(base, lora).train()


# (key, prefix length P, row lengths): several clusters of different prefix lengths, rows of different
# lengths, an empty rest (a row that is all prefix), identical rows (key 4: both all prefix), a one-row
# cluster, a cluster sharing no token
CLUSTERS = [(7, 10, [30, 20, 12]), (3, 5, [25, 5]), (4, 18, [18, 18]), (9, 14, [14]), (2, 0, [9, 16])]


def _batch(clusters=CLUSTERS, T=32, seed=1):
    """Right-padded rows (B, T), their mask and keys, the rows of one cluster interleaved with the others'."""
    g = torch.Generator().manual_seed(seed)
    rows = [(key, P, n, j) for key, P, lengths in clusters for j, n in enumerate(lengths)]
    rows = [rows[k] for k in torch.randperm(len(rows), generator=g).tolist()]
    ids = torch.randint(0, VOCAB, (len(rows), T), generator=g)
    prefixes = {key: torch.randint(0, VOCAB, (P,), generator=g) for key, P, _ in clusters}
    for r, (key, P, n, j) in enumerate(rows):
        ids[r, :P] = prefixes[key]
        if n > P:
            ids[r, P] = (P + 7 * j) % VOCAB  # rows part right after the prefix
    lengths = torch.tensor([n for _, _, n, _ in rows])
    mask = (torch.arange(T)[None] < lengths[:, None]).long()  # (B, T)
    keys = torch.tensor([key for key, *_ in rows])
    for key, P, _ in clusters:  # the batch is what the cases say
        assert common_prefix(ids[keys == key], lengths[keys == key]) == P
    return ids, mask, keys


def _lora(model) -> list[torch.nn.Parameter]:
    return [p for n, p in model.named_parameters() if "lora_" in n]


def _pass(model, ids, mask, prefix, precision="float32"):
    """Hidden states, log-probs, entropies and the LoRA gradient of the log-probs' sum, as one update runs them;
    `prefix` (keys, impl) or None, the model's argument (`hidden_states`)."""
    for p in model.parameters():
        p.grad = None
    ctx = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16")
    with ctx:
        h = hidden_states(model, ids, mask, prefix)
        lp, ent = token_logprobs(model, ids, mask, with_entropy=True, prefix=prefix)
    (lp.sum() + (h.float() * mask[..., None]).sum() * 1e-3).backward()
    return h.detach().float(), lp.detach(), ent.detach(), torch.cat([p.grad.flatten() for p in _lora(model)])


def _spy(monkeypatch, name: str) -> list[int]:
    """Counts the calls of the path `name`, so a test knows that path ran."""
    calls, impl = [], logprobs.PREFIX_IMPLS[name]
    monkeypatch.setitem(logprobs.PREFIX_IMPLS, name, lambda *a: calls.append(1) or impl(*a))
    return calls


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_the_other_paths_give_the_plain_and_packed_values_and_gradients(attn, impl, monkeypatch):
    model, (ids, mask, keys) = _model(attn), _batch()
    calls = _spy(monkeypatch, impl)
    plain = _pass(model, ids, mask, None)
    packed = _pass(model, ids, mask, (keys, "packed"))
    cached = _pass(model, ids, mask, (keys, impl))
    assert len(calls) == 2  # hidden states and log-probs, each through the path
    m = mask.bool()
    for other in (plain, packed):
        for a, b in zip(cached[:3], other[:3]):
            assert (a - b)[m].abs().max().item() < TOL
        assert ((cached[3] - other[3]).norm() / other[3].norm()).item() < TOL
    assert plain[3].norm() > 0 and (cached[1][m] != 0).any()


@pytest.mark.parametrize("impl", IMPLS)
def test_padding_positions_are_finite_and_receive_no_gradient(impl):
    model, (ids, mask, keys) = _model("sdpa"), _batch()
    h, lp, _, g = _pass(model, ids, mask, (keys, impl))
    assert torch.isfinite(h).all() and torch.isfinite(g).all()
    assert (lp[~mask.bool()] == 0).all()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("clusters", [[(1, 0, [9, 16]), (2, 0, [12, 5])], [(1, 12, [12, 12]), (2, 8, [8])]])
def test_the_other_paths_with_no_prefix_or_no_rest_anywhere(clusters, impl):
    """Every cluster's prefix empty (no cache pass, no prefix segment) or every rest empty (no rest pass, no
    rest segment)."""
    model, (ids, mask, keys) = _model("sdpa"), _batch(clusters, T=20)
    plain, cached = _pass(model, ids, mask, None), _pass(model, ids, mask, (keys, impl))
    m = mask.bool()
    assert (cached[1] - plain[1])[m].abs().max().item() < TOL
    assert ((cached[3] - plain[3]).norm() / plain[3].norm()).item() < TOL


@pytest.mark.parametrize("impl", IMPLS)
def test_under_bfloat16_the_other_paths_give_the_plain_values_within_its_rounding(impl):
    model, (ids, mask, keys) = _model("sdpa"), _batch()
    m = mask.bool()
    f32 = _pass(model, ids, mask, None)
    runs = {name: _pass(model, ids, mask, (keys, name), "bfloat16") for name in ("packed", impl)}
    runs["plain"] = _pass(model, ids, mask, None, "bfloat16")
    cached = runs[impl]
    assert TOL < (cached[1] - f32[1])[m].abs().max().item()  # it ran in bfloat16
    for other in (f32, runs["plain"], runs["packed"]):
        for a, b in zip(cached[:3], other[:3]):
            assert (a - b)[m].abs().max().item() < BF16_TOL
        cos = torch.nn.functional.cosine_similarity(cached[3], other[3], dim=0).item()
        assert cos > 0.99 and ((cached[3] - other[3]).norm() / other[3].norm()).item() < BF16_TOL


@pytest.mark.parametrize("impl", IMPLS)
def test_the_other_paths_refuse_activation_checkpointing_and_flash_kernels(impl):
    model, (ids, mask, keys) = _model("sdpa"), _batch()
    model.get_base_model().activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    with pytest.raises(ValueError, match="model.gradient_checkpointing"):
        hidden_states(model, ids, mask, (keys, impl))
    with torch.no_grad():  # no backward to replay: the pass runs
        hidden_states(model, ids, mask, (keys, impl))
    model = _model("sdpa")
    model.get_base_model().get_decoder().config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match=r"train.learner.shared_prefix needs an attention that takes a 4D mask"):
        hidden_states(model, ids, mask, (keys, impl))
    with pytest.raises(ValueError, match="train.learner.prefix_impl must be one of"):
        hidden_states(_model("sdpa"), ids, mask, (keys, "paged"))


def test_the_segmented_attention_is_switched_on_for_its_call_only():
    """The decoder's config names sdpa again after a segmented pass, also one that fails inside the decoder; a
    plain pass afterwards is the plain pass bit for bit; sliding-window layers are refused."""
    model, (ids, mask, keys) = _model("sdpa"), _batch()
    config = model.get_base_model().get_decoder().config
    before = _pass(model, ids, mask, None)
    _pass(model, ids, mask, (keys, "segmented"))
    assert config._attn_implementation == "sdpa"
    with pytest.raises(IndexError):  # a token id past the vocabulary fails in the embedding
        hidden_states(model, ids.masked_fill(mask.bool(), VOCAB + 5), mask, (keys, "segmented"))
    assert config._attn_implementation == "sdpa"
    for a, b in zip(before, _pass(model, ids, mask, None)):
        assert torch.equal(a, b)
    config.layer_types = ["sliding_attention"] * len(config.layer_types)
    with pytest.raises(ValueError, match="full attention in every layer"):
        hidden_states(model, ids, mask, (keys, "segmented"))


def test_the_segmented_attention_takes_no_mask_and_no_dropout():
    from harness.model.segmented import SEGMENTS_KW, Segments, segmented_attention

    q = torch.zeros(1, 2, 4, 8)
    seg = Segments([[(0, 2, [(2, 4)])]])
    assert segmented_attention(torch.nn.Module(), q, q, q, None, **{SEGMENTS_KW: seg})[0].shape == (1, 4, 2, 8)
    with pytest.raises(TypeError, match="no mask"):
        segmented_attention(torch.nn.Module(), q, q, q, torch.zeros(1, 1, 4, 4), **{SEGMENTS_KW: seg})
    with pytest.raises(TypeError, match="Segments"):
        segmented_attention(torch.nn.Module(), q, q, q, None)
    with pytest.raises(ValueError, match="dropout"):
        segmented_attention(torch.nn.Module(), q, q, q, None, dropout=0.1, **{SEGMENTS_KW: seg})


def test_segments_must_lie_end_to_end():
    from harness.model.segmented import Segments

    Segments([[(0, 2, [(2, 4), (4, 4)]), (4, 0, [(4, 9)]), (9, 3, [])]])  # a prefix-less cluster, a lone row
    with pytest.raises(ValueError, match="does not follow on"):
        Segments([[(0, 2, [(3, 5)])]])  # a gap after the prefix
    with pytest.raises(ValueError, match="does not follow on"):
        Segments([[(0, 2, []), (1, 2, [])]])  # overlapping clusters


def _one_row_spy(monkeypatch) -> list[tuple[int, int]]:
    """The (rows, length) of every packed batch the segmented decoder call runs."""
    from harness.model import segmented

    shapes, call = [], segmented.segmented_decoder_call

    def spy(decoder, packed_ids, positions, segments):
        shapes.append(tuple(packed_ids.shape))
        return call(decoder, packed_ids, positions, segments)

    monkeypatch.setattr(logprobs, "segmented_decoder_call", spy)
    return shapes


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_padding_free_rows_give_the_plain_values_and_gradients_from_one_unpadded_row(attn, monkeypatch):
    """train.learner.padding_free without a shared prefix: every row its own sequence (a key of its own), all of
    them end to end in one packed row as long as their real tokens; hidden states, log-probs, entropies and the
    LoRA gradient equal the padded pass's within float rounding."""
    model, (ids, mask, _) = _model(attn), _batch()
    shapes = _one_row_spy(monkeypatch)
    plain = _pass(model, ids, mask, None)
    free = _pass(model, ids, mask, (torch.arange(ids.shape[0]), logprobs.PADDING_FREE))
    assert shapes == [(1, int(mask.sum()))] * 2  # one row, nothing padded (the padded rows hold more slots)
    assert int(mask.sum()) < mask.numel()
    m = mask.bool()
    for a, b in zip(free[:3], plain[:3]):
        assert (a - b)[m].abs().max().item() < TOL
    assert ((free[3] - plain[3]).norm() / plain[3].norm()).item() < TOL
    assert (free[1][~m] == 0).all() and torch.isfinite(free[0]).all()


def test_padding_free_groups_share_their_prefix_in_one_row(monkeypatch):
    """With the segmented shared prefix: every group's packed sequence end to end in one row (each prefix once),
    equal to the plain pass and to the segmented pass's one row per group."""
    model, (ids, mask, keys) = _model("sdpa"), _batch()
    shapes = _one_row_spy(monkeypatch)
    plain = _pass(model, ids, mask, None)
    per_group = _pass(model, ids, mask, (keys, "segmented"))
    free = _pass(model, ids, mask, (keys, logprobs.SEGMENTED_PADDING_FREE))
    packed_len = sum(P + sum(n - P for n in lengths) for _, P, lengths in CLUSTERS)
    assert shapes[0][0] == len(CLUSTERS) and shapes[0][1] < packed_len  # one row per group, padded
    assert shapes[2:] == [(1, packed_len)] * 2
    m = mask.bool()
    for other in (plain, per_group):
        for a, b in zip(free[:3], other[:3]):
            assert (a - b)[m].abs().max().item() < TOL
        assert ((free[3] - other[3]).norm() / other[3].norm()).item() < TOL


def test_padding_free_under_bfloat16_stays_within_its_rounding():
    model, (ids, mask, _) = _model("sdpa"), _batch()
    m = mask.bool()
    f32 = _pass(model, ids, mask, None)
    plain = _pass(model, ids, mask, None, "bfloat16")
    free = _pass(model, ids, mask, (torch.arange(ids.shape[0]), logprobs.PADDING_FREE), "bfloat16")
    assert TOL < (free[1] - f32[1])[m].abs().max().item()  # it ran in bfloat16
    for other in (f32, plain):
        assert (free[1] - other[1])[m].abs().max().item() < BF16_TOL
        cos = torch.nn.functional.cosine_similarity(free[3], other[3], dim=0).item()
        assert cos > 0.99 and ((free[3] - other[3]).norm() / other[3].norm()).item() < BF16_TOL
