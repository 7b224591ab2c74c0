"""`algo:` one section per ablation axis, and the parameters each axis function receives.

Who owns what:
- These sections own every default, bound and documentation line of the `algo.*` keys.
- Each section's `params` (`AlgoConfig.agg_params` for aggregation) is the one place where it becomes
  the dataclass of `algorithms.types` its axis function receives; those dataclasses declare no
  defaults and no checks of their own.
- `algorithms/` owns the axis functions and their registries (checked by the loader), the checks
  that belong to an algorithm (`algorithms.correction.check_params`, called below;
  `algorithms.normalization.check_norm_compatible`, called by `RunConfig`), the defaults a null
  key stands for because they depend on the chosen value (`algorithms.correction.TIS_CAP` and
  `BANDS`, which the documentation below quotes), and its numerical constants that are no config
  key (`algorithms.utils.STD_EPS`, `WHITEN_EPS`, the log-ratio clamps).
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from algorithms.correction import BANDS, CORRECTION, TIS_CAP, check_params
from algorithms.types import AdvantageParams, AggParams, ClipParams, CorrectionParams, FilterParams
from harness.config.fields import MAX_BATCH, MAX_TOKENS, F, Strict


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

    @property
    def params(self) -> AdvantageParams:
        """What `algo.adv.estimator` and `algo.adv.norm` receive."""
        return AdvantageParams(
            gamma=self.gamma,
            lam=self.lam,
            gigpo_gamma=self.gigpo_gamma,
            gigpo_step_weight=self.gigpo_step_weight,
            gigpo_mode=self.gigpo_mode,
            gigpo_episode_stats=self.gigpo_episode_stats,
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

    @property
    def params(self) -> ClipParams:
        """What `algo.clip.level` receives (seq_mask / seq_mask_delta go to the SAMPO mask instead)."""
        return ClipParams(
            eps_low=self.eps_low, eps_high=self.eps_high, dual_c=self.dual_c, tau_pos=self.tau_pos, tau_neg=self.tau_neg
        )


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
        f"Cap C: tis_token / tis_seq truncate their weight at C (null = {TIS_CAP:g}, verl); decoupled rejects tokens "
        "whose weight exceeds C (null = no cap; AReaL's examples use 5). Also the band [1/C, C] of the mismatch "
        f"diagnostics (null = {TIS_CAP:g}).",
        ge=1,
    )
    lo: float | None = F(
        None, "Lower bound of the band of mis_token, mis_seq, icepop, geo_seq_mask (null = its default).", ge=0
    )
    hi: float | None = F(
        None,
        f"Upper bound of that band (null = its default: mis {BANDS['mis_token'][1]:g}, icepop {BANDS['icepop'][1]:g}, "
        f"geo_seq_mask {BANDS['geo_seq_mask'][1]:g}).",
        gt=0,
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
            check_params(self.name, self.params)
        return self

    @property
    def params(self) -> CorrectionParams:
        """What `algo.correction.name` receives (None: the correction's own default, `algorithms.correction`)."""
        return CorrectionParams(c=self.c, lo=self.lo, hi=self.hi)


class FilterConfig(Strict):
    name: str = F("none", "Group filter: none, dapo (drop zero-variance groups), ragen_top_p, ragen_top_k.")
    top_p: float = F(0.9, "ragen_top_p: keep groups holding this share of total reward std (RAGEN-2: 0.9).", gt=0, le=1)
    top_k: float = F(0.5, "ragen_top_k: fraction of groups kept.", gt=0, le=1)
    max_extra_rounds: int = F(
        0, "dapo: extra generation rounds to refill the batch (DAPO dynamic sampling).", ge=0, le=100
    )

    @property
    def params(self) -> FilterParams:
        """What `algo.filter.name` receives (max_extra_rounds is the rollout worker's)."""
        return FilterParams(top_p=self.top_p, top_k=self.top_k)


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

    @property
    def agg_params(self) -> AggParams:
        """What `algo.agg` receives, before the counts of a minibatch are known (`num_tokens`, `num_seqs`
        None: each call counts its own; `algorithms.aggregation.global_counts` fills in a minibatch's)."""
        return AggParams(num_tokens=None, num_seqs=None, agg_len=self.agg_len)
