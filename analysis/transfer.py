"""The transfer table of a results page: a contrast measured with the tiny model beside the same
contrast measured with a real pretrained model (issue 38), and whether the two verdicts agree.

The rows are written by hand in `<notes>/_transfer.yaml`:

    model: SmolLM2-135M-Instruct          # how the second column names the real model
    rows:
      - contrast: no clipping vs PPO token clipping
        tiny: {sweep: clipping, cell: no-clip}
        real: {sweep: smollm2_transfer_frozenlake, cell: no-clip}
        note: ...                         # optional: printed under the table, e.g. a side run on another machine

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

A relation compares verdicts, not sizes: a contrast can be worse on one model and undetermined on the
other while the two Δs clearly differ. The size column tests that directly: the real model's Δ minus
the tiny model's (gain minus gain for a gain row), with a 95% t interval whose standard error is the
two sides' combined (the experiments are independent: other models, other runs) and whose degrees of
freedom are Welch-Satterthwaite's from the two sides' own (docs/algorithms.md#statistics).
It is not adjusted across rows; the page-wide correction (analysis.family) takes it into its family, and
the last two columns give the relation of the two sides' page-level verdicts and the size test's p-value
under that correction.

A sweep whose results folder is absent keeps its section from the previous page (analysis.results_doc);
its side of a row is then the previous page's cell for it, verbatim, with the verdict read from that
text, so that regenerating the page on a clone without the tiny sweeps' results changes no row. The size
column needs both sides' standard errors, which the page does not hold: it is kept from the previous
page when the other side's cell is unchanged, else a dash that says why.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from analysis.family import Contrast, from_text, p_text, seeds_of
from analysis.findings import Row as FindingsRow
from analysis.findings import ci_text, split_row
from analysis.intervals import DIRECTIONS, Interval, independent_difference
from analysis.load import AnalysisError

TRANSFER = "_transfer.yaml"
TITLE = "Transfer to a pretrained model"
SIDES = ("tiny", "real")
OPPOSITE = {frozenset(("better", "worse")), frozenset(("higher", "lower"))}
DETERMINED = {*DIRECTIONS, "equivalent"}
# a side's cell as _cell writes it: "Δ -0.05 [-0.17, 0.07] undetermined ([clipping](#clipping))"
CELL_VERDICT = re.compile(r"^(?:Δ|gain) \S+ \[[^\]]*\] (\w+) \(\[")
KEPT_SIZE = "— (a side kept from the previous page)"


@dataclass(frozen=True)
class Side:
    sweep: str
    cell: str


@dataclass(frozen=True)
class Row:
    contrast: str
    tiny: Side | None
    real: Side | None
    note: str = ""  # what a reader must know about the row (another machine, ...), printed under the table


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
        keys = set(r) - {"note"} if isinstance(r, dict) else set()
        if keys != {"contrast", *SIDES} or not isinstance(r["contrast"], str) or not isinstance(r.get("note", ""), str):
            found = sorted(r) if isinstance(r, dict) else repr(r)
            raise AnalysisError(
                f"{path}: rows[{i}] = {found}: expected the keys contrast (text), tiny and real, and optionally "
                "note (text)."
            )
        note = " ".join(r.get("note", "").split())
        rows.append(Row(" ".join(r["contrast"].split()), *(_side(path, i, k, r[k]) for k in SIDES), note))
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


@dataclass(frozen=True)
class _Found:
    text: str  # what the table shows for one side
    verdict: str | None = None
    what: str | None = None  # "Δ" or "gain"
    interval: Interval | None = None


def _kept(side: Side | None, sections: dict) -> bool:
    return side is not None and sections[side.sweep].kept


def _cell(side: Side | None, sections: dict, before: str | None = None) -> _Found:
    """One side of a row; `before` is the previous page's cell for a side whose section was kept."""
    if side is None:
        return _Found("no such contrast")
    link = f"([{side.sweep}](#{side.sweep}))"  # a cell of another sweep (the row was edited) is not reused
    if before is not None and _kept(side, sections) and before.endswith(link) and (m := CELL_VERDICT.match(before)):
        return _Found(before, m.group(1))
    sec = sections[side.sweep]  # check_sweeps: every side names a sweep file
    if sec.table is None:
        return _Found(f"[{side.sweep}](#{side.sweep}): {sec.status or 'no table'}")
    found = [f for f in sec.table.findings if f["cell"] == side.cell]
    if not found:
        return _Found(f"[{side.sweep}](#{side.sweep}): no contrast '{side.cell}' in its table")
    f = found[0]
    what = "Δ" if f["baseline"] is not None else "gain"
    text = f"{what} {ci_text(f['interval'])} {f['verdict']} ([{side.sweep}](#{side.sweep}))"
    return _Found(text, f["verdict"], what, f["interval"])


def _difference(tiny: _Found, real: _Found) -> str:
    """The size column: both sides' intervals of the same kind, each with a spread, or a dash."""
    sides = (tiny.interval, real.interval)
    if any(iv is None or iv.n < 2 or iv.degenerate or not math.isfinite(iv.se) for iv in sides):
        return "—"
    if tiny.what != real.what:
        return "— (a Δ beside a gain)"
    return ci_text(independent_difference(real.interval, tiny.interval))


def check_sweeps(sp: Spec, path: Path, names: list[str]) -> None:
    """Every side names a sweep file: a misspelt one is one AnalysisError with the names allowed."""
    for i, r in enumerate(sp.rows):
        for key, side in zip(SIDES, (r.tiny, r.real)):
            if side is not None and side.sweep not in names:
                raise AnalysisError(
                    f"{path}: rows[{i}].{key}.sweep = {side.sweep!r} is not a sweep file; allowed: {', '.join(names)}."
                )


