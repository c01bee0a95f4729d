"""Policy flow control with a clock the test moves: rate limits, dedup, debounce, max_concurrent, hooks, approval.

Events are ingested into a real store (SQLite and PostgreSQL in turn, ``tests/_stores.py``), claimed
with ``claim(now=clock())`` and handed one at a time to the service's real ``Worker``, which decides
each (``agentwake.decide``) and carries the outcome out. No LLM is involved: the worker's agent is a
``RecordingAgent`` that renders the run's plan with the real ``AgentRunner.prepare`` (prompts, allowed
tools) and completes the run in the store, as a run would; "reached the agent" means it was asked to
run. Windows are measured by the fake clock only: the test advances it by hand and never sleeps.

Most tests give the worker no connection pool (the wait for a server's tools is not what they are
about); the test that checks which tools a run is offered attaches a real demo server over stdio.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from _stores import Backend, backend_fixture, store_fixture  # noqa: F401 - fixtures, by their names
from conftest import REPO, demo_stdio

from agentwake.agent.runner import AgentRunner, RunPlan
from agentwake.agent.tools import ConnectionPool
from agentwake.clock import iso
from agentwake.config import AgentConfig, AgentwakeConfig, parse_config
from agentwake.decide import Outcome
from agentwake.delivery.common import subscription_key
from agentwake.mcp import ServerConnection
from agentwake.policy import load_policy
from agentwake.store import EventVerdict, InboxEvent, IncomingEvent, RunKind, RunProgress, Store
from agentwake.worker import Worker

pytestmark = pytest.mark.anyio

T0 = datetime(2031, 5, 1, 12, 0, 0, tzinfo=UTC)
NO_PROGRESS = RunProgress([], 0, 0, 0, None)


@dataclass
class FakeClock:
    """The worker's clock: it moves only when the test says so."""

    now: datetime = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def at(self, seconds: float) -> None:
        """Set the clock to T0 + seconds."""
        self.now = T0 + timedelta(seconds=seconds)


@dataclass
class Run:
    event_id: str
    outcome: Outcome
    batch: list[str]
    plan: RunPlan


@dataclass
class RecordingAgent:
    """The agent stage without an LLM: the real plan (prompts, tools), then the run completed in the store.

    ``fail_next`` makes the next run fail transiently (the event goes back to pending at once);
    ``gate`` holds runs until it is set (``started`` says one is waiting there).
    """

    runner: AgentRunner
    store: Store
    runs: list[Run] = field(default_factory=list)
    fail_next: bool = False
    gate: anyio.Event | None = None
    started: anyio.Event = field(default_factory=anyio.Event)

    @property
    def agent(self) -> AgentConfig:
        return self.runner.agent

    async def warm_up(self) -> None:
        return None

    async def run(
        self, outcome: Outcome, *, kind: RunKind = "agent", batch: Sequence[InboxEvent] = ()
    ) -> object:
        event = outcome.event
        plan = self.runner.prepare(outcome, batch=batch)
        self.runs.append(Run(event.event_id, outcome, [b.event_id for b in batch], plan))
        run_id = await self.store.start_run(
            event.id,
            kind=kind,
            attempt=event.attempts,
            model=plan.model,
            decision=plan.decision,
            system_prompt=plan.prompt.system if plan.prompt else None,
            user_prompt=plan.prompt.user if plan.prompt else None,
            sanitize_report=plan.cleaned.report(),
        )
        if self.gate is not None:
            self.started.set()
            await self.gate.wait()
        failing, self.fail_next = self.fail_next, False
        verdict = (
            EventVerdict("pending", "down", iso(T0 - timedelta(days=1))) if failing else EventVerdict("done")
        )
        await self.store.finish_run(
            run_id,
            status="failed" if failing else "completed",
            reason="down" if failing else None,
            progress=NO_PROGRESS,
            duration_ms=0,
            verdict=verdict,
        )
        return verdict


