"""The `harness` command: sweep, run, axes, envs, config-docs (and the groups registered at the end).

Bad input (a config or sweep file, an axis value, an option) is one paragraph on stderr and
exit status 2, never a traceback; a missing component is one line and status 1.
"""

from __future__ import annotations

import json
import signal
import sys
import typing
import warnings
from pathlib import Path
from typing import Any

import typer

from harness import __version__
from harness.cli.console import check_results_dir, config_warning_printer, say_error
from harness.config.errors import ConfigError, ConfigWarning, UnavailableError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Ablation harness for multi-turn agentic RL of language models.\n\n"
    "Declare a base config and the axes to vary in a sweep file, run it, resume it, "
    "and trace every number back to its config, code version and packages.",
)


def _fail(message: str, code: int) -> typing.NoReturn:
    say_error(message)
    raise typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        print(f"harness {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Ablation harness for multi-turn agentic RL of language models."""


def _sigterm_as_interrupt() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


# ----------------------------------------------------------------------------- sweep / run
def preflight(sweep: Any) -> None:
    """What the trainer can check before any point starts (model.name exists; ConfigError)."""
    from harness.experiments.checks import check_before_run

    check_before_run(sweep)


def _print_points(sweep: Any, results: Path, reuse: bool = True) -> None:
    from harness.experiments.point import RunOptions, find_donor, point_dir, point_state

    points = sweep.points
    if sweep.budget is not None:  # the looks decided so far and the points up to the next one
        from harness.experiments.sequential import plan_lines

        lines, points = plan_lines(sweep, results)
        print("\n".join(lines))
        print(f"  {len(points)} points in the looks taken and the next; axes: {', '.join(sweep.axes)}")
    else:
        print(
            f"sweep {sweep.name}: {len(points)} points ({len(points) // len(sweep.seeds)} variants x "
            f"{len(sweep.seeds)} seeds); axes: {', '.join(sweep.axes)}; baseline: {sweep.baseline}"
        )
    if sweep.description:
        print("  " + " ".join(sweep.description.split()))
    for p in points:
        status = point_state(point_dir(results, sweep.name, p)) or "new"
        if status == "new" and reuse and find_donor(p, sweep.name, RunOptions(results=results)):
            status = "copy"  # an identical finished run in another sweep folder (RunOptions.reuse)
        mark = "*" if p.is_baseline else " "
        overrides = " ".join(f"{k}={json.dumps(v)}" for k, v in p.overrides.items()) or "(base config)"
        print(f"{mark} {p.id}  [{status}]  {overrides}")
    print("(* = baseline; [copy] = an identical finished run in another sweep folder is copied, not trained)")


EXTRA_COUNTS = {
    "elsewhere": "finished by another process",
    "busy": "busy (held by another process)",
    "corrupt": "corrupt (damaged files; --retry-failed runs them again)",
    "reused": "of the done copied from identical finished runs in other sweep folders (--no-reuse trains them)",
    "blocked": "look(s) of the seed budget blocked (see below)",
    "capped": "not started (the --max-minutes cap had passed)",
}


def _run(
    sweep: Any,
    results: Path,
    workers: int,
    retry_failed: bool,
    no_mlflow: bool,
    executor: Any = None,
    reuse: bool = True,
    max_minutes: float | None = None,
) -> None:
    from harness.experiments.progress import SweepProgress
    from harness.experiments.runner import RunOptions, run_sweep
    from harness.experiments.tracking import default_tracking_uri

    opts = RunOptions(
        results=results,
        mlflow_uri=None if no_mlflow else default_tracking_uri(results),
        retry_failed=retry_failed,
        workers=workers,
        executor=executor,
        reuse=reuse,
        max_minutes=max_minutes,
    )
    _sigterm_as_interrupt()
    result = run_sweep(sweep, opts, SweepProgress())
    c = result.counts
    extra = [f"{c[k]} {text}" for k, text in EXTRA_COUNTS.items() if c.get(k)]
    print(
        f"sweep {sweep.name}: {c['done']} done, {c['diverged']} diverged, {c['failed']} failed, "
        f"{c['skipped']} skipped (finished before){''.join(', ' + e for e in extra)}; "
        f"results in {results / sweep.name}"
    )
    for pid, error in result.errors.items():
        print(f"  {pid}: {error.splitlines()[0] if error else ''}  (see {results / sweep.name / pid})")
    if result.interrupted:
        print("interrupted: run the same command again to resume")
        raise typer.Exit(130)
    if c.get("capped"):
        print(
            f"time cap of {max_minutes:g} minutes reached: {c['capped']} point(s) not started; run the same "
            f"command again to resume (`harness table {results / sweep.name}` shows what is decided so far)"
        )
    if not result.ok:
        raise typer.Exit(1)


def _check_transfer(backend: str, transfer: str | None, max_point_mb: float | None) -> None:
    """--transfer and --max-point-mb: their values, and that they go with --backend ray."""
    from harness.experiments.ray_backend import TRANSFERS  # imports no ray

    if transfer is not None and transfer not in TRANSFERS:
        _fail(f"--transfer {transfer!r} is not a transfer mode; choose one of: {', '.join(TRANSFERS)}", 2)
    if backend == "local" and (transfer is not None or max_point_mb is not None):
        _fail("--transfer and --max-point-mb apply to --backend ray", 2)
    if transfer == "shared-fs" and max_point_mb is not None:
        _fail("--max-point-mb applies to --transfer objects (shared-fs ships no files)", 2)


@app.command()
def sweep(
    file: Path = typer.Argument(..., help="Sweep YAML file (see sweeps/)."),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the points (id, overrides, status) and exit; with a seed budget, the looks decided so far "
        "and which variants the next look gives seeds.",
    ),
    workers: int = typer.Option(1, "--workers", "-w", min=1, help="Points run in parallel, each in its own process."),
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="Run failed and corrupt points again (default: skip them; see `harness check`)."
    ),
    no_mlflow: bool = typer.Option(
        False, "--no-mlflow", help="Do not log to MLflow (metrics.jsonl is always written)."
    ),
    results: Path = typer.Option(
        Path("results"), "--results", help="Results root: points go to RESULTS/<sweep>/<point>/."
    ),
    backend: str = typer.Option(
        "local", "--backend", help="local (process pool) or ray (points as Ray tasks; pip install -e '.[dist]')."
    ),
    address: str | None = typer.Option(
        None,
        "--address",
        help="--backend ray: the cluster to join (default: a local Ray instance on 127.0.0.1, --workers CPUs).",
    ),
    retries: int = typer.Option(0, "--retries", min=0, help="--backend ray: run a failed point again up to N times."),
    insecure: bool = typer.Option(
        False,
        "--insecure",
        help="--address: join a Ray cluster without token authentication (anyone who can reach it can run code).",
    ),
    transfer: str | None = typer.Option(
        None,
        "--transfer",
        help="--backend ray: how a point's files reach RESULTS: objects (default; each task runs its point in a "
        "folder of its node and ships the files and checkpoints to this driver through Ray's object store, no "
        "shared filesystem needed) or shared-fs (tasks write RESULTS directly; every node must see it at the same "
        "path, checked at the start).",
    ),
    max_point_mb: float | None = typer.Option(
        None,
        "--max-point-mb",
        min=1.0,
        help="--transfer objects: the largest point folder (MiB) shipped through the object store (default 1024); "
        "a point over it fails with a message.",
    ),
    override: list[str] = typer.Option(
        [],
        "--override",
        "-o",
        metavar="KEY=VALUE",
        help="Set a dotted key in the base config of every point, e.g. -o "
        "train.updates=1 for a smoke run (changes the point ids).",
    ),
    seeds: str | None = typer.Option(None, "--seeds", metavar="0,1,...", help="Run these seeds instead of the file's."),
    no_reuse: bool = typer.Option(
        False,
        "--no-reuse",
        help="Train every point, even one whose identical run (same config, seed, code, packages and CPU) "
        "finished in another sweep folder under --results (default: copy it; CPU runs repeat bit for bit).",
    ),
    max_minutes: float | None = typer.Option(
        None,
        "--max-minutes",
        min=0.0,
        help="A time cap: after this many minutes no new point (and, with a seed budget, no new look) starts; "
        "points in flight finish, and the same command later resumes. With --backend ray it acts between looks.",
    ),
) -> None:
    """Run (or resume) every point of a sweep file.

    Finished points are skipped, interrupted ones resume from their checkpoint, failed ones are
    retried only with --retry-failed. MLflow logs to sqlite:///RESULTS/mlflow.db unless
    MLFLOW_TRACKING_URI is set.
    """
    from harness.experiments.sweep import load_sweep

    if backend not in ("local", "ray"):
        _fail(f"--backend {backend!r} is not a backend; choose one of: local, ray", 2)
    seed_list = None
    if seeds is not None:
        try:
            seed_list = [int(x) for x in seeds.split(",") if x.strip()]
        except ValueError:
            _fail(f"--seeds {seeds!r} is not a comma-separated list of integers (e.g. --seeds 0,1)", 2)
    swp = load_sweep(file, list(override), seed_list)
    preflight(swp)
    if dry_run:
        _print_points(swp, results, not no_reuse)
        return
    if backend == "local" and (address or retries):
        _fail("--address and --retries apply to --backend ray", 2)
    if insecure and not address:
        _fail("--insecure applies to --backend ray --address ADDR (joining a cluster)", 2)
    _check_transfer(backend, transfer, max_point_mb)
    executor = None
    if backend == "ray":  # its checks (token, ray installed) run before anything is written
        from harness.experiments.ray_backend import RayExecutor

        executor = RayExecutor(address, retries, insecure, transfer, max_point_mb)
    check_results_dir(results, "--results")
    _run(swp, results, workers, retry_failed, no_mlflow, executor, reuse=not no_reuse, max_minutes=max_minutes)


