"""agentwake beside a hostile MCP events server (tests/hostile_server.py) and a well-behaved one.

Each test runs one misbehaviour (``HOSTILE_MODE``) on the subscription "hostile" while
tests/feed_server.py feeds the subscription "good" (a long backlog, drained as fast as
it goes). Whatever the hostile server does, the service's task group must keep running
and "good" must keep storing events; then each test checks what agentwake should do
about that misbehaviour.

Most tests run the supervisor in-process (a real SQLite store, real stdio servers). A
watchdog interrupts the event loop when it has been blocked for too long (5 s; 2 s for the
catastrophic pattern), so a freeze fails the test instead of hanging it; waits look at
conditions (the hostile server's request log, store counts) every 20 ms under a deadline.
The stderr flood, the memory ceiling of the real process and SIGTERM are checked on the
real ``agentwake run`` in a subprocess.

These tests state the contract of the fixes for the issue's list of misbehaviours; on
code without those fixes most of them fail, each naming what went wrong.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
import signal
import socket
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from _support import set_cursor
from conftest import REPO

from agentwake.config import AgentConfig, AgentwakeConfig, parse_config
from agentwake.decide import Outcome
from agentwake.delivery.common import subscription_key
from agentwake.store import InboxEvent, RunKind, Store
from agentwake.store.sqlite import SqliteCore, SqliteStore
from agentwake.supervisor import Supervisor
from agentwake.worker import Worker

pytestmark = pytest.mark.anyio

HOSTILE = REPO / "tests" / "hostile_server.py"
FEED = REPO / "tests" / "feed_server.py"
FLOOR_MS = 200
# agentwake's own process (the subprocess tests) stays under this whatever a peer sends.
RSS_LIMIT_MB = 400
# In-process, the test process already holds what earlier tests loaded: what a peer may add to it.
RSS_GROWTH_LIMIT_MB = 250
# The event loop may be blocked this long before the watchdog calls it frozen.
FREEZE_LIMIT_S = 5.0
STDERR_MARKER = "HOSTILE-STDERR"


# ---- measuring the process ------------------------------------------------------------------------


def memory_mb(pid: int | str = "self") -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = re.search(r"VmRSS:\s+(\d+) kB", status)
    peak = re.search(r"VmHWM:\s+(\d+) kB", status)
    assert rss and peak
    return int(rss.group(1)) / 1024, int(peak.group(1)) / 1024


def reset_peak_rss() -> None:
    """Start VmHWM over from the current RSS (Linux: clear_refs 5)."""
    # Where that is not allowed the peak covers the whole session: a stricter check.
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


class Frozen(BaseException):
    """Raised in the main thread when the event loop has not run for too long."""


@contextmanager
def freeze_watch(limit_s: float) -> Iterator[Callable[[], None]]:
    """Interrupt the main thread with Frozen when the event loop stops calling the returned beat.

    Two alarms, re-armed by each beat: a thread for a loop blocked without using the CPU, and
    a CPU-time timer (SIGVTALRM, delivered even while the main thread holds the GIL in C code,
    say a regular expression that backtracks forever) for a loop that is busy.
    """
    last = [time.monotonic()]
    stop = threading.Event()

    def interrupt(signum: int, frame: object) -> None:
        raise Frozen(f"the event loop was blocked for more than {limit_s:g}s")

    def beat() -> None:
        last[0] = time.monotonic()
        signal.setitimer(signal.ITIMER_VIRTUAL, limit_s)

    def watch() -> None:
        while not stop.wait(0.05):
            if time.monotonic() - last[0] > limit_s:
                os.kill(os.getpid(), signal.SIGUSR1)
                return

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGUSR1, signal.SIGVTALRM)}
    watcher = threading.Thread(target=watch, name="freeze-watch", daemon=True)
    watcher.start()
    try:
        beat()
        yield beat
    finally:
        stop.set()
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        watcher.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ---- configuration ------------------------------------------------------------------------------------


def server_entries(tmp_path: Path, mode: str, *, arg: str | None, feed_items: int) -> dict[str, Any]:
    env = {"HOSTILE_MODE": mode, "HOSTILE_LOG": str(tmp_path / "hostile.log")}
    if arg is not None:
        env["HOSTILE_ARG"] = arg
    return {
        "feed": {
            "command": sys.executable,
            "args": [str(FEED)],
            "cwd": str(REPO),
            # PYTHONPATH: the agentwake of this checkout, whatever is installed.
            "env": {"FEED_ITEMS": str(feed_items), "PYTHONPATH": str(REPO)},
        },
        "hostile": {
            "command": sys.executable,
            "args": [str(HOSTILE)],
            "cwd": str(tmp_path),
            "env": env,
        },
    }


def subscription_entries(delivery: str, arguments: dict[str, Any] | None) -> list[dict[str, Any]]:
    hostile: dict[str, Any] = {
        "name": "hostile",
        "server": "hostile",
        "event": "h.tick",
        "delivery": delivery,
        "poll_floor_ms": FLOOR_MS,
        "heartbeat_s": 1,
    }
    if arguments:
        hostile["arguments"] = arguments
    return [{"name": "good", "server": "feed", "event": "feed.item", "delivery": "poll"}, hostile]


def make_config(
    tmp_path: Path,
    mode: str,
    *,
    delivery: str = "poll",
    arg: str | None = None,
    arguments: dict[str, Any] | None = None,
    feed_items: int = 100_000,
    agent: dict[str, Any] | None = None,
    limits: dict[str, Any] | None = None,
) -> AgentwakeConfig:
    raw: dict[str, Any] = {
        "store": {"path": str(tmp_path / "aw.db")},
        "servers": server_entries(tmp_path, mode, arg=arg, feed_items=feed_items),
        "subscriptions": subscription_entries(delivery, arguments),
    }
    if agent is not None:
        raw["agent"] = agent
    if limits is not None:
        raw["limits"] = limits
    return parse_config(raw, env={})


# ---- the in-process rig -----------------------------------------------------------------------------


def read_log(path: Path) -> list[dict[str, Any]]:
    """The hostile server's request log (complete lines only)."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]
    return [json.loads(line) for line in lines]


