"""events/subscribe and events/unsubscribe on ``EventsExtension(webhook=...)``: validation, identity,
TTL grants, refresh, expiry and unsubscribe.

The MCP side is an in-process ``MCPServer`` reached through the SDK's ``mcp.Client``;
the principal comes from ``principal_of`` (a ``Caller`` the test sets). The callback
is a real HTTPS endpoint on loopback (``Receiver``) and every signature is checked
with the ``standardwebhooks`` reference library. Time for TTLs is a ``FakeNow``;
nothing sleeps: tests wait on deliveries and on the sender's own log signals.
"""

from __future__ import annotations

import base64
from datetime import timedelta
from typing import Any

import pytest
import trustme
from _webhook_server_support import (
    Caller,
    FakeNow,
    Receiver,
    Signals,
    Tickets,
    declare_incidents,
    declare_tickets,
    incident,
    new_secret,
    serving,
    webhook_settings,
)
from mcp.shared.exceptions import MCPError
from standardwebhooks import Webhook

from agentwake.server import (
    EventContext,
    EventsExtension,
    SqliteWebhookStore,
    WebhookSettings,
    isoformat,
    subscription_id,
)

pytestmark = pytest.mark.anyio

SUBSCRIBE = "events/subscribe"
# Tests that move a FakeNow past an expiry sweep by hand; the background sweep would race them.
MANUAL_SWEEPS = timedelta(hours=1)


def incidents(ca: trustme.CA, caller: Caller | None = None, **settings: Any) -> EventsExtension:
    events = EventsExtension(webhook=webhook_settings(ca, **settings), principal_of=caller or Caller())
    declare_incidents(events)
    return events


def params(url: str, secret: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "incident.created",
        "delivery": {"mode": "webhook", "url": url, "secret": secret},
        **extra,
    }


# ---- offered only when configured --------------------------------------------------------------


async def test_types_list_webhook_only_when_the_extension_has_webhook_settings(ca: trustme.CA) -> None:
    caller = Caller()
    events = incidents(ca, caller)
    events.event(name="quiet.thing", emit_only=True, delivery=["poll"])(type("Quiet", (), {}))
    async with serving(events, caller) as wire:
        listed = {d["name"]: d["delivery"] for d in (await wire.call("events/list", {}))["events"]}
    assert listed == {"incident.created": ["poll", "push", "webhook"], "quiet.thing": ["poll"]}

    plain = EventsExtension()
    declare_incidents(plain)
    async with serving(plain, Caller()) as wire:
        (descriptor,) = (await wire.call("events/list", {}))["events"]
        error = await wire.error(SUBSCRIBE, params("https://127.0.0.1/hook", new_secret()))
    assert descriptor["delivery"] == ["poll", "push"]
    assert error.code == -32601  # not served at all without WebhookSettings


def test_a_webhook_only_type_needs_webhook_settings(ca: trustme.CA) -> None:
    with pytest.raises(ValueError, match="webhook needs EventsExtension"):
        declare_incidents(EventsExtension(), delivery=["webhook"])
    declare_incidents(incidents_without_types(ca), delivery=["webhook"])


def incidents_without_types(ca: trustme.CA) -> EventsExtension:
    return EventsExtension(webhook=webhook_settings(ca), principal_of=Caller())


def test_settings_are_checked_when_built() -> None:
    with pytest.raises(ValueError, match="min_ttl must not exceed max_ttl"):
        WebhookSettings(max_ttl=timedelta(seconds=1), min_ttl=timedelta(seconds=2))
    with pytest.raises(ValueError, match="max_in_flight"):
        WebhookSettings(max_ttl=timedelta(minutes=1), max_in_flight=0)
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 network"):
        WebhookSettings(max_ttl=timedelta(minutes=1), allow_networks=["loopback"])


# ---- refusals -------------------------------------------------------------------------------------


