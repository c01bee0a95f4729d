"""Limits that change live, and `agentwake limits`: each limit with what counts against it now.

The store's view is read on both backends; the command runs in process (typer's runner) on a real
SQLite store; the reload end to end is a real `agentwake run` against the demo server over stdio and
the fake LLM on loopback, whose config file is edited while it runs.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from _stores import backend_fixture, store_fixture  # noqa: F401 - the fixtures backend, store
from _support import agentwake_run, demo_server_toml, fake_agent_toml, start_from_cursor
from fake_llm import FakeLLM, hold, text
from typer.testing import CliRunner

from agentwake.cli import app
from agentwake.demo.store import TicketStore
from agentwake.store import FlowGate, IncomingEvent, RunProgress, Store, SubscriptionKey

pytestmark = pytest.mark.anyio

TIMESTAMP = "2026-12-01T00:00:00Z"
HOUR_AGO, DAY_AGO = "2000-01-01T00:00:00Z", "2000-01-01T00:00:00Z"
WAIT_S = 90  # a hang guard on a busy machine, not a speed measure


async def test_the_store_counts_runs_spend_events_in_hand_slots_and_rate_marks(store: Store) -> None:
    key = SubscriptionKey("tickets", "demo", "ticket.created", {})
    await store.register(key)
    ids = ["T-1", "T-2", "T-3"]
    await store.ingest(key, [IncomingEvent(i, "ticket.created", TIMESTAMP, {"n": i}) for i in ids], "1")
    claimed = await store.claim(3)
    first = claimed[0]
    run = await store.start_run(
        first.id,
        kind="agent",
        attempt=1,
        model="openai/fake",
        decision={"action": "agent"},
        system_prompt=None,
        user_prompt=None,
    )
    await store.record_progress(run, RunProgress([], 1, 10, 5, 0.25), [])
    assert await store.take_rule_slot(first.id, "triage", 2, TIMESTAMP)
    gate = FlowGate(now=TIMESTAMP, rate_key="svc-a", rate_since=HOUR_AGO, rate_max=5)
    for event in claimed[1:]:
        await store.flow_gate(event.id, "paging", {"action": "agent"}, gate)

    use = await store.limit_use(HOUR_AGO, DAY_AGO, {"paging": HOUR_AGO, "quiet": HOUR_AGO})
    assert use == {
        "runs_last_hour": 1,
        "cost_last_day_usd": 0.25,
        "handled": 3,
        "handled_by_server": {"demo": 3},
        "slots_by_rule": {"triage": 1},
        "rate_by_rule": {"paging": {"key": "svc-a", "used": 2}, "quiet": {"key": None, "used": 0}},
    }


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def project(tmp_path: Path, llm_url: str, *, concurrency: int, extra: str = "") -> Path:
    (tmp_path / "policies").mkdir(exist_ok=True)
    (tmp_path / "policies" / "rules.toml").write_text(
        "[[rules]]\n"
        'name = "triage"\n'
        'action = "agent"\n'
        "max_concurrent = 4\n"
        'rate_limit = { max = 30, window_s = 3600, key = "data.queue" }\n'
        'match.event = "ticket.created"\n'
    )
    config = tmp_path / "agentwake.toml"
    config.write_text(
        '[store]\npath = "aw.db"\n\n[policy]\ndir = "policies"\n\n'
        + fake_agent_toml(llm_url, llm_retries=0, concurrency=concurrency, max_runs_per_hour=100)
        + extra
        + "\n"
        + demo_server_toml(tmp_path / "demo.db")
        + "max_concurrent_runs = 3\n"
        + '\n[[subscriptions]]\nname = "tickets"\nserver = "demo"\nevent = "ticket.created"\n'
        'delivery = "poll"\npoll_floor_ms = 100\n'
    )
    return config


def test_limits_lists_each_limit_with_its_use(tmp_path: Path) -> None:
    config = project(tmp_path, "http://127.0.0.1:9/v1", concurrency=2)
    start_from_cursor(config)
    shown = cli("limits", "--json", "-c", str(config))
    assert shown.exit_code == 0, shown.output
    rows = {(r["limit"], r["set_in"]): r for r in json.loads(shown.output)}
    assert rows[("max_runs_per_hour", "[agent]")] | {} == {
        "limit": "max_runs_per_hour",
        "set_in": "[agent]",
        "value": 100,
        "in_use": 0,
        "unit": "runs in the last hour",
        "reached": False,
    }
    assert rows[("max_cost_per_day_usd", "[agent]")]["value"] is None
    assert rows[("concurrency", "[agent]")]["value"] == 2
    assert rows[("max_concurrent_runs", "[servers.demo]")]["value"] == 3
    assert rows[("max_concurrent", "rule triage")]["value"] == 4
    assert rows[("rate_limit", "rule triage")]["unit"] == "runs in the last 3600 s"
    table = cli("limits", "-c", str(config))
    assert table.exit_code == 0 and "max_runs_per_hour" in table.output and "rule triage" in table.output
    assert cli("limits", "--help").exit_code == 0
    missing = cli("limits", "-c", str(tmp_path / "nope.toml"))
    assert missing.exit_code != 0


def new_tickets(tmp_path: Path, count: int) -> None:
    tickets = TicketStore(tmp_path / "demo.db")
    tickets.create([("support", "P2", f"ticket {n}", "body", "amy@example.com") for n in range(count)])
    tickets.close()


def states(tmp_path: Path) -> dict[str, int]:
    with sqlite3.connect(tmp_path / "aw.db") as db:
        return dict(db.execute("SELECT state, count(*) FROM events GROUP BY state").fetchall())


async def until(check: Callable[[], bool]) -> None:
    with anyio.fail_after(WAIT_S):
        while not check():  # noqa: ASYNC110 - another process writes the store: nothing signals
            await anyio.sleep(0.05)


async def test_a_reload_applies_changed_limits_without_a_restart(tmp_path: Path) -> None:
    """concurrency 1 → 3 on a reload: the held run keeps its slot and two more start at once; then
    max_runs_per_hour is lowered under the runs made, and the next events wait in pending."""
    async with FakeLLM() as fake:
        fake.script(hold(), hold(), hold())
        config = project(tmp_path, fake.url, concurrency=1)
        new_tickets(tmp_path, 3)
        start_from_cursor(config)
        async with agentwake_run(config, FAKE_LLM_KEY="sk-test") as service:
            await fake.wait_for_requests(1, timeout=WAIT_S)
            assert len(fake.requests) == 1  # one at a time while concurrency = 1
            config.write_text(config.read_text().replace("concurrency = 1", "concurrency = 3"))
            await service.wait_for("config reloaded", "[agent] concurrency = 3: applied")
            await fake.wait_for_requests(3, timeout=WAIT_S)
            fake.responder = lambda body: text("done")
            fake.release()
            await until(lambda: states(tmp_path).get("done") == 3)

            config.write_text(config.read_text().replace("max_runs_per_hour = 100", "max_runs_per_hour = 3"))
            await service.wait_for("config reloaded", "[agent] max_runs_per_hour = 3: applied")
            assert not any("[agent] changed: not applied" in line for line in service.lines)
            await service.wait_for("agent paused: max_runs_per_hour=3 reached")
            new_tickets(tmp_path, 1)
            await until(lambda: states(tmp_path).get("pending") == 1)
            assert len(fake.requests) == 3
            shown = json.loads(cli("limits", "--json", "-c", str(config)).output)
            [hourly] = [r for r in shown if r["limit"] == "max_runs_per_hour"]
            assert (hourly["value"], hourly["in_use"], hourly["reached"]) == (3, 3, True)
            assert await service.stop() == 0