@dataclass
class Rig:
    tmp: Path
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
                    "model": "openai/never-called",
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

    def worker(
        self,
        rules: str,
        *,
        hooks: str | None = None,
        store: Store | None = None,
        pool: ConnectionPool | None = None,
        **config: Any,
    ) -> tuple[Worker, RecordingAgent]:
        """The service's Worker with these policy rules (and hook module), the fake clock and a recording agent."""
        folder = self.tmp / "policies"
        folder.mkdir(exist_ok=True)
        (folder / "10-flow.toml").write_text(textwrap.dedent(rules))
        if hooks is not None:
            (self.tmp / "hooks.py").write_text(textwrap.dedent(hooks))
        policy = load_policy(folder, "log", base=self.tmp)
        cfg = self.config(**config)
        store = store or self.store
        pool = pool or self.pool
        agent = RecordingAgent(AgentRunner.build(cfg, store, pool or ConnectionPool()), store)
        worker = Worker(cfg, store, policy=policy, agent=agent, pool=pool, clock=self.clock)
        return worker, agent

    async def add(self, event_id: str, data: dict[str, Any], *, subscription: str = "alerts") -> int:
        """Ingest one event as a poll would; returns its row id."""
        event = "alert.fired" if subscription == "alerts" else "ticket.created"
        key = subscription_key(next(s for s in self.config().subscriptions if s.name == subscription))
        if subscription not in self.registered:
            await self.store.register(key)
            self.registered.add(subscription)
        self.cursor += 1
        await self.store.ingest(
            key, [IncomingEvent(event_id, event, iso(self.clock()), data)], str(self.cursor)
        )
        return int((await self.row(event_id))["id"])

    async def claim(self, limit: int = 100) -> list[InboxEvent]:
        return await self.store.claim(limit, now=iso(self.clock()))

    async def one(self, worker: Worker, event_id: str) -> None:
        """Claim everything due now; exactly this event must be among it; hand it to the worker."""
        claimed = await self.claim()
        assert [e.event_id for e in claimed] == [event_id]
        with anyio.fail_after(30):
            await worker.handle(claimed[0])

    async def arrive(self, worker: Worker, event_id: str, data: dict[str, Any]) -> None:
        await self.add(event_id, data)
        await self.one(worker, event_id)

    async def row(self, event_id: str) -> dict[str, Any]:
        [event] = await self.store.find_events(event_id)
        return event

    async def state(self, event_id: str) -> str:
        return str((await self.row(event_id))["state"])

    async def batch(self, leader_row: int) -> list[str]:
        """The events batched under this leader, in order."""
        return [member.event_id for member in await self.store.batch_members(leader_row)]


def reached_agent(agent: RecordingAgent) -> list[str]:
    """The event ids the agent was asked to run, in order."""
    return [run.event_id for run in agent.runs]


@pytest.fixture(autouse=True)
def no_litellm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flow control is decided and carried out without the LLM stage: reaching litellm fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a flow-control test reached litellm")

    monkeypatch.setattr("agentwake.agent.llm.load_litellm", refuse)
    monkeypatch.setattr("agentwake.agent.runner.complete", refuse)


@pytest.fixture
def rig(tmp_path: Path, store: Store) -> Rig:
    return Rig(tmp_path, store, FakeClock(), None, tmp_path / "demo.db")


@pytest.fixture
async def live_rig(tmp_path: Path, store: Store) -> AsyncIterator[Rig]:
    """With a real demo server connected, so a run's plan offers the allowed tools of its catalog."""
    demo_db = tmp_path / "demo.db"
    async with ServerConnection("demo", demo_stdio(demo_db)) as conn:
        pool = ConnectionPool()
        await pool.attach(conn)
        yield Rig(tmp_path, store, FakeClock(), pool, demo_db)


def fenced_blocks(text: str) -> list[Any]:
    """Every ``<event-data boundary=...>`` block in a prompt, parsed back from JSON."""
    blocks = []
    for part in text.split('<event-data boundary="')[1:]:
        boundary, rest = part.split('">\n', 1)
        blocks.append(json.loads(rest.split(f'\n</event-data boundary="{boundary}">')[0]))
    return blocks


def user_prompt(run: Run) -> str:
    assert run.plan.prompt is not None
    return run.plan.prompt.user


# ---- rate limit ------------------------------------------------------------------------------

RATE = """
[[rules]]
name = "limited"
action = "agent"
match.event = "alert.fired"
rate_limit = {{ max = 2, window_s = 60, key = "data.service"{extra} }}
"""


