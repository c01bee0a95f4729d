"""Policy flow control with a clock the test moves: rate limits, dedup, debounce, max_concurrent, hooks, approval.

Each test drives events through ``Supervisor._agent_one`` as the service's claim loop does: events are
ingested into a real SQLite store, claimed with ``claim_sync(now=iso_at(clock()))`` and handed over one
at a time. The agent is a real ``AgentRunner`` calling litellm over loopback HTTP to the FakeLLM, so
"reached the LLM" means a chat request arrived there. Windows are measured by the fake clock only: the
test advances it by hand and never sleeps.

Most tests give the Supervisor no connection pool (the wait for a server's tools is not what they are
about, and no tool is called); the tests that check which tools the LLM is offered attach a real demo
server over stdio, as test_agent_e2e does.
"""

from __future__ import annotations

import json
import sqlite3
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import REPO, demo_stdio
from fake_llm import FakeLLM, error, hold

from agentwake.agent.runner import AgentRunner
from agentwake.agent.tools import ConnectionPool
from agentwake.config import AgentwakeConfig, parse_config
from agentwake.delivery.poll import subscription_key
from agentwake.mcp import ServerConnection
from agentwake.policy import load_policy
from agentwake.store import InboxEvent, IncomingEvent, Store
from agentwake.supervisor import Supervisor, iso_at

pytestmark = [
    pytest.mark.anyio,
    # See test_agent_units.py: pydantic warns once about a litellm model it builds lazily.
    pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning"),
]

KEY_ENV = "AGENTWAKE_TEST_FLOW_LLM_KEY"
T0 = datetime(2031, 5, 1, 12, 0, 0, tzinfo=UTC)


@dataclass
class FakeClock:
    """The Supervisor's clock: it moves only when the test says so."""

    now: datetime = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def at(self, seconds: float) -> None:
        """Set the clock to T0 + seconds."""
        self.now = T0 + timedelta(seconds=seconds)


@dataclass
class Rig:
    tmp: Path
    fake: FakeLLM
    store: Store
    clock: FakeClock
    pool: ConnectionPool | None
    demo_db: Path
    cursor: int = 0
    registered: set[str] = field(default_factory=set)

    def config(
        self, *, ticket_tools: list[str] | None = None, connect_timeout_s: float = 30.0, **agent: Any
    ) -> AgentwakeConfig:
        server = demo_stdio(self.demo_db).model_copy(update={"connect_timeout_s": connect_timeout_s})
        return parse_config(
            {
                "store": {"path": str(self.tmp / "aw.db")},
                "agent": {
                    "model": "openai/fake",
                    "api_base": self.fake.url,
                    "api_key_env": KEY_ENV,
                    "llm_retries": 0,
                    "attempt_backoff_s": 0,
                    "max_attempts": 3,
                    "prompts": str(REPO / "prompts"),
                    **agent,
                },
                "servers": {"demo": server.model_dump(exclude_defaults=True, mode="json")},
                "subscriptions": [
                    {
                        "name": "tickets",
                        "server": "demo",
                        "event": "ticket.created",
                        "tools": ticket_tools or [],
                    },
                    {"name": "alerts", "server": "demo", "event": "alert.fired"},
                ],
            },
            env={},
        )

    def supervisor(
        self,
        rules: str,
        *,
        hooks: str | None = None,
        store: Store | None = None,
        pool: ConnectionPool | None = None,
        **config: Any,
    ) -> tuple[Supervisor, AgentRunner]:
        """A Supervisor with these policy rules (and hook module), the fake clock and a real runner."""
        folder = self.tmp / "policies"
        folder.mkdir(exist_ok=True)
        (folder / "10-flow.toml").write_text(textwrap.dedent(rules))
        if hooks is not None:
            (self.tmp / "hooks.py").write_text(textwrap.dedent(hooks))
        policy = load_policy(folder, "log", base=self.tmp)
        cfg = self.config(**config)
        store = store or self.store
        pool = pool or self.pool
        runner = AgentRunner.build(cfg, store, pool or ConnectionPool())
        supervisor = Supervisor(cfg, store, agent=runner, pool=pool, policy=policy, clock=self.clock)
        return supervisor, runner

    async def add(self, event_id: str, data: dict[str, Any], *, subscription: str = "alerts") -> int:
        """Ingest one event as a poll would; returns its row id."""
        event = "alert.fired" if subscription == "alerts" else "ticket.created"
        key = subscription_key(next(s for s in self.config().subscriptions if s.name == subscription))
        if subscription not in self.registered:
            await self.store.register(key)
            self.registered.add(subscription)
        self.cursor += 1
        await self.store.ingest(
            key, [IncomingEvent(event_id, event, iso_at(self.clock()), data)], str(self.cursor)
        )
        return int(self.row(event_id)["id"])

    def claim(self, limit: int = 100) -> list[InboxEvent]:
        return self.store.claim_sync(limit, now=iso_at(self.clock()))

    async def one(self, supervisor: Supervisor, runner: AgentRunner, event_id: str) -> None:
        """Claim everything due now; exactly this event must be among it; hand it to the Supervisor."""
        claimed = self.claim()
        assert [e.event_id for e in claimed] == [event_id]
        with anyio.fail_after(30):
            await supervisor._agent_one(runner, claimed[0])

    async def arrive(
        self, supervisor: Supervisor, runner: AgentRunner, event_id: str, data: dict[str, Any]
    ) -> None:
        await self.add(event_id, data)
        await self.one(supervisor, runner, event_id)

    def row(self, event_id: str) -> dict[str, Any]:
        [event] = self.store.find_events_sync(event_id)
        if isinstance(event["decision"], str):
            event["decision"] = json.loads(event["decision"])
        return event

    def column(self, event_id: str, name: str) -> Any:
        """A column find_events does not return (available_at, batch_leader), read from the file."""
        with sqlite3.connect(self.tmp / "aw.db") as db:
            return db.execute(f"SELECT {name} FROM events WHERE event_id = ?", [event_id]).fetchone()[0]

    def reached_llm(self) -> list[str]:
        """The event ids whose prompt reached the LLM, in order (the first request of each run)."""
        ids = []
        for request in self.fake.requests:
            user = request["messages"][1]["content"]
            ids.append(user.split("(event ")[1].split(" ")[0])
        return ids