async def test_without_a_principal_subscribe_and_unsubscribe_are_forbidden(ca: trustme.CA) -> None:
    caller = Caller(principal=None)
    async with Receiver(ca) as receiver, serving(incidents(ca, caller), caller) as wire:
        subscribe = await wire.subscribe_error("incident.created", receiver.url(), new_secret())
        unsubscribe = await wire.error(
            "events/unsubscribe", {"name": "incident.created", "delivery": {"url": receiver.url()}}
        )
    assert (subscribe.code, subscribe.message) == (-32012, "Forbidden")
    assert unsubscribe.code == -32012
    assert receiver.received == []  # nothing was verified or delivered


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8443/hook",
        "ftp://127.0.0.1/hook",
        "127.0.0.1/hook",
        "https://",
        "https:///path-only",
        "https://user:pw@127.0.0.1/hook",
        "https://127.0.0.1:99999/hook",
        "https://127.0.0.1:0/hook",
        "https://2130706433/hook",  # 127.0.0.1 to some parsers, a name to others
        "https://127.1/hook",
        "https://0x7f.1/hook",
        "",
        42,
        None,
    ],
)
async def test_a_callback_that_is_not_an_https_url_is_invalid_params(ca: trustme.CA, url: Any) -> None:
    caller = Caller()
    async with serving(incidents(ca, caller), caller) as wire:
        error = await wire.error(SUBSCRIBE, params(url, new_secret()))
    assert error.code == -32602
    assert "delivery.url" in error.message


def _whsec(size: int) -> str:
    return "whsec_" + base64.b64encode(bytes(range(size))).decode()


@pytest.mark.parametrize(
    "secret",
    [
        "not-a-secret-at-all-but-long-enough-to-matter",
        "whsec_!!!!not*base64!!!!",
        _whsec(23),
        _whsec(65),
        base64.b64encode(bytes(32)).decode(),  # the key without its prefix
        12345,
        None,
    ],
)
async def test_a_secret_that_is_not_whsec_and_24_to_64_bytes_is_invalid_params_and_never_echoed(
    ca: trustme.CA, secret: Any
) -> None:
    caller = Caller()
    async with Receiver(ca) as receiver, serving(incidents(ca, caller), caller) as wire:
        error = await wire.error(SUBSCRIBE, params(receiver.url(), secret))
    assert error.code == -32602
    assert "delivery.secret" in error.message
    text = f"{error.message} {error.data!r}"
    if isinstance(secret, str):
        assert secret not in text and secret.removeprefix("whsec_") not in text
    assert receiver.received == []


async def test_secrets_of_24_and_64_bytes_are_accepted(ca: trustme.CA) -> None:
    caller = Caller()
    async with Receiver(ca) as receiver, serving(incidents(ca, caller), caller) as wire:
        for number, size in enumerate((24, 64)):
            await wire.subscribe("incident.created", receiver.url(f"/{number}"), _whsec(size))
    assert len(receiver.of("verification")) == 2


async def test_a_delivery_mode_other_than_webhook_is_unsupported(ca: trustme.CA) -> None:
    caller = Caller()
    async with serving(incidents(ca, caller), caller) as wire:
        error = await wire.error(
            SUBSCRIBE, {"name": "incident.created", "delivery": {"mode": "push", "url": "https://x.test/"}}
        )
        missing = await wire.error(SUBSCRIBE, {"name": "incident.created"})
    assert (error.code, error.data) == (-32014, {"feature": "deliveryMode", "value": "push"})
    assert missing.code == -32602


async def test_unknown_types_types_without_webhook_and_bad_arguments_are_refused(ca: trustme.CA) -> None:
    caller = Caller()
    events = incidents(ca, caller)
    events.event(name="poll.only", emit_only=True, delivery=["poll", "push"])(type("PollOnly", (), {}))
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        unknown = await wire.subscribe_error("nope", receiver.url(), new_secret())
        not_offered = await wire.subscribe_error("poll.only", receiver.url(), new_secret())
        bad_arguments = await wire.subscribe_error(
            "incident.created", receiver.url(), new_secret(), {"severity": "P9"}
        )
    assert (unknown.code, unknown.data) == (-32011, {"kind": "event", "name": "nope"})
    assert (not_offered.code, not_offered.data) == (-32014, {"feature": "deliveryMode", "value": "webhook"})
    assert bad_arguments.code == -32602 and "severity" in bad_arguments.message
    assert receiver.received == []


async def test_the_subscription_limit_is_checked_before_on_subscribe(ca: trustme.CA) -> None:
    caller = Caller()
    events = incidents(ca, caller, max_subscriptions=1)
    subscribed: list[str] = []

    @events.on_subscribe("incident.created")
    async def on_subscribe(ctx: EventContext, arguments: dict[str, Any], sid: str) -> None:
        subscribed.append(sid)

    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        secret = new_secret()
        first = await wire.subscribe("incident.created", receiver.url(), secret)
        error = await wire.subscribe_error(
            "incident.created", receiver.url(), new_secret(), {"severity": "P2"}
        )
        refreshed = await wire.subscribe(
            "incident.created", receiver.url(), secret
        )  # a refresh is not a new one
    assert (error.code, error.data) == (-32013, {"limit": "subscriptions", "max": 1})
    assert subscribed == [first["id"]]
    assert refreshed["id"] == first["id"]
    assert len(receiver.of("verification")) == 1


