"""A server that offers events and no tools still gets its events run, and a stop stays prompt.

A real `agentwake run` against tests/minimal_server.py over stdio (hand-written JSON-RPC) and the
in-test fake LLM. The server declares no tools capability (MINIMAL_TOOLS=none), or declares it but
refuses tools/list (MINIMAL_TOOLS=refuse): either way its events reach agent runs (the agent gets
no tools), nothing waits for the server's tools, and tools/list is never sent to a server that
declares no tools. A run whose allowed tools are on a server that never connects waits for it,
but a SIGTERM does not wait for that. Waits are on a log line or a file, under a deadline.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from _support import agentwake_run, fake_agent_toml, read_db, start_from_cursor, until_rows
from conftest import REPO
from fake_llm import FakeLLM

from agentwake.config import OFFLINE_MODEL

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MINIMAL = REPO / "tests" / "minimal_server.py"
EVENTS = ("m-1", "m-2", "m-3")
# A stop must end well within this (the default stop_timeout_s and connect_timeout_s are 30 s).
PROMPT_S = 10.0


def write_config(
    tmp_path: Path, llm_url: str, tools_mode: str, *, tools: str = "", extra: str = "", offline: bool = False
) -> Path:
    """``offline``: the agent's model is agentwake/offline, so no litellm import is under way when a
    test signals the service early (that import, seconds long on a busy machine, is not cancellable)."""
    path = tmp_path / "agentwake.toml"
    agent = fake_agent_toml(llm_url, llm_retries=0, concurrency=2, timeout_s=60)
    if offline:
        agent = agent.replace('model = "openai/fake"', f"model = {json.dumps(OFFLINE_MODEL)}")
    env = {"MINIMAL_LOG": str(tmp_path / "requests.log"), "MINIMAL_TOOLS": tools_mode, "MINIMAL_EVENTS": "3"}
    env_toml = ", ".join(f"{key} = {json.dumps(value)}" for key, value in env.items())
    path.write_text(
        f"""
[store]
path = "aw.db"

{agent}
[servers.ts]
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(MINIMAL))}]
cwd = {json.dumps(str(tmp_path))}
env = {{ {env_toml} }}
{extra}
[[subscriptions]]
name = "ticks"
server = "ts"
event = "m.tick"
poll_floor_ms = 100
{tools}
"""
    )
    start_from_cursor(path)  # cursor "0": the server's three events are delivered
    return path


def requests(tmp_path: Path) -> list[str]:
    log = tmp_path / "requests.log"
    return [json.loads(line)["method"] for line in log.read_text().splitlines()] if log.exists() else []


async def stop_promptly(service: Any) -> None:
    started = anyio.current_time()
    try:
        code = await service.stop(signal.SIGTERM, timeout=PROMPT_S)
    except TimeoutError:
        raise AssertionError(f"no exit within {PROMPT_S:g}s of SIGTERM:\n{service.log()}") from None
    assert code == 0, service.log()
    assert anyio.current_time() - started < PROMPT_S


async def test_an_events_only_server_gets_its_events_run_and_a_stop_is_prompt(tmp_path: Path) -> None:
    async with FakeLLM() as fake:
        config = write_config(tmp_path, fake.url, "none")
        async with agentwake_run(config, FAKE_LLM_KEY="sk-test") as service:
            for event_id in EVENTS:
                await service.wait_for(f"agent: event {event_id} (ticks) run ", " completed in ", timeout=60)
            await stop_promptly(service)
    log = "\n".join(service.lines)
    assert "its tools are allowed" not in log, log
    assert "tools are not available" not in log, log
    assert "server ts: offers no tools" in log, log
    # No tools capability: it is asked nothing about tools.
    assert "tools/list" not in requests(tmp_path)
    rows = read_db(tmp_path / "aw.db", "SELECT event_id, state FROM events ORDER BY event_id")
    assert rows == [(event_id, "done") for event_id in EVENTS]


async def test_a_refused_tools_list_leaves_the_agent_without_them_not_waiting(tmp_path: Path) -> None:
    async with FakeLLM() as fake:
        config = write_config(tmp_path, fake.url, "refuse", tools='tools = ["ts__*"]')
        async with agentwake_run(config, FAKE_LLM_KEY="sk-test") as service:
            await service.wait_for("server ts: cannot list its tools", "the agent gets none of them")
            for event_id in EVENTS:
                await service.wait_for(f"agent: event {event_id} (ticks) run ", " completed in ", timeout=60)
            await stop_promptly(service)
    assert "tools/list" in requests(tmp_path)
    assert "tools are not available" not in "\n".join(service.lines)


async def test_a_stop_does_not_wait_for_a_server_whose_tools_a_run_needs(tmp_path: Path) -> None:
    # The run may use the tools of "gone", which never connects (its command exits at once).
    gone = f"""
[servers.gone]
command = {json.dumps(sys.executable)}
args = ["-c", "raise SystemExit(3)"]
connect_timeout_s = 30
"""
    async with FakeLLM() as fake:
        config = write_config(
            tmp_path, fake.url, "none", tools='tools = ["gone__*"]', extra=gone, offline=True
        )
        async with agentwake_run(config, FAKE_LLM_KEY="sk-test") as service:
            await service.wait_for("waiting up to 30s for server gone to connect (its tools are allowed)")
            await stop_promptly(service)
    # The events went back to pending: nothing ran them.
    rows = await until_rows(
        tmp_path / "aw.db",
        "SELECT state FROM events",
        lambda rows: len(rows) >= 1,
        service,
    )
    assert all(state == "pending" for (state,) in rows), rows
