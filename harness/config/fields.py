"""The building blocks of every config section: the strict base model, the documented field,
and the bounds shared by several sections.

Each field of a section declares its default, its documentation and its bounds in one `F(...)`
call, the one declaration of each (`harness config-docs` prints them).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# Seeds go to Python, numpy and torch and, as PYTHONHASHSEED, to child processes, which accept
# 0 .. 2**32 - 1 (numpy's legacy seeding has the same range; torch accepts more).
SEED_MIN, SEED_MAX = 0, 2**32 - 1

# Upper bounds of sizes: far above any run this harness is meant for; they catch typos (a few
# zeros too many) that would otherwise exhaust memory or time before the first update.
MAX_WIDTH = 65_536  # model widths, vocabulary
MAX_BATCH = 65_536  # episodes or rows in one batch
MAX_COUNT = 10_000_000  # updates, tasks, demonstrations, episodes
MAX_TURNS = 1_024  # turns of one episode
MAX_TOKENS = 1_048_576  # tokens of one sequence


class Strict(BaseModel):
    """Unknown keys are errors; every float must be finite (inf and nan are rejected)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def seed_field(default: int, doc: str) -> Any:
    return F(default, doc, ge=SEED_MIN, le=SEED_MAX)


def F(default: Any, doc: str, **kw: Any) -> Any:
    """A field with its documentation (shown by `harness config-docs`)."""
    return Field(default, description=doc, **kw)
