"""Builders shared by the test modules; a test module imports these and fixtures, never another test module.

- configs: the tiny trainer config (TINY), `merge`, `cfg_with`, `train_tiny`, the small one-layer model (`small_cfg`)
- baseline: the recorded baseline run (its config, `run`, the record, the CPU code path it depends on)
- update: real rollouts of the tiny policy for the update's tests (BASE, `Env`, `raw_config`, `cfg_of`, `perturb`)
- rollout: a tiny chat format and model, fake environments, `run` = collect() with test defaults
- episodes: a hand-built episode for batch layouts
- sweeps: sweep and study files, run options with the fake trainer, checks of finished points
- cli: `python -m harness` in a subprocess with the test environment; the fake trainers' names
- synthetic, synthetic_tasks: results folders with known answers for the analysis tests

Files the harness loads by name or path (the fake trainers, their pause protocol, a fault-injecting
environment, recorded data) are in tests/support/.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUPPORT = REPO / "tests" / "support"
