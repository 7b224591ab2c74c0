"""Layouts and masks of training sequences, on hand-built episodes (docs/algorithms.md#layout)."""

import torch

from harness.rl.batch import build_batch
from tests.helpers.episodes import PAD, episode


def test_concatenated_row_is_the_exact_id_stream_and_masks_actions_only():
    b = build_batch([episode()], concatenated=True, mask_observations=True, pad_id=PAD)
    assert b.input_ids.tolist() == [[1, 2, 3, 10, 11, 4, 5, 12, 6, 13, 14, 15]]
    assert b.loss_mask.tolist() == [[0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]]
    assert b.action_id.tolist() == [[-1, -1, -1, 0, 0, -1, -1, 1, -1, 2, 2, 2]]
    assert b.sampler_logp[0, 3].item() == -0.5 and b.sampler_logp[0, 0].item() == 0.0
    assert b.rewards.tolist() == [1.0] and b.turn_rewards.tolist() == [[0.0, 0.0, 1.0]]


def test_mask_off_trains_observations_once_but_never_the_prompt():
    b = build_batch([episode()], concatenated=True, mask_observations=False, pad_id=PAD)
    assert b.loss_mask.tolist() == [[0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1]]
    assert b.action_mask.tolist() == [[0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]]
    # observation tokens take the advantage of the first token of the action they precede
    adv_stream = torch.arange(12, dtype=torch.float32)[None]
    rows = b.to_rows(adv_stream)
    assert rows.tolist() == [[0, 0, 0, 3, 4, 7, 7, 7, 9, 9, 10, 11]]


def test_per_step_rows_use_the_context_the_policy_saw():
    b = build_batch([episode(ctx=True)], concatenated=False, mask_observations=True, pad_id=PAD)
    assert b.input_ids[0].tolist() == [1, 2, 3, 10, 11, PAD, PAD]  # right-padded
    full = [r[: int(m.sum())] for r, m in zip(b.input_ids.tolist(), b.attention_mask)]
    assert full == [[1, 2, 3, 10, 11], [1, 2, 3, 4, 5, 12], [1, 2, 3, 6, 13, 14, 15]]
    trained = [[t for t, m in zip(r, mm) if m] for r, mm in zip(b.input_ids.tolist(), b.loss_mask.tolist())]
    assert trained == [[10, 11], [12], [13, 14, 15]]


def test_per_step_mask_off_trains_the_preceding_observation_only():
    b = build_batch([episode(ctx=True)], concatenated=False, mask_observations=False, pad_id=PAD)
    trained = [[t for t, m in zip(r, mm) if m] for r, mm in zip(b.input_ids.tolist(), b.loss_mask.tolist())]
    assert trained == [[10, 11], [4, 5, 12], [6, 13, 14, 15]]


def test_per_step_without_context_ids_is_the_append_only_prefix():
    b = build_batch([episode()], concatenated=False, mask_observations=True, pad_id=PAD)
    full = [r[: int(m.sum())] for r, m in zip(b.input_ids.tolist(), b.attention_mask)]
    assert full[2] == [1, 2, 3, 10, 11, 4, 5, 12, 6, 13, 14, 15]


def test_stream_round_trip_and_ids_across_episodes():
    eps = [episode(group=0), episode(group=0), episode(group=1)]
    for concatenated in (True, False):
        b = build_batch(eps, concatenated=concatenated, mask_observations=True, pad_id=PAD)
        x = torch.randn(b.stream_mask.shape) * b.stream_mask
        assert torch.equal(b.to_stream(b.to_rows(x)), x)
        ids = b.action_id[b.action_mask.bool()]
        assert ids.unique().numel() == 9  # 3 episodes x 3 turns, unique across the batch
        assert b.group.tolist() == [0, 0, 1]
        assert (b.traj_id[b.action_mask.bool()].unique() == torch.tensor([0, 1, 2])).all()


def test_anchor_ids_equal_for_equal_state_keys():
    b = build_batch([episode(), episode()], concatenated=True, mask_observations=True, pad_id=PAD)
    assert torch.equal(b.anchor[0], b.anchor[1]) and len(set(b.anchor[0].tolist())) == 3


def test_trained_observation_tokens_share_the_segment_of_the_action_they_precede():
    """With the mask off, sequence-level ratios take one geometric mean per action id: observation
    tokens must carry the id of their own action, never a shared id across trajectories."""
    eps = [episode(group=0), episode(group=1)]
    b = build_batch(eps, concatenated=True, mask_observations=False, pad_id=PAD)
    assert b.action_id.tolist() == [
        [-1, -1, -1, 0, 0, 1, 1, 1, 2, 2, 2, 2],
        [-1, -1, -1, 3, 3, 4, 4, 4, 5, 5, 5, 5],
    ]
    s = build_batch(eps, concatenated=False, mask_observations=False, pad_id=PAD)
    ids = [[a for a, m in zip(r, mm) if m] for r, mm in zip(s.action_id.tolist(), s.loss_mask.tolist())]
    assert ids == [[0, 0], [1, 1, 1], [2, 2, 2, 2], [3, 3], [4, 4, 4], [5, 5, 5, 5]]
    # the segments are those of the sequence-level policy loss: one ratio per action, never pooled
    from algorithms.utils import segment_mean

    x = torch.randn(b.action_id.shape)
    means = segment_mean(x, b.action_id, b.loss_mask)
    for seg in range(6):
        on = b.action_id == seg
        assert torch.allclose(means[on], x[on].mean().expand(int(on.sum())))


def _constrained_episode():
    ep = episode()
    # a1's single token had one admissible continuation (forced); a2's last token too
    allowed = {0: [[10, 20], [11, 21]], 1: [[12]], 2: [[13, 30], [14, 31], [15]]}
    for t, st in enumerate(ep.steps):
        st.allowed_ids = allowed[t]
    return ep


def test_forced_tokens_stay_in_the_loss_by_default_and_leave_it_with_drop():
    count = build_batch([_constrained_episode()], concatenated=True, mask_observations=True, pad_id=PAD)
    drop = build_batch(
        [_constrained_episode()], concatenated=True, mask_observations=True, pad_id=PAD, drop_forced=True
    )
    assert count.loss_mask.tolist() == [[0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]]
    assert drop.loss_mask.tolist() == [[0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0]]
    assert torch.equal(drop.action_mask, count.action_mask) and torch.equal(drop.stream_mask, count.stream_mask)
    # token-mean over the kept tokens only: forced tokens no longer dilute the step
    from algorithms import AGGREGATION, AggParams

    loss = torch.arange(12, dtype=torch.float32)[None]
    tm, own = AGGREGATION.get("token-mean"), AggParams(num_tokens=None, num_seqs=None, agg_len=12)
    assert abs(tm(loss, drop.loss_mask, own).item() - (3 + 4 + 9 + 10) / 4) < 1e-6
    assert abs(tm(loss, count.loss_mask, own).item() - (3 + 4 + 7 + 9 + 10 + 11) / 6) < 1e-6
