"""One frozen process does not stall the others (issue 30): the server-side session timeouts of the
PostgreSQL store (``agentwake.store.postgres.base``, "Timeouts"), and claims that take the claims'
advisory lock only under limits.

The frozen process is real: ``tests/frozen_store.py`` opens the store as ``agentwake run`` does and
stops itself (SIGSTOP) inside one of the store's transactions, its locks held: an ingest after its
fence check, a lease round, a claim. It stays stopped until the test ends (its ``finally``
continues it), so whatever waited for it would wait the whole test; this process, with its own
store on the same database, is every other process, and must get on within a bound: the frozen
transaction is cut off by ``idle_in_transaction_session_timeout`` (a sixth of the lease, at least
1 s), a takeover comes once its lease lapses; plus a margin for a busy machine.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import psycopg
import pytest
from conftest import REPO

from agentwake.clock import iso, utc_now
from agentwake.errors import StoreError
from agentwake.ownership import LeaseManager
from agentwake.store import InboxEvent, IncomingEvent, SubscriptionKey
from agentwake.store.postgres import PostgresStore, SessionTimeouts
from agentwake.store.quotas import ClaimLimits

pytestmark = pytest.mark.anyio
logger = logging.getLogger(__name__)

SCRIPT = Path(__file__).with_name("frozen_store.py")
KEY = SubscriptionKey("sub", "demo", "ticket.created", {})  # frozen_store.py's
OTHER = SubscriptionKey("other", "demo", "ticket.created", {})
# A lease of 3 s: the frozen transaction is cut off after 1 s, a lock is waited for 2 s at most.
LEASE_S = 3.0
TIMEOUTS = SessionTimeouts.for_lease(LEASE_S)
# For a busy machine (and this process's own start of a round or a claim); the frozen process stays
# stopped for the whole test, so "bounded" and "waited for it" stay far apart.
MARGIN_S = 3.0
START_S = 60.0  # the frozen process's start: importing agentwake, opening the store


@dataclass
class Frozen:
    """The stopped process: when it was seen stopped, and the end of the lease it committed."""

    process: anyio.abc.Process
    stopped_at: float = 0.0
    lease_end: float | None = None  # time.monotonic() at which its committed lease lapses
    lines: list[str] = field(default_factory=list)

    def outcome(self) -> str:
        """What it printed once continued: ``committed`` or ``error: ...``."""
        return self.lines[-1] if len(self.lines) > 1 else ""


def stopped(pid: int) -> bool:
    """Whether the process is stopped (state T)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] == "T"


