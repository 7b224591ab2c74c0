"""Algorithm presets made only of axis values: {preset: {dotted key under `algo.`: value}}.

The config loader fills every key a user did not set from the chosen `algo.preset`.
"""

from __future__ import annotations

PRESETS: dict[str, dict[str, object]] = {
    # PPO with a critic (Practitioner's Guide): GAE, batch-whitened advantages (verl whitens
    # inside its GAE), KL in the reward.
    "ppo": {
        "adv.estimator": "gae",
        "adv.norm": "batch",
        "clip.level": "token",
        "agg": "token-mean",
        "kl.estimator": "k1",
        "kl.where": "reward",
        "critic.enabled": True,
    },
    # GRPO as verl runs it: k3 KL in the loss, token-mean (verl's default; the original paper
    # used seq-mean-token-mean, one `algo.agg` away).
    "grpo": {
        "adv.estimator": "grpo",
        "adv.norm": "group",
        "clip.level": "token",
        "agg": "token-mean",
        "kl.estimator": "k3",
        "kl.where": "loss",
        "critic.enabled": False,
    },
    # RLOO (Ahmadian et al. 2024): leave-one-out baseline, KL in the reward.
    "rloo": {
        "adv.estimator": "rloo",
        "adv.norm": "group",
        "clip.level": "token",
        "agg": "token-mean",
        "kl.estimator": "k1",
        "kl.where": "reward",
        "critic.enabled": False,
    },
    # REINFORCE++ (Hu 2025): per-token KL in the reward, batch-whitened returns (the
    # estimator whitens itself, so the scope stays `group` = identity).
    "reinforce_pp": {
        "adv.estimator": "reinforce_pp",
        "adv.norm": "group",
        "clip.level": "token",
        "agg": "token-mean",
        "kl.estimator": "k1",
        "kl.where": "reward",
        "critic.enabled": False,
    },
}
