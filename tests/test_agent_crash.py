"""kill -9 around an agent run: an interrupted run goes again once, a completed one never does.

`agentwake run` is a real subprocess (demo server over stdio, litellm over loopback HTTP);
the fake LLM runs in the test process, so the test sees each request as it arrives.
"""

from __future__ import annotations

import random
import signal
import sqlite3
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from _support import RunningService, agentwake_run, demo_server_toml, fake_agent_toml, start_from_cursor
from fake_llm import FakeLLM, hold, text, tool_calls

from agentwake.store.sqlite import SqliteCore
from examples.demo_server import TicketStore, random_ticket

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TICKET: Final = "T-000001"
LATER_TICKET: Final = "T-000002"
COMMENT: Final = "category: login, urgency: high"
# litellm's import alone takes several seconds on a cold start.
START_TIMEOUT_S: Final = 45.0


def run_line(ticket: str) -> str:
    """The start of the line logged when a run of this ticket ends, completed or failed."""
    return f"agent: event {ticket} (tickets) run"


@dataclass
class Paths:
    config: Path
    store: Path
    demo: Path


def write_config(tmp_path: Path, llm_url: str) -> Paths:
    demo_db = tmp_path / "demo.db"
    path = tmp_path / "agentwake.toml"
    # concurrency 1: runs happen one after another, oldest event first, so "a later event ran"
    # proves that anything claimed before it has finished.
    path.write_text(
        f"""
[store]
path = "aw.db"

[log]
level = "INFO"

{fake_agent_toml(llm_url, attempt_backoff_s=0, llm_retries=0, concurrency=1, timeout_s=30)}
{demo_server_toml(demo_db, DEMO_BACKLOG="1")}
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
poll_floor_ms = 100
tools = ["demo__add_comment"]
"""
    )
    return Paths(path, start_from_cursor(path), demo_db)


def service(paths: Paths) -> AbstractAsyncContextManager[RunningService]:
    """A real `agentwake run` on the scenario's config, its stderr collected line by line."""
    return agentwake_run(paths.config, FAKE_LLM_KEY="sk-test")


def stored_event(paths: Paths, event_id: str) -> dict[str, Any]:
    store = SqliteCore.open(paths.store)
    try:
        [event] = store.find_events(event_id)
    finally:
        store.close()
    return event


def comments(paths: Paths, ticket: str) -> list[str]:
    db = sqlite3.connect(paths.demo)
    try:
        rows = db.execute("SELECT body FROM comments WHERE ticket_id = ? ORDER BY id", [ticket]).fetchall()
    finally:
        db.close()
    return [row[0] for row in rows]


def mentions(request: dict[str, Any], ticket: str) -> bool:
    return any(ticket in str(message.get("content") or "") for message in request["messages"])


def tool_names(request: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in request.get("tools") or []]


@dataclass
class Outcome:
    """What one crash scenario left behind, for the tests to check."""

    paths: Paths
    requests: list[dict[str, Any]]
    restart_log: list[str]
    state_after_kill: dict[str, Any]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    # Module scope, so the crash scenario below runs once for the tests that check it.
    return "asyncio"


