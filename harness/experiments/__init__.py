"""Experiments: config loading, sweeps, the runner, tuning, the Ray backend, tracking, provenance, progress."""
