"""Sequential seeds (analysis.sequential): the spending functions, one look's Holm and TOST by hand,
the replay of looks, and by simulation the error rates of the whole stopping rule.

The simulations draw the paired Δ of a sweep's arms against one shared baseline on a seeds x
tasks grid, Y[s, t] = mu + a_s + b_t + e_st per arm with normal effects, in the variance of the
FrozenLake sweeps (issue 54: σ_seed 0.03-0.046, σ_task 0.05, residual 0.34 per episode, 256
held-out tasks; each arm's components are the Δ's over √2, so every Δ has them, and contrasts
sharing the baseline are correlated 0.5). They run the looks at 3, 5, ..., 15 seeds with the
rule of the table (analysis.intervals' interval, analysis.sequential.look_codes) and count:
- family-wise: a replicate with at least one null contrast (true Δ 0) declared better / worse;
- equivalence: a contrast at the margin (true Δ = margin, the least favourable point) declared
  equivalent.
Monte-Carlo tolerance: each estimated rate must stay below its nominal rate plus three binomial
standard errors at the nominal rate (sqrt(α(1 - α) / R); R replicates). The same draws under the
naive rule (the fixed-n table re-read at every look) must exceed the nominal rate, so the
simulation can see the inflation it guards against.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from analysis.intervals import grid_interval, interval_arrays, mean_squares, seeds_for_interval, seeds_for_verdict
from analysis.sequential import (
    DOWN,
    EQUIVALENT,
    OPEN,
    UP,
    Plan,
    look_codes,
    look_sizes,
    obrien_fleming,
    pocock,
    replay,
    seeds_needed,
)

TASKS = 256
PLAN = Plan(start=3, step=2, max=15)
REGIMES = {  # (σ_seed, σ_task, σ_residual) of the paired Δ
    "seed 0.03": (0.03, 0.05, 0.34),
    "seed 0.046": (0.046, 0.05, 0.34),
}


# ----------------------------------------------------------------------------- by hand
def test_spending_functions_reach_alpha_at_the_end_and_grow():
    tau = np.array([0.2, 1 / 3, 0.6, 1.0])
    for f in (obrien_fleming, pocock):
        a = f(tau, 0.05)
        assert np.all(np.diff(a) > 0) and a[-1] == pytest.approx(0.05)
    # O'Brien-Fleming at tau = 0.2: 2 - 2 Phi(1.95996 / sqrt(0.2)) = 2 - 2 Phi(4.3826) = 1.17e-5
    assert obrien_fleming(np.array([0.2]), 0.05)[0] == pytest.approx(1.17e-5, rel=0.01)
    # Pocock at tau = 0.5: 0.05 ln(1 + (e - 1) / 2) = 0.05 x 0.6201 = 0.031
    assert pocock(np.array([0.5]), 0.05)[0] == pytest.approx(0.031006, rel=1e-4)


def test_looks_and_increments():
    assert look_sizes(3, 2, 15) == (3, 5, 7, 9, 11, 13, 15)
    assert look_sizes(3, 4, 12) == (3, 7, 11, 12)  # max is always a look
    assert look_sizes(5, 1, 5) == (5,)  # one look: the fixed-n rule at α
    inc = PLAN.increments(0.05)
    assert inc.sum() == pytest.approx(0.05) and np.all(inc > 0)
    assert Plan(5, 1, 5).levels(0) == (pytest.approx(0.05), pytest.approx(0.05))


def test_one_look_holm_over_the_family_and_tost():
    # three contrasts, se 0.01, df large: 5 sigma (p 5.7e-7), -2.3 sigma (p 0.0214), 0
    value, se, df = [0.05, -0.023, 0.0], [0.01] * 3, [1e6] * 3
    codes = look_codes(value, se, df, [True] * 3, [True] * 3, 0.05, 0.05, 0.05)[0]
    # Holm: 5.7e-7 <= 0.05/3, then 0.0214 <= 0.05/2; the third's 90% interval 0 ± 0.0164 is inside ±0.05
    assert list(codes) == [UP, DOWN, EQUIVALENT]
    # a fourth contrast frozen as equivalent stays in the family: 0.0214 > 0.05/3 now, and the
    # second is equivalent instead (0.023 + 0.0164 < 0.05); the frozen one is not tested
    codes = look_codes([*value, 0.0], [*se, 0.01], [*df, 1e6], [True] * 3 + [False], [True] * 4, 0.05, 0.05, 0.05)[0]
    assert list(codes) == [UP, EQUIVALENT, EQUIVALENT, OPEN]
    # a look spending 0.001: the 5-sigma contrast passes (5.7e-7 <= 0.001/3), the TOST at 0.001
    # (3.09 se) puts the second outside ±0.05 (0.023 + 0.0309) and the third inside (0.0309)
    codes = look_codes(value, se, df, [True] * 3, [True] * 3, 0.001, 0.001, 0.05)[0]
    assert list(codes) == [UP, OPEN, EQUIVALENT]
    codes = look_codes(value, se, df, [True] * 3, [True] * 3, 0.001, 0.001, 0.03)[0]
    assert list(codes) == [UP, OPEN, OPEN]
    # no spread: never decided
    assert look_codes([0.1], [0.0], [2], [True], [True], 0.05, 0.05, 0.05)[0][0] == OPEN


def test_vectorised_interval_is_the_table_interval():
    rng = np.random.default_rng(0)
    for n, m, s_seed, s_task in [(3, 40, 0.05, 0.0), (5, 30, 0.001, 0.3), (4, 1, 0.1, 0.0), (6, 20, 0.02, 0.05)]:
        y = rng.normal(0, s_seed, (n, 1)) + rng.normal(0, s_task, (1, m)) + rng.normal(0, 0.3, (n, m))
        v, se, df = interval_arrays(y.mean(), *mean_squares(y), n, m)
        ref = grid_interval(y)
        assert (float(v), float(se), float(df)) == pytest.approx((ref.value, ref.se, ref.df), rel=1e-9)


def _grids(rng, n, effects, sigma=(0.04, 0.05, 0.34), m=64):
    """A baseline and one grid per effect: the paired Δ grids (n x m) of each arm."""
    base = rng.normal(0, sigma[0], (n, 1)) + rng.normal(0, sigma[1], (1, m)) + rng.normal(0, sigma[2], (n, m))
    out = {}
    for i, e in enumerate(effects):
        arm = e + rng.normal(0, sigma[0], (n, 1)) + rng.normal(0, sigma[1], (1, m)) + rng.normal(0, sigma[2], (n, m))
        out[f"arm{i}"] = arm - base
    return out


def test_replay_freezes_decisions_and_stops_at_incomplete_looks():
    rng = np.random.default_rng(3)
    grids = _grids(rng, 15, [0.5, 0.0, 0.01])
    plan = Plan(3, 2, 15, margin=0.2)
    have = {"arm0": 15, "arm1": 15, "arm2": 15}

    def estimate(arm, n):
        return grid_interval(grids[arm][:n]) if n <= have[arm] else None

    out = replay(plan, list(grids), estimate)
    assert out.next_look is None
    big = out.decisions["arm0"]
    assert big.verdict == "better" and big.seeds < 15  # a large effect stops early
    assert big.interval.n == big.seeds
    for d in out.decisions.values():
        assert d.verdict in ("better", "equivalent", "undetermined")
    # every look records the verdicts of the contrasts it tested; a decided one is not tested again
    decided_at = {a: d.look for a, d in out.decisions.items()}
    for record in out.looks:
        assert all(decided_at[a] >= record["look"] - 1 for a in record["verdicts"])
    # arm1 has only 6 seeds: the look at 7 seeds is not complete, so the replay stops there with
    # the verdicts of the looks before it unchanged
    assert out.decisions["arm1"].look >= 2  # open at the look at 7 seeds in the full replay
    have["arm1"] = 6
    part = replay(plan, list(grids), estimate)
    assert part.next_look == 2 and part.decisions["arm1"].verdict == "open"
    assert part.looks == out.looks[:2]
    for a, d in part.decisions.items():
        assert d == out.decisions[a] if d.verdict != "open" else out.decisions[a].look >= 2


def test_a_contrast_without_spread_is_frozen_as_degenerate_at_its_look_and_gets_no_more_seeds():
    """An arm whose runs score as the baseline's on every seed and task (a judge that never votes) has
    no test at any look: it is degenerate at the first look and gets no more seeds. The rule freezes
    what it saw: an arm equal to the baseline on the first look's seeds is degenerate there even when
    a later seed would differ (here from the fourth on), while one seed of spread keeps it tested."""
    rng = np.random.default_rng(5)
    grids = _grids(rng, 15, [0.0])
    grids["same"] = np.zeros((15, 8))
    late = np.zeros((15, 8))
    late[3:] = rng.normal(0, 0.3, (12, 8))
    grids["late"] = late
    early = np.zeros((15, 8))
    early[2:] = rng.normal(0, 0.3, (13, 8))
    grids["early"] = early
    plan = Plan(3, 2, 15, margin=0.05)
    out = replay(plan, list(grids), lambda arm, n: grid_interval(grids[arm][:n]))
    for arm in ("same", "late"):
        d = out.decisions[arm]
        assert d.verdict == "degenerate" and d.look == 0 and d.seeds == 3
        assert all(arm not in r["verdicts"] for r in out.looks[1:])  # not tested again
    assert out.looks[0]["verdicts"]["early"] != "degenerate" and out.decisions["early"].verdict != "degenerate"
    assert out.decisions["arm0"].verdict != "degenerate"


def test_seeds_needed_shrinks_with_a_larger_effect_and_is_none_without_a_way_to_a_verdict():
    rng = np.random.default_rng(5)
    noise = rng.normal(0, 0.05, (15, 1)) + rng.normal(0, 0.3, (15, 64))
    noise -= noise.mean()
    plan = Plan(3, 2, 15, margin=0.01)
    # Δ 0.03 and 0.045, undetermined at 15 seeds (0.045 < t x SE at the last look's a_K / 3)
    small, large = seeds_needed(noise + 0.03, plan, 3), seeds_needed(noise + 0.045, plan, 3)
    assert small is not None and large is not None and 15 < large < small
    assert seeds_needed(noise, PLAN, 3) is not None  # Δ 0: inside ±0.05 with enough seeds
    assert seeds_needed(noise, plan, 3) is None  # ... but not inside ±0.01 below NEEDED_MAX seeds
    # a task term alone wider than the margin (4 tasks, σ_task 0.5) never shrinks with seeds: Δ 0 is
    # never inside ±0.05 and never away from 0
    tasks = rng.normal(0, 0.05, (15, 1)) + np.array([[-0.6, -0.2, 0.3, 0.5]]) + rng.normal(0, 0.01, (15, 4))
    assert seeds_needed(tasks - tasks.mean(), PLAN, 3) is None


def _grid_with(value: float, ms: tuple[float, float, float], n: int, m: int, rng) -> np.ndarray:
    """An n x m grid of mean `value` whose mean squares are exactly `ms` (MS_seed, MS_task, MS_res)."""
    ms_seed, ms_task, ms_res = ms
    a = rng.standard_normal(n)
    a -= a.mean()
    b = rng.standard_normal(m)
    b -= b.mean()
    e = rng.standard_normal((n, m))
    e = e - e.mean(axis=1, keepdims=True) - e.mean(axis=0) + e.mean()
    a *= math.sqrt(ms_seed * (n - 1) / m / (a**2).sum())
    b *= math.sqrt(ms_task * (m - 1) / n / (b**2).sum())
    e *= math.sqrt(ms_res * (n - 1) * (m - 1) / (e**2).sum())
    return value + a[:, None] + b[None, :] + e


def _decides(iv, alpha_diff: float, alpha_eq: float, margin: float) -> bool:
    """The table's rule for one contrast at these levels: away from 0, or inside ±margin (TOST)."""
    away = abs(iv.value) - stats.t.ppf(1 - alpha_diff / 2, iv.df) * iv.se > 0
    return away or abs(iv.value) + stats.t.ppf(1 - alpha_eq, iv.df) * iv.se < margin


