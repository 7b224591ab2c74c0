"""Results folders -> DataFrames, statistics across seeds, paper tables, figures and reports.

Never imports the trainer or torch: everything here reads only what `harness sweep` wrote.
"""

from analysis.load import AnalysisError, load_curves, load_results

__all__ = ["AnalysisError", "load_curves", "load_results"]