@dataclass
class Rig:
    """A running supervisor with "good" (feed server) and "hostile" (hostile server) subscriptions."""

    tmp: Path
    config: AgentwakeConfig
    store: SqliteStore
    supervisor: Supervisor
    caplog: pytest.LogCaptureFixture
    crash: BaseException | None = None
    peak_rss_mb: float = 0.0
    rss_limit_mb: float | None = None
    start_rss_mb: float = 0.0

    # -- what happened

    def requests(self, method: str | None = None) -> list[dict[str, Any]]:
        return [r for r in read_log(self.tmp / "hostile.log") if method is None or r["method"] == method]

    def polls(self) -> list[dict[str, Any]]:
        return self.requests("events/poll")

    def count(self, subscription: str, state: str | None = None) -> int:
        sql, args = "SELECT count(*) FROM events WHERE subscription = ?", [subscription]
        if state is not None:
            sql, args = sql + " AND state = ?", [*args, state]
        return int(self.store.core.conn.execute(sql, args).fetchone()[0])

    def hostile_ids(self) -> list[str]:
        return self.store.core.event_ids("hostile")

    def row(self, name: str = "hostile") -> dict[str, Any]:
        return next(r for r in self.store.core.subscriptions() if r["subscription"] == name)

    def last_error(self, name: str = "hostile") -> str:
        return self.row(name)["last_error"] or ""

    # -- waiting

    def check_alive(self) -> None:
        if self.crash is not None:
            raise AssertionError(f"the supervisor's task group ended: {self.crash!r}") from self.crash
        if self.rss_limit_mb is not None and self.peak_rss_mb - self.start_rss_mb > self.rss_limit_mb:
            raise AssertionError(
                f"the process grew by {self.peak_rss_mb - self.start_rss_mb:.0f} MB, to"
                f" {self.peak_rss_mb:.0f} MB (limit: {self.rss_limit_mb} MB of growth)"
            )

    async def until(self, predicate: Callable[[], bool], what: str, within: float = 8.0) -> None:
        """Wait (looking every 20 ms) until predicate() holds; fail with ``what`` after ``within`` seconds."""
        try:
            with anyio.fail_after(within):
                while True:
                    self.check_alive()
                    if predicate():
                        return
                    await anyio.sleep(0.02)
        except TimeoutError:
            self.check_alive()
            raise AssertionError(f"not within {within:g}s: {what} [{self.summary()}]") from None

    def summary(self) -> str:
        row = self.row()
        return (
            f"hostile: {row['status']}, {self.count('hostile')} events, {len(self.polls())} polls,"
            f" {len(self.requests('events/list'))} lists, peak RSS {self.peak_rss_mb:.0f} MB,"
            f" last error {row['last_error']!r}; good: {self.count('good')} events"
        )

    async def acted(self, method: str, n: int, within: float = 8.0) -> None:
        """Wait until the hostile server has received ``n`` requests of ``method``."""
        await self.until(
            lambda: len(self.requests(method)) >= n, f"the hostile server got {n} {method}", within
        )

    async def good_keeps_flowing(self, more: int = 50, within: float = 8.0) -> None:
        """The common check: nothing ended the task group, and "good" stores ``more`` new events."""
        self.check_alive()
        start = self.count("good")
        await self.until(
            lambda: self.count("good") >= start + more,
            f"the good subscription stored {more} more events (it had {start})",
            within,
        )
        self.check_alive()

    # -- tasks

    async def _supervise(self) -> None:
        try:
            await self.supervisor.run()
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException as exc:  # recorded: every wait fails with it
            self.crash = exc
            return
        self.crash = AssertionError("Supervisor.run returned on its own")

    async def _beat(self, beat: Callable[[], None]) -> None:
        while True:
            beat()
            await anyio.sleep(0.05)

    async def _sample_rss(self) -> None:
        while True:
            self.peak_rss_mb = max(self.peak_rss_mb, *memory_mb())
            await anyio.sleep(0.05)