@pytest.fixture
async def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Rig]:
    monkeypatch.setenv(KEY_ENV, "sk-test")
    async with FakeLLM() as fake:
        store = await Store.open(tmp_path / "aw.db")
        try:
            yield Rig(tmp_path, fake, store, FakeClock(), None, tmp_path / "demo.db")
        finally:
            await store.close()


@pytest.fixture
async def live_rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Rig]:
    """With a real demo server connected, so the LLM is offered the allowed tools of its catalog."""
    monkeypatch.setenv(KEY_ENV, "sk-test")
    demo_db = tmp_path / "demo.db"
    async with FakeLLM() as fake, ServerConnection("demo", demo_stdio(demo_db)) as conn:
        pool = ConnectionPool()
        await pool.attach(conn)
        store = await Store.open(tmp_path / "aw.db")
        try:
            yield Rig(tmp_path, fake, store, FakeClock(), pool, demo_db)
        finally:
            await store.close()


def tool_names(request: dict[str, Any]) -> list[str]:
    return sorted(t["function"]["name"] for t in request.get("tools") or [])


def fenced_blocks(text: str) -> list[Any]:
    """Every ``<event-data boundary=...>`` block in a prompt, parsed back from JSON."""
    blocks = []
    for part in text.split('<event-data boundary="')[1:]:
        boundary, rest = part.split('">\n', 1)
        blocks.append(json.loads(rest.split(f'\n</event-data boundary="{boundary}">')[0]))
    return blocks


# ---- rate limit ------------------------------------------------------------------------------

RATE = """
[[rules]]
name = "limited"
action = "agent"
match.event = "alert.fired"
rate_limit = {{ max = 2, window_s = 60, key = "data.service"{extra} }}
"""