async def test_over_the_rate_limit_an_event_is_logged_and_another_key_still_runs(rig: Rig) -> None:
    worker, agent = rig.worker(RATE.format(extra=""))
    await rig.arrive(worker, "A-1", {"service": "api"})
    rig.clock.advance(10)
    await rig.arrive(worker, "A-2", {"service": "api"})
    rig.clock.advance(10)
    await rig.arrive(worker, "A-3", {"service": "api"})
    await rig.arrive(worker, "B-1", {"service": "db"})

    assert reached_agent(agent) == ["A-1", "A-2", "B-1"]
    third = await rig.row("A-3")
    assert (third["state"], third["runs"]) == ("done", [])
    assert third["decision"]["rule"] == "limited"
    assert third["decision"]["action"] == "log"
    assert third["decision"]["why"] == "over the rate limit of 2 per 60s for data.service"
    for ran in ("A-1", "A-2", "B-1"):
        assert await rig.state(ran) == "done"
        assert [r["status"] for r in (await rig.row(ran))["runs"]] == ["completed"]

    # 61 s after the first run, only A-2 is left in the window: one more fits.
    rig.clock.at(61)
    await rig.arrive(worker, "A-4", {"service": "api"})
    rig.clock.at(62)
    await rig.arrive(worker, "A-5", {"service": "api"})
    assert reached_agent(agent) == ["A-1", "A-2", "B-1", "A-4"]
    assert (await rig.row("A-5"))["decision"]["why"].startswith("over the rate limit")


async def test_over_the_rate_limit_with_ignore_the_event_is_ignored(rig: Rig) -> None:
    worker, agent = rig.worker(RATE.format(extra=', over_limit = "ignore"'))
    for n in (1, 2, 3):
        await rig.arrive(worker, f"A-{n}", {"service": "api"})
    assert reached_agent(agent) == ["A-1", "A-2"]
    third = await rig.row("A-3")
    assert (third["state"], third["runs"]) == ("ignored", [])
    assert third["decision"]["why"] == "over the rate limit of 2 per 60s for data.service"


async def test_over_the_rate_limit_with_delay_the_event_waits_for_the_window_to_end(rig: Rig) -> None:
    worker, agent = rig.worker(RATE.format(extra=', over_limit = "delay"'))
    await rig.arrive(worker, "A-1", {"service": "api"})
    rig.clock.at(10)
    await rig.arrive(worker, "A-2", {"service": "api"})
    rig.clock.at(20)
    await rig.arrive(worker, "A-3", {"service": "api"})

    third = await rig.row("A-3")
    assert (third["state"], third["attempts"], third["runs"], third["decision"]) == ("pending", 0, [], None)
    # The oldest run in the window (A-1, at T0) leaves it 60 s later: A-3 is due then, to the millisecond.
    rig.clock.at(59.999)
    assert await rig.claim() == []

    rig.clock.at(60)
    await rig.one(worker, "A-3")
    assert reached_agent(agent) == ["A-1", "A-2", "A-3"]
    assert await rig.state("A-3") == "done"
    assert (await rig.row("A-3"))["attempts"] == 1


async def test_a_delayed_event_runs_when_claimed_at_the_time_it_was_given(rig: Rig) -> None:
    worker, agent = rig.worker(RATE.format(extra=', over_limit = "delay"'))
    for n, at in ((1, 0), (2, 10), (3, 20)):
        rig.clock.at(at)
        await rig.arrive(worker, f"A-{n}", {"service": "api"})
    # Given T0 + 60 s (the oldest run leaves the window): not a millisecond before, and at that instant.
    rig.clock.at(59.999)
    assert await rig.claim() == []
    rig.clock.at(60)
    await rig.one(worker, "A-3")
    assert await rig.state("A-3") == "done"
    assert reached_agent(agent) == ["A-1", "A-2", "A-3"]


# ---- dedup ---------------------------------------------------------------------------------------

DEDUP = """
[[rules]]
name = "once"
action = "agent"
match.event = "alert.fired"
dedup = { key = "data.incidentId", window_s = 600 }
"""


