"""Helpers for the chaos test (tests/test_chaos.py): the processes, a load balancer, and what the
store, the servers and the processes' logs say.

- ``Lifetime`` / ``run_agentwake``: one `agentwake run` process from start to exit, its JSON log
  lines read to the end (so the last lines before a SIGKILL are there too); ``Cluster``: the
  processes in their slots, killed (``Kill``: what the killed one held) and started again.
- ``Balancer``: a TCP round-robin forwarder in front of the processes' webhook receivers, as a load
  balancer would be; TLS passes through (each receiver terminates it). A receiver that refuses the
  connection (its process is dead) is skipped.
- ``read_store``: agentwake's store read with plain SQL, as ``_faults.Snapshot`` plus every inbox
  row and the subscriptions' lease rows.
- ``CursorSamples``: the stored cursors, with the inbox they were stored with (one REPEATABLE READ
  transaction), read every ``interval_s`` while the chaos runs.
- ``Asked``: the demo servers' DEMO_CURSOR_LOG: the cursor each request asked from.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc
import psycopg
from _faults import Run, Snapshot, StoredEvent, children, command_lines, pipe_both_ways, reap
from anyio.abc import SocketAttribute, SocketStream
from conftest import REPO

from agentwake.clock import iso

DRIVES: Final = ": this process drives it now (fence "
READY: Final = "policy: "  # logged just before the supervisor (and its lease rounds) starts


# ---- the processes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Logged:
    at: float  # time.time() of the record
    message: str


def logged(lines: list[str]) -> list[Logged]:
    """The JSON log records among ``lines`` (``[log] format = "json"``), with their times."""
    found = []
    for line in lines:
        try:
            record = json.loads(line)
            at = datetime.fromisoformat(record["time"].replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # not a record (a traceback's line, a warning printed before logging was set up)
        found.append(Logged(at, str(record.get("message", ""))))
    return found


@dataclass
class Lifetime:
    """One `agentwake run` process: slot (which receiver port it listens on), its log, its end."""

    slot: int
    process: anyio.abc.Process
    started_at: float
    lines: list[str] = field(default_factory=list)
    ended: anyio.Event = field(default_factory=anyio.Event)  # exited, and its stderr read to the end
    killed_at: float | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def log(self) -> list[Logged]:
        return logged(self.lines)

    def ready_at(self) -> float | None:
        return next((line.at for line in self.log() if line.message.startswith(READY)), None)

    def drives(self) -> list[tuple[float, str, int]]:
        """(time, subscription, fence) of each "this process drives it now" line."""
        found = []
        for line in self.log():
            if DRIVES in line.message:
                name, _, rest = line.message.removeprefix("subscription ").partition(DRIVES)
                found.append((line.at, name, int(rest.rstrip(")"))))
        return found

    def tail(self, last: int = 30) -> str:
        return f"--- pid {self.pid} (slot {self.slot}):\n" + "\n".join(self.lines[-last:])


async def run_agentwake(
    config: Path, env: dict[str, str], slot: int, *, task_status: anyio.abc.TaskStatus[Lifetime]
) -> None:
    """`agentwake run -c config` in the config's folder until it exits; killed if cancelled first."""
    process = await anyio.open_process(
        [sys.executable, "-m", "agentwake.cli", "run", "-c", str(config)],
        cwd=config.parent,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )
    life = Lifetime(slot, process, time.time())
    try:
        task_status.started(life)
        assert process.stderr is not None
        pending = b""
        async for chunk in process.stderr:
            pending += chunk
            *complete, pending = pending.split(b"\n")
            life.lines.extend(line.decode(errors="replace") for line in complete)
        await process.wait()
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            with anyio.fail_after(30):
                await process.wait()
            await process.aclose()
        life.ended.set()


@dataclass(frozen=True)
class Kill:
    slot: int
    pid: int
    at: float
    held: dict[str, int]  # subscription -> fence of the unexpired leases it held at the kill