def only_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
        leaf = leaf.exceptions[0]
    return leaf


@asynccontextmanager
async def running(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    mode: str,
    *,
    freeze_limit_s: float = FREEZE_LIMIT_S,
    rss_limit_mb: float | None = None,
    make_agent: Callable[[AgentwakeConfig, Store], Any] | None = None,
    **options: Any,
) -> AsyncIterator[Rig]:
    caplog.set_level(logging.INFO, logger="agentwake")
    # Without an agent the worker logs every event it handles: thousands a second from "good".
    caplog.set_level(logging.WARNING, logger="agentwake.worker")
    config = make_config(tmp_path, mode, **options)
    store = await SqliteStore.open(config.store.path)
    try:
        # "good" starts at the beginning of its backlog, not "now", so it flows at once.
        await set_cursor(store, subscription_key(config.subscriptions[0]), "0")
        agent = make_agent(config, store) if make_agent is not None else None
        supervisor = Supervisor(
            config,
            store,
            worker=Worker(config, store, agent=agent),
            pool=None,
            reconnect_initial_s=0.05,
            reconnect_max_s=0.5,
        )
        rig = Rig(tmp_path, config, store, supervisor, caplog, rss_limit_mb=rss_limit_mb)
        reset_peak_rss()
        rig.start_rss_mb = memory_mb()[0]
        with freeze_watch(freeze_limit_s) as beat:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(rig._supervise)
                    tg.start_soon(rig._beat, beat)
                    tg.start_soon(rig._sample_rss)
                    try:
                        yield rig
                    finally:
                        tg.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                # The test's own failure, unwrapped from the task group, reads better.
                failure = only_leaf(group)
                if isinstance(failure, AssertionError):
                    raise failure from None
                raise
    finally:
        with anyio.CancelScope(shield=True):
            await store.close()


def files_containing(folder: Path, pattern: str, text: str) -> list[str]:
    return [p.name for p in folder.glob(pattern) if text.encode() in p.read_bytes()]


def records_text(caplog: pytest.LogCaptureFixture) -> str:
    parts = []
    for record in caplog.records:
        parts.append(record.getMessage())
        if record.exc_text:
            parts.append(record.exc_text)
    return "\n".join(parts)


# ---- schema -------------------------------------------------------------------------------------------

SCHEMA_ERROR = re.compile(r"input ?schema", re.IGNORECASE)


async def assert_schema_refused(rig: Rig, *, ended_within: float = 8.0) -> None:
    """The subscription stops as invalid (until the server's event list changes), with a message about
    its inputSchema, and the other one flows."""
    await rig.acted("events/list", 1)
    listed = rig.requests("events/list")[0]["t"]
    await rig.until(
        lambda: rig.row()["status"] == "invalid",
        f"the hostile subscription stopped within {ended_within:g}s of its events/list",
        within=max(0.5, listed + ended_within - time.time()),
    )
    await rig.good_keeps_flowing()
    assert SCHEMA_ERROR.search(rig.last_error()), rig.last_error()
    assert rig.polls() == [], "a subscription whose inputSchema is unusable must not be polled"