# ---- identity -------------------------------------------------------------------------------------


def test_the_derived_id_is_deterministic_and_distinct_per_key_component() -> None:
    base = subscription_id(
        "alice", "https://a.test/hook", "incident.created", {"severity": "P1", "x": [1, 2]}
    )
    assert base == subscription_id(
        "alice", "https://a.test/hook", "incident.created", {"x": [1, 2], "severity": "P1"}
    )
    assert base.startswith("sub_") and len(base) == 4 + 16
    others = {
        subscription_id("bob", "https://a.test/hook", "incident.created", {"severity": "P1", "x": [1, 2]}),
        subscription_id("alice", "https://b.test/hook", "incident.created", {"severity": "P1", "x": [1, 2]}),
        subscription_id("alice", "https://a.test/hook", "ticket.created", {"severity": "P1", "x": [1, 2]}),
        subscription_id("alice", "https://a.test/hook", "incident.created", {"severity": "P2", "x": [1, 2]}),
    }
    assert len(others) == 4 and base not in others
    # Canonical-JSON equality: 1 and 1.0 are one number.
    assert subscription_id("alice", "https://a.test/hook", "incident.created", {"n": 1, "x": [2.0]}) == (
        subscription_id("alice", "https://a.test/hook", "incident.created", {"n": 1.0, "x": [2]})
    )


async def test_the_id_is_the_same_after_a_restart_and_differs_per_principal_url_and_arguments(
    ca: trustme.CA,
) -> None:
    caller = Caller()
    async with Receiver(ca) as receiver:
        ids = []
        for _ in range(2):  # two server lifetimes
            async with serving(incidents(ca, caller), caller) as wire:
                ids.append((await wire.subscribe("incident.created", receiver.url(), new_secret()))["id"])
                other_principal = await wire.subscribe(
                    "incident.created", receiver.url(), new_secret(), as_="bob"
                )
                other_url = await wire.subscribe("incident.created", receiver.url("/other"), new_secret())
                other_arguments = await wire.subscribe(
                    "incident.created", receiver.url(), new_secret(), {"severity": "P1"}
                )
    assert ids[0] == ids[1] == subscription_id("alice", receiver.url(), "incident.created", {})
    assert len({ids[0], other_principal["id"], other_url["id"], other_arguments["id"]}) == 4


# ---- TTL grants ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ttl", "granted"),
    [
        ({"ttlMs": 120_000}, timedelta(minutes=2)),  # honoured
        ({"ttlMs": 3_600_000}, timedelta(minutes=10)),  # clamped down to max_ttl
        ({"ttlMs": 10}, timedelta(seconds=1)),  # clamped up to the floor
        ({"ttlMs": 0}, timedelta(seconds=1)),
        ({}, timedelta(minutes=10)),  # omitted: the server default (the cap)
        ({"ttlMs": None}, timedelta(minutes=10)),  # no expiry asked, but no durable store: finite
    ],
)
async def test_the_granted_ttl(ca: trustme.CA, ttl: dict[str, Any], granted: timedelta) -> None:
    caller, now = Caller(), FakeNow()
    events = EventsExtension(webhook=webhook_settings(ca), principal_of=caller, now=now)
    declare_incidents(events)
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        result = await wire.subscribe("incident.created", receiver.url(), new_secret(), **ttl)
    assert result["refreshBefore"] == isoformat(now() + granted)


async def test_a_null_ttl_is_no_expiry_only_with_a_durable_store(ca: trustme.CA, tmp_path: Any) -> None:
    caller = Caller()
    store = SqliteWebhookStore(tmp_path / "hooks.db")
    events = EventsExtension(webhook=webhook_settings(ca, store=store), principal_of=caller)
    declare_incidents(events)
    try:
        async with Receiver(ca) as receiver, serving(events, caller) as wire:
            forever = await wire.subscribe("incident.created", receiver.url(), new_secret(), ttlMs=None)
            omitted = await wire.subscribe("incident.created", receiver.url("/b"), new_secret())
            finite = await wire.subscribe("incident.created", receiver.url("/c"), new_secret(), ttlMs=5000)
    finally:
        store.close()
    assert forever["refreshBefore"] is None
    assert omitted["refreshBefore"] is not None and finite["refreshBefore"] is not None