@app.command()
def run(
    config: Path = typer.Argument(..., help="Run config YAML file (see configs/)."),
    override: list[str] = typer.Option(
        [],
        "--override",
        "-o",
        metavar="KEY=VALUE",
        help="Set a dotted config key, e.g. -o algo.clip.level=sequence (repeatable).",
    ),
    results: Path = typer.Option(
        Path("results"), "--results", "--out", help="Results root: the run goes to RESULTS/<name>/<point id>/."
    ),
    name: str | None = typer.Option(
        None, "--name", help="Results folder and MLflow experiment (default: config file name)."
    ),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not log to MLflow."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate, print the resolved config and exit."),
    no_reuse: bool = typer.Option(
        False, "--no-reuse", help="Train even when an identical finished run sits in another folder under --results."
    ),
) -> None:
    """Run one config (with overrides) as a one-point sweep; resumes it if interrupted.

    Every key and its default: `harness config-docs`.
    """
    from harness.config.loading import dump_config
    from harness.experiments.sweep import single_point

    swp = single_point(config, list(override), name)
    preflight(swp)
    if dry_run:
        print(f"# point {swp.points[0].id}")
        print(dump_config(swp.points[0].config), end="")
        return
    check_results_dir(results, "--results/--out")
    _run(swp, results, 1, True, no_mlflow, reuse=not no_reuse)


