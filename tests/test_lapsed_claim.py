"""A lapsed claim no longer acts (issue 30): no tool call from a run whose claim is not current.

Every test drives real things: a store (a SQLite file, or a throwaway PostgreSQL database), the
fake LLM over loopback HTTP and tests/journal_tools_server.py over stdio, whose calls it writes
down. A "paused" process is a run whose LLM call the fake holds while the test lets its lease
lapse (claims made at times the test picks) and claims the event again, through a second store
on the same database as another process would.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

import anyio
import pytest
from _stores import Backend, backend_fixture, second_store_fixture, store_fixture  # noqa: F401 - fixtures
from conftest import REPO
from fake_llm import FakeLLM, Reply, hold, text, tool_calls

from agentwake.agent.runner import AgentRunner, RunResult
from agentwake.agent.tools import ConnectionPool
from agentwake.clock import iso, utc_now
from agentwake.config import AgentwakeConfig, ServerConfig, parse_config
from agentwake.decide import Outcome, decide
from agentwake.delivery.common import subscription_key
from agentwake.mcp import ServerConnection
from agentwake.policy import Policy
from agentwake.store import (
    EventVerdict,
    InboxEvent,
    IncomingEvent,
    RunKind,
    RunProgress,
    Store,
    ToolCallRecord,
)
from agentwake.worker import Worker

pytestmark = pytest.mark.anyio

KEY_ENV: Final = "AGENTWAKE_TEST_LLM_KEY"
TICKET: Final = "T-000001"
NOTE: Final = {"text": "triaged T-000001"}
POST_NOTE: Final = "notes__post_note"
# How long a test waits for something that should happen at once (a guard against a hang).
DEADLINE_S: Final = 30.0


@dataclass
class Scene:
    fake: FakeLLM
    store: Store
    pool: ConnectionPool
    calls: Path
    tmp: Path
    backend: Backend

    def config(self, **agent: Any) -> AgentwakeConfig:
        return parse_config(
            {
                "store": self.backend.store_table(),
                "agent": {
                    "model": "openai/fake",
                    "api_base": self.fake.url,
                    "api_key_env": KEY_ENV,
                    "llm_retries": 0,
                    "attempt_backoff_s": 0,
                    "timeout_s": 60,
                    "prompts": str(REPO / "prompts"),
                    **agent,
                },
                "servers": {"notes": tool_server(self.calls, self.tmp).model_dump(mode="json")},
                "subscriptions": [
                    {"name": "tickets", "server": "notes", "event": "ticket.created", "tools": [POST_NOTE]}
                ],
            },
            env={},
        )

    def runner(self, store: Store | None = None, **agent: Any) -> AgentRunner:
        return AgentRunner.build(self.config(**agent), store or self.store, self.pool)

    async def ingest(self) -> int:
        key = subscription_key(self.config().subscriptions[0])
        await self.store.register(key)
        await self.store.ingest(
            key, [IncomingEvent(TICKET, "ticket.created", iso(utc_now()), {"ticketId": TICKET})], "1"
        )
        [found] = await self.store.find_events(TICKET, "notes")
        return int(found["id"])

    def notes(self) -> list[dict[str, Any]]:
        """The calls the tool server got, in order."""
        if not self.calls.exists():
            return []
        return [json.loads(line) for line in self.calls.read_text().splitlines()]

    async def stored(self) -> dict[str, Any]:
        [found] = await self.store.find_events(TICKET, "notes")
        detail = await self.store.event_detail(int(found["id"]))
        assert detail is not None
        return detail


def tool_server(calls: Path, tmp: Path) -> ServerConfig:
    return ServerConfig(
        command=sys.executable,
        args=[str(REPO / "tests" / "journal_tools_server.py")],
        env={"CALLS_FILE": str(calls), "BLOCK_FILE": str(tmp / "block")},
        cwd=REPO,
    )


@pytest.fixture
async def scene(
    store: Store, backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Scene]:
    monkeypatch.setenv(KEY_ENV, "sk-test")
    calls = tmp_path / "calls.jsonl"
    async with FakeLLM() as fake, ServerConnection("notes", tool_server(calls, tmp_path)) as conn:
        pool = ConnectionPool()
        await pool.attach(conn)
        yield Scene(fake, store, pool, calls, tmp_path, backend)


def ago(seconds: float) -> str:
    return iso(utc_now() - timedelta(seconds=seconds))


def from_now(seconds: float) -> str:
    return iso(utc_now() + timedelta(seconds=seconds))


async def decided(runner: AgentRunner, event: InboxEvent) -> Outcome:
    outcome = await decide(event, config=runner.config, policy=Policy(), now=utc_now(), flow=None)
    assert outcome.verdict == "run", outcome.why
    return outcome


@dataclass
class Running:
    """A run going on in the background; ``result`` once it ended."""

    result: RunResult | None = None
    ended: anyio.Event = field(default_factory=anyio.Event)

    async def wait(self) -> RunResult:
        with anyio.fail_after(DEADLINE_S):
            await self.ended.wait()
        assert self.result is not None
        return self.result


def start(tg: anyio.abc.TaskGroup, runner: AgentRunner, outcome: Outcome) -> Running:
    running = Running()

    async def go() -> None:
        running.result = await runner.run(outcome)
        running.ended.set()

    tg.start_soon(go)
    return running


def answers_like_a_model(request: dict[str, Any]) -> Reply:
    """Post the note unless the transcript shows it posted; then say so."""
    if any(m.get("role") == "tool" for m in request["messages"]):
        return text("done: noted")
    return tool_calls((POST_NOTE, NOTE))


# ---- 1. a tool call is journaled and sent only under a current claim -------------------------------


async def test_a_run_whose_event_was_claimed_again_and_completed_elsewhere_sends_nothing(
    scene: Scene, second_store: Store
) -> None:
    row = await scene.ingest()
    # The paused process's claim: its lease has lapsed by the time its LLM answers.
    [first] = await scene.store.claim(1, ago(60), lease_until=ago(30))
    runner = scene.runner()
    scene.fake.script(hold())
    async with anyio.create_task_group() as tg:
        paused = start(tg, runner, await decided(runner, first))
        await scene.fake.wait_for_requests(1)
        # Another process claims the event again and completes it.
        [again] = await second_store.claim(1, iso(utc_now()), lease_until=from_now(60))
        assert (again.id, again.attempts) == (row, 2)
        other = await second_store.start_run(
            row, kind="agent", attempt=2, model="m", decision={}, system_prompt=None, user_prompt=None
        )
        assert await second_store.finish_run(
            other,
            status="completed",
            reason=None,
            progress=RunProgress([], 0, 0, 0, None),
            duration_ms=1,
            verdict=EventVerdict("done"),
        )
        # The paused process wakes: its model asks for the note.
        scene.fake.script(tool_calls((POST_NOTE, NOTE)))
        scene.fake.release()
        result = await paused.wait()

    assert scene.notes() == []  # nothing reached the tool server
    assert (result.status, result.event_state) == ("interrupted", None)
    assert result.reason is not None and result.reason.startswith("lease lost: its event is done now")
    assert len(scene.fake.requests) == 1  # the run stopped at the refused call: no further LLM call
    stored = await scene.stored()
    assert (stored["state"], stored["attempts"]) == ("done", 2)
    stale, completed = stored["runs"]
    assert (stale["status"], stale["tool_calls"]) == ("interrupted", [])
    assert stale["reason"].startswith("lease lost")
    assert completed["status"] == "completed"


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_single_process_whose_lease_lapsed_sends_nothing_and_its_next_claim_posts_once(
    scene: Scene,
) -> None:
    row = await scene.ingest()
    [first] = await scene.store.claim(1, ago(60), lease_until=ago(30))
    runner = scene.runner()
    scene.fake.script(hold())
    async with anyio.create_task_group() as tg:
        paused = start(tg, runner, await decided(runner, first))
        await scene.fake.wait_for_requests(1)
        scene.fake.script(tool_calls((POST_NOTE, NOTE)))
        scene.fake.release()
        result = await paused.wait()
    assert scene.notes() == []
    assert result.status == "interrupted"
    assert result.reason is not None and "its lease lapsed at" in result.reason
    # Not counted against the event: still its first claim, whose lease lapsed; the next claim takes it.
    stored = await scene.stored()
    assert (stored["state"], stored["attempts"]) == ("processing", 1)

    [again] = await scene.store.claim(1, iso(utc_now()), lease_until=from_now(60))
    assert (again.id, again.attempts) == (row, 2)
    scene.fake.script(text("done: noted"))
    rerun = await runner.run(await decided(runner, again))
    assert rerun.status == "completed"
    assert [n["text"] for n in scene.notes()] == [NOTE["text"]]  # the call the stale run asked for, once
    stored = await scene.stored()
    assert stored["state"] == "done"
    assert [r["status"] for r in stored["runs"]] == ["interrupted", "completed"]


# ---- 2. a lost lease stops the run at once ----------------------------------------------------------


@dataclass
class Clock:
    """A worker's clock, which the test may move."""

    offset: timedelta = timedelta()

    def __call__(self) -> datetime:
        return utc_now() + self.offset