@pytest.mark.parametrize(
    "value, sigmas",
    [(-0.04, (0.03, 0.0, 0.3)), (-0.065, (0.03, 0.04, 0.34)), (0.01, (0.05, 0.01, 0.34)), (0.03, (0.08, 0.0, 0.2))],
)
def test_seeds_for_verdict_is_the_fewest_seeds_at_which_the_tables_interval_decides(value, sigmas):
    """The projection is the table's own interval at k seeds with the observed Δ and mean squares: a grid
    of k seeds with exactly those mean squares is decided at k and not at k - 1 (Holm's strictest level
    over 8 contrasts, the 90% TOST), whether the seed term or the fixed task term dominates."""
    rng = np.random.default_rng(11)
    s_seed, s_task, s_res = sigmas
    m = 128
    ms = (m * s_seed**2 + s_res**2, 3 * s_task**2 + s_res**2, s_res**2)  # their expectations at n = 3
    grid = _grid_with(value, ms, 3, m, rng)
    assert mean_squares(grid) == pytest.approx(ms) and grid.mean() == pytest.approx(value)
    alpha_diff, alpha_eq = 0.05 / 8, 0.05
    k = seeds_for_verdict(grid, alpha_diff, alpha_eq, 0.05)
    assert k is not None and k > 3
    # the task term is a variance of the task means, which more seeds do not change: MS_task - MS_res scales with n
    at = lambda n: grid_interval(_grid_with(value, (ms[0], ms[2] + (ms[1] - ms[2]) * n / 3, ms[2]), n, m, rng))  # noqa: E731
    assert _decides(at(k), alpha_diff, alpha_eq, 0.05) and not _decides(at(k - 1), alpha_diff, alpha_eq, 0.05)
    # from the interval alone (all of SE^2 taken as seed term): never more seeds than the grid's projection
    assert seeds_for_interval(grid_interval(grid), alpha_diff, alpha_eq, 0.05) <= k


