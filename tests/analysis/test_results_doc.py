"""`harness results-doc`: docs/results.md regenerated from a results root, hand-written notes kept."""

import re

import typer
from synthetic_tasks import make_task_sweep
from typer.testing import CliRunner

from harness.cli.analysis import register


def cli(*args):
    app = typer.Typer()
    register(app)
    return CliRunner().invoke(app, [str(a) for a in args])


def test_results_doc_covers_every_shipped_sweep_and_keeps_the_notes(tmp_path):
    root, sweeps, docs = tmp_path / "results", tmp_path / "sweeps", tmp_path / "docs"
    make_task_sweep(root / "filters")
    sweeps.mkdir()
    (sweeps / "filters.yaml").write_text("name: filters\ndescription: DAPO refills against no filter.\n")
    (sweeps / "unrun.yaml").write_text("name: unrun\ngrid: {algo.lr: [1.0e-5]}\n")
    (sweeps / "study.yaml").write_text("name: study\nspace: {algo.lr: {type: float, low: 1.0e-5, high: 1.0e-3}}\n")
    (docs / "results_notes").mkdir(parents=True)
    notes = "DAPO's dynamic sampling (Yu et al. 2025) wins per update but not per episode here.\n\n| a | b |"
    (docs / "results_notes" / "filters.md").write_text(notes + "\n")
    (docs / "results_notes" / "_intro.md").write_text("All runs on 2 CPU cores.\n")
    (docs / "results_notes" / "_limits.md").write_text("Actions of 1-2 tokens.\n")
    out = docs / "results.md"
    r = cli("results-doc", root, "--out", out, "--sweeps", sweeps)
    assert r.exit_code == 0, r.output
    text = out.read_text()
    filters = text.split("\n## filters")[1].split("\n## study")[0]
    assert "- Command: `harness sweep sweeps/filters.yaml`" in filters and "- Seeds: 0, 1, 2" in filters
    assert "- Code version: 89abcde" in filters and "9 of 9 points finished (9 done)" in filters
    head = "| filter.name | seeds | start | final | gain | Δ vs baseline | verdict | Δ @ equal episodes |"
    assert head in filters and "Minimum detectable effect (80% power" in filters
    assert filters.split("### Notes")[1].strip() == notes  # verbatim
    links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", filters)
    assert links == [
        "figures/filters/evaluation.png",
        "figures/filters/training.png",
        "figures/filters/diagnostics.png",
    ]
    assert all((docs / link).stat().st_size > 10_000 for link in links)
    assert "All runs on 2 CPU cores." in text.split("\n## filters")[0]
    assert "Not run yet: `harness sweep sweeps/unrun.yaml`" in text
    assert "write `" in text.split("## unrun")[1]  # a placeholder where no notes exist yet
    assert "An Optuna study, not run yet: `harness tune" in text.split("## study")[1]
    assert str(tmp_path) not in text  # no path of the machine that built the page
    pngs = {p: p.read_bytes() for p in (docs / "figures").rglob("*.png")}
    assert cli("results-doc", root, "--out", out, "--sweeps", sweeps).exit_code == 0
    assert out.read_text() == text and all(p.read_bytes() == b for p, b in pngs.items())  # reproducible


def test_results_doc_bad_root_is_one_paragraph_exit_2(tmp_path):
    r = cli("results-doc", tmp_path / "nope", "--out", tmp_path / "r.md", "--sweeps", tmp_path)
    assert r.exit_code == 2 and "is not a results root" in r.output and "Traceback" not in r.output


def test_probe_sweeps_lead_with_true_success_and_tabulate_the_sweep_files_tables(tmp_path):
    """A reward-hacking probe's rows carry true_success and exploit_rate per episode: the table pairs
    them by task like success, and the sweep file's `tables:` become more tables under the lead one."""
    import json

    root, sweeps, docs = tmp_path / "results", tmp_path / "sweeps", tmp_path / "docs"
    make_task_sweep(root / "filters")
    for f in (root / "filters").glob("*/eval_tasks.jsonl"):
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        for r in rows:  # the truth: success on even tasks only; the exploit: success on odd ones
            r["true_success"] = r["success"] * (r["task"] % 2 == 0)
            r["exploit_rate"] = r["success"] * (r["task"] % 2 == 1)
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary = json.loads((f.parent / "summary.json").read_text())  # what the run's summary records
        for when in ("init", "final"):
            for name in ("true_success", "exploit_rate"):
                summary["metrics"][f"{when}/eval_greedy/{name}"] = 0.0  # (the table reads the task rows)
        (f.parent / "summary.json").write_text(json.dumps(summary))
    manifest = json.loads((root / "filters" / "sweep.json").read_text())
    manifest["metric"] = "final/eval_greedy/true_success"
    manifest["tables"] = ["final/eval_greedy/exploit_rate"]
    (root / "filters" / "sweep.json").write_text(json.dumps(manifest))
    sweeps.mkdir()
    (sweeps / "filters.yaml").write_text("name: filters\n")
    out = docs / "results.md"
    r = cli("results-doc", root, "--out", out, "--sweeps", sweeps)
    assert r.exit_code == 0, r.output
    text = out.read_text().split("## filters")[1]
    lead, more = text.split("`-m final/eval_greedy/exploit_rate`:")
    assert "true success rate" in lead and "exploit rate" in more.split("### Notes")[0]

    # none: tasks 0..2+u/2 (seed 2 one more) solved in greedy decoding; even tasks are true successes.
    # Start (u = 0): tasks 0, 1 (and 2 on seed 2) -> true 1 + 1 + 2 of 24 = 0.17, exploit 3/24 = 0.12.
    def start(table: str) -> str:  # the baseline row's start column, without its ± spread
        row = next(line for line in table.splitlines() if line.startswith("| none"))
        return row.split("|")[3].split("±")[0].strip()

    assert start(lead) == "0.17" and start(more) in ("0.12", "0.13")  # 3/24 = 0.125


