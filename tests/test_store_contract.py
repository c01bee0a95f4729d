"""The store's contract, backend by backend: every test runs against SQLite and against PostgreSQL.

Only the async ``Store`` protocol is driven (no SQL, no backend's internals), and the results are
compared with exact values where the SQLite backend defines them, so that a backend passing here
can replace another under the service. Times the store takes (``now=``, leases, flow windows) are
fixed; the ones it reads from the clock are checked for their form only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from _stores import backend_fixture, second_store_fixture, store_fixture  # noqa: F401 - fixtures, by their names

from agentwake.clock import iso, now_iso
from agentwake.errors import FencedOut, LeaseLost, StoreError
from agentwake.store import (
    EVENT_STATES,
    Answerer,
    EventState,
    EventVerdict,
    FlowGate,
    FlowOutcome,
    InboxEvent,
    IncomingEvent,
    IngestResult,
    JournaledCall,
    RejectedEvent,
    RetiredWebhook,
    RunKind,
    RunProgress,
    RunStatus,
    Settlement,
    Store,
    SubscriptionKey,
    ToolCallRecord,
    ToolCallStatus,
    WebhookDelivery,
    WebhookRecord,
)

pytestmark = pytest.mark.anyio

START = datetime(2026, 12, 3, 8, 0, 0, tzinfo=UTC)
T0 = "2026-12-03T08:00:00.000Z"
TICKETS = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "support"})
ALERTS = SubscriptionKey("alerts", "demo", "alert.fired", {})
OTHER = SubscriptionKey("feed", "other", "feed.item", {})
NO_PROGRESS = RunProgress([], 0, 0, 0, None)
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
URL = "https://agentwake.example/hooks/tickets"


def at(seconds: float) -> str:
    """START + seconds, in the store's ISO form."""
    return iso(START + timedelta(seconds=seconds))


def is_iso(value: object) -> bool:
    return isinstance(value, str) and ISO.match(value) is not None


def incoming(event_id: str, key: SubscriptionKey = TICKETS, **data: Any) -> IncomingEvent:
    return IncomingEvent(event_id, key.event, T0, data or {"n": event_id})


async def add(store: Store, key: SubscriptionKey, *event_ids: str) -> list[int]:
    """Register ``key`` and ingest these events (the last one's id as the cursor); their row ids, in order."""
    await store.register(key)
    await store.ingest(key, [incoming(e, key) for e in event_ids], event_ids[-1])
    return [await row_of(store, e, key.server) for e in event_ids]


async def row_of(store: Store, event_id: str, server: str = "demo") -> int:
    [found] = await store.find_events(event_id, server)
    return int(found["id"])


async def claimed(store: Store, key: SubscriptionKey, *event_ids: str) -> list[InboxEvent]:
    """Store these events and claim them all at T0, leased until T0 + 60 s."""
    await add(store, key, *event_ids)
    events = await store.claim(len(event_ids), T0, lease_until=at(60))
    assert [e.event_id for e in events] == list(event_ids)
    return events


async def detail(store: Store, row: int) -> dict[str, Any]:
    found = await store.event_detail(row)
    assert found is not None
    return found


async def agent_run(store: Store, event: InboxEvent) -> int:
    """An agent run of a claimed event, at its claim's attempt."""
    return await store.start_run(
        event.id,
        kind="agent",
        attempt=event.attempts,
        model="m",
        decision={},
        system_prompt="sys",
        user_prompt="usr",
    )


async def finish(
    store: Store, run: int, verdict: EventVerdict | None, progress: RunProgress = NO_PROGRESS
) -> bool:
    status: RunStatus = "completed" if verdict is not None and verdict.state == "done" else "failed"
    return await store.finish_run(
        run, status=status, reason=None, progress=progress, duration_ms=7, verdict=verdict
    )


def call(call_id: str, status: ToolCallStatus = "ok", tool: str = "demo__close") -> ToolCallRecord:
    return ToolCallRecord(1, call_id, tool, "demo", "close", {"id": 1}, status, "closed", 3)


def secrets(*values: str) -> Callable[[], str]:
    made = iter(values)
    return lambda: next(made)


# ---- subscriptions and cursors ------------------------------------------------------------------


async def test_a_registered_subscription_keeps_the_cursor_its_batches_stored(store: Store) -> None:
    assert await store.register(TICKETS) is None
    assert await store.cursor("tickets") is None
    await store.ingest(TICKETS, [incoming("E-1")], "c1")
    assert await store.cursor("tickets") == "c1"
    assert await store.register(TICKETS) == "c1"
    assert await store.cursor("nobody") is None


@pytest.mark.parametrize(
    "changed",
    [
        SubscriptionKey("tickets", "elsewhere", "ticket.created", {"queue": "support"}),
        SubscriptionKey("tickets", "demo", "ticket.updated", {"queue": "support"}),
        SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "billing"}),
    ],
    ids=["server", "event", "arguments"],
)
async def test_a_changed_server_event_or_arguments_drops_the_stored_cursor(
    store: Store, changed: SubscriptionKey
) -> None:
    await store.register(TICKETS)
    await store.ingest(TICKETS, [incoming("E-1")], "c1")
    assert await store.register(changed) is None
    assert await store.cursor("tickets") is None
    [row] = await store.subscriptions()
    assert (row["server"], row["event"], row["arguments"]) == (
        changed.server,
        changed.event,
        changed.arguments,
    )
    assert row["cursor"] is None and row["cursor_updated_at"] is None


async def test_the_same_arguments_in_another_order_are_the_same_subscription(store: Store) -> None:
    await store.register(SubscriptionKey("s", "demo", "e", {"a": 1, "b": {"y": 2, "x": 1}}))
    await store.ingest(SubscriptionKey("s", "demo", "e", {"a": 1, "b": {"y": 2, "x": 1}}), [], "c1")
    assert await store.register(SubscriptionKey("s", "demo", "e", {"b": {"x": 1, "y": 2}, "a": 1})) == "c1"


async def test_a_new_subscription_is_shown_with_zero_counters_and_no_webhook(store: Store) -> None:
    await store.register(TICKETS)
    assert await store.subscriptions() == [
        {
            "subscription": "tickets",
            "server": "demo",
            "event": "ticket.created",
            "arguments": {"queue": "support"},
            "mode": None,
            "cursor": None,
            "last_activity_at": None,
            "last_poll_at": None,
            "events_received": 0,
            "duplicates": 0,
            "gaps": 0,
            "status": "new",
            "last_error": None,
            "cursor_updated_at": None,
            "stream_errors": 0,
            "rejected": 0,
            "recent_errors": [],
            "webhook": None,
        }
    ]


async def test_state_and_errors_are_stored_redacted_and_a_success_clears_the_last_error(store: Store) -> None:
    await store.register(TICKETS)
    await store.register(ALERTS)
    await store.set_state("tickets", status="polling", mode="poll")
    await store.record_error("tickets", "connection closed")
    await store.record_error("tickets", "connection closed")
    for n in range(6):
        await store.set_state("tickets", status="stalled", error=f"poll failed ({n})")
    await store.count_stream_error("tickets", "stream error: token=hunter2-secret-value")
    rows = {r["subscription"]: r for r in await store.subscriptions()}
    ticket = rows["tickets"]
    assert (ticket["status"], ticket["mode"], ticket["stream_errors"]) == ("stalled", "poll", 1)
    assert ticket["last_error"] == "stream error: token=[REDACTED]"
    # The last five, oldest first; the same error twice in a row is one entry with a count.
    assert [e["error"] for e in ticket["recent_errors"]] == [
        "poll failed (2)",
        "poll failed (3)",
        "poll failed (4)",
        "poll failed (5)",
        "stream error: token=[REDACTED]",
    ]
    assert all(is_iso(e["at"]) for e in ticket["recent_errors"])
    assert rows["alerts"]["recent_errors"] == [] and rows["alerts"]["last_error"] is None
    await store.ingest(TICKETS, [], "c1")
    [ticket] = [r for r in await store.subscriptions() if r["subscription"] == "tickets"]
    assert (ticket["status"], ticket["last_error"], ticket["mode"]) == ("active", None, "poll")
    assert len(ticket["recent_errors"]) == 5


async def test_the_same_error_again_is_counted_not_repeated(store: Store) -> None:
    await store.register(TICKETS)
    for _ in range(3):
        await store.record_error("tickets", "server 'demo': connection closed")
    [row] = await store.subscriptions()
    [entry] = row["recent_errors"]
    assert (entry["error"], entry["count"]) == ("server 'demo': connection closed", 3)


# ---- ingest ---------------------------------------------------------------------------------------


async def test_a_batch_is_stored_in_order_with_its_cursor_and_counted(store: Store) -> None:
    await store.register(TICKETS)
    before = now_iso()
    result = await store.ingest(TICKETS, [incoming("E-1"), incoming("E-2"), incoming("E-3")], "c3")
    assert result == IngestResult(3, 0)
    assert await store.event_ids() == ["E-1", "E-2", "E-3"]
    [row] = await store.subscriptions()
    assert (row["cursor"], row["events_received"], row["duplicates"], row["gaps"], row["status"]) == (
        "c3",
        3,
        0,
        0,
        "active",
    )
    assert is_iso(row["last_activity_at"]) and row["last_activity_at"] >= before
    assert row["last_poll_at"] == row["last_activity_at"] == row["cursor_updated_at"]


async def test_a_duplicate_server_event_name_and_id_is_counted_never_stored_twice(store: Store) -> None:
    await store.register(TICKETS)
    await store.register(OTHER)
    await store.ingest(TICKETS, [incoming("E-1"), incoming("E-2")], "c2")
    again = await store.ingest(TICKETS, [incoming("E-2"), incoming("E-1"), incoming("E-3")], "c3")
    assert again == IngestResult(1, 2)
    # The same eventId under another event name, or from another server, is another event.
    renamed = IncomingEvent("E-1", "ticket.updated", T0, {})
    assert await store.ingest(TICKETS, [renamed], "c4") == IngestResult(1, 0)
    assert await store.ingest(OTHER, [incoming("E-1", OTHER)], "o1") == IngestResult(1, 0)
    assert await store.event_ids("tickets") == ["E-1", "E-2", "E-3", "E-1"]
    rows = {r["subscription"]: r for r in await store.subscriptions()}
    assert (rows["tickets"]["events_received"], rows["tickets"]["duplicates"]) == (4, 2)
    assert (rows["feed"]["events_received"], rows["feed"]["duplicates"]) == (1, 0)


