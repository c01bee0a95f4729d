"""Read-only commands need no secrets: an unset ${VAR} in a server's headers or env does not stop
`status`, `inbox`, `actions`, `show`, `approvals` or `policy check`; the commands that talk to
servers (`run`, `check`, `events`, `replay`) still refuse it at once, naming the variable.

Each command runs through the real CLI on a real config file and a real SQLite store.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import REPO
from typer.testing import CliRunner

from agentwake.cli import app
from agentwake.config import load_config
from agentwake.errors import ConfigError
from agentwake.store import IncomingEvent, SubscriptionKey
from agentwake.store.sqlite import SqliteCore

runner = CliRunner()
TOKEN = "WEBHOOK_DEMO_TOKEN"
SECRET = "AGENTWAKE_TEST_LOCAL_SECRET"
URL = "AGENTWAKE_TEST_HOOKS_URL"

POLICY = """
[[rules]]
name = "everything"
action = "log"
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in (TOKEN, SECRET, URL):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "10-all.toml").write_text(POLICY)
    path = tmp_path / "agentwake.toml"
    path.write_text(
        f"""
[store]
path = "aw.db"

[agent]
model = "agentwake/offline"
prompts = {json.dumps(str(REPO / "prompts"))}

[servers.hooks]
url = "http://127.0.0.1:9/mcp"
headers = {{ Authorization = "Bearer ${{{TOKEN}}}" }}

[servers.later]
url = "${{{URL}}}"

[servers.local]
command = {json.dumps(sys.executable)}
args = ["-m", "examples.demo_server"]
env = {{ DEMO_TOKEN = "${{{SECRET}}}", DEMO_RATE = "${{AGENTWAKE_TEST_RATE:-0}}" }}

[[subscriptions]]
name = "tickets"
server = "hooks"
event = "ticket.created"
"""
    )
    store = SqliteCore.open(tmp_path / "aw.db")
    key = SubscriptionKey("tickets", "hooks", "ticket.created", {})
    store.register(key)
    store.ingest(key, [IncomingEvent("T-000001", "ticket.created", "2026-01-01T00:00:00Z", {"a": 1})], "1")
    store.close()
    return path


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["status", "--json"],
        ["inbox"],
        ["inbox", "--json"],
        ["actions"],
        ["show", "T-000001"],
        ["approvals"],
        ["policy", "check"],
    ],
    ids=lambda c: " ".join(c),
)
def test_a_read_only_command_works_with_an_unset_variable_in_a_server(
    config: Path, command: list[str]
) -> None:
    result = runner.invoke(app, [*command, "-c", str(config)])
    assert result.exit_code == 0, result.output
    assert "is not set" not in result.output


def test_show_and_inbox_still_find_the_event(config: Path) -> None:
    inbox = runner.invoke(app, ["inbox", "--json", "-c", str(config)])
    assert [row["event_id"] for row in json.loads(inbox.stdout)] == ["T-000001"]
    show = runner.invoke(app, ["show", "T-000001", "-c", str(config)])
    assert "ticket.created from hooks" in flat(show.output)


def test_policy_check_lists_the_rules(config: Path) -> None:
    result = runner.invoke(app, ["policy", "check", "-c", str(config)])
    assert result.exit_code == 0, result.output
    assert "everything" in result.output


def test_deny_is_not_stopped_by_a_servers_secret(config: Path) -> None:
    # Nothing is held, so deny refuses; but for that reason, not for the server's secret.
    result = runner.invoke(app, ["deny", "T-000001", "-c", str(config)])
    assert "is not set" not in result.output


@pytest.mark.parametrize(
    "command",
    [["run"], ["check"], ["check", "--json"], ["events"], ["replay", "T-000001"]],
    ids=lambda c: " ".join(c),
)
def test_a_command_that_talks_to_servers_refuses_the_unset_variable_at_once(
    config: Path, command: list[str]
) -> None:
    result = runner.invoke(app, [*command, "-c", str(config)])
    assert result.exit_code == 2, result.output
    assert f"uses ${{{TOKEN}}}, but {TOKEN} is not set" in flat(result.output)


def test_once_set_the_variables_reach_the_server_config(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN, "t0ken")
    monkeypatch.setenv(SECRET, "s3cret")
    monkeypatch.setenv(URL, "http://127.0.0.1:9/other")
    cfg = load_config(config)
    assert cfg.servers["hooks"].headers == {"Authorization": "Bearer t0ken"}
    assert cfg.servers["local"].env["DEMO_TOKEN"] == "s3cret"
    assert cfg.servers["later"].url == "http://127.0.0.1:9/other"


def test_without_secrets_unset_placeholders_stay_as_written(config: Path) -> None:
    with pytest.raises(ConfigError, match=f"servers.hooks.headers.Authorization uses \\${{{TOKEN}}}"):
        load_config(config)
    cfg = load_config(config, secrets=False)
    assert cfg.servers["hooks"].headers == {"Authorization": f"Bearer ${{{TOKEN}}}"}
    assert cfg.servers["later"].url == f"${{{URL}}}"
    assert cfg.servers["local"].env == {"DEMO_TOKEN": f"${{{SECRET}}}", "DEMO_RATE": "0"}


def test_without_secrets_other_sections_still_need_their_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTWAKE_TEST_POLICY_DIR", raising=False)
    path = tmp_path / "agentwake.toml"
    path.write_text('[policy]\ndir = "${AGENTWAKE_TEST_POLICY_DIR}"\n')
    with pytest.raises(ConfigError, match=r"policy\.dir uses"):
        load_config(path, secrets=False)
    result = runner.invoke(app, ["policy", "check", "-c", str(path)])
    assert result.exit_code == 2 and "AGENTWAKE_TEST_POLICY_DIR is not set" in flat(result.output)