# ---- refresh ----------------------------------------------------------------------------------------


async def test_a_refresh_keeps_the_id_regrants_the_ttl_and_reports_delivery_status(
    ca: trustme.CA, signals: Signals
) -> None:
    caller, now = Caller(), FakeNow()
    events = EventsExtension(webhook=webhook_settings(ca), principal_of=caller, now=now)
    declare_incidents(events)
    created: list[str] = []

    @events.on_subscribe("incident.created")
    def on_subscribe(ctx: EventContext, arguments: dict[str, Any], sid: str) -> None:
        created.append(sid)

    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        secret = new_secret()
        first = await wire.subscribe("incident.created", receiver.url(), secret, ttlMs=60_000)
        events.emit(incident(1))
        await signals.done("inc-1")
        now.advance(seconds=30)
        again = await wire.subscribe(
            "incident.created", receiver.url(), secret, ttlMs=120_000, cursor="stale"
        )
    assert "deliveryStatus" not in first
    assert again["id"] == first["id"]
    assert again["refreshBefore"] == isoformat(now() + timedelta(minutes=2))
    assert again["deliveryStatus"] == {
        "active": True,
        "lastDeliveryAt": isoformat(now() - timedelta(seconds=30)),
        "lastError": None,
    }
    assert again["cursor"] == receiver.events()[0]["cursor"]  # the watermark, not the client's stale cursor
    assert again["truncated"] is False
    assert created == [first["id"]]  # on_subscribe fires on creation only
    assert len(receiver.of("verification")) == 1


async def test_a_new_secret_on_refresh_is_used_and_the_old_one_signs_too_for_the_grace_window(
    ca: trustme.CA,
) -> None:
    caller, now = Caller(), FakeNow()
    settings = webhook_settings(ca, rotation_grace=timedelta(minutes=5))
    events = EventsExtension(webhook=settings, principal_of=caller, now=now)
    declare_incidents(events)
    old, new = new_secret(), new_secret()
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        await wire.subscribe("incident.created", receiver.url(), old)
        events.emit(incident(1))
        before = await receiver.next("event")
        await wire.subscribe("incident.created", receiver.url(), new)
        events.emit(incident(2))
        during = await receiver.next("event")
        now.advance(minutes=5)
        events.emit(incident(3))
        after = await receiver.next("event")

    assert len(before.headers["webhook-signature"].split(" ")) == 1
    before.verify(old)
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    assert during.verify(old)["eventId"] == during.verify(new)["eventId"] == "inc-2"
    assert len(after.headers["webhook-signature"].split(" ")) == 1
    after.verify(new)
    with pytest.raises(Exception, match="No matching signature"):
        Webhook(old).verify(after.body, after.headers)


# ---- expiry and unsubscribe --------------------------------------------------------------------------


async def test_an_unrefreshed_subscription_expires_fires_on_unsubscribe_and_stops_delivering(
    ca: trustme.CA,
) -> None:
    caller, now = Caller(), FakeNow()
    events = EventsExtension(
        webhook=webhook_settings(ca, sweep_interval=MANUAL_SWEEPS), principal_of=caller, now=now
    )
    declare_incidents(events)
    hooks: list[tuple[str, str]] = []

    @events.on_subscribe("incident.created")
    def on_subscribe(ctx: EventContext, arguments: dict[str, Any], sid: str) -> None:
        hooks.append(("subscribe", sid))

    @events.on_unsubscribe("incident.created")
    def on_unsubscribe(ctx: EventContext, arguments: dict[str, Any], sid: str) -> None:
        hooks.append(("unsubscribe", sid))

    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        secret = new_secret()
        sid = (await wire.subscribe("incident.created", receiver.url(), secret, ttlMs=5_000))["id"]
        now.advance(seconds=4.999)
        assert await events.sweep_webhooks() == 0
        now.advance(seconds=0.001)
        assert await events.sweep_webhooks() == 1
        assert events.webhook_subscriptions() == 0
        events.emit(incident(1))  # nobody to deliver to
        # Re-subscribing after expiry is a fresh subscription (on_subscribe again; verification is cached).
        again = await wire.subscribe("incident.created", receiver.url(), secret)
        events.emit(incident(2))
        delivered = await receiver.next("event")

    assert hooks == [("subscribe", sid), ("unsubscribe", sid), ("subscribe", sid)]
    assert again["id"] == sid and "deliveryStatus" not in again
    assert delivered.document["eventId"] == "inc-2"
    assert [r.document["eventId"] for r in receiver.of("event")] == ["inc-2"]


