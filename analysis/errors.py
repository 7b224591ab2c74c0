"""The one error analysis raises for bad input (a path, what is wrong with it), for the CLI to print."""

from __future__ import annotations


class AnalysisError(ValueError):
    """The path is not a results folder, or a requested metric does not exist (one paragraph)."""