def test_seeds_needed_is_seeds_for_verdict_at_the_last_looks_levels():
    rng = np.random.default_rng(3)
    grid = rng.normal(0, 0.05, (15, 1)) + rng.normal(0, 0.3, (15, 64)) + 0.03
    alpha, alpha_eq = PLAN.levels(len(PLAN.looks) - 1)
    assert seeds_needed(grid, PLAN, 3) == seeds_for_verdict(grid, alpha / 3, alpha_eq, PLAN.margin)


def test_seeds_for_interval_needs_an_interval():
    from analysis.intervals import Interval

    assert seeds_for_interval(Interval(0.1, math.nan, math.nan, 1, 1), 0.05, 0.05, 0.05) is None
    assert seeds_for_interval(Interval(0.1, 0.0, 2.0, 3, 1), 0.05, 0.05, 0.05) is None
    # a seeds-only interval: SE = s / sqrt(n), so the projection is the t test at k seeds with the same s
    k = seeds_for_interval(Interval(0.04, 0.02, 2.0, 3, 1), 0.05, 0.05, 0.01)
    se_k = lambda k: 0.02 * math.sqrt(3 / k)  # noqa: E731
    assert 0.04 / se_k(k) > stats.t.ppf(0.975, k - 1) and 0.04 / se_k(k - 1) <= stats.t.ppf(0.975, k - 2)


