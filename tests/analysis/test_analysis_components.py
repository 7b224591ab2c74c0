"""analysis.components (`harness table --components`): the variance components of a paired Δ by hand,
by simulation in the variance regimes of the shipped sweeps (σ_seed 0.03-0.05, σ_task 0.05, residual
0.34 per episode, 256 tasks, 3-15 seeds) that the components are unbiased, that the model's expected
SE at another design is the simulated one, that the lever it names is the one that narrows more,
and that the seeds-unpaired alternative it prints covers only where the seeds' correlation is not
negative (why the table keeps the paired interval); and the CLI section on a synthetic sweep."""

from __future__ import annotations

import math

import numpy as np
import pytest
import typer
from synthetic_tasks import make_task_sweep
from typer.testing import CliRunner

from analysis.components import Components, Contrast, contrasts, page_lines, pooled, seed_correlation
from analysis.intervals import grid_interval
from harness.cli.analysis import register

# (σ_seed, σ_task, σ_res) of the paired differences, as the shipped FrozenLake sweeps show them
SHIPPED = [(0.03, 0.05, 0.34), (0.05, 0.05, 0.34)]


def crossed(rng, sigma: tuple[float, float, float], n: int, m: int, reps: int, delta: float = 0.0) -> np.ndarray:
    """`reps` grids D[s, j] = Δ + a_s + b_j + e_sj (normal, the model the components assume)."""
    s_seed, s_task, s_res = sigma
    a = rng.normal(0, s_seed, (reps, n, 1))
    b = rng.normal(0, s_task, (reps, 1, m))
    return delta + a + b + rng.normal(0, s_res, (reps, n, m))


