"""The webhook sender's deliveries: signing, per-subscription shaping, retries, the watermark cursor,
deliveryStatus, suspension, and the gap and terminated envelopes.

A real HTTPS receiver on loopback answers through a per-test ``respond``; every
delivery is checked with the ``standardwebhooks`` reference library. Tests wait
on arrivals and on the sender's own "acknowledged/abandoned/suspended" log
lines (``Signals``), never on sleeps; backoffs are 10 to 50 ms.
"""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest
import trustme
from _webhook_server_support import (
    DNS,
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

from agentwake.server import EmitBuffer, EventContext, EventsExtension, forbidden

pytestmark = pytest.mark.anyio

OCCURRENCE_FIELDS = {"eventId", "name", "timestamp", "data", "cursor"}


def incidents(
    ca: trustme.CA,
    caller: Caller,
    *,
    now: FakeNow | None = None,
    buffer: EmitBuffer | None = None,
    dns: DNS | None = None,
    **settings: Any,
) -> EventsExtension:
    options: dict[str, Any] = {"now": now} if now is not None else {}
    events = EventsExtension(
        webhook=webhook_settings(ca, dns, **settings), principal_of=caller, emit_buffer=buffer, **options
    )
    declare_incidents(events)
    return events


def failing(statuses: dict[str, list[int]]) -> Any:
    """A responder answering each event's attempts with the listed statuses in turn, then 200."""

    def respond(received: Received) -> Reply:
        if received.kind != "event":
            return echo(received)
        queue = statuses.get(received.document["eventId"], [])
        return (queue.pop(0), {}) if queue else (200, {})

    return respond


async def test_every_delivery_is_a_signed_event_occurrence_shaped_per_subscription(ca: trustme.CA) -> None:
    caller = Caller()
    events = incidents(ca, caller)
    urgent, routine = new_secret(), new_secret()
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        p1 = await wire.subscribe(
            "incident.created", receiver.url("/p1"), urgent, {"severity": "P1", "redact": True}
        )
        p2 = await wire.subscribe("incident.created", receiver.url("/p2"), routine, {"severity": "P2"})
        events.emit(incident(1, "P1"))
        events.emit(incident(2, "P2"))
        first, second = await receiver.next("event"), await receiver.next("event")

    by_path = {r.path: r for r in (first, second)}
    one, two = by_path["/p1"], by_path["/p2"]
    assert one.verify(urgent)["data"] == {
        "incidentId": "INC-1",
        "severity": "P1",
        "reporter": None,
    }  # transform
    assert two.verify(routine)["data"] == {"incidentId": "INC-2", "severity": "P2", "reporter": "amy"}
    for received, subscription, event_id in ((one, p1, "inc-1"), (two, p2, "inc-2")):
        assert set(received.document) == OCCURRENCE_FIELDS
        assert received.document["eventId"] == received.msg_id == event_id
        assert received.document["name"] == "incident.created"
        assert received.subscription == subscription["id"]
        assert received.headers["content-type"] == "application/json"
        assert re.fullmatch(r"\d{10}", received.headers["webhook-timestamp"])
        assert re.fullmatch(r"v1,[A-Za-z0-9+/]{43}=", received.headers["webhook-signature"])
    assert len(receiver.of("event")) == 2  # match: each endpoint got only its severity


async def test_a_check_function_type_is_read_every_next_poll_ms(ca: trustme.CA) -> None:
    caller, tickets = Caller(), Tickets()
    events = EventsExtension(webhook=webhook_settings(ca), principal_of=caller)
    declare_tickets(events, tickets, next_poll_ms=20)
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        result = await wire.subscribe("ticket.created", receiver.url(), new_secret())
        tickets.add("one", "two")  # no wake: the subscription's own poll finds them
        delivered = [await receiver.next("event") for _ in range(2)]
    assert result["cursor"] == "0"
    assert sorted(r.document["eventId"] for r in delivered) == ["t1", "t2"]


async def test_a_5xx_is_retried_with_growing_backoff_and_a_fresh_timestamp_and_signature_each_time(
    ca: trustme.CA, signals: Signals, caplog: pytest.LogCaptureFixture
) -> None:
    caller, now = Caller(), FakeNow()
    events = incidents(ca, caller, now=now)
    statuses = {"inc-1": [503, 500]}
    respond = failing(statuses)

    def tick(received: Received) -> Reply:
        now.advance(seconds=2)  # the server's clock moves between attempts
        return respond(received)  # type: ignore[no-any-return]

    secret = new_secret()
    caplog.set_level("DEBUG", logger="agentwake.server._webhook_delivery")
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        receiver.respond = tick
        await wire.subscribe("incident.created", receiver.url(), secret)
        events.emit(incident(1))
        assert await signals.done("inc-1") == ["acknowledged"]
        status = (await wire.subscribe("incident.created", receiver.url(), secret))["deliveryStatus"]

    attempts = receiver.of("event")
    assert len(attempts) == 3
    stamps = [int(a.headers["webhook-timestamp"]) for a in attempts]
    assert stamps[0] < stamps[1] < stamps[2]
    assert len({a.headers["webhook-signature"] for a in attempts}) == 3
    assert all(a.verify(secret)["eventId"] == "inc-1" for a in attempts)
    delays = [float(d) for d in re.findall(r"retry \d+ in ([\d.]+)s", caplog.text)]
    # retry_initial 10ms, retry_max 50ms: 10ms then 20ms, each plus up to 10ms of jitter
    assert len(delays) == 2 and 0.01 <= delays[0] <= 0.02 <= delays[1] <= 0.03
    assert (
        status["lastError"] is None and status["lastDeliveryAt"] is not None and "failedSince" not in status
    )


@pytest.mark.parametrize(("refusal", "last_error"), [(410, None), (413, "http_4xx")])
async def test_410_and_413_are_never_retried(
    ca: trustme.CA, signals: Signals, refusal: int, last_error: str | None
) -> None:
    caller = Caller()
    events = incidents(ca, caller, max_in_flight=1)
    secret = new_secret()
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        receiver.respond = failing({"inc-1": [refusal, 500, 500]})
        await wire.subscribe("incident.created", receiver.url(), secret)
        events.emit(incident(1))
        assert await signals.done("inc-1") == ["abandoned"]
        status = (await wire.subscribe("incident.created", receiver.url(), secret))["deliveryStatus"]
        events.emit(incident(2))
        assert await signals.done("inc-2") == ["acknowledged"]

    assert [r.document["eventId"] for r in receiver.of("event")] == ["inc-1", "inc-2"]
    assert status["lastError"] == last_error  # a 410 says nothing about the endpoint's health
    assert status["active"] is True
    one, two = receiver.events()
    assert two["cursor"] != one["cursor"]  # the abandoned event no longer holds the watermark back


async def test_the_watermark_never_passes_an_unacknowledged_delivery(
    ca: trustme.CA, signals: Signals
) -> None:
    caller = Caller()
    events = incidents(ca, caller, max_attempts=1000)
    release = anyio.Event()

    def hold_first(received: Received) -> Reply:
        if received.kind == "event" and received.document["eventId"] == "inc-1" and not release.is_set():
            return 503, {}
        return echo(received)

    secret = new_secret()
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        receiver.respond = hold_first
        start = (await wire.subscribe("incident.created", receiver.url(), secret))["cursor"]
        for number in (1, 2, 3):
            events.emit(incident(number))
        # 2 and 3 are acknowledged while 1 is still being retried: several deliveries in flight.
        assert await signals.done("inc-2", "inc-3") == ["acknowledged", "acknowledged"]
        assert "inc-1" not in signals.finished
        held = (await wire.subscribe("incident.created", receiver.url(), secret))["cursor"]
        release.set()
        assert await signals.done("inc-1") == ["acknowledged"]
        after = (await wire.subscribe("incident.created", receiver.url(), secret))["cursor"]

    epoch = start.rsplit("-", 1)[0]
    bodies = receiver.events()
    two_three = {b["eventId"]: b["cursor"] for b in bodies if b["eventId"] != "inc-1"}
    retries_of_one = [b["cursor"] for b in bodies if b["eventId"] == "inc-1"]
    assert start == f"{epoch}-0"
    assert two_three == {"inc-2": start, "inc-3": start}  # never past the unacknowledged inc-1
    assert held == start
    # inc-1's own body may count inc-1 itself as delivered (the receiver stores both together),
    # and whatever after it is done; with 2 and 3 acknowledged, its last body carries the head.
    assert set(retries_of_one) <= {f"{epoch}-1", f"{epoch}-2", f"{epoch}-3"}
    assert retries_of_one[-1] == f"{epoch}-3"
    assert after == f"{epoch}-3"


async def test_delivery_status_reports_categories_only(ca: trustme.CA, signals: Signals) -> None:
    caller, now = Caller(), FakeNow()
    dns = DNS()
    # One lookup per connection: the verification, inc-1, the gap envelope reporting it, inc-2, then
    # inc-3 meets a private address.
    dns.set("hooks.test", "127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1", "10.0.0.1", "127.0.0.1")
    events = incidents(ca, caller, now=now, dns=dns, max_attempts=1)
    secret = new_secret()
    url = None
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        url = receiver.url(host="hooks.test")
        fail_events = failing({"inc-1": [503]})

        def respond(received: Received) -> Reply:
            # The gap envelope reporting inc-1 fails too: the endpoint is down for both.
            return (503, {}) if received.kind == "gap" else fail_events(received)

        receiver.respond = respond
        await wire.subscribe("incident.created", url, secret)
        failed_at = now()
        events.emit(incident(1))
        assert await signals.done("inc-1") == ["abandoned"]
        await signals.until(lambda: gap_outcomes(signals) == ["abandoned"])
        now.advance(seconds=1)
        refreshed = await wire.subscribe("incident.created", url, secret)
        assert refreshed["truncated"] is True  # the refresh reports what the gap envelope could not
        failing_status = refreshed["deliveryStatus"]
        receiver.respond = fail_events
        events.emit(incident(2))
        assert await signals.done("inc-2") == ["acknowledged"]
        healthy = (await wire.subscribe("incident.created", url, secret))["deliveryStatus"]
        events.emit(incident(3))  # hooks.test now resolves to a private address
        assert await signals.done("inc-3") == ["abandoned"]
        refused = (await wire.subscribe("incident.created", url, secret))["deliveryStatus"]

    from agentwake.server import isoformat

    assert failing_status == {
        "active": True,
        "lastDeliveryAt": None,
        "lastError": "http_5xx",
        "failedSince": isoformat(failed_at),
    }
    assert healthy == {"active": True, "lastDeliveryAt": isoformat(now()), "lastError": None}
    assert refused["lastError"] == "connection_refused" and "10.0.0.1" not in str(refused)
    assert [r.document["eventId"] for r in receiver.of("event")] == ["inc-1", "inc-2"]


async def test_sustained_failure_suspends_delivery_until_a_refresh_resumes_it(
    ca: trustme.CA, signals: Signals
) -> None:
    caller = Caller()
    events = incidents(ca, caller, max_attempts=1000, suspend_min_attempts=4, suspend_failure_rate=0.5)
    refused: list[str] = []
    healthy = False

    def respond(received: Received) -> Reply:
        if received.kind == "event" and not healthy:
            refused.append(received.document["eventId"])
            return 503, {}
        return echo(received)

    secret = new_secret()
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        receiver.respond = respond
        sid = (await wire.subscribe("incident.created", receiver.url(), secret))["id"]
        events.emit(incident(1))
        await signals.until(lambda: sid in signals.suspended)
        attempts_at_suspension = len(refused)
        events.emit(incident(2))  # suspended: read later, not now
        healthy = True
        suspended = (await wire.subscribe("incident.created", receiver.url(), secret))["deliveryStatus"]
        # That refresh reactivated delivery: the pending inc-1 and the new inc-2 go out.
        assert await signals.done("inc-1", "inc-2") == ["acknowledged", "acknowledged"]
        resumed = (await wire.subscribe("incident.created", receiver.url(), secret))["deliveryStatus"]

    assert attempts_at_suspension == 4 and refused == ["inc-1"] * 4  # nothing went out while suspended
    assert suspended["active"] is False and suspended["lastError"] == "http_5xx"
    assert "failedSince" in suspended
    assert resumed["active"] is True and resumed["lastError"] is None


async def test_a_read_that_skipped_events_sends_a_gap_envelope(ca: trustme.CA, signals: Signals) -> None:
    caller = Caller()
    events = incidents(ca, caller, buffer=EmitBuffer(max_events=2))
    secret = new_secret()
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        start = (await wire.subscribe("incident.created", receiver.url(), secret))["cursor"]
        for number in range(1, 6):  # in one go: the buffer keeps only 4 and 5 by the time it is read
            events.emit(incident(number))
        gap = await receiver.next("gap")
        await signals.done("inc-4", "inc-5")

    epoch = start.rsplit("-", 1)[0]
    assert gap.verify(secret) == {"type": "gap", "cursor": f"{epoch}-3"}
    assert gap.msg_id.startswith("msg_gap_")
    assert sorted(b["eventId"] for b in receiver.events()) == ["inc-4", "inc-5"]
    # An event delivered before the gap was acknowledged carries the position before the gap.
    assert {b["cursor"] for b in receiver.events()} <= {start, f"{epoch}-4", f"{epoch}-5"}


async def test_terminate_webhooks_sends_a_signed_terminated_envelope_and_ends_the_subscription(
    ca: trustme.CA,
) -> None:
    caller = Caller()
    events = incidents(ca, caller)
    gone = anyio.Event()
    ended: list[str] = []

    @events.on_unsubscribe("incident.created")
    def on_unsubscribe(ctx: EventContext, arguments: dict[str, Any], sid: str) -> None:
        ended.append(sid)
        gone.set()

    revoked, kept = new_secret(), new_secret()
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        p1 = await wire.subscribe("incident.created", receiver.url("/p1"), revoked, {"severity": "P1"})
        await wire.subscribe("incident.created", receiver.url("/p2"), kept, {"severity": "P2"})
        count = events.terminate_webhooks(
            "incident.created",
            error=forbidden("access revoked"),
            where=lambda arguments, principal: arguments.get("severity") == "P1" and principal == "alice",
        )
        terminated = await receiver.next("terminated")
        with anyio.fail_after(10):
            await gone.wait()
        events.emit(incident(1, "P1"))
        events.emit(incident(2, "P2"))
        delivered = await receiver.next("event")
        left = events.webhook_subscriptions()
        # A later subscribe with the same key is a fresh subscription.
        again = await wire.subscribe("incident.created", receiver.url("/p1"), revoked, {"severity": "P1"})

    assert count == 1 and left == 1
    assert terminated.path == "/p1" and terminated.subscription == p1["id"]
    assert terminated.msg_id.startswith("msg_terminated_")
    assert terminated.verify(revoked) == {
        "type": "terminated",
        "error": {"code": -32012, "message": "Forbidden", "data": {"reason": "access revoked"}},
    }
    assert ended == [p1["id"]]
    assert (delivered.path, delivered.document["eventId"]) == ("/p2", "inc-2")
    assert "deliveryStatus" not in again


async def test_removing_an_event_type_terminates_its_webhooks_with_not_found(ca: trustme.CA) -> None:
    caller = Caller()
    events = incidents(ca, caller)
    secret = new_secret()
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        await wire.subscribe("incident.created", receiver.url(), secret)
        events.remove_event_type("incident.created")
        terminated = await receiver.next("terminated")
        left = events.webhook_subscriptions()
    assert terminated.verify(secret)["error"] == {
        "code": -32011,
        "message": "NotFound",
        "data": {"kind": "event", "name": "incident.created"},
    }
    assert left == 0


async def test_a_body_over_the_size_limit_is_never_sent(ca: trustme.CA, signals: Signals) -> None:
    caller = Caller()
    events = incidents(ca, caller, max_in_flight=1, max_body_bytes=1024)
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        await wire.subscribe("incident.created", receiver.url(), new_secret())
        events.emit(incident(1, notes="x" * 2048))
        assert await signals.done("inc-1") == ["abandoned"]
        # Never sent, so never received: the endpoint is told it missed it (a gap envelope).
        await signals.until(lambda: "acknowledged" in gap_outcomes(signals))
        events.emit(incident(2))
        assert await signals.done("inc-2") == ["acknowledged"]
    (only,) = receiver.events()
    assert only["eventId"] == "inc-2" and only["cursor"].endswith("-2")
    (gap,) = receiver.of("gap")
    assert gap.document == {"type": "gap", "cursor": only["cursor"][:-1] + "1"}


def gap_outcomes(signals: Signals) -> list[str]:
    """How the gap envelopes the sender finished ended (acknowledged | abandoned)."""
    return [outcome for msg_id, outcome in signals.finished.items() if msg_id.startswith("msg_gap_")]


async def test_an_event_id_that_cannot_be_a_header_is_abandoned_and_delivery_goes_on(
    ca: trustme.CA, signals: Signals
) -> None:
    caller = Caller()
    events = incidents(ca, caller)
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        await wire.subscribe("incident.created", receiver.url(), new_secret())
        events.emit(incident(1).replace(event_id="bad\r\nX-Injected: 1"))
        events.emit(incident(2))
        delivered = await receiver.next("event")
        await signals.done("inc-2")
    assert delivered.document["eventId"] == "inc-2"
    assert [r.document["eventId"] for r in receiver.of("event")] == ["inc-2"]
    assert all("x-injected" not in r.headers for r in receiver.received)


async def test_a_503_with_retry_after_waits_as_asked_and_spends_no_attempt(
    ca: trustme.CA, signals: Signals, caplog: pytest.LogCaptureFixture
) -> None:
    """agentwake's receiver answers 503 with Retry-After while a subscription is held back (its agent
    is catching up): the sender waits as asked (up to retry_max) and does not count it as a failure."""
    caller = Caller()
    events = incidents(ca, caller, max_attempts=2)
    busy = 4

    def respond(received: Received) -> Reply:
        nonlocal busy
        if received.kind != "event":
            return echo(received)
        if busy:
            busy -= 1
            return 503, None, {"Retry-After": "1"}
        return 200, {}

    caplog.set_level("DEBUG", logger="agentwake.server._webhook_delivery")
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        receiver.respond = respond
        await wire.subscribe("incident.created", receiver.url(), new_secret())
        events.emit(incident(1))
        assert await signals.done("inc-1") == ["acknowledged"]
    assert len(receiver.of("event")) == 5, (
        "four asked-for waits, then taken: none abandoned at max_attempts=2"
    )
    delays = [float(d) for d in re.findall(r"retry \d+ in ([\d.]+)s", caplog.text)]
    # Retry-After: 1 is capped at retry_max (50 ms here), above the 10-20 ms backoff it replaces.
    assert len(delays) == 4 and all(d == pytest.approx(0.05) for d in delays), delays


async def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    from agentwake.server._webhook_http import retry_after_s

    assert retry_after_s("5", 1000.0) == 5.0
    assert retry_after_s("Thu, 01 Jan 1970 00:16:50 GMT", 1000.0) == 10.0
    assert retry_after_s("Thu, 01 Jan 1970 00:00:10 GMT", 1000.0) == 0.0
    for unusable in (None, "", "-3", "soon", "1.5", "Thu, 01 Jan 1970 00:16:50"):
        assert retry_after_s(unusable, 1000.0) is None, unusable


async def test_a_gap_envelope_a_refresh_reported_meanwhile_is_not_sent_again(
    ca: trustme.CA, signals: Signals
) -> None:
    """The endpoint is down for the gap envelope and comes back only after a refresh that reported the
    skip itself (truncated: true): the envelope is not sent again, so one skip is one gap, not two."""
    caller = Caller()
    # inc-1 is over the body cap: abandoned unsent. The gap envelope reporting it is retried (10-50 ms).
    events = incidents(ca, caller, max_body_bytes=1024, max_attempts=10_000)
    secret = new_secret()
    gaps_down = True

    def respond(received: Received) -> Reply:
        if received.kind == "gap" and gaps_down:
            return 503, {}
        return echo(received)

    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        receiver.respond = respond
        await wire.subscribe("incident.created", receiver.url(), secret)
        events.emit(incident(1, notes="x" * 2048))
        assert await signals.done("inc-1") == ["abandoned"]
        await signals.until(lambda: len(receiver.of("gap")) >= 2)  # being retried
        refreshed = await wire.subscribe("incident.created", receiver.url(), secret)
        assert refreshed["truncated"] is True, "the refresh reports the skip"
        await signals.until(lambda: bool(gap_outcomes(signals)))
        gaps_down = False
        events.emit(incident(2))
        assert await signals.done("inc-2") == ["acknowledged"]
    assert gap_outcomes(signals) == ["superseded"]
    assert [r.document["eventId"] for r in receiver.of("event")] == ["inc-2"]