async def test_over_the_rate_limit_an_event_is_logged_and_another_key_still_runs(rig: Rig) -> None:
    supervisor, runner = rig.supervisor(RATE.format(extra=""))
    await rig.arrive(supervisor, runner, "A-1", {"service": "api"})
    rig.clock.advance(10)
    await rig.arrive(supervisor, runner, "A-2", {"service": "api"})
    rig.clock.advance(10)
    await rig.arrive(supervisor, runner, "A-3", {"service": "api"})
    await rig.arrive(supervisor, runner, "B-1", {"service": "db"})

    assert rig.reached_llm() == ["A-1", "A-2", "B-1"]
    third = rig.row("A-3")
    assert (third["state"], third["runs"]) == ("done", [])
    assert third["decision"]["rule"] == "limited"
    assert third["decision"]["action"] == "log"
    assert third["decision"]["why"] == "over the rate limit of 2 per 60s for data.service"
    for ran in ("A-1", "A-2", "B-1"):
        assert rig.row(ran)["state"] == "done"
        assert [r["status"] for r in rig.row(ran)["runs"]] == ["completed"]

    # 61 s after the first run, only A-2 is left in the window: one more fits.
    rig.clock.at(61)
    await rig.arrive(supervisor, runner, "A-4", {"service": "api"})
    rig.clock.at(62)
    await rig.arrive(supervisor, runner, "A-5", {"service": "api"})
    assert rig.reached_llm() == ["A-1", "A-2", "B-1", "A-4"]
    assert rig.row("A-5")["decision"]["why"].startswith("over the rate limit")


async def test_over_the_rate_limit_with_ignore_the_event_is_ignored(rig: Rig) -> None:
    supervisor, runner = rig.supervisor(RATE.format(extra=', over_limit = "ignore"'))
    for n in (1, 2, 3):
        await rig.arrive(supervisor, runner, f"A-{n}", {"service": "api"})
    assert rig.reached_llm() == ["A-1", "A-2"]
    third = rig.row("A-3")
    assert (third["state"], third["runs"]) == ("ignored", [])
    assert third["decision"]["why"] == "over the rate limit of 2 per 60s for data.service"


async def test_over_the_rate_limit_with_delay_the_event_waits_for_the_window_to_end(rig: Rig) -> None:
    supervisor, runner = rig.supervisor(RATE.format(extra=', over_limit = "delay"'))
    await rig.arrive(supervisor, runner, "A-1", {"service": "api"})
    rig.clock.at(10)
    await rig.arrive(supervisor, runner, "A-2", {"service": "api"})
    rig.clock.at(20)
    await rig.arrive(supervisor, runner, "A-3", {"service": "api"})

    third = rig.row("A-3")
    assert (third["state"], third["attempts"], third["runs"], third["decision"]) == ("pending", 0, [], None)
    # The oldest run in the window (A-1, at T0) leaves it 60 s later.
    assert rig.column("A-3", "available_at") == iso_at(T0 + timedelta(seconds=60))
    rig.clock.at(59.999)
    assert rig.claim() == []

    rig.clock.at(60.001)
    await rig.one(supervisor, runner, "A-3")
    assert rig.reached_llm() == ["A-1", "A-2", "A-3"]
    assert rig.row("A-3")["state"] == "done"
    assert rig.row("A-3")["attempts"] == 1


async def test_a_delayed_event_runs_when_claimed_at_the_time_it_was_given(rig: Rig) -> None:
    supervisor, runner = rig.supervisor(RATE.format(extra=', over_limit = "delay"'))
    for n, at in ((1, 0), (2, 10), (3, 20)):
        rig.clock.at(at)
        await rig.arrive(supervisor, runner, f"A-{n}", {"service": "api"})
    available = rig.column("A-3", "available_at")
    rig.clock.at(60)
    assert iso_at(rig.clock()) == available
    await rig.one(supervisor, runner, "A-3")
    assert rig.row("A-3")["state"] == "done"


# ---- dedup ---------------------------------------------------------------------------------------

DEDUP = """
[[rules]]
name = "once"
action = "agent"
match.event = "alert.fired"
dedup = { key = "data.incidentId", window_s = 600 }
"""


