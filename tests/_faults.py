"""Helpers for the fault suite (tests/test_fault_suite.py): ground truth on both sides of agentwake.

- ``Tickets``: the demo help desk's own SQLite file, where the test opens tickets and reads which
  exist (ticket ``T-000007`` is the one at sequence 7; the demo's cursor is that sequence).
- ``Snapshot``: what agentwake's store holds (events and states, runs, tool calls as the journal
  has them, cursors, gaps), read with plain sqlite3 while or after a process runs.
- ``sent_calls``: the tool calls the tools server really received (tests/journal_tools_server.py
  writes each one down before it answers), by event.
- ``Script``: the fake LLM's responder: a tool call on each event's first step, then an answer;
  it can hold one event's second step (kill mid-LLM call) and block another's tool call at the
  tools server (kill between the call's send and its result).
- ``WebhookDemo``: the demo server over Streamable HTTP delivering by webhook, with a log of
  each delivery it saw answered 2xx (the sender's side of "accepted").
- ``GatedProxy``: a TCP forwarder in front of the HTTP demo server that holds agentwake's
  connections until the test opens its gate (once the tools server is listed).
- ``children``/``reap``: the stdio servers an `agentwake run` spawned, read from /proc.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc
from anyio.abc import SocketAttribute, SocketStream
from conftest import QUIET_DEMO, REPO
from fake_llm import Reply, hold, text, tool_calls

from agentwake.demo.store import TicketStore

TOOL: Final = "notes__post_note"
TOOLS_READY: Final = "server notes: 1 tool(s)"
TERMINAL: Final = frozenset({"done", "dead", "failed", "ignored", "denied", "rejected"})
# A tool call the journal says went out to the server (not refused, planned or reused).
SENT_STATUSES: Final = frozenset({"sent", "ok", "error"})
_TICKET: Final = re.compile(r"T-\d{6}")


def ticket_id(seq: int) -> str:
    return f"T-{seq:06d}"


def seq_of(ticket: str) -> int:
    return int(ticket.removeprefix("T-"))


async def until(condition: Callable[[], object], what: str, timeout: float = 60) -> None:  # noqa: ASYNC109
    """Wait for ``condition()`` to hold (checked every 20 ms): processes and files signal nothing."""
    try:
        with anyio.fail_after(timeout):
            while not condition():  # noqa: ASYNC110 - another process's files signal nothing
                await anyio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {timeout:g}s: {what}") from None


class Tickets:
    """The demo's ticket store, opened from the test process (another writer than the demo: WAL)."""

    def __init__(self, db: Path) -> None:
        self.db = db

    def open(self, count: int = 1) -> list[str]:
        store = TicketStore(self.db)
        try:
            return store.create([("support", "P3", "fault suite ticket", "", "user1@example.com")] * count)
        finally:
            store.close()

    def ids(self) -> list[str]:
        if not self.db.exists():
            return []
        db = sqlite3.connect(self.db)
        try:
            return [row[0] for row in db.execute("SELECT id FROM tickets ORDER BY seq")]
        finally:
            db.close()

    def head(self) -> int:
        ids = self.ids()
        return seq_of(ids[-1]) if ids else 0


@dataclass(frozen=True)
class Run:
    run_id: int
    status: str
    attempt: int
    reason: str | None
    calls: tuple[tuple[str, str | None], ...]  # its tool calls' (journal status, idempotency key), in order

    def statuses(self) -> tuple[str, ...]:
        return tuple(status for status, _ in self.calls)

    def sent_itself(self) -> bool:
        """Whether this run sent a call: a resumed run's journal also holds copies of its predecessor's
        calls (a 'sent' one of unknown outcome stays 'sent'), under the key that names that run."""
        mine = f"/run-{self.run_id}/"
        return any(status in SENT_STATUSES and mine in (key or "") for status, key in self.calls)


@dataclass(frozen=True)
class StoredEvent:
    event_id: str
    subscription: str
    state: str
    last_error: str | None
    runs: tuple[Run, ...]

    def completed(self) -> int:
        return sum(run.status == "completed" for run in self.runs)

    def runs_that_sent(self) -> int:
        return sum(run.sent_itself() for run in self.runs)

    def journaled_sends(self) -> int:
        """Calls the journal says went out: one idempotency key each, however many runs list it."""
        return len({key for run in self.runs for status, key in run.calls if status in SENT_STATUSES})


@dataclass(frozen=True)
class Snapshot:
    """agentwake's store at one moment."""

    events: dict[str, StoredEvent]
    cursors: dict[str, str | None]
    duplicates: dict[str, int]
    gap_counts: dict[str, int]  # the subscriptions' counters
    gap_rows: int  # rows of the gaps table

    def ids(self) -> list[str]:
        return sorted(self.events)

    def state(self, ticket: str) -> str | None:
        event = self.events.get(ticket)
        return None if event is None else event.state


