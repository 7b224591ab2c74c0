"""Benchmarks: speed and memory ratios against baselines measured in the same process."""