async def test_a_null_cursor_never_replaces_the_stored_one(store: Store) -> None:
    await store.register(TICKETS)
    await store.ingest(TICKETS, [incoming("E-1")], "c1")
    [first] = await store.subscriptions()
    assert await store.ingest(TICKETS, [incoming("E-2")], None) == IngestResult(1, 0)
    assert await store.cursor("tickets") == "c1"
    [row] = await store.subscriptions()
    assert (row["cursor"], row["cursor_updated_at"]) == ("c1", first["cursor_updated_at"])
    assert row["events_received"] == 2


async def test_a_cursor_written_unless_moved_keeps_a_newer_one_stored_meanwhile(store: Store) -> None:
    # A webhook subscribe carried cursor 4; a delivery stored 5 before its answer (watermark 3) came.
    await store.register(TICKETS)
    await store.ingest(TICKETS, [], "5")
    await store.ingest(TICKETS, [], "3", cursor_before="4", unless_moved=True)
    assert await store.cursor(TICKETS.name) == "5"
    # Nothing stored meanwhile: the answer's watermark is the new cursor.
    await store.ingest(TICKETS, [], "6", cursor_before="5", unless_moved=True)
    assert await store.cursor(TICKETS.name) == "6"
    [row] = await store.subscriptions()
    assert row["status"] == "active"


async def test_a_truncated_batch_records_a_gap_between_its_cursors(store: Store) -> None:
    await store.register(TICKETS)
    await store.register(ALERTS)
    await store.ingest(TICKETS, [incoming("E-1")], "c1")
    await store.ingest(TICKETS, [incoming("E-5")], "c5", truncated=True, cursor_before="c1")
    await store.ingest(ALERTS, [], "a9", truncated=True)
    gaps = await store.gaps()
    assert [{k: v for k, v in g.items() if k != "detected_at"} for g in gaps] == [
        {
            "subscription": "tickets",
            "server": "demo",
            "event": "ticket.created",
            "cursor_before": "c1",
            "cursor_after": "c5",
        },
        {
            "subscription": "alerts",
            "server": "demo",
            "event": "alert.fired",
            "cursor_before": None,
            "cursor_after": "a9",
        },
    ]
    assert all(is_iso(g["detected_at"]) for g in gaps)
    assert [g["cursor_after"] for g in await store.gaps("alerts")] == ["a9"]
    assert await store.gaps("nobody") == []
    rows = {r["subscription"]: r for r in await store.subscriptions()}
    assert (rows["tickets"]["gaps"], rows["tickets"]["cursor"], rows["alerts"]["gaps"]) == (1, "c5", 1)


async def test_rejected_events_are_stored_as_summaries_counted_and_make_a_gap(store: Store) -> None:
    await store.register(TICKETS)
    refused = RejectedEvent("x" * 64 + "…#abc", "h.tick", "", "eventId is too long", '{"eventId":"xxx')
    result = await store.ingest(TICKETS, [incoming("E-1")], "c2", cursor_before="c1", rejected=[refused])
    again = await store.ingest(TICKETS, [], "c3", cursor_before="c2", rejected=[refused])  # a duplicate
    assert (result, again) == (IngestResult(1, 0), IngestResult(0, 0))
    [row] = await store.subscriptions()
    assert (row["rejected"], row["gaps"], row["cursor"], row["events_received"]) == (1, 1, "c3", 1)
    [stored] = await store.inbox(10, state="rejected")
    assert {k: stored[k] for k in ("event_id", "event", "timestamp", "data", "last_error", "attempts")} == {
        "event_id": refused.event_id,
        "event": "h.tick",
        "timestamp": "",
        "data": {"rejected": "eventId is too long", "preview": '{"eventId":"xxx'},
        "last_error": "eventId is too long",
        "attempts": 0,
    }
    # A rejected event never reaches the worker.
    assert [e.event_id for e in await store.claim(10, T0)] == ["E-1"]
    assert [(g["cursor_before"], g["cursor_after"]) for g in await store.gaps()] == [("c1", "c2")]


async def test_an_event_is_stored_as_sent_odd_text_included(store: Store) -> None:
    await store.register(TICKETS)
    data = {
        "title": "Drucker brennt 🔥",
        "nul": "a\x00b",
        "surrogate": "\ud800",
        "nested": {"list": [1, 2.5, None, True], "empty": {}},
        "big": 2**53 + 1,
    }
    sent = IncomingEvent("E-1", "ticket.created", "2026-12-03T09:00:00+01:00", data, {"traceparent": "00-1"})
    bare = IncomingEvent("E-2", "ticket.created", "not a time", {}, None)
    assert await store.ingest(TICKETS, [sent, bare], "c1") == IngestResult(2, 0)
    first = await detail(store, await row_of(store, "E-1"))
    assert (first["data"], first["meta"], first["timestamp"]) == (
        data,
        {"traceparent": "00-1"},
        sent.timestamp,
    )
    second = await detail(store, await row_of(store, "E-2"))
    assert (second["data"], second["meta"], second["timestamp"]) == ({}, None, "not a time")


# ---- webhook deliveries -----------------------------------------------------------------------------


async def test_webhook_deliveries_are_stored_together_one_result_each(store: Store) -> None:
    await store.register(TICKETS)
    await store.register(ALERTS)
    await store.ingest(TICKETS, [incoming("E-0")], "c0")
    results = await store.ingest_deliveries(
        [
            WebhookDelivery(TICKETS, incoming("E-1"), "c1"),
            WebhookDelivery(ALERTS, incoming("A-1", ALERTS), "a1"),
            WebhookDelivery(TICKETS, incoming("E-1"), "c1"),  # a retry within the batch
            WebhookDelivery(TICKETS, incoming("E-0"), None),  # stored before
            WebhookDelivery(TICKETS, incoming("E-2"), "c2"),
            WebhookDelivery(TICKETS, incoming("E-3"), None),  # the cursor stays the last one sent
        ]
    )
    assert results == [
        IngestResult(1, 0),
        IngestResult(1, 0),
        IngestResult(0, 1),
        IngestResult(0, 1),
        IngestResult(1, 0),
        IngestResult(1, 0),
    ]
    assert await store.event_ids("tickets") == ["E-0", "E-1", "E-2", "E-3"]
    assert (await store.cursor("tickets"), await store.cursor("alerts")) == ("c2", "a1")
    rows = {r["subscription"]: r for r in await store.subscriptions()}
    assert (rows["tickets"]["events_received"], rows["tickets"]["duplicates"]) == (4, 2)
    assert (rows["alerts"]["events_received"], rows["alerts"]["duplicates"]) == (1, 0)
    assert await store.ingest_deliveries([]) == []


async def test_a_gap_delivery_is_recorded_once_however_often_it_is_retried(store: Store) -> None:
    await store.register(TICKETS)
    await store.ingest(TICKETS, [incoming("E-1")], "c1")
    gap = WebhookDelivery(TICKETS, None, "c5", truncated=True, control_id="msg-1")
    assert await store.ingest_deliveries([gap, gap]) == [IngestResult(0, 0), IngestResult(0, 1)]
    assert await store.ingest_deliveries([WebhookDelivery(TICKETS, incoming("E-6"), "c6")]) == [
        IngestResult(1, 0)
    ]
    assert await store.ingest_deliveries([gap]) == [IngestResult(0, 1)]
    assert [(g["cursor_before"], g["cursor_after"]) for g in await store.gaps()] == [("c1", "c5")]
    [row] = await store.subscriptions()
    assert (row["gaps"], row["cursor"]) == (1, "c6")


async def test_a_rejected_delivery_is_stored_counted_and_makes_a_gap(store: Store) -> None:
    await store.register(TICKETS)
    await store.ingest(TICKETS, [], "c1")
    refused = RejectedEvent("E-9", "ticket.created", T0, "payload too large", "{...")
    [result] = await store.ingest_deliveries([WebhookDelivery(TICKETS, None, "c2", rejected=refused)])
    assert result == IngestResult(0, 0)
    [row] = await store.subscriptions()
    assert (row["rejected"], row["gaps"], row["cursor"]) == (1, 1, "c2")
    assert [(e["event_id"], e["state"]) for e in await store.inbox(5)] == [("E-9", "rejected")]
    assert [(g["cursor_before"], g["cursor_after"]) for g in await store.gaps()] == [("c1", "c2")]


# ---- webhook subscriptions ----------------------------------------------------------------------------


async def test_prepare_webhook_stores_a_new_one_and_gives_back_the_stored_one_after(store: Store) -> None:
    await store.register(TICKETS)
    first = await store.prepare_webhook(TICKETS, URL, "s1")
    assert first == WebhookRecord("tickets", "demo", "ticket.created", {"queue": "support"}, URL, "s1")
    again = await store.prepare_webhook(
        SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "support"}), URL, "s2"
    )
    assert again == first and again.secret == "s1"
    assert await store.webhook("tickets") == first
    assert await store.webhooks() == [first]
    assert await store.webhook("nobody") is None
    assert await store.to_unsubscribe() == []


async def test_a_webhook_under_another_key_or_url_is_retired_and_replaced(store: Store) -> None:
    await store.prepare_webhook(TICKETS, URL, "s1")
    await store.webhook_subscribed(
        "tickets",
        webhook_id="wh-1",
        sent_secret="s1",
        refresh_before=None,
        delivery_status=None,
        previous_until=T0,
    )
    moved = await store.prepare_webhook(TICKETS, URL + "/v2", "s2")
    assert (moved.url, moved.secret, moved.webhook_id, moved.refreshes) == (URL + "/v2", "s2", None, 0)
    [retired] = await store.to_unsubscribe()
    assert retired == RetiredWebhook(
        retired.id, "tickets", "demo", "ticket.created", {"queue": "support"}, URL, "wh-1"
    )
    assert isinstance(retired.id, int)
    assert await store.retired_webhook_ids() == {"wh-1"}
    changed = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "billing"})
    assert (await store.prepare_webhook(changed, URL + "/v2", "s3")).secret == "s3"
    assert [r.webhook_id for r in await store.to_unsubscribe()] == ["wh-1", None]