@pytest.mark.parametrize("mode", ["schema-unknown-type", "schema-recursive-ref"])
async def test_an_unusable_input_schema_ends_only_its_own_subscription(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    async with running(tmp_path, caplog, mode) as rig:
        await assert_schema_refused(rig)


class Listener:
    """A loopback socket that counts the connections made to it (and closes each at once)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="ref-listener", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


async def test_a_remote_ref_in_an_input_schema_is_never_fetched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("no_proxy", "*")  # were a proxy configured, a fetch would still only go to loopback
    listener = Listener()
    try:
        url = f"http://127.0.0.1:{listener.port}/x.json"
        async with running(tmp_path, caplog, "schema-remote-ref", arg=url) as rig:
            await assert_schema_refused(rig)
    finally:
        listener.close()
    assert listener.connections == 0, "agentwake fetched the server's remote $ref"


async def test_a_file_ref_in_an_input_schema_is_never_read_nor_its_content_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = f"treasure{uuid.uuid4().hex}"
    schema = tmp_path / "secret-schema.json"
    schema.write_text(json.dumps({"type": "object", "required": [secret], "const": secret}))
    async with running(tmp_path, caplog, "schema-file-ref", arg=schema.as_uri()) as rig:
        await assert_schema_refused(rig)
        rows = json.dumps(rig.store.core.subscriptions())
    assert secret not in records_text(caplog)
    assert secret not in rows
    assert not files_containing(tmp_path, "aw.db*", secret)


async def test_a_catastrophic_pattern_in_an_input_schema_does_not_freeze_the_service(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(
        tmp_path, caplog, "schema-catastrophic-pattern", arguments={"q": "a" * 40}, freeze_limit_s=2.0
    ) as rig:
        await assert_schema_refused(rig, ended_within=3.0)


# ---- poll ---------------------------------------------------------------------------------------------


def gaps_between(requests: Sequence[dict[str, Any]]) -> list[float]:
    times = [r["t"] for r in requests]
    return [b - a for a, b in itertools.pairwise(times)]


@pytest.mark.parametrize(
    ("mode", "polls"),
    [
        # 1e400 is clamped to max_next_poll_ms (1 h): one poll, whose page still counts.
        ("next-poll-huge", 1),
        ("next-poll-negative", 4),
        ("next-poll-float", 4),
        # Not a number: no suggestion, the 5 s default.
        ("next-poll-string", 2),
    ],
)
async def test_a_nonsensical_next_poll_ms_is_clamped_and_the_page_still_counts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: str, polls: int
) -> None:
    async with running(tmp_path, caplog, mode) as rig:
        await rig.acted("events/poll", polls, within=12)
        await rig.good_keeps_flowing()
        assert rig.row()["status"] == "active"
        gaps = gaps_between(rig.polls())
        assert not gaps or min(gaps) >= FLOOR_MS / 1000 - 0.01, f"polls closer than poll_floor_ms: {gaps}"
        # The page is good apart from nextPollMs: its cursor is stored, and so are its events (the
        # first poll, from no cursor, brings none).
        await rig.until(
            lambda: rig.row()["cursor"] is not None and len(rig.hostile_ids()) >= polls - 1,
            f"the hostile subscription stored its pages (last error: {rig.last_error()!r})",
            within=3,
        )


async def poll_rate_window(rig: Rig, window_s: float) -> int:
    """How many polls the hostile server got in a window of ``window_s``, starting now."""
    start = time.time()
    await rig.until(
        lambda: any(r["t"] >= start + window_s for r in rig.polls()),
        f"a poll after a window of {window_s:g}s",
        within=window_s + 8,
    )
    return sum(1 for r in rig.polls() if start <= r["t"] < start + window_s)


async def test_a_server_that_always_has_more_but_sends_nothing_is_not_polled_in_a_busy_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(tmp_path, caplog, "has-more-empty") as rig:
        await rig.acted("events/poll", 3)
        await rig.good_keeps_flowing()
        window_s = 1.5
        polls = await poll_rate_window(rig, window_s)
        assert polls <= window_s / (FLOOR_MS / 1000) + 2, f"{polls} polls in {window_s}s: a busy loop"
        assert rig.row()["status"] == "active"


async def test_a_server_that_truncates_every_poll_costs_one_gap_per_poll_and_bounded_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(tmp_path, caplog, "truncated-every-poll") as rig:
        await rig.acted("events/poll", 3)
        await rig.good_keeps_flowing()
        window_s = 2.0
        polls = await poll_rate_window(rig, window_s)
        assert polls <= window_s / (FLOOR_MS / 1000) + 2, f"{polls} polls in {window_s}s: a busy loop"
        total_polls = len(rig.polls())
        assert total_polls >= 10
        gaps = len(rig.store.core.gaps("hostile"))
        assert gaps <= total_polls, f"{gaps} gaps for {total_polls} polls"
        warnings = [
            r
            for r in caplog.records
            if r.levelno >= logging.WARNING and "hostile" in r.getMessage() and "gap" in r.getMessage()
        ]
        assert len(warnings) <= 3, f"{len(warnings)} gap warnings for {total_polls} polls"


async def test_a_busy_answer_is_not_a_reason_to_respawn_the_server(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(tmp_path, caplog, "poll-error-32000") as rig:
        await rig.acted("events/poll", 1)
        await rig.until(lambda: "server busy" in rig.last_error(), "last_error says the server is busy")
        await rig.good_keeps_flowing()
        assert "server busy" in rig.last_error()
    pids = {r["pid"] for r in rig.requests()}
    assert len(pids) == 1, f"the hostile server was started {len(pids)} times"


async def test_an_unknown_error_code_is_retried_with_backoff_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(tmp_path, caplog, "poll-error-unknown") as rig:
        await rig.acted("events/poll", 1)
        await rig.good_keeps_flowing()
        await rig.until(lambda: "-32099" in rig.last_error(), "last_error shows the -32099 answer")
        # Retried with backoff: polled again, never "ended" (whether it shows as active or stalled).
        await rig.acted("events/poll", 3, within=6)
        assert rig.row()["status"] != "ended", rig.last_error()
        gaps = gaps_between(rig.polls())
        assert min(gaps) >= 0.2, f"retried without backoff: {gaps}"


async def test_a_malformed_poll_result_names_the_field_that_is_wrong(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(tmp_path, caplog, "poll-malformed") as rig:
        await rig.acted("events/poll", 2)
        await rig.good_keeps_flowing()

        def names_the_field() -> bool:
            # On the subscription (the page refused), or on the refused event's record (the event refused).
            reasons = [r["last_error"] or "" for r in rig.store.core.inbox(10, state="rejected")]
            return "events.0.timestamp" in rig.last_error() or any("timestamp" in r for r in reasons)

        await rig.until(names_the_field, "the error names the missing field (events.0.timestamp)")


def rejected_count(rig: Rig) -> int:
    return int(rig.row().get("rejected") or 0)


async def test_events_of_another_type_are_rejected_not_stored_as_the_subscribed_type(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(tmp_path, caplog, "wrong-event-name") as rig:
        await rig.acted("events/poll", 3)
        await rig.good_keeps_flowing()
        await rig.until(lambda: len(rig.hostile_ids()) >= 1, "the hostile subscription stored something")
        states = rig.store.core.conn.execute(
            "SELECT DISTINCT state FROM events WHERE name = 'alert.fired'"
        ).fetchall()
        assert {s for (s,) in states} <= {"rejected"}, f"alert.fired stored as {states}"
        assert rejected_count(rig) > 0
        assert any(i.startswith("h-") for i in rig.hostile_ids())  # the right type still gets through


OVERSIZED = {
    "oversized-id": "length(event_id) >= 1048576",
    "oversized-timestamp": "length(timestamp) >= 10240",
    "oversized-data": "length(data) >= 20971520",
}


@pytest.mark.parametrize("mode", sorted(OVERSIZED))
async def test_an_oversized_event_is_rejected_recorded_as_a_gap_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    async with running(tmp_path, caplog, mode, rss_limit_mb=RSS_GROWTH_LIMIT_MB) as rig:
        await rig.acted("events/poll", 2)
        await rig.good_keeps_flowing()
        await rig.until(
            lambda: {"h-2", "h-3"} <= set(rig.hostile_ids()),
            f"later events stored (last error: {rig.last_error()!r})",
        )
        verbatim = rig.store.core.conn.execute(f"SELECT count(*) FROM events WHERE {OVERSIZED[mode]}")
        assert verbatim.fetchone()[0] == 0, "the oversized event was stored verbatim"
        rejected = rig.store.core.inbox(10, state="rejected")
        assert [r["subscription"] for r in rejected] == ["hostile"]
        assert rejected_count(rig) > 0
        assert rig.store.core.gaps("hostile"), "skipping the oversized event is a gap"
        rig.check_alive()
        assert rig.peak_rss_mb - rig.start_rss_mb < RSS_GROWTH_LIMIT_MB


@dataclass
class CountingAgent:
    """Stands in for the agent stage: each run takes a while, as an LLM call does, and marks its event done."""

    agent: AgentConfig
    store: Store
    run_s: float = 0.05
    handled: list[str] = field(default_factory=list)

    async def warm_up(self) -> None:
        return None

    async def run(
        self, outcome: Outcome, *, kind: RunKind = "agent", batch: Sequence[InboxEvent] = ()
    ) -> None:
        await anyio.sleep(self.run_s)
        self.handled.append(outcome.event.subscription)
        await self.store.finish([outcome.event.id], "done")


async def test_a_flooding_subscription_does_not_starve_the_agent_runs_of_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agents: list[CountingAgent] = []

    def make_agent(config: AgentwakeConfig, store: Store) -> CountingAgent:
        assert config.agent is not None
        agents.append(CountingAgent(config.agent, store))
        return agents[0]

    agent_config = {"model": "openai/never-called", "concurrency": 2, "prompts": str(REPO / "prompts")}
    async with running(tmp_path, caplog, "flood", agent=agent_config, make_agent=make_agent) as rig:
        [agent] = agents
        await rig.acted("events/poll", 5)
        await rig.good_keeps_flowing()
        before = agent.handled.count("good")
        polls = len(rig.polls())
        await rig.until(
            lambda: agent.handled.count("good") >= before + 10,
            f"10 good events reached the agent during the flood (it ran {len(agent.handled)} events,"
            f" {agent.handled.count('good')} of them good; {rig.count('hostile')} flood events stored)",
            within=15,
        )
        # The flood went on meanwhile, up to the bound on what one subscription may hold undecided.
        assert len(rig.polls()) > polls or rig.row()["status"] == "held_back", rig.summary()
        assert rig.count("hostile", "pending") <= rig.config.limits.max_undecided_events + 200


# ---- push ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["push-terminated-bad-code", "push-terminated-string-error"])
async def test_a_terminated_notification_with_a_malformed_error_ends_the_subscription_with_a_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    async with running(tmp_path, caplog, mode, delivery="push") as rig:
        await rig.acted("events/stream", 1)
        await rig.until(lambda: rig.row()["status"] == "ended", "the hostile subscription ended")
        await rig.good_keeps_flowing()
        assert "terminated" in rig.last_error() or "ended" in rig.last_error(), rig.last_error()
        assert rig.hostile_ids() == ["h-1", "h-2", "h-3"]  # what came before it is kept


async def test_an_error_notification_that_is_a_bare_string_is_counted_and_the_stream_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(tmp_path, caplog, "push-error-string", delivery="push") as rig:
        await rig.acted("events/stream", 1)
        await rig.until(lambda: len(rig.hostile_ids()) >= 8, "the hostile stream went on after its error")
        await rig.good_keeps_flowing()
        assert rig.row()["stream_errors"] >= 2  # the server sends one after events 2, 7, 12, ...
        assert rig.row()["status"] == "active"


@pytest.mark.parametrize("mode", ["push-unparsable-event", "push-deep-nesting"])
async def test_an_unreadable_stream_event_is_a_gap_and_the_stream_moves_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    async with running(tmp_path, caplog, mode, delivery="push") as rig:
        await rig.acted("events/stream", 1)
        await rig.until(
            lambda: {"h-4", "h-5", "h-6"} <= set(rig.hostile_ids()), "later events of the stream stored"
        )
        await rig.good_keeps_flowing()
        assert rig.store.core.gaps("hostile"), "the event that could not be read is a gap"


# ---- transport ----------------------------------------------------------------------------------------


async def test_a_response_with_invalid_utf8_does_not_cost_the_subscription(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(tmp_path, caplog, "invalid-utf8") as rig:
        await rig.acted("events/poll", 2)
        await rig.good_keeps_flowing()
        await rig.until(
            lambda: {"h-2", "h-3"} <= set(rig.hostile_ids()),
            f"later hostile events stored (last error: {rig.last_error()!r})",
        )


async def test_junk_lines_on_stdout_are_reported_briefly_and_without_tracebacks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(tmp_path, caplog, "stdout-junk") as rig:
        await rig.acted("events/poll", 2)
        await rig.until(
            lambda: {"h-1", "h-2"} <= set(rig.hostile_ids()), "hostile events after the junk", within=12
        )
        await rig.good_keeps_flowing()
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) < 20, f"{len(loud)} warnings or errors for 10,000 junk lines"
    assert len(caplog.records) < 100, f"{len(caplog.records)} log records for 10,000 junk lines"
    traced = [r for r in caplog.records if r.exc_info or r.exc_text]
    assert not traced, f"{len(traced)} records with a traceback, e.g. {traced[0].getMessage()!r}"


async def test_a_50mb_line_on_stdout_does_not_exhaust_memory_and_later_events_arrive(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(tmp_path, caplog, "huge-line", rss_limit_mb=RSS_GROWTH_LIMIT_MB) as rig:
        await rig.acted("events/poll", 2)
        await rig.until(
            lambda: {"h-2", "h-3"} <= set(rig.hostile_ids()),
            f"later hostile events stored (last error: {rig.last_error()!r})",
            within=15,
        )
        await rig.good_keeps_flowing()
        assert rig.peak_rss_mb - rig.start_rss_mb < RSS_GROWTH_LIMIT_MB


EXIT_7 = re.compile(r"exit[^\n]*\b7\b")


async def test_a_server_that_exits_is_reported_with_its_exit_code(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(tmp_path, caplog, "exit-code") as rig:
        await rig.acted("events/poll", 1)
        await rig.good_keeps_flowing()
        await rig.until(
            lambda: bool(EXIT_7.search(rig.last_error()) or EXIT_7.search(caplog.text)),
            f"last_error or the log says the server exited with code 7 (last error: {rig.last_error()!r})",
            within=5,
        )


# ---- discovery ----------------------------------------------------------------------------------------


async def test_a_list_changed_flood_is_debounced_and_costs_little_cpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A short backlog for "good": the CPU is measured once it is drained.
    items = 5000
    async with running(tmp_path, caplog, "list-changed-flood", feed_items=items) as rig:
        await rig.acted("events/list", 1)
        await rig.good_keeps_flowing()
        await rig.until(
            lambda: rig.count("good") >= items and rig.count("good", "done") >= items,
            "the good backlog drained and handled",
            within=15,
        )
        window_s = 2.0
        start, cpu = time.time(), time.process_time()
        await rig.until(
            lambda: time.time() >= start + window_s and bool(rig.requests()),
            "the measurement window",
            within=window_s + 5,
        )
        used = (time.process_time() - cpu) / (time.time() - start)
        lists = sum(1 for r in rig.requests("events/list") if start <= r["t"] < start + window_s)
        assert lists <= 3 * window_s, f"{lists} events/list calls in {window_s:g}s"
        # Reading 1,000 notifications a second costs something (about 40% here); relisting for each, all.
        assert used < 0.6, f"the process used {used:.0%} of a core while the server flooded list_changed"
        rig.check_alive()


async def test_an_endless_paginated_events_list_is_cut_at_a_size_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(tmp_path, caplog, "list-pages-flood", rss_limit_mb=RSS_GROWTH_LIMIT_MB) as rig:
        await rig.acted("events/list", 2)
        await rig.good_keeps_flowing()
        await rig.until(
            lambda: bool(re.search(r"limit|too (large|big|long)|exceed", rig.last_error(), re.IGNORECASE)),
            "last_error on the hostile subscription names the size limit",
        )
        assert rig.peak_rss_mb - rig.start_rss_mb < RSS_GROWTH_LIMIT_MB


# ---- the real service in a subprocess ------------------------------------------------------------------


def write_toml(tmp_path: Path, mode: str, *, arguments: dict[str, Any] | None = None) -> Path:
    """The same two servers and subscriptions as the in-process rig, as an agentwake.toml."""

    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return json.dumps(v)

    lines = ['[store]\npath = "aw.db"\n', '[log]\nlevel = "INFO"\n']
    for name, server in server_entries(tmp_path, mode, arg=None, feed_items=100_000).items():
        lines.append(f"[servers.{name}]")
        lines.extend(f"{k} = {value(v)}" for k, v in server.items())
        lines.append("")
    for sub in subscription_entries("poll", arguments):
        lines.append("[[subscriptions]]")
        lines.extend(f"{k} = {value(v)}" for k, v in sub.items())
        lines.append("")
    path = tmp_path / "agentwake.toml"
    path.write_text("\n".join(lines))
    return path


def db_count(db: Path, subscription: str) -> int:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            row = conn.execute(
                "SELECT count(*) FROM events WHERE subscription = ?", [subscription]
            ).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return 0
    return int(row[0])


@dataclass
class Service:
    """``agentwake run`` in a subprocess, its stderr in a file."""

    tmp: Path
    process: anyio.abc.Process
    stderr: Path
    peak_rss_mb: float = 0.0

    def requests(self, method: str) -> list[dict[str, Any]]:
        return [r for r in read_log(self.tmp / "hostile.log") if r["method"] == method]

    def count(self, subscription: str) -> int:
        return db_count(self.tmp / "aw.db", subscription)

    def sample(self) -> None:
        with contextlib.suppress(OSError, AssertionError):  # it may have exited meanwhile
            self.peak_rss_mb = max(self.peak_rss_mb, memory_mb(self.process.pid)[1])

    async def until(self, predicate: Callable[[], bool], what: str, within: float = 60.0) -> None:
        try:
            with anyio.fail_after(within):
                while not predicate():
                    self.sample()
                    if self.process.returncode is not None:
                        raise AssertionError(f"agentwake exited ({self.process.returncode}):\n{self.tail()}")
                    await anyio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(
                f"not within {within:g}s: {what} [agentwake peaked at {self.peak_rss_mb:.0f} MB; hostile:"
                f" {self.count('hostile')} events; good: {self.count('good')} events]"
            ) from None
        self.sample()

    async def good_keeps_flowing(self, more: int = 50) -> None:
        start = self.count("good")
        await self.until(lambda: self.count("good") >= start + more, f"good stored {more} more events")

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.stderr.read_bytes().decode(errors="replace").splitlines()[-lines:])

    async def stop(self, limit_s: float = 10.0) -> None:
        """SIGTERM, then a clean exit (code 0) within ``limit_s``."""
        self.process.send_signal(signal.SIGTERM)
        try:
            with anyio.fail_after(limit_s):
                code = await self.process.wait()
        except TimeoutError:
            raise AssertionError(f"agentwake did not exit within {limit_s:g}s of SIGTERM") from None
        assert code == 0, f"agentwake exited with code {code} after SIGTERM:\n{self.tail()}"


@asynccontextmanager
async def service(tmp_path: Path, mode: str, **options: Any) -> AsyncIterator[Service]:
    config = write_toml(tmp_path, mode, **options)
    # "good" starts at the beginning of its backlog, as in the rig.
    good = subscription_key(make_config(tmp_path, mode).subscriptions[0])
    seeded = SqliteCore.open(tmp_path / "aw.db")
    seeded.register(good)
    seeded.ingest(good, [], "0")
    seeded.close()
    stderr = tmp_path / "stderr.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with stderr.open("wb") as err:
        process = await anyio.open_process(
            [sys.executable, "-m", "agentwake.cli", "run", "-c", str(config)],
            cwd=tmp_path,
            env=env,
            stdin=None,
            stdout=None,
            stderr=err,
        )
    try:
        yield Service(tmp_path, process, stderr)
    finally:
        if process.returncode is None:
            process.kill()
            with anyio.CancelScope(shield=True):
                await process.wait()
        await process.aclose()


@pytest.mark.slow
async def test_a_server_flooding_stderr_reaches_ours_prefixed_with_its_name_and_bounded(
    tmp_path: Path,
) -> None:
    async with service(tmp_path, "stderr-flood") as svc:
        await svc.until(lambda: len(svc.requests("events/poll")) >= 3, "the hostile server polled 3 times")
        await svc.good_keeps_flowing()
        await svc.stop()
    marker = STDERR_MARKER.encode()
    theirs = [line for line in svc.stderr.read_bytes().split(b"\n") if marker in line]
    assert theirs, "none of the server's stderr reached ours"
    unprefixed = sum(1 for line in theirs if b"hostile" not in line[: line.index(marker)])
    first = theirs[0].decode(errors="replace")
    assert unprefixed == 0, f"{unprefixed} of {len(theirs)} lines without the server's name, e.g. {first!r}"
    size = sum(len(line) + 1 for line in theirs)
    assert size < 2 * 1024 * 1024, f"{size / 1024 / 1024:.1f} MB of the server's stderr reached ours"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["huge-line", "oversized-data"])
async def test_the_real_service_stays_under_400mb_beside_a_server_sending_huge_messages(
    tmp_path: Path, mode: str
) -> None:
    async with service(tmp_path, mode) as svc:
        await svc.until(lambda: len(svc.requests("events/poll")) >= 3, "the hostile server polled 3 times")
        await svc.until(lambda: svc.count("hostile") >= 2, "later hostile events stored", within=60)
        await svc.good_keeps_flowing()
        assert svc.peak_rss_mb <= RSS_LIMIT_MB, f"agentwake peaked at {svc.peak_rss_mb:.0f} MB"
        await svc.stop()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "method", "arguments"),
    [
        ("list-changed-flood", "events/list", None),
        ("has-more-empty", "events/poll", None),
        ("schema-catastrophic-pattern", "events/list", {"q": "a" * 40}),
    ],
)
async def test_sigterm_stops_the_real_service_within_10s_while_a_server_misbehaves(
    tmp_path: Path, mode: str, method: str, arguments: dict[str, Any] | None
) -> None:
    needed = 1 if mode.startswith("schema-") else 3
    async with service(tmp_path, mode, arguments=arguments) as svc:
        await svc.until(
            lambda: len(svc.requests(method)) >= needed, f"the hostile server got {needed} {method}"
        )
        await svc.stop(10.0)
