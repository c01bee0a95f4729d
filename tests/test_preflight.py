"""`agentwake check` tells the truth: what `run` would trip on is a finding, with a non-zero exit.

Every test runs the real CLI (typer's CliRunner) on a real config file, against the real demo
server over stdio (or the minimal server without MCP Events), with real SQLite files.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from _support import demo_server_toml
from conftest import REPO
from typer.testing import CliRunner

from agentwake.cli import app
from agentwake.store import IncomingEvent, SubscriptionKey
from agentwake.store.sqlite import SqliteCore

runner = CliRunner()
KEY = "AGENTWAKE_PREFLIGHT_KEY"

TICKETS = """
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
arguments = { queue = "support" }
tools = ["demo__get_ticket"]
"""


def write_config(
    tmp_path: Path,
    subscriptions: str = TICKETS,
    *,
    agent: str = 'model = "agentwake/offline"',
    store: str = "aw.db",
    policies: dict[str, str] | None = None,
    servers: str | None = None,
) -> Path:
    if servers is None:
        servers = demo_server_toml(tmp_path / "demo.db")
    folder = tmp_path / "policies"
    folder.mkdir(exist_ok=True)
    for name, text in (policies or {}).items():
        (folder / name).write_text(text)
    agent_section = f"[agent]\n{agent}\nprompts = {json.dumps(str(REPO / 'prompts'))}\n" if agent else ""
    path = tmp_path / "agentwake.toml"
    path.write_text(
        f"""
[store]
path = {json.dumps(store)}

{agent_section}
[policy]
dir = "policies"