async def test_the_same_key_within_the_window_is_a_duplicate_of_the_earlier_event(rig: Rig) -> None:
    supervisor, runner = rig.supervisor(DEDUP)
    first = await rig.add("A-1", {"incidentId": "I-1", "n": 1})
    await rig.one(supervisor, runner, "A-1")
    rig.clock.at(300)
    await rig.arrive(supervisor, runner, "A-2", {"incidentId": "I-1", "n": 2})
    await rig.arrive(supervisor, runner, "B-1", {"incidentId": "I-2"})
    rig.clock.at(600)  # the window's last instant still counts
    await rig.arrive(supervisor, runner, "A-3", {"incidentId": "I-1", "n": 3})

    assert rig.reached_llm() == ["A-1", "B-1"]
    for duplicate in ("A-2", "A-3"):
        row = rig.row(duplicate)
        assert (row["state"], row["runs"]) == ("ignored", [])
        assert row["decision"]["rule"] == "once"
        assert (
            row["decision"]["why"]
            == f"duplicate: data.incidentId was seen in event A-1 (row {first}) within 600s"
        )

    rig.clock.at(601)
    await rig.arrive(supervisor, runner, "A-4", {"incidentId": "I-1", "n": 4})
    assert rig.reached_llm() == ["A-1", "B-1", "A-4"]
    assert rig.row("A-4")["state"] == "done"
    # The new run starts a new window: a fifth one right after is its duplicate.
    rig.clock.at(602)
    await rig.arrive(supervisor, runner, "A-5", {"incidentId": "I-1"})
    assert rig.row("A-5")["decision"]["why"].endswith(f"event A-4 (row {rig.row('A-4')['id']}) within 600s")


async def test_the_dedup_window_survives_a_restart(rig: Rig) -> None:
    supervisor, runner = rig.supervisor(DEDUP)
    first = await rig.add("A-1", {"incidentId": "I-1"})
    await rig.one(supervisor, runner, "A-1")
    # A new store connection and a new Supervisor, as after a restart: the window is rows, not memory.
    reopened = await Store.open(rig.tmp / "aw.db")
    try:
        again, again_runner = rig.supervisor(DEDUP, store=reopened)
        rig.clock.at(120)
        await rig.add("A-2", {"incidentId": "I-1"})
        [claimed] = reopened.claim_sync(10, now=iso_at(rig.clock()))
        await again._agent_one(again_runner, claimed)
    finally:
        await reopened.close()
    assert rig.row("A-2")["state"] == "ignored"
    assert rig.row("A-2")["decision"]["why"].endswith(f"event A-1 (row {first}) within 600s")
    assert rig.reached_llm() == ["A-1"]


# ---- debounce ------------------------------------------------------------------------------------

DEBOUNCE = """
[[rules]]
name = "grouped"
action = "agent"
match.event = "alert.fired"
debounce = {{ window_s = 30, key = "data.service"{extra} }}
"""


async def test_events_within_the_window_become_one_run_that_sees_them_all(rig: Rig) -> None:
    supervisor, runner = rig.supervisor(DEBOUNCE.format(extra=""))
    data = {
        "A-1": {"service": "api", "n": 1, "summary": "first"},
        "A-2": {"service": "api", "n": 2, "summary": "second"},
        "A-3": {"service": "api", "n": 3, "summary": "third"},
    }
    leader = await rig.add("A-1", data["A-1"])
    await rig.one(supervisor, runner, "A-1")
    first = rig.row("A-1")
    assert (first["state"], first["attempts"], first["runs"]) == ("pending", 0, [])
    assert first["decision"]["batch_leader"] is True
    assert rig.column("A-1", "available_at") == iso_at(T0 + timedelta(seconds=30))
    assert rig.claim() == []  # not before it is due

    for event_id, at in (("A-2", 5), ("A-3", 29)):
        rig.clock.at(at)
        await rig.arrive(supervisor, runner, event_id, data[event_id])
        row = rig.row(event_id)
        assert (row["state"], row["runs"]) == ("batched", [])
        assert rig.column(event_id, "batch_leader") == leader
    assert rig.fake.requests == []
    rig.clock.at(29.999)
    assert rig.claim() == []

    rig.clock.at(30)
    await rig.one(supervisor, runner, "A-1")
    assert len(rig.fake.requests) == 1
    user = rig.fake.requests[0]["messages"][1]["content"]
    assert fenced_blocks(user) == [data["A-1"], data["A-2"], data["A-3"]]
    assert "2 more event(s) arrived within the debounce window" in user
    for event_id in data:
        assert rig.row(event_id)["state"] == "done"
    [run] = rig.row("A-1")["runs"]
    assert run["status"] == "completed" and run["decision"]["batch"] == ["A-2", "A-3"]
    assert rig.claim() == []