def snapshot(store: Path) -> Snapshot:
    """The store as of one moment. The reads share one transaction: read one after another, a run
    could be read 'running' and its event, finished in between, 'done'."""
    db = sqlite3.connect(store, timeout=30, isolation_level=None)
    try:
        db.execute("BEGIN")
        calls: dict[int, list[tuple[str, str | None]]] = {}
        for run_id, status, key in db.execute(
            "SELECT run_id, status, idempotency_key FROM tool_calls ORDER BY id"
        ):
            calls.setdefault(run_id, []).append((status, key))
        runs: dict[int, list[Run]] = {}
        for run_id, row, status, attempt, reason in db.execute(
            "SELECT id, event_row, status, attempt, reason FROM runs ORDER BY id"
        ):
            runs.setdefault(row, []).append(
                Run(run_id, status, attempt, reason, tuple(calls.get(run_id, ())))
            )
        events = {
            event_id: StoredEvent(event_id, subscription, state, last_error, tuple(runs.get(row, ())))
            for row, event_id, subscription, state, last_error in db.execute(
                "SELECT id, event_id, subscription, state, last_error FROM events ORDER BY id"
            )
        }
        subscriptions = db.execute("SELECT name, cursor, duplicates, gaps FROM subscriptions").fetchall()
        (gap_rows,) = db.execute("SELECT count(*) FROM gaps").fetchone()
        db.execute("COMMIT")
    finally:
        db.close()
    return Snapshot(
        events,
        {name: cursor for name, cursor, _, _ in subscriptions},
        {name: duplicates for name, _, duplicates, _ in subscriptions},
        {name: gaps for name, _, _, gaps in subscriptions},
        gap_rows,
    )


def sent_calls(calls_file: Path) -> dict[str, int]:
    """Calls the tools server received, per event (its idempotency key is agentwake/SERVER/EVENT/run-N/...)."""
    counts: dict[str, int] = {}
    if not calls_file.exists():
        return counts
    for line in calls_file.read_text().splitlines():
        key = json.loads(line)["key"]
        event = key.split("/")[2] if isinstance(key, str) and key.count("/") >= 3 else f"<no key: {line}>"
        counts[event] = counts.get(event, 0) + 1
    return counts


def run_invariants(snap: Snapshot, calls: dict[str, int], events: Iterable[str]) -> list[str]:
    """What breaks "no agent run twice, no tool call sent twice" for these events; [] when nothing does."""
    problems = []
    for ticket in events:
        event = snap.events.get(ticket)
        if event is None:
            problems.append(f"{ticket}: not in the inbox")
            continue
        runs = [(run.status, run.calls) for run in event.runs]
        if event.completed() > 1:
            problems.append(f"{ticket}: {event.completed()} completed runs: {runs}")
        if event.runs_that_sent() > 1:
            problems.append(f"{ticket}: {event.runs_that_sent()} runs sent a tool call: {runs}")
        if calls.get(ticket, 0) > 1:
            problems.append(f"{ticket}: the tools server received {calls[ticket]} calls")
        if calls.get(ticket, 0) != event.journaled_sends():
            problems.append(
                f"{ticket}: the journal says {event.journaled_sends()} call(s) went out,"
                f" the tools server received {calls.get(ticket, 0)}: {runs}"
            )
        if event.state == "done" and event.completed() != 1:
            problems.append(f"{ticket}: done without exactly one completed run: {runs}")
    return problems


def tool_names(body: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in body.get("tools") or []]


def ticket_of(body: dict[str, Any]) -> str:
    """The event a chat request is about: the first ticket id in its user prompt."""
    for message in body["messages"]:
        if message.get("role") == "user":
            found = _TICKET.search(str(message.get("content") or ""))
            if found:
                return found.group(0)
    raise AssertionError(f"a chat request about no ticket: {body['messages']!r:.300}")


@dataclass
class Script:
    """The fake LLM's responder for one agentwake: ``post_note`` on each event's first step, then "done".

    ``hold_second_step`` names an event whose second LLM call (after its tool result came back) is
    held and never answered; ``block_tool_call`` one whose tool call the tools server writes down
    and never answers (``block`` is the tools server's BLOCK_FILE, made as the call is handed out).
    """

    block: Path
    hold_second_step: str | None = None
    block_tool_call: str | None = None
    held: str | None = None
    blocked: str | None = None
    # Events whose first step came before the tools server was listed (so the call is refused).
    without_tool: list[str] = field(default_factory=list)

    def __call__(self, body: dict[str, Any]) -> Reply:
        ticket = ticket_of(body)
        if not any(message.get("role") == "tool" for message in body["messages"]):
            if TOOL not in tool_names(body):
                self.without_tool.append(ticket)
            if ticket == self.block_tool_call and self.blocked is None:
                self.block.touch()  # the tools server looks for it after writing the call down
                self.blocked = ticket
            return tool_calls((TOOL, {"text": f"triaged {ticket}"}))
        if ticket == self.hold_second_step and self.held is None:
            self.held = ticket
            return hold()
        return text(f"done: {ticket}")


