"""Errors the harness shows to users as one paragraph, never as a traceback."""

from __future__ import annotations

import warnings
from typing import Any


class ConfigError(ValueError):
    """A bad config or sweep file: the message names the file, the dotted key, the bad value and
    the allowed values. The CLI prints it without a traceback and exits with status 2."""


class ConfigWarning(UserWarning):
    """A config that loads but probably does not do what its author meant (an explicit key that
    overrides a preset, a sweep without seeds, a turn budget the expert cannot finish in). The
    CLI prints each one once as `warning: ...` on stderr."""

    def __init__(self, message: str, once_key: Any = None):
        super().__init__(message)
        self.once_key = once_key if once_key is not None else message


def warn(message: str, once_key: Any = None) -> None:
    """Issue a ConfigWarning (one paragraph, like a ConfigError message). Warnings with equal
    `once_key` (default: the message) are the same problem seen again, e.g. in every point of a
    sweep; the CLI shows the first only."""
    warnings.warn(ConfigWarning(message, once_key), stacklevel=2)


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
