"""How the `harness` command talks to the user on stderr: errors and warnings as one paragraph,
user values printed verbatim (no console markup, no :emoji: codes), and the results folder
checked before anything is written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.console import Console

from harness.config.errors import ConfigError, ConfigWarning
from harness.experiments.redact import mask_credentials

# user values (paths, keys, config values) are printed verbatim: no markup, no :emoji: codes
err = Console(stderr=True, highlight=False, markup=False, emoji=False)


def say_error(message: str) -> None:
    """One error paragraph on stderr, user values printed as written, credentials in URLs masked."""
    err.print(f"error: {mask_credentials(message)}", markup=False, emoji=False, soft_wrap=True)


def check_results_dir(results: Path, option: str) -> None:
    """The results root must be a folder this process can create and write in."""
    if results.exists() and not results.is_dir():
        raise ConfigError(f"{option} {results}: is a file, not a folder; give a folder for the results.")
    try:
        results.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{option} {results}: cannot create this folder ({e.strerror or e}).") from None
    if not os.access(results, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {results}: this folder is not writable.")


def config_warning_printer(fallback: Any) -> Any:
    """A `warnings.showwarning` that prints each ConfigWarning once (by its once_key) as one
    paragraph on stderr and leaves other warnings to `fallback`."""
    seen: set = set()

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if not issubclass(category, ConfigWarning):
            fallback(message, category, filename, lineno, file, line)
            return
        key = getattr(message, "once_key", str(message))
        if key not in seen:
            seen.add(key)
            err.print(f"warning: {message}", markup=False, emoji=False, soft_wrap=True)

    return show