def test_components_by_hand():
    d = np.array([[0, 0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 1, 1, 0]], float)
    n, m = d.shape
    mu, rows, cols = d.mean(), d.mean(axis=1), d.mean(axis=0)
    ms_seed = m * ((rows - mu) ** 2).sum() / (n - 1)  # 0: every seed solves two more tasks
    ms_task = n * ((cols - mu) ** 2).sum() / (m - 1)  # 3 x 1.0556 / 7
    ms_res = ((d - rows[:, None] - cols[None, :] + mu) ** 2).sum() / ((n - 1) * (m - 1))  # 1.3333 / 14
    assert (ms_seed, ms_task, ms_res) == pytest.approx((0.0, 0.45238, 0.095238), abs=1e-5)
    c = Components.of(d)
    assert c.var_seed == 0.0  # (0 - MS_res) / m floored
    assert c.var_task == pytest.approx((ms_task - ms_res) / n) and c.var_res == pytest.approx(ms_res)
    assert c.terms() == pytest.approx((0.0, c.var_task / m, ms_res / (n * m)))
    assert sum(c.shares()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least 2 seeds and 2 tasks"):
        Components.of(d[:1])


def test_unfloored_terms_add_up_to_the_tables_se():
    d = crossed(np.random.default_rng(0), (0.3, 0.2, 0.5), 5, 40, 1)[0]
    c, iv = Components.of(d), grid_interval(d)
    assert c.var_seed > 0 and c.var_task > 0  # nothing floored in this draw
    assert math.sqrt(sum(c.terms())) == pytest.approx(iv.se)
    assert c.expected().se == pytest.approx(iv.se)  # the expected mean squares at the observed ones


@pytest.mark.parametrize("sigma", SHIPPED)
@pytest.mark.parametrize("n", [3, 15])
def test_components_are_unbiased_and_the_expected_se_is_the_simulated_one(sigma, n):
    rng = np.random.default_rng(n + int(1000 * sigma[0]))
    m, reps = 256, 400
    grids = crossed(rng, sigma, n, m, reps)
    comps = [Components.of(g) for g in grids]
    truth = [s * s for s in sigma]
    for k, name in enumerate(("var_seed", "var_task", "var_res")):
        est = np.array([getattr(c, name) for c in comps])
        tol = 4 * est.std() / math.sqrt(reps) + 0.05 * truth[k]
        if name == "var_task" and n == 3:
            # MS_task - MS_res is below 0 in about a third of the draws at 3 seeds: the floor biases σ_task²
            # up (never down), so the printed task share errs towards more tasks, not fewer
            assert est.mean() > truth[k] - tol and (est == 0).mean() > 0.2, (name, est.mean())
            continue
        assert abs(est.mean() - truth[k]) < tol, (name, est.mean())
    # planning: the SE the truth expects at twice the seeds and at twice the tasks vs the simulated SE there
    true = Components(n, m, *truth)
    for n2, m2 in ((2 * n, m), (n, 2 * m)):
        sim = np.sqrt(np.mean([grid_interval(g).se ** 2 for g in crossed(rng, sigma, n2, m2, reps)]))
        assert true.expected(n2, m2).se == pytest.approx(sim, rel=0.06), (n2, m2)


def test_the_lever_is_the_doubling_that_narrows_more():
    seed_bound = Components(3, 256, 0.05**2, 0.05**2, 0.34**2)  # 3 seeds: the seed term and t(2)
    assert seed_bound.lever() == "seeds" and seed_bound.narrowing(n=6) < 0.6
    task_bound = Components(15, 64, 0.01**2, 0.2**2, 0.34**2)  # 15 seeds, a wide task spread, few tasks
    assert task_bound.lever() == "tasks"
    assert task_bound.narrowing(m=128) < task_bound.narrowing(n=30) < 1.0


def arms(rng, n: int, m: int, rho: float, sigma_seed: float = 0.05, delta: float = 0.05):
    """Two arms' success grids on m tasks of varied difficulty with common random numbers, the arm
    better by `delta`, seed effects correlated `rho` across the arms for the same seed."""
    p = 1 / (1 + np.exp(-rng.normal(0.5, 1.5, m)))
    z = rng.normal(0, 1, (2, n))
    seed_b = sigma_seed * z[0]
    seed_a = sigma_seed * (rho * z[0] + math.sqrt(1 - rho * rho) * z[1])
    u = rng.random((n, m))  # the same stream for both arms
    a = (u < np.clip(p + delta + seed_a[:, None], 0, 1)).astype(float)
    b = (u < np.clip(p + seed_b[:, None], 0, 1)).astype(float)
    return a, b


def _truth(rng, delta: float = 0.05, k: int = 400_000) -> float:
    p = 1 / (1 + np.exp(-rng.normal(0.5, 1.5, k)))
    return float((np.clip(p + delta, 0, 1) - p).mean())


@pytest.mark.parametrize(
    ("rho", "sigma_seed", "n", "low", "high"),
    [(0.0, 0.05, 3, 0.93, 0.99), (0.0, 0.03, 5, 0.93, 0.99), (0.6, 0.05, 3, 0.95, 1.0), (-0.9, 0.1, 3, 0.0, 0.92)],
)
def test_seeds_unpaired_covers_only_when_the_seeds_do_not_anticorrelate(rho, sigma_seed, n, low, high):
    rng = np.random.default_rng(int(100 * rho) + n + 1000)
    truth, reps = _truth(rng), 1000
    covered = {"crossed": 0, "welch": 0}
    width = {"crossed": [], "welch": []}
    for _ in range(reps):
        c = Contrast("arm", "base", *arms(rng, n, 256, rho, sigma_seed))
        for name, iv in (("crossed", c.crossed), ("welch", c.seeds_unpaired)):
            lo, hi = iv.bounds()
            covered[name] += lo <= truth <= hi
            width[name].append(hi - lo)
    assert 0.93 <= covered["crossed"] / reps <= 0.98  # the table's interval, whatever rho
    assert low <= covered["welch"] / reps <= high, covered["welch"] / reps
    if rho == 0.0 and n == 3:
        # independent seeds: Welch's df (about 3 instead of 2) narrows it, but each arm's seed means carry
        # that arm's own episode noise, which the common random numbers cancel in D: about 10% in all
        assert np.median(width["welch"]) < 0.97 * np.median(width["crossed"])


def test_common_random_numbers_make_the_crossed_interval_narrower_than_unpaired_tasks():
    rng = np.random.default_rng(3)
    ratios = []
    for _ in range(50):
        c = Contrast("arm", "base", *arms(rng, 5, 256, 0.0, sigma_seed=0.02))
        ratios.append(c.crossed.half_width / c.tasks_unpaired.half_width)
    assert np.median(ratios) < 0.8  # task difficulty and the shared stream cancel in D


def test_seed_correlation():
    a = np.array([[0.1, 0.3], [0.5, 0.7], [0.2, 0.2]])
    assert seed_correlation(a, a + 0.1) == pytest.approx(1.0)
    assert math.isnan(seed_correlation(a[:2], a[:2]))  # two seeds: no correlation to speak of


@pytest.fixture
def cli():
    app = typer.Typer()
    register(app)
    return lambda *args: CliRunner().invoke(app, [str(a) for a in args])


def test_cli_components_section_on_a_sweep_with_per_task_results(cli, tmp_path):
    root = make_task_sweep(tmp_path / "filters")
    metric, found = contrasts(root)
    assert metric == "final/eval_greedy/success"
    by_label = {c.label: c for c in found}
    assert set(by_label) == {"ragen_top_p", "dapo"} and by_label["dapo"].a.shape == (3, 8)
    r = cli("table", root, "--components")
    assert r.exit_code == 0, r.output
    assert "### Variance components of the Δ (final/eval_greedy/success, paired by seed and task)" in r.output
    c = by_label["ragen_top_p"].components  # the grid of test_components_by_hand
    row = next(line for line in r.output.splitlines() if line.startswith("| ragen_top_p vs none |"))
    assert row.startswith("| ragen_top_p vs none | 3 x 8 | +0.250 ± ") and "| 0 | 0.35 | 0.31 |" in row
    assert c.var_seed == 0 and row.split("|")[7].strip() == "0% / 79% / 21%"  # 0.0149 / 0.0040 of SE² by hand
    assert "Greedy decoding is deterministic" in r.output
    bad = cli("table", root, "--components", "--format", "csv")
    assert bad.exit_code == 2 and "--components prints a markdown section" in bad.output
    sampled = cli("table", root, "--components", "-m", "collapsed_at")
    assert sampled.exit_code == 2 and "needs a held-out metric with per-task results" in sampled.output


def test_page_lines_pool_the_sweeps_contrasts(tmp_path):
    root = make_task_sweep(tmp_path / "filters")
    _, found = contrasts(root)
    comp, k = pooled(found)
    assert k == 2 and comp.var_task == pytest.approx(np.mean([c.components.var_task for c in found]))
    (line, blank) = page_lines(root)
    assert blank == "" and line.startswith("Variance of its paired Δs (2 contrasts of 3 seeds x 8 tasks, averaged;")
    assert f"twice the held-out tasks to ×{comp.narrowing(m=16):.2f}:" in line  # greedy: no samples clause
    assert f"more {comp.lever()} narrow them most." in line
    assert page_lines(make_task_sweep(tmp_path / "seeds", per_task=False)) == []  # no per-task results