@dataclass
class CountingAgent:
    """The real AgentRunner, counting the runs of each claim and how many go on at once."""

    runner: AgentRunner
    claims: list[tuple[int, int]] = field(default_factory=list)
    going: int = 0
    most: int = 0

    @property
    def agent(self) -> Any:
        return self.runner.agent

    async def warm_up(self) -> None:
        await self.runner.warm_up()

    async def run(self, outcome: Outcome, *, kind: RunKind = "agent", batch: Any = ()) -> object:
        self.claims.append((outcome.event.id, outcome.event.attempts))
        self.going += 1
        self.most = max(self.most, self.going)
        try:
            return await self.runner.run(outcome, kind=kind, batch=batch)
        finally:
            self.going -= 1


async def running_worker(
    tg: anyio.abc.TaskGroup, scene: Scene, clock: Callable[[], datetime], **agent: Any
) -> tuple[Worker, CountingAgent]:
    config = scene.config(**agent)
    counting = CountingAgent(AgentRunner.build(config, scene.store, scene.pool))
    worker = Worker(config, scene.store, agent=counting, pool=scene.pool, clock=clock)
    await tg.start(worker.run)
    return worker, counting


async def test_a_lost_lease_stops_the_run_before_its_llm_answers(scene: Scene, second_store: Store) -> None:
    row = await scene.ingest()
    scene.fake.script(hold())
    async with anyio.create_task_group() as tg:
        # A process whose clock runs an hour behind: each lease it takes or renews has already lapsed.
        # One run at a time: it must not claim its own lapsed event again before the other process does.
        worker, counting = await running_worker(
            tg, scene, Clock(timedelta(hours=-1)), lease_s=0.3, concurrency=1
        )
        await scene.fake.wait_for_requests(1)
        [again] = await second_store.claim(1, iso(utc_now()), lease_until=from_now(60))
        assert (again.id, again.attempts) == (row, 2)
        # Its next renewal finds the lease lost and stops the run: the held LLM call is not awaited.
        with anyio.fail_after(DEADLINE_S):
            await worker.drained()
        assert counting.going == 0
        tg.cancel_scope.cancel()
    scene.fake.release()
    assert scene.notes() == []
    assert len(scene.fake.requests) == 1
    stored = await scene.stored()
    assert (stored["state"], stored["attempts"]) == ("processing", 2)  # the other process's claim
    [stopped] = stored["runs"]
    assert (stopped["status"], stopped["tool_calls"]) == ("interrupted", [])


