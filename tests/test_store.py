"""The store's seam and its SQLite backend: every sqlite3 error is a StoreError, one writer thread at a time.

What the protocol promises runs against both backends (the ``store`` fixture of ``tests/_stores.py``);
what is about the SQLite file, its connections and its writer thread runs on SQLite only.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import anyio
import psycopg
import pytest
from _stores import Backend, backend_fixture, store_fixture  # noqa: F401 - fixtures, by their names

from agentwake.clock import now_iso
from agentwake.errors import StoreError
from agentwake.store import IncomingEvent, RejectedEvent, Settlement, Store, SubscriptionKey, open_store
from agentwake.store.interface import Store as StoreProtocol
from agentwake.store.sqlite import SqliteCore, SqliteStore

pytestmark = pytest.mark.anyio

KEY = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "support"})


async def test_the_store_offers_every_method_of_the_protocol_as_a_coroutine(store: Store) -> None:
    wanted = {name for name in vars(StoreProtocol) if not name.startswith("_")}
    missing = sorted(name for name in wanted if not callable(getattr(store, name, None)))
    assert not missing
    assert await store.event_ids() == []
    assert Store is StoreProtocol


# How each backend says there is no store yet: no file; a database without the schema.
MISSING = {
    "sqlite": r"no store at .* yet: run 'agentwake run' first",
    "postgres": r"no agentwake store in .* yet: run 'agentwake run' first",
}


async def test_open_store_opens_the_configured_store_and_refuses_a_missing_one(backend: Backend) -> None:
    config = backend.store_config()
    with pytest.raises(StoreError, match=MISSING[backend.name]):
        await open_store(config, create=False)
    store = await open_store(config)
    try:
        assert await store.register(KEY) is None
        await store.ingest(KEY, [IncomingEvent("E-1", "ticket.created", now_iso(), {"n": 1})], "c1")
        assert await store.cursor("tickets") == "c1"
    finally:
        await store.close()
    reopened = await open_store(config, create=False)
    try:
        assert await reopened.event_ids() == ["E-1"]
    finally:
        await reopened.close()


# SQLite-only: another process's lock on the file, taken with sqlite3.
def test_a_locked_store_is_a_store_error_that_says_so(tmp_path: Path) -> None:
    path = tmp_path / "aw.db"
    SqliteCore.open(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match=r"the store .*aw\.db is locked by another process"):
            core = SqliteCore.open(path, busy_timeout_ms=100)
            try:
                core.register(KEY)
            finally:
                core.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


# SQLite-only: a file that is not a SQLite database.
def test_a_file_that_is_not_a_database_is_a_store_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "aw.db"
    path.write_bytes(b"this is not SQLite" * 100)
    with pytest.raises(StoreError, match=r"aw\.db is not a readable agentwake store"):
        SqliteCore.open(path)


async def refuse_state_changes(backend: Backend, store: Store, event_row: int) -> None:
    """A trigger in the database that fails every change of this event's state (the fault to inject)."""
    if backend.url is None:
        assert isinstance(store, SqliteStore)
        store.core.conn.execute(
            f"CREATE TRIGGER refuse BEFORE UPDATE OF state ON events WHEN NEW.id = {event_row}"
            " BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END"
        )
        return
    async with await psycopg.AsyncConnection.connect(backend.url, autocommit=True) as conn:
        await conn.execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql"
            " AS $$ BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$"
        )
        await conn.execute(
            "CREATE TRIGGER refuse BEFORE UPDATE OF state ON events FOR EACH ROW"
            f" WHEN (NEW.id = {event_row}) EXECUTE FUNCTION refuse()"
        )


async def test_a_write_that_fails_mid_method_is_a_store_error_and_leaves_nothing_half_done(
    backend: Backend, store: Store
) -> None:
    await store.register(KEY)
    events = [IncomingEvent(f"E-{n}", "ticket.created", now_iso(), {}) for n in (1, 2)]
    await store.ingest(KEY, events, "c1")
    first, second = await store.claim(2)
    await refuse_state_changes(backend, store, second.id)
    with pytest.raises(StoreError, match="refused by a trigger"):
        await store.settle(
            [Settlement(first.id, {"why": "x"}, "ignored"), Settlement(second.id, {"why": "y"}, "done")]
        )
    assert (await store.state_counts())["processing"] == 2