# The demo server over HTTP, as a sender that never gives a delivery up while agentwake is down
# (retrying every 0.1-0.6 s, never suspending): abandoning one is the sender's policy, which would
# show here as a missing event. Each delivery answered 2xx is logged with its time.
WEBHOOK_DEMO: Final = """
import dataclasses, logging, sys
from datetime import timedelta
logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                    format="demo_server %(created).6f %(levelname)s %(message)s")
logging.getLogger("agentwake.server._webhook_delivery").setLevel(logging.DEBUG)
import agentwake.demo.server as demo
_settings = demo.webhook_settings
def webhook_settings(settings, store):
    found = _settings(settings, store)
    if found is None:
        return None
    return dataclasses.replace(found, max_attempts=1_000_000, retry_max=timedelta(seconds=0.5),
                               retry_window=timedelta(hours=1), suspend_min_attempts=1_000_000)
demo.webhook_settings = webhook_settings
demo.main()
"""
_ACK: Final = re.compile(r"demo_server (\d+\.\d+) DEBUG webhook subscription \S+: (\S+) acknowledged;")
_LISTENING: Final = re.compile(r"listening on http://[\d.]+:(\d+)/mcp")


@dataclass
class WebhookDemo:
    """The demo server over Streamable HTTP with webhook delivery; ``acks`` is (time, eventId) per 2xx."""

    process: anyio.abc.Process
    port: int = 0
    acks: list[tuple[float, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def read(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        assert self.process.stderr is not None
        pending = b""
        started = False
        async for chunk in self.process.stderr:
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for raw in complete:
                line = raw.decode(errors="replace")
                self.lines.append(line)
                if (ack := _ACK.search(line)) is not None:
                    self.acks.append((float(ack.group(1)), ack.group(2)))
                elif not started and (listening := _LISTENING.search(line)) is not None:
                    self.port = int(listening.group(1))
                    started = True
                    task_status.started()
        if not started:
            raise AssertionError(
                "the webhook demo server exited before it listened:\n" + "\n".join(self.lines)
            )


async def start_webhook_demo(tg: anyio.abc.TaskGroup, db: Path, **env: str) -> WebhookDemo:
    process = await anyio.open_process(
        [sys.executable, "-c", WEBHOOK_DEMO, "--http", "127.0.0.1:0"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **QUIET_DEMO, "DEMO_DB": str(db), **env},
    )
    demo = WebhookDemo(process)
    with anyio.fail_after(30):
        await tg.start(demo.read)
    return demo


@dataclass
class GatedProxy:
    """A TCP forwarder to ``upstream_port`` on loopback that holds every new connection until
    ``open_gate()``; ``close_gate()`` makes the connections that come after it wait again."""

    upstream_port: int
    port: int = 0
    gate: anyio.Event = field(default_factory=anyio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def open_gate(self) -> None:
        self.gate.set()

    def close_gate(self) -> None:
        if self.gate.is_set():
            self.gate = anyio.Event()

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        async with listener:
            self.port = listener.extra(SocketAttribute.local_port)
            task_status.started()
            await listener.serve(self._forward)

    async def _forward(self, client: SocketStream) -> None:
        gate = self.gate  # the one in force when the connection came
        async with client:
            await gate.wait()
            try:
                upstream = await anyio.connect_tcp("127.0.0.1", self.upstream_port)
            except OSError:
                return
            async with upstream:
                await pipe_both_ways(client, upstream)


async def pipe_both_ways(one: SocketStream, other: SocketStream) -> None:
    """Copy bytes both ways until either side closes; then both go."""
    async with anyio.create_task_group() as tg:

        async def pipe(source: SocketStream, sink: SocketStream) -> None:
            try:
                async for chunk in source:
                    await sink.send(chunk)
                await sink.send_eof()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                tg.cancel_scope.cancel()  # one side is gone: so is the connection

        tg.start_soon(pipe, one, other)
        tg.start_soon(pipe, other, one)


def children(pid: int) -> list[int]:
    """The direct children of a process (its stdio servers), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:  # the task (or the process) is gone
            continue
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent that will not reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def command_lines(pids: Iterable[int]) -> list[tuple[int, str]]:
    """Each pid with its command line, to recognise it later (a pid may be reused once it is gone)."""
    return [(pid, cmdline(pid)) for pid in pids]


async def reap(processes: Iterable[tuple[int, str]], timeout: float = 15) -> list[str]:  # noqa: ASYNC109
    """Wait for the stdio servers of a killed agentwake to go (their stdin closed); SIGKILL any still
    there, recognised by pid and command line. Returns the command lines of the ones killed."""
    processes = list(processes)

    def still(pid: int, line: str) -> bool:
        return alive(pid) and cmdline(pid) == line

    deadline = time.monotonic() + timeout
    while any(still(*p) for p in processes) and time.monotonic() < deadline:  # noqa: ASYNC110
        await anyio.sleep(0.05)
    stuck = [(pid, line) for pid, line in processes if still(pid, line)]
    for pid, _ in stuck:
        os.kill(pid, signal.SIGKILL)
    return [line for _, line in stuck]
