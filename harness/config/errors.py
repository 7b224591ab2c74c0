"""Errors the harness shows to users as one paragraph, never as a traceback."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A bad config or sweep file: the message names the file, the dotted key, the bad value and
    the allowed values. The CLI prints it without a traceback and exits with status 2."""


class Diverged(RuntimeError):
    """Raised by the trainer when a run diverges (NaN loss, KL blow-up, ...).

    The point is recorded with status `diverged` (a result, not a failure: it is not retried).
    `summary` carries the metrics known at that moment and is stored in summary.json.
    """

    def __init__(self, message: str, summary: dict[str, Any] | None = None):
        super().__init__(message)
        self.summary = dict(summary or {})


class UnavailableError(RuntimeError):
    """A component the command needs is not installed or cannot be imported (one-line message)."""
