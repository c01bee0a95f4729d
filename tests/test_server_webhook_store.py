"""Durable webhook subscriptions: ``SqliteWebhookStore`` and what it lets the server promise.

With a store, ``ttlMs: null`` is granted as no expiry, and a subscription keeps
delivering across a restart of the extension without the client re-subscribing
(its verification and watermark are stored with it). A no-expiry subscription
whose endpoint keeps failing is dropped after ``drop_after``, with a terminated
envelope attempt.
"""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import trustme
from _webhook_server_support import (
    Caller,
    FakeNow,
    Received,
    Receiver,
    Reply,
    Signals,
    Tickets,
    declare_incidents,
    declare_tickets,
    echo,
    incident,
    new_secret,
    serving,
    webhook_settings,
)

from agentwake import signing
from agentwake.server import EventContext, EventsExtension, SqliteWebhookStore, StoredWebhook

pytestmark = pytest.mark.anyio


def test_the_store_file_is_owner_only_and_round_trips_records(tmp_path: Path) -> None:
    path = tmp_path / "state" / "hooks.db"
    previous = os.umask(0o022)
    try:
        store = SqliteWebhookStore(path)
    finally:
        os.umask(previous)
    moment = datetime(2026, 2, 19, 15, 30, tzinfo=UTC)
    record = StoredWebhook(
        id="sub_0123456789abcdef",
        principal="alice",
        url="https://hooks.test/a",
        name="incident.created",
        arguments={"severity": "P1", "tags": ["x"]},
        secret=new_secret(),
        previous_secret=new_secret(),
        previous_until=moment,
        expires_at=None,
        verified_at=moment,
        cursor="abc-7",
    )
    try:
        store.save(record)
        store.save(record)  # an upsert, not a second row
    finally:
        store.close()
    reopened = SqliteWebhookStore(path)
    try:
        assert reopened.load() == [record]
        reopened.delete(record.id)
        reopened.delete(record.id)  # gone already: not an error
        assert reopened.load() == []
    finally:
        reopened.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert record.secret not in repr(record)


async def test_a_no_expiry_subscription_keeps_delivering_across_a_restart_without_resubscribing(
    ca: trustme.CA, tmp_path: Path, signals: Signals
) -> None:
    caller, tickets = Caller(), Tickets()
    tickets.add("one")
    path = tmp_path / "hooks.db"
    secret = new_secret()
    resumed: list[str] = []

    def lifetime() -> tuple[EventsExtension, SqliteWebhookStore]:
        store = SqliteWebhookStore(path)
        events = EventsExtension(webhook=webhook_settings(ca, store=store), principal_of=caller)
        declare_tickets(events, tickets, next_poll_ms=60_000)

        @events.on_subscribe("ticket.created")
        def on_subscribe(ctx: EventContext, arguments: dict[str, Any], sid: str) -> None:
            resumed.append(sid)

        return events, store

    async with Receiver(ca) as receiver:
        events, store = lifetime()
        async with serving(events, caller) as wire:
            granted = await wire.subscribe("ticket.created", receiver.url(), secret, {"x": 1}, ttlMs=None)
            tickets.add("two")
            events.wake("ticket.created")
            await receiver.next("event")
            await signals.done("t2")  # acknowledged, so the stored watermark is past it
        store.close()

        tickets.add("three", "four")  # while the server is down

        events, store = lifetime()
        async with serving(events, caller) as wire:
            assert events.webhook_subscriptions() == 1
            after_restart = [await receiver.next("event") for _ in range(2)]
            await signals.done("t3", "t4")
            refreshed = await wire.subscribe("ticket.created", receiver.url(), secret, {"x": 1}, ttlMs=None)
        store.close()

    assert granted["refreshBefore"] is None
    assert resumed == [granted["id"], granted["id"]]  # on_subscribe again when it is loaded
    assert sorted(r.verify(secret)["eventId"] for r in after_restart) == ["t3", "t4"]
    assert {r.subscription for r in after_restart} == {granted["id"]}
    assert len(receiver.of("verification")) == 1  # the stored verification covers the restart
    assert refreshed["id"] == granted["id"] and refreshed["refreshBefore"] is None
    assert refreshed["cursor"] == "4" and "deliveryStatus" in refreshed


async def test_an_emit_only_subscription_resumes_after_a_restart_with_a_gap(
    ca: trustme.CA, tmp_path: Path
) -> None:
    caller = Caller()
    path = tmp_path / "hooks.db"
    secret = new_secret()

    def lifetime() -> tuple[EventsExtension, SqliteWebhookStore]:
        store = SqliteWebhookStore(path)
        events = EventsExtension(webhook=webhook_settings(ca, store=store), principal_of=caller)
        declare_incidents(events)
        return events, store

    async with Receiver(ca) as receiver:
        events, store = lifetime()
        async with serving(events, caller) as wire:
            await wire.subscribe("incident.created", receiver.url(), secret, ttlMs=None)
        store.close()
        events, store = lifetime()
        async with serving(events, caller):
            gap = await receiver.next("gap")  # the ring buffer did not survive: events may be lost
            events.emit(incident(1))
            delivered = await receiver.next("event")
        store.close()

    assert gap.verify(secret)["cursor"] == delivered.verify(secret)["cursor"].rsplit("-", 1)[0] + "-0"