# SQLite-only: a batch is inserted many rows a statement, within the connection's bound-parameter limit.
async def test_a_batch_over_the_connections_parameter_limit_is_stored_whole(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "aw.db")
    try:
        # The limit of SQLite builds before 3.32: 999 parameters, 111 rows of 9 a statement.
        store.core.conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
        await store.register(KEY)
        events = [IncomingEvent(f"e-{n}", "ticket.created", "t", {"n": n}) for n in range(2500)]
        result = await store.ingest(KEY, events, "2500")
        assert (result.inserted, result.duplicates) == (2500, 0)
        assert sorted(await store.event_ids("tickets")) == sorted(e.event_id for e in events)
        assert await store.cursor("tickets") == "2500"
    finally:
        await store.close()


# SQLite-only: SqliteStore's one writer thread (PostgreSQL's store is natively async, with a pool).
async def test_store_calls_run_one_at_a_time_off_the_event_loop(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "aw.db")
    loop_thread = threading.get_ident()
    seen: list[int] = []
    inside = 0
    most = 0

    class Watching(SqliteCore):
        def cursor(self, name: str) -> str | None:
            nonlocal inside, most
            seen.append(threading.get_ident())
            inside += 1
            most = max(most, inside)
            try:
                return super().cursor(name)
            finally:
                inside -= 1

    watched = SqliteStore(Watching(store.core.conn, store.core.path))
    try:
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(watched.cursor, "tickets")
    finally:
        await store.close()
    assert len(seen) == 20 and loop_thread not in seen
    assert most == 1


# SQLite-only: the SQLite file's migrations (test_postgres_store.py checks PostgreSQL's).
def test_the_migration_names_known_without_sqlite_utils_are_the_schemas(tmp_path: Path) -> None:
    from agentwake.store.sqlite.schema import migrations
    from agentwake.store.sqlite.versions import MIGRATION_NAMES, MIGRATION_SET

    SqliteCore.open(tmp_path / "aw.db").close()
    with sqlite3.connect(tmp_path / "aw.db") as db:
        applied = [
            row[0]
            for row in db.execute(
                "SELECT name FROM _sqlite_migrations WHERE migration_set = ? ORDER BY rowid", [MIGRATION_SET]
            )
        ]
    assert (migrations.name, tuple(applied)) == (MIGRATION_SET, MIGRATION_NAMES)