async def test_a_subscribe_records_the_id_expiry_and_delivery_status(store: Store) -> None:
    await store.prepare_webhook(TICKETS, URL, "s1")
    record = await store.webhook_subscribed(
        "tickets",
        webhook_id="wh-1",
        sent_secret="s1",
        refresh_before=at(3600),
        delivery_status={"lastDelivery": "ok", "failures": 0},
        previous_until=at(600),
    )
    assert record is not None
    assert record == WebhookRecord(
        "tickets",
        "demo",
        "ticket.created",
        {"queue": "support"},
        URL,
        "s1",
        webhook_id="wh-1",
        refresh_before=at(3600),
        no_expiry=False,
        delivery_status={"lastDelivery": "ok", "failures": 0},
        refreshes=1,
        last_refresh_at=record.last_refresh_at,
    )
    assert is_iso(record.last_refresh_at)
    refreshed = await store.webhook_subscribed(
        "tickets",
        webhook_id="wh-1",
        sent_secret="s1",
        refresh_before=None,
        delivery_status=None,
        previous_until=at(600),
    )
    assert refreshed is not None
    assert (refreshed.no_expiry, refreshed.refresh_before, refreshed.delivery_status) == (True, None, None)
    assert (refreshed.refreshes, refreshed.previous_secret, refreshed.previous_until) == (2, None, None)
    assert await store.webhook("tickets") == refreshed


async def test_a_rotation_makes_the_sent_secret_current_and_keeps_the_old_one_until_a_deadline(
    store: Store,
) -> None:
    await store.prepare_webhook(TICKETS, URL, "s1")
    await store.prepare_webhook(ALERTS, URL + "/alerts", "a1")
    assert await store.request_rotation(["tickets", "nobody"], secrets("s2")) == ["tickets"]
    pending = await store.webhook("tickets")
    assert pending is not None and (pending.secret, pending.pending_secret) == ("s1", "s2")
    rotated = await store.webhook_subscribed(
        "tickets",
        webhook_id="wh-1",
        sent_secret="s2",
        refresh_before=None,
        delivery_status=None,
        previous_until=at(600),
    )
    assert rotated is not None
    assert (rotated.secret, rotated.pending_secret, rotated.previous_secret, rotated.previous_until) == (
        "s2",
        None,
        "s1",
        at(600),
    )
    # Rotated again, then a refresh that still sent the current secret: the new one stays pending.
    assert await store.request_rotation(None, secrets("a2", "s3")) == ["alerts", "tickets"]
    kept = await store.webhook_subscribed(
        "tickets",
        webhook_id="wh-1",
        sent_secret="s2",
        refresh_before=None,
        delivery_status=None,
        previous_until=at(900),
    )
    assert kept is not None
    assert (kept.secret, kept.pending_secret, kept.previous_secret, kept.previous_until) == (
        "s2",
        "s3",
        "s1",
        at(600),
    )
    alerts = await store.webhook("alerts")
    assert alerts is not None and alerts.pending_secret == "a2"


async def test_a_retired_webhook_waits_to_be_unsubscribed_and_its_id_stays_refused(store: Store) -> None:
    await store.prepare_webhook(TICKETS, URL, "s1")
    await store.prepare_webhook(OTHER, URL + "/feed", "f1")
    for name, webhook_id in (("tickets", "wh-1"), ("feed", "wh-2")):
        await store.webhook_subscribed(
            name,
            webhook_id=webhook_id,
            sent_secret="x",
            refresh_before=None,
            delivery_status=None,
            previous_until=T0,
        )
    retired = await store.retire_webhook("tickets", "removed from the config", unsubscribed=False)
    assert retired is not None and retired.webhook_id == "wh-1"
    assert await store.webhook("tickets") is None
    assert await store.retire_webhook("tickets", "again", unsubscribed=False) is None
    assert await store.retire_webhook("feed", "terminated by the server", unsubscribed=True) is not None
    assert await store.retired_webhook_ids() == {"wh-1", "wh-2"}
    [waiting] = await store.to_unsubscribe()
    assert (waiting.subscription, waiting.webhook_id) == ("tickets", "wh-1")
    assert await store.to_unsubscribe("demo") == [waiting]
    assert await store.to_unsubscribe("other") == []
    await store.mark_unsubscribed(waiting.id)
    assert await store.to_unsubscribe() == []
    assert await store.retired_webhook_ids() == {"wh-1", "wh-2"}
    # Retired meanwhile: a subscribe that lands after it records nothing.
    assert (
        await store.webhook_subscribed(
            "tickets",
            webhook_id="wh-1",
            sent_secret="s1",
            refresh_before=None,
            delivery_status=None,
            previous_until=T0,
        )
        is None
    )


async def test_a_retired_id_subscribed_again_is_live_and_not_unsubscribed(store: Store) -> None:
    await store.prepare_webhook(TICKETS, URL, "s1")
    await store.webhook_subscribed(
        "tickets",
        webhook_id="wh-1",
        sent_secret="s1",
        refresh_before=None,
        delivery_status=None,
        previous_until=T0,
    )
    await store.retire_webhook("tickets", "removed from the config", unsubscribed=False)
    await store.prepare_webhook(TICKETS, URL, "s2")
    await store.webhook_subscribed(
        "tickets",
        webhook_id="wh-1",
        sent_secret="s2",
        refresh_before=None,
        delivery_status=None,
        previous_until=T0,
    )
    assert await store.retired_webhook_ids() == set()
    assert await store.to_unsubscribe() == []


async def test_the_subscriptions_view_shows_a_webhooks_state_but_never_a_secret(store: Store) -> None:
    await store.register(TICKETS)
    await store.prepare_webhook(TICKETS, URL, "hush-1")
    await store.webhook_subscribed(
        "tickets",
        webhook_id="wh-1",
        sent_secret="hush-1",
        refresh_before=at(3600),
        delivery_status={"failures": 2},
        previous_until=at(60),
    )
    await store.request_rotation(None, secrets("hush-2"))
    [row] = await store.subscriptions()
    webhook = row["webhook"]
    assert is_iso(webhook.pop("last_refresh_at"))
    assert webhook == {
        "id": "wh-1",
        "url": URL,
        "refresh_before": at(3600),
        "no_expiry": False,
        "delivery_status": {"failures": 2},
        "refreshes": 1,
        "rotation_pending": True,
        "previous_secret_until": None,
    }
    assert "hush-1" not in repr(row) and "hush-2" not in repr(row)


# ---- the work queue -------------------------------------------------------------------------------------


async def test_claim_takes_at_most_limit_events_oldest_first_and_leases_them(store: Store) -> None:
    rows = await add(store, TICKETS, "E-1", "E-2", "E-3")
    first = await store.claim(2, T0, lease_until=at(60))
    assert first == [
        InboxEvent(rows[0], "demo", "tickets", "ticket.created", "E-1", T0, {"n": "E-1"}, 1),
        InboxEvent(rows[1], "demo", "tickets", "ticket.created", "E-2", T0, {"n": "E-2"}, 1),
    ]
    counts = await store.state_counts()
    assert (counts["processing"], counts["pending"]) == (2, 1)
    assert [e.event_id for e in await store.claim(5, T0, lease_until=at(60))] == ["E-3"]
    assert await store.claim(5, T0, lease_until=at(60)) == []


async def test_a_leased_event_is_claimed_again_only_after_its_lease_lapses(store: Store) -> None:
    [row] = await add(store, TICKETS, "E-1")
    [first] = await store.claim(1, T0, lease_until=at(1))
    assert await store.claim(1, T0) == []
    assert await store.claim(1, at(1)) == []  # a lease runs until its end
    [again] = await store.claim(1, at(5), lease_until=at(60))
    assert (first.id, again.id, again.attempts) == (row, row, 2)


async def test_an_event_claimed_without_a_lease_is_not_reclaimed(store: Store) -> None:
    await add(store, TICKETS, "E-1")
    assert len(await store.claim(1, T0)) == 1
    assert await store.claim(1, at(10**6)) == []


async def test_claims_take_each_subscriptions_next_event_in_turn_so_a_flood_starves_nobody(
    store: Store,
) -> None:
    flood = SubscriptionKey("flood", "bad", "h.tick", {})
    quiet = SubscriptionKey("quiet", "good", "feed.item", {})
    await add(store, flood, *(f"F-{n}" for n in range(30)))
    await add(store, quiet, "Q-0", "Q-1", "Q-2")
    first = await store.claim(4, T0, lease_until=at(60))
    assert [e.event_id for e in first] == ["F-0", "F-1", "Q-0", "Q-1"]  # returned oldest first
    second = [e.event_id for e in await store.claim(4, T0, lease_until=at(60))]
    assert "Q-2" in second and len(second) == 4
    await store.ingest(quiet, [incoming(f"Q-{n}", quiet) for n in range(3, 6)], "6")
    # One at a time, the subscription served longest ago goes first.
    one_by_one = [(await store.claim(1, T0, lease_until=at(60)))[0].subscription for _ in range(4)]
    assert one_by_one in (["flood", "quiet"] * 2, ["quiet", "flood"] * 2)


async def test_claims_leave_out_the_excluded_servers(store: Store) -> None:
    await add(store, TICKETS, "E-1")
    await add(store, OTHER, "O-1", "O-2")
    assert [e.event_id for e in await store.claim(10, T0, exclude_servers=["demo"])] == ["O-1", "O-2"]
    assert await store.claim(10, T0, exclude_servers=["demo", "other"]) == []
    assert [e.event_id for e in await store.claim(10, T0, exclude_servers=[])] == ["E-1"]


