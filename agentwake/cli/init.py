"""``agentwake init [DIR]``: a new project from the packaged defaults, ready to check and run.

It writes ``agentwake.toml`` (the demo help desk, the offline model, the store in DIR),
``policies/`` and ``prompts/`` (copies of the packaged ones, to edit). Every file is checked
before any is written, so a refusal (a file exists and ``--force`` was not given) leaves DIR
exactly as it was.

``--systemd`` also writes ``agentwake.service``: the packaged unit
(``defaults/systemd/agentwake.service``) filled in for DIR. Its store stays where the config puts
it (``agentwake.db`` in DIR, so ``agentwake status`` finds it as before): the unit runs in DIR
(``WorkingDirectory=``) and may write there (``ReadWritePaths=``), and nowhere else but its
``StateDirectory=``; it runs as the user who ran init. On a folder that already has a config,
``--systemd`` writes only the unit, for that config.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Annotated, Final

import typer

from agentwake.cli.common import app, fail, warn

# The packaged defaults (pyproject's package-data), next to this package: the project
# template (config and the demo triage policies) and the prompts every config falls back to.
DEFAULTS: Final = Path(__file__).resolve().parent.parent / "defaults"
PROJECT: Final = DEFAULTS / "project"
CONFIG_NAME: Final = "agentwake.toml"
SOURCES: Final = (("policies", PROJECT / "policies"), ("prompts", DEFAULTS / "prompts"))
UNIT_TEMPLATE: Final = DEFAULTS / "systemd" / "agentwake.service"
# The playgrounds (--example): a config whose bridges run against the packaged fakes
# (agentwake bridge NAME --fake), its own policies beside the packaged ones it names, and the prompts.
EXAMPLES: Final = DEFAULTS / "examples"
EXAMPLE_POLICIES: Final = {
    "github": ("github-triage.toml", "99-default.toml"),
    "slack": ("99-default.toml",),
    "pagerduty": ("99-default.toml",),
    "triage": ("triage.toml", "github-triage.toml", "99-default.toml"),
}
# What each playground's first event is, and a send-test to try next.
EXAMPLE_NEXT: Final = {
    "github": (
        "the fake GitHub sends issues.opened; the agent comments on issue #1",
        "github issue_comment.created",
    ),
    "slack": ("the fake Slack mentions the app; the agent replies in the thread", "slack app_mention"),
    "pagerduty": (
        "the fake PagerDuty triggers a P1 incident; the agent adds a note",
        "pagerduty incident.triggered",
    ),
    "triage": ("each fake sends one event; the agent acts on each", "slack app_mention"),
}
UNIT_NAME: Final = "agentwake.service"
# Beside the config: API keys and the ${VAR}s it uses, read by the unit if present.
ENV_FILE_NAME: Final = "agentwake.env"
# What PrivateTmp=yes replaces with a folder of the service's own.
PRIVATE_TMP: Final = (Path("/tmp"), Path("/var/tmp"))


def planned_files(example: str | None = None) -> list[tuple[Path, Path]]:
    """(packaged source, path relative to DIR) for every file init writes, in the order it writes them."""
    if example is not None:
        return _example_files(example)
    files = [(PROJECT / CONFIG_NAME, Path(CONFIG_NAME))]
    for folder, source_dir in SOURCES:
        files.extend(
            (source, Path(folder) / source.name)
            for source in sorted(source_dir.iterdir())
            if source.is_file()
        )
    return files


def _example_files(example: str) -> list[tuple[Path, Path]]:
    own = EXAMPLES / example
    files = [(own / CONFIG_NAME, Path(CONFIG_NAME))]
    policies = [PROJECT / "policies" / name for name in EXAMPLE_POLICIES[example]]
    if (own / "policies").is_dir():
        policies.extend(path for path in (own / "policies").iterdir() if path.is_file())
    files.extend(
        (source, Path("policies") / source.name) for source in sorted(policies, key=lambda p: p.name)
    )
    prompts = DEFAULTS / "prompts"
    files.extend(
        (source, Path("prompts") / source.name) for source in sorted(prompts.iterdir()) if source.is_file()
    )
    return files


def _shown(path: Path) -> str:
    """A path as typed in a shell: relative to the current folder when it is under it."""
    try:
        text = str(path.relative_to(Path.cwd()))
    except ValueError:
        text = str(path)
    return shlex.quote(text)


# ---- the systemd unit ------------------------------------------------------------------------------


def agentwake_command() -> list[str]:
    """How a unit starts this agentwake: the ``agentwake`` program of this interpreter's environment,
    else the one on PATH, else this Python with ``-m agentwake.cli`` (a checkout, not installed)."""
    from agentwake.commands import script_dirs

    for folder in script_dirs():
        found = shutil.which("agentwake", path=str(folder))
        if found is not None:
            return [str(Path(found).absolute())]
    found = shutil.which("agentwake")
    if found is not None:
        return [str(Path(found).absolute())]
    return [str(Path(sys.executable).absolute()), "-m", "agentwake.cli"]


def _escaped(value: str) -> str:
    """A value systemd reads as written: ``%`` starts a specifier in any setting."""
    return value.replace("%", "%%")


def _word(value: str, *, command: bool = False) -> str:
    """One word of a list setting (ExecStart=, ReadWritePaths=), quoted when it must be; in a
    command line, ``$`` would also start a variable."""
    value = _escaped(value)
    if command:
        value = value.replace("$", "$$")
    if value and not re.search(r"[\s\"'\\]", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _current_user() -> tuple[str, str] | None:
    """(user, group) to run the unit as: whoever runs init, unless root (then the unit says none)."""
    if not hasattr(os, "geteuid") or os.geteuid() == 0:
        return None
    import grp
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name, grp.getgrgid(os.getegid()).gr_name
    except KeyError:  # a uid without a passwd entry (some containers)
        return None


def systemd_unit(
    template: str,
    *,
    command: list[str],
    config: Path,
    directory: Path,
    writable: list[Path],
    user: tuple[str, str] | None,
) -> str:
    """The packaged unit, its settings filled in for the project in ``directory``."""
    values = {
        "ExecStart": " ".join(_word(part, command=True) for part in [*command, "run", "-c", str(config)]),
        "WorkingDirectory": _escaped(str(directory)),
        "EnvironmentFile": "-" + _escaped(str(directory / ENV_FILE_NAME)),
        "ReadWritePaths": " ".join(_word(str(path)) for path in writable),
    }
    if user is not None:
        values["User"], values["Group"] = user

    def filled(match: re.Match[str]) -> str:
        key = match.group("key")
        return f"{key}={values[key]}" if key in values else match.group(0)

    keys = "|".join(values)
    body = re.sub(rf"^#?(?P<key>{keys})=.*$", filled, template[template.index("[Unit]") :], flags=re.M)
    header = (
        f"# agentwake as a systemd service, for the project in {directory}\n"
        "# (written by `agentwake init --systemd`; the packaged original explains each setting).\n"
        f"# Its store is where {CONFIG_NAME} puts it; API keys and ${{VAR}}s may go in {ENV_FILE_NAME}.\n"
        "#\n"
        f"# Install:  sudo cp {shlex.quote(str(directory / UNIT_NAME))} /etc/systemd/system/\n"
        "#           sudo systemctl daemon-reload && sudo systemctl enable --now agentwake\n"
        "# Watch:    systemctl status agentwake; journalctl -u agentwake -f;"
        f" agentwake status -c {shlex.quote(str(config))}\n"
        "\n"
    )
    return header + body


def _unit_for(target: Path) -> bytes:
    from agentwake.configfile import locate_store
    from agentwake.errors import ConfigError

    config = target / CONFIG_NAME
    writable = [target]
    if config.is_file():
        try:
            location = locate_store(config)
            # A PostgreSQL store ([store] url) writes no file here.
            store_folder = target if location.url is not None else location.path.parent.resolve()
        except ConfigError:
            store_folder = target  # `agentwake check` will say what is wrong with it
        if not store_folder.is_relative_to(target):
            writable.append(store_folder)
    text = systemd_unit(
        UNIT_TEMPLATE.read_text(encoding="utf-8"),
        command=agentwake_command(),
        config=config,
        directory=target,
        writable=writable,
        user=_current_user(),
    )
    return text.encode()


# ---- the command -----------------------------------------------------------------------------------


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
    systemd: Annotated[
        bool,
        typer.Option(
            "--systemd",
            help="Also write agentwake.service, a systemd unit that runs this project (as you, in DIR);"
            " in a folder that already has agentwake.toml, write only the unit.",
        ),
    ] = False,
    example: Annotated[
        str | None,
        typer.Option(
            "--example",
            metavar="NAME",
            help="Write a playground instead: github, slack, pagerduty or triage. Its bridges run against"
            " fake upstreams that ship with agentwake (agentwake bridge NAME --fake), so agentwake run"
            " shows an upstream event become an agent action and a tool call land on the fake, offline.",
        ),
    ] = None,
) -> None:
    """Start a new project in DIR: a commented agentwake.toml, policies/ and prompts/.

    The config runs as written, offline: the demo help desk (agentwake-demo) over
    stdio, the "agentwake/offline" stand-in model and the store in DIR. The policies
    and prompts are copies of agentwake's packaged defaults, for you to edit. An
    existing file is never overwritten without --force; then nothing is written.
    """
    if example is not None and example not in EXAMPLE_POLICIES:
        raise fail(f"no example named {example!r}; the examples: {', '.join(EXAMPLE_POLICIES)}", code=2)
    if example is not None and systemd:
        raise fail("--example writes a playground; --systemd is for a project of your own", code=2)
    target = directory.expanduser().resolve()
    if target.exists() and not target.is_dir():
        raise fail(f"{directory} exists and is not a folder")
    unit_only = systemd and (target / CONFIG_NAME).is_file()
    sources = [] if unit_only else planned_files(example)
    if systemd:
        sources.append((UNIT_TEMPLATE, Path(UNIT_NAME)))
    missing = [str(source) for source, _ in sources if not source.is_file()]
    if missing:
        raise fail(f"agentwake's packaged defaults are missing (a broken install?): {', '.join(missing)}")
    existing = [relative for _, relative in sources if (target / relative).exists()]
    blocked = [relative for relative in existing if not (target / relative).is_file()]
    if blocked:
        raise fail(f"not a file, cannot write it: {', '.join(str(target / p) for p in blocked)}")
    if existing and not force:
        names = ", ".join(str(p) for p in existing)
        raise fail(f"{target} already has {names}; nothing was written (pass --force to overwrite)")
    for source, relative in sources:
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes(_unit_for(target) if source == UNIT_TEMPLATE else source.read_bytes())
    overwritten = set(existing)
    if example is not None:
        _say_playground(example, target, sources, overwritten)
        return
    if unit_only:
        typer.echo(f"Wrote a systemd unit for the agentwake project in {target}:")
    else:
        typer.echo(f"Wrote a new agentwake project in {target}:")
    for _, relative in sources:
        typer.echo(f"  {relative}{'  (overwritten)' if relative in overwritten else ''}")
    config = _shown(target / CONFIG_NAME)
    option = "" if target == Path.cwd().resolve() else f" -c {config}"
    typer.echo("")
    typer.echo("Next:")
    if not unit_only:
        typer.echo(
            f"  agentwake check{option}    # validate it, start the demo server, show each subscription"
        )
        typer.echo(
            f"  agentwake run{option}      # the service, until Ctrl-C; the offline model needs no key"
        )
        typer.echo(f"  agentwake actions{option}  # what the agent did")
    if systemd:
        if any(target.is_relative_to(tmp) for tmp in PRIVATE_TMP):
            warn(f"the unit's PrivateTmp=yes hides {target} from the service: move the project, or drop it")
        typer.echo(f"  sudo cp {_shown(target / UNIT_NAME)} /etc/systemd/system/")
        typer.echo("  sudo systemctl daemon-reload && sudo systemctl enable --now agentwake")
        typer.echo(f"  agentwake status{option} --watch   # the service, refreshed every 2s")
    if not unit_only:
        typer.echo(f"Then edit {config}: your own MCP servers, a real model, policies/ and prompts/.")


def _say_playground(
    example: str, target: Path, sources: list[tuple[Path, Path]], overwritten: set[Path]
) -> None:
    typer.echo(f"Wrote the {example} playground in {target}:")
    for _, relative in sources:
        if relative.parent != Path("prompts"):
            typer.echo(f"  {relative}{'  (overwritten)' if relative in overwritten else ''}")
    typer.echo("  prompts/  (agentwake's packaged prompts, to edit)")
    here = target == Path.cwd().resolve()
    option = "" if here else f" -c {_shown(target / CONFIG_NAME)}"
    first, test = EXAMPLE_NEXT[example]
    upstream, _ = test.split()
    state = "" if here else f" --state-dir {_shown(target / '.agentwake-bridge' / upstream)}"
    typer.echo("")
    typer.echo("Next, offline (no account, no key; loopback only):")
    typer.echo(f"  agentwake check{option}    # validate it; the bridges start once, without ingress")
    typer.echo(f"  agentwake run{option}      # {first}; Ctrl-C stops")
    typer.echo(f"  agentwake bridge send-test {test}{state}   # in another terminal, while run runs")
    typer.echo(f"  agentwake actions{option}  # what the agent did")
    typer.echo("To start afresh: stop run, delete agentwake.db and .agentwake-bridge/ in the folder.")