# SQLite-only: sqlite-utils migrates the SQLite file only.
def test_reading_a_store_that_is_up_to_date_does_not_load_sqlite_utils(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    SqliteCore.open(tmp_path / "aw.db").close()
    script = (
        "import json, sys; from pathlib import Path; from agentwake.store.sqlite import SqliteCore;"
        f"core = SqliteCore.open(Path({str(tmp_path / 'aw.db')!r}), create=False);"
        "core.subscriptions(); core.inbox(5); core.close();"
        "print(json.dumps('sqlite_utils' in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) is False


# SQLite-only: SQLite's file lock and its busy timeout, driven with sqlite3.
def test_a_write_that_reads_first_waits_for_another_process_and_then_succeeds(tmp_path: Path) -> None:
    """`agentwake approve` while the service commits: the answer waits for the lock, it does not fail.

    The other process holds the write lock until the answer has begun; a transaction that
    read first and only then asked for the lock would find its snapshot stale and fail at once.
    """
    path = tmp_path / "aw.db"
    core = SqliteCore.open(path, busy_timeout_ms=5_000)
    try:
        core.register(KEY)
        core.ingest(KEY, [IncomingEvent("E-1", "ticket.created", now_iso(), {})], "c1")
        [claimed] = core.claim(1)
        core.settle([Settlement(claimed.id, {"why": "held"}, "held")])
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("UPDATE subscriptions SET last_error = 'busy' WHERE name = 'tickets'")
        released = threading.Timer(0.3, holder.execute, ["COMMIT"])

        def on_statement(sql: str) -> None:
            if sql.startswith("BEGIN") and not released.is_alive() and not released.finished.is_set():
                released.start()  # the other process commits a moment after the answer began

        core.conn.set_trace_callback(on_statement)
        outcome: list[BaseException | None] = []

        def answer() -> None:
            try:
                core.answer(claimed.id, approve=True, note="ok")
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(target=answer)
        worker.start()
        worker.join(timeout=10)
        released.join(timeout=10)
        holder.close()
        core.conn.set_trace_callback(None)
        assert outcome == [None]
        assert core.inbox(1)[0]["state"] == "pending"
    finally:
        core.close()


async def test_rejected_events_are_stored_as_summaries_counted_and_make_a_gap(store: Store) -> None:
    await store.register(KEY)
    refused = RejectedEvent("x" * 64 + "…#abc", "h.tick", "", "eventId is too long", '{"eventId":"xxx')
    good = IncomingEvent("E-1", "ticket.created", now_iso(), {"n": 1})
    result = await store.ingest(KEY, [good], "c2", cursor_before="c1", rejected=[refused])
    again = await store.ingest(KEY, [], "c3", cursor_before="c2", rejected=[refused])  # a retry: a duplicate
    assert (result.inserted, again.inserted) == (1, 0)
    [row] = await store.subscriptions()
    assert (row["rejected"], row["gaps"], row["cursor"]) == (1, 1, "c3")
    [stored] = await store.inbox(10, state="rejected")
    assert stored["data"] == {"rejected": "eventId is too long", "preview": '{"eventId":"xxx'}
    assert stored["last_error"] == "eventId is too long"
    # A rejected event never reaches the worker.
    assert [e.event_id for e in await store.claim(10)] == ["E-1"]
    assert [(g["cursor_before"], g["cursor_after"]) for g in await store.gaps()] == [("c1", "c2")]


async def test_claims_take_each_subscriptions_next_event_in_turn_so_a_flood_starves_nobody(
    store: Store,
) -> None:
    flood = SubscriptionKey("flood", "bad", "h.tick", {})
    quiet = SubscriptionKey("quiet", "good", "feed.item", {})
    await store.register(flood)
    await store.register(quiet)
    await store.ingest(flood, [IncomingEvent(f"F-{n}", "h.tick", now_iso(), {}) for n in range(1000)], "1000")
    await store.ingest(quiet, [IncomingEvent(f"Q-{n}", "feed.item", now_iso(), {}) for n in range(3)], "3")
    first = [e.event_id for e in await store.claim(4)]
    assert sorted(first) == ["F-0", "F-1", "Q-0", "Q-1"]
    second = [e.event_id for e in await store.claim(4)]
    assert "Q-2" in second
    # One at a time, the subscription served longest ago goes first.
    await store.ingest(quiet, [IncomingEvent(f"Q-{n}", "feed.item", now_iso(), {}) for n in range(3, 6)], "6")
    one_by_one = [(await store.claim(1))[0].subscription for _ in range(4)]
    assert one_by_one in (["flood", "quiet"] * 2, ["quiet", "flood"] * 2)


async def test_recent_errors_outlive_the_success_that_clears_last_error(store: Store) -> None:
    await store.register(KEY)
    await store.record_error("tickets", "server 'demo': connection closed: exited with code 1")
    await store.record_error("tickets", "server 'demo': connection closed: exited with code 1")
    for n in range(7):
        await store.set_state("tickets", status="stalled", error=f"events/poll failed ({n})")
    await store.count_stream_error("tickets", "stream error: token=hunter2-secret-value")
    await store.ingest(KEY, [IncomingEvent("E-1", "ticket.created", now_iso(), {"n": 1})], "c1")
    [row] = await store.subscriptions()
    assert (row["status"], row["last_error"]) == ("active", None)
    recent = row["recent_errors"]
    # The last five, oldest first, each with its time; the same error twice in a row is one entry.
    assert [entry["error"] for entry in recent] == [
        "events/poll failed (3)",
        "events/poll failed (4)",
        "events/poll failed (5)",
        "events/poll failed (6)",
        "stream error: token=[REDACTED]",
    ]
    assert all(entry["at"] for entry in recent)


async def test_the_same_error_again_is_counted_not_repeated(store: Store) -> None:
    await store.register(KEY)
    for _ in range(3):
        await store.record_error("tickets", "server 'demo': connection closed")
    [row] = await store.subscriptions()
    [entry] = row["recent_errors"]
    assert (entry["error"], entry["count"]) == ("server 'demo': connection closed", 3)


# SQLite-only: the lock that keeps processes opening a new file from migrating it at once.
def test_stores_opened_at_once_on_a_new_file_migrate_it_once(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from agentwake.store.sqlite.base import SqliteBase, up_to_date

    path = tmp_path / "new.db"
    barrier = threading.Barrier(6)

    def open_it() -> None:
        barrier.wait()
        SqliteBase.connect(path).close()

    with ThreadPoolExecutor(6) as pool:
        for future in [pool.submit(open_it) for _ in range(6)]:
            future.result()  # none says "table ... already exists"
    conn = sqlite3.connect(path)
    try:
        assert up_to_date(conn)
    finally:
        conn.close()
