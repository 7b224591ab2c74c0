"""Results folders -> DataFrames, statistics across seeds, paper tables, figures and reports.

Never imports the trainer or torch: everything here reads only what `harness sweep` wrote.
pandas is imported on first use of these names, so `analysis.integrity` (standard library and
PyYAML only) loads without it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AnalysisError", "load_curves", "load_results"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from analysis import load

        return getattr(load, name)
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")