async def test_the_same_key_within_the_window_is_a_duplicate_of_the_earlier_event(rig: Rig) -> None:
    worker, agent = rig.worker(DEDUP)
    first = await rig.add("A-1", {"incidentId": "I-1", "n": 1})
    await rig.one(worker, "A-1")
    rig.clock.at(300)
    await rig.arrive(worker, "A-2", {"incidentId": "I-1", "n": 2})
    await rig.arrive(worker, "B-1", {"incidentId": "I-2"})
    rig.clock.at(600)  # the window's last instant still counts
    await rig.arrive(worker, "A-3", {"incidentId": "I-1", "n": 3})

    assert reached_agent(agent) == ["A-1", "B-1"]
    for duplicate in ("A-2", "A-3"):
        row = await rig.row(duplicate)
        assert (row["state"], row["runs"]) == ("ignored", [])
        assert row["decision"]["rule"] == "once"
        assert (
            row["decision"]["why"]
            == f"duplicate: data.incidentId was seen in event A-1 (row {first}) within 600s"
        )

    rig.clock.at(601)
    await rig.arrive(worker, "A-4", {"incidentId": "I-1", "n": 4})
    assert reached_agent(agent) == ["A-1", "B-1", "A-4"]
    assert await rig.state("A-4") == "done"
    # The new run starts a new window: a fifth one right after is its duplicate.
    rig.clock.at(602)
    await rig.arrive(worker, "A-5", {"incidentId": "I-1"})
    fourth = (await rig.row("A-4"))["id"]
    assert (await rig.row("A-5"))["decision"]["why"].endswith(f"event A-4 (row {fourth}) within 600s")


async def test_the_dedup_window_survives_a_restart(rig: Rig, backend: Backend) -> None:
    worker, agent = rig.worker(DEDUP)
    first = await rig.add("A-1", {"incidentId": "I-1"})
    await rig.one(worker, "A-1")
    # A new store connection and a new Supervisor, as after a restart: the window is rows, not memory.
    reopened = await backend.open()
    try:
        again, _ = rig.worker(DEDUP, store=reopened)
        rig.clock.at(120)
        await rig.add("A-2", {"incidentId": "I-1"})
        [claimed] = await reopened.claim(10, now=iso(rig.clock()))
        await again.handle(claimed)
    finally:
        await reopened.close()
    assert await rig.state("A-2") == "ignored"
    assert (await rig.row("A-2"))["decision"]["why"].endswith(f"event A-1 (row {first}) within 600s")
    assert reached_agent(agent) == ["A-1"]


# ---- debounce ------------------------------------------------------------------------------------

DEBOUNCE = """
[[rules]]
name = "grouped"
action = "agent"
match.event = "alert.fired"
debounce = {{ window_s = 30, key = "data.service"{extra} }}
"""


async def test_events_within_the_window_become_one_run_that_sees_them_all(rig: Rig) -> None:
    worker, agent = rig.worker(DEBOUNCE.format(extra=""))
    data = {
        "A-1": {"service": "api", "n": 1, "summary": "first"},
        "A-2": {"service": "api", "n": 2, "summary": "second"},
        "A-3": {"service": "api", "n": 3, "summary": "third"},
    }
    leader = await rig.add("A-1", data["A-1"])
    await rig.one(worker, "A-1")
    first = await rig.row("A-1")
    assert (first["state"], first["attempts"], first["runs"]) == ("pending", 0, [])
    assert first["decision"]["batch_leader"] is True
    assert await rig.claim() == []  # not before it is due

    batched: list[str] = []
    for event_id, at in (("A-2", 5), ("A-3", 29)):
        rig.clock.at(at)
        await rig.arrive(worker, event_id, data[event_id])
        row = await rig.row(event_id)
        assert (row["state"], row["runs"]) == ("batched", [])
        batched.append(event_id)
        assert await rig.batch(leader) == batched
    assert agent.runs == []
    # The leader is due at T0 + 30 s (its window's end), to the millisecond.
    rig.clock.at(29.999)
    assert await rig.claim() == []

    rig.clock.at(30)
    await rig.one(worker, "A-1")
    [run] = agent.runs
    user = user_prompt(run)
    assert fenced_blocks(user) == [data["A-1"], data["A-2"], data["A-3"]]
    assert "2 more event(s) arrived within the debounce window" in user
    for event_id in data:
        assert await rig.state(event_id) == "done"
    [run] = (await rig.row("A-1"))["runs"]
    assert run["status"] == "completed" and run["decision"]["batch"] == ["A-2", "A-3"]
    assert await rig.claim() == []


