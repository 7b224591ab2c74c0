"""The transfer table of a results page: a contrast measured with the tiny model beside the same
contrast measured with a real pretrained model (issue 38), and whether the two verdicts agree.

The rows are written by hand in `<notes>/_transfer.yaml`:

    model: SmolLM2-135M-Instruct          # how the second column names the real model
    rows:
      - contrast: no clipping vs PPO token clipping
        tiny: {sweep: clipping, cell: no-clip}
        real: {sweep: smollm2_transfer_frozenlake, cell: no-clip}

A side is a cell of a sweep's lead table, as the findings table names it (its label); its Δ, interval
and verdict are that table's (analysis.findings: Holm across the sweep's own contrasts, the sweep's
equivalence margin). A side may be left out (`tiny: null`) where the tiny model has no such contrast.

The relation of the two verdicts:
- agree: the same verdict (both worse, both equivalent, ...);
- reverse: opposite directions (better / worse, higher / lower);
- differ: both determined but different otherwise (equivalent on one model, worse on the other);
- undetermined: either side undetermined or degenerate;
- a dash where a side has no verdict yet (the sweep not run, or its table kept from a page that
  predates the verdict rule), with the reason in that side's cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from analysis.findings import ci_text
from analysis.intervals import DIRECTIONS
from analysis.load import AnalysisError

TRANSFER = "_transfer.yaml"
TITLE = "Transfer to a pretrained model"
SIDES = ("tiny", "real")
OPPOSITE = {frozenset(("better", "worse")), frozenset(("higher", "lower"))}
DETERMINED = {*DIRECTIONS, "equivalent"}


@dataclass(frozen=True)
class Side:
    sweep: str
    cell: str


@dataclass(frozen=True)
class Row:
    contrast: str
    tiny: Side | None
    real: Side | None


@dataclass(frozen=True)
class Spec:
    model: str
    rows: tuple[Row, ...]


def _side(path: Path, i: int, key: str, raw) -> Side | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"sweep", "cell"} or not all(isinstance(v, str) for v in raw.values()):
        raise AnalysisError(
            f"{path}: rows[{i}].{key} = {raw!r}: expected {{sweep: <sweep name>, cell: <label in its table>}} or null."
        )
    return Side(raw["sweep"], raw["cell"])


def spec(notes_dir: Path) -> Spec | None:
    """The transfer rows of `<notes>/_transfer.yaml`, or None when there is no such file; a malformed
    file is one AnalysisError naming the file, the key and what is allowed."""
    path = notes_dir / TRANSFER
    if not path.is_file():
        return None
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise AnalysisError(f"{path}: not valid YAML ({e}).") from None
    if not isinstance(raw, dict) or set(raw) - {"model", "rows"} or not isinstance(raw.get("rows"), list):
        keys = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise AnalysisError(f"{path}: expected the keys model (text) and rows (a list); found {keys}.")
    model = raw.get("model", "the real model")
    if not isinstance(model, str):
        raise AnalysisError(f"{path}: model = {model!r}: expected the real model's name (text).")
    rows = []
    for i, r in enumerate(raw["rows"]):
        if not isinstance(r, dict) or set(r) != {"contrast", *SIDES} or not isinstance(r["contrast"], str):
            found = sorted(r) if isinstance(r, dict) else repr(r)
            raise AnalysisError(f"{path}: rows[{i}] = {found}: expected the keys contrast (text), tiny and real.")
        rows.append(Row(" ".join(r["contrast"].split()), *(_side(path, i, k, r[k]) for k in SIDES)))
    return Spec(model, tuple(rows))


def relation(tiny: str | None, real: str | None) -> str:
    """How two verdicts relate (module docstring); None for a side without a verdict."""
    if tiny is None or real is None:
        return "—"
    if tiny not in DETERMINED or real not in DETERMINED:
        return "undetermined"
    if tiny == real:
        return "agree"
    return "reverse" if frozenset((tiny, real)) in OPPOSITE else "differ"


def _cell(side: Side | None, sections: dict) -> tuple[str, str | None]:
    """(what the table shows for one side, its verdict or None)."""
    if side is None:
        return "no such contrast", None
    sec = sections[side.sweep]  # check_sweeps: every side names a sweep file
    if sec.table is None:
        return f"[{side.sweep}](#{side.sweep}): {sec.status or 'no table'}", None
    found = [f for f in sec.table.findings if f["cell"] == side.cell]
    if not found:
        return f"[{side.sweep}](#{side.sweep}): no contrast '{side.cell}' in its table", None
    f = found[0]
    what = "Δ" if f["baseline"] is not None else "gain"
    return f"{what} {ci_text(f['interval'])} {f['verdict']} ([{side.sweep}](#{side.sweep}))", f["verdict"]


def check_sweeps(sp: Spec, path: Path, names: list[str]) -> None:
    """Every side names a sweep file: a misspelt one is one AnalysisError with the names allowed."""
    for i, r in enumerate(sp.rows):
        for key, side in zip(SIDES, (r.tiny, r.real)):
            if side is not None and side.sweep not in names:
                raise AnalysisError(
                    f"{path}: rows[{i}].{key}.sweep = {side.sweep!r} is not a sweep file; allowed: {', '.join(names)}."
                )


def lines(sp: Spec, sections: dict) -> list[str]:
    """The page's transfer section: sections is {sweep name: analysis.results_doc.Section}, holding
    every sweep the rows name (check_sweeps)."""
    head = [
        f"## {TITLE}",
        "",
        f"Each contrast measured with the tiny model beside the same contrast with {sp.model}, each side "
        "with its own sweep's Δ, interval and verdict (Holm across that sweep's contrasts). agree: the same "
        "verdict; reverse: opposite directions; differ: both determined, otherwise different; "
        "undetermined: either side undetermined.",
        "",
        f"| contrast | tiny model | {sp.model} | relation |",
        "| :-- | :-- | :-- | :-- |",
    ]
    body = []
    for r in sp.rows:
        (tiny, tv), (real, rv) = _cell(r.tiny, sections), _cell(r.real, sections)
        body.append("| " + " | ".join(c.replace("|", r"\|") for c in (r.contrast, tiny, real, relation(tv, rv))) + " |")
    return head + body + [""]