# ----------------------------------------------------------------------------- documentation
def _first_line(text: str) -> str:
    return " ".join((text or "").split())


GENERATED_BEGIN = "<!-- BEGIN GENERATED: harness axes --markdown -->"
GENERATED_END = "<!-- END GENERATED -->"


def axes_markdown() -> str:
    """The registered values of every axis as markdown tables (the generated block of
    docs/algorithms.md), followed by what each preset sets."""
    from algorithms import AXES, PRESETS
    from harness.transcript.context import CONTEXT_POLICIES

    cell = lambda text: _first_line(text).replace("|", "\\|")  # noqa: E731
    lines = []
    for key, registry in {**AXES, "context.policy": CONTEXT_POLICIES}.items():
        lines += [
            f"### `{key}`: {cell(registry.doc)}",
            "",
            "| value | what it computes | source |",
            "| --- | --- | --- |",
        ]
        lines += [f"| `{e.name}` | {cell(e.doc)} | {cell(e.source)} |" for e in registry] + [""]
    keys = sorted({k for preset in PRESETS.values() for k in preset})
    lines += [
        "### `algo.preset`: keys each preset fills (when not set)",
        "",
        "| key | " + " | ".join(f"`{p}`" for p in PRESETS) + " |",
        "| --- |" + " --- |" * len(PRESETS),
    ]
    lines += [f"| `algo.{k}` | " + " | ".join(f"`{PRESETS[p].get(k, '-')}`" for p in PRESETS) + " |" for k in keys]
    lines += ["", "### Config choices: the other choice-valued settings `harness axes` lists", ""]
    lines += ["| key | values | default | what it does |", "| --- | --- | --- | --- |"]
    bar = " \\| "  # a | inside a table cell
    lines += [
        f"| `{key}` | {bar.join(f'`{c}`' for c in choices)} | `{default}` | {cell(doc)} |"
        for key, choices, default, doc in config_choices()
    ]
    return "\n".join(lines)


def config_choices() -> list[tuple[str, tuple, object, str]]:
    """(key, values, default, doc) of every choice-valued config setting that is not a registry axis:
    what `harness axes` prints under "Config choices" and the generated list in docs/algorithms.md."""
    from harness.config.keys import iter_config_fields, literal_choices
    from harness.config.loading import axis_registries

    registries = axis_registries()
    out = []
    for key, info in iter_config_fields():
        choices = literal_choices(info.annotation)
        if choices and key not in registries:
            out.append((key, tuple(choices), info.default, info.description or ""))
    return out