async def test_two_stores_on_one_database_never_claim_the_same_event(
    store: Store, second_store: Store
) -> None:
    await add(store, TICKETS, *(f"E-{n}" for n in range(40)))
    taken: list[list[int]] = [[], [], [], []]

    async def drain(handle: Store, into: list[int]) -> None:
        while events := await handle.claim(3, T0, lease_until=at(60)):
            into.extend(e.id for e in events)

    async with anyio.create_task_group() as tg:
        for n, handle in enumerate((store, second_store, store, second_store)):
            tg.start_soon(drain, handle, taken[n])
    everything = [row for rows in taken for row in rows]
    assert len(everything) == len(set(everything)) == 40
    assert (await second_store.state_counts())["processing"] == 40


async def test_a_renewal_keeps_a_held_lease_and_reports_a_lost_one(store: Store) -> None:
    [row_a, row_b] = await add(store, TICKETS, "E-1", "E-2")
    first_a, first_b = await store.claim(2, T0, lease_until=at(1))
    assert await store.renew_leases([(row_a, first_a.attempts)], at(30)) == []
    [again] = await store.claim(2, at(5), lease_until=at(60))  # E-2's lease lapsed; E-1's was renewed
    assert (again.id, again.attempts) == (row_b, 2)
    # The first claim of E-2 lost its lease; the second holds it.
    assert await store.renew_leases([(row_a, 1), (row_b, first_b.attempts)], at(90)) == [row_b]
    assert await store.renew_leases([(row_b, again.attempts)], at(90)) == []
    assert await store.claim(2, at(45)) == []


async def test_a_released_event_is_untouched_and_waits_until_its_time(store: Store) -> None:
    [row] = await add(store, TICKETS, "E-1")
    await store.claim(1, T0, lease_until=at(60))
    await store.release(row, at(30))
    assert (await store.event(row)).attempts == 0
    assert (await detail(store, row))["state"] == "pending"
    assert await store.claim(1, at(29)) == []
    [again] = await store.claim(1, at(30), lease_until=at(90))
    assert again.attempts == 1
    await store.finish([row], "done")
    await store.release(row, at(0))  # not processing: nothing happens
    assert (await detail(store, row))["state"] == "done"


async def test_a_stop_requeues_its_events_but_one_that_used_up_its_attempts_is_dead(store: Store) -> None:
    [row_a, row_b] = await add(store, TICKETS, "E-1", "E-2")
    await store.claim(2, T0, lease_until=at(1))
    await store.release(row_b, T0)
    again = await store.claim(2, at(5), lease_until=at(60))
    assert [(e.event_id, e.attempts) for e in again] == [("E-1", 2), ("E-2", 1)]
    run = await agent_run(store, again[1])
    assert await store.requeue_interrupted(max_attempts=2) == 1
    a, b = await detail(store, row_a), await detail(store, row_b)
    assert (a["state"], b["state"]) == ("dead", "pending")
    assert a["last_error"] == "the service stopped during each of its 2 attempt(s)"
    [stopped] = b["runs"]
    assert (stopped["run_id"], stopped["status"]) == (run, "interrupted")
    assert stopped["reason"] == "the service stopped during the run" and is_iso(stopped["finished_at"])
    await store.claim(1, at(5), lease_until=at(60))
    assert await store.requeue_interrupted() == 1
    assert await store.requeue_interrupted() == 0


async def test_retry_requeues_failed_and_dead_events_only(store: Store) -> None:
    events = await claimed(store, TICKETS, "E-1", "E-2", "E-3")
    states: tuple[EventState, ...] = ("failed", "dead", "done")
    for event, state in zip(events, states, strict=True):
        await store.finish([event.id], state, "why")
    for event in events[:2]:
        assert await store.retry(event.id) == 0
        shown = await detail(store, event.id)
        assert (shown["state"], shown["attempts"], shown["last_error"]) == ("pending", 0, None)
    with pytest.raises(StoreError, match="only failed or dead events are retried"):
        await store.retry(events[2].id)
    with pytest.raises(StoreError):
        await store.retry(events[2].id + 1000)


async def test_a_retry_is_refused_while_a_call_of_unknown_outcome_is_not_allowed_to_be_resent(
    store: Store,
) -> None:
    [event] = await claimed(store, TICKETS, "E-1")
    run = await agent_run(store, event)
    await store.journal_tool_call(run, call("c1", "sent"), "key-1")
    await finish(store, run, EventVerdict("failed", "LLM down"))
    with pytest.raises(StoreError, match=r"outcome is unknown.*key-1"):
        await store.retry(event.id)
    assert (await detail(store, event.id))["state"] == "failed"
    assert await store.retry(event.id, resend_unknown=True) == 1
    point = await store.resume_point(event.id)
    assert point is None  # the run never got an answer from the LLM
    [shown_run] = (await detail(store, event.id))["runs"]
    assert [c["status"] for c in shown_run["tool_calls"]] == ["resend"]


async def test_settled_decisions_end_their_events_in_one_call(store: Store) -> None:
    events = await claimed(store, TICKETS, "E-1", "E-2", "E-3")
    await store.settle(
        [
            Settlement(events[0].id, {"action": "ignore", "why": "noise"}, "ignored"),
            Settlement(events[1].id, {"action": "log", "injection_score": 0.75}, "done"),
            Settlement(events[2].id, {"action": "approve", "rule": "refunds"}, "held"),
        ]
    )
    shown = [await detail(store, e.id) for e in events]
    assert [s["state"] for s in shown] == ["ignored", "done", "held"]
    assert shown[0]["decision"] == {"action": "ignore", "why": "noise"}
    assert [s["injection_score"] for s in shown] == [None, 0.75, None]
    assert (await store.event(events[2].id)).decision == {"action": "approve", "rule": "refunds"}
    await store.settle([])


async def test_a_recorded_decision_leaves_the_events_state_alone(store: Store) -> None:
    [event] = await claimed(store, TICKETS, "E-1")
    await store.record_decision(event.id, {"action": "agent", "rule": "r", "injection_score": 0.5})
    await store.record_decision(event.id, {"action": "agent", "rule": "r2", "injection_score": True})
    shown = await detail(store, event.id)
    assert (shown["state"], shown["decision"], shown["injection_score"]) == (
        "processing",
        {"action": "agent", "rule": "r2", "injection_score": True},
        0.5,  # a score that is not a number keeps the stored one
    )
    got = await store.event(event.id)
    assert (got.decision, got.attempts, got.approved) == (shown["decision"], 1, False)


async def test_finish_moves_events_to_a_state_with_an_error(store: Store) -> None:
    events = await claimed(store, TICKETS, "E-1", "E-2")
    await store.finish([e.id for e in events], "failed", "boom")
    await store.finish([], "done")
    assert [(e["state"], e["last_error"]) for e in await store.inbox(5)] == [("failed", "boom")] * 2
    await store.finish([events[0].id], "done")
    assert (await detail(store, events[0].id))["last_error"] is None


async def test_an_unknown_event_row_is_a_store_error(store: Store) -> None:
    [row] = await add(store, TICKETS, "E-1")
    with pytest.raises(StoreError):
        await store.event(row + 1000)
    with pytest.raises(StoreError):
        await store.answer(row + 1000, approve=True, note=None)
    assert await store.event_detail(row + 1000) is None


async def test_an_approved_event_goes_back_to_pending_and_a_denied_one_ends(store: Store) -> None:
    events = await claimed(store, TICKETS, "E-1", "E-2", "E-3")
    await store.settle([Settlement(e.id, {"action": "approve"}, "held") for e in events[:2]])
    held = await store.approvals()
    assert [h["event_id"] for h in held] == ["E-1", "E-2"]
    assert is_iso(held[0].pop("received_at"))
    assert held[0] == {
        "id": events[0].id,
        "server": "demo",
        "subscription": "tickets",
        "event": "ticket.created",
        "event_id": "E-1",
        "timestamp": T0,
        "decision": {"action": "approve"},
        "data": {"n": "E-1"},
        "injection_score": None,
    }
    await store.answer(events[0].id, approve=True, note="fine")
    await store.answer(events[1].id, approve=False, note=None)
    with pytest.raises(StoreError, match="not held for approval"):
        await store.answer(events[2].id, approve=True, note=None)
    approved, denied = await detail(store, events[0].id), await detail(store, events[1].id)
    assert (approved["state"], approved["approval_note"], is_iso(approved["approved_at"])) == (
        "pending",
        "fine",
        True,
    )
    assert (denied["state"], denied["approval_note"], denied["approved_at"]) == ("denied", None, None)
    assert (await store.event(events[0].id)).approved is True
    assert (await store.event(events[1].id)).approved is False
    assert await store.approvals() == []
    [again] = await store.claim(5, T0, lease_until=at(60))
    assert (again.id, again.approved, again.decision) == (events[0].id, True, {"action": "approve"})


async def test_each_answer_is_recorded_with_who_where_when_the_rule_and_what_it_grants(store: Store) -> None:
    events = await claimed(store, TICKETS, "E-1", "E-2", "E-3")
    decision = {
        "rule": "hold-it",
        "rule_tools": ["demo__close"],
        "why": "held",
        "authority": ["demo__close: ticket = 'E-1' (pinned)"],
    }
    await store.settle([Settlement(e.id, decision, "held") for e in events])
    slack = Answerer("slack:U0123ABCD", "relayed by token slack", "127.0.0.1")
    await store.answer(events[0].id, approve=True, note="ok", by=slack)
    await store.answer(
        events[1].id,
        approve=False,
        note=None,
        by=Answerer("operator", "browser session operator", "::1"),
        tools=[],
    )
    await store.answer(events[2].id, approve=True, note=None)  # no answerer given: said so, not guessed
    newest = await store.answers(10)
    assert [a["event_id"] for a in newest] == ["E-3", "E-2", "E-1"]
    for answer in newest:
        assert is_iso(answer.pop("at")) and answer.pop("id")
    assert newest[2] == {
        "row": events[0].id,
        "event_id": "E-1",
        "server": "demo",
        "subscription": "tickets",
        "answer": "approved",
        "who": "slack:U0123ABCD",
        "via": "relayed by token slack",
        "address": "127.0.0.1",
        "rule": "hold-it",
        "tools": ["demo__close"],  # the rule's, when the answerer does not say what it was shown
        "authority": ["demo__close: ticket = 'E-1' (pinned)"],
        "note": "ok",
    }
    assert (newest[1]["answer"], newest[1]["who"], newest[1]["address"], newest[1]["tools"]) == (
        "denied",
        "operator",
        "::1",
        [],
    )
    assert (newest[0]["who"], newest[0]["via"], newest[0]["address"]) == ("unrecorded", "unrecorded", None)
    assert [a["event_id"] for a in await store.answers(1)] == ["E-3"]
    [recorded] = (await detail(store, events[0].id))["answers"]
    assert recorded["who"] == "slack:U0123ABCD" and recorded["row"] == events[0].id
    assert [a["event_id"] for a in await store.answers(5, events[1].id)] == ["E-2"]
    # A refused answer (no longer held) records nothing.
    with pytest.raises(StoreError, match="not held for approval"):
        await store.answer(events[0].id, approve=False, note=None, by=slack)
    assert len(await store.answers(10)) == 3


