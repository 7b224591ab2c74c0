"""The run configuration: typed, nested, strict (an unknown key is an error).

Every field documents what it does, its default and, where one applies, the paper it comes
from. Axis values are checked against the registries of `algorithms/` and `envs/` when a file
loads, and conflicting settings are errors, all before any model is built (torchtune habit).
`harness.config.loading.load_run_config` turns every problem into one `ConfigError` naming the
file, the dotted key, the bad value and the allowed values.

This module is the schema's one import point: `RunConfig`, its checks across sections, and every
section, which live by topic in `model`, `env`, `algo` (with the axis parameters built from it)
and `training`, on the building blocks of `fields`.
"""

from __future__ import annotations

from pydantic import model_validator

from algorithms.advantage import CRITIC_ESTIMATORS
from algorithms.normalization import check_norm_compatible
from harness.config.algo import (
    AdvConfig,
    AlgoConfig,
    ClipConfig,
    CorrectionConfig,
    CriticConfig,
    DistillConfig,
    FilterConfig,
    KLConfig,
    ObsSftConfig,
)
from harness.config.env import ContextConfig, EnvConfig, TurnsConfig
from harness.config.fields import SEED_MAX, SEED_MIN, F, Strict
from harness.config.model import QWEN2_LINEAR_MODULES, LoraConfig, ModelConfig, TinyModelConfig
from harness.config.training import (
    ACTConfig,
    CrossPolicyConfig,
    JudgeConfig,
    RewardConfig,
    RolloutConfig,
    SFTConfig,
    TrackingConfig,
    TrainConfig,
)

__all__ = [
    "RunConfig",
    "RENAMED_KEYS",
    "vllm_backend_problem",
    "ModelConfig",
    "LoraConfig",
    "TinyModelConfig",
    "QWEN2_LINEAR_MODULES",
    "EnvConfig",
    "TurnsConfig",
    "ContextConfig",
    "AlgoConfig",
    "AdvConfig",
    "ClipConfig",
    "CorrectionConfig",
    "CriticConfig",
    "DistillConfig",
    "FilterConfig",
    "KLConfig",
    "ObsSftConfig",
    "SFTConfig",
    "RolloutConfig",
    "CrossPolicyConfig",
    "TrainConfig",
    "TrackingConfig",
    "RewardConfig",
    "JudgeConfig",
    "ACTConfig",
    "SEED_MIN",
    "SEED_MAX",
]

# Config keys that were renamed: old dotted key -> new one. Loading a file that still uses an
# old key fails with a message naming the new key (no silent aliases).
RENAMED_KEYS = {
    "algo.filter.p": "algo.filter.top_p",
    "algo.filter.k": "algo.filter.top_k",
}