async def test_the_claim_loop_runs_a_batch_when_the_clock_reaches_its_due_time(rig: Rig) -> None:
    """The worker's own loop claims with its clock, not the wall clock."""
    handled: list[str] = []
    changed = anyio.Event()

    class CountingWorker(Worker):
        async def handle(self, event: InboxEvent) -> None:
            nonlocal changed
            await super().handle(event)
            handled.append(event.event_id)
            changed.set()
            changed = anyio.Event()

    plain, agent = rig.worker(DEBOUNCE.format(extra=""))
    worker = CountingWorker(plain.config, plain.store, policy=plain.policy, agent=agent, clock=rig.clock)

    async def handled_count(n: int) -> None:
        with anyio.fail_after(30):
            while len(handled) < n:
                await changed.wait()

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await rig.add("A-1", {"service": "api", "n": 1})
        worker.wake(1)
        await handled_count(1)
        rig.clock.at(5)
        await rig.add("A-2", {"service": "api", "n": 2})
        worker.wake(1)
        await handled_count(2)
        assert [await rig.state(e) for e in ("A-1", "A-2")] == ["pending", "batched"]
        assert agent.runs == []
        # The wall clock is years before T0 + 30 s: only the fake clock can make the batch due.
        rig.clock.at(30)
        worker.wake(0)
        await handled_count(3)
        tg.cancel_scope.cancel()
    assert handled == ["A-1", "A-2", "A-1"]
    assert [b["n"] for b in fenced_blocks(user_prompt(agent.runs[0]))] == [1, 2]
    assert [await rig.state(e) for e in ("A-1", "A-2")] == ["done", "done"]


async def test_another_key_opens_its_own_batch(rig: Rig) -> None:
    worker, agent = rig.worker(DEBOUNCE.format(extra=""))
    await rig.arrive(worker, "A-1", {"service": "api"})
    rig.clock.at(1)
    await rig.arrive(worker, "B-1", {"service": "db"})
    rig.clock.at(2)
    await rig.arrive(worker, "B-2", {"service": "db"})
    assert [await rig.state(e) for e in ("A-1", "B-1", "B-2")] == ["pending", "pending", "batched"]
    rig.clock.at(31)
    claimed = await rig.claim()
    assert [e.event_id for e in claimed] == ["A-1", "B-1"]
    for event in claimed:
        await worker.handle(event)
    assert sorted(len(fenced_blocks(user_prompt(r))) for r in agent.runs) == [1, 2]
    assert {await rig.state(e) for e in ("A-1", "B-1", "B-2")} == {"done"}


async def test_a_full_batch_makes_the_next_event_open_a_new_one(rig: Rig) -> None:
    worker, agent = rig.worker(DEBOUNCE.format(extra=", max_events = 2"))
    for n in (1, 2, 3, 4, 5):
        rig.clock.at(n)
        await rig.arrive(worker, f"A-{n}", {"service": "api", "n": n})
    states = {f"A-{n}": await rig.state(f"A-{n}") for n in (1, 2, 3, 4, 5)}
    assert states == {
        "A-1": "pending",
        "A-2": "batched",
        "A-3": "pending",
        "A-4": "batched",
        "A-5": "pending",
    }
    batches = {f"A-{n}": await rig.batch((await rig.row(f"A-{n}"))["id"]) for n in (1, 3, 5)}
    assert batches == {"A-1": ["A-2"], "A-3": ["A-4"], "A-5": []}

    rig.clock.at(40)
    claimed = await rig.claim()
    assert [e.event_id for e in claimed] == ["A-1", "A-3", "A-5"]
    for event in claimed:
        await worker.handle(event)
    seen = [[b["n"] for b in fenced_blocks(user_prompt(r))] for r in agent.runs]
    assert sorted(seen) == [[1, 2], [3, 4], [5]]
    assert {await rig.state(f"A-{n}") for n in (1, 2, 3, 4, 5)} == {"done"}


