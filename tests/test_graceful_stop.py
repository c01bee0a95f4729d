"""A stop signal lets running agent runs finish, for at most [service] stop_timeout_s.

A real `agentwake run` (the demo server over stdio, the in-test fake LLM). The run is held
in its LLM call when SIGTERM arrives: released in time, it completes and the service exits
0; not released, it is cut short at the deadline, and its attempt is not counted.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Final

import pytest
from _support import agentwake_run, demo_server_toml, fake_agent_toml, start_from_cursor
from fake_llm import FakeLLM, hold, text

from agentwake.store.sqlite import SqliteCore

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TICKET: Final = "T-000001"


def write_config(tmp_path: Path, llm_url: str, stop_timeout_s: float) -> Path:
    path = tmp_path / "agentwake.toml"
    path.write_text(
        f"""
[store]
path = "aw.db"

[service]
stop_timeout_s = {stop_timeout_s}

{fake_agent_toml(llm_url, llm_retries=0, concurrency=1, timeout_s=60)}
{demo_server_toml(tmp_path / "demo.db", DEMO_BACKLOG="1")}
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
poll_floor_ms = 100
"""
    )
    start_from_cursor(path)
    return path


def stored(tmp_path: Path) -> dict[str, Any]:
    store = SqliteCore.open(tmp_path / "aw.db")
    try:
        [event] = store.find_events(TICKET)
    finally:
        store.close()
    return event


async def test_a_run_in_flight_finishes_before_the_service_exits(tmp_path: Path) -> None:
    async with FakeLLM() as fake:
        config = write_config(tmp_path, fake.url, stop_timeout_s=30)
        fake.script(hold(), text("done: triaged"))
        async with agentwake_run(config, FAKE_LLM_KEY="sk-test") as service:
            await fake.wait_for_requests(1)
            service.process.send_signal(signal.SIGTERM)
            await service.wait_for("waiting up to 30s for 1 event(s) being handled")
            fake.release()
            await service.wait_for(f"agent: event {TICKET} (tickets) run 1 completed")
            assert await service.stop(signal.SIGTERM) == 0, service.log()  # the second signal: at once
    event = stored(tmp_path)
    assert (event["state"], event["attempts"]) == ("done", 1)
    assert [r["status"] for r in event["runs"]] == ["completed"]


async def test_a_run_past_the_deadline_is_cut_short_and_its_attempt_not_counted(tmp_path: Path) -> None:
    async with FakeLLM() as fake:
        config = write_config(tmp_path, fake.url, stop_timeout_s=0.5)
        fake.script(hold())
        async with agentwake_run(config, FAKE_LLM_KEY="sk-test") as service:
            await fake.wait_for_requests(1)
            service.process.send_signal(signal.SIGTERM)
            await service.wait_for("1 event(s) still being handled after 0.5s")
            with_code = await service.stop(signal.SIGTERM)
        assert with_code == 0, service.log()
    event = stored(tmp_path)
    assert (event["state"], event["attempts"]) == ("pending", 0)
    [run] = event["runs"]
    assert (run["status"], run["reason"]) == ("interrupted", "the service stopped during the run")