async def test_the_claim_loop_runs_a_batch_when_the_clock_reaches_its_due_time(rig: Rig) -> None:
    """The service's own loop (_agent_forever) claims with the Supervisor's clock, not the wall clock."""
    supervisor, runner = rig.supervisor(DEBOUNCE.format(extra=""))
    handled: list[str] = []
    changed = anyio.Event()
    original = supervisor._agent_one

    async def counted(agent: AgentRunner, event: InboxEvent) -> None:
        nonlocal changed
        await original(agent, event)
        handled.append(event.event_id)
        changed.set()
        changed = anyio.Event()

    async def handled_count(n: int) -> None:
        with anyio.fail_after(30):
            while len(handled) < n:
                await changed.wait()

    supervisor._agent_one = counted  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(supervisor._agent_forever, runner)
        await rig.add("A-1", {"service": "api", "n": 1})
        supervisor._notify_new(1)
        await handled_count(1)
        rig.clock.at(5)
        await rig.add("A-2", {"service": "api", "n": 2})
        supervisor._notify_new(1)
        await handled_count(2)
        assert [rig.row(e)["state"] for e in ("A-1", "A-2")] == ["pending", "batched"]
        assert rig.fake.requests == []
        # The wall clock is years before T0 + 30 s: only the fake clock can make the batch due.
        rig.clock.at(30)
        supervisor._notify_new(0)
        await handled_count(3)
        tg.cancel_scope.cancel()
    assert handled == ["A-1", "A-2", "A-1"]
    assert [b["n"] for b in fenced_blocks(rig.fake.requests[0]["messages"][1]["content"])] == [1, 2]
    assert [rig.row(e)["state"] for e in ("A-1", "A-2")] == ["done", "done"]


async def test_another_key_opens_its_own_batch(rig: Rig) -> None:
    supervisor, runner = rig.supervisor(DEBOUNCE.format(extra=""))
    await rig.arrive(supervisor, runner, "A-1", {"service": "api"})
    rig.clock.at(1)
    await rig.arrive(supervisor, runner, "B-1", {"service": "db"})
    rig.clock.at(2)
    await rig.arrive(supervisor, runner, "B-2", {"service": "db"})
    assert [rig.row(e)["state"] for e in ("A-1", "B-1", "B-2")] == ["pending", "pending", "batched"]
    rig.clock.at(31)
    claimed = rig.claim()
    assert [e.event_id for e in claimed] == ["A-1", "B-1"]
    for event in claimed:
        await supervisor._agent_one(runner, event)
    assert sorted(len(fenced_blocks(r["messages"][1]["content"])) for r in rig.fake.requests) == [1, 2]
    assert {rig.row(e)["state"] for e in ("A-1", "B-1", "B-2")} == {"done"}


async def test_a_full_batch_makes_the_next_event_open_a_new_one(rig: Rig) -> None:
    supervisor, runner = rig.supervisor(DEBOUNCE.format(extra=", max_events = 2"))
    for n in (1, 2, 3, 4, 5):
        rig.clock.at(n)
        await rig.arrive(supervisor, runner, f"A-{n}", {"service": "api", "n": n})
    states = {f"A-{n}": rig.row(f"A-{n}")["state"] for n in (1, 2, 3, 4, 5)}
    assert states == {
        "A-1": "pending",
        "A-2": "batched",
        "A-3": "pending",
        "A-4": "batched",
        "A-5": "pending",
    }
    leaders = {f"A-{n}": rig.column(f"A-{n}", "batch_leader") for n in (2, 4)}
    assert leaders == {"A-2": rig.row("A-1")["id"], "A-4": rig.row("A-3")["id"]}

    rig.clock.at(40)
    claimed = rig.claim()
    assert [e.event_id for e in claimed] == ["A-1", "A-3", "A-5"]
    for event in claimed:
        await supervisor._agent_one(runner, event)
    seen = [[b["n"] for b in fenced_blocks(r["messages"][1]["content"])] for r in rig.fake.requests]
    assert sorted(seen) == [[1, 2], [3, 4], [5]]
    assert {rig.row(f"A-{n}")["state"] for n in (1, 2, 3, 4, 5)} == {"done"}