def test_results_doc_prints_a_studys_trials(tmp_path):
    """A study that has run: its section is what `harness tune FILE --show` prints (a real Optuna
    storage with two finished trials), the same text on every regeneration."""
    import optuna
    from optuna.distributions import FloatDistribution

    root, sweeps, docs = tmp_path / "results", tmp_path / "sweeps", tmp_path / "docs"
    sweeps.mkdir()
    space = "space: {algo.lr: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}}"
    (sweeps / "study.yaml").write_text(f"name: study\n{space}\nobjective: {{metric: eval_greedy/success}}\n")
    (root / "study").mkdir(parents=True)
    ostudy = optuna.create_study(
        study_name="study", storage=f"sqlite:///{root / 'study' / 'optuna.db'}", direction="maximize"
    )
    for lr, value in ((1e-4, 0.25), (3e-4, 0.5)):
        ostudy.add_trial(
            optuna.trial.create_trial(
                params={"algo.lr": lr}, distributions={"algo.lr": FloatDistribution(1e-5, 1e-3, log=True)}, value=value
            )
        )
    out = docs / "results.md"
    r = cli("results-doc", root, "--out", out, "--sweeps", sweeps)
    assert r.exit_code == 0, r.output
    section = out.read_text().split("## study")[1]
    assert "`harness tune sweeps/study.yaml --results results --show` prints:" in section
    assert "study study: 2 trials (2 complete)" in section and "best trial 1: eval_greedy/success = 0.5" in section
    assert "algo.lr = 0.0003" in section
    first = out.read_text()
    assert cli("results-doc", root, "--out", out, "--sweeps", sweeps).exit_code == 0 and out.read_text() == first
    # regenerated where the storage is absent (a fresh clone): the printout is kept, marked as such
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert cli("results-doc", elsewhere, "--out", out, "--sweeps", sweeps).exit_code == 0
    kept = out.read_text().split("## study")[1]
    assert "_Kept from the previous version of this page: `elsewhere/study/optuna.db` was not there" in kept
    assert kept.split("prints:", 1)[1] == section.split("prints:", 1)[1]
    assert cli("results-doc", elsewhere, "--out", out, "--sweeps", sweeps).exit_code == 0
    assert out.read_text().split("## study")[1] == kept  # idempotent
    assert cli("results-doc", elsewhere, "--out", out, "--sweeps", sweeps, "--no-keep").exit_code == 0
    assert "An Optuna study, not run yet" in out.read_text()


def test_a_sweep_not_in_the_root_keeps_its_section_and_findings_until_it_is_re_run(tmp_path):
    """Sweeps re-run one at a time: regenerating from a root that lacks a sweep keeps that sweep's
    table, figures and findings rows from the page being replaced (marked as kept); --no-keep drops them."""
    import json
    import shutil

    full, part, sweeps, docs = tmp_path / "full", tmp_path / "part", tmp_path / "sweeps", tmp_path / "docs"
    make_task_sweep(full / "filters")
    shutil.copytree(full / "filters", full / "other")
    manifest = json.loads((full / "other" / "sweep.json").read_text())
    manifest.update(name="other", source="sweeps/other.yaml", command="harness sweep sweeps/other.yaml")
    (full / "other" / "sweep.json").write_text(json.dumps(manifest))
    sweeps.mkdir()
    for name in ("filters", "other", "unrun"):
        (sweeps / f"{name}.yaml").write_text(f"name: {name}\ndescription: The {name} sweep.\n")
    (docs / "results_notes").mkdir(parents=True)
    (docs / "results_notes" / "other.md").write_text("Notes on other.\n")
    out = docs / "results.md"
    assert cli("results-doc", full, "--out", out, "--sweeps", sweeps).exit_code == 0
    before = out.read_text()

    def section(text, name):
        return text.split(f"\n## {name}\n")[1].split("\n## ")[0]

    def rows(text, name):
        return [line for line in text.splitlines() if line.startswith(f"| [{name}](#{name}) |")]

    assert rows(before, "other") and "verdict" in section(before, "other")
    make_task_sweep(part / "filters")  # only filters re-run
    r = cli("results-doc", part, "--out", out, "--sweeps", sweeps)
    assert r.exit_code == 0, r.output
    after = out.read_text()
    kept, was = section(after, "other"), section(before, "other")
    assert kept.startswith("\nThe other sweep.\n\n_Kept from the previous version of this page: `part/other`")
    assert kept.split("- Command: ", 1)[1] == was.split("- Command: ", 1)[1]  # table, figures, notes verbatim
    assert rows(after, "other") == rows(before, "other")  # its verdicts too
    assert section(after, "filters").replace("part/", "full/") == section(before, "filters")
    assert "Not run yet: `harness sweep sweeps/unrun.yaml`" in section(after, "unrun")
    assert cli("results-doc", part, "--out", out, "--sweeps", sweeps).exit_code == 0
    assert out.read_text() == after  # keeping is idempotent: no second marker, nothing lost
    assert cli("results-doc", part, "--out", out, "--sweeps", sweeps, "--no-keep").exit_code == 0
    dropped = out.read_text()
    assert "Not run yet: `harness sweep sweeps/other.yaml`" in section(dropped, "other")
    assert rows(dropped, "other") == ["| [other](#other) | The other sweep | not run yet | — | — | — | — | — |"]


