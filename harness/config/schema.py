"""The run configuration: typed, nested, strict (an unknown key is an error).

Every field documents what it does, its default and, where one applies, the paper it comes
from. Axis values are checked against the registries of `algorithms/` and `envs/` when a file
loads, and conflicting settings are errors, all before any model is built (torchtune habit).
`load_run_config` turns every problem into one `ConfigError` naming the file, the dotted key,
the bad value and the allowed values.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from algorithms.advantage import CRITIC_ESTIMATORS
from algorithms.correction import CORRECTION, check_params
from algorithms.normalization import check_norm_compatible
from algorithms.types import CorrectionParams

# Config keys that were renamed: old dotted key -> new one. Loading a file that still uses an
# old key fails with a message naming the new key (no silent aliases).
RENAMED_KEYS = {
    "algo.filter.p": "algo.filter.top_p",
    "algo.filter.k": "algo.filter.top_k",
}

P = TypeVar("P")

# The leaf modules of a Qwen2 model (the architecture of model.name: tiny) that a LoRA adapter
# can wrap: attention and MLP projections, then the embedding and the output layer.
QWEN2_LINEAR_MODULES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "embed_tokens",
    "lm_head",
)

# Seeds go to Python, numpy and torch and, as PYTHONHASHSEED, to child processes, which accept
# 0 .. 2**32 - 1 (numpy's legacy seeding has the same range; torch accepts more).
SEED_MIN, SEED_MAX = 0, 2**32 - 1

# Upper bounds of sizes: far above any run this harness is meant for; they catch typos (a few
# zeros too many) that would otherwise exhaust memory or time before the first update.
MAX_WIDTH = 65_536  # model widths, vocabulary
MAX_BATCH = 65_536  # episodes or rows in one batch
MAX_COUNT = 10_000_000  # updates, tasks, demonstrations, episodes
MAX_TURNS = 1_024  # turns of one episode
MAX_TOKENS = 1_048_576  # tokens of one sequence


class Strict(BaseModel):
    """Unknown keys are errors; every float must be finite (inf and nan are rejected)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def seed_field(default: int, doc: str) -> Any:
    return F(default, doc, ge=SEED_MIN, le=SEED_MAX)


def F(default: Any, doc: str, **kw: Any) -> Any:
    """A field with its documentation (shown by `harness run --help-config`)."""
    return Field(default, description=doc, **kw)


# ----------------------------------------------------------------------------- model
class TinyModelConfig(Strict):
    """A small Qwen2-architecture model built from config on this machine (no model hub)."""

    hidden_size: int = F(128, "Width of the tiny Qwen2 model.", ge=8, le=MAX_WIDTH)
    num_layers: int = F(4, "Transformer layers.", ge=1, le=256)
    num_heads: int = F(4, "Attention heads (key/value heads = heads / 2 when even).", ge=1, le=256)
    intermediate_size: int = F(512, "MLP width.", ge=8, le=4 * MAX_WIDTH)
    vocab_size: int = F(
        1024, "Target size of the byte-level BPE tokenizer trained on environment text.", ge=300, le=4 * MAX_WIDTH
    )
    max_position: int = F(2048, "Longest sequence the model accepts.", ge=64, le=MAX_TOKENS)
    pretrain_demos: int = F(
        1000,
        "Expert episodes the tiny model is pre-trained on by supervised "
        "learning (cached by content hash under results/.cache, shared by all points).",
        ge=0,
        le=MAX_COUNT,
    )
    pretrain_epochs: int = F(3, "Epochs of that pre-training.", ge=0, le=10_000)
    pretrain_lr: float = F(1e-3, "Learning rate of that pre-training (AdamW).", gt=0)
    pretrain_batch_size: int = F(16, "Episodes per batch of that pre-training.", ge=1, le=MAX_BATCH)
    init_seed: int = seed_field(
        0,
        "Seed of the tiny model's initialisation and pre-training order; independent of "
        "train.seed so that every point of a sweep shares one base model.",
    )