async def test_unsubscribe_stops_deliveries_and_only_the_owner_can_do_it(
    ca: trustme.CA, signals: Signals
) -> None:
    caller = Caller()
    events = incidents(ca, caller)
    ended: list[str] = []

    @events.on_unsubscribe("incident.created")
    def on_unsubscribe(ctx: EventContext, arguments: dict[str, Any], sid: str) -> None:
        ended.append(sid)

    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        sid = (await wire.subscribe("incident.created", receiver.url(), new_secret(), {"severity": "P1"}))[
            "id"
        ]
        # bob cannot address alice's subscription: the key includes the principal.
        with pytest.raises(MCPError) as by_bob:
            await wire.unsubscribe("incident.created", receiver.url(), {"severity": "P1"}, as_="bob")
        with pytest.raises(MCPError) as wrong_arguments:
            await wire.unsubscribe("incident.created", receiver.url(), {"severity": "P2"})
        assert events.webhook_subscriptions() == 1
        assert await wire.unsubscribe("incident.created", receiver.url(), {"severity": "P1"}) is not None
        assert events.webhook_subscriptions() == 0
        with pytest.raises(MCPError) as twice:
            await wire.unsubscribe("incident.created", receiver.url(), {"severity": "P1"})
        events.emit(incident(1))
        # Proof that nothing goes out: a second subscription's delivery arrives, the first's never did.
        await wire.subscribe("incident.created", receiver.url("/other"), new_secret())
        events.emit(incident(2))
        await receiver.next("event")

    for refused in (by_bob.value, wrong_arguments.value, twice.value):
        assert (refused.code, refused.data) == (-32011, {"kind": "subscription"})
    assert ended == [sid]
    assert [(r.path, r.document["eventId"]) for r in receiver.of("event")] == [("/other", "inc-2")]


async def test_the_id_is_not_accepted_as_input(ca: trustme.CA) -> None:
    caller = Caller()
    events = incidents(ca, caller)
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        sid = (await wire.subscribe("incident.created", receiver.url(), new_secret()))["id"]
        error = await wire.error("events/unsubscribe", {"name": "incident.created", "id": sid})
        still = events.webhook_subscriptions()
    assert error.code == -32602 and "delivery.url" in error.message
    assert still == 1


async def test_a_check_function_type_delivers_what_changed_after_the_cursor(ca: trustme.CA) -> None:
    caller, tickets = Caller(), Tickets()
    tickets.add("one", "two", "three")
    events = EventsExtension(webhook=webhook_settings(ca), principal_of=caller)
    declare_tickets(events, tickets, next_poll_ms=60_000)
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        result = await wire.subscribe("ticket.created", receiver.url(), new_secret(), cursor="1")
        replayed = [await receiver.next("event") for _ in range(2)]
        tickets.add("four")
        events.wake("ticket.created")  # the poll interval is a minute: only the wake reads now
        live = await receiver.next("event")
    assert result["cursor"] == "1" and result["truncated"] is False
    assert sorted(r.document["eventId"] for r in replayed) == ["t2", "t3"]
    assert live.document["eventId"] == "t4"


async def test_a_late_refresh_before_the_sweep_renews_the_subscription_in_place(ca: trustme.CA) -> None:
    caller, now = Caller(), FakeNow()
    events = EventsExtension(
        webhook=webhook_settings(ca, sweep_interval=MANUAL_SWEEPS), principal_of=caller, now=now
    )
    declare_incidents(events)
    hooks: list[str] = []

    @events.on_subscribe("incident.created")
    def on_subscribe(ctx: EventContext, arguments: dict[str, Any], sid: str) -> None:
        hooks.append("subscribe")

    @events.on_unsubscribe("incident.created")
    def on_unsubscribe(ctx: EventContext, arguments: dict[str, Any], sid: str) -> None:
        hooks.append("unsubscribe")

    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        secret = new_secret()
        await wire.subscribe("incident.created", receiver.url(), secret, ttlMs=5_000)
        now.advance(seconds=6)  # late, but the sweeper has not reclaimed it yet
        late = await wire.subscribe("incident.created", receiver.url(), secret, ttlMs=5_000)
        swept = await events.sweep_webhooks()
    assert "deliveryStatus" in late and late["refreshBefore"] == isoformat(now() + timedelta(seconds=5))
    assert swept == 0 and hooks == ["subscribe"]
