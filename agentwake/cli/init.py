"""``agentwake init [DIR]``: a new project from the packaged defaults, ready to check and run.

It writes ``agentwake.toml`` (the demo help desk, the offline model, the store in DIR),
``policies/`` and ``prompts/`` (copies of the packaged ones, to edit). Every file is checked
before any is written, so a refusal (a file exists and ``--force`` was not given) leaves DIR
exactly as it was.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Final

import typer

from agentwake.cli.common import app, fail

# The packaged defaults (pyproject's package-data), next to this package: the project
# template (config and the demo triage policies) and the prompts every config falls back to.
DEFAULTS: Final = Path(__file__).resolve().parent.parent / "defaults"
PROJECT: Final = DEFAULTS / "project"
CONFIG_NAME: Final = "agentwake.toml"
SOURCES: Final = (("policies", PROJECT / "policies"), ("prompts", DEFAULTS / "prompts"))


def planned_files() -> list[tuple[Path, Path]]:
    """(packaged source, path relative to DIR) for every file init writes, in the order it writes them."""
    files = [(PROJECT / CONFIG_NAME, Path(CONFIG_NAME))]
    for folder, source_dir in SOURCES:
        files.extend(
            (source, Path(folder) / source.name)
            for source in sorted(source_dir.iterdir())
            if source.is_file()
        )
    return files


def _shown(path: Path) -> str:
    """A path as typed in a shell: relative to the current folder when it is under it."""
    try:
        text = str(path.relative_to(Path.cwd()))
    except ValueError:
        text = str(path)
    return shlex.quote(text)


@app.command()
def init(
    directory: Annotated[
        Path,
        typer.Argument(
            metavar="DIR", help="Folder to start the project in; created if missing.", show_default=True
        ),
    ] = Path("."),
    force: Annotated[
        bool, typer.Option("--force", "-f", help="Overwrite the files init writes that already exist.")
    ] = False,
) -> None:
    """Start a new project in DIR: a commented agentwake.toml, policies/ and prompts/.

    The config runs as written, offline: the demo help desk (agentwake-demo) over
    stdio, the "agentwake/offline" stand-in model and the store in DIR. The policies
    and prompts are copies of agentwake's packaged defaults, for you to edit. An
    existing file is never overwritten without --force; then nothing is written.
    """
    target = directory.expanduser().resolve()
    if target.exists() and not target.is_dir():
        raise fail(f"{directory} exists and is not a folder")
    files = planned_files()
    missing = [str(source) for source, _ in files if not source.is_file()]
    if missing:
        raise fail(f"agentwake's packaged defaults are missing (a broken install?): {', '.join(missing)}")
    existing = [relative for _, relative in files if (target / relative).exists()]
    blocked = [relative for relative in existing if not (target / relative).is_file()]
    if blocked:
        raise fail(f"not a file, cannot write it: {', '.join(str(target / p) for p in blocked)}")
    if existing and not force:
        names = ", ".join(str(p) for p in existing)
        raise fail(f"{target} already has {names}; nothing was written (pass --force to overwrite)")
    for source, relative in files:
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes(source.read_bytes())
    overwritten = set(existing)
    typer.echo(f"Wrote a new agentwake project in {target}:")
    for _, relative in files:
        typer.echo(f"  {relative}{'  (overwritten)' if relative in overwritten else ''}")
    config = _shown(target / CONFIG_NAME)
    option = "" if target == Path.cwd().resolve() else f" -c {config}"
    typer.echo("")
    typer.echo("Next:")
    typer.echo(f"  agentwake check{option}    # validate it, start the demo server, show each subscription")
    typer.echo(f"  agentwake run{option}      # the service, until Ctrl-C; the offline model needs no key")
    typer.echo(f"  agentwake actions{option}  # what the agent did")
    typer.echo(f"Then edit {config}: your own MCP servers, a real model, policies/ and prompts/.")