async def test_holding_an_event_costs_it_no_attempt(store: Store) -> None:
    [event] = await claimed(store, TICKETS, "E-1")
    assert event.attempts == 1
    await store.settle([Settlement(event.id, {"rule": "hold-it"}, "held")])
    assert (await detail(store, event.id))["attempts"] == 0
    await store.answer(event.id, approve=True, note=None)
    [again] = await store.claim(5, T0, lease_until=at(60))
    assert (again.id, again.attempts, again.approved) == (event.id, 1, True)  # its first run, not its second


# ---- flow control --------------------------------------------------------------------------------------


async def test_the_same_dedup_key_within_the_window_is_a_duplicate_of_the_earlier_event(store: Store) -> None:
    first, second, third, fourth = await claimed(store, TICKETS, "E-1", "E-2", "E-3", "E-4")

    def gate(now: float) -> FlowGate:
        return FlowGate(now=at(now), dedup_key="printer", dedup_since=at(now - 60))

    assert await store.flow_gate(first.id, "r", {}, gate(0)) == FlowOutcome("run")
    assert await store.flow_gate(first.id, "r", {}, gate(1)) == FlowOutcome("run")  # never its own duplicate
    assert await store.flow_gate(second.id, "r", {}, gate(30)) == FlowOutcome(
        "duplicate", other=first.id, other_event_id="E-1"
    )
    assert await store.flow_gate(second.id, "other-rule", {}, gate(30)) == FlowOutcome("run")
    assert await store.flow_gate(third.id, "r", {}, gate(30)) == FlowOutcome(
        "duplicate", other=first.id, other_event_id="E-1"
    )
    # The first marks are out of the window (the duplicates left no mark of their own).
    assert await store.flow_gate(fourth.id, "r", {}, gate(200)) == FlowOutcome("run")
    assert (await detail(store, second.id))["state"] == "processing"  # a duplicate is the caller's to settle


async def test_past_the_rate_limit_the_oldest_run_in_the_window_is_reported(store: Store) -> None:
    events = await claimed(store, TICKETS, "E-1", "E-2", "E-3", "E-4", "E-5")

    def gate(now: float, key: str = "k") -> FlowGate:
        return FlowGate(now=at(now), rate_key=key, rate_since=at(now - 60), rate_max=2)

    assert await store.flow_gate(events[0].id, "r", {}, gate(0)) == FlowOutcome("run")
    assert await store.flow_gate(events[1].id, "r", {}, gate(10)) == FlowOutcome("run")
    assert await store.flow_gate(events[2].id, "r", {}, gate(20)) == FlowOutcome("over_limit", oldest=at(0))
    assert await store.flow_gate(events[2].id, "r", {}, gate(20, "another")) == FlowOutcome("run")
    # The window starts just after its start: a mark made at exactly that time is out.
    assert await store.flow_gate(events[3].id, "r", {}, gate(60)) == FlowOutcome("run")
    assert await store.flow_gate(events[4].id, "r", {}, gate(61)) == FlowOutcome("over_limit", oldest=at(10))


async def test_a_duplicate_over_the_rate_limit_still_marks_its_dedup_key(store: Store) -> None:
    first, second, third = await claimed(store, TICKETS, "E-1", "E-2", "E-3")
    both = FlowGate(
        now=at(0), dedup_key="d", dedup_since=at(-60), rate_key="k", rate_since=at(-60), rate_max=0
    )
    assert await store.flow_gate(first.id, "r", {}, both) == FlowOutcome("over_limit", oldest=None)
    assert await store.flow_gate(second.id, "r", {}, both) == FlowOutcome(
        "duplicate", other=first.id, other_event_id="E-1"
    )
    rate_only = FlowGate(now=at(0), rate_key="k", rate_since=at(-60), rate_max=1)
    assert await store.flow_gate(third.id, "r", {}, rate_only) == FlowOutcome(
        "run"
    )  # over_limit left no mark


async def test_events_within_the_debounce_window_join_their_leaders_batch(store: Store) -> None:
    events = await claimed(store, TICKETS, "E-1", "E-2", "E-3", "E-4")
    leader, member, other_key, _ = events

    def gate(now: float, key: str = "printer", batch_max: int = 50) -> FlowGate:
        return FlowGate(
            now=at(now), batch_key=key, batch_since=at(now - 30), batch_due=at(now + 30), batch_max=batch_max
        )

    decision = {"action": "agent", "rule": "r"}
    assert await store.flow_gate(leader.id, "r", decision, gate(0)) == FlowOutcome("leader")
    assert await store.flow_gate(member.id, "r", decision, gate(10)) == FlowOutcome(
        "batched", other=leader.id
    )
    assert await store.flow_gate(other_key.id, "r", decision, gate(10, "scanner")) == FlowOutcome("leader")
    shown = await detail(store, leader.id)
    assert (shown["state"], shown["attempts"]) == ("pending", 0)
    assert shown["decision"] == {"action": "agent", "rule": "r", "batch_leader": True}
    batched = await detail(store, member.id)
    assert (batched["state"], batched["decision"]) == ("batched", decision)
    assert await store.batch_members(leader.id) == [
        InboxEvent(member.id, "demo", "tickets", "ticket.created", "E-2", T0, {"n": "E-2"}, 1)
    ]
    assert await store.batch_members(other_key.id) == []
    # The leader waits for the window's end, then runs with its batch; both end with the run.
    assert await store.claim(5, at(29), lease_until=at(90)) == []
    [due] = await store.claim(5, at(30), lease_until=at(90))
    assert (due.id, due.attempts, due.decision) == (leader.id, 1, shown["decision"])
    run = await agent_run(store, due)
    assert await finish(store, run, EventVerdict("done")) is True
    assert [(await detail(store, e.id))["state"] for e in (leader, member)] == ["done", "done"]


async def test_a_full_or_running_batch_makes_the_next_event_open_a_new_one(store: Store) -> None:
    first, second, third, fourth = await claimed(store, TICKETS, "E-1", "E-2", "E-3", "E-4")
    gate = FlowGate(now=at(0), batch_key="k", batch_since=at(-30), batch_due=at(30), batch_max=2)
    assert await store.flow_gate(first.id, "r", {}, gate) == FlowOutcome("leader")
    assert await store.flow_gate(second.id, "r", {}, gate) == FlowOutcome("batched", other=first.id)
    assert await store.flow_gate(third.id, "r", {}, gate) == FlowOutcome("leader")  # the first batch is full
    [due] = await store.claim(1, at(30), lease_until=at(90))
    assert due.id == first.id
    later = FlowGate(now=at(10), batch_key="k", batch_since=at(-20), batch_due=at(40), batch_max=5)
    # The first leader is running: only the third's batch takes members.
    assert await store.flow_gate(fourth.id, "r", {}, later) == FlowOutcome("batched", other=third.id)


async def test_a_batched_event_leaves_the_rate_limit_to_its_leader(store: Store) -> None:
    first, second, third = await claimed(store, TICKETS, "E-1", "E-2", "E-3")
    gate = FlowGate(
        now=at(0),
        rate_key="k",
        rate_since=at(-60),
        rate_max=1,
        batch_key="b",
        batch_since=at(-30),
        batch_due=at(30),
    )
    assert await store.flow_gate(first.id, "r", {}, gate) == FlowOutcome("leader")
    assert await store.flow_gate(second.id, "r", {}, gate) == FlowOutcome("batched", other=first.id)
    other_batch = FlowGate(
        now=at(1),
        rate_key="k",
        rate_since=at(-59),
        rate_max=1,
        batch_key="c",
        batch_since=at(-29),
        batch_due=at(31),
    )
    assert await store.flow_gate(third.id, "r", {}, other_batch) == FlowOutcome("over_limit", oldest=at(0))
    assert (await detail(store, third.id))["state"] == "processing"


# ---- runs -----------------------------------------------------------------------------------------------


async def test_a_completed_run_is_shown_whole_and_its_event_is_done(store: Store) -> None:
    [event] = await claimed(store, TICKETS, "E-1")
    run = await store.start_run(
        event.id,
        kind="agent",
        attempt=1,
        model="openai/gpt",
        decision={"rule": "r", "action": "agent"},
        system_prompt="you are",
        user_prompt="an event",
    )
    assert isinstance(run, int)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "an event"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "closed"},
        {"role": "assistant", "content": "Closed  the\nticket."},
    ]
    await store.record_progress(run, RunProgress(messages[:3], 1, 10, 2, 0.001), [call("c1")])
    progress = RunProgress(messages, 2, 30, 6, 0.003)
    assert await store.finish_run(
        run,
        status="completed",
        reason=None,
        progress=progress,
        duration_ms=1234,
        verdict=EventVerdict("done"),
    )
    shown = await detail(store, event.id)
    assert (shown["state"], shown["attempts"], shown["last_error"]) == ("done", 1, None)
    [stored] = shown["runs"]
    assert is_iso(stored.pop("started_at")) and is_iso(stored.pop("finished_at"))
    assert stored == {
        "run_id": run,
        "kind": "agent",
        "attempt": 1,
        "model": "openai/gpt",
        "status": "completed",
        "reason": None,
        "decision": {"rule": "r", "action": "agent"},
        "system_prompt": "you are",
        "user_prompt": "an event",
        "messages": messages,
        "steps": 2,
        "prompt_tokens": 30,
        "completion_tokens": 6,
        "cached_tokens": 0,
        "cost_usd": 0.003,
        "duration_ms": 1234,
        "summary": "Closed the ticket.",
        "tool_calls": [
            {
                "step": 1,
                "call_id": "c1",
                "tool": "demo__close",
                "server": "demo",
                "name": "close",
                "arguments": {"id": 1},
                "status": "ok",
                "result": "closed",
                "duration_ms": 3,
            }
        ],
    }