class RunConfig(Strict):
    model: ModelConfig = F(ModelConfig(), "Policy model.")
    env: EnvConfig = F(EnvConfig(), "Environment.")
    turns: TurnsConfig = F(TurnsConfig(), "Turn budget.")
    context: ContextConfig = F(ContextConfig(), "Context policy and loss mask.")
    algo: AlgoConfig = F(AlgoConfig(), "RL algorithm, one field per ablation axis.")
    sft: SFTConfig = F(SFTConfig(), "SFT warm-up and SFT/RL split.")
    rollout: RolloutConfig = F(RolloutConfig(), "Sampling.")
    train: TrainConfig = F(TrainConfig(), "Training loop.")
    tracking: TrackingConfig = F(TrackingConfig(), "Logging.")
    reward: RewardConfig = F(RewardConfig(), "Process rewards from a step judge (off by default).")
    act: ACTConfig = F(ACTConfig(), "ACT: critic training on expert-vs-sampled action pairs (off by default).")

    @model_validator(mode="after")
    def _conflicts(self) -> RunConfig:
        if self.act.mode != "none" and self.act.answer == "action" and self.env.mixture:
            raise ValueError(
                "act.answer: 'action' needs one environment to parse the answers; with env.mixture use "
                "act.answer: letter"
            )
        a = self.algo
        if a.critic.enabled and a.adv.estimator not in CRITIC_ESTIMATORS:
            raise ValueError(
                f"algo.critic.enabled: true needs an estimator that gives the critic returns to fit "
                f"(algo.adv.estimator in {list(CRITIC_ESTIMATORS)}), not {a.adv.estimator!r}; "
                f"set algo.critic.enabled: false"
            )
        if a.adv.estimator == "gae" and not a.critic.enabled:
            raise ValueError("algo.adv.estimator 'gae' needs a critic: set algo.critic.enabled: true")
        if a.adv.estimator == "gae" and self.context.resolved_layout != "concatenated":
            raise ValueError(
                "algo.adv.estimator 'gae' needs context.layout 'concatenated' (values along "
                "one token stream per trajectory)"
            )
        check_norm_compatible(a.adv.estimator, a.adv.norm)
        d = a.distill
        if d.coef > 0 and d.teacher == "policy" and d.hint == "none":
            raise ValueError(
                "algo.distill.teacher 'policy' with algo.distill.hint 'none': the teacher would be the behaviour "
                "policy itself (a zero advantage); use hint: hindsight or teacher: reference / judge"
            )
        if d.coef > 0 and self.rollout.constrain:
            raise ValueError(
                "algo.distill.coef > 0 with rollout.constrain: true: the teacher's log-probs are taken over the "
                "whole vocabulary, the behaviour's over the admissible set; set rollout.constrain: false"
            )
        if d.coef > 0 and self.rollout.concurrent:
            raise ValueError(
                "algo.distill.coef > 0 with rollout.concurrent: true: the teacher runs in the learner's loop; "
                "set rollout.concurrent: false"
            )
        act = self.act
        if act.mode == "stage" and act.updates >= self.train.updates:
            raise ValueError(
                f"act.updates = {act.updates} with train.updates = {self.train.updates}: the ACT stage must leave "
                f"at least one RL update; lower act.updates or raise train.updates"
            )
        if (
            act.mode == "mixed"
            and max(1, round(act.mix * self.rollout.tasks_per_update)) >= self.rollout.tasks_per_update
        ):
            raise ValueError(
                f"act.mix = {act.mix} with rollout.tasks_per_update = {self.rollout.tasks_per_update}: no RL task "
                f"would be left in an update; lower act.mix or raise rollout.tasks_per_update"
            )
        if act.mode != "none" and self.rollout.concurrent:
            raise ValueError("act.mode with rollout.concurrent: true: ACT questions are built in the learner's loop")
        if self.reward.process != "none" and self.rollout.concurrent:
            raise ValueError(
                f"reward.process {self.reward.process!r} with rollout.concurrent: true: the judge runs in the "
                f"learner's rollout loop; set rollout.concurrent: false or reward.process: none"
            )
        self._check_sft_budget()
        problem = learner_problem(self)
        if problem:
            raise ValueError(problem)
        if self.rollout.share_prefix and self.rollout.backend != "hf":
            raise ValueError(
                f"rollout.share_prefix: true with rollout.backend = {self.rollout.backend!r}: the prefill is shared "
                "by our growing-cache engine only; set rollout.backend: hf or rollout.share_prefix: false"
            )
        if self.rollout.backend == "vllm":
            problem = vllm_backend_problem(self)
            if problem:
                raise ValueError(problem)
        return self

    def _check_sft_budget(self) -> None:
        """The SFT/RL split must leave at least one RL update (`harness.rl.trainer.planned_updates`)."""
        s, r = self.sft, self.rollout
        if s.budget is None:
            return
        sft_cost = s.demos * s.demo_cost
        per_update = r.tasks_per_update * r.group_size
        if s.budget - sft_cost < per_update:
            raise ValueError(
                f"sft.budget = {s.budget} leaves {max(0.0, s.budget - sft_cost):g} RL episodes after the SFT "
                f"demonstrations (sft.demos * sft.demo_cost = {s.demos} * {s.demo_cost:g} = {sft_cost:g}), fewer "
                f"than one RL update (rollout.tasks_per_update * rollout.group_size = {per_update} episodes): "
                f"raise sft.budget to at least {sft_cost + per_update:g} or lower sft.demos"
            )