# ----------------------------------------------------------------------------- simulation
def _deltas(rng, reps: int, effects, sigma, n: int, m: int = TASKS) -> np.ndarray:
    """(reps, arms, n, m) paired Δ grids of arms against one shared baseline (float32 draws)."""
    s_seed, s_task, s_res = (x / math.sqrt(2) for x in sigma)
    arms = len(effects) + 1

    def draw(shape, scale):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)

    y = draw((reps, arms, n, m), s_res)
    y += draw((reps, arms, n, 1), s_seed)
    y += draw((reps, arms, 1, m), s_task)
    return (y[:, 1:] - y[:, :1]).astype(np.float64) + np.asarray(effects, dtype=float)[None, :, None, None]


def _look_estimates(d: np.ndarray, looks) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(value, se, df) arrays (reps, arms) of the first n seeds, for every look n (prefix sums)."""
    m = d.shape[-1]
    rows = d.sum(-1)  # (R, C, N)
    cols = np.cumsum(d, axis=2)  # (R, C, N, m): column sums over the first n seeds
    squares = np.cumsum((d * d).sum(-1), axis=2)
    out = []
    for n in looks:
        total = rows[..., :n].sum(-1)
        ct = total**2 / (n * m)
        ss_rows = (rows[..., :n] ** 2).sum(-1) / m
        ss_cols = (cols[..., n - 1, :] ** 2).sum(-1) / n
        ms_seed = (ss_rows - ct) / (n - 1)
        ms_task = (ss_cols - ct) / (m - 1)
        ms_res = (squares[..., n - 1] - ss_rows - ss_cols + ct) / ((n - 1) * (m - 1))
        out.append(interval_arrays(total / (n * m), ms_seed, ms_task, ms_res, n, m))
    return out


def _run_rule(estimates, plan: Plan, sequential: bool) -> np.ndarray:
    """Final codes (reps, arms): the sequential rule, or the naive one (the fixed-n table's Holm at
    0.05 and 90% TOST re-read at every look, stopping a contrast at its first verdict)."""
    codes = np.full(estimates[0][0].shape, OPEN)
    rejected = np.zeros(codes.shape, dtype=bool)
    for k, (v, se, df) in enumerate(estimates):
        alpha, alpha_eq = plan.levels(k) if sequential else (plan.alpha, plan.equivalence_alpha)
        tested = codes == OPEN
        family = ~rejected if sequential else np.ones_like(rejected)
        new = look_codes(v, se, df, tested, family, alpha, alpha_eq, plan.margin)
        fresh = tested & (new != OPEN)
        codes[fresh] = new[fresh]
        rejected |= fresh & np.isin(new, (UP, DOWN))
    return codes


def _simulate(seed: int, reps: int, effects, sigma, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Final codes of the sequential and of the naive rule on the same draws, in chunks."""
    rng = np.random.default_rng(seed)
    seq, naive = [], []
    for start in range(0, reps, 250):
        est = _look_estimates(_deltas(rng, min(250, reps - start), effects, sigma, plan.max), plan.looks)
        seq.append(_run_rule(est, plan, True))
        naive.append(_run_rule(est, plan, False))
    return np.concatenate(seq), np.concatenate(naive)