@dataclass
class Cluster:
    """The processes in their slots: slot ``n`` gets ``env_of(n)`` (its receiver's port)."""

    tg: anyio.abc.TaskGroup
    config: Path
    env_of: Callable[[int], dict[str, str]]
    lifetimes: list[Lifetime] = field(default_factory=list)
    current: dict[int, Lifetime] = field(default_factory=dict)
    stuck: list[str] = field(default_factory=list)  # stdio servers that outlived their killed process

    async def start(self, slot: int) -> Lifetime:
        life: Lifetime = await self.tg.start(run_agentwake, self.config, self.env_of(slot), slot)
        self.lifetimes.append(life)
        self.current[slot] = life
        return life

    async def kill(self, slot: int, conn: psycopg.AsyncConnection[Any]) -> Kill:
        """SIGKILL the slot's process; what it held then, from the lease rows."""
        life = self.current[slot]
        if not life.alive:
            raise AssertionError(f"exited on its own ({life.process.returncode}):\n{life.tail(80)}")
        servers = command_lines(children(life.pid))
        life.killed_at = time.time()
        life.process.send_signal(signal.SIGKILL)
        with anyio.fail_after(30):
            await life.ended.wait()
        now = iso(datetime.fromtimestamp(life.killed_at, UTC))
        held = {
            name: fence
            for name, (owner, fence, until) in (await read_store(conn)).owners.items()
            if owner_pid(owner) == life.pid and until > now
        }
        self.tg.start_soon(self._reap, servers)
        return Kill(slot, life.pid, life.killed_at, held)

    async def _reap(self, servers: list[tuple[int, str]]) -> None:
        self.stuck += await reap(servers)

    def by_pid(self, pid: int) -> Lifetime | None:
        found = [life for life in self.lifetimes if life.pid == pid]
        return found[0] if len(found) == 1 else None

    def save_logs(self, folder: Path) -> None:
        folder.mkdir(exist_ok=True)
        for life in self.lifetimes:
            (folder / f"slot{life.slot}-pid{life.pid}.log").write_text("\n".join(life.lines) + "\n")

    def logs(self) -> str:
        return "\n".join(life.tail() for life in self.lifetimes)


# ---- the load balancer ------------------------------------------------------------------------------


@dataclass
class Balancer:
    """Round robin over ``backends`` (loopback ports), per connection; a refused one is skipped."""

    backends: list[int]
    port: int = 0
    connections: Counter[int] = field(default_factory=Counter)  # forwarded, per backend port
    refused: int = 0
    _turn: int = 0

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        async with listener:
            self.port = listener.extra(SocketAttribute.local_port)
            task_status.started()
            await listener.serve(self._forward)

    async def _connect(self) -> SocketStream | None:
        for _ in self.backends:
            port = self.backends[self._turn % len(self.backends)]
            self._turn += 1
            try:
                upstream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                self.refused += 1
                continue
            self.connections[port] += 1
            return upstream
        return None

    async def _forward(self, client: SocketStream) -> None:
        async with client:
            upstream = await self._connect()
            if upstream is None:
                return  # every receiver down: the sender sees the connection closed, and retries
            async with upstream:
                await pipe_both_ways(client, upstream)


# ---- the store, read from outside ----------------------------------------------------------------------


@dataclass(frozen=True)
class StoreView:
    snapshot: Snapshot  # keyed by event id: the subscriptions' tickets are disjoint
    rows: list[tuple[str, str]]  # (subscription, event id) of every inbox row
    owners: dict[str, tuple[str, int, str]]  # subscription -> (owner, fence, lease_until)
    event_of_row: dict[int, str]  # inbox row id -> event id