async def test_expired_records_are_dropped_at_start_up(ca: trustme.CA, tmp_path: Path) -> None:
    caller, now = Caller(), FakeNow()
    path = tmp_path / "hooks.db"
    async with Receiver(ca) as receiver:
        store = SqliteWebhookStore(path)
        events = EventsExtension(webhook=webhook_settings(ca, store=store), principal_of=caller, now=now)
        declare_incidents(events)
        async with serving(events, caller) as wire:
            await wire.subscribe("incident.created", receiver.url(), new_secret(), ttlMs=5_000)
        store.close()

        now.advance(seconds=5)
        store = SqliteWebhookStore(path)
        events = EventsExtension(webhook=webhook_settings(ca, store=store), principal_of=caller, now=now)
        declare_incidents(events)
        async with serving(events, caller):
            live = events.webhook_subscriptions()
        left = store.load()
        store.close()
    assert live == 0 and left == []


async def test_a_stored_record_that_was_never_verified_is_not_resumed(ca: trustme.CA, tmp_path: Path) -> None:
    # "a persisted subscription resumes delivery without a re-subscribe ... the stored record only exists
    # because verification succeeded": one without it (another store's, say) must not deliver.
    caller = Caller()
    path = tmp_path / "hooks.db"
    async with Receiver(ca) as receiver:
        store = SqliteWebhookStore(path)
        store.save(
            StoredWebhook(
                id="sub_0123456789abcdef",
                principal="alice",
                url=receiver.url(),
                name="incident.created",
                arguments={},
                secret=new_secret(),
                expires_at=None,
                verified_at=None,
                cursor=None,
            )
        )
        events = EventsExtension(webhook=webhook_settings(ca, store=store), principal_of=caller)
        declare_incidents(events)
        async with serving(events, caller):
            live = events.webhook_subscriptions()
        left = store.load()
        store.close()
    assert live == 0 and left == []
    assert receiver.received == []


def test_a_long_ttl_cap_without_a_store_is_warned_about(
    ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    webhook_settings(ca, max_ttl=timedelta(days=30))
    assert "without a store: a restart loses subscriptions" in caplog.text
    caplog.clear()
    webhook_settings(ca, max_ttl=timedelta(hours=1))
    assert caplog.text == ""


async def test_a_failing_no_expiry_subscription_is_dropped_after_drop_after_with_a_terminated_attempt(
    ca: trustme.CA, tmp_path: Path, signals: Signals
) -> None:
    caller, now = Caller(), FakeNow()
    store = SqliteWebhookStore(tmp_path / "hooks.db")
    settings = webhook_settings(
        ca, store=store, max_attempts=1, drop_after=timedelta(hours=6), sweep_interval=timedelta(days=1)
    )  # sweeps by hand: the background one would race the moved clock
    events = EventsExtension(webhook=settings, principal_of=caller, now=now)
    declare_incidents(events)
    gone = anyio.Event()

    @events.on_unsubscribe("incident.created")
    def on_unsubscribe(ctx: EventContext, arguments: dict[str, Any], sid: str) -> None:
        gone.set()

    def broken(received: Received) -> Reply:
        return echo(received) if received.kind == "verification" else (500, {})

    secret = new_secret()
    try:
        async with Receiver(ca) as receiver, serving(events, caller) as wire:
            receiver.respond = broken
            sid = (await wire.subscribe("incident.created", receiver.url(), secret, ttlMs=None))["id"]
            events.emit(incident(1))
            assert await signals.done("inc-1") == ["abandoned"]
            now.advance(hours=5, minutes=59)
            assert await events.sweep_webhooks() == 0
            now.advance(minutes=1)
            assert await events.sweep_webhooks() == 1
            terminated = await receiver.next("terminated")
            with anyio.fail_after(10):
                await gone.wait()
            left = store.load()
    finally:
        store.close()
    assert terminated.subscription == sid
    # Six hours of server time later than the real clock: check the signature without freshness.
    headers = terminated.headers
    key = signing.decode_secret(secret)
    assert signing.verify(
        [key],
        headers["webhook-id"],
        headers["webhook-timestamp"],
        headers["webhook-signature"],
        terminated.body,
    )
    assert terminated.document["error"] == {
        "code": -32015,
        "message": "CallbackEndpointError",
        "data": {"reason": "http_5xx"},
    }
    assert left == []