def _bound(rate: float, reps: int) -> float:
    return rate + 3 * math.sqrt(rate * (1 - rate) / reps)


@pytest.mark.parametrize("regime", list(REGIMES))
@pytest.mark.parametrize("spending", ["obrien_fleming", "pocock"])
def test_family_wise_false_better_or_worse_at_most_alpha(regime, spending):
    """Four null contrasts and one real one (Δ 0.06, so the family shrinks once it is decided)."""
    plan = Plan(3, 2, 15, spending=spending)
    reps, effects = 2000, [0.0, 0.0, 0.0, 0.0, 0.06]
    seq, naive = _simulate(11, reps, effects, REGIMES[regime], plan)
    null = np.array(effects) == 0
    fwer = float(np.isin(seq[:, null], (UP, DOWN)).any(axis=1).mean())
    naive_fwer = float(np.isin(naive[:, null], (UP, DOWN)).any(axis=1).mean())
    assert fwer <= _bound(plan.alpha, reps), (regime, spending, fwer)
    assert naive_fwer > fwer, (regime, naive_fwer)
    assert float((seq[:, ~null] == UP).mean()) > 0.5  # the real effect is found (power)


@pytest.mark.parametrize("regime", list(REGIMES))
def test_one_null_contrast_re_read_at_every_look_is_inflated_and_the_rule_is_not(regime):
    """The failure the rule exists for: one null contrast, the fixed-n test re-read at 3, 5, ..., 15
    seeds, stopping at the first verdict, is declared better / worse far more often than 5%."""
    reps = 3000
    seq, naive = _simulate(14, reps, [0.0], REGIMES[regime], PLAN)
    assert float(np.isin(naive, (UP, DOWN)).mean()) > _bound(PLAN.alpha, reps)
    assert float(np.isin(seq, (UP, DOWN)).mean()) <= _bound(PLAN.alpha, reps)


@pytest.mark.parametrize("regime", list(REGIMES))
def test_equivalence_wrong_at_most_its_nominal_rate(regime):
    """Contrasts exactly at ±margin (equivalence false, least favourable): declared equivalent at
    most 5% of the time each."""
    plan = Plan(3, 2, 15, margin=0.05)
    reps, effects = 2000, [0.05, -0.05]
    seq, naive = _simulate(12, reps, effects, REGIMES[regime], plan)
    wrong = float((seq == EQUIVALENT).mean())
    naive_wrong = float((naive == EQUIVALENT).mean())
    # per contrast: 2 x reps draws, correlated through the baseline; the tolerance uses reps only
    assert wrong <= _bound(plan.equivalence_alpha, reps), (regime, wrong)
    assert naive_wrong > wrong


def test_equivalence_is_reachable_under_the_null():
    """Not a vacuous rule: with Δ 0 and a margin of 0.05 most null contrasts end equivalent by 15 seeds."""
    seq, _ = _simulate(13, 500, [0.0, 0.0], REGIMES["seed 0.03"], PLAN)
    assert float((seq == EQUIVALENT).mean()) > 0.5