async def test_a_batch_leader_retried_after_a_transient_failure_keeps_its_batch(rig: Rig) -> None:
    worker, agent = rig.worker(DEBOUNCE.format(extra=""))
    await rig.arrive(worker, "A-1", {"service": "api", "n": 1})
    rig.clock.at(5)
    await rig.arrive(worker, "A-2", {"service": "api", "n": 2})
    rig.clock.at(30)
    [leader] = await rig.claim()
    agent.fail_next = True  # transient: the leader goes back to pending for another attempt
    rig.clock.at(31)
    await rig.arrive(worker, "A-3", {"service": "api", "n": 3})  # opens a new batch
    await worker.handle(leader)
    assert await rig.state("A-1") == "pending"

    # Its next attempt (the backoff is 0 s): it should run with its batch.
    rig.clock.at(32)
    await rig.one(worker, "A-1")
    rig.clock.at(70)
    for event in await rig.claim():
        await worker.handle(event)
    assert {await rig.state(f"A-{n}") for n in (1, 2, 3)} == {"done"}


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
    worker, agent = rig.worker(CONCURRENT)
    await rig.add("A-1", {"n": 1})
    [first] = await rig.claim()
    gate = agent.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.handle, first)
        with anyio.fail_after(10):
            await agent.started.wait()
        agent.gate = None  # later runs go straight through; the first still waits on its gate

        await rig.add("A-2", {"n": 2})
        [second] = await rig.claim()
        assert second.attempts == 1
        with anyio.fail_after(10):
            await worker.handle(second)
        row = await rig.row("A-2")
        assert (row["state"], row["attempts"], row["runs"]) == ("pending", 0, [])  # not an attempt

        await rig.add("T-1", {"title": "printer"}, subscription="tickets")
        with anyio.fail_after(30):
            await rig.one(worker, "T-1")  # A-2 is not due yet: only T-1 is claimed
        assert await rig.state("T-1") == "done"
        assert await rig.state("A-1") == "processing"
        gate.set()
    assert await rig.state("A-1") == "done"

    # A-2 went back until T0 + 1 s, to the millisecond.
    rig.clock.at(0.999)
    assert await rig.claim() == []
    rig.clock.at(1)
    await rig.one(worker, "A-2")
    assert await rig.state("A-2") == "done"
    assert (await rig.row("A-2"))["attempts"] == 1
    assert reached_agent(agent) == ["A-1", "T-1", "A-2"]


async def test_an_event_released_by_max_concurrent_does_not_use_up_the_rate_limit(rig: Rig) -> None:
    rules = CONCURRENT.replace(
        "max_concurrent = 1", "max_concurrent = 1\nrate_limit = { max = 2, window_s = 60 }"
    )
    worker, agent = rig.worker(rules)
    await rig.add("A-1", {"n": 1})
    [first] = await rig.claim()
    gate = agent.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.handle, first)
        with anyio.fail_after(10):
            await agent.started.wait()
        agent.gate = None
        await rig.arrive(worker, "A-2", {"n": 2})
        assert await rig.state("A-2") == "pending"  # released: the rule is busy
        gate.set()
    rig.clock.at(2)
    await rig.one(worker, "A-2")
    # Two runs in the window. A-2 must not be refused as the third.
    assert reached_agent(agent) == ["A-1", "A-2"]