async def until(condition: Callable[[], bool], deadline: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail once ``time.monotonic()`` passes ``deadline``."""
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within the bound", pytrace=False)
        await anyio.sleep(0.02)


@asynccontextmanager
async def frozen(url: str, lease_s: float, mode: str) -> AsyncIterator[Frozen]:
    """``frozen_store.py URL LEASE_S MODE``, yielded once stopped inside its transaction; continued
    (SIGCONT) and waited for, or killed, on the way out whatever happened."""
    process = await anyio.open_process(
        [sys.executable, str(SCRIPT), url, str(lease_s), mode],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=None,
    )
    found = Frozen(process)
    assert process.stdout is not None
    buffered = b""
    ended = anyio.Event()

    async def read() -> None:
        nonlocal buffered
        assert process.stdout is not None
        try:
            async for chunk in process.stdout:
                buffered += chunk
                while b"\n" in buffered:
                    line, buffered = buffered.split(b"\n", 1)
                    found.lines.append(line.decode())
        finally:
            ended.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            try:
                deadline = time.monotonic() + START_S
                await until(lambda: bool(found.lines), deadline, f"frozen_store.py {mode} printing")
                await until(lambda: stopped(process.pid), deadline, f"frozen_store.py {mode} stopping")
                found.stopped_at = time.monotonic()
                said = json.loads(found.lines[0])
                if said["lease_until"] is not None:
                    left = datetime.fromisoformat(said["lease_until"]) - utc_now()
                    found.lease_end = found.stopped_at + left.total_seconds()
                yield found
            finally:
                with anyio.CancelScope(shield=True):
                    if process.returncode is None:
                        os.kill(process.pid, signal.SIGCONT)
                    with anyio.move_on_after(30):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()
                        await process.wait()
                    with anyio.move_on_after(5):
                        await ended.wait()  # its last line read
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await process.aclose()


@asynccontextmanager
async def opened(url: str, **kwargs: Any) -> AsyncIterator[PostgresStore]:
    store = await PostgresStore.open(url, **kwargs)
    try:
        yield store
    finally:
        await store.close()


def event(event_id: str) -> IncomingEvent:
    return IncomingEvent(event_id, KEY.event, "2026-12-03T08:00:00.000Z", {})


async def claim_until(
    store: PostgresStore,
    wanted: str,
    deadline: float,
    limits: ClaimLimits,
    errors: list[str],
    claimed_too: list[InboxEvent] | None = None,
) -> InboxEvent:
    """Claim until the event ``wanted`` is claimed, as a worker does round after round: a claim that
    gave up waiting for a lock (a transient StoreError) is tried again. Fails past ``deadline``.
    The other events claimed on the way go to ``claimed_too``."""
    lease_until = iso(utc_now() + timedelta(minutes=5))
    while True:
        try:
            with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                claimed = await store.claim(10, lease_until=lease_until, limits=limits)
        except TimeoutError:
            pytest.fail(f"claiming {wanted} did not end within the bound", pytrace=False)
        except StoreError as exc:
            errors.append(str(exc))
        else:
            if claimed_too is not None:
                claimed_too.extend(claimed)
            for found in claimed:
                if found.event_id == wanted:
                    return found
        if time.monotonic() > deadline:
            pytest.fail(f"{wanted} was not claimed within the bound (errors: {errors})", pytrace=False)
        await anyio.sleep(0.05)


# ---- a frozen lease holder: the takeover ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["ingest", "round"])
async def test_a_process_frozen_inside_an_ingest_or_a_lease_round_is_taken_over_within_the_lease_and_a_round(
    postgres_url: str, mode: str
) -> None:
    async with opened(postgres_url, lease_s=LEASE_S) as store, frozen(postgres_url, LEASE_S, mode) as held:
        assert held.lease_end is not None
        manager = LeaseManager(store, lambda: [KEY.name], LEASE_S, owner="live")
        async with anyio.create_task_group() as tg:
            await tg.start(manager.run)
            # Taken once the frozen process's lease lapses, at the next round: not after its pause.
            bound = held.lease_end + manager.interval_s + MARGIN_S
            await until(lambda: KEY.name in manager.held(), bound, f"the takeover of {KEY.name}")
            took_s = time.monotonic() - held.stopped_at
            tg.cancel_scope.cancel()
        logger.info(
            "%s: taken over %.2fs after the freeze (its lease lapsed after %.2fs)",
            mode,
            took_s,
            held.lease_end - held.stopped_at,
        )
    # The frozen transaction was cut off by the server: continued, it learns so, and wrote nothing.
    assert "idle_in_transaction_session_timeout" in held.outcome(), held.lines
    assert "nothing of it was written" in held.outcome()
    async with opened(postgres_url) as store:
        assert "E-2" not in await store.event_ids(KEY.name)


# ---- a frozen ingest or claim: the other processes' claims ------------------------------------------


async def test_a_process_frozen_inside_an_ingest_holds_other_processes_claims_up_only_until_the_server_cuts_it_off(
    postgres_url: str,
) -> None:
    errors: list[str] = []
    async with (
        opened(postgres_url, lease_s=LEASE_S) as store,
        frozen(postgres_url, LEASE_S, "ingest") as held,
    ):
        # E-1 (committed before the freeze) is due; claiming it needs its subscription's row, which
        # the frozen ingest has locked.
        bound = held.stopped_at + TIMEOUTS.idle_in_transaction_s + MARGIN_S
        claimed = await claim_until(store, "E-1", bound, ClaimLimits(), errors)
        logger.info("ingest: E-1 claimed %.2fs after the freeze", time.monotonic() - held.stopped_at)
    assert claimed.attempts == 1
    # It waited for the frozen holder's lock, which came when the holder was cut off: no error.
    assert errors == []


async def test_a_process_frozen_inside_a_claim_under_limits_holds_the_other_claims_up_only_until_the_server_cuts_it_off(
    postgres_url: str,
) -> None:
    errors: list[str] = []
    limits = ClaimLimits({KEY.server: 10})
    async with opened(postgres_url, lease_s=LEASE_S) as store:
        await store.register(OTHER)
        async with frozen(postgres_url, LEASE_S, "claim-limits") as held:
            # Stored now: the frozen claim holds E-1 (and "sub"'s row), not this one.
            await store.ingest(OTHER, [event("O-1")], "1")
            # The frozen claim holds the claims' advisory lock: every claim under limits waits for it.
            bound = held.stopped_at + TIMEOUTS.idle_in_transaction_s + MARGIN_S
            claimed: list[InboxEvent] = []
            await claim_until(store, "O-1", bound, limits, errors, claimed)
            logger.info(
                "claim-limits: O-1 claimed %.2fs after the freeze", time.monotonic() - held.stopped_at
            )
        assert "idle_in_transaction_session_timeout" in held.outcome(), held.lines
        # The frozen claim was rolled back: its event was due again, for this process.
        if "E-1" not in {e.event_id for e in claimed}:
            await claim_until(store, "E-1", time.monotonic() + MARGIN_S, limits, errors)
    assert errors == []


async def test_a_claim_without_limits_takes_no_lock_so_a_frozen_claim_holds_it_up_not_at_all(
    postgres_url: str,
) -> None:
    # A long lease: the frozen claim is cut off only after 10 s; a claim that waited for its
    # advisory lock would wait that long.
    lease_s = 60.0
    assert SessionTimeouts.for_lease(lease_s).idle_in_transaction_s >= 10
    errors: list[str] = []
    async with opened(postgres_url, lease_s=lease_s) as store:
        await store.register(OTHER)
        async with frozen(postgres_url, lease_s, "claim") as held:
            # Stored now: the frozen claim holds E-1 (and "sub"'s row), not this one.
            await store.ingest(OTHER, [event("O-1")], "1")
            await claim_until(store, "O-1", held.stopped_at + MARGIN_S, ClaimLimits(), errors)
            logger.info("claim: O-1 claimed %.2fs after the freeze", time.monotonic() - held.stopped_at)
    assert errors == []


# ---- the timeouts themselves ------------------------------------------------------------------------


def test_the_timeouts_follow_the_lease() -> None:
    # Cut off after half a round, a lock waited for twice that (a frozen holder is cut off first).
    assert SessionTimeouts.for_lease(10.0).values() == ["1667", "3333", "30000"]
    assert SessionTimeouts.for_lease(12.0) == SessionTimeouts(2.0, 4.0, 30.0)
    # Never under a second (a busy event loop may pause a transaction a moment); a long lease's
    # statements may run as long as it.
    assert SessionTimeouts.for_lease(3.0) == SessionTimeouts(1.0, 2.0, 30.0)
    assert SessionTimeouts.for_lease(0.6) == SessionTimeouts(1.0, 2.0, 30.0)
    assert SessionTimeouts.for_lease(120.0) == SessionTimeouts(20.0, 40.0, 120.0)
    assert SessionTimeouts(1.0, 0.25, 30.0).values() == ["1000", "250", "30000"]


async def show(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    cur = await conn.execute(
        "SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('lock_timeout'),"
        " current_setting('statement_timeout')"
    )
    row = await cur.fetchone()
    assert row is not None
    return [str(value) for value in row]


async def test_every_session_of_the_store_has_the_timeouts_of_its_lease_and_a_long_operation_lifts_them(
    postgres_url: str,
) -> None:
    async with opened(postgres_url, lease_s=12.0) as store:
        async with store.transaction() as conn:
            assert await show(conn) == ["2s", "4s", "30s"]
        assert store.timeouts == SessionTimeouts.for_lease(12.0)
        async with store.transaction(bounded=False) as conn:
            assert await show(conn) == ["0", "0", "0"]
        # SET LOCAL: the next transaction on that connection is bounded again.
        async with store.transaction() as conn:
            assert await show(conn) == ["2s", "4s", "30s"]
    # Without a lease, [store] lease_s's default (10 s).
    async with opened(postgres_url) as store, store.transaction() as conn:
        assert await show(conn) == ["1667ms", "3333ms", "30s"]


async def test_a_statement_past_statement_timeout_is_cancelled_and_said_so(postgres_url: str) -> None:
    async with opened(postgres_url, timeouts=SessionTimeouts(5.0, 5.0, 0.3)) as store:
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled) as caught:
            async with store.transaction() as conn:
                await conn.execute("SELECT pg_sleep(20)")
        assert time.monotonic() - started < 10
        message = str(store.store_error(caught.value))
        assert "statement_timeout" in message and "try again" in message
        # Lifted for one of the store's own long operations.
        async with store.transaction(bounded=False) as conn:
            await conn.execute("SELECT pg_sleep(0.6)")


async def test_a_lease_round_behind_a_lock_held_elsewhere_gives_up_after_lock_timeout_and_the_next_round_goes_on(
    postgres_url: str,
) -> None:
    async with opened(postgres_url, lease_s=LEASE_S) as store:
        now = utc_now()
        await store.hold_subscriptions("first", [KEY.name], iso(now + timedelta(seconds=LEASE_S)), iso(now))
        # A session without agentwake's timeouts (psql left open in a transaction, say) holds the
        # lease's row: nothing cuts it off, but agentwake's round gives up waiting for it.
        async with await psycopg.AsyncConnection.connect(postgres_url) as foreign:
            await foreign.execute(
                "SELECT * FROM subscription_owners WHERE subscription = %s FOR UPDATE", [KEY.name]
            )
            started = time.monotonic()
            with pytest.raises(StoreError, match="lock_timeout") as caught:
                with anyio.fail_after(TIMEOUTS.lock_s + MARGIN_S):
                    now = utc_now()
                    await store.hold_subscriptions(
                        "second", [KEY.name], iso(now + timedelta(seconds=LEASE_S)), iso(now)
                    )
            assert time.monotonic() - started >= TIMEOUTS.lock_s * 0.9
            assert "nothing was written; try again" in str(caught.value)
            await foreign.rollback()
        # A round (agentwake.ownership) that fails so logs it and tries again at the next one.
        manager = LeaseManager(store, lambda: [KEY.name], LEASE_S, owner="first")
        await manager.round()
        assert manager.held() == {KEY.name: 1}


async def test_agentwake_store_copy_is_not_cut_off_by_the_timeouts(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentwake.store import postgres
    from agentwake.store.copy import copy_store
    from agentwake.store.sqlite import SqliteStore

    source = tmp_path / "agentwake.db"
    sqlite = await SqliteStore.open(source)
    try:
        await sqlite.register(KEY)
        await sqlite.ingest(KEY, [event("E-1"), event("E-2")], "2")
    finally:
        await sqlite.close()
    # The copy's store idles out after 1 s; between its statements the copy reads SQLite (here: slowly).
    monkeypatch.setattr(postgres, "DEFAULT_LEASE_S", 3.0)
    slow = SessionTimeouts.for_lease(3.0).idle_in_transaction_s + 0.5

    def progress(table: str, done: int, total: int) -> None:
        if table == "events":
            time.sleep(slow)

    report = await copy_store(source, postgres_url, progress=progress)
    assert report.tables["events"] == 2
    async with opened(postgres_url) as store:
        assert sorted(await store.event_ids(KEY.name)) == ["E-1", "E-2"]