async def test_a_failed_run_moves_its_event_as_its_verdict_says(store: Store) -> None:
    failed, retried, refunded, untouched = await claimed(store, TICKETS, "E-1", "E-2", "E-3", "E-4")
    run = await agent_run(store, failed)
    assert await finish(store, run, EventVerdict("failed", "LLM down")) is True
    run = await agent_run(store, retried)
    assert await finish(store, run, EventVerdict("pending", "timeout", retry_at=at(120))) is True
    run = await agent_run(store, refunded)
    assert await finish(store, run, EventVerdict("pending", "stopping", refund_attempt=True)) is True
    run = await agent_run(store, untouched)
    assert await finish(store, run, None) is True
    states = {e.event_id: await detail(store, e.id) for e in (failed, retried, refunded, untouched)}
    assert {k: (v["state"], v["attempts"], v["last_error"]) for k, v in states.items()} == {
        "E-1": ("failed", 1, "LLM down"),
        "E-2": ("pending", 1, "timeout"),
        "E-3": ("pending", 0, "stopping"),
        "E-4": ("processing", 1, None),
    }
    # E-3 at once; E-4, whose run ended without a verdict, when its lease lapsed.
    assert [e.event_id for e in await store.claim(5, at(119), lease_until=at(200))] == ["E-3", "E-4"]
    assert [(e.event_id, e.attempts) for e in await store.claim(5, at(120), lease_until=at(200))] == [
        ("E-2", 2)
    ]


async def test_a_run_whose_lease_lapsed_cannot_move_its_event(store: Store) -> None:
    [row] = await add(store, TICKETS, "E-1")
    [first] = await store.claim(1, T0, lease_until=at(1))
    run = await agent_run(store, first)
    [again] = await store.claim(1, at(5), lease_until=at(60))
    assert await finish(store, run, EventVerdict("done")) is False
    shown = await detail(store, row)
    assert (shown["state"], shown["attempts"]) == ("processing", 2)
    [stale] = shown["runs"]
    assert stale["status"] == "interrupted" and "lease lapsed" in stale["reason"]
    current = await agent_run(store, again)
    assert await finish(store, current, EventVerdict("done")) is True
    assert (await detail(store, row))["state"] == "done"


async def test_a_failed_batch_leader_takes_its_batch_with_it_but_a_retried_one_keeps_it(store: Store) -> None:
    leader, member = await claimed(store, TICKETS, "E-1", "E-2")
    gate = FlowGate(now=at(0), batch_key="k", batch_since=at(-30), batch_due=at(30))
    await store.flow_gate(leader.id, "r", {}, gate)
    await store.flow_gate(member.id, "r", {}, gate)
    [due] = await store.claim(1, at(30), lease_until=at(90))
    run = await agent_run(store, due)
    await finish(store, run, EventVerdict("pending", "timeout", retry_at=at(60)))
    assert (await detail(store, member.id))["state"] == "batched"
    [due] = await store.claim(1, at(60), lease_until=at(120))
    run = await agent_run(store, due)
    await finish(store, run, EventVerdict("failed", "gave up"))
    shown = await detail(store, member.id)
    assert (shown["state"], shown["last_error"]) == ("failed", "gave up")


async def test_an_agent_runs_sanitize_report_is_stored_with_the_policys_decision_kept(store: Store) -> None:
    [event] = await claimed(store, TICKETS, "E-1")
    await store.record_decision(event.id, {"rule": "r", "tools": ["demo__close"]})
    report = {"injection_score": 0.25, "cuts": 1}
    await store.start_run(
        event.id,
        kind="dry_run",
        attempt=1,
        model="m",
        decision={"rule": "dry"},
        system_prompt=None,
        user_prompt=None,
        sanitize_report={"injection_score": 0.9},
    )
    assert (await detail(store, event.id))["sanitize_report"] is None  # only an agent run's is kept
    await store.start_run(
        event.id,
        kind="agent",
        attempt=1,
        model="m",
        decision={"rule": "other", "model": "m", "prompt": "p"},
        system_prompt=None,
        user_prompt=None,
        sanitize_report=report,
    )
    shown = await detail(store, event.id)
    assert (shown["sanitize_report"], shown["injection_score"]) == (report, 0.25)
    assert shown["decision"] == {"rule": "r", "tools": ["demo__close"], "model": "m", "prompt": "p"}
    assert [r["decision"] for r in shown["runs"]] == [
        {"rule": "dry"},
        {"rule": "other", "model": "m", "prompt": "p"},
    ]


async def test_a_journaled_call_is_sent_until_settled_and_a_rerun_resumes_from_it(store: Store) -> None:
    [event] = await claimed(store, TICKETS, "E-1")
    run = await agent_run(store, event)
    assert await store.resume_point(event.id) is None  # no LLM answer yet
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
    ]
    await store.record_progress(run, RunProgress(messages, 1, 5, 1, 0.5), [])
    first = await store.journal_tool_call(run, call("c1", "sent"), "key-1")
    second = await store.journal_tool_call(run, call("c2", "sent", tool="demo__note"), "key-2")
    assert isinstance(first, int) and first != second
    await store.settle_tool_call(first, status="ok", result="closed", reply="ticket closed", duration_ms=9)
    point = await store.resume_point(event.id)
    assert point is not None
    assert (
        point.run_id,
        point.messages,
        point.steps,
        point.prompt_tokens,
        point.completion_tokens,
        point.cost_usd,
    ) == (
        run,
        messages,
        1,
        5,
        1,
        0.5,
    )
    assert point.calls == {
        "c1": JournaledCall("c1", "demo__close", "ok", {"id": 1}, "closed", "ticket closed", "key-1"),
        "c2": JournaledCall("c2", "demo__note", "sent", {"id": 1}, None, None, "key-2"),
    }
    # The next run takes over the transcript and the journal; settled calls become 'reused'.
    await store.requeue_interrupted()
    [again] = await store.claim(1, T0, lease_until=at(60))
    rerun = await agent_run(store, again)
    progress = RunProgress(messages, 1, 5, 1, 0.5)
    await store.adopt_run(rerun, run, ["c1", "c2"], progress)
    adopted = await store.resume_point(event.id)
    assert adopted is not None and adopted.run_id == rerun
    assert {k: (c.status, c.reply, c.idempotency_key) for k, c in adopted.calls.items()} == {
        "c1": ("reused", "ticket closed", "key-1"),
        "c2": ("sent", None, "key-2"),
    }
    assert adopted.messages == messages


async def test_only_the_named_calls_are_adopted(store: Store) -> None:
    [event] = await claimed(store, TICKETS, "E-1")
    run = await agent_run(store, event)
    for n in (1, 2, 3):
        row = await store.journal_tool_call(run, call(f"c{n}", "sent"), f"key-{n}")
        await store.settle_tool_call(row, status="error", result="no", reply="failed", duration_ms=1)
    rerun = await agent_run(store, event)
    progress = RunProgress([{"role": "assistant", "content": "x"}], 3, 1, 1, None)
    await store.adopt_run(rerun, run, ["c3", "c1"], progress)
    point = await store.resume_point(event.id)
    assert point is not None and point.run_id == rerun
    # The journal spans the event's runs: c2, which the rerun did not adopt, is the first run's.
    assert [(c.call_id, c.status) for c in point.calls.values()] == [
        ("c1", "reused"),
        ("c2", "error"),
        ("c3", "reused"),
    ]
    await store.adopt_run(rerun, run, [], progress)


async def test_a_tool_call_is_journaled_only_while_its_run_holds_a_current_lease(store: Store) -> None:
    [row] = await add(store, TICKETS, "E-1")
    [first] = await store.claim(1, T0, lease_until=at(10))
    run = await agent_run(store, first)
    assert isinstance(await store.journal_tool_call(run, call("c1", "sent"), "key-1", now=at(9)), int)
    # The lease lapsed: nobody has claimed the event again yet, but from now on anybody may.
    with pytest.raises(LeaseLost, match="lease lapsed"):
        await store.journal_tool_call(run, call("c2", "sent"), "key-2", now=at(11))
    # Claimed again: the first claim's run may not journal, whatever the time.
    [again] = await store.claim(1, at(11), lease_until=at(60))
    for now in (at(12), None):
        with pytest.raises(LeaseLost, match="claimed again"):
            await store.journal_tool_call(run, call("c3", "sent"), "key-3", now=now)
    current = await agent_run(store, again)
    await store.journal_tool_call(current, call("c4", "sent"), "key-4", now=at(12))
    assert await finish(store, current, EventVerdict("done")) is True
    with pytest.raises(LeaseLost, match="is done now"):
        await store.journal_tool_call(current, call("c5", "sent"), "key-5", now=at(12))
    # Nothing of the refused calls was written.
    journaled = [
        (c["call_id"], c["status"]) for r in (await detail(store, row))["runs"] for c in r["tool_calls"]
    ]
    assert journaled == [("c1", "sent"), ("c4", "sent")]


async def test_a_run_fenced_out_by_a_newer_claim_with_the_same_count_journals_nothing(store: Store) -> None:
    """A release lowers the count of claims, so the next claim has the stale run's number again; the
    claim ended the stale run (interrupted) in its own transaction, and that fences it out."""
    await add(store, TICKETS, "E-1")
    [first] = await store.claim(1, T0, lease_until=at(60))
    stale = await agent_run(store, first)
    await store.release(first.id, T0)
    [again] = await store.claim(1, T0, lease_until=at(60))
    assert again.attempts == first.attempts, "the same count: the number alone cannot tell the claims apart"
    with pytest.raises(LeaseLost, match="this run was ended"):
        await store.journal_tool_call(stale, call("c1", "sent"), "key-1", now=at(1))
    current = await agent_run(store, again)
    assert isinstance(await store.journal_tool_call(current, call("c2", "sent"), "key-2", now=at(1)), int)


