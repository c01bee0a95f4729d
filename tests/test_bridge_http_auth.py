"""A bridge's ``--http`` has no unlocked door: without ``--mcp-token-env`` it serves only a loopback
address, and only when told ``--no-auth``; its state dir is owner-only.

The command-line refusals are checked for every bridge in process (CliRunner); the rest runs real
``agentwake bridge github`` processes against agentwake/fakes/github.py, over real HTTP on loopback.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from _support import RunningService
from conftest import REPO
from typer.testing import CliRunner

from agentwake.bridges.framework import http_auth_problem, is_loopback, owner_only_dir
from agentwake.cli import app
from agentwake.config import ServerConfig
from agentwake.fakes.github import FakeGitHub
from agentwake.mcp import ServerConnection

pytestmark = pytest.mark.anyio

TOKEN = "gh-test-token-5f1c"
MCP_TOKEN = "mcp-bearer-9d27"
WAIT = 20.0
ACCEPT = {"Accept": "application/json, text/event-stream"}


@pytest.fixture
async def github() -> AsyncIterator[FakeGitHub]:
    async with FakeGitHub(token=TOKEN) as fake:
        fake.add_repo("acme/x")
        yield fake


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---- the rule, and every bridge's command line ----------------------------------------------------


def test_loopback_is_127_8_and_ipv6_1_and_localhost() -> None:
    for host in ("127.0.0.1", "127.1.2.3", "::1", "localhost", "LOCALHOST"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.1", "192.168.1.2", "example.com", "localhost.example.com", ""):
        assert not is_loopback(host), host


def test_http_without_a_token_needs_no_auth_and_a_loopback_address() -> None:
    assert http_auth_problem(None, has_token=False, no_auth=False) is None
    assert http_auth_problem("0.0.0.0:8780", has_token=True, no_auth=False) is None
    assert http_auth_problem("127.0.0.1:8780", has_token=False, no_auth=True) is None
    assert http_auth_problem("[::1]:8780", has_token=False, no_auth=True) is None
    assert http_auth_problem("localhost:8780", has_token=False, no_auth=True) is None
    for http, has_token, no_auth, needle in (
        ("127.0.0.1:8780", False, False, "--no-auth"),
        ("0.0.0.0:8780", False, True, "not a loopback address"),
        ("[::]:8780", False, False, "not a loopback address"),
        ("bridge.internal:8780", False, True, "not a loopback address"),
        ("127.0.0.1:8780", True, True, "exclude each other"),
        (None, False, True, "--no-auth is for --http"),
    ):
        problem = http_auth_problem(http, has_token=has_token, no_auth=no_auth)
        assert problem is not None and needle in problem, (http, has_token, no_auth, problem)


@pytest.mark.parametrize("bridge", ["github", "slack", "pagerduty"])
def test_every_bridge_refuses_an_open_http_with_one_error_line(tmp_path: Path, bridge: str) -> None:
    env: dict[str, str | None] = {"BRIDGE_MCP_TOKEN": MCP_TOKEN, "AGENTWAKE_BRIDGE_HTTP": None}
    cases: list[tuple[list[str], dict[str, str | None], list[str]]] = [
        (["--http", "127.0.0.1:0"], env, ["--mcp-token-env", "--no-auth"]),
        ([], {**env, "AGENTWAKE_BRIDGE_HTTP": "127.0.0.1:0"}, ["--mcp-token-env", "--no-auth"]),
        (["--http", "0.0.0.0:0", "--no-auth"], env, ["0.0.0.0:0", "loopback", "--mcp-token-env"]),
        (["--http", "0.0.0.0:0"], env, ["loopback", "--mcp-token-env"]),
        (["--http", "[::]:0", "--no-auth"], env, ["loopback"]),
        (["--http", "127.0.0.1:0", "--no-auth", "--mcp-token-env", "BRIDGE_MCP_TOKEN"], env, ["--no-auth"]),
        (["--no-auth"], env, ["--no-auth", "--http"]),
    ]
    for args, environment, named in cases:
        result = CliRunner().invoke(
            app, ["bridge", bridge, "--state-dir", str(tmp_path / "state"), *args], env=environment
        )
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert result.exit_code == 2 and len(errors) == 1, (args, result.output)
        for needle in named:
            assert needle in errors[0], (args, result.output)
        assert MCP_TOKEN not in result.output
    assert not (tmp_path / "state").exists()

    help_text = CliRunner().invoke(app, ["bridge", bridge, "--help"], env={"COLUMNS": "200"}).output
    assert "--no-auth" in help_text and "loopback" in help_text


def test_the_state_dir_is_made_owner_only_and_an_open_one_is_tightened(tmp_path: Path) -> None:
    fresh = tmp_path / "a" / "state"
    owner_only_dir(fresh)
    assert mode_of(fresh) == 0o700
    opened = tmp_path / "opened"
    opened.mkdir()
    opened.chmod(0o775)
    owner_only_dir(opened)
    assert mode_of(opened) == 0o700
    owner_only_dir(opened)  # a second time changes nothing
    assert mode_of(opened) == 0o700


# ---- real processes ---------------------------------------------------------------------------------


def bridge_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentwake.cli", "bridge", "github", *args]


def bridge_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "GITHUB_TOKEN": TOKEN, **extra}
    env.pop("AGENTWAKE_BRIDGE_HTTP", None)
    return env


@asynccontextmanager
async def serving(args: list[str], env: dict[str, str]) -> AsyncIterator[tuple[RunningService, str]]:
    """``agentwake bridge github`` serving MCP over HTTP; its process and MCP URL. Killed on the way out."""
    process = await anyio.open_process(bridge_command(*args), cwd=REPO, env=env)
    running = RunningService(process)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(running._read)
            try:
                line = running.lines[await running.wait_for("bridge: MCP on http://", timeout=WAIT)]
                yield running, line.split(" on ", 1)[1].strip()
            finally:
                if process.returncode is None:
                    process.kill()
                with anyio.CancelScope(shield=True), anyio.fail_after(30):
                    await process.wait()
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await process.aclose()


async def refused(args: list[str]) -> subprocess.CompletedProcess[bytes]:
    with anyio.fail_after(WAIT):
        return await anyio.run_process(bridge_command(*args), cwd=REPO, env=bridge_env(), check=False)


@pytest.mark.slow
async def test_http_without_a_token_exits_2_and_with_no_auth_serves_loopback(
    tmp_path: Path, github: FakeGitHub
) -> None:
    state = tmp_path / "state"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        # The port is taken: a bridge that tried to bind would fail another way, not with the refusal.
        for args, needle in (
            (["--http", f"127.0.0.1:{port}"], "pass --mcp-token-env VAR, or --no-auth"),
            (["--http", f"0.0.0.0:{port}", "--no-auth"], f"--http 0.0.0.0:{port} is not a loopback address"),
        ):
            done = await refused(["--state-dir", str(state), "--api-base", github.url, *args])
            stderr = done.stderr.decode()
            errors = [line for line in stderr.splitlines() if line.startswith("error:")]
            assert done.returncode == 2, stderr
            assert len(errors) == 1 and needle in errors[0], stderr
            assert "MCP on" not in stderr and "in use" not in stderr, stderr
    assert not state.exists()

    state.mkdir()
    state.chmod(0o755)  # made by an older version
    args = ["--state-dir", str(state), "--api-base", github.url, "--http", "127.0.0.1:0", "--no-auth"]
    async with serving(args, bridge_env()) as (running, url):
        assert url.startswith("http://127.0.0.1:")
        assert mode_of(state) == 0o700
        issue = github.open_issue("acme/x", title="served without a token, on loopback")
        async with ServerConnection("github", ServerConfig(url=url)) as conn:
            result = await conn.call_tool(
                "get_issue", {"repository": "acme/x", "number": issue["number"]}, timeout_s=WAIT
            )
            assert not result.is_error, result
        assert any("tightened" in line or "owner only" in line for line in running.lines), running.log()


@pytest.mark.slow
async def test_with_a_token_an_anonymous_tools_call_is_401_and_an_authorised_one_works(
    tmp_path: Path, github: FakeGitHub
) -> None:
    state = tmp_path / "fresh" / "state"
    args = [
        "--state-dir",
        str(state),
        "--api-base",
        github.url,
        "--http",
        "127.0.0.1:0",
        "--mcp-token-env",
        "BRIDGE_MCP_TOKEN",
        "--allow-tool",
        "close_issue",
    ]
    issue = github.open_issue("acme/x", title="do not close me anonymously")
    close: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "close_issue", "arguments": {"repository": "acme/x", "number": issue["number"]}},
    }
    async with serving(args, bridge_env(BRIDGE_MCP_TOKEN=MCP_TOKEN)) as (_, url):
        assert mode_of(state) == 0o700
        async with httpx.AsyncClient() as http:
            for headers in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": MCP_TOKEN}):
                answer = await http.post(url, json=close, headers={**ACCEPT, **headers})
                assert answer.status_code == 401, (headers, answer.text)
        assert github.calls("PATCH") == []
        assert github.issue("acme/x", issue["number"])["state"] == "open"

        config = ServerConfig(url=url, headers={"Authorization": f"Bearer {MCP_TOKEN}"})
        async with ServerConnection("github", config) as conn:
            result = await conn.call_tool(
                "close_issue", {"repository": "acme/x", "number": issue["number"]}, timeout_s=WAIT
            )
            assert not result.is_error, result
        assert github.calls("PATCH")[-1].json == {"state": "closed", "state_reason": "completed"}
        assert github.issue("acme/x", issue["number"])["state"] == "closed"