def learner_problem(cfg: RunConfig) -> str | None:
    """Why `train.learner` cannot run `cfg` as written (None: it can), with the key to change."""
    ln, r, kl = cfg.train.learner, cfg.rollout, cfg.algo.kl
    head = "train.learner.behaviour 'sampler'"
    checks = [
        (r.sampler_dtype != "same", f"rollout.sampler_dtype = {r.sampler_dtype!r}: the sampler is another precision"),
        (r.staleness > 0, f"rollout.staleness = {r.staleness}: the sampler is an older policy"),
        (r.concurrent, "rollout.concurrent = true: the sampler runs in another process, up to k updates behind"),
        (r.cross_policy.members > 0, "rollout.cross_policy.members > 0: stale pool members sample some turns"),
        (r.backend not in ("hf", "static"), f"rollout.backend = {r.backend!r}: that engine records no entropies"),
        (
            cfg.algo.correction.name != "none",
            f"algo.correction.name = {cfg.algo.correction.name!r}: the sampler is the behaviour policy, "
            "so there is nothing to correct",
        ),
        (
            not cfg.context.mask_observations,
            "context.mask_observations = false: observation tokens are trained, and the sampler drew no "
            "log-prob for them",
        ),
    ]
    if ln.behaviour == "first_forward":
        head = "train.learner.behaviour 'first_forward'"
        a = cfg.algo
        before = [
            (
                a.epochs != 1 or a.minibatches != 1,
                f"algo.epochs = {a.epochs}, algo.minibatches = {a.minibatches}: "
                "after the first optimizer step the training forward is no longer the behaviour policy (needs 1 and 1)",
            ),
            (a.critic.enabled, "algo.critic.enabled = true: the advantages need the critic's values before the step"),
            (
                kl.where == "reward" and kl.estimator != "none",
                "algo.kl.where = 'reward': the KL in the reward needs the behaviour log-probs before the advantages",
            ),
            (
                a.distill.coef > 0,
                f"algo.distill.coef = {a.distill.coef:g}: the distillation gap needs the behaviour "
                "log-probs before the advantages",
            ),
            (
                a.clip.seq_mask,
                "algo.clip.seq_mask = true: the SAMPO mask compares against the behaviour log-probs before the loss",
            ),
            (
                cfg.model.lora.dropout > 0,
                f"model.lora.dropout = {cfg.model.lora.dropout:g}: the training forward "
                "(dropout on) is not the policy that sampled (dropout off)",
            ),
        ]
        for bad, why in before:
            if bad:
                return f"{head} takes the training forward's log-probs as the behaviour's; here {why}. " + (
                    "Set train.learner.behaviour: recompute or change that key"
                )
    if ln.behaviour in ("sampler", "first_forward"):
        for bad, why in checks:
            if bad:
                took = "log-probs" if ln.behaviour == "sampler" else "entropies (the entropy diagnostic)"
                return (
                    f"{head} takes the sampler's {took} as the behaviour policy's, which needs the sampler to "
                    f"be the trainer's own model; here {why}. Set train.learner.behaviour: recompute or change that key"
                )
    if ln.behaviour == "sampler" and ln.precision != "float32":
        return (
            f"{head} with train.learner.precision = {ln.precision!r}: the sampler's log-probs are float32 and the "
            f"training forward's are {ln.precision}, so the ratio of even the first minibatch would carry their "
            "rounding gap; set train.learner.behaviour: recompute (the behaviour pass then runs in the same "
            "precision) or train.learner.precision: float32"
        )
    problem = prefix_impl_problem(cfg)
    if problem:
        return problem
    trained = kl.estimator != "none" and kl.coef > 0
    if ln.reference_every > 1 and trained:
        return (
            f"train.learner.reference_every = {ln.reference_every} with a KL to the reference in the "
            f"{kl.where} (algo.kl.estimator {kl.estimator!r}, coef {kl.coef:g}): the reference log-probs are "
            f"needed every update; set train.learner.reference_every: 1 or algo.kl.coef: 0"
        )
    return None


def prefix_impl_problem(cfg: RunConfig) -> str | None:
    """Why train.learner.prefix_impl or padding_free cannot run as written (None: it can)."""
    ln = cfg.train.learner
    if ln.padding_free:
        if ln.shared_prefix and ln.prefix_impl != "segmented":
            return (
                f"train.learner.padding_free = true with train.learner.prefix_impl = {ln.prefix_impl!r}: the "
                "padding-free row computes attention per sequence, which only the segmented implementation does; "
                "set train.learner.prefix_impl: segmented or train.learner.padding_free: false"
            )
        if cfg.model.gradient_checkpointing:
            return (
                "train.learner.padding_free = true with model.gradient_checkpointing = true: checkpointed layers "
                "recompute their attention in backward, outside the call that computes it per sequence; set "
                "model.gradient_checkpointing: false or train.learner.padding_free: false"
            )
    if ln.prefix_impl == "packed":
        return None
    if not ln.shared_prefix:
        return (
            f"train.learner.prefix_impl = {ln.prefix_impl!r} with train.learner.shared_prefix = false: it says how "
            "a shared prefix is computed, and none is; set train.learner.shared_prefix: true or remove prefix_impl"
        )
    if cfg.model.gradient_checkpointing:
        why = {
            "kv_cache": "layers keep no key-value cache, so the rows would not see their prefix",
            "segmented": "layers recompute their attention in backward, outside the call that computes it per segment",
        }[ln.prefix_impl]
        return (
            f"train.learner.prefix_impl = {ln.prefix_impl!r} with model.gradient_checkpointing = true: checkpointed "
            f"{why}; set model.gradient_checkpointing: false or train.learner.prefix_impl: packed"
        )
    return None