async def test_a_batch_leader_retried_after_a_transient_failure_keeps_its_batch(rig: Rig) -> None:
    supervisor, runner = rig.supervisor(DEBOUNCE.format(extra=""))
    await rig.arrive(supervisor, runner, "A-1", {"service": "api", "n": 1})
    rig.clock.at(5)
    await rig.arrive(supervisor, runner, "A-2", {"service": "api", "n": 2})
    rig.clock.at(30)
    [leader] = rig.claim()
    rig.fake.script(error(500, "down"))  # transient: the leader goes back to pending for another attempt
    rig.clock.at(31)
    await rig.arrive(supervisor, runner, "A-3", {"service": "api", "n": 3})  # opens a new batch
    await supervisor._agent_one(runner, leader)
    assert rig.row("A-1")["state"] == "pending"

    # Its next attempt (the backoff is 0 s): it should run with its batch.
    rig.clock.at(32)
    await rig.one(supervisor, runner, "A-1")
    rig.clock.at(70)
    for event in rig.claim():
        await supervisor._agent_one(runner, event)
    assert {rig.row(f"A-{n}")["state"] for n in (1, 2, 3)} == {"done"}


# ---- max_concurrent ------------------------------------------------------------------------------

CONCURRENT = """
[[rules]]
name = "one-at-a-time"
action = "agent"
max_concurrent = 1
match.event = "alert.fired"

[[rules]]
name = "tickets"
action = "agent"
match.event = "ticket.created"
"""


async def test_at_the_rules_limit_an_event_goes_back_while_another_rules_event_runs(rig: Rig) -> None:
    supervisor, runner = rig.supervisor(CONCURRENT)
    await rig.add("A-1", {"n": 1})
    [first] = rig.claim()
    rig.fake.script(hold())
    async with anyio.create_task_group() as tg:
        tg.start_soon(supervisor._agent_one, runner, first)
        await rig.fake.wait_for_requests(1)

        await rig.add("A-2", {"n": 2})
        [second] = rig.claim()
        assert second.attempts == 1
        with anyio.fail_after(10):
            await supervisor._agent_one(runner, second)
        row = rig.row("A-2")
        assert (row["state"], row["attempts"], row["runs"]) == ("pending", 0, [])  # not an attempt
        assert rig.column("A-2", "available_at") == iso_at(T0 + timedelta(seconds=1))

        await rig.add("T-1", {"title": "printer"}, subscription="tickets")
        with anyio.fail_after(30):
            await rig.one(supervisor, runner, "T-1")  # A-2 is not due yet: only T-1 is claimed
        assert rig.row("T-1")["state"] == "done"
        assert rig.row("A-1")["state"] == "processing"
        rig.fake.release()
    assert rig.row("A-1")["state"] == "done"

    rig.clock.at(1)
    await rig.one(supervisor, runner, "A-2")
    assert rig.row("A-2")["state"] == "done"
    assert rig.row("A-2")["attempts"] == 1
    assert rig.reached_llm() == ["A-1", "T-1", "A-2"]


async def test_an_event_released_by_max_concurrent_does_not_use_up_the_rate_limit(rig: Rig) -> None:
    rules = CONCURRENT.replace(
        "max_concurrent = 1", "max_concurrent = 1\nrate_limit = { max = 2, window_s = 60 }"
    )
    supervisor, runner = rig.supervisor(rules)
    await rig.add("A-1", {"n": 1})
    [first] = rig.claim()
    rig.fake.script(hold())
    async with anyio.create_task_group() as tg:
        tg.start_soon(supervisor._agent_one, runner, first)
        await rig.fake.wait_for_requests(1)
        await rig.arrive(supervisor, runner, "A-2", {"n": 2})
        assert rig.row("A-2")["state"] == "pending"  # released: the rule is busy
        rig.fake.release()
    rig.clock.at(2)
    await rig.one(supervisor, runner, "A-2")
    # Two runs in the window. A-2 must not be refused as the third.
    assert rig.reached_llm() == ["A-1", "A-2"]


