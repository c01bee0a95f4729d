"""Config errors name the table, the line and the nearest known key; AGENTWAKE_CONFIG; inbox --state."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from _support import demo_server_toml
from conftest import REPO
from typer.testing import CliRunner

from agentwake.cli import app
from agentwake.config import load_config
from agentwake.configfile import key_lines, line_of, table_label
from agentwake.errors import ConfigError
from agentwake.store import IncomingEvent, SubscriptionKey
from agentwake.store.sqlite import SqliteCore

runner = CliRunner()


def good(tmp_path: Path) -> str:
    """A valid config; the tests edit its text."""
    return f"""# a comment
[store]
path = "aw.db"

[agent]
model = "agentwake/offline"
prompts = {json.dumps(str(REPO / "prompts"))}

{demo_server_toml(tmp_path / "demo.db")}
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
arguments = {{ queue = "support" }}

[[subscriptions]]
name = "alerts"
server = "demo"
event = "alert.fired"
tools = ["demo__get_alert"]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agentwake.toml"
    path.write_text(text)
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    first, *rest = str(caught.value).splitlines()
    assert first == f"{path} is invalid:"
    return [line.strip() for line in rest]


def line_number(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), start=1) if needle in line)


def test_the_good_config_loads(tmp_path: Path) -> None:
    assert [s.name for s in load_config(write(tmp_path, good(tmp_path))).subscriptions] == [
        "tickets",
        "alerts",
    ]


@pytest.mark.parametrize(
    ("edit", "typo", "expected"),
    [
        # A key at the top level, before any table.
        (
            lambda t: "servr = 1\n" + t,
            "servr = 1",
            "unknown key 'servr' at the top level at line {line}; did you mean 'servers'?",
        ),
        # A key in [servers.x].
        (
            lambda t: t.replace("cwd = ", 'comand = "x"\ncwd = '),
            'comand = "x"',
            "servers.demo.comand: unknown key 'comand' in [servers.demo] at line {line}; did you mean 'command'?",
        ),
        # A key in the second [[subscriptions]].
        (
            lambda t: t.replace('tools = ["demo__get_alert"]', 'tool = ["demo__get_alert"]'),
            "tool = [",
            "subscriptions[1].tool: unknown key 'tool' in [[subscriptions]] #2 at line {line}; did you mean 'tools'?",
        ),
        # A key in [agent].
        (
            lambda t: t.replace(
                'model = "agentwake/offline"', 'model = "agentwake/offline"\ntemprature = 0.2'
            ),
            "temprature",
            "agent.temprature: unknown key 'temprature' in [agent] at line {line}; did you mean 'temperature'?",
        ),
        # A whole table misspelt.
        (
            lambda t: t.replace("[store]", "[stor]"),
            "[stor]",
            "unknown key 'stor' at the top level at line {line}; did you mean 'store'?",
        ),
        # A key inside an inline table of a [[subscriptions]] entry: no suggestion when nothing is near.
        (
            lambda t: t.replace('event = "ticket.created"', 'event = "ticket.created"\nzzz = 1'),
            "zzz = 1",
            "subscriptions[0].zzz: unknown key 'zzz' in [[subscriptions]] #1 at line {line} (check the spelling",
        ),
    ],
    ids=["top-level", "servers.x", "subscriptions #2", "agent", "table", "no suggestion"],
)
def test_an_unknown_key_names_its_table_line_and_nearest_key(
    tmp_path: Path, edit: Callable[[str], str], typo: str, expected: str
) -> None:
    text = edit(good(tmp_path))
    path = write(tmp_path, text)
    [problem] = problems(path)
    assert problem.startswith(expected.format(line=line_number(text, typo))), problem
    assert "(top level)" not in problem


def test_a_wrong_type_names_the_key_the_value_and_the_line(tmp_path: Path) -> None:
    text = good(tmp_path).replace('name = "alerts"', 'name = "alerts"\nmax_events = "many"')
    [problem] = problems(write(tmp_path, text))
    line = line_number(text, "max_events")
    assert problem == (
        "subscriptions[1].max_events: Input should be a valid integer, unable to parse string as an"
        f" integer, got 'many' (in [[subscriptions]] #2 at line {line})"
    )


def test_a_bad_value_in_a_server_names_the_server_table_and_line(tmp_path: Path) -> None:
    text = good(tmp_path).replace("cwd = ", 'url = "http://x/mcp"\ncwd = ')
    [problem] = problems(write(tmp_path, text))
    assert problem == (
        "servers.demo: set exactly one of 'command' (stdio) or 'url' (Streamable HTTP)"
        f" (in [servers.demo] at line {line_number(text, '[servers.demo]')})"
    )


def test_several_problems_are_listed_in_file_order(tmp_path: Path) -> None:
    text = (
        good(tmp_path)
        .replace("[store]", "[store]\npth = 1")
        .replace('name = "alerts"', 'name = "alerts"\nmax_events = 0\ntool = []')
    )
    found = problems(write(tmp_path, text))
    assert [re.sub(r":.*", "", p) for p in found] == [
        "store.pth",
        "subscriptions[1].max_events",
        "subscriptions[1].tool",
    ]


