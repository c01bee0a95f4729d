"""Short looks start the bridges without ingress (AGENTWAKE_NO_INGRESS=1).

`agentwake check`, `events` and `policy test` start each stdio server for a moment, beside a
service that may be running with the same config. A bridge started so must not bind its --listen
port (the service's bridge holds it), open Socket Mode (Slack would hand that connection events
meant for the service) or poll: here the port is held by a socket of the test's, and the fake
Slack records every Socket Mode connection and API call.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from _support import bridge_server_toml
from conftest import REPO

from agentwake.fakes.slack import FakeSlack

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SECRET_ENV = {"GITHUB_WEBHOOK_SECRET": "dev-secret", "GITHUB_TOKEN": "test-token"}


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port bound and listened on by this test, as a running bridge would hold it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def config_with(tmp_path: Path, servers: str, subscriptions: str) -> Path:
    policies = tmp_path / "policies"
    policies.mkdir()
    config = tmp_path / "agentwake.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path / "aw.db"}"\n\n'
        '[agent]\nmodel = "agentwake/offline"\n\n'
        f'[policy]\ndir = {json.dumps(str(policies))}\ndefault = "agent"\n\n' + servers + subscriptions
    )
    return config


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentwake.cli", *args]


def cli_env(**env: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "LITELLM_LOCAL_MODEL_COST_MAP": "True", **env}


def github_config(tmp_path: Path, port: int) -> Path:
    server = bridge_server_toml(
        "github",
        tmp_path / "bridge",
        ["--listen", f"127.0.0.1:{port}", "--api-base", "http://127.0.0.1:9"],
        ["GITHUB_WEBHOOK_SECRET", "GITHUB_TOKEN"],
    )
    subscription = (
        '[[subscriptions]]\nname = "issues"\nserver = "github"\nevent = "issues.opened"\n'
        'arguments = { repository = "acme/demo" }\ntools = ["github__comment"]\n'
    )
    return config_with(tmp_path, server, subscription)


def test_check_passes_while_the_listen_port_is_held(tmp_path: Path, held_port: int) -> None:
    config = github_config(tmp_path, held_port)
    done = subprocess.run(
        cli("check", "-c", str(config)),
        cwd=tmp_path,
        env=cli_env(**SECRET_ENV),
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "config OK" in " ".join(said.split())
    assert "in use" not in said


def test_policy_test_and_events_start_the_bridge_without_its_listener(tmp_path: Path, held_port: int) -> None:
    config = github_config(tmp_path, held_port)
    sample = tmp_path / "event.json"
    sample.write_text(json.dumps({"name": "issues.opened", "data": {"repository": "acme/demo", "number": 1}}))
    done = subprocess.run(
        cli("policy", "test", str(sample), "-c", str(config), "--subscription", "issues"),
        cwd=tmp_path,
        env=cli_env(**SECRET_ENV),
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "matching tools: github__comment" in said, said
    assert "unreachable" not in said and "in use" not in said
    listed = subprocess.run(
        cli("events", "github", "-c", str(config), "--json"),
        cwd=tmp_path,
        env=cli_env(**SECRET_ENV),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "issues.opened" in {d["name"] for d in json.loads(listed.stdout)}


async def test_check_opens_no_socket_mode_connection(tmp_path: Path, held_port: int) -> None:
    async with FakeSlack() as slack:
        server = bridge_server_toml(
            "slack",
            tmp_path / "bridge",
            ["--listen", f"127.0.0.1:{held_port}", "--socket-mode", "--api-base", slack.url],
            ["SLACK_SIGNING_SECRET", "SLACK_BOT_TOKEN", "SLACK_APP_TOKEN"],
        )
        subscription = (
            '[[subscriptions]]\nname = "mentions"\nserver = "slack"\nevent = "app_mention"\n'
            'tools = ["slack__reply_in_thread"]\n'
        )
        config = config_with(tmp_path, server, subscription)
        env = cli_env(
            SLACK_SIGNING_SECRET=slack.signing_secret,
            SLACK_BOT_TOKEN=slack.bot_token,
            SLACK_APP_TOKEN=slack.app_token,
        )
        done = await anyio.run_process(cli("check", "-c", str(config)), cwd=tmp_path, env=env, check=False)
        said = done.stdout.decode() + done.stderr.decode()
        assert done.returncode == 0, said
        assert "config OK" in " ".join(said.split())
        assert slack.connections == []
        assert slack.calls("apps.connections.open") == []
