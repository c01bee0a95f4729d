"""The PostgreSQL store: the same answers as the SQLite store, and safe when processes share a database.

The throwaway server is ``tests/_postgres.py``'s (one per pytest process, registered by conftest.py);
each test gets a fresh database, most of them a copy of one already migrated. Host connections of
the user ``locked`` need its password (scram-sha-256); every other connection is trusted.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from _postgres import PASSWORD, PASSWORD_USER, USER, PostgresServer, free_port
from hypothesis import given as hypothesis_given
from hypothesis import strategies as st
from pydantic import ValidationError

from agentwake.clock import iso, utc_now
from agentwake.config import StoreConfig
from agentwake.errors import StoreError
from agentwake.store import (
    EventVerdict,
    FlowGate,
    IncomingEvent,
    RejectedEvent,
    RunProgress,
    Settlement,
    Store,
    SubscriptionKey,
    ToolCallRecord,
    WebhookDelivery,
    open_config_reader,
    open_store,
)
from agentwake.store.postgres import PostgresReader, PostgresStore
from agentwake.store.postgres.base import NUL_MARK, escape_text, unescape_text
from agentwake.store.postgres.schema import MIGRATION_NAMES
from agentwake.store.sqlite import SqliteStore

LOCKED_USER = PASSWORD_USER
LOCKED_PASSWORD = PASSWORD
DBNAME = r"test_\d+_\d+"  # PostgresServer.create_database's names


@pytest.fixture(scope="session")
def migrated_template(postgres_server: PostgresServer) -> str:
    """A migrated database to copy (this process's server): most tests start from the schema."""
    url = postgres_server.create_database("template")

    async def migrate() -> None:
        await (await PostgresStore.open(url)).close()

    anyio.run(migrate)
    return postgres_server.dbname(url)


@pytest.fixture
def pg_url(postgres_server: PostgresServer, migrated_template: str) -> Iterator[str]:
    """A fresh database with the store's schema; dropped after the test."""
    url = postgres_server.create_database(template=migrated_template)
    try:
        yield url
    finally:
        if postgres_server.running():
            postgres_server.drop_database(url)


@pytest.fixture
def empty_url(postgres_url: str) -> str:
    """A fresh database without any table."""
    return postgres_url


T0 = "2026-01-01T00:00:00.000Z"
T1 = "2026-01-01T00:01:00.000Z"
T2 = "2026-01-01T00:05:00.000Z"
T3 = "2026-01-01T00:10:00.000Z"
ALERTS = SubscriptionKey("alerts", "demo", "alert.fired", {"sev": "high"})
TICKETS = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "support"})
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def alert(n: int, **data: Any) -> IncomingEvent:
    return IncomingEvent(f"A-{n}", "alert.fired", T0, {"n": n, **data})


def ticket(n: int) -> IncomingEvent:
    return IncomingEvent(f"T-{n}", "ticket.created", T0, {"n": n}, {"trace": f"t{n}"})