def test_a_cross_reference_error_has_no_location_prefix(tmp_path: Path) -> None:
    text = good(tmp_path).replace(
        'server = "demo"\nevent = "alert.fired"', 'server = "nowhere"\nevent = "alert.fired"'
    )
    [problem] = problems(write(tmp_path, text))
    assert problem.startswith("subscriptions[1] ('alerts') names server 'nowhere'")
    assert "(top level)" not in problem


def test_check_prints_the_located_error_and_exits_2(tmp_path: Path) -> None:
    text = good(tmp_path).replace('tools = ["demo__get_alert"]', 'tool = ["demo__get_alert"]')
    result = runner.invoke(app, ["check", "-c", str(write(tmp_path, text))])
    assert result.exit_code == 2
    line = line_number(text, "tool = [")
    assert f"unknown key 'tool' in [[subscriptions]] #2 at line {line}; did you mean 'tools'?" in " ".join(
        result.output.split()
    )


# ---- the line scanner ----------------------------------------------------------------------------


def test_key_lines_follows_tables_arrays_dotted_inline_and_quoted_keys() -> None:
    text = """
top = 1
[a]
x.y = 2
"quoted key" = 3
inline = { p = 1, "q" = 2 }
[[arr]]
k = 1
[arr.sub]
deep = 1
[[arr]]
text = \"\"\"
not = a key
\"\"\"
k = 2
[ b . c ]  # spaced, commented
z = 1
"""
    lines = key_lines(text)
    assert lines[("top",)] == 2
    assert lines[("a",)] == 3 and lines[("a", "x", "y")] == 4 and lines[("a", "x")] == 4
    assert lines[("a", "quoted key")] == 5
    assert lines[("a", "inline", "p")] == 6 and lines[("a", "inline", "q")] == 6
    assert lines[("arr", 0)] == 7 and lines[("arr", 0, "k")] == 8
    assert lines[("arr", 0, "sub", "deep")] == 10
    assert lines[("arr", 1)] == 11 and lines[("arr", 1, "k")] == 15
    assert ("arr", 1, "not") not in lines
    assert lines[("b", "c", "z")] == 17
    # A location the scanner does not know falls back to the nearest one it does.
    assert line_of(lines, ("arr", 1, "k", 3)) == 15
    assert line_of(lines, ("nowhere",)) is None


def test_table_labels() -> None:
    assert table_label(()) == "the top level"
    assert table_label(("agent",)) == "[agent]"
    assert table_label(("servers", "x")) == "[servers.x]"
    assert table_label(("subscriptions", 0)) == "[[subscriptions]] #1"


# ---- AGENTWAKE_CONFIG ----------------------------------------------------------------------------


def seeded(tmp_path: Path) -> Path:
    path = write(tmp_path, good(tmp_path))
    store = SqliteCore.open(tmp_path / "aw.db")
    key = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "support"})
    store.register(key)
    store.ingest(key, [IncomingEvent("T-000001", "ticket.created", "2026-01-01T00:00:00Z", {"a": 1})], "1")
    store.close()
    return path


def test_agentwake_config_is_the_default_config_of_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = seeded(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no agentwake.toml here
    monkeypatch.setenv("AGENTWAKE_CONFIG", str(config))
    inbox = runner.invoke(app, ["inbox", "--json"])
    assert inbox.exit_code == 0, inbox.output
    assert [row["event_id"] for row in json.loads(inbox.stdout)] == ["T-000001"]
    assert runner.invoke(app, ["status", "--json"]).exit_code == 0
    policy = runner.invoke(app, ["policy", "check"])
    assert policy.exit_code == 0, policy.output
    # -c still wins over the variable.
    missing = runner.invoke(app, ["status", "-c", str(elsewhere / "none.toml")])
    assert missing.exit_code == 2 and "none.toml" in missing.output


def test_without_agentwake_config_the_error_says_how_to_point_at_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AGENTWAKE_CONFIG", raising=False)
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 2
    assert "AGENTWAKE_CONFIG" in " ".join(result.output.split())


@pytest.mark.parametrize("command", ["run", "check", "events", "status", "inbox", "policy check"])
def test_every_commands_help_shows_the_variable(command: str) -> None:
    result = runner.invoke(app, [*command.split(), "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "AGENTWAKE_CONFIG" in result.output


# ---- inbox --state -------------------------------------------------------------------------------


def test_inbox_with_an_unknown_state_is_an_error_listing_the_states(tmp_path: Path) -> None:
    config = seeded(tmp_path)
    result = runner.invoke(app, ["inbox", "--state", "bogus", "-c", str(config)])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "unknown state 'bogus'" in text
    for state in ("pending", "processing", "done", "failed", "ignored", "held", "rejected"):
        assert state in text


def test_inbox_with_a_known_state_filters(tmp_path: Path) -> None:
    config = seeded(tmp_path)
    pending = runner.invoke(app, ["inbox", "--json", "--state", "pending", "-c", str(config)])
    assert [row["event_id"] for row in json.loads(pending.stdout)] == ["T-000001"]
    done = runner.invoke(app, ["inbox", "--json", "--state", "done", "-c", str(config)])
    assert json.loads(done.stdout) == []