async def test_a_replay_journals_its_calls_whatever_its_events_claim(store: Store) -> None:
    [event] = await claimed(store, TICKETS, "E-1")
    run = await agent_run(store, event)
    assert await finish(store, run, EventVerdict("done")) is True
    replay = await store.start_run(
        event.id, kind="replay", attempt=1, model="m", decision={}, system_prompt=None, user_prompt=None
    )
    assert isinstance(await store.journal_tool_call(replay, call("c1", "sent"), "key-1", now=at(999)), int)


async def test_a_rerun_resumes_from_the_newest_answered_run_with_every_runs_settled_calls(
    store: Store,
) -> None:
    [row] = await add(store, TICKETS, "E-1")
    [first] = await store.claim(1, T0, lease_until=at(10))
    stale = await agent_run(store, first)
    asked: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
    ]
    await store.record_progress(stale, RunProgress(asked, 1, 5, 1, None), [])
    sent = await store.journal_tool_call(stale, call("c1", "sent"), "key-1", now=at(5))
    await store.journal_tool_call(stale, call("c2", "sent"), "key-2", now=at(5))
    # Its lease lapsed while c1 was out; a second claim's run adopted c1 as still 'sent' ...
    [second] = await store.claim(1, at(11), lease_until=at(20))
    adopting = await agent_run(store, second)
    await store.adopt_run(adopting, stale, ["c1", "c2"], RunProgress(asked, 1, 5, 1, None))
    # ... then the stale run learnt c1's outcome and recorded it.
    await store.settle_tool_call(sent, status="ok", result="closed", reply="ticket closed", duration_ms=9)
    # A third claim's run stopped before its first answer: it is the newest run, but has no answer.
    [third] = await store.claim(1, at(21), lease_until=at(30))
    await agent_run(store, third)
    point = await store.resume_point(row)
    assert point is not None and point.run_id == adopting and point.messages == asked
    assert {k: (c.status, c.reply, c.idempotency_key) for k, c in point.calls.items()} == {
        "c1": ("ok", "ticket closed", "key-1"),
        "c2": ("sent", None, "key-2"),
    }
    # A run that adopts from it gets c1 settled, as 'reused', though the run it adopts from has it 'sent'.
    [fourth] = await store.claim(1, at(31), lease_until=at(40))
    rerun = await agent_run(store, fourth)
    await store.adopt_run(rerun, adopting, ["c1", "c2"], RunProgress(asked, 1, 5, 1, None))
    [*_, last] = (await detail(store, row))["runs"]
    assert [(c["call_id"], c["status"]) for c in last["tool_calls"]] == [("c1", "reused"), ("c2", "sent")]


async def test_agent_usage_counts_agent_runs_and_the_spend_of_every_run(store: Store) -> None:
    events = await claimed(store, TICKETS, "E-1", "E-2", "E-3")
    kinds: tuple[RunKind, ...] = ("agent", "agent", "replay")
    for event, kind in zip(events, kinds, strict=True):
        run = await store.start_run(
            event.id, kind=kind, attempt=1, model="m", decision={}, system_prompt=None, user_prompt=None
        )
        await finish(store, run, EventVerdict("done"), RunProgress([], 1, 10, 5, 0.25))
    assert await store.agent_usage("2000-01-01T00:00:00.000Z", "2000-01-01T00:00:00.000Z") == (2, 0.75)
    assert await store.agent_usage("2999-01-01T00:00:00.000Z", "2000-01-01T00:00:00.000Z") == (0, 0.75)
    assert await store.agent_usage("2000-01-01T00:00:00.000Z", "2999-01-01T00:00:00.000Z") == (2, 0.0)


# ---- the service's record -------------------------------------------------------------------------------


async def test_the_services_starts_heartbeats_pauses_and_stops_are_recorded(store: Store) -> None:
    assert await store.services() == []
    first = await store.service_started(pid=11, host="h1", version="0.1.0", heartbeat_s=5)
    await store.service_stopped(first)
    second = await store.service_started(pid=12, host="h2", version=None, heartbeat_s=2.5)
    await store.service_paused("max_runs_per_hour=1 reached")
    await store.service_heartbeat(second)
    newest, older = await store.services()
    assert set(newest) == {
        "id",
        "pid",
        "host",
        "version",
        "started_at",
        "heartbeat_at",
        "heartbeat_s",
        "stopped_at",
        "paused",
    }
    assert (newest["id"], newest["pid"], newest["host"], newest["version"], newest["heartbeat_s"]) == (
        second,
        12,
        "h2",
        None,
        2.5,
    )
    assert (newest["stopped_at"], newest["paused"]) == (None, "max_runs_per_hour=1 reached")
    assert is_iso(newest["started_at"]) and newest["heartbeat_at"] >= newest["started_at"]
    assert (older["id"], older["pid"], older["heartbeat_s"], older["paused"]) == (first, 11, 5.0, None)
    assert is_iso(older["stopped_at"]) and older["heartbeat_at"] == older["stopped_at"]
    await store.service_paused(None)
    await store.service_stopped(second)
    stopped = (await store.services(1))[0]
    assert (stopped["id"], stopped["paused"], is_iso(stopped["stopped_at"])) == (second, None, True)
    # After a stop, nothing moves its record: not a late heartbeat, nor a pause.
    await store.service_heartbeat(second)
    await store.service_paused("late")
    assert (await store.services(1))[0] == stopped


async def test_only_the_last_twenty_starts_are_kept(store: Store) -> None:
    ids = [await store.service_started(pid=n, host="h", version=None, heartbeat_s=1) for n in range(22)]
    kept = await store.services(limit=50)
    assert [s["id"] for s in kept] == ids[:1:-1]
    assert [s["pid"] for s in await store.services()] == [21, 20, 19, 18, 17]


# ---- read-only views --------------------------------------------------------------------------------------


async def test_run_counts_give_runs_by_status_events_by_state_and_the_last_failure(store: Store) -> None:
    events = await claimed(store, TICKETS, "E-1", "E-2", "E-3")
    await add(store, OTHER, "O-1")
    for event, verdict in zip(events, (EventVerdict("done"), EventVerdict("failed", "first")), strict=False):
        await finish(store, await agent_run(store, event), verdict)
    await store.start_run(
        events[2].id, kind="dry_run", attempt=1, model="m", decision={}, system_prompt=None, user_prompt=None
    )
    await store.finish([events[2].id], "dead", "second")
    assert await store.run_counts() == {
        "tickets": {
            "runs_completed": 1,
            "runs_failed": 1,
            "events_done": 1,
            "events_failed": 1,
            "events_dead": 1,
            "last_failure": "second",
        },
        "feed": {"events_pending": 1},
    }


async def test_the_inbox_shows_the_newest_events_first_by_state(store: Store) -> None:
    rows = await add(store, TICKETS, "E-1", "E-2", "E-3")
    await store.claim(1, T0, lease_until=at(60))
    newest = await store.inbox(2)
    assert [e["event_id"] for e in newest] == ["E-3", "E-2"]
    assert is_iso(newest[0].pop("received_at"))
    assert newest[0] == {
        "id": rows[2],
        "server": "demo",
        "subscription": "tickets",
        "event": "ticket.created",
        "event_id": "E-3",
        "timestamp": T0,
        "state": "pending",
        "attempts": 0,
        "data": {"n": "E-3"},
        "last_error": None,
    }
    assert [e["event_id"] for e in await store.inbox(10, state="processing")] == ["E-1"]
    assert await store.inbox(10, state="held") == []


async def test_actions_summarize_the_newest_runs_first(store: Store) -> None:
    first, second = await claimed(store, TICKETS, "E-1", "E-2")
    older = await agent_run(store, first)
    await store.record_progress(
        older,
        NO_PROGRESS,
        [call("c1"), call("c2", "refused", tool="demo__delete"), call("c3", tool="demo__note")],
    )
    await finish(
        store,
        older,
        EventVerdict("done"),
        RunProgress([{"role": "assistant", "content": "x" * 300}], 1, 1, 1, None),
    )
    newer = await agent_run(store, second)
    tool_turn = [{"role": "assistant", "content": "thinking", "tool_calls": [{"id": "c"}]}]
    await store.finish_run(
        newer,
        status="failed",
        reason="LLM down",
        progress=RunProgress(tool_turn, 1, 100, 20, 0.25),
        duration_ms=50,
        verdict=EventVerdict("failed", "LLM down"),
    )
    actions = await store.actions(10)
    assert [a["run_id"] for a in actions] == [newer, older]
    assert is_iso(actions[0].pop("started_at"))
    assert actions[0] == {
        "run_id": newer,
        "event_id": "E-2",
        "server": "demo",
        "subscription": "tickets",
        "event": "ticket.created",
        "kind": "agent",
        "attempt": 1,
        "model": "m",
        "status": "failed",
        "reason": "LLM down",
        "steps": 1,
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "cached_tokens": 0,
        "cost_usd": 0.25,
        "duration_ms": 50,
        "tool_calls": 0,
        "refused": 0,
        "tools": [],
        "summary": None,
    }
    last = actions[1]
    assert (last["tool_calls"], last["refused"], last["tools"]) == (
        3,
        1,
        ["demo__close", "demo__delete", "demo__note"],
    )
    assert last["summary"] == "x" * 199 + "…"
    assert [a["run_id"] for a in await store.actions(1)] == [newer]