async def test_without_its_server_connected_an_event_goes_back_untouched(rig: Rig) -> None:
    """The other path of the server wait: the pool never gets the server within connect_timeout_s."""
    supervisor, runner = rig.supervisor(CONCURRENT, pool=ConnectionPool(), connect_timeout_s=0.05)
    await rig.add("A-1", {"n": 1})
    await rig.one(supervisor, runner, "A-1")
    row = rig.row("A-1")
    assert (row["state"], row["attempts"], row["runs"]) == ("pending", 0, [])
    assert rig.fake.requests == []
    assert rig.column("A-1", "available_at") is not None


# ---- hooks ---------------------------------------------------------------------------------------

HOOKS = """
import threading

RELEASE = threading.Event()
SEEN = []


def to_ignore(view):
    SEEN.append(view)
    return "ignore"


def grant(view):
    return {"action": "agent", "tools": ["demo__get_ticket"], "why": "the hook grants get_ticket"}


def keep(view):
    return None


def explode(view):
    raise RuntimeError("boom")


def unknown_action(view):
    return "wake"


def wrong_type(view):
    return 42


def slow(view):
    RELEASE.wait(60)
    return "agent"
"""

HOOK_RULES = """
[[rules]]
name = "hooked"
action = "{action}"
hook = "hooks.py:{function}"
hook_timeout_s = 0.2
fallback = "{fallback}"
"""


EVERY = "the rule matches every event"


@pytest.mark.parametrize(
    ("function", "action", "fallback", "decided", "why"),
    [
        # (hook, the rule's action, its fallback, what is decided, the decision's why)
        ("to_ignore", "agent", "log", "ignore", f"{EVERY}; hook chose ignore"),
        ("keep", "agent", "ignore", "agent", EVERY),
        ("grant", "log", "ignore", "agent", f"{EVERY}; the hook grants get_ticket"),
        (
            "explode",
            "agent",
            "ignore",
            "ignore",
            f"{EVERY}; hook failed: RuntimeError: boom, fallback ignore",
        ),
        (
            "unknown_action",
            "agent",
            "log",
            "log",
            f"{EVERY}; hook failed: ValueError: a hook returned the unknown action 'wake', fallback log",
        ),
        (
            "wrong_type",
            "agent",
            "ignore",
            "ignore",
            f"{EVERY}; hook failed: TypeError: a hook returns None, an action name or a dict, not int,"
            " fallback ignore",
        ),
        ("slow", "agent", "log", "log", f"{EVERY}; hook timed out, fallback log"),
    ],
)
async def test_a_hook_changes_the_decision_or_fails_to_the_fallback(
    rig: Rig, function: str, action: str, fallback: str, decided: str, why: str
) -> None:
    supervisor, runner = rig.supervisor(
        HOOK_RULES.format(action=action, function=function, fallback=fallback), hooks=HOOKS
    )
    module: dict[str, Any] = supervisor.policy.hooks["hooked"].__globals__
    try:
        await rig.arrive(supervisor, runner, "A-1", {"service": "api"})
    finally:
        module["RELEASE"].set()  # the abandoned slow hook's thread ends now
    row = rig.row("A-1")
    assert row["state"] == {"ignore": "ignored", "log": "done", "agent": "done"}[decided]
    if decided == "agent":
        assert rig.reached_llm() == ["A-1"]
        [run] = row["runs"]
        assert run["decision"]["why"] == f"rule 'hooked' (10-flow.toml:2): {why}"
    else:
        assert (rig.fake.requests, row["runs"]) == ([], [])
        assert (row["decision"]["action"], row["decision"]["why"]) == (decided, why)
    if function == "grant":
        assert row["runs"][0]["decision"]["allowlist"] == ["demo__get_ticket"]
    if function == "to_ignore":
        [seen] = module["SEEN"]
        assert seen["event_id"] == "A-1" and seen["data"] == {"service": "api"}
        assert (seen["server"], seen["subscription"], seen["name"]) == ("demo", "alerts", "alert.fired")


