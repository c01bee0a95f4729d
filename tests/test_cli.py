"""The command line: help on every command, check, events, status and inbox."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from _support import demo_server_toml
from rich.console import Console
from typer.testing import CliRunner

from agentwake import signing
from agentwake.cli import PlainTable, app, print_status, print_table
from agentwake.store import IncomingEvent, SubscriptionKey
from agentwake.store.sqlite import SqliteCore

runner = CliRunner()
COMMANDS = ["run", "check", "events", "status", "inbox", "rotate-secret"]


def demo_config(tmp_path: Path, subscriptions: str = "", **env: str) -> Path:
    text = f"""
[store]
path = "aw.db"

{demo_server_toml(tmp_path / "demo.db", **env)}{subscriptions}
"""
    path = tmp_path / "agentwake.toml"
    path.write_text(text)
    return path


TICKETS = """
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
arguments = { queue = "support" }
"""


def test_the_top_level_help_lists_every_command() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in COMMANDS:
        assert command in result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_text(command: str) -> None:
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "--config" in result.output
    registered = {c.name or c.callback.__name__: c for c in app.registered_commands if c.callback}
    doc = (registered[command].callback.__doc__ or "").strip()
    assert doc, f"{command} has no docstring"
    assert doc.split("\n")[0][:40] in " ".join(result.output.split())


def test_help_does_not_import_litellm() -> None:
    code = "import sys, agentwake.cli; sys.exit(1 if 'litellm' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_check_shows_each_subscription_with_its_mode(tmp_path: Path) -> None:
    result = runner.invoke(app, ["check", "-c", str(demo_config(tmp_path, TICKETS))])
    assert result.exit_code == 0, result.output
    assert "tickets" in result.output and "push" in result.output and "config OK" in result.output


def test_check_names_an_unknown_event_and_the_fix(tmp_path: Path) -> None:
    bad = TICKETS.replace("ticket.created", "ticket.exploded")
    result = runner.invoke(app, ["check", "-c", str(demo_config(tmp_path, bad))])
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert "subscription 'tickets'" in text and "no event 'ticket.exploded'" in text and "fix 'event'" in text


def test_check_names_arguments_that_fail_the_input_schema(tmp_path: Path) -> None:
    bad = TICKETS.replace('queue = "support"', 'queue = "nowhere"')
    result = runner.invoke(app, ["check", "-c", str(demo_config(tmp_path, bad))])
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert "arguments do not match the inputSchema" in text and "queue" in text and "fix 'arguments'" in text


def test_check_reports_an_unreachable_server(tmp_path: Path) -> None:
    path = tmp_path / "agentwake.toml"
    path.write_text(
        '[servers.gone]\ncommand = "/nonexistent/server"\n[[subscriptions]]\nserver = "gone"\nevent = "x"\n'
    )
    result = runner.invoke(app, ["check", "-c", str(path)])
    assert result.exit_code == 1
    assert "command not found" in " ".join(result.output.split())


def test_check_rejects_bad_config_before_connecting(tmp_path: Path) -> None:
    path = tmp_path / "agentwake.toml"
    path.write_text('[servers.a]\ncommand = "x"\nport = 3\n')
    result = runner.invoke(app, ["check", "-c", str(path)])
    assert result.exit_code == 2
    assert "servers.a.port: unknown key" in result.output


def test_forcing_webhook_without_a_receiver_is_a_clear_config_error(tmp_path: Path) -> None:
    forced = TICKETS + 'delivery = "webhook"\n'
    result = runner.invoke(app, ["check", "-c", str(demo_config(tmp_path, forced))])
    assert result.exit_code == 2
    assert 'sets delivery = "webhook", but there is no [webhook] section' in " ".join(result.output.split())


def test_events_lists_types_with_modes_and_arguments(tmp_path: Path) -> None:
    result = runner.invoke(app, ["events", "demo", "--json", "-c", str(demo_config(tmp_path))])
    assert result.exit_code == 0, result.output
    listing = {e["name"]: e for e in json.loads(result.output)}
    assert set(listing) == {"ticket.created", "alert.fired", "system.load"}
    assert listing["ticket.created"]["delivery"] == ["poll", "push"]
    assert "queue" in listing["ticket.created"]["inputSchema"]["properties"]
    table = runner.invoke(app, ["events", "-c", str(demo_config(tmp_path))])
    assert "ticket.created" in table.output


def seeded_store(config: Path) -> None:
    store = SqliteCore.open(config.parent / "aw.db")
    key = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "support"})
    store.register(key)
    event = IncomingEvent("T-000001", "ticket.created", "2026-01-01T00:00:00Z", {"ticketId": "T-000001"})
    store.ingest(key, [event, event], "1")
    store.close()


def test_status_json_has_the_documented_fields(tmp_path: Path) -> None:
    config = demo_config(tmp_path, TICKETS)
    seeded_store(config)
    result = runner.invoke(app, ["status", "--json", "-c", str(config)])
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.output)
    for field in (
        "subscription",
        "server",
        "event",
        "mode",
        "cursor",
        "events_received",
        "duplicates",
        "gaps",
        "last_error",
    ):
        assert field in row
    assert (row["subscription"], row["cursor"], row["events_received"], row["duplicates"]) == (
        "tickets",
        "1",
        1,
        1,
    )


@pytest.mark.anyio
async def test_a_command_run_from_inside_an_event_loop_still_reads_the_store(tmp_path: Path) -> None:
    # A program (or a test) may call the CLI from async code; the CLI's own loop must not clash with it.
    config = demo_config(tmp_path, TICKETS)
    seeded_store(config)
    result = runner.invoke(app, ["inbox", "--json", "-c", str(config)])
    assert result.exit_code == 0, result.output
    assert [row["event_id"] for row in json.loads(result.output)] == ["T-000001"]


def test_inbox_json_has_the_documented_fields(tmp_path: Path) -> None:
    config = demo_config(tmp_path, TICKETS)
    seeded_store(config)
    result = runner.invoke(app, ["inbox", "--json", "--limit", "5", "-c", str(config)])
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.output)
    for field in ("server", "subscription", "event", "event_id", "timestamp", "received_at", "state", "data"):
        assert field in row
    assert row["data"] == {"ticketId": "T-000001"} and row["state"] == "pending"


def status_rows_with_a_webhook(tmp_path: Path) -> list[dict[str, object]]:
    """`status --json` rows for a store holding a subscribed webhook with a failing delivery."""
    config = demo_config(tmp_path, TICKETS)
    seeded_store(config)
    store = SqliteCore.open(config.parent / "aw.db")
    key = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "support"})
    record = store.prepare_webhook(key, "https://hooks.example.com/tickets", signing.generate_secret())
    store.webhook_subscribed(
        "tickets",
        webhook_id="sub_a3f1c8e2b0d49f7e",
        sent_secret=record.secret,
        refresh_before="2026-12-02T13:00:00.000Z",
        delivery_status={"active": False, "lastError": "http_4xx"},
        previous_until="2026-12-02T12:10:00.000Z",
    )
    store.set_state("tickets", status="failed", mode="webhook", error="[red]server said no[/red]")
    store.close()
    result = runner.invoke(app, ["status", "--json", "-c", str(config)])
    assert result.exit_code == 0, result.output
    rows: list[dict[str, object]] = json.loads(result.output)
    return rows


def rendered(width: int, show: Callable[[Console], None]) -> list[str]:
    console = Console(width=width, markup=False, file=io.StringIO())
    show(console)
    assert isinstance(console.file, io.StringIO)
    return [line.rstrip() for line in console.file.getvalue().splitlines()]


def rendered_status(rows: list[dict[str, object]], width: int) -> list[str]:
    return rendered(width, lambda console: print_status(rows, console))


def runs_table() -> PlainTable:
    table = PlainTable(title="Agent runs")
    for column in ("run", "started", "reason"):
        table.add_column(column, overflow="fold")
    table.add_row("18", "2026-12-02T07:07:01.787Z", "[bold]refused[/bold] by the server")
    table.add_row("17", "2026-12-02T07:06:58.776Z", "")
    return table


def test_a_table_too_wide_for_the_terminal_prints_a_block_of_labelled_lines_per_row() -> None:
    lines = rendered(40, lambda console: print_table(runs_table(), console))
    assert lines == [
        "Agent runs",
        "",
        "run 18",
        "  started  2026-12-02T07:07:01.787Z",
        "  reason   [bold]refused[/bold] by the",  # upstream text as written, folded at the edge
        "           server",
        "",
        "run 17",
        "  started  2026-12-02T07:06:58.776Z",  # an empty cell is left out
    ]


def test_a_table_that_fits_prints_as_a_table() -> None:
    lines = rendered(120, lambda console: print_table(runs_table(), console))
    assert any(line.startswith("┃ run ┃ started") for line in lines)
    assert any("[bold]refused[/bold] by the server" in line for line in lines)


def test_status_on_a_narrow_terminal_prints_a_block_per_subscription_with_nothing_folded(
    tmp_path: Path,
) -> None:
    lines = rendered_status(status_rows_with_a_webhook(tmp_path), 100)
    assert max(len(line) for line in lines) <= 100
    assert lines[2] == "tickets       demo · ticket.created · webhook · failed"
    assert "  cursor      1 (last activity " in lines[3]
    assert lines[4] == "  events      1 received, 1 duplicates, 0 gaps; 0 done, 0 failed"
    assert lines[5] == (
        "  webhook     sub_a3f1c8e2b0d49f7e · refresh by 2026-12-02T13:00:00.000Z · suspended, http_4xx"
    )
    assert lines[6] == "  last error  [red]server said no[/red]"  # upstream text, printed as written


def test_status_on_a_wide_terminal_is_one_table(tmp_path: Path) -> None:
    lines = rendered_status(status_rows_with_a_webhook(tmp_path), 220)
    [header] = [line for line in lines if "subscription" in line]
    assert header.split("┃")[1:-1] and "webhook" in header and "last error" in header
    assert any("sub_a3f1c8e2b0d49f7e" in line for line in lines)


def test_status_before_any_run_says_what_to_do(tmp_path: Path) -> None:
    result = runner.invoke(app, ["status", "-c", str(demo_config(tmp_path, TICKETS))])
    assert result.exit_code == 1
    assert "run 'agentwake run' first" in " ".join(result.output.split())
