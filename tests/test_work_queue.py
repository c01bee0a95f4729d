"""The work queue: claims are leases, attempts end in a dead letter, per-server run limits, usage limits.

The store is real, SQLite and PostgreSQL in turn (``tests/_stores.py``); the worker is the service's.
The agent stage is a gate that records which events run at once (what is under test is the
scheduling, not the LLM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from _stores import Backend, backend_fixture, store_fixture  # noqa: F401 - fixtures

from agentwake.clock import iso, utc_now
from agentwake.config import AgentConfig, AgentwakeConfig, parse_config
from agentwake.decide import Outcome
from agentwake.delivery.common import subscription_key
from agentwake.errors import StoreError
from agentwake.store import EventVerdict, InboxEvent, IncomingEvent, RunKind, RunProgress, Store
from agentwake.worker import Worker

pytestmark = pytest.mark.anyio

NO_PROGRESS = RunProgress([], 0, 0, 0, None)


def config(
    tmp_path: Path, *, servers: dict[str, dict[str, Any]] | None = None, **agent: Any
) -> AgentwakeConfig:
    servers = servers or {"a": {}, "b": {}}
    return parse_config(
        {
            "store": {"path": str(tmp_path / "aw.db")},
            "agent": {"model": "agentwake/offline", "concurrency": 4, **agent},
            "servers": {name: {"command": "true", **extra} for name, extra in servers.items()},
            "subscriptions": [
                {"name": f"sub-{name}", "server": name, "event": "x.happened"} for name in servers
            ],
        },
        env={},
    )


async def add_events(store: Store, cfg: AgentwakeConfig, server: str, count: int, start: int = 0) -> None:
    sub = next(s for s in cfg.subscriptions if s.server == server)
    key = subscription_key(sub)
    await store.register(key)
    events = [
        IncomingEvent(f"{server}-{i}", "x.happened", iso(utc_now()), {"n": i})
        for i in range(start, start + count)
    ]
    await store.ingest(key, events, str(start + count))


async def state_of(store: Store, event_id: str) -> dict[str, Any]:
    [event] = await store.find_events(event_id)
    return event


# ---- the store ---------------------------------------------------------------------------------


async def test_a_lapsed_lease_is_claimed_again_and_the_old_run_cannot_move_the_event(
    tmp_path: Path, store: Store
) -> None:
    cfg = config(tmp_path)
    await add_events(store, cfg, "a", 1)
    now = utc_now()
    [first] = await store.claim(1, iso(now), lease_until=iso(now + timedelta(seconds=1)))
    run = await store.start_run(
        first.id,
        kind="agent",
        attempt=first.attempts,
        model="m",
        decision={},
        system_prompt=None,
        user_prompt=None,
    )
    # Still leased: nobody else gets it.
    assert await store.claim(1, iso(now)) == []
    later = now + timedelta(seconds=5)
    [again] = await store.claim(1, iso(later), lease_until=iso(later + timedelta(seconds=60)))
    assert (again.id, again.attempts) == (first.id, 2)
    # The first holder's renewal and its outcome are refused: the second claim holds the event now.
    assert await store.renew_leases([(first.id, first.attempts)], iso(later)) == [first.id]
    assert await store.renew_leases([(again.id, again.attempts)], iso(later + timedelta(seconds=90))) == []
    applied = await store.finish_run(
        run,
        status="completed",
        reason=None,
        progress=NO_PROGRESS,
        duration_ms=1,
        verdict=EventVerdict("done"),
    )
    assert applied is False
    event = await state_of(store, "a-0")
    assert (event["state"], event["attempts"]) == ("processing", 2)
    assert event["runs"][0]["status"] == "interrupted" and "lease lapsed" in event["runs"][0]["reason"]


async def test_a_crash_requeues_its_events_but_one_that_used_up_its_attempts_is_dead(
    tmp_path: Path, store: Store
) -> None:
    cfg = config(tmp_path)
    await add_events(store, cfg, "a", 2)
    # Claimed in the past, with leases that lapsed before the restart: what a crash leaves (a shared
    # PostgreSQL store requeues only lapsed leases; SQLite, one process, every claim).
    now = utc_now()
    start, lapsed = iso(now - timedelta(seconds=10)), iso(now - timedelta(seconds=9))
    claimed = await store.claim(2, start, lease_until=lapsed)
    await store.release(next(e.id for e in claimed if e.event_id == "a-1"), start)
    again = await store.claim(2, iso(now - timedelta(seconds=5)), lease_until=iso(now - timedelta(seconds=1)))
    assert sorted((e.event_id, e.attempts) for e in again) == [("a-0", 2), ("a-1", 1)]
    assert await store.requeue_interrupted(max_attempts=2) == 1
    assert ((await state_of(store, "a-0"))["state"], (await state_of(store, "a-1"))["state"]) == (
        "dead",
        "pending",
    )
    assert "during each of its 2 attempt(s)" in (await state_of(store, "a-0"))["last_error"]


async def test_claims_leave_out_the_servers_at_their_limit(tmp_path: Path, store: Store) -> None:
    cfg = config(tmp_path)
    await add_events(store, cfg, "a", 2)
    await add_events(store, cfg, "b", 2)
    claimed = await store.claim(10, exclude_servers=["a"])
    assert sorted(e.event_id for e in claimed) == ["b-0", "b-1"]


async def test_retry_requeues_failed_and_dead_events_only(tmp_path: Path, store: Store) -> None:
    cfg = config(tmp_path)
    await add_events(store, cfg, "a", 3)
    for event in await store.claim(3):
        await store.finish([event.id], {"a-0": "failed", "a-1": "dead", "a-2": "done"}[event.event_id], "why")
    for event_id in ("a-0", "a-1"):
        assert await store.retry(int((await state_of(store, event_id))["id"])) == 0
        event = await state_of(store, event_id)
        assert (event["state"], event["attempts"], event["last_error"]) == ("pending", 0, None)
    with pytest.raises(StoreError, match="only failed or dead events are retried"):
        await store.retry(int((await state_of(store, "a-2"))["id"]))


async def test_agent_usage_counts_runs_of_the_last_hour_and_spend_of_the_last_day(
    tmp_path: Path, store: Store
) -> None:
    cfg = config(tmp_path)
    await add_events(store, cfg, "a", 2)
    for event in await store.claim(2):
        run = await store.start_run(
            event.id, kind="agent", attempt=1, model="m", decision={}, system_prompt=None, user_prompt=None
        )
        await store.finish_run(
            run,
            status="completed",
            reason=None,
            progress=RunProgress([], 1, 10, 5, 0.25),
            duration_ms=1,
            verdict=EventVerdict("done"),
        )
    now = utc_now()
    assert await store.agent_usage(iso(now - timedelta(hours=1)), iso(now - timedelta(days=1))) == (2, 0.5)
    assert await store.agent_usage(iso(now + timedelta(seconds=1)), iso(now + timedelta(seconds=1))) == (
        0,
        0.0,
    )


# ---- the worker --------------------------------------------------------------------------------


@dataclass
class GateAgent:
    """Runs nothing: records which events run at the same time and finishes each when the gate opens."""

    agent: AgentConfig
    store: Any
    gate: anyio.Event = field(default_factory=anyio.Event)
    running: list[InboxEvent] = field(default_factory=list)
    peak_by_server: dict[str, int] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)

    async def warm_up(self) -> None:
        return None

    async def run(
        self, outcome: Outcome, *, kind: RunKind = "agent", batch: Sequence[InboxEvent] = ()
    ) -> object:
        event = outcome.event
        self.running.append(event)
        self.started.append(event.event_id)
        on_server = sum(1 for e in self.running if e.server == event.server)
        self.peak_by_server[event.server] = max(self.peak_by_server.get(event.server, 0), on_server)
        self.changed.set()
        self.changed = anyio.Event()
        try:
            await self.gate.wait()
            run = await self.store.start_run(
                event.id,
                kind="agent",
                attempt=event.attempts,
                model="m",
                decision={},
                system_prompt=None,
                user_prompt=None,
            )
            await self.store.finish_run(
                run,
                status="completed",
                reason=None,
                progress=NO_PROGRESS,
                duration_ms=1,
                verdict=EventVerdict("done"),
            )
        finally:
            self.running.remove(event)
        return None

    async def wait_started(self, count: int) -> None:
        with anyio.fail_after(10):
            while len(self.started) < count:
                await self.changed.wait()


async def test_a_server_runs_at_most_its_max_concurrent_runs(tmp_path: Path, store: Store) -> None:
    cfg = config(tmp_path, servers={"a": {"max_concurrent_runs": 1}, "b": {}})
    await add_events(store, cfg, "a", 3)
    await add_events(store, cfg, "b", 2)
    assert cfg.agent is not None
    agent = GateAgent(cfg.agent, store)
    worker = Worker(cfg, store, agent=agent)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await agent.wait_started(3)  # one of a's and both of b's, with 4 slots
        assert sorted(e.server for e in agent.running) == ["a", "b", "b"]
        agent.gate.set()
        await agent.wait_started(5)
        with anyio.fail_after(10):
            while worker.held:  # noqa: ASYNC110 - the last runs finish right after the gate opened
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert agent.peak_by_server == {"a": 1, "b": 2}
    assert (await store.state_counts()).get("done") == 5


async def test_past_max_runs_per_hour_events_wait_in_pending_and_status_says_why(
    tmp_path: Path, store: Store
) -> None:
    cfg = config(tmp_path, max_runs_per_hour=1)
    await add_events(store, cfg, "a", 2)
    await store.service_started(pid=1, host="h", version=None, heartbeat_s=5)
    assert cfg.agent is not None
    agent = GateAgent(cfg.agent, store)
    agent.gate.set()
    worker = Worker(cfg, store, agent=agent)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await agent.wait_started(1)
        # Until the store says so too: the worker sets ``paused`` before it writes it, and a write
        # cancelled mid-query (PostgreSQL; SQLite's thread finishes it) is rolled back.
        with anyio.fail_after(10):
            while worker.paused is None or (await store.services())[0]["paused"] is None:
                worker.wake()
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert agent.started == ["a-0"]
    assert (await store.state_counts()).get("pending") == 1
    [service] = await store.services()
    assert "max_runs_per_hour=1 reached (1 runs in the last hour)" in service["paused"]


def test_status_says_why_the_agent_waits() -> None:
    from agentwake.cli.tables import describe_service

    running = {"state": "running", "pid": 7, "host": "h", "started_at": "t", "heartbeat_age_s": 1.0}
    paused = describe_service({**running, "paused": "max_runs_per_hour=1 reached (1 runs in the last hour)"})
    assert paused.endswith(
        "; the agent waits: max_runs_per_hour=1 reached (1 runs in the last hour) (events stay pending)"
    )
    assert "waits" not in describe_service({**running, "paused": None})


async def cli(config_file: Path, *args: str) -> str:
    """What ``agentwake <args> -c config_file`` prints, run as a program; it must succeed."""
    import os
    import subprocess
    import sys

    command = [sys.executable, "-m", "agentwake.cli", *args, "-c", str(config_file)]
    with anyio.fail_after(60):
        shown = await anyio.run_process(
            command, check=False, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "250"}
        )
    assert shown.returncode == 0, shown.stderr.decode()
    return str(shown.stdout.decode())


async def test_actions_show_each_runs_tokens_and_cost(tmp_path: Path, backend: Backend, store: Store) -> None:
    cfg = config(tmp_path)
    await add_events(store, cfg, "a", 2)
    for event, cost in zip(await store.claim(2), (0.25, None), strict=True):
        run = await store.start_run(
            event.id, kind="agent", attempt=1, model="m", decision={}, system_prompt=None, user_prompt=None
        )
        progress = RunProgress([], 1, 100, 20, cost)
        await store.finish_run(
            run, status="completed", reason=None, progress=progress, duration_ms=1, verdict=None
        )
    (tmp_path / "agentwake.toml").write_text(backend.store_toml())
    shown = await cli(tmp_path / "agentwake.toml", "actions")
    assert "cost" in shown and "$0.2500" in shown
    assert shown.count(" 120 ") == 2  # tokens: prompt and completion together


async def test_status_counts_dead_events_and_shows_why(
    tmp_path: Path, backend: Backend, store: Store
) -> None:
    import json

    cfg = config(tmp_path)
    await add_events(store, cfg, "a", 2)
    [first, _] = await store.claim(2)
    await store.finish([first.id], "dead", "gave up after 3 attempt(s): LLM call failed")
    (tmp_path / "agentwake.toml").write_text(backend.store_toml())
    [row] = json.loads(await cli(tmp_path / "agentwake.toml", "status", "--json"))
    assert (row["events_dead"], row["events_failed"]) == (1, 0)
    assert row["last_failure"] == "gave up after 3 attempt(s): LLM call failed"
    text = await cli(tmp_path / "agentwake.toml", "status")
    assert "0 (1 dead)" in text and "gave up after 3 attempt(s)" in text
