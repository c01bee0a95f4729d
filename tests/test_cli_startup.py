"""How `agentwake NAME ...` starts: the one command's module imported and that command built
alone (agentwake.cli.COMMANDS), the rest of the app as --help shows it, and the garbage
collector off for the quick commands only. Which modules each command loads is checked by
tests/test_cli_imports.py; how fast they start by bench/cli_startup.py, not here.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import typer
from typer.testing import CliRunner

import agentwake.cli
from agentwake.cli import COMMANDS, QUICK, app, command_name, listing, only
from agentwake.cli.views import watch_status
from agentwake.config import load_config
from agentwake.store import IncomingEvent, SubscriptionKey, open_store

runner = CliRunner()


def registered() -> dict[str, set[str]]:
    """Each top-level name on the whole app, and the modules its callbacks (a group's: its
    subcommands') are defined in."""
    found: dict[str, set[str]] = {}
    for info in app.registered_commands:
        found.setdefault(command_name(info), set()).add(info.callback.__module__)  # type: ignore[union-attr]
    for group in app.registered_groups:
        assert group.typer_instance is not None and group.name is not None
        modules = {c.callback.__module__ for c in group.typer_instance.registered_commands}  # type: ignore[union-attr]
        found.setdefault(group.name, set()).update(modules)
    return found


def test_the_table_of_commands_names_every_command_and_the_modules_that_define_it() -> None:
    expected = {name: {f"agentwake.cli.{m}" for m in modules} for name, modules in COMMANDS.items()}
    assert registered() == expected


def test_the_whole_app_lists_the_commands_in_the_tables_order() -> None:
    names = [command_name(c) for c in app.registered_commands] + [str(g.name) for g in app.registered_groups]
    assert names == list(COMMANDS)
    listed = runner.invoke(app, ["--help"], terminal_width=200)
    assert listed.exit_code == 0
    lines = listed.output.split("Commands:")[1].splitlines()
    # Each command's line starts with its name, two spaces in; a wrapped description, further in.
    listed_names = [line.split()[0] for line in lines if line.startswith("  ") and line[2] != " "]
    assert listed_names == list(COMMANDS)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_command_built_alone_has_the_same_help_as_in_the_whole_app(name: str) -> None:
    whole = runner.invoke(app, [name, "--help"], prog_name="agentwake", terminal_width=120)
    alone = runner.invoke(only(name), [name, "--help"], prog_name="agentwake", terminal_width=120)
    assert whole.exit_code == alone.exit_code == 0
    assert alone.output == whole.output


def test_a_command_built_alone_refuses_what_the_whole_app_refuses() -> None:
    whole = runner.invoke(app, ["status", "--no-such-flag"], prog_name="agentwake")
    alone = runner.invoke(only("status"), ["status", "--no-such-flag"], prog_name="agentwake")
    assert whole.exit_code == alone.exit_code == 2
    assert alone.output == whole.output


@pytest.mark.parametrize(
    "argv", [["--help"], [], ["--version"]], ids=lambda argv: " ".join(argv) or "no args"
)
@pytest.mark.parametrize("width", [60, 200])
def test_the_listing_answers_as_the_whole_app_does(argv: list[str], width: int) -> None:
    """`agentwake --help` (and no command at all, and --version) built without any command's parameters."""
    whole = runner.invoke(app, argv, prog_name="agentwake", terminal_width=width)
    listed = runner.invoke(listing(), argv, prog_name="agentwake", terminal_width=width)
    assert listed.exit_code == whole.exit_code
    assert listed.output == whole.output
    assert "status" in listed.output or argv == ["--version"]


def test_the_listing_builds_no_parameter_and_runs_no_command() -> None:
    shown = listing()
    assert all(
        c.callback is not None and c.callback.__name__ == "_listed_only" for c in shown.registered_commands
    )
    assert all(g.typer_instance and not g.typer_instance.registered_commands for g in shown.registered_groups)
    assert [command_name(c) for c in shown.registered_commands] == [
        command_name(c) for c in app.registered_commands
    ]
    assert runner.invoke(shown, ["status"]).exit_code != 0  # listed, never run


def test_only_leaves_the_whole_app_whole() -> None:
    before = [command_name(c) for c in app.registered_commands]
    groups = [len(g.typer_instance.registered_commands) for g in app.registered_groups if g.typer_instance]
    only("inbox")
    listing()
    assert [command_name(c) for c in app.registered_commands] == before
    assert [c.callback.__name__ for c in app.registered_commands if c.callback] == [
        name.replace("-", "_") for name in before
    ]
    assert [
        len(g.typer_instance.registered_commands) for g in app.registered_groups if g.typer_instance
    ] == groups


# ---- end to end, through main() in a fresh interpreter -------------------------------------------

PROBE = """
import gc, json, sys
out, argv = sys.argv[1], json.loads(sys.argv[2])
sys.argv = ["agentwake", *argv]
import agentwake.cli
import agentwake.cli.views as views

seen = {}
real = views.status_reading
def spy(*args, **kwargs):
    seen["collecting"] = gc.isenabled()
    return real(*args, **kwargs)
views.status_reading = spy
code = 0
try:
    agentwake.cli.main()
except SystemExit as exc:
    code = exc.code
with open(out, "w") as f:
    json.dump({"code": code, "during": seen.get("collecting"), "after": gc.isenabled()}, f)
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with one subscription and one event whose text holds an emoji code."""
    folder = tmp_path_factory.mktemp("cli-startup")
    path = folder / "agentwake.toml"
    path.write_text('[store]\npath = "aw.db"\n\n[servers.demo]\ncommand = "python"\n')

    async def fill() -> None:
        store = await open_store(load_config(path).store)
        try:
            key = SubscriptionKey("tickets", "demo", "ticket.created", {})
            await store.register(key)
            data = {"text": "on fire :fire: [bold]x[/bold]"}
            await store.ingest(
                key, [IncomingEvent("T-1", "ticket.created", "2026-01-01T00:00:00Z", data)], "1"
            )
        finally:
            await store.close()

    anyio.run(fill)
    return path


def probe(config: Path, *argv: str) -> dict[str, object]:
    found = config.parent / "probe.json"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(found), json.dumps(list(argv))],
        cwd=config.parent,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    probed: dict[str, object] = json.loads(found.read_text())
    return probed