async def test_find_events_gives_each_servers_event_with_that_id(store: Store) -> None:
    [ticket] = await add(store, TICKETS, "E-1")
    [other] = await add(store, OTHER, "E-1")
    found = await store.find_events("E-1")
    assert [(e["id"], e["server"]) for e in found] == [(ticket, "demo"), (other, "other")]
    assert [e["id"] for e in await store.find_events("E-1", "other")] == [other]
    assert await store.find_events("E-404") == []
    shown = found[0]
    received = shown.pop("received_at")
    assert is_iso(received)
    assert shown == {
        "id": ticket,
        "server": "demo",
        "subscription": "tickets",
        "event": "ticket.created",
        "event_id": "E-1",
        "timestamp": T0,
        "state": "pending",
        "attempts": 0,
        "data": {"n": "E-1"},
        "meta": None,
        "last_error": None,
        "injection_score": None,
        "sanitize_report": None,
        "decision": None,
        "approved_at": None,
        "approval_note": None,
        "runs": [],
        "answers": [],
    }
    assert await store.event_detail(ticket) == {**shown, "received_at": received}


async def test_event_ids_state_counts_and_the_oldest_pending_event(store: Store) -> None:
    assert await store.oldest_pending_at() is None
    assert await store.state_counts() == dict.fromkeys(EVENT_STATES, 0)
    before = now_iso()
    await add(store, TICKETS, "E-1", "E-2")
    await add(store, OTHER, "O-1")
    after = now_iso()
    oldest = await store.oldest_pending_at()
    assert oldest is not None and is_iso(oldest) and before <= oldest <= after
    assert await store.event_ids() == ["E-1", "E-2", "O-1"]
    assert await store.event_ids("feed") == ["O-1"]
    assert await store.event_ids("nobody") == []
    claimed_all = await store.claim(3, T0, lease_until=at(60))
    await store.finish([claimed_all[0].id], "done")
    counts = await store.state_counts()
    assert list(counts) == list(EVENT_STATES)
    assert counts == {**dict.fromkeys(EVENT_STATES, 0), "processing": 2, "done": 1}
    assert await store.oldest_pending_at() is None


# ---- who drives each subscription's delivery loop -------------------------------------------------

NAMES = ["alerts", "feed", "tickets"]


async def test_a_lease_is_renewed_by_its_owner_and_taken_over_with_a_raised_fence_once_it_lapses(
    store: Store,
) -> None:
    assert await store.hold_subscriptions("a", NAMES, at(10), at(0)) == dict.fromkeys(NAMES, 1)
    # Held by "a" until 10 s: "b" gets nothing, "a" renews it with the same fence.
    assert await store.hold_subscriptions("b", NAMES, at(15), at(5)) == {}
    assert await store.hold_subscriptions("a", NAMES, at(16), at(6)) == dict.fromkeys(NAMES, 1)
    # A lease ending exactly now still holds; one that ended before now is free.
    assert await store.hold_subscriptions("b", NAMES, at(26), at(16)) == {}
    assert await store.hold_subscriptions("b", ["tickets", "alerts"], at(27), at(17)) == {
        "alerts": 2,
        "tickets": 2,
    }
    # "a" renews what it still holds; a new name goes to whoever asks first.
    assert await store.hold_subscriptions("a", [*NAMES, "new"], at(28), at(17)) == {"feed": 1, "new": 1}
    assert await store.subscription_owners() == [
        {"subscription": "alerts", "owner": "b", "fence": 2, "lease_until": at(27)},
        {"subscription": "feed", "owner": "a", "fence": 1, "lease_until": at(28)},
        {"subscription": "new", "owner": "a", "fence": 1, "lease_until": at(28)},
        {"subscription": "tickets", "owner": "b", "fence": 2, "lease_until": at(27)},
    ]
    # Taken back by "a" after "b" lapsed: a third owner change, a third fence.
    assert await store.hold_subscriptions("a", ["tickets"], at(40), at(30)) == {"tickets": 3}


async def test_a_released_lease_is_taken_over_at_once_with_its_fence_raised(store: Store) -> None:
    await store.hold_subscriptions("a", NAMES, at(10), at(0))
    await store.release_subscriptions("a", ["tickets"])
    assert await store.hold_subscriptions("b", NAMES, at(11), at(1)) == {"tickets": 2}
    await store.release_subscriptions("a")
    assert await store.hold_subscriptions("b", NAMES, at(12), at(2)) == {"alerts": 2, "feed": 2, "tickets": 2}
    # Releasing what another owner holds changes nothing.
    await store.release_subscriptions("a")
    assert await store.hold_subscriptions("a", NAMES, at(13), at(3)) == {}


async def test_ingest_with_a_stale_fence_writes_nothing_and_raises_fenced_out(store: Store) -> None:
    await store.register(TICKETS)
    [fence] = (await store.hold_subscriptions("a", ["tickets"], at(10), at(0))).values()
    await store.ingest(TICKETS, [incoming("E-1")], "c1", fence=fence)
    # "a" pauses past its lease; "b" takes the subscription over and stores past it.
    taken = await store.hold_subscriptions("b", ["tickets"], at(30), at(20))
    assert taken == {"tickets": fence + 1}
    await store.ingest(TICKETS, [incoming("E-2")], "c2", fence=taken["tickets"])
    before = await store.subscriptions()
    with pytest.raises(
        FencedOut, match=r"subscription tickets is now driven by another process \(fence 2 > 1\)"
    ):
        await store.ingest(
            TICKETS, [incoming("E-1b"), incoming("E-3")], "c1b", truncated=True, fence=fence, rejected=[]
        )
    assert await store.cursor("tickets") == "c2"
    assert await store.event_ids() == ["E-1", "E-2"]
    assert await store.gaps() == []
    assert await store.subscriptions() == before
    # Unfenced writes (webhook deliveries, a store of one process) are not checked.
    await store.ingest(TICKETS, [incoming("E-3")], "c3")
    assert await store.cursor("tickets") == "c3"


async def test_a_fence_on_a_subscription_nobody_holds_is_refused(store: Store) -> None:
    await store.register(TICKETS)
    with pytest.raises(FencedOut):
        await store.ingest(TICKETS, [incoming("E-1")], "c1", fence=1)
    assert await store.event_ids() == []


async def test_two_owners_racing_for_the_same_subscriptions_never_both_hold_one(
    store: Store, second_store: Store
) -> None:
    names = [f"sub-{n:03}" for n in range(200)]
    results: dict[str, dict[str, int]] = {}

    async def hold(owner: str, handle: Store) -> None:
        results[owner] = await handle.hold_subscriptions(owner, names, at(10), at(0))

    for _ in range(3):  # the later rounds renew what each got, and take nothing from the other
        async with anyio.create_task_group() as tg:
            for owner, handle in (("a", store), ("b", second_store)):
                tg.start_soon(hold, owner, handle)
        assert not set(results["a"]) & set(results["b"])
        assert set(results["a"]) | set(results["b"]) == set(names)
    owners = {row["subscription"]: row["owner"] for row in await store.subscription_owners()}
    assert owners == {name: "a" if name in results["a"] else "b" for name in names}


async def test_register_with_a_stale_fence_writes_nothing_and_raises_fenced_out(store: Store) -> None:
    await store.register(TICKETS)
    [fence] = (await store.hold_subscriptions("a", ["tickets"], at(10), at(0))).values()
    # "a" pauses past its lease; "b" takes the subscription over, under a changed config, and stores.
    changed = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "billing"})
    taken = await store.hold_subscriptions("b", ["tickets"], at(30), at(20))
    assert await store.register(changed, fence=taken["tickets"]) is None
    await store.ingest(changed, [incoming("E-2", changed)], "c2", fence=taken["tickets"])
    before = await store.subscriptions()
    # "a"'s late register, under its old config, would drop "b"'s cursor: it writes nothing.
    with pytest.raises(FencedOut, match=r"subscription tickets is now driven by another process"):
        await store.register(TICKETS, fence=fence)
    assert await store.subscriptions() == before
    assert await store.cursor("tickets") == "c2"
    # The current fence registers as an unfenced call does: a changed key drops the cursor.
    assert await store.register(changed, fence=taken["tickets"]) == "c2"
    assert await store.register(TICKETS, fence=taken["tickets"]) is None
    assert await store.cursor("tickets") is None
    # A fence for a subscription nobody holds adds no row.
    with pytest.raises(FencedOut):
        await store.register(ALERTS, fence=1)
    assert [row["subscription"] for row in await store.subscriptions()] == ["tickets"]


async def test_webhook_subscribed_with_a_stale_fence_writes_nothing_and_raises_fenced_out(
    store: Store,
) -> None:
    await store.register(TICKETS)
    await store.prepare_webhook(TICKETS, URL, "s1")
    [fence] = (await store.hold_subscriptions("a", ["tickets"], at(10), at(0))).values()
    first = await store.webhook_subscribed(
        "tickets",
        webhook_id="wh-1",
        sent_secret="s1",
        refresh_before=at(3600),
        delivery_status=None,
        previous_until=at(600),
        fence=fence,
    )
    assert first is not None and first.refreshes == 1
    # A retired id the late write would bring back to life (it clears a retired row's id).
    await store.prepare_webhook(OTHER, URL + "/feed", "f1")
    await store.webhook_subscribed(
        "feed",
        webhook_id="wh-old",
        sent_secret="f1",
        refresh_before=None,
        delivery_status=None,
        previous_until=at(600),
    )
    await store.retire_webhook("feed", "removed", unsubscribed=False)
    # "a" pauses past its lease; "b" takes over and subscribes with a rotated secret.
    taken = await store.hold_subscriptions("b", ["tickets"], at(30), at(20))
    await store.request_rotation(["tickets"], secrets("s2"))
    current = await store.webhook_subscribed(
        "tickets",
        webhook_id="wh-2",
        sent_secret="s2",
        refresh_before=at(7200),
        delivery_status={"active": True},
        previous_until=at(900),
        fence=taken["tickets"],
    )
    assert current is not None and current.refreshes == 2
    # "a"'s subscribe answer arrives late: nothing of it is written.
    with pytest.raises(FencedOut, match=r"subscription tickets is now driven by another process"):
        await store.webhook_subscribed(
            "tickets",
            webhook_id="wh-old",
            sent_secret="s1",
            refresh_before=at(3600),
            delivery_status=None,
            previous_until=at(1200),
            fence=fence,
        )
    assert await store.webhook("tickets") == current
    assert [r.webhook_id for r in await store.to_unsubscribe()] == ["wh-old"]
    assert await store.retired_webhook_ids() == {"wh-old"}