# ---- 3. a rerun sees every earlier run's settled calls -----------------------------------------------


async def test_a_rerun_goes_on_from_an_earlier_answered_run_when_the_newest_has_no_answer(
    scene: Scene, second_store: Store
) -> None:
    row = await scene.ingest()
    [first] = await scene.store.claim(1, iso(utc_now()), lease_until=from_now(60))
    runner = scene.runner()
    scene.fake.responder = answers_like_a_model
    scene.fake.script(tool_calls((POST_NOTE, NOTE)), hold())
    async with anyio.create_task_group() as tg:
        # The first run posts the note, then its process pauses in its next LLM call.
        paused = start(tg, runner, await decided(runner, first))
        await scene.fake.wait_for_requests(2)
        assert len(scene.notes()) == 1
        # Its lease lapses; another process claims the event, its run stops before any answer ...
        [second] = await second_store.claim(1, from_now(120), lease_until=from_now(180))
        cut_short = await second_store.start_run(
            row, kind="agent", attempt=second.attempts, model="m", decision={}, system_prompt=None, user_prompt=None
        )  # fmt: skip
        await second_store.finish_run(
            cut_short,
            status="interrupted",
            reason="its process stopped",
            progress=RunProgress([], 0, 0, 0, None),
            duration_ms=1,
            verdict=None,
        )
        # ... and a third claim's run goes on from the first run's transcript, not from scratch.
        [third] = await second_store.claim(1, from_now(240), lease_until=from_now(300))
        rerun = await scene.runner(second_store).run(await decided(runner, third))
        assert rerun.status == "completed" and rerun.final_text == "done: noted"
        scene.fake.release()
        stale = await paused.wait()
    assert [n["text"] for n in scene.notes()] == [NOTE["text"]]
    assert stale.status == "interrupted"  # claimed again: its outcome is not applied
    stored = await scene.stored()
    assert (stored["state"], stored["attempts"]) == ("done", 3)
    assert [r["status"] for r in stored["runs"]] == ["interrupted", "interrupted", "completed"]