def previous_rows(text: str) -> dict[str, list[str]]:
    """The transfer table of the page being replaced (its text; empty where there is none):
    {contrast: [contrast, tiny, real, relation, size, ...]}."""
    if f"\n## {TITLE}\n" not in text:
        return {}
    section = text.split(f"\n## {TITLE}\n", 1)[1].split("\n## ", 1)[0]
    rows = [split_row(line) for line in section.splitlines() if line.startswith("| ")][2:]  # below head and rule
    return {r[0]: r for r in rows if len(r) >= 5}


@dataclass
class Computed:
    """One row of the transfer table before the page-wide correction: its two sides, the size column
    and the size test (None where there is no size)."""

    row: Row
    tiny: _Found
    real: _Found
    size: str
    contrast: Contrast | None


def _seeds(sides: tuple[Side | None, ...], sections: dict) -> int:
    return min(seeds_of(sections[s.sweep].lines) for s in sides if s is not None)


def _exact(side: Side | None, found: _Found, findings: list[FindingsRow]) -> _Found:
    """A kept side with its exact interval, where its section kept the hidden line of exact intervals."""
    hit = _matches(side, found, findings)
    if found.interval is not None or len(hit) != 1 or hit[0].contrast.approximate:
        return found
    return replace(found, what=found.text.split(" ")[0], interval=hit[0].contrast.interval)


def computed(
    sp: Spec, sections: dict, previous: dict[str, list[str]] | None = None, findings: list[FindingsRow] = ()
) -> list[Computed]:
    """Every row's sides and size: sections is {sweep name: analysis.results_doc.Section}, holding every
    sweep the rows name (check_sweeps); previous is the replaced page's rows (previous_rows); findings
    the page's findings rows (a kept side's exact interval, where its section stored one)."""
    out = []
    for r in sp.rows:
        old = (previous or {}).get(r.contrast)
        tiny, real = (_cell(s, sections, old[i] if old else None) for i, s in ((1, r.tiny), (2, r.real)))
        tiny, real = _exact(r.tiny, tiny, findings), _exact(r.real, real, findings)
        size = _difference(tiny, real)
        iv = independent_difference(real.interval, tiny.interval) if size.startswith(("+", "-")) else None
        approximate = False
        if _kept(r.tiny, sections) or _kept(r.real, sections):
            same = old is not None and (old[1], old[2]) == (tiny.text, real.text)
            size = old[4] if same else KEPT_SIZE
            if iv is None or not same:
                iv, approximate = from_text(size, _seeds((r.tiny, r.real), sections)), True
        contrast = Contrast(iv, "undetermined", None, approximate) if iv is not None else None
        out.append(Computed(r, tiny, real, size, contrast))
    return out


def _matches(side: Side | None, found: _Found, findings: list[FindingsRow]) -> list[FindingsRow]:
    """The findings rows a side is: by cell label, or for a kept side (no label) by its Δ text."""
    if side is None or found.verdict is None:
        return []
    mine = [f for f in findings if f.sweep == side.sweep and f.contrast is not None]
    return [f for f in mine if f.cell == side.cell] or [f for f in mine if found.text.startswith(f.cells[3] + " ")]


def _page_verdict(side: Side | None, found: _Found, findings: list[FindingsRow]) -> str | None:
    """A side's page-level verdict: its findings row's (a kept side's by its Δ text, where every row of
    its sweep with that text has the same page verdict)."""
    if side is None or found.verdict is None:
        return None
    verdicts = {f.contrast.page for f in _matches(side, found, findings)}
    return verdicts.pop() if len(verdicts) == 1 else None


def lines(sp: Spec, rows: list[Computed], findings: list[FindingsRow]) -> list[str]:
    """The page's transfer section, once the page-wide correction has run (analysis.family.correct)."""
    head = [
        f"## {TITLE}",
        "",
        f"Each contrast measured with the tiny model beside the same contrast with {sp.model}, each side "
        "with its own sweep's Δ, interval and verdict (Holm across that sweep's contrasts). agree: the same "
        "verdict; reverse: opposite directions; differ: both determined, otherwise different; "
        "undetermined: either side undetermined. The fifth column compares sizes instead of verdicts: "
        f"{sp.model}'s Δ minus the tiny model's, with a 95% t interval from the two sides' standard errors "
        "(independent experiments; Welch-Satterthwaite degrees of freedom), not adjusted across rows; "
        "where it excludes 0 the contrast's size differs between the two models. The last two columns "
        "correct every contrast of the page together ([Findings](#findings)): the relation of the two "
        "sides' page-level verdicts, and the size test's Holm-adjusted p-value across the page "
        "(≈: read from a kept row's rounded interval).",
        "",
        f"| contrast | tiny model | {sp.model} | relation | {sp.model} − tiny | relation, page | "
        "Holm p, page: sizes differ |",
        "| :-- | :-- | :-- | :-- | :-- | :-- | --: |",
    ]
    body = []
    for c in rows:
        tiny, real = (_page_verdict(s, f, findings) for s, f in ((c.row.tiny, c.tiny), (c.row.real, c.real)))
        p = p_text(c.contrast.adj_diff, c.contrast.approximate) if c.contrast else "—"
        cells = (c.row.contrast, c.tiny.text, c.real.text, relation(c.tiny.verdict, c.real.verdict), c.size)
        cells += (relation(tiny, real), p)
        body.append("| " + " | ".join(x.replace("|", r"\|") for x in cells) + " |")
    notes = [f"- {c.row.contrast}: {c.row.note}" for c in rows if c.row.note]
    return head + body + ([""] + notes if notes else []) + [""]
