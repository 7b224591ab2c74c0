"""The ablation axes: registries of small pure torch functions (math: docs/algorithms.md).

`AXES` maps each dotted config key to its registry; the config loader validates YAML
against it and `harness axes` prints each entry's doc and source.
"""

from . import gigpo as _gigpo  # noqa: F401  (registers "gigpo" into ADVANTAGE)
from .advantage import ADVANTAGE
from .aggregation import AGGREGATION, global_counts
from .correction import CORRECTION
from .filters import GROUP_FILTER
from .kl import KL_ESTIMATOR, entropy_from_logits, kl_penalty_rewards
from .normalization import ADV_NORM, check_norm_compatible
from .policy_loss import POLICY_LOSS, clipped_objective, negative_advantage_seq_mask
from .presets import PRESETS
from .registry import Entry, Registry, UnknownChoiceError
from .types import (
    AdvantageInputs,
    AdvantageOutput,
    AdvantageParams,
    AggParams,
    ClipParams,
    CorrectionOutput,
    CorrectionParams,
    EmptyBatchError,
    FilterParams,
    FilterResult,
)
from .utils import masked_mean, masked_sum, masked_var, masked_whiten, outcome_turn_rewards, turn_rewards_to_tokens

AXES: dict[str, Registry] = {
    "algo.clip.level": POLICY_LOSS,
    "algo.agg": AGGREGATION,
    "algo.adv.estimator": ADVANTAGE,
    "algo.adv.norm": ADV_NORM,
    "algo.filter.name": GROUP_FILTER,
    "algo.kl.estimator": KL_ESTIMATOR,
    "algo.correction.name": CORRECTION,
}

__all__ = [
    "AXES",
    "POLICY_LOSS",
    "AGGREGATION",
    "ADVANTAGE",
    "ADV_NORM",
    "GROUP_FILTER",
    "KL_ESTIMATOR",
    "CORRECTION",
    "PRESETS",
    "Registry",
    "Entry",
    "UnknownChoiceError",
    "AdvantageInputs",
    "AdvantageOutput",
    "AdvantageParams",
    "AggParams",
    "ClipParams",
    "CorrectionOutput",
    "CorrectionParams",
    "EmptyBatchError",
    "FilterParams",
    "FilterResult",
    "global_counts",
    "entropy_from_logits",
    "kl_penalty_rewards",
    "check_norm_compatible",
    "clipped_objective",
    "negative_advantage_seq_mask",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "outcome_turn_rewards",
    "turn_rewards_to_tokens",
]
