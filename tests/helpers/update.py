"""Real rollouts of the tiny policy on FrozenLake for the update's tests: the base config, configs built
from one combination of axis values, and `Env` (one trainer per rollout setting, its rollouts reused)."""

from __future__ import annotations

import torch

from algorithms import GROUP_FILTER
from algorithms.types import EmptyBatchError
from harness.config.loading import validate_run_config
from harness.config.schema import RunConfig
from harness.experiments.tracking import RunLogger
from harness.rl.trainer import Trainer
from tests.helpers.configs import TINY, merge

# the tiny model and budgets of the trainer tests, with shorter episodes and one update
BASE = merge(
    TINY,
    {
        "rollout": {"temperature": 1.5},
        "turns": {"max": 3},
        "context": {"policy": "full"},
        "algo": {"lr": 1e-3, "micro_batch_size": 64, "agg_len": 16},
        "train": {"updates": 1, "eval_every": 0, "mi_every": 0, "threads": 1, "device": "cpu", "seed": 3},
        "tracking": {"mlflow": False, "samples": 0},
    },
)
NO_CORRECTION = {"name": "none"}
# one combination of axis values: plain GRPO
GRPO = {
    "clip": {"level": "token", "seq_mask": False, "eps_low": 0.2, "eps_high": 0.2, "seq_mask_delta": 0.223},
    "agg": "token-mean",
    "estimator": "grpo",
    "norm": "group",
    "filter": "none",
    "kl": ("k3", "loss"),
    "critic": False,
    "layout": "concatenated",
    "mask": True,
    "constrain": False,
}


def raw_config(c: dict) -> dict:
    """BASE with the axis values of combination `c` (keys as in GRPO, plus an optional correction)."""
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    raw["algo"] = {
        **BASE["algo"],
        "clip": c["clip"],
        "agg": c["agg"],
        "adv": {"estimator": c["estimator"], "norm": c["norm"]},
        "filter": {"name": c["filter"], "top_p": 0.9, "top_k": 0.5},
        "kl": {"estimator": c["kl"][0], "where": c["kl"][1], "coef": 0.3},
        "critic": {"enabled": c["critic"]},
        "correction": c.get("correction", NO_CORRECTION),
        "minibatches": 1,
        "epochs": 1,
    }
    raw["context"] = {"policy": "full", "layout": c["layout"], "mask_observations": c["mask"]}
    raw["rollout"] = {**BASE["rollout"], "constrain": c["constrain"]}
    return raw


def cfg_of(**over) -> RunConfig:
    """The config of GRPO with `over` changed."""
    return validate_run_config(raw_config({**GRPO, **over}), "test")


class Env:
    """One trainer per rollout setting (its rollouts are reused), one policy whose trainable
    weights are reset before every check."""

    def __init__(self, root):
        self.root, self.trainers, self.episodes = root, {}, {}

    def trainer(self, cfg: RunConfig) -> Trainer:
        key = cfg.rollout.constrain
        if key not in self.trainers:
            self.trainers[key] = Trainer(cfg, self.root / f"run{int(key)}", RunLogger(self.root / f"log{int(key)}"))
            t = self.trainers[key]
            t.initial = {n: p.detach().clone() for n, p in t.policy.model.named_parameters() if p.requires_grad}
            self.episodes[key] = t.worker.episodes(
                t.worker.train_tasks(1, 0),
                cfg.rollout.group_size,
                greedy=False,
                budget=cfg.turns.max,
                generator=torch.Generator().manual_seed(7),
                record_entropy=True,  # so every plan can be tried on these episodes (tokens unchanged)
            )
        t = self.trainers[key]
        with torch.no_grad():
            for n, p in t.policy.model.named_parameters():
                if p.requires_grad:
                    p.copy_(t.initial[n])
            for p in t.policy.value_head.parameters():
                p.zero_()
        return t

    def batch(self, t: Trainer, cfg: RunConfig):
        eps = [e for e in self.episodes[cfg.rollout.constrain] if e.steps and e.env_error is None]
        f = cfg.algo.filter
        try:
            res = GROUP_FILTER.get(f.name)(
                torch.tensor([e.outcome for e in eps]),
                torch.tensor([e.group for e in eps]),
                f.params,
            )
        except EmptyBatchError:
            return None
        kept = [e for e, k in zip(eps, res.keep.tolist()) if k]
        return t.learner.training_batch(kept, cfg)

    def close(self) -> None:
        for t in self.trainers.values():
            t.close()


def grads(policy) -> torch.Tensor:
    """The gradients of the actor and critic parameters, flattened into one vector (zeros where None)."""
    params = policy.actor_parameters() + policy.critic_parameters()
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])


def perturb(policy, seed: int) -> None:
    """Move the actor's trainable weights by seeded noise (off the behaviour policy and the reference)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.actor_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