{servers}
{subscriptions}
"""
    )
    return path


def check_json(config: Path) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["check", "--json", "-c", str(config)])
    return result.exit_code, json.loads(result.stdout)


def findings(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["kind"] == kind]


def flat(text: str) -> str:
    return " ".join(text.split())


# ---- a good config -----------------------------------------------------------------------------


def test_a_good_config_is_ok_in_json_with_each_subscription(tmp_path: Path) -> None:
    code, report = check_json(write_config(tmp_path))
    assert code == 0, report
    assert report["ok"] is True
    assert [f for f in report["findings"] if f["severity"] == "error"] == []
    [sub] = report["subscriptions"]
    assert (sub["name"], sub["server"], sub["event"], sub["mode"], sub["status"]) == (
        "tickets",
        "demo",
        "ticket.created",
        "push",
        "ok",
    )
    assert sub["tools"] == ["demo__get_ticket"]


def test_a_good_config_says_config_ok_in_text(tmp_path: Path) -> None:
    result = runner.invoke(app, ["check", "-c", str(write_config(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "config OK: 1 server(s), 1 subscription(s)" in flat(result.output)


# ---- an empty config -----------------------------------------------------------------------------


def test_a_config_without_servers_is_an_error(tmp_path: Path) -> None:
    config = write_config(tmp_path, "", servers="")
    code, report = check_json(config)
    assert code == 1 and report["ok"] is False
    whats = {f["what"] for f in findings(report, "config")}
    assert whats == {"servers", "subscriptions"}
    text = runner.invoke(app, ["check", "-c", str(config)])
    assert text.exit_code == 1
    assert "no servers are configured" in flat(text.output)
    assert "config OK" not in text.output


def test_a_config_without_subscriptions_is_an_error(tmp_path: Path) -> None:
    code, report = check_json(write_config(tmp_path, ""))
    assert code == 1
    [finding] = findings(report, "config")
    assert finding["what"] == "subscriptions" and finding["severity"] == "error"
    assert "no subscriptions are configured" in finding["message"]


def test_an_invalid_config_in_json_is_one_config_finding_and_exit_2(tmp_path: Path) -> None:
    config = write_config(tmp_path, TICKETS + "max_events = 0\n")
    code, report = check_json(config)
    assert code == 2 and report["ok"] is False
    [finding] = report["findings"]
    assert finding["kind"] == "config" and finding["what"] == str(config)
    assert "subscriptions[0].max_events" in finding["message"]


# ---- policy files and their tools ------------------------------------------------------------------


def test_a_broken_policy_file_is_a_policy_finding_naming_the_file(tmp_path: Path) -> None:
    config = write_config(tmp_path, policies={"10-bad.toml": '[[rules]]\nname = "x"\naction = "wake"\n'})
    code, report = check_json(config)
    assert code == 1
    [finding] = findings(report, "policy")
    assert finding["what"].endswith("10-bad.toml")
    assert "rule 'x'" in finding["message"] and "action" in finding["message"]
    text = runner.invoke(app, ["check", "-c", str(config)])
    assert text.exit_code == 1 and "10-bad.toml" in text.output and "config OK" not in text.output


RULE = """
[[rules]]
name = "ack"
action = "agent"
tools = {tools}
match.event = "ticket.*"
"""


def test_a_rule_tool_that_no_server_has_is_an_error_naming_rule_and_tool(tmp_path: Path) -> None:
    config = write_config(tmp_path, policies={"10-ack.toml": RULE.format(tools='["demo__get_tiket"]')})
    code, report = check_json(config)
    assert code == 1
    [finding] = findings(report, "tool")
    assert (finding["what"], finding["rule"], finding["severity"], finding["server"]) == (
        "demo__get_tiket",
        "ack",
        "error",
        "demo",
    )
    assert finding["file"].endswith("10-ack.toml") and finding["line"] == 2
    assert "did you mean 'demo__get_ticket'?" in finding["message"]


def test_a_rule_tool_on_a_server_that_is_not_configured_is_an_error(tmp_path: Path) -> None:
    config = write_config(tmp_path, policies={"10-ack.toml": RULE.format(tools='["github__*"]')})
    code, report = check_json(config)
    assert code == 1
    [finding] = findings(report, "tool")
    assert finding["what"] == "github__*"
    assert "names server 'github', which is not in [servers] (demo)" in finding["message"]


def test_rule_tools_that_exist_pass(tmp_path: Path) -> None:
    tools = '["demo__get_*", "demo__add_comment", "*__acknowledge_alert"]'
    code, report = check_json(write_config(tmp_path, policies={"10-ack.toml": RULE.format(tools=tools)}))
    assert code == 0, report
    assert findings(report, "tool") == []


def test_a_subscription_tool_glob_that_matches_nothing_is_a_warning(tmp_path: Path) -> None:
    config = write_config(tmp_path, TICKETS.replace("demo__get_ticket", "demo__get_tiket"))
    code, report = check_json(config)
    assert code == 0 and report["ok"] is True
    [finding] = findings(report, "tool")
    assert (finding["severity"], finding["subscription"], finding["what"]) == (
        "warning",
        "tickets",
        "demo__get_tiket",
    )


# ---- the store -----------------------------------------------------------------------------------


def test_a_store_that_cannot_be_created_is_a_store_finding(tmp_path: Path) -> None:
    (tmp_path / "not-a-folder").write_text("a file")
    code, report = check_json(write_config(tmp_path, store="not-a-folder/aw.db"))
    assert code == 1
    [finding] = findings(report, "store")
    assert finding["what"] == str(tmp_path / "not-a-folder" / "aw.db")
    assert "cannot be created" in finding["message"]


def test_a_store_path_that_is_a_folder_is_a_store_finding(tmp_path: Path) -> None:
    (tmp_path / "aw.db").mkdir()
    code, report = check_json(write_config(tmp_path))
    assert code == 1
    [finding] = findings(report, "store")
    assert "is a folder" in finding["message"]


def test_a_file_that_is_no_store_is_a_store_finding_and_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "aw.db").write_bytes(b"not a database at all, just bytes" * 100)
    before = (tmp_path / "aw.db").read_bytes()
    code, report = check_json(write_config(tmp_path))
    assert code == 1
    [finding] = findings(report, "store")
    assert "cannot be opened" in finding["message"]
    assert (tmp_path / "aw.db").read_bytes() == before


def test_a_new_store_is_not_created_by_check_but_its_folder_is_made(tmp_path: Path) -> None:
    code, report = check_json(write_config(tmp_path, store="data/deep/aw.db"))
    assert code == 0, report
    assert (tmp_path / "data" / "deep").is_dir()
    assert list((tmp_path / "data" / "deep").iterdir()) == []  # the scratch file is gone


def test_an_existing_store_keeps_its_data(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    store = SqliteCore.open(tmp_path / "aw.db")
    key = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "support"})
    store.register(key)
    store.ingest(key, [IncomingEvent("T-1", "ticket.created", "2026-01-01T00:00:00Z", {"a": 1})], "7")
    store.close()
    code, report = check_json(config)
    assert code == 0, report
    with sqlite3.connect(tmp_path / "aw.db") as db:
        assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 1
    inbox = runner.invoke(app, ["inbox", "--json", "-c", str(config)])
    assert [row["event_id"] for row in json.loads(inbox.stdout)] == ["T-1"]


# ---- the API key ---------------------------------------------------------------------------------


def test_an_unset_api_key_env_is_an_api_key_finding_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY, raising=False)
    config = write_config(tmp_path, agent=f'model = "openai/gpt-4o-mini"\napi_key_env = "{KEY}"')
    code, report = check_json(config)
    assert code == 1
    [finding] = findings(report, "api_key")
    assert finding["what"] == KEY and finding["severity"] == "error"
    assert f"{KEY} is not set" in finding["message"]
    monkeypatch.setenv(KEY, "sk-anything")
    code, report = check_json(config)
    assert code == 0, report


def test_the_offline_model_needs_no_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY, raising=False)
    config = write_config(tmp_path, agent=f'model = "agentwake/offline"\napi_key_env = "{KEY}"')
    code, report = check_json(config)
    assert code == 0, report
    assert findings(report, "api_key") == []


def test_without_api_key_env_the_providers_own_variable_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    code, report = check_json(write_config(tmp_path, agent='model = "anthropic/claude-3-5-haiku-latest"'))
    assert code == 1
    [finding] = findings(report, "api_key")
    assert finding["what"] == "ANTHROPIC_API_KEY"
    assert "ANTHROPIC_API_KEY" in finding["message"] and "api_key_env" in finding["message"]


def test_a_rules_model_needs_its_key_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GROQ_API_KEY", raising=False)
    rule = RULE.format(tools='["demo__get_ticket"]') + 'model = "groq/llama3-8b-8192"\n'
    code, report = check_json(write_config(tmp_path, policies={"10-ack.toml": rule}))
    assert code == 1
    [finding] = findings(report, "api_key")
    assert finding["what"] == "GROQ_API_KEY" and finding["model"] == "groq/llama3-8b-8192"


# ---- servers -------------------------------------------------------------------------------------


def test_an_unreachable_server_is_a_server_finding(tmp_path: Path) -> None:
    servers = '[servers.gone]\ncommand = "/nonexistent/server"\n'
    subs = '[[subscriptions]]\nserver = "gone"\nevent = "x"\n'
    code, report = check_json(write_config(tmp_path, subs, servers=servers))
    assert code == 1
    [finding] = findings(report, "server")
    assert finding["what"] == "gone" and "command not found" in finding["message"]
    [sub] = report["subscriptions"]
    assert sub["status"] == "server unreachable"


def test_a_server_without_mcp_events_fails_check_with_its_subscriptions_unsupported(
    tmp_path: Path,
) -> None:
    servers = f"""