@pytest.fixture(scope="module")
async def killed_mid_run(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    """SIGKILL while the first run waits for the LLM; restart; the rerun comments, then answers."""
    async with FakeLLM() as fake:
        paths = write_config(tmp_path_factory.mktemp("killed-mid-run"), fake.url)
        fake.script(hold())  # the first run's LLM call never answers: the kill lands mid-run
        async with service(paths) as first:
            await fake.wait_for_requests(1)
            assert await first.stop(signal.SIGKILL) == -signal.SIGKILL
        state_after_kill = stored_event(paths, TICKET)

        fake.script(
            tool_calls(("demo__add_comment", {"ticket_id": TICKET, "body": COMMENT})),
            text("done: commented"),
        )
        async with service(paths) as second:
            await second.wait_for(run_line(TICKET), "completed")
            assert await second.stop(signal.SIGTERM) == 0, second.log()
        return Outcome(paths, list(fake.requests), second.lines, state_after_kill)


async def test_sigkill_during_a_run_runs_the_event_once_more_after_restart(killed_mid_run: Outcome) -> None:
    outcome = killed_mid_run
    # The kill left the event claimed and its run open, as a crash does.
    assert outcome.state_after_kill["state"] == "processing"
    assert [r["status"] for r in outcome.state_after_kill["runs"]] == ["running"]
    assert any("1 event(s) interrupted by a previous stop" in line for line in outcome.restart_log)

    event = stored_event(outcome.paths, TICKET)
    assert event["state"] == "done"
    assert event["attempts"] == 2
    runs = event["runs"]
    assert [(r["kind"], r["status"], r["attempt"]) for r in runs] == [
        ("agent", "interrupted", 1),
        ("agent", "completed", 2),
    ]
    assert runs[0]["reason"] == "the service stopped during the run"
    assert runs[0]["tool_calls"] == []
    [call] = runs[1]["tool_calls"]  # the rerun's one call, recorded once
    assert (call["tool"], call["arguments"]) == ("demo__add_comment", {"ticket_id": TICKET, "body": COMMENT})
    assert runs[1]["messages"][-1] == {"role": "assistant", "content": "done: commented"}
    # The held call, then the rerun's two steps; all about this ticket.
    assert len(outcome.requests) == 3
    assert all(mentions(request, TICKET) for request in outcome.requests)
    assert comments(outcome.paths, TICKET) == [COMMENT]


async def test_the_rerun_after_a_restart_may_use_the_subscription_tools(killed_mid_run: Outcome) -> None:
    outcome = killed_mid_run
    [_, rerun] = stored_event(outcome.paths, TICKET)["runs"]
    assert rerun["decision"]["tools"] == ["demo__add_comment"]
    assert tool_names(outcome.requests[1]) == ["demo__add_comment"]
    assert [c["status"] for c in rerun["tool_calls"]] == ["ok"]
    assert comments(outcome.paths, TICKET) == [COMMENT]


async def test_sigkill_after_a_completed_run_does_not_run_the_event_again(tmp_path: Path) -> None:
    async with FakeLLM() as fake:
        paths = write_config(tmp_path, fake.url)
        fake.script(text("nothing to do"))
        async with service(paths) as first:
            await first.wait_for(run_line(TICKET), "completed")
            assert await first.stop(signal.SIGKILL) == -signal.SIGKILL
        assert len(fake.requests) == 1

        # A later ticket, made while the service is down: the restart polls it from the stored cursor.
        # With concurrency 1 and oldest-first claims, any rerun of the first ticket would come before it.
        tickets = TicketStore(paths.demo)
        try:
            assert tickets.create([random_ticket(random.Random(7))]) == [LATER_TICKET]
        finally:
            tickets.close()
        fake.script(text("nothing to do either"))
        async with service(paths) as second:
            await second.wait_for(run_line(LATER_TICKET), "completed")
            assert await second.stop(signal.SIGTERM) == 0, second.log()
        assert not [line for line in second.lines if "interrupted by a previous stop" in line]
        assert not [line for line in second.lines if run_line(TICKET) in line]

    event = stored_event(paths, TICKET)
    assert event["state"] == "done"
    assert event["attempts"] == 1
    assert [(r["kind"], r["status"], r["attempt"]) for r in event["runs"]] == [("agent", "completed", 1)]
    later = stored_event(paths, LATER_TICKET)
    assert (later["state"], [r["status"] for r in later["runs"]]) == ("done", ["completed"])
    # One request per event; none of the restart's is about the first ticket.
    assert len(fake.requests) == 2
    assert mentions(fake.requests[0], TICKET)
    assert mentions(fake.requests[1], LATER_TICKET) and not mentions(fake.requests[1], TICKET)