def normalized(value: Any) -> Any:
    """A value with every time written now replaced (the two backends run at different moments)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, normalized(dataclasses.asdict(value)))
    if isinstance(value, dict):
        return {key: normalized(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [normalized(item) for item in value]
    if isinstance(value, str):
        return ISO.sub("<time>", value)
    return value


async def scenario(store: Store) -> list[Any]:
    """Every kind of call, in an order that reaches each branch; what each returned, then every view."""
    out: list[Any] = []
    rec = out.append

    async def failing(call: Any) -> None:
        try:
            await call
        except StoreError as exc:
            rec(("error", str(exc)))
        else:
            rec("no error")

    rec(await store.register(ALERTS))
    rec(await store.register(TICKETS))
    rec(await store.ingest(ALERTS, [alert(1), alert(2), alert(2)], "a1"))
    rejected = RejectedEvent("A-R", "alert.fired", T0, "over 1 MiB", '{"n": ...')
    rec(
        await store.ingest(
            ALERTS, [alert(2), alert(3)], None, truncated=True, cursor_before="a1", rejected=[rejected]
        )
    )
    rec(await store.ingest(ALERTS, [], "a2", rejected=[rejected]))
    rec(await store.cursor("alerts"))
    rec(await store.register(dataclasses.replace(ALERTS, arguments={"sev": "low"})))
    rec(await store.register(ALERTS))
    rec(await store.cursor("nobody"))
    rec(await store.ingest(TICKETS, [ticket(1), ticket(2)], "t1"))
    deliveries = [
        WebhookDelivery(TICKETS, ticket(3), "t2"),
        WebhookDelivery(TICKETS, ticket(3), "t3"),
        WebhookDelivery(TICKETS, ticket(1), None),
        WebhookDelivery(TICKETS, None, "t4", truncated=True, control_id="gap-1"),
        WebhookDelivery(TICKETS, None, "t5", truncated=True, control_id="gap-1"),
        WebhookDelivery(TICKETS, None, None, rejected=RejectedEvent("T-R", "ticket.created", T0, "bad", "x")),
        WebhookDelivery(ALERTS, alert(4), "a3"),
    ]
    rec(await store.ingest_deliveries(deliveries))
    rec(
        await store.ingest_deliveries(
            [WebhookDelivery(TICKETS, None, "t6", truncated=True, control_id="gap-1")]
        )
    )
    await store.set_state("alerts", status="failing", mode="poll", error="boom: token=abc123")
    await store.record_error("alerts", "boom: token=abc123")
    await store.count_stream_error("tickets", "the stream broke")
    await store.set_state("alerts", status="active")

    secrets = (f"rotated-{n}" for n in itertools.count())
    rec(await store.prepare_webhook(TICKETS, "https://cb.example/1", "s0"))
    rec(await store.prepare_webhook(TICKETS, "https://cb.example/1", "unused"))
    subscribed = {"refresh_before": T3, "delivery_status": {"ok": True}, "previous_until": T2}
    rec(await store.webhook_subscribed("tickets", webhook_id="wh-1", sent_secret="s0", **subscribed))
    rec(await store.request_rotation(None, lambda: next(secrets)))
    rec(await store.request_rotation(["nobody"], lambda: next(secrets)))
    rec(
        await store.webhook_subscribed(
            "tickets", webhook_id="wh-1", sent_secret="rotated-0", refresh_before=None,
            delivery_status=None, previous_until=T3,
        )
    )  # fmt: skip
    rec(await store.prepare_webhook(TICKETS, "https://cb.example/2", "s1"))
    rec(await store.webhook_subscribed("tickets", webhook_id="wh-2", sent_secret="s1", **subscribed))
    rec(await store.prepare_webhook(ALERTS, "https://cb.example/3", "s2"))
    rec(await store.webhook_subscribed("alerts", webhook_id="wh-1", sent_secret="s2", **subscribed))
    rec(await store.retire_webhook("alerts", "removed from the config", unsubscribed=False))
    rec(await store.retire_webhook("nobody", "gone", unsubscribed=True))
    rec(await store.webhook_subscribed("nobody", webhook_id="wh-9", sent_secret="x", **subscribed))
    rec(await store.webhooks())
    rec(await store.webhook("alerts"))
    retired = await store.to_unsubscribe()
    rec(retired)
    rec(await store.to_unsubscribe("elsewhere"))
    await store.mark_unsubscribed(retired[0].id)
    rec(await store.to_unsubscribe("demo"))
    rec(await store.retired_webhook_ids())

    first = await store.claim(3, T1, lease_until=T2)
    rec(first)
    rec(await store.renew_leases([(e.id, e.attempts) for e in first] + [(first[0].id, 7), (9999, 1)], T3))
    await store.release(first[0].id, T2)
    rec(await store.claim(2, T1, lease_until=T2, exclude_servers=["demo"]))
    second = await store.claim(10, T1, lease_until=T2)
    rec(second)
    rec(await store.claim(10, T1, lease_until=T2))
    rec(await store.claim(10, T3, lease_until=T3))  # every lease lapsed: all claimed again
    rows = [e.id for e in second] + [e.id for e in first]
    await store.settle([Settlement(rows[0], {"rule": "hold", "injection_score": 2}, "held")])
    await store.settle(
        [Settlement(rows[1], {"rule": "hold"}, "held"), Settlement(rows[2], {"rule": "x"}, "ignored")]
    )
    await store.record_decision(rows[3], {"rule": "agent", "injection_score": 0.25})
    await store.answer(rows[0], approve=True, note="fine")
    await store.answer(rows[1], approve=False, note=None)
    await failing(store.answer(rows[1], approve=True, note=None))
    await failing(store.answer(9999, approve=True, note=None))

    dedup = FlowGate(now=T1, dedup_key="k", dedup_since=T0)
    rate = FlowGate(now=T1, rate_key="r", rate_since=T0, rate_max=1)
    batch = FlowGate(now=T1, batch_key="b", batch_since=T0, batch_due=T2, batch_max=3)
    for gate in (dedup, rate, batch):
        for row in rows[3:6]:
            rec(await store.flow_gate(row, "rule-1", {"rule": "rule-1"}, gate))
    rec(await store.batch_members(rows[3]))

    await store.claim(10, T2, lease_until=T3)
    event = await store.event(rows[3])
    rec(event)
    await failing(store.event(9999))
    decision = {"rule": "agent", "tools": ["echo"], "extra": {"a": 1, "b": None}}
    run = await store.start_run(
        rows[3], kind="agent", attempt=event.attempts, model="m", decision=decision, system_prompt="sys",
        user_prompt="user", sanitize_report={"injection_score": 1, "cuts": []},
    )  # fmt: skip
    call = ToolCallRecord(1, "c1", "echo", "demo", "echo", {"text": "hi"}, "planned", None, None)
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [1]}]
    progress = RunProgress(messages, 1, 10, 5, 0.01)
    await store.record_progress(run, progress, [call])
    journaled = await store.journal_tool_call(
        run, dataclasses.replace(call, call_id="c2", status="sent"), "key-2"
    )
    await store.journal_tool_call(run, dataclasses.replace(call, call_id="c3", status="sent"), "key-3")
    await store.settle_tool_call(journaled, status="ok", result="hi", reply="hi back", duration_ms=3)
    rec(await store.resume_point(rows[3]))
    rec(await store.resume_point(rows[4]))
    answered = RunProgress(
        [*messages, {"role": "assistant", "content": "  all\x07 done\n now "}], 2, 20, 9, 0.02
    )
    failed = EventVerdict("failed", error="it broke")
    rec(
        await store.finish_run(
            run, status="failed", reason="x", progress=answered, duration_ms=5, verdict=failed
        )
    )
    await failing(store.retry(rows[3]))
    rec(await store.retry(rows[3], resend_unknown=True))
    await failing(store.retry(rows[4]))
    again = await store.start_run(
        rows[3], kind="agent", attempt=1, model="m", decision={"rule": "agent"}, system_prompt=None,
        user_prompt=None,
    )  # fmt: skip
    await store.adopt_run(again, run, ["c2", "c3", "c9"], progress)
    rec(await store.resume_point(rows[3]))
    done = EventVerdict("done")
    rec(
        await store.finish_run(
            again, status="completed", reason=None, progress=answered, duration_ms=1, verdict=done
        )
    )
    await store.claim(10, T3, lease_until=T3)
    dry = await store.start_run(
        rows[5], kind="dry_run", attempt=1, model="m", decision={}, system_prompt=None, user_prompt=None,
        sanitize_report={"injection_score": 0.5},
    )  # fmt: skip
    rec(
        await store.finish_run(
            dry, status="completed", reason=None, progress=progress, duration_ms=1, verdict=None
        )
    )
    rec(await store.agent_usage(T0, T0))
    rec(await store.agent_usage("2999-01-01T00:00:00.000Z", "2999-01-01T00:00:00.000Z"))
    await store.finish([rows[6]], "failed", "gave up")
    rec(await store.requeue_interrupted(max_attempts=2))
    rec(await store.requeue_interrupted())

    first_service = await store.service_started(pid=10, host="h", version="1.0", heartbeat_s=5.0)
    await store.service_heartbeat(first_service)
    await store.service_stopped(first_service)
    second_service = await store.service_started(pid=11, host="h", version=None, heartbeat_s=2.5)
    await store.service_paused("the cost limit")
    rec([second_service - first_service, await store.services(), await store.services(1)])
    rec(await views_of(store))
    return out


async def views_of(store: Store) -> list[Any]:
    return [
        await store.subscriptions(),
        await store.run_counts(),
        await store.inbox(100),
        await store.inbox(2, state="rejected"),
        await store.actions(10),
        await store.find_events("A-2"),
        await store.find_events("A-2", "demo"),
        await store.find_events("A-2", "elsewhere"),
        await store.event_detail(4),
        await store.event_detail(9999),
        await store.approvals(),
        await store.gaps(),
        await store.gaps("tickets"),
        await store.event_ids(),
        await store.event_ids("alerts"),
        await store.state_counts(),
        await store.oldest_pending_at(),
        await store.services(),
    ]


def reader_views(reader: Any) -> list[Any]:
    return [
        reader.subscriptions(),
        reader.run_counts(),
        reader.inbox(100),
        reader.inbox(2, state="rejected"),
        reader.actions(10),
        reader.find_events("A-2"),
        reader.find_events("A-2", "demo"),
        reader.find_events("A-2", "elsewhere"),
        reader.event_detail(4),
        reader.event_detail(9999),
        reader.approvals(),
        reader.gaps(),
        reader.gaps("tickets"),
        reader.event_ids(),
        reader.event_ids("alerts"),
        reader.state_counts(),
        reader.oldest_pending_at(),
        reader.services(),
    ]


@pytest.mark.anyio
async def test_every_call_and_view_answers_as_the_sqlite_store_does(pg_url: str, tmp_path: Path) -> None:
    sqlite = await SqliteStore.open(tmp_path / "aw.db")
    try:
        expected = await scenario(sqlite)
    finally:
        await sqlite.close()
    store = await PostgresStore.open(pg_url)
    try:
        got = await scenario(store)
        views = await views_of(store)
    finally:
        await store.close()
    for step, (mine, theirs) in enumerate(zip(normalized(got), normalized(expected), strict=True)):
        assert mine == theirs, f"call {step} differs"
    # The synchronous reader shows the same views, with the same types (no normalizing).
    reader = PostgresReader.open(pg_url)
    try:
        assert reader_views(reader) == views
    finally:
        reader.close()


# ---- several processes on one database ------------------------------------------------------------


async def open_all(urls: Sequence[str], **kwargs: Any) -> list[PostgresStore]:
    """One store per url, all opening at the same time (as processes starting together would)."""
    opened: list[PostgresStore | None] = [None] * len(urls)

    async def one(index: int) -> None:
        opened[index] = await PostgresStore.open(urls[index], **kwargs)

    async with anyio.create_task_group() as tg:
        for index in range(len(urls)):
            tg.start_soon(one, index)
    return [store for store in opened if store is not None]


@pytest.mark.anyio
async def test_concurrent_opens_of_an_empty_database_apply_the_schema_once(
    empty_url: str, postgres_server: PostgresServer, migrated_template: str
) -> None:
    stores = await open_all([empty_url] * 6, max_size=2)
    try:
        assert len(stores) == 6
        assert [await store.event_ids() for store in stores] == [[]] * 6
    finally:
        for store in stores:
            await store.close()
    tables_sql = "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1"
    with psycopg.connect(empty_url) as conn:
        applied = conn.execute("SELECT name FROM schema_migrations ORDER BY name").fetchall()
        tables = conn.execute(tables_sql).fetchall()
    # The same tables as a database one store migrated alone (the schema's, and schema_migrations).
    with psycopg.connect(postgres_server.url(migrated_template)) as conn:
        expected = conn.execute(tables_sql).fetchall()
    assert [name for (name,) in applied] == list(MIGRATION_NAMES)
    assert tables == expected and ("schema_migrations",) in tables and len(tables) > 2


@pytest.mark.anyio
async def test_create_false_refuses_a_database_without_the_schema(empty_url: str) -> None:
    with pytest.raises(
        StoreError, match=rf"no agentwake store in the PostgreSQL database \"{DBNAME}\" on 127\.0\.0\.1"
    ):
        await PostgresStore.open(empty_url, create=False)
    with pytest.raises(StoreError, match=r"no agentwake store in .* yet: run 'agentwake run' first"):
        PostgresReader.open(empty_url)
    store = await PostgresStore.open(empty_url)
    await store.close()
    again = await PostgresStore.open(empty_url, create=False)
    await again.close()


async def fill(store: Store, subscriptions: int, per_subscription: int) -> list[str]:
    ids = []
    for s in range(subscriptions):
        key = SubscriptionKey(f"sub-{s}", f"server-{s}", "alert.fired", {})
        await store.register(key)
        events = [IncomingEvent(f"E-{s}-{n}", "alert.fired", T0, {"n": n}) for n in range(per_subscription)]
        await store.ingest(key, events, f"c{s}")
        ids += [e.event_id for e in events]
    return ids


@pytest.mark.anyio
async def test_two_stores_claiming_from_one_inbox_never_get_the_same_event(pg_url: str) -> None:
    stores = await open_all([pg_url, pg_url], max_size=4)
    try:
        expected = await fill(stores[0], 3, 40)
        claimed: list[list[str]] = [[], []]

        async def worker(index: int, limit: int) -> None:
            while True:
                got = await stores[index].claim(limit, T1, lease_until=T3)
                if not got:
                    return
                claimed[index] += [e.event_id for e in got]

        async with anyio.create_task_group() as tg:
            for index in (0, 1):
                for limit in (1, 3):  # two workers per store: four claimers racing
                    tg.start_soon(worker, index, limit)
        everything = claimed[0] + claimed[1]
        assert len(everything) == len(set(everything)), "an event was claimed twice"
        assert sorted(everything) == sorted(expected)
        assert claimed[0] and claimed[1]
        assert (await stores[1].state_counts())["processing"] == len(expected)
    finally:
        for store in stores:
            await store.close()


@pytest.mark.anyio
async def test_two_stores_ingesting_the_same_events_store_each_once_and_count_the_rest(pg_url: str) -> None:
    stores = await open_all([pg_url, pg_url], max_size=4)
    try:
        for store in stores:
            await store.register(TICKETS)
        events = [ticket(n) for n in range(60)]
        results: list[Any] = []

        async def poll(store: PostgresStore, batch: Sequence[IncomingEvent]) -> None:
            results.append(await store.ingest(TICKETS, batch, "c"))

        async def webhook(store: PostgresStore, batch: Sequence[IncomingEvent]) -> None:
            deliveries = [WebhookDelivery(TICKETS, event, f"w{event.event_id}") for event in batch]
            results.extend(await store.ingest_deliveries(deliveries))

        async with anyio.create_task_group() as tg:
            for store in stores:
                for start in (0, 20, 40):
                    tg.start_soon(poll, store, events[start : start + 30])
                    tg.start_soon(webhook, store, events[start : start + 30])
        attempted = 2 * 2 * sum(len(events[start : start + 30]) for start in (0, 20, 40))
        assert sum(r.inserted for r in results) == 60
        assert sum(r.duplicates for r in results) == attempted - 60
        assert sorted(await stores[0].event_ids()) == sorted(e.event_id for e in events)
        (subscription,) = await stores[1].subscriptions()
        assert subscription["events_received"] == 60
        assert subscription["duplicates"] == attempted - 60
    finally:
        for store in stores:
            await store.close()


@pytest.mark.anyio
async def test_a_rate_limit_holds_across_two_stores_racing(pg_url: str) -> None:
    stores = await open_all([pg_url, pg_url], max_size=6)
    try:
        await fill(stores[0], 1, 24)
        rows = [e.id for e in await stores[0].claim(24, T1, lease_until=T3)]
        gate = FlowGate(now=T1, rate_key="team-a", rate_since=T0, rate_max=5)
        dedup = FlowGate(now=T1, dedup_key="same", dedup_since=T0)
        verdicts: dict[str, list[str]] = {"rate": [], "dedup": []}

        async def gated(store: PostgresStore, row: int) -> None:
            verdicts["rate"].append((await store.flow_gate(row, "page", {"rule": "page"}, gate)).verdict)
            verdicts["dedup"].append((await store.flow_gate(row, "once", {"rule": "once"}, dedup)).verdict)

        async with anyio.create_task_group() as tg:
            for n, row in enumerate(rows):
                tg.start_soon(gated, stores[n % 2], row)
        assert sorted(verdicts["rate"]) == ["over_limit"] * 19 + ["run"] * 5
        assert sorted(verdicts["dedup"]) == ["duplicate"] * 23 + ["run"]
    finally:
        for store in stores:
            await store.close()


@pytest.mark.anyio
async def test_a_starting_store_requeues_only_events_whose_lease_lapsed(pg_url: str) -> None:
    """Two stores are two processes: B starting up must not take the event A holds under a live lease;
    once that lease lapses (A was killed, say), B's claim takes it and A's outcome is refused."""
    a, b = await open_all([pg_url, pg_url], max_size=2)
    try:
        await a.register(TICKETS)
        await a.ingest(TICKETS, [ticket(n) for n in range(1, 5)], "c")
        now = utc_now()
        start, lapsed, lease = iso(now), iso(now - timedelta(seconds=1)), now + timedelta(seconds=60)
        [live] = await a.claim(1, start, lease_until=iso(lease))  # T-1: A works on it
        [unleased] = await a.claim(1, start)  # T-2: claimed without a lease
        await a.claim(2, start, lease_until=lapsed)  # T-3, T-4: held by a process that died
        [twice] = await a.claim(1, start, lease_until=lapsed)  # T-3 again: its 2nd attempt
        assert (live.event_id, unleased.event_id, twice.event_id, twice.attempts) == ("T-1", "T-2", "T-3", 2)
        runs = {}
        for event_id in ("T-1", "T-3", "T-4"):
            [shown] = await a.find_events(event_id)
            runs[event_id] = await a.start_run(
                shown["id"], kind="agent", attempt=shown["attempts"], model="m", decision={},
                system_prompt=None, user_prompt=None,
            )  # fmt: skip

        assert await b.requeue_interrupted(max_attempts=2) == 2  # T-2 and T-4; T-3 is dead
        shown = {e: (await b.find_events(e))[0] for e in ("T-1", "T-2", "T-3", "T-4")}
        states = {e: (d["state"], d["attempts"], [r["status"] for r in d["runs"]]) for e, d in shown.items()}
        assert states == {
            "T-1": ("processing", 1, ["running"]),
            "T-2": ("pending", 1, []),
            "T-3": ("dead", 2, ["interrupted"]),
            "T-4": ("pending", 1, ["interrupted"]),
        }
        assert shown["T-3"]["last_error"] == "the service stopped during each of its 2 attempt(s)"
        assert await b.requeue_interrupted() == 0
        assert await a.renew_leases([(live.id, live.attempts)], iso(lease)) == []

        # A's lease lapses: B's claim takes T-1 (another attempt), and A's outcome no longer applies.
        after = lease + timedelta(seconds=1)
        taken = await b.claim(10, iso(after), lease_until=iso(after + timedelta(seconds=60)))
        assert sorted((e.event_id, e.attempts) for e in taken) == [("T-1", 2), ("T-2", 2), ("T-4", 2)]
        applied = await a.finish_run(
            runs["T-1"], status="completed", reason=None, progress=NO_RUN, duration_ms=1,
            verdict=EventVerdict("done"),
        )  # fmt: skip
        assert applied is False
        [t1] = await b.find_events("T-1")
        assert (t1["state"], t1["attempts"], t1["runs"][0]["status"]) == ("processing", 2, "interrupted")
        assert await a.renew_leases([(live.id, live.attempts)], iso(after)) == [live.id]
    finally:
        for store in (a, b):
            await store.close()


# ---- errors name the database, never the password ---------------------------------------------------


@pytest.mark.anyio
async def test_a_server_that_cannot_be_reached_is_a_store_error_that_says_so() -> None:
    url = f"postgresql://{LOCKED_USER}@127.0.0.1:{free_port()}/agentwake"
    with pytest.raises(StoreError) as caught:
        await PostgresStore.open(url, password=LOCKED_PASSWORD)
    message = str(caught.value)
    assert message.startswith('the server of the PostgreSQL database "agentwake" on 127.0.0.1:')
    assert "cannot be reached" in message
    assert LOCKED_PASSWORD not in message + repr(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    with pytest.raises(StoreError, match="cannot be reached") as sync_caught:
        PostgresReader.open(url, password=LOCKED_PASSWORD)
    assert LOCKED_PASSWORD not in str(sync_caught.value)


@pytest.mark.anyio
async def test_a_wrong_or_missing_password_is_a_store_error_that_never_shows_it(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = pg_url.replace(f"{USER}@", f"{LOCKED_USER}@")
    wrong = LOCKED_PASSWORD[::-1]
    with pytest.raises(StoreError, match=r"authentication to the PostgreSQL database .* failed") as caught:
        await PostgresStore.open(url, password=wrong)
    assert wrong not in str(caught.value) and LOCKED_PASSWORD not in str(caught.value)
    with pytest.raises(StoreError, match="wants a password and none was given"):
        await PostgresStore.open(url)
    store = await PostgresStore.open(url, password=LOCKED_PASSWORD)
    try:
        assert await store.register(TICKETS) is None
        assert LOCKED_PASSWORD not in repr(store) + repr(store.pool)
        # An error of a statement names the database too, and still not the password.
        with pytest.raises(StoreError) as failed:
            await store.start_run(
                9999, kind="agent", attempt=1, model="m", decision={}, system_prompt=None, user_prompt=None
            )
        assert "violates foreign key constraint" in str(failed.value)
        assert re.match(f'the PostgreSQL database "{DBNAME}"', str(failed.value))
    finally:
        await store.close()
    with pytest.raises(StoreError, match="is closed"):
        await store.event_ids()
    assert LOCKED_PASSWORD not in caplog.text and wrong not in caplog.text


# ---- configuration and open_store ------------------------------------------------------------------


@pytest.mark.anyio
async def test_open_store_opens_postgresql_with_the_password_from_the_named_variable(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = pg_url.replace(f"{USER}@", f"{LOCKED_USER}@")
    config = StoreConfig(url=url, password_env="AW_TEST_PG_PASSWORD")
    monkeypatch.delenv("AW_TEST_PG_PASSWORD", raising=False)
    with pytest.raises(StoreError, match=r"AW_TEST_PG_PASSWORD \(\[store\] password_env\) is not set"):
        await open_store(config)
    monkeypatch.setenv("AW_TEST_PG_PASSWORD", "")
    with pytest.raises(StoreError, match=r"AW_TEST_PG_PASSWORD .* is empty"):
        await open_store(config)
    monkeypatch.setenv("AW_TEST_PG_PASSWORD", LOCKED_PASSWORD)
    store = await open_store(config, create=False)
    try:
        assert isinstance(store, PostgresStore)
        await store.register(TICKETS)
        await store.ingest(TICKETS, [ticket(1)], "c1")
    finally:
        await store.close()
    reader = open_config_reader(config)
    try:
        assert isinstance(reader, PostgresReader)
        assert reader.event_ids() == ["T-1"]
    finally:
        reader.close()


def test_store_config_chooses_postgresql_with_a_url_and_refuses_mistakes() -> None:
    config = StoreConfig(url="postgresql://aw@db.internal:5432/agentwake", password_env="AW_PG")
    assert (config.url, config.password_env) == ("postgresql://aw@db.internal:5432/agentwake", "AW_PG")
    assert StoreConfig(url="postgres://aw@db/agentwake").url == "postgres://aw@db/agentwake"
    assert StoreConfig().url is None
    refused = {
        "must be a postgresql:// URL .* its scheme is 'mysql'": {"url": "mysql://aw@db/agentwake"},
        "must be a postgresql:// URL .* its scheme is none": {"url": "db.internal/agentwake"},
        "must not hold a password: put it in an environment variable .* 'password_env'": {
            "url": "postgresql://aw:hunter2-pw@db/agentwake"
        },
        "must not hold a password": {"url": "postgresql://aw@db/agentwake?password=hunter2-pw"},
        "'password_env' only applies to a PostgreSQL store: set 'url' too": {"password_env": "AW_PG"},
        "set either 'url' \\(a PostgreSQL store\\) or 'path' \\(a SQLite file\\), not both": {
            "url": "postgresql://aw@db/agentwake",
            "path": "agentwake.db",
        },
    }
    for message, given in refused.items():
        with pytest.raises(ValidationError, match=message) as caught:
            StoreConfig(**given)
        assert "hunter2-pw" not in str(caught.value)


def test_a_config_file_with_a_password_in_the_store_url_is_refused_without_quoting_it(tmp_path: Path) -> None:
    from agentwake.config import load_config
    from agentwake.errors import ConfigError

    config = tmp_path / "agentwake.toml"
    config.write_text('[store]\nurl = "postgresql://aw:hunter2-pw@db/agentwake"\n')
    with pytest.raises(
        ConfigError, match=r"store: url must not hold a password: put it in an environment variable"
    ) as caught:
        load_config(config)
    assert "hunter2-pw" not in str(caught.value)


def test_the_sqlite_path_never_imports_psycopg(tmp_path: Path) -> None:
    code = (
        "import sys, anyio\n"
        "from agentwake.config import StoreConfig\n"
        "from agentwake.store import open_store, open_config_reader\n"
        f"config = StoreConfig(path={str(tmp_path / 'aw.db')!r})\n"
        "async def main():\n"
        "    await (await open_store(config)).close()\n"
        "anyio.run(main)\n"
        "open_config_reader(config).close()\n"
        "assert not [m for m in sys.modules if m.startswith('psycopg')], 'psycopg was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ---- text with NUL characters ------------------------------------------------------------------------

# NUL, backslashes (a stored escape must not be mistaken for one), the escape marker itself.
NUL_ID = "N\x00-1\\0\\\\"
ODD_TEXTS = [
    "\x00",
    "a\x00b",
    "\\0",
    "\\",
    "x\\\x00\\0",
    NUL_MARK,
    NUL_MARK + "\x00",
    NUL_MARK + "\\0",
    "plain",
]


@hypothesis_given(st.text())
def test_the_nul_escape_is_exact_and_changes_only_text_with_nul_or_the_marker(text: str) -> None:
    stored = escape_text(text)
    assert "\x00" not in stored and unescape_text(stored) == text
    if "\x00" not in text and not text.startswith(NUL_MARK):
        assert stored is text
    else:
        assert stored.startswith(NUL_MARK)


def test_the_nul_escape_tells_every_odd_text_apart() -> None:
    stored = [escape_text(text) for text in ODD_TEXTS]
    assert len(set(stored)) == len(ODD_TEXTS)
    assert [unescape_text(s) for s in stored] == ODD_TEXTS


async def nul_scenario(store: Store) -> list[Any]:
    """Event ids, data, prompts, tool results and errors with NUL and backslashes, written and read back."""
    out: list[Any] = []
    rec = out.append
    key = SubscriptionKey("nul\x00sub", "demo", "alert.fired", {"q": "a\x00\\"})
    await store.register(key)
    events = [IncomingEvent(NUL_ID, "alert.fired", T0, {"text": "a\x00b\\c"}, {"m": "\x00"})]
    events += [IncomingEvent(text, "alert.fired", T0, {"n": n}) for n, text in enumerate(ODD_TEXTS)]
    rec(await store.ingest(key, events, "c\x00ursor"))
    # The same ids again, by poll and by webhook: every one is a duplicate.
    rec(await store.ingest(key, events[:3], "c2"))
    rec(await store.ingest_deliveries([WebhookDelivery(key, events[0], "c\x003")]))
    rec(await store.cursor("nul\x00sub"))
    rec(await store.event_ids())
    rec(await store.find_events(NUL_ID))
    await store.record_error("nul\x00sub", "boom\x00: \\0")
    claimed = await store.claim(1, T1, lease_until=T2)
    rec(claimed)
    (event,) = claimed
    run = await store.start_run(
        event.id, kind="agent", attempt=event.attempts, model="m\x00", decision={"why": "\x00"},
        system_prompt="sys\x00\\", user_prompt="user\x00",
    )  # fmt: skip
    call = ToolCallRecord(1, "c\x001", "echo", "demo", "echo", {"t": "\x00"}, "ok", "result\x00\\0", 1)
    messages = [
        {"role": "user", "content": "\x00"},
        {"role": "assistant", "content": "a\x00", "tool_calls": [1]},
    ]
    await store.record_progress(run, RunProgress(messages, 1, 1, 1, None), [call])
    journaled = await store.journal_tool_call(
        run, dataclasses.replace(call, call_id="c\x002", status="sent", result=None), "key\x00"
    )
    await store.settle_tool_call(journaled, status="ok", result="r\x00\\", reply="reply\x00", duration_ms=1)
    rec(await store.resume_point(event.id))
    failed = EventVerdict("failed", error="it\x00 broke\\0")
    rec(
        await store.finish_run(
            run, status="failed", reason="why\x00", progress=NO_RUN, duration_ms=1, verdict=failed
        )
    )
    rec(await store.event(event.id))
    rec(await store.event_detail(event.id))
    rec(await store.subscriptions())
    rec(await store.inbox(100))
    return out


NO_RUN = RunProgress([], 0, 0, 0, None)


@pytest.mark.anyio
async def test_text_with_nul_and_backslashes_round_trips_as_on_sqlite(pg_url: str, tmp_path: Path) -> None:
    sqlite = await SqliteStore.open(tmp_path / "aw.db")
    try:
        expected = await nul_scenario(sqlite)
    finally:
        await sqlite.close()
    store = await PostgresStore.open(pg_url)
    try:
        got = await nul_scenario(store)
    finally:
        await store.close()
    for step, (mine, theirs) in enumerate(zip(normalized(got), normalized(expected), strict=True)):
        assert mine == theirs, f"step {step} differs"
    inserted, again, (delivered,), cursor, ids, (found,), (claimed,), point = got[:8]
    assert (inserted.inserted, again.inserted, again.duplicates, delivered.duplicates) == (10, 0, 3, 1)
    assert cursor == "c\x003" and sorted(ids) == sorted([NUL_ID, *ODD_TEXTS])
    assert found["event_id"] == NUL_ID and claimed.data == {"text": "a\x00b\\c"}
    assert {c.call_id: (c.result, c.reply) for c in point.calls.values()}["c\x002"] == (
        "r\x00\\",
        "reply\x00",
    )
    detail = got[10]
    assert detail["last_error"] == "it\x00 broke\\0" and detail["runs"][0]["reason"] == "why\x00"
    # The reader reads them back too; in the database, only text with a NUL (or the marker) is escaped.
    reader = PostgresReader.open(pg_url)
    try:
        assert sorted(reader.event_ids()) == sorted(ids)
        assert [e["event_id"] for e in reader.find_events(NUL_ID)] == [NUL_ID]
    finally:
        reader.close()
    with psycopg.connect(pg_url) as conn:
        stored = {row[0] for row in conn.execute("SELECT event_id FROM events").fetchall()}
    assert stored == {escape_text(text) for text in ids}
    assert {"\\0", "\\", "plain", NUL_MARK + "a\\0b"} <= stored