async def read_store(conn: psycopg.AsyncConnection[Any]) -> StoreView:
    """agentwake's store as it is now, in one REPEATABLE READ transaction."""
    async with conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        calls: dict[int, list[tuple[str, str | None]]] = {}
        for run_id, status, key in await (
            await conn.execute("SELECT run_id, status, idempotency_key FROM tool_calls ORDER BY id")
        ).fetchall():
            calls.setdefault(run_id, []).append((status, key))
        runs: dict[int, list[Run]] = {}
        for run_id, row, status, attempt, reason in await (
            await conn.execute("SELECT id, event_row, status, attempt, reason FROM runs ORDER BY id")
        ).fetchall():
            runs.setdefault(row, []).append(
                Run(run_id, status, attempt, reason, tuple(calls.get(run_id, ())))
            )
        event_rows = await (
            await conn.execute("SELECT id, event_id, subscription, state, last_error FROM events ORDER BY id")
        ).fetchall()
        subscriptions = await (
            await conn.execute("SELECT name, cursor, duplicates, gaps FROM subscriptions")
        ).fetchall()
        (gap_rows,) = await (await conn.execute("SELECT count(*) FROM gaps")).fetchone() or (0,)
        owners = await (
            # Not the processes' own rows (@owner, !owner server since: agentwake.ownership's balance).
            await conn.execute(
                "SELECT subscription, owner, fence, lease_until FROM subscription_owners"
                " WHERE left(subscription, 1) NOT IN ('@', '!', '?')"
            )
        ).fetchall()
    events = {
        event_id: StoredEvent(event_id, subscription, state, last_error, tuple(runs.get(row, ())))
        for row, event_id, subscription, state, last_error in event_rows
    }
    snapshot = Snapshot(
        events,
        {name: cursor for name, cursor, _, _ in subscriptions},
        {name: duplicates for name, _, duplicates, _ in subscriptions},
        {name: gaps for name, _, _, gaps in subscriptions},
        gap_rows,
    )
    return StoreView(
        snapshot,
        [(subscription, event_id) for _, event_id, subscription, _, _ in event_rows],
        {name: (owner, fence, until) for name, owner, fence, until in owners},
        {row: event_id for row, event_id, _, _, _ in event_rows},
    )


def owner_pid(owner: str) -> int:
    """The pid in a lease row's owner, ``host:pid:random`` (agentwake.ownership.owner_id)."""
    return int(owner.split(":")[-2])


@dataclass(frozen=True)
class Sample:
    at: float  # time.time() once the read returned: every value in it was committed before
    cursors: dict[str, str | None]
    stored: dict[str, frozenset[str]]  # subscription -> the event ids in its inbox


@dataclass
class CursorSamples:
    """The stored cursors (and the inbox with them) every ``interval_s``, until cancelled."""

    url: str
    interval_s: float = 0.1
    samples: list[Sample] = field(default_factory=list)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        conn = await psycopg.AsyncConnection.connect(self.url)
        try:
            task_status.started()
            while True:
                self.samples.append(await self.sample(conn))
                await anyio.sleep(self.interval_s)
        finally:
            with anyio.CancelScope(shield=True):  # cancelled is how it ends: close it all the same
                await conn.close()

    @staticmethod
    async def sample(conn: psycopg.AsyncConnection[Any]) -> Sample:
        async with conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursors = await (await conn.execute("SELECT name, cursor FROM subscriptions")).fetchall()
            rows = await (await conn.execute("SELECT subscription, event_id FROM events")).fetchall()
        stored: dict[str, set[str]] = {}
        for subscription, event_id in rows:
            stored.setdefault(subscription, set()).add(event_id)
        return Sample(
            time.time(),
            {name: cursor for name, cursor in cursors},
            {name: frozenset(ids) for name, ids in stored.items()},
        )


# ---- what the servers were asked ----------------------------------------------------------------------


@dataclass(frozen=True)
class Asked:
    """One DEMO_CURSOR_LOG line: a request for ticket.created from ``cursor``."""

    at: float
    server_pid: int
    client_pid: int | None  # over stdio, the `agentwake run` that started the server
    mode: str
    queue: str | None
    cursor: str | None


def read_asked(path: Path) -> list[Asked]:
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        found.append(
            Asked(
                record["at"],
                record["server_pid"],
                record["client_pid"],
                record["mode"],
                record["arguments"].get("queue"),
                record["cursor"],
            )
        )
    return found


async def eventually(
    condition: Callable[[], Any], what: str, limit_s: float, detail: Callable[[], str] = str
) -> None:
    """Wait until the coroutine function ``condition`` returns true (checked every 50 ms): the
    processes and the database signal nothing."""
    try:
        with anyio.fail_after(limit_s):
            while not await condition():  # noqa: ASYNC110 - written by other processes
                await anyio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {limit_s:g}s: {what}\n{detail()}") from None