def test_a_replaced_sweep_keeps_its_rows_on_the_page_but_out_of_the_count_and_the_family(tmp_path):
    """docs/results_notes/_superseded.yaml: a sweep re-run as another asking the same question of the
    same arms shows its rows marked 'replaced by', outside the page-wide Holm family; the replacement
    must share base, baseline, metric and points, else one error naming the file and what differs."""
    import json
    import shutil

    root, part, sweeps, docs = tmp_path / "results", tmp_path / "part", tmp_path / "sweeps", tmp_path / "docs"
    make_task_sweep(root / "filters")
    shutil.copytree(root / "filters", root / "again")
    manifest = json.loads((root / "again" / "sweep.json").read_text())
    manifest.update(name="again", source="sweeps/again.yaml", command="harness sweep sweeps/again.yaml")
    (root / "again" / "sweep.json").write_text(json.dumps(manifest))
    sweeps.mkdir()
    body = "points: [{label: none, filter.name: none}, {label: dapo, filter.name: dapo}]\nbaseline: none\n"
    (sweeps / "filters.yaml").write_text("name: filters\ndescription: Fixed seeds.\n" + body)
    (sweeps / "again.yaml").write_text("name: again\ndescription: A seed budget.\n" + body)
    notes = docs / "results_notes"
    notes.mkdir(parents=True)
    out = docs / "results.md"

    def k_of(text):  # the size of the page-wide family
        return int(re.search(r"Holm at family-wise error 0.05 across the (\d+) tests", text)[1])

    def rows(text, name):
        return [line for line in text.splitlines() if line.startswith(f"| [{name}](#{name}) |")]

    assert cli("results-doc", root, "--out", out, "--sweeps", sweeps, "--no-keep").exit_code == 0
    plain = out.read_text()
    (notes / "_superseded.yaml").write_text("filters: again\n")
    r = cli("results-doc", root, "--out", out, "--sweeps", sweeps, "--no-keep")
    assert r.exit_code == 0, r.output
    text = out.read_text()
    n = len(rows(text, "filters"))
    five = lambda lines: [line.split(" | ")[:5] for line in lines]  # noqa: E731
    assert n >= 1 and five(rows(text, "again")) == five(rows(plain, "again"))  # its Holm p shrink with the family
    assert all(line.endswith("| — | — | replaced by [again](#again) |") for line in rows(text, "filters"))
    assert five(rows(text, "filters")) == five(rows(plain, "filters"))  # only the page-level cells change
    assert k_of(text) == k_of(plain) - 2 * n  # each row's difference and equivalence tests leave the family
    assert "The rows of [filters](#filters) are shown as they ran but are not verdicts" in text
    assert "_Replaced by [again](#again)" in text.split("\n## filters\n")[1].split("\n## ")[0]
    shutil.copytree(root / "again", part / "again")  # filters' folder absent: its section and rows are kept
    assert cli("results-doc", part, "--out", out, "--sweeps", sweeps).exit_code == 0
    kept = out.read_text()
    assert rows(kept, "filters") == rows(text, "filters") and k_of(kept) == k_of(text)
    assert kept.count("_Replaced by [again]") == 1  # not stacked on the kept section
    (sweeps / "again.yaml").write_text("name: again\n" + body.replace("baseline: none", "baseline: dapo"))
    r = cli("results-doc", root, "--out", out, "--sweeps", sweeps)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "_superseded.yaml: filters: again: their baseline differs ('none' vs 'dapo')" in " ".join(r.output.split())
    (sweeps / "again.yaml").write_text("name: again\n" + body.replace(", {label: dapo, filter.name: dapo}", ""))
    r = cli("results-doc", root, "--out", out, "--sweeps", sweeps)
    assert r.exit_code == 2 and "point(s) dapo of filters are not points of again" in " ".join(r.output.split())