[servers.mini]
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(REPO / "tests" / "minimal_server.py"))}]
env = {{ MINIMAL_CAPABILITY = "none" }}
"""
    subs = '[[subscriptions]]\nname = "ticks"\nserver = "mini"\nevent = "m.tick"\ntools = ["mini__echo"]\n'
    code, report = check_json(write_config(tmp_path, subs, servers=servers))
    assert code == 1
    [finding] = findings(report, "server")
    assert finding["what"] == "mini" and "does not implement MCP Events" in finding["message"]
    [sub] = report["subscriptions"]
    assert sub["status"] == "unsupported"
    # Its tools are still there for the agent: the glob matches, no tool finding.
    assert findings(report, "tool") == []


def test_an_unknown_event_is_a_subscription_finding(tmp_path: Path) -> None:
    code, report = check_json(write_config(tmp_path, TICKETS.replace("ticket.created", "ticket.exploded")))
    assert code == 1
    [finding] = findings(report, "subscription")
    assert finding["what"] == "tickets" and "ticket.exploded" in finding["message"]
    assert report["subscriptions"][0]["status"] == "invalid"


# ---- [service] ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("service", "what", "says"),
    [
        ('listen = "0.0.0.0:9464"', "listen", "reachable beyond this machine"),
        (
            'listen = "127.0.0.1:9464"\ntoken_env = "AGENTWAKE_TEST_UNSET_TOKEN"',
            "AGENTWAKE_TEST_UNSET_TOKEN",
            "not set",
        ),
    ],
)
def test_an_endpoint_run_would_refuse_is_a_service_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, service: str, what: str, says: str
) -> None:
    monkeypatch.delenv("AGENTWAKE_TEST_UNSET_TOKEN", raising=False)
    config = write_config(tmp_path, TICKETS + f"\n[service]\n{service}\n")
    code, report = check_json(config)
    assert code == 1 and report["ok"] is False
    [finding] = findings(report, "service")
    assert finding["what"] == what and says in finding["message"]


def test_a_loopback_endpoint_passes(tmp_path: Path) -> None:
    code, report = check_json(write_config(tmp_path, TICKETS + '\n[service]\nlisten = "127.0.0.1:9464"\n'))
    assert code == 0, report
    assert findings(report, "service") == []