# ---- approval ------------------------------------------------------------------------------------

APPROVE = """
[[rules]]
name = "needs-ok"
action = "approve"
tools = ["demo__get_ticket"]
match.event = "ticket.created"
"""


async def test_an_approved_event_runs_with_the_rules_tools_and_a_denied_one_never(live_rig: Rig) -> None:
    rig = live_rig
    supervisor, runner = rig.supervisor(APPROVE, ticket_tools=["demo__add_comment", "demo__close_ticket"])
    ok = await rig.add("T-1", {"title": "printer"}, subscription="tickets")
    no = await rig.add("T-2", {"title": "scanner"}, subscription="tickets")
    for event in rig.claim():
        await supervisor._agent_one(runner, event)
    for event_id in ("T-1", "T-2"):
        row = rig.row(event_id)
        assert (row["state"], row["runs"]) == ("held", [])
        assert row["decision"]["rule"] == "needs-ok" and row["decision"]["action"] == "approve"
        assert row["decision"]["rule_tools"] == ["demo__get_ticket"]
    assert [h["event_id"] for h in rig.store.approvals_sync()] == ["T-1", "T-2"]
    assert rig.claim() == []  # held is not pending
    assert rig.fake.requests == []

    rig.store.answer_sync(ok, approve=True, note="looked at it")
    rig.store.answer_sync(no, approve=False, note="spam")
    row = rig.row("T-1")
    assert (row["state"], row["approval_note"]) == ("pending", "looked at it")
    assert row["approved_at"] is not None
    denied = rig.row("T-2")
    assert (denied["state"], denied["approval_note"], denied["approved_at"]) == ("denied", "spam", None)

    [claimed] = rig.claim()
    assert (claimed.event_id, claimed.approved) == ("T-1", True)
    with anyio.fail_after(30):
        await supervisor._agent_one(runner, claimed)
    assert rig.reached_llm() == ["T-1"]
    assert tool_names(rig.fake.requests[0]) == ["demo__get_ticket"]  # the rule's, not the subscription's
    row = rig.row("T-1")
    assert row["state"] == "done"
    [run] = row["runs"]
    assert run["status"] == "completed"
    assert run["decision"]["why"].startswith(
        "rule 'needs-ok' (10-flow.toml:2): approved by a person; held by: "
    )
    assert run["decision"]["tools"] == ["demo__get_ticket"]

    assert rig.claim() == []
    assert rig.row("T-2")["runs"] == [] and rig.row("T-2")["state"] == "denied"


async def test_an_approved_event_retried_after_a_transient_failure_keeps_the_rules_tools(rig: Rig) -> None:
    rules = APPROVE + 'prompt = "event.md.j2"\n'
    supervisor, runner = rig.supervisor(rules, ticket_tools=["demo__close_ticket"])
    row_id = await rig.add("T-1", {"title": "printer"}, subscription="tickets")
    await rig.one(supervisor, runner, "T-1")
    rig.store.answer_sync(row_id, approve=True, note=None)
    rig.fake.script(error(500, "down"))
    await rig.one(supervisor, runner, "T-1")
    assert rig.row("T-1")["state"] == "pending"  # transient: another attempt (backoff 0 s)
    await rig.one(supervisor, runner, "T-1")
    first, second = rig.row("T-1")["runs"]
    assert first["decision"]["allowlist"] == ["demo__get_ticket"]
    assert second["decision"]["allowlist"] == ["demo__get_ticket"]
    for run in (first, second):  # event.md.j2, the rule's prompt, not ticket.created.md.j2
        assert "Decide whether this needs action" in run["user_prompt"]


def test_the_fake_clock_is_what_claims_use(tmp_path: Path) -> None:
    """A guard for the rig itself: claim_sync compares available_at with the clock it is given."""
    clock = FakeClock()
    clock.advance(1.5)
    assert iso_at(clock()) == "2031-05-01T12:00:01.500Z"
    clock.at(-1)
    assert clock() == T0 - timedelta(seconds=1)
