"""Every ``--help`` shows the words its help was written with.

The commands and subcommands are found by walking the typer app (``agentwake.cli.app``, the
``policy`` group included), so a new command is checked without being listed here. Each one's
``--help`` is rendered on a wide terminal, and must hold, in order, every word of its docstring (or
the group's ``help=``) and of each option's and argument's ``help=``. Whitespace is ignored, so
wrapping does not matter; a word the renderer swallowed (typer's rich markup took "[servers]" for a
style and printed "a name from )") or changed does. No ``<bool>`` metavar and no reST double
backticks may show either.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from agentwake.cli import app

WIDTH = 200
runner = CliRunner()


def commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """``(path under agentwake, click command)`` for the app itself and every (sub)command in it."""
    found = [(path, command)]
    for name, sub in (getattr(command, "commands", None) or {}).items():
        if not getattr(sub, "hidden", False):
            found.extend(commands(sub, (*path, name)))
    return found


COMMANDS = commands(typer.main.get_command(app))


def written_help(command: Any) -> str:
    """The command's help as written: its function's docstring, else its ``help=``; up to click's
    ``\\f`` (what follows is not for the terminal)."""
    callback = getattr(command, "callback", None)
    text = (inspect.getdoc(callback) if callback is not None else None) or command.help or ""
    return text.split("\f")[0]


def texts(command: Any) -> list[tuple[str, str]]:
    """(what, text as written) for the command and each of its options and arguments."""
    found = [("docstring", written_help(command))]
    for param in command.params:
        found.append((f"{param.param_type_name} {param.name}", getattr(param, "help", None) or ""))
    return found


def render(path: tuple[str, ...]) -> str:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)}, terminal_width=WIDTH)
    assert result.exit_code == 0, result.output
    return result.output


def squash(text: str) -> str:
    """The text without whitespace or box-drawing characters: wrapping and frames do not count."""
    return "".join(c for c in text if not c.isspace() and not "\u2500" <= c <= "\u257f")


def as_read(text: str) -> str:
    """What a person should read: reST ``literal`` markers are not part of the words."""
    return text.replace("``", "")


def missing(written: str, shown: str) -> list[str]:
    """The words of ``written`` the rendered help does not show; all of them in order, as one
    sequence, when each is somewhere but not in that order."""
    flat = squash(shown)
    words = as_read(written).split()
    if squash(" ".join(words)) in flat:
        return []
    return [w for w in words if squash(w) not in flat] or words


def label(path: tuple[str, ...]) -> str:
    return " ".join(("agentwake", *path))


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[label(p) for p, _ in COMMANDS])
def test_every_help_text_shows_each_word_it_was_written_with(path: tuple[str, ...], command: Any) -> None:
    shown = render(path)
    problems = {}
    for what, written in texts(command):
        assert written.strip(), f"{label(path)}: {what} has no help text"
        lost = missing(written, shown)
        if lost:
            problems[what] = lost
    assert not problems, f"{label(path)} --help lost words:\n{problems}\n--- shown:\n{shown}"


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[label(p) for p, _ in COMMANDS])
def test_no_help_shows_a_bool_metavar_or_rest_backticks(path: tuple[str, ...], command: Any) -> None:
    shown = render(path)
    assert "<bool>" not in shown.lower()
    assert "``" not in shown


def first_sentence(text: str) -> str:
    """The first paragraph up to its first full stop."""
    words = as_read(text).split("\n\n")[0].split()
    ends = [i for i, word in enumerate(words) if word.endswith(".")]
    return " ".join(words[: ends[0] + 1] if ends else words)


GROUPS = [(path, command) for path, command in COMMANDS if getattr(command, "commands", None)]


@pytest.mark.parametrize(("path", "group"), GROUPS, ids=[label(p) for p, _ in GROUPS])
def test_a_groups_help_lists_each_commands_first_sentence_whole(path: tuple[str, ...], group: Any) -> None:
    """At a common terminal width: click would cut each line short with "..."."""
    result = runner.invoke(app, [*path, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    listing = result.output.split("Commands:")[-1]
    assert "..." not in listing
    for name, command in group.commands.items():
        lost = missing(first_sentence(written_help(command)), listing)
        assert not lost, f"{label(path)} --help lists {name} without {lost}:\n{result.output}"


def test_the_walk_finds_every_command_and_the_policy_group() -> None:
    found = {label(p) for p, _ in COMMANDS}
    for expected in ("agentwake", "agentwake events", "agentwake rotate-secret", "agentwake status"):
        assert expected in found
    assert {"agentwake policy", "agentwake policy check", "agentwake policy test"} <= found


def test_the_check_catches_a_word_the_renderer_swallows() -> None:
    """The check itself, on a renderer that loses a bracketed word: typer's rich markup, which the
    CLI used before and which reads "[servers]" as a style."""
    rich_app = typer.Typer(rich_markup_mode="rich")

    @rich_app.command()
    def events(server: str = typer.Argument("", help="Only this server (a name from [servers]).")) -> None:
        """List the event types each server offers."""

    result = runner.invoke(rich_app, ["--help"], env={"COLUMNS": str(WIDTH)}, terminal_width=WIDTH)
    assert result.exit_code == 0, result.output
    assert "a name from" in result.output
    assert missing("Only this server (a name from [servers]).", result.output) == ["[servers])."]
    assert missing("List the event types each server offers.", result.output) == []


def test_the_check_ignores_wrapping_but_not_order() -> None:
    shown = "  Only this server (a name\n              from [servers]).  [default: x]\n"
    assert missing("Only this server (a name from [servers]).", shown) == []
    words = ["from", "a", "name"]
    assert missing(" ".join(words), "a name from") == words