class LoraConfig(Strict):
    r: int = F(16, "LoRA rank (Hu et al. 2021).", ge=1, le=MAX_WIDTH)
    alpha: int = F(32, "LoRA scaling numerator (scale = alpha / r).", ge=1, le=MAX_COUNT)
    dropout: float = F(0.0, "Dropout on the LoRA branch; 0 keeps CPU runs bit-reproducible.", ge=0, lt=1)
    target_modules: list[Annotated[str, StringConstraints(min_length=1)]] = F(
        list(QWEN2_LINEAR_MODULES[:7]),
        "Module names that get adapters (Qwen2 names; a name matches a module whose dotted path ends with it).",
        min_length=1,
        max_length=256,
    )


class ModelConfig(Strict):
    name: str = F("tiny", "'tiny' (built locally, see model.tiny), a Hugging Face id, or a local path.", min_length=1)
    dtype: Literal["float32", "bfloat16", "float16"] = F("float32", "Parameter dtype; float32 on CPU.")
    finetune: Literal["lora", "full"] = F(
        "lora", "Train a LoRA adapter (reference = adapter off) or all weights (reference = a frozen copy)."
    )
    lora: LoraConfig = F(LoraConfig(), "LoRA adapter settings.")
    tiny: TinyModelConfig = F(TinyModelConfig(), "Shape and pre-training of the locally built tiny model.")
    gradient_checkpointing: bool = F(False, "Trade compute for memory in the update.")

    @model_validator(mode="after")
    def _tiny_lora_targets(self) -> ModelConfig:
        """The tiny model is a Qwen2 model: its module names are known before it is built."""
        if self.name != "tiny" or self.finetune != "lora":
            return self
        for target in self.lora.target_modules:
            if target.rpartition(".")[2] not in QWEN2_LINEAR_MODULES:
                close = difflib.get_close_matches(target, QWEN2_LINEAR_MODULES, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(
                    f"model.lora.target_modules: {target!r} is not a module of the tiny Qwen2 model{hint}; "
                    f"choose from: {', '.join(QWEN2_LINEAR_MODULES)}"
                )
        return self


# ----------------------------------------------------------------------------- env
class EnvConfig(Strict):
    name: str = F("frozenlake", "Environment (see `harness envs`).")
    options: dict[str, Any] = F({}, "Environment options, validated by the environment's own schema.")
    mixture: list[dict[str, Any]] = F(
        [],
        "Multi-task training (AgentRL): a weighted mixture [{name, options, weight, label}, ...]; when set, "
        "env.name becomes `mixture` and env.options its members (leave both unset). Each group is from one "
        "environment; task type = environment for algo.adv.norm task; metrics and held-out evaluation per "
        "environment (weight 0: evaluated, never trained).",
    )
    reward_density: Literal["sparse", "dense"] = F(
        "sparse", "sparse: outcome only; dense: score increments per turn (Practitioner's Guide, Wang et al. 2025)."
    )
    format_penalty: float = F(
        0.0, "Reward subtracted for an unparsable action (RAGEN uses a negative format reward).", ge=0
    )
    train_tasks: int = F(
        0, "Size of the training task pool (0 = a fresh task seed for every group).", ge=0, le=MAX_COUNT
    )
    heldout_tasks: int = F(64, "Held-out tasks used for evaluation (disjoint from training tasks).", ge=1, le=MAX_COUNT)
    skip_demo_tasks: bool = F(
        False,
        "RL's train tasks (rollouts, ACT questions, the env.train_tasks pool) start after the train seeds "
        "the model's expert demonstrations came from (tiny-model pre-training, SFT warm-up), so RL never "
        "trains on a task the model imitated. Off: they start at the first train seed and overlap the demonstrations.",
    )
    workers: int = F(
        0,
        "Worker processes stepping environments (0 = in-process). Use >0 for TextWorld, whose interpreter can crash.",
        ge=0,
        le=1_024,
    )

    @model_validator(mode="before")
    @classmethod
    def _mixture(cls, data: Any) -> Any:
        """env.mixture set: the environment is `mixture` with the members as its options (the
        members are validated, with messages naming env.mixture.<i>, by the config loader)."""
        if not isinstance(data, dict) or not data.get("mixture"):
            return data
        options = data.get("options") or {}
        if not isinstance(options, dict) or set(options) - {"members"}:
            raise ValueError(
                "env.options: leave it unset with env.mixture (each member's options go in "
                f"env.mixture.<i>.options); got {options!r}"
            )
        return {**data, "name": "mixture", "options": {"members": data["mixture"]}}


# ----------------------------------------------------------------------------- turns / context
class TurnsConfig(Strict):
    max: int = F(8, "Turn budget: an episode reaching it is truncated.", ge=1, le=MAX_TURNS)
    curriculum: list[int] = F(
        [],
        "ScalingInter-RL budgets h_1 < ... < h_N (AgentGym-RL, Xi et al. 2025), each at most turns.max; "
        "empty = fixed budget turns.max.",
    )
    curriculum_every: int = F(80, "Updates between curriculum steps (paper: 80).", ge=1, le=MAX_COUNT)
    overflow_penalty: float = F(
        0.0,
        "Reward subtracted when the budget or max_new_tokens is exceeded (AgentRL, Zhang et al. 2025, uses 0.2).",
        ge=0,
    )
    final_turn_note: str | None = F(
        None,
        "Appended (on a new line) to the observation of the last allowed "
        "turn, asking for a final answer (ScalingInter-RL). null = 'Last turn: "
        "answer now.' when a curriculum is set, none otherwise; '' = never.",
    )

    @model_validator(mode="after")
    def _increasing(self) -> TurnsConfig:
        c = self.curriculum
        if any(b <= a for a, b in zip(c, c[1:])) or any(h < 1 for h in c):
            raise ValueError(f"turns.curriculum must be positive and strictly increasing, got {c}")
        if c and c[-1] > self.max:
            raise ValueError(
                f"turns.curriculum {c} goes above turns.max = {self.max}; turns.max is the largest budget an "
                f"episode may get: raise turns.max to {c[-1]} or lower the curriculum"
            )
        return self


class ContextConfig(Strict):
    policy: Literal["full", "window", "obs_truncate", "single"] = F(
        "full",
        "What the policy sees each turn: full history; instructions + last `window` turns "
        "(Agent-R1); every observation cut to `obs_tokens` tokens with a [truncated] marker (AgentRL); "
        "instructions + current observation only (verl-agent history_length 0).",
    )
    window: int = F(2, "Turns kept by the window policy.", ge=1, le=MAX_TURNS)
    obs_tokens: int = F(64, "Token limit per observation for obs_truncate.", ge=1, le=MAX_TOKENS)
    mask_observations: bool = F(
        True,
        "True (every published recipe): train only on the policy's action "
        "tokens. False: observation tokens are trained on too (RAGEN "
        "enable_response_mask=false; risks hallucinated observations).",
    )
    layout: Literal["auto", "concatenated", "per-step"] = F(
        "auto",
        "Training sequences: one per trajectory (concatenated, append-only contexts only) or one "
        "per turn (per-step). auto = concatenated for policy full, per-step otherwise.",
    )

    @model_validator(mode="after")
    def _layout(self) -> ContextConfig:
        if self.layout == "concatenated" and self.policy != "full":
            raise ValueError(
                f"context.layout 'concatenated' needs context.policy 'full' (an append-only "
                f"context); policy {self.policy!r} needs layout 'per-step' or 'auto'"
            )
        return self

    @property
    def resolved_layout(self) -> str:
        if self.layout != "auto":
            return self.layout
        return "concatenated" if self.policy == "full" else "per-step"


# ----------------------------------------------------------------------------- algo
class AdvConfig(Strict):
    estimator: str = F("grpo", "Advantage estimator (see `harness axes`).")
    norm: str = F("group", "Normalization scope: group, batch, task (AgentRL), env_std (AutoForge ERPO).")
    gamma: float = F(1.0, "Discount for gae / reinforce_pp (Practitioner's Guide best: 1.0).", ge=0, le=1)
    lam: float = F(1.0, "GAE lambda.", ge=0, le=1)
    gigpo_mode: Literal["mean_std_norm", "mean_norm"] = F(
        "mean_norm", "GiGPO step-advantage normalisation (verl-agent code default: mean_norm)."
    )
    gigpo_step_weight: float = F(1.0, "GiGPO omega, weight of the step-level advantage.", ge=0)
    gigpo_gamma: float = F(0.95, "GiGPO discount of per-turn rewards (verl-agent scripts: 0.95).", ge=0, le=1)
    gigpo_episode_stats: Literal["trajectories", "steps"] = F(
        "trajectories",
        "GiGPO episode mean/std over trajectories (paper) or over step samples "
        "(verl-agent compute_mean_std_cross_steps).",
    )


class ClipConfig(Strict):
    level: str = F(
        "token",
        "Importance-ratio level and policy loss: token (PPO), sequence (GSPO), trajectory, none, cispo "
        "(MiniMax-M1), sapo (Qwen).",
    )
    eps_low: float = F(
        0.2, "Lower clip range (PPO 0.2; GSPO 3e-4; SAMPO 3e-3; cispo: >= 1 removes the lower bound).", ge=0
    )
    eps_high: float = F(0.2, "Upper clip range; > eps_low is DAPO clip-higher (0.28).", ge=0)
    dual_c: float | None = F(None, "Dual-clip constant c > 1 for negative advantages (verl: 3); null = off.", gt=1)
    seq_mask: bool = F(False, "SAMPO negative-advantage sequence mask (ARLArena).")
    seq_mask_delta: float = F(0.223, "SAMPO delta: drop A<0 actions whose mean log(old/new) > delta.", ge=0)
    tau_pos: float = F(1.0, "sapo: gate temperature for tokens with A > 0 (SAPO, verl, TRL: 1.0).", gt=0)
    tau_neg: float = F(1.05, "sapo: gate temperature for tokens with A <= 0 (SAPO, verl, TRL: 1.05).", gt=0)

    @model_validator(mode="after")
    def _dual_clip_level(self) -> ClipConfig:
        if self.dual_c is not None and self.level in ("cispo", "sapo"):
            raise ValueError(
                f"algo.clip.dual_c = {self.dual_c:g} applies to the clipped surrogate of the token, sequence and "
                f"trajectory levels; level {self.level!r} has no surrogate to bound: set algo.clip.dual_c: null"
            )
        return self


class ObsSftConfig(Strict):
    coef: float = F(
        0.0,
        "lambda of observation SFT (ECHO, arXiv 2605.24517; 0.1 in ECHO and prime-rl): an auxiliary cross-entropy on "
        "the observation tokens after the prompt, from the policy's forward pass, with its own token denominator; "
        "0 = off (docs/algorithms.md#obs-sft).",
        ge=0,
        le=1e3,
    )


class DistillConfig(Strict):
    """On-policy distillation, with or without hindsight hints (docs/algorithms.md#distillation)."""

    coef: float = F(
        0.0,
        "Weight of the distillation advantage teacher log-prob - behaviour log-prob (detached, per action "
        "token, neither normalised nor clipped) added to the RL advantage; 0 = off (OpenClaw-RL combined: 1).",
        ge=0,
        le=1e3,
    )
    rl_coef: float = F(1.0, "Weight of the RL advantage in the sum (0 = distillation only).", ge=0, le=1e3)
    teacher: Literal["reference", "policy", "judge"] = F(
        "reference",
        "Whose log-probs teach: reference = the frozen starting policy (adapter off); policy = the live policy "
        "at the start of the update (with hints: self-distillation); judge = the model judge's own model "
        "(reward.judge.model; the reference when that is null).",
    )
    hint: Literal["hindsight", "none"] = F(
        "hindsight",
        "hindsight: the judge's hint about the step, read from the next state, is added to the teacher's "
        "context (OpenClaw-RL's directive signal; turns without a hint leave the term); none: plain "
        "on-policy distillation (Thinking Machines), every action token.",
    )


class CorrectionConfig(Strict):
    name: str = F(
        "none",
        "Off-policy correction of the sampler-trainer mismatch: none, tis_token, tis_seq, mis_token, mis_seq, "
        "icepop, geo_seq_mask, decoupled (see `harness axes`).",
    )
    c: float | None = F(
        None,
        "Cap C: tis_token / tis_seq truncate their weight at C (null = 2, verl); decoupled rejects tokens whose "
        "weight exceeds C (null = no cap; AReaL's examples use 5). Also the band [1/C, C] of the mismatch "
        "diagnostics (null = 2).",
        ge=1,
    )
    lo: float | None = F(
        None, "Lower bound of the band of mis_token, mis_seq, icepop, geo_seq_mask (null = its default).", ge=0
    )
    hi: float | None = F(
        None, "Upper bound of that band (null = its default: mis 2, icepop 5, geo_seq_mask 1.01).", gt=0
    )
    rejected: Literal["drop", "zero"] = F(
        "drop",
        "What a rejected token does (mis_token, mis_seq, geo_seq_mask, decoupled's cap): drop = it leaves the "
        "policy loss and its denominator (verl); zero = its weight is 0 and the denominator keeps it (TRL, AReaL).",
    )
    unit: Literal["trajectory", "action"] = F(
        "trajectory",
        "The sequence of the sequence-level corrections (tis_seq, mis_seq, geo_seq_mask) and of the sequence "
        "masked fraction: the whole trajectory (a verl/SkyRL multi-turn response) or one turn-action.",
    )

    @model_validator(mode="after")
    def _band(self) -> CorrectionConfig:
        if self.name in CORRECTION:  # an unknown name is reported by the registry check
            check_params(self.name, CorrectionParams(c=self.c, lo=self.lo, hi=self.hi))
        return self


class FilterConfig(Strict):
    name: str = F("none", "Group filter: none, dapo (drop zero-variance groups), ragen_top_p, ragen_top_k.")
    top_p: float = F(0.9, "ragen_top_p: keep groups holding this share of total reward std (RAGEN-2: 0.9).", gt=0, le=1)
    top_k: float = F(0.5, "ragen_top_k: fraction of groups kept.", gt=0, le=1)
    max_extra_rounds: int = F(
        0, "dapo: extra generation rounds to refill the batch (DAPO dynamic sampling).", ge=0, le=100
    )


class KLConfig(Strict):
    estimator: str = F("k3", "KL estimator to the reference: none, k1, k2, k3 (Schulman 2020).")
    where: Literal["loss", "reward"] = F("loss", "loss: beta*KL added to the loss (GRPO); reward: r -= beta*KL (PPO).")
    coef: float = F(0.01, "beta (Practitioner's Guide: 0.01).", ge=0)


class CriticConfig(Strict):
    enabled: bool = F(False, "Train a value head (needed by the gae estimator).")
    lr: float = F(1e-4, "Critic learning rate (guide: 1e-5 for 1.5B models).", gt=0)
    value_clip: float = F(0.2, "Clip range of the clipped value loss.", ge=0)
    coef: float = F(0.5, "Weight of the value loss.", ge=0)


class AlgoConfig(Strict):
    preset: Literal["ppo", "grpo", "rloo", "reinforce_pp", "custom"] = F(
        "custom", "Fill unset algo keys from a preset made only of axis values."
    )
    adv: AdvConfig = F(AdvConfig(), "Advantage estimation.")
    clip: ClipConfig = F(ClipConfig(), "Policy-loss ratio and clipping.")
    agg: str = F(
        "token-mean",
        "Loss aggregation: token-mean (DAPO), seq-mean-token-mean (GRPO), "
        "seq-mean-token-sum, seq-mean-token-sum-norm (Dr.GRPO).",
    )
    agg_len: int = F(
        256, "T_const of seq-mean-token-sum-norm (divides by batch * agg_len, as TRL).", ge=1, le=MAX_TOKENS
    )
    filter: FilterConfig = F(FilterConfig(), "Dynamic filtering of groups.")
    kl: KLConfig = F(KLConfig(), "KL to the reference policy.")
    entropy_coef: float = F(0.0, "Entropy bonus coefficient.", ge=0)
    critic: CriticConfig = F(CriticConfig(), "PPO value head.")
    correction: CorrectionConfig = F(
        CorrectionConfig(), "Off-policy correction between the sampler's and the behaviour log-probs."
    )
    obs_sft: ObsSftConfig = F(ObsSftConfig(), "Observation SFT (ECHO): cross-entropy on observation tokens.")
    distill: DistillConfig = F(DistillConfig(), "On-policy distillation (hindsight hints or none).")
    forced_tokens: Literal["count", "drop"] = F(
        "count",
        "Constrained decoding: tokens that were the only admissible continuation have log-prob 0 and no "
        "gradient. count: they stay in the loss mask (aggregation denominators, sequence-ratio lengths); "
        "drop: they leave it, so the step is not diluted by tokens the policy did not choose.",
    )
    epochs: int = F(1, "Passes over each rollout batch.", ge=1, le=1_000)
    minibatches: int = F(1, "Optimizer steps per epoch.", ge=1, le=MAX_BATCH)
    micro_batch_size: int = F(
        16, "Rows per forward pass (gradient accumulation); does not change results.", ge=1, le=MAX_BATCH
    )
    micro_batch_tokens: int = F(
        0,
        "Token budget per forward pass (0 = off: fixed micro_batch_size rows). When set, rows are sorted by "
        "length and packed so that rows x longest row <= budget (a longer trajectory gets a pass of its own), "
        "replacing micro_batch_size; as verl's use_dynamic_bsz, it cuts padding and changes results only "
        "at float-rounding level.",
        ge=0,
        le=MAX_TOKENS * MAX_BATCH,
    )
    lr: float = F(1e-4, "Actor learning rate (AdamW).", gt=0)
    weight_decay: float = F(0.0, "AdamW weight decay.", ge=0)
    grad_clip: float = F(1.0, "Max global gradient norm (0 = off).", ge=0)


# ----------------------------------------------------------------------------- sft / rollout / train
class SFTConfig(Strict):
    demos: int = F(0, "Expert demonstrations for the SFT warm-up of the policy (0 = none).", ge=0, le=MAX_COUNT)
    epochs: int = F(2, "SFT epochs.", ge=1, le=10_000)
    lr: float = F(1e-4, "SFT learning rate.", gt=0)
    batch_size: int = F(16, "SFT batch size (episodes).", ge=1, le=MAX_BATCH)
    budget: int | None = F(
        None,
        "SFT/RL split (Practitioner's Guide): total budget in RL episodes; "
        "RL episodes = budget - demos * demo_cost (at least one update's worth). null = no split.",
        ge=1,
        le=1_000 * MAX_COUNT,
    )
    demo_cost: float = F(10.0, "RL episodes one demonstration costs (guide: 10).", gt=0, le=MAX_COUNT)


class CrossPolicyConfig(Strict):
    members: int = F(
        0,
        "Cross-policy sampling (AgentRL): stale policies in the sampling pool besides the current one "
        "(0 = off; docs/algorithms.md#off-policy).",
        ge=0,
        le=16,
    )
    prob: float = F(
        0.5, "Probability that a turn's action is generated by a stale member (drawn uniformly among them).", ge=0, le=1
    )
    refresh_every: int = F(
        2,
        "The pool takes a snapshot of the trainer's weights every this many updates; member j holds the j-th most "
        "recent one, so member 1 is 0 to refresh_every - 1 updates old.",
        ge=1,
        le=MAX_COUNT,
    )
    train_on: Literal["all", "current"] = F(
        "all",
        "Turns trained: all (AgentRL: plain training on every action) or current (only the turns the current "
        "policy generated; the stale members' turns stay in the context but leave the loss).",
    )


class RolloutConfig(Strict):
    backend: Literal["hf", "static", "vllm"] = F(
        "hf",
        "Generation backend. hf: our batched sampler on the model's own forward with a growing KV "
        "cache (the CPU path). static: the same sampler on a preallocated static KV cache with fused "
        "attention, and CUDA graphs for the decode step on a GPU (harness.rl.engines.static). vllm: vLLM's "
        "engine with the LoRA adapter swapped in after every update (harness.rl.engines.vllm).",
    )
    group_size: int = F(8, "G rollouts per task instance (one group).", ge=1, le=4_096)
    tasks_per_update: int = F(8, "Task instances (groups) per update.", ge=1, le=MAX_BATCH)
    temperature: float = F(1.0, "Sampling temperature (guide: 0.7 for PPO).", gt=0)
    top_p: float = F(1.0, "Nucleus sampling.", gt=0, le=1)
    max_new_tokens: int = F(16, "Token limit of one action; reaching it counts as overflow.", ge=1, le=MAX_TOKENS)
    constrain: bool = F(False, "Constrain decoding to the admissible actions where the env lists them.")
    sampler_dtype: Literal["same", "bfloat16", "float32"] = F(
        "same",
        "Dtype of the policy that samples training rollouts. same: the trainer's model itself. bfloat16 / "
        "float32: a copy in that dtype, refreshed from the trainer's weights before every rollout, so sampler "
        "and trainer differ as in engines that sample in another precision (held-out evaluation always uses "
        "the trainer's model).",
    )
    cross_policy: CrossPolicyConfig = F(CrossPolicyConfig(), "Cross-policy sampling from a pool of policies (AgentRL).")
    staleness: int = F(
        0,
        "Asynchronous rollout with staleness bound k (0 = synchronous; docs/algorithms.md#staleness). "
        "Deterministic mode (concurrent: false): update u's episodes are sampled with the adapter the trainer "
        "had at the start of update u - k. Concurrent mode: a rollout process runs up to k updates ahead.",
        ge=0,
        le=1000,
    )
    concurrent: bool = F(
        False,
        "Generate rollouts in a separate process that overlaps the learner's updates, within rollout.staleness "
        "(the lag then varies in [0, k] with timing; rollout/staleness logs it).",
    )

    @model_validator(mode="after")
    def _concurrent_alone(self) -> RolloutConfig:
        if self.concurrent and self.cross_policy.members:
            raise ValueError(
                f"rollout.concurrent = true with rollout.cross_policy.members = {self.cross_policy.members}: "
                "cross-policy sampling runs in the synchronous or deterministic modes only; set one of them off"
            )
        return self


class TrainConfig(Strict):
    updates: int = F(40, "RL updates.", ge=0, le=MAX_COUNT)
    eval_every: int = F(
        10, "Held-out evaluation every k updates (and at the end); 0 = only at the end.", ge=0, le=MAX_COUNT
    )
    eval_episodes: int = F(64, "Held-out episodes per evaluation (greedy and sampled).", ge=1, le=MAX_COUNT)
    checkpoint_every: int = F(10, "Checkpoint cadence in updates (0 = only at the end).", ge=0, le=MAX_COUNT)
    seed: int = seed_field(0, "One seed for python, numpy, torch, environments and sampling.")
    device: Literal["auto", "cpu", "cuda"] = F("auto", "Where the model runs.")
    threads: int = F(0, "torch CPU threads (0 = torch's default).", ge=0, le=4_096)
    early_stop_on_collapse: bool = F(False, "Stop when the echo-trap detector fires (RAGEN).")
    mi_every: int = F(
        10, "Mutual-information proxy of template collapse (RAGEN-2) every k updates; 0 = off.", ge=0, le=MAX_COUNT
    )
    mi_prompts: int = F(16, "Distinct prompts N of the MI proxy (its estimate is at most log N).", ge=2, le=MAX_BATCH)


class TrackingConfig(Strict):
    mlflow: bool = F(True, "Log the run to MLflow (local store under results/ unless MLFLOW_TRACKING_URI).")
    samples: int = F(4, "Episodes per update written to samples.jsonl.", ge=0, le=MAX_BATCH)


class JudgeConfig(Strict):
    """The step judge (docs/algorithms.md#process-rewards): (state, action, next state) -> a vote in {+1, 0, -1}."""

    kind: Literal["rule", "model"] = F(
        "rule",
        "rule: the environment's own state (-1 on a format error, else the sign of the change of its progress "
        "score); model: a frozen causal LM prompted with the judge template, m sampled votes, majority.",
    )
    votes: int = F(
        1, "m, votes per step; the step's vote is their majority, a tie gives 0 (OpenClaw-RL: 1, SWE: 3).", ge=1, le=64
    )
    model: str | None = F(
        None,
        "kind model: a Hugging Face id or local path of the frozen judge; null = the run's starting policy "
        "(base model + SFT warm-up, adapter off), frozen.",
    )
    temperature: float = F(1.0, "kind model: sampling temperature of each vote (0 = greedy).", ge=0, le=10)
    max_new_tokens: int = F(8, "kind model: tokens of each answer.", ge=1, le=512)


class RewardConfig(Strict):
    """Reward signals added to the environment's (docs/algorithms.md#process-rewards)."""

    process: Literal["none", "judge"] = F(
        "none",
        "Process rewards (OpenClaw-RL's evaluative signal): judge = every step gets the judge's vote; "
        "none = the environment's rewards only (env.reward_density picks sparse or dense).",
    )
    weight: float = F(1.0, "w: weight of the process reward against the outcome (OpenClaw-RL SWE: 1.0).", ge=0, le=1e3)
    form: Literal["episode", "step"] = F(
        "episode",
        "episode: R = outcome + w * mean of the step votes, on the last step (OpenClaw-RL SWE-PRM); "
        "step: turn t's reward += w * vote_t, for step-level estimators (GiGPO, turn-level, GAE).",
    )
    judge: JudgeConfig = F(JudgeConfig(), "The step judge.")


class ACTConfig(Strict):
    """ACT, agentic critical training (docs/algorithms.md#act)."""

    mode: Literal["none", "stage", "mixed"] = F(
        "none",
        "none: off; stage: the first act.updates updates train the critic task (which of the expert's and a "
        "sampled action is better), the rest RL; mixed: every update gives a share act.mix of its groups to "
        "the critic task. Both keep the episodes of an RL-only run (equal compute).",
    )
    updates: int = F(5, "stage: updates spent on the critic task before RL.", ge=1, le=MAX_COUNT)
    mix: float = F(0.25, "mixed: share of each update's groups (tasks) that are critic questions.", gt=0, lt=1)
    answer: Literal["letter", "action"] = F(
        "letter",
        "How the policy answers a critic question: letter: A or B (the pair shown as A: / B:); action: it writes "
        "the better of the two actions, parsed by the environment (for policies that can only write the "
        "environment's actions, such as the tiny model: with letters every answer is a format error).",
    )


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


def axis_params(cls: type[P], section: BaseModel, **fixed: Any) -> P:
    """An `algorithms.types` params dataclass from the config section whose keys carry the same
    names (`ClipParams` from `algo.clip`, ...); `fixed` sets fields that are not config keys."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: getattr(section, k) for k in type(section).model_fields if k in names}, **fixed)
