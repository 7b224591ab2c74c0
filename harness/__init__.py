"""harness: an ablation harness for multi-turn agentic RL of language models."""

import os

# OpenMP threads that wait for work sleep instead of spinning. The shared builds run torch on
# several threads (harness.model.cache.build_threads) while other processes (sweep workers,
# a second sweep) use the same cores; spinning threads then take the cores from them. Measured on
# 2 cores, tiny-model pre-training steps at 2 threads beside a 1-thread run: 0.62 steps/s spinning,
# 1.29 sleeping; two 2-thread builds at once: 0.68 and 1.24 each; alone: 2.38 and 2.31 (-3%).
# Scheduling only: the arithmetic and its results are the same. Set before torch loads OpenMP;
# an explicit OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
