"""``agentwake policy test``'s arguments: the sample's server must be known, and --offline needs no
server secrets.

A file of data only, named with --event, says nothing about its server: without --server that is
an error naming --server (before, the prompt said the event came from MCP server "?"). --offline
asks no server, so an unset ${VAR} in a server's headers does not stop it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO
from typer.testing import CliRunner

from agentwake.cli import app

runner = CliRunner()
TOKEN = "AGENTWAKE_TEST_POLICY_TEST_TOKEN"
CONFIG = f"""
[store]
path = "aw.db"

[agent]
model = "agentwake/offline"
prompts = {json.dumps(str(REPO / "prompts"))}

[servers.demo]
url = "http://127.0.0.1:9/mcp"
headers = {{ Authorization = "Bearer ${{{TOKEN}}}" }}

[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
tools = ["demo__add_comment"]
"""
RULES = """
[[rules]]
name = "tickets"
action = "agent"
match.event = "ticket.created"
"""
DATA = {"ticketId": "T-9", "queue": "support", "title": "Printer jammed"}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config whose one server needs a secret; unset unless a test sets it."""
    monkeypatch.delenv(TOKEN, raising=False)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "10-tickets.toml").write_text(RULES)
    (tmp_path / "data.json").write_text(json.dumps(DATA))
    config = tmp_path / "agentwake.toml"
    config.write_text(CONFIG)
    return config


def flat(text: str) -> str:
    return " ".join(text.split())


def policy_test(config: Path, *args: str, event: str = "data.json") -> tuple[int, str]:
    argv = ["policy", "test", str(config.parent / event), *args, "-c", str(config)]
    result = runner.invoke(app, argv, env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_event_without_server_is_an_error_naming_server(project: Path) -> None:
    code, out = policy_test(project, "--event", "ticket.created", "--offline")
    assert code == 2, out
    assert "--server" in flat(out)
    assert '"?"' not in out and "decision" not in out and "prompt" not in out


def test_event_with_server_shows_the_servers_name_in_the_prompt(project: Path) -> None:
    code, out = policy_test(project, "--event", "ticket.created", "--server", "demo", "--offline")
    assert code == 0, out
    assert 'MCP server "demo"' in out
    assert '"?"' not in out.split("system prompt")[1].split("user prompt")[0]


def test_a_whole_event_file_may_name_its_server(project: Path) -> None:
    event = {"name": "ticket.created", "server": "demo", "data": DATA}
    (project.parent / "event.json").write_text(json.dumps(event))
    code, out = policy_test(project, "--offline", event="event.json")
    assert code == 0, out
    assert 'MCP server "demo"' in out


def test_a_whole_event_file_without_a_server_needs_server_too(project: Path) -> None:
    (project.parent / "event.json").write_text(json.dumps({"name": "ticket.created", "data": DATA}))
    code, out = policy_test(project, "--offline", event="event.json")
    assert code == 2, out
    assert "--server" in flat(out)


def test_a_server_not_in_the_config_is_an_error_listing_the_known_ones(project: Path) -> None:
    code, out = policy_test(project, "--event", "ticket.created", "--server", "github", "--offline")
    assert code == 2, out
    assert "no server named 'github'" in flat(out) and "(known: demo)" in flat(out)


def test_the_subscription_gives_the_server(project: Path) -> None:
    code, out = policy_test(project, "--subscription", "tickets", "--offline")
    assert code == 0, out
    assert 'MCP server "demo"' in out


def test_offline_needs_no_server_secret(project: Path) -> None:
    code, out = policy_test(project, "--subscription", "tickets", "--offline")
    assert code == 0, out
    assert "is not set" not in out
    assert "rule: tickets" in flat(out)
    assert "--offline: no server was asked for its tools" in flat(out)


def test_without_offline_the_unset_secret_is_still_refused_at_once(project: Path) -> None:
    code, out = policy_test(project, "--subscription", "tickets")
    assert code == 2, out
    assert f"uses ${{{TOKEN}}}, but {TOKEN} is not set" in flat(out)