def write_generated_block(path: Path, text: str) -> None:
    """Replace the text between the GENERATED markers of `path` with `text`."""
    try:
        doc = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--write-doc {path}: cannot read it ({getattr(e, 'strerror', None) or e}).") from None
    if GENERATED_BEGIN not in doc or GENERATED_END not in doc:
        raise ConfigError(f"{path}: no {GENERATED_BEGIN} ... {GENERATED_END} block to regenerate")
    head, rest = doc.split(GENERATED_BEGIN, 1)
    tail = rest.split(GENERATED_END, 1)[1]
    path.write_text(f"{head}{GENERATED_BEGIN}\n{text}\n{GENERATED_END}{tail}")


def _print_presets() -> None:
    """What each `algo.preset` sets: the keys it fills when a config leaves them unset."""
    from algorithms import PRESETS

    print("algo.preset  (sets these algo.<key> values where the config leaves them unset; custom sets none)")
    width = max(len(p) for p in PRESETS)
    show = lambda v: v if isinstance(v, str) else json.dumps(v)  # noqa: E731
    for name, keys in PRESETS.items():
        print(f"  {name:<{width}}  " + ", ".join(f"{k}={show(v)}" for k, v in keys.items()))
    print()


@app.command()
def axes(
    markdown: bool = typer.Option(
        False, "--markdown", help="Print the registered values as the markdown tables of docs/algorithms.md."
    ),
    write_doc: Path | None = typer.Option(
        None,
        "--write-doc",
        metavar="FILE",
        help="Regenerate the generated block of FILE (docs/algorithms.md) in place.",
    ),
) -> None:
    """Every ablation axis with its values, one-line docs and sources.

    Generated from the registries of algorithms.AXES, followed by the choice-valued settings of
    the config schema (context.policy, algo.kl.where, ...)."""
    from harness.config.loading import axis_registries

    if write_doc is not None:
        write_generated_block(write_doc, axes_markdown())
        print(f"wrote the registered values into {write_doc}")
        return
    if markdown:
        print(axes_markdown())
        return
    registries = axis_registries()
    for key, registry in registries.items():
        print(f"{key}  ({_first_line(registry.doc)})")
        width = max((len(e.name) for e in registry), default=0)
        for entry in registry:
            source = f"  [{_first_line(entry.source)}]" if entry.source else ""
            print(f"  {entry.name:<{width}}  {_first_line(entry.doc)}{source}")
        print()
    _print_presets()
    print("Config choices (set in YAML; from the schema):")
    for key, choices, default, doc in config_choices():
        print(f"  {key}: {' | '.join(map(str, choices))}  (default {default})  {_first_line(doc)}")
    print("\nFormulas, defaults and sources of every value: docs/algorithms.md")


@app.command()
def envs() -> None:
    """The reference environments: name, doc, source and options."""
    from envs import describe

    rows = describe()
    for row in rows:
        print(f"{row.get('name')}  {_first_line(str(row.get('doc', '')))}")
        if row.get("source"):
            print(f"  source: {_first_line(str(row['source']))}")
        for opt in row.get("options") or []:
            if isinstance(opt, dict):
                print(
                    f"  options.{opt.get('name')}: {opt.get('type', '')} = {opt.get('default')!r}  "
                    f"{_first_line(str(opt.get('description', '')))}"
                )
        for key, value in row.items():
            if key not in ("name", "doc", "source", "options") and value not in (None, "", [], {}):
                print(f"  {key}: {value}")
        print()


@app.command("config-docs")
def config_docs() -> None:
    """Every config key with its type, default and documentation."""
    from harness.config.keys import iter_config_fields

    section = None
    for key, info in iter_config_fields():
        top = key.split(".")[0]
        if top != section:
            section = top
            print(f"\n[{section}]")
        ann = info.annotation
        type_name = ann.__name__ if isinstance(ann, type) else str(ann).replace("typing.", "")
        default = info.get_default(call_default_factory=True)
        print(f"  {key}: {type_name} = {json.dumps(default, default=str)}")
        if info.description:
            print(f"      {_first_line(info.description)}")


# the command groups that live in their own modules (imported after `app` exists)
from harness.cli import analysis as _analysis  # noqa: E402
from harness.cli import bench as _bench  # noqa: E402
from harness.cli import eval as _eval  # noqa: E402
from harness.cli import models as _models  # noqa: E402
from harness.cli import tune as _tune  # noqa: E402

for _group in (_analysis, _eval, _tune, _bench, _models):
    _group.register(app)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: known errors become messages and exit codes; config warnings
    are printed once each as `warning: ...`."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", ConfigWarning)
        warnings.showwarning = config_warning_printer(warnings.showwarning)
        try:
            app(args=argv, prog_name="harness")
        except ConfigError as e:
            say_error(str(e))
            sys.exit(2)
        except UnavailableError as e:
            say_error(str(e))
            sys.exit(1)