# vLLM's LoRA layers: the largest rank it accepts (vllm.config.lora.MaxLoRARanks), and the modules of a
# Qwen2 adapter it cannot load (LoRA on the embedding and the output layer is not registered for Qwen2)
VLLM_MAX_LORA_RANK = 512
VLLM_LORA_UNSUPPORTED = ("embed_tokens", "lm_head")


def vllm_backend_problem(cfg: RunConfig) -> str | None:
    """Why `rollout.backend: vllm` cannot run `cfg` (None: it can): the first combination the vLLM
    backend (harness.rl.engines.vllm) does not support, with the key to change."""
    r, m = cfg.rollout, cfg.model
    head = "rollout.backend 'vllm'"
    unsupported = [t for t in m.lora.target_modules if t.rpartition(".")[2] in VLLM_LORA_UNSUPPORTED]
    checks = [
        (
            m.finetune != "lora",
            f"{head} with model.finetune = {m.finetune!r}: only a LoRA adapter can be swapped "
            "into the engine after each update; set model.finetune: lora or rollout.backend: hf",
        ),
        (
            bool(unsupported),
            f"{head} with model.lora.target_modules containing {unsupported}: vLLM loads LoRA "
            "adapters on the attention and MLP projections of a Qwen2 model only; remove them from "
            "model.lora.target_modules or set rollout.backend: hf",
        ),
        (
            m.lora.r > VLLM_MAX_LORA_RANK,
            f"{head} with model.lora.r = {m.lora.r}: vLLM's largest LoRA rank is "
            f"{VLLM_MAX_LORA_RANK}; lower model.lora.r or set rollout.backend: hf",
        ),
        (
            cfg.train.device == "cpu",
            f"{head} with train.device = 'cpu': vLLM samples on the GPU the trainer "
            "shares with it; set train.device: cuda (or auto on a CUDA machine) or rollout.backend: hf",
        ),
        (
            r.constrain,
            f"{head} with rollout.constrain = true: trie-constrained decoding is our sampler's, vLLM "
            "has no per-token admissible-action constraint here; set rollout.constrain: false or rollout.backend: hf",
        ),
        (
            r.stop != "eot",
            f"{head} with rollout.stop = {r.stop!r}: the line stop is our sampler's (vLLM would cut the "
            "newline token out of the sampled ids); set rollout.stop: eot or rollout.backend: hf",
        ),
        (
            r.cross_policy.members > 0,
            f"{head} with rollout.cross_policy.members = {r.cross_policy.members}: the "
            "stale pool members are torch copies our sampler runs; set rollout.cross_policy.members: 0 or "
            "rollout.backend: hf",
        ),
        (
            r.sampler_dtype != "same",
            f"{head} with rollout.sampler_dtype = {r.sampler_dtype!r}: the engine "
            "samples in model.dtype; set rollout.sampler_dtype: same (or change model.dtype)",
        ),
        (
            r.staleness > 0,
            f"{head} with rollout.staleness = {r.staleness}: the engine always holds the latest "
            "adapter (synchronous rollouts); set rollout.staleness: 0 or rollout.backend: hf",
        ),
        (
            r.concurrent,
            f"{head} with rollout.concurrent = true: the engine runs in the learner's process, "
            "asleep during updates; set rollout.concurrent: false or rollout.backend: hf",
        ),
        (
            r.top_p < 1 and cfg.algo.correction.name != "none",
            f"{head} with rollout.top_p = {r.top_p} and "
            f"algo.correction.name = {cfg.algo.correction.name!r}: vLLM's log-probs are renormalised over the "
            "top-p nucleus, so the correction would read biased sampler log-probs; set rollout.top_p: 1, "
            "algo.correction.name: none, or rollout.backend: hf",
        ),
    ]
    return next((message for bad, message in checks if bad), None)
