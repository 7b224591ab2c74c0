"""A sweep's seed budget: `seeds: {start, step, max, spending}` instead of a list of seeds.

    seeds: {start: 3, step: 2, max: 15, spending: obrien_fleming}
    until: verdict                     # optional: the only stopping goal, and the default

The sweep runs every variant at seeds 0 .. start - 1, then looks at the table's contrasts (each
variant's paired Δ to the baseline) and gives `step` more seeds only to the variants whose
contrast is still undetermined, and to the baseline, until `max` (docs/user-guide.md#sequential-seeds).
The verdict rule is analysis.sequential's; the looks are start, start + step, ..., and max.
Keys: start (at least 2, the fewest seeds an interval needs), step (default 1), max (at least
start), spending (default obrien_fleming; or pocock: how the family-wise 0.05 is spread over the
looks, Lan & DeMets 1983). The budget, the spending and the sweep's equivalence_margin are fixed
once the first look is recorded (results/<sweep>/looks.json): changing them afterwards is an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.config.errors import ConfigError
from harness.config.keys import show_value
from harness.config.schema import SEED_MAX

BUDGET_KEYS = ("start", "step", "max", "spending")
DEFAULT_SPENDING = "obrien_fleming"
UNTIL = ("verdict",)  # what `until:` may say


def spending_names() -> list[str]:
    from analysis.sequential import SPENDING  # scipy: imported only for a sweep with a budget

    return list(SPENDING)


@dataclass(frozen=True)
class SeedBudget:
    start: int
    step: int
    max: int
    spending: str = DEFAULT_SPENDING

    @property
    def looks(self) -> tuple[int, ...]:
        from analysis.sequential import look_sizes

        return look_sizes(self.start, self.step, self.max)

    def plan(self, margin: float | None):
        """The analysis.sequential.Plan of this budget with the sweep's margin (None: the default)."""
        from analysis.sequential import DEFAULT_MARGIN, Plan

        return Plan(self.start, self.step, self.max, self.spending, DEFAULT_MARGIN if margin is None else margin)

    def as_dict(self) -> dict[str, Any]:
        return {"start": self.start, "step": self.step, "max": self.max, "spending": self.spending}


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_seed_budget(value: dict, src: str) -> SeedBudget:
    """A `seeds:` mapping as a SeedBudget; anything wrong is one paragraph naming the file, the
    key, its value and what is allowed."""
    shown = f"{src}: seeds = {show_value(value)}"
    form = "a seed budget is seeds: {start: 3, step: 2, max: 15, spending: obrien_fleming} (step and spending optional)"
    unknown = [k for k in value if k not in BUDGET_KEYS]
    if unknown:
        raise ConfigError(f"{shown}: unknown key seeds.{unknown[0]}; valid keys: {', '.join(BUDGET_KEYS)} ({form}).")
    for key in ("start", "max"):
        if key not in value:
            raise ConfigError(f"{shown}: seeds.{key} is required ({form}).")
    start, step, most = value["start"], value.get("step", 1), value["max"]
    spending = value.get("spending", DEFAULT_SPENDING)
    if not _whole(start) or start < 2:
        raise ConfigError(
            f"{shown}: seeds.start = {show_value(start)} must be a whole number of at least 2 (the seeds of the "
            "first look; an interval needs 2)."
        )
    if not _whole(step) or step < 1:
        raise ConfigError(
            f"{shown}: seeds.step = {show_value(step)} must be a whole number of at least 1 (the seeds each look adds)."
        )
    if not _whole(most) or most < start or most > SEED_MAX + 1:
        raise ConfigError(
            f"{shown}: seeds.max = {show_value(most)} must be a whole number from seeds.start ({start}) up: the "
            "most seeds a variant gets (seeds 0 .. max - 1)."
        )
    names = spending_names()
    if spending not in names:
        raise ConfigError(
            f"{shown}: seeds.spending = {show_value(spending)} is not a spending function; choose one of: "
            f"{', '.join(names)}."
        )
    return SeedBudget(start, step, most, spending)


def check_until(until: Any, budget: SeedBudget | None, src: str) -> None:
    """`until:` names a stopping goal of a seed budget; with a list of seeds it is an error."""
    if until is None:
        return
    if until not in UNTIL:
        raise ConfigError(
            f"{src}: until = {show_value(until)} is not a stopping goal; choose one of: {', '.join(UNTIL)}."
        )
    if budget is None:
        raise ConfigError(
            f"{src}: until = {show_value(until)} applies to a seed budget (seeds: {{start, step, max}}); this sweep "
            "lists its seeds, so every variant runs all of them. Remove `until:` or declare a budget."
        )