async def test_a_call_settled_by_a_stale_run_is_reused_though_the_run_resumed_from_has_it_unsettled(
    scene: Scene,
) -> None:
    row = await scene.ingest()
    boundary = "0123456789abcdef"
    asked: list[dict[str, Any]] = [
        {"role": "system", "content": "you triage tickets"},
        {
            "role": "user",
            "content": f'<event boundary="{boundary}">\n{TICKET}\n</event boundary="{boundary}">',
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": POST_NOTE, "arguments": json.dumps(NOTE)},
                }
            ],
        },
    ]
    progress = RunProgress(asked, 1, 10, 5, None)
    # A first run sent the note; while it was out, its lease lapsed ...
    [first] = await scene.store.claim(1, iso(utc_now()), lease_until=from_now(60))
    stale = await scene.store.start_run(
        row,
        kind="agent",
        attempt=first.attempts,
        model="m",
        decision={},
        system_prompt=None,
        user_prompt=None,
    )
    await scene.store.record_progress(stale, progress, [])
    call = await scene.store.journal_tool_call(
        stale,
        ToolCallRecord(1, "call_a", POST_NOTE, "notes", "post_note", NOTE, "sent", None, None),
        f"agentwake/notes/{TICKET}/run-{stale}/step-1/call_a",
        now=iso(utc_now()),
    )
    # ... a second claim's run took the call over as still 'sent' and stopped ...
    [second] = await scene.store.claim(1, from_now(120), lease_until=from_now(180))
    adopting = await scene.store.start_run(
        row,
        kind="agent",
        attempt=second.attempts,
        model="m",
        decision={},
        system_prompt=None,
        user_prompt=None,
    )
    await scene.store.adopt_run(adopting, stale, ["call_a"], progress)
    await scene.store.finish_run(
        adopting, status="interrupted", reason="stopped", progress=progress, duration_ms=1, verdict=None
    )
    # ... and the first run learnt that the note was posted.
    await scene.store.settle_tool_call(
        call, status="ok", result="note posted", reply="note posted: triaged", duration_ms=5
    )
    [third] = await scene.store.claim(1, from_now(240), lease_until=from_now(300))
    runner = scene.runner()
    scene.fake.script(text("done: noted"))
    result = await runner.run(await decided(runner, third))
    assert (result.status, result.final_text) == ("completed", "done: noted")
    assert scene.notes() == []  # the note was not posted again
    [request] = scene.fake.requests
    assert {"role": "tool", "tool_call_id": "call_a", "content": "note posted: triaged"} in request[
        "messages"
    ]
    stored = await scene.stored()
    assert stored["state"] == "done"
    assert [(c["call_id"], c["status"]) for c in stored["runs"][-1]["tool_calls"]] == [("call_a", "reused")]


# ---- 4. one handler per event in a process ------------------------------------------------------------


async def test_an_event_this_process_claims_again_is_handled_once_under_the_newest_claim(
    scene: Scene,
) -> None:
    row = await scene.ingest()
    clock = Clock()
    # Replies by what the transcript shows: a held call whose client went away may take one unseen.
    scene.fake.script(hold(), hold())
    scene.fake.responder = answers_like_a_model
    async with anyio.create_task_group() as tg:
        worker, counting = await running_worker(tg, scene, clock, lease_s=60, concurrency=2)
        await scene.fake.wait_for_requests(1)
        # The process was paused past its lease; its next claim takes the event back.
        clock.offset = timedelta(hours=1)
        worker.wake()
        await scene.fake.wait_for_requests(2)
        assert counting.claims == [(row, 1), (row, 2)]
        assert counting.most == 1  # the first claim's run had stopped before the second's started
        assert worker.held == {row: ("notes", 2)}  # renewals keep the newest claim
        assert worker.active == 1
        scene.fake.release()
        with anyio.fail_after(DEADLINE_S):
            await worker.drained()
        tg.cancel_scope.cancel()
    assert [n["text"] for n in scene.notes()] == [NOTE["text"]]
    stored = await scene.stored()
    assert (stored["state"], stored["attempts"]) == ("done", 2)
    assert [(r["attempt"], r["status"]) for r in stored["runs"]] == [(1, "interrupted"), (2, "completed")]
