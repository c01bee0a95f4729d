"""A rule's ``args`` in the CLI: ``agentwake check`` and ``agentwake policy check`` hold them against
what the demo server (a real stdio process) declares, and ``agentwake policy test`` shows the pins."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from _support import demo_server_toml
from conftest import REPO
from rich.console import Console
from typer.testing import CliRunner

from agentwake import cli

runner = CliRunner()

GOOD = """
[[rules]]
name = "comment-on-its-ticket"
action = "agent"
tools = ["demo__get_ticket", "demo__add_comment"]
args."demo__add_comment" = { ticket_id = "{{ data.ticketId }}", body = { max_length = 500 } }
match.event = "ticket.created"
"""
BAD = """
[[rules]]
name = "typos"
action = "agent"
tools = ["demo__add_comment"]
args."demo__add_comment" = { ticket = "{{ data.ticketId }}", body = "{{ data.titel }}" }
match.server = "demo"
match.event = "ticket.created"
"""


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "out", Console(width=400))
    monkeypatch.setattr(cli, "err", Console(width=400, stderr=True))


def project(tmp_path: Path, policy: str) -> Path:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "rules.toml").write_text(textwrap.dedent(policy), encoding="utf-8")
    config = tmp_path / "agentwake.toml"
    config.write_text(
        f"""
[store]
path = "aw.db"

[agent]
model = "agentwake/offline"
prompts = {json.dumps(str(REPO / "prompts"))}

[policy]
dir = "policies"
default = "log"

{demo_server_toml(tmp_path / "demo.db")}
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
""",
        encoding="utf-8",
    )
    return config


def test_check_reports_an_argument_the_tool_lacks_and_a_field_the_event_cannot_have(tmp_path: Path) -> None:
    config = project(tmp_path, BAD)
    result = runner.invoke(cli.app, ["check", "--json", "-c", str(config)])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    messages = [p["message"] for p in report["findings"] if p["kind"] == "policy"]
    where = "rules.toml:2: rule 'typos': "
    assert (
        f"{where}args.'demo__add_comment': demo__add_comment has no argument 'ticket' (its arguments: body, ticket_id)"
        in messages
    )
    assert any(
        m.startswith(where) and "{{ data.titel }}" in m and "demo/ticket.created" in m for m in messages
    ), messages
    line = next(p for p in report["findings"] if p["kind"] == "policy")
    assert (Path(line["file"]).name, line["line"]) == ("rules.toml", 2)


def test_policy_check_reports_them_too_and_offline_checks_form_only(tmp_path: Path) -> None:
    config = project(tmp_path, BAD)
    result = runner.invoke(cli.app, ["policy", "check", "-c", str(config)])
    assert result.exit_code == 2, result.output
    assert (
        "rules.toml:2: rule 'typos': args.'demo__add_comment': demo__add_comment has no argument 'ticket'"
        in result.output
    )
    assert "{{ data.titel }}" in result.output
    offline = runner.invoke(cli.app, ["policy", "check", "--offline", "-c", str(config)])
    assert offline.exit_code == 0, offline.output


def test_good_args_pass_check_and_policy_check(tmp_path: Path) -> None:
    config = project(tmp_path, GOOD)
    checked = runner.invoke(cli.app, ["policy", "check", "-c", str(config)])
    assert checked.exit_code == 0, checked.output
    report = json.loads(runner.invoke(cli.app, ["check", "--json", "-c", str(config)]).stdout)
    assert not [p for p in report["findings"] if p["kind"] == "policy"], report


def test_policy_test_shows_the_pinned_values_for_the_sample_event(tmp_path: Path) -> None:
    config = project(tmp_path, GOOD)
    sample = tmp_path / "event.json"
    sample.write_text(json.dumps({"name": "ticket.created", "data": {"ticketId": "T-000042", "title": "x"}}))
    result = runner.invoke(
        cli.app, ["policy", "test", str(sample), "--subscription", "tickets", "-c", str(config)]
    )
    assert result.exit_code == 0, result.output
    assert "arguments allowed" in result.output
    assert (
        'demo__add_comment: ticket_id = "T-000042" (from {{ data.ticketId }}); body: at most 500 long'
        in result.output
    )
    assert "demo__get_ticket: any arguments" in result.output