async def test_without_its_server_connected_an_event_goes_back_untouched(rig: Rig) -> None:
    """The other path of the server wait: the pool never gets the server within connect_timeout_s.
    The run waits for it only because its rule allows that server's tools."""
    with_tools = CONCURRENT.replace(
        "max_concurrent = 1\n", 'max_concurrent = 1\ntools = ["demo__get_alert"]\n'
    )
    worker, agent = rig.worker(with_tools, pool=ConnectionPool(), connect_timeout_s=0.05)
    await rig.add("A-1", {"n": 1})
    await rig.one(worker, "A-1")
    row = await rig.row("A-1")
    assert (row["state"], row["attempts"], row["runs"]) == ("pending", 0, [])
    assert agent.runs == []
    # Not due again now: it waits out the server wait's backoff (retry_at, on the wall clock).
    assert await rig.store.claim(100) == []


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
    worker, agent = rig.worker(
        HOOK_RULES.format(action=action, function=function, fallback=fallback), hooks=HOOKS
    )
    module: dict[str, Any] = worker.policy.hooks["hooked"].__globals__
    try:
        await rig.arrive(worker, "A-1", {"service": "api"})
    finally:
        module["RELEASE"].set()  # the abandoned slow hook's thread ends now
    row = await rig.row("A-1")
    assert row["state"] == {"ignore": "ignored", "log": "done", "agent": "done"}[decided]
    if decided == "agent":
        assert reached_agent(agent) == ["A-1"]
        [run] = row["runs"]
        assert run["decision"]["why"] == f"rule 'hooked' (10-flow.toml:2): {why}"
    else:
        assert (agent.runs, row["runs"]) == ([], [])
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
    worker, agent = rig.worker(APPROVE, ticket_tools=["demo__add_comment", "demo__close_ticket"])
    ok = await rig.add("T-1", {"title": "printer"}, subscription="tickets")
    no = await rig.add("T-2", {"title": "scanner"}, subscription="tickets")
    for event in await rig.claim():
        await worker.handle(event)
    for event_id in ("T-1", "T-2"):
        row = await rig.row(event_id)
        assert (row["state"], row["runs"]) == ("held", [])
        assert row["decision"]["rule"] == "needs-ok" and row["decision"]["action"] == "approve"
        assert row["decision"]["rule_tools"] == ["demo__get_ticket"]
    assert [h["event_id"] for h in await rig.store.approvals()] == ["T-1", "T-2"]
    assert await rig.claim() == []  # held is not pending
    assert agent.runs == []

    await rig.store.answer(ok, approve=True, note="looked at it")
    await rig.store.answer(no, approve=False, note="spam")
    row = await rig.row("T-1")
    assert (row["state"], row["approval_note"]) == ("pending", "looked at it")
    assert row["approved_at"] is not None
    denied = await rig.row("T-2")
    assert (denied["state"], denied["approval_note"], denied["approved_at"]) == ("denied", "spam", None)

    [claimed] = await rig.claim()
    assert (claimed.event_id, claimed.approved) == ("T-1", True)
    with anyio.fail_after(30):
        await worker.handle(claimed)
    assert reached_agent(agent) == ["T-1"]
    # The rule's tools, not the subscription's, are the ones the run offers.
    assert [spec.exposed for spec in agent.runs[0].plan.allowed] == ["demo__get_ticket"]
    row = await rig.row("T-1")
    assert row["state"] == "done"
    [run] = row["runs"]
    assert run["status"] == "completed"
    assert run["decision"]["why"].startswith(
        "rule 'needs-ok' (10-flow.toml:2): approved by a person; held by: "
    )
    assert run["decision"]["tools"] == ["demo__get_ticket"]

    assert await rig.claim() == []
    assert (await rig.row("T-2"))["runs"] == [] and await rig.state("T-2") == "denied"


async def test_an_approved_event_retried_after_a_transient_failure_keeps_the_rules_tools(rig: Rig) -> None:
    rules = APPROVE + 'prompt = "event.md.j2"\n'
    worker, agent = rig.worker(rules, ticket_tools=["demo__close_ticket"])
    row_id = await rig.add("T-1", {"title": "printer"}, subscription="tickets")
    await rig.one(worker, "T-1")
    await rig.store.answer(row_id, approve=True, note=None)
    agent.fail_next = True
    await rig.one(worker, "T-1")
    assert await rig.state("T-1") == "pending"  # transient: another attempt (backoff 0 s)
    await rig.one(worker, "T-1")
    first, second = (await rig.row("T-1"))["runs"]
    assert first["decision"]["allowlist"] == ["demo__get_ticket"]
    assert second["decision"]["allowlist"] == ["demo__get_ticket"]
    for run in (first, second):  # event.md.j2, the rule's prompt, not ticket.created.md.j2
        assert "Decide whether this needs action" in run["user_prompt"]


def test_the_fake_clock_is_what_claims_use(tmp_path: Path) -> None:
    """A guard for the rig itself: claim compares available_at with the clock it is given."""
    clock = FakeClock()
    clock.advance(1.5)
    assert iso(clock()) == "2031-05-01T12:00:01.500Z"
    clock.at(-1)
    assert clock() == T0 - timedelta(seconds=1)