def test_a_quick_command_runs_without_the_collector_and_main_gives_it_back(config: Path) -> None:
    assert "status" in QUICK
    probed = probe(config, "status", "-c", str(config))
    assert probed == {"code": 0, "during": False, "after": True}


def test_a_command_that_is_not_quick_keeps_the_collector(config: Path) -> None:
    assert "run" not in QUICK and "check" not in QUICK
    probed = probe(config, "check", "--help")
    assert probed["code"] == 0 and probed["after"] is True


def test_status_watch_turns_the_collector_back_on(tmp_path: Path) -> None:
    """A watch runs until Ctrl-C: it collects, although `status` started without the collector."""
    gc.disable()
    try:
        with pytest.raises(typer.Exit):  # no config there: the watch ends at its first reading
            watch_status(tmp_path / "missing.toml", as_json=True, with_service=False, interval_s=0.1)
        assert gc.isenabled()
    finally:
        gc.enable()


def test_emoji_codes_and_markup_in_stored_text_print_as_written(config: Path) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "agentwake.cli", "inbox", "-c", str(config)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert shown.returncode == 0, shown.stderr
    assert "on fire :fire: [bold]x[/bold]" in shown.stdout
    assert "\N{FIRE}" not in shown.stdout


def test_the_consoles_replace_no_emoji_code() -> None:
    for console in (agentwake.cli.out, agentwake.cli.err):
        with console.capture() as captured:
            console.print(":rotating_light: alert", highlight=False)
        assert captured.get() == ":rotating_light: alert\n"
