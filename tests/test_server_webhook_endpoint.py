"""The callback endpoint as the sender sees it: the verification handshake and the SSRF guard.

A real HTTPS receiver on loopback (certificates from a throwaway ``trustme`` CA),
reached either at ``127.0.0.1`` or at ``hooks.test``, a name the injectable
``resolve`` hook maps to loopback, so Host and SNI can be checked. Loopback is
exempt from the guard only where a test says so (``allow_networks``).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
import trustme
from _webhook_server_support import (
    DNS,
    Caller,
    Received,
    Receiver,
    Reply,
    Signals,
    declare_incidents,
    incident,
    new_secret,
    serving,
    webhook_settings,
)

from agentwake.server import EventsExtension
from agentwake.server._ssrf import AddressPolicy, is_public

pytestmark = pytest.mark.anyio


def incidents(ca: trustme.CA, caller: Caller, dns: DNS | None = None, **settings: Any) -> EventsExtension:
    events = EventsExtension(webhook=webhook_settings(ca, dns, **settings), principal_of=caller)
    declare_incidents(events)
    return events


# ---- verification ----------------------------------------------------------------------------------


async def test_the_challenge_is_signed_with_the_request_secret_and_cached_per_principal_and_url(
    ca: trustme.CA,
) -> None:
    caller = Caller()
    async with Receiver(ca) as receiver, serving(incidents(ca, caller), caller) as wire:
        secret = new_secret()
        first = await wire.subscribe("incident.created", receiver.url(), secret)
        (challenge,) = receiver.of("verification")
        # Other arguments, same (principal, url): no second challenge at the endpoint.
        await wire.subscribe("incident.created", receiver.url(), new_secret(), {"severity": "P1"})
        assert len(receiver.of("verification")) == 1
        # Another principal's verification never waives the challenge for bob.
        await wire.subscribe("incident.created", receiver.url(), new_secret(), as_="bob")
        # Another URL of alice's is another endpoint.
        await wire.subscribe("incident.created", receiver.url("/second"), new_secret())

    document = challenge.verify(secret)  # standardwebhooks accepts it under this request's secret
    assert document["type"] == "verification" and len(document["challenge"]) >= 32
    assert challenge.msg_id.startswith("msg_verification_")
    assert challenge.subscription == first["id"]
    assert challenge.headers["content-type"] == "application/json"
    assert len(receiver.of("verification")) == 3
    assert len({r.document["challenge"] for r in receiver.of("verification")}) == 3  # single-use nonces


async def test_a_verification_does_not_lapse_while_a_subscription_to_its_url_is_live(ca: trustme.CA) -> None:
    # "a successful handshake ... covers that principal's subscriptions to that URL across refreshes"
    caller = Caller()
    clock = [datetime(2026, 12, 2, 12, 0, tzinfo=UTC)]
    events = EventsExtension(
        webhook=webhook_settings(
            ca,
            verification_ttl=timedelta(minutes=1),
            max_ttl=timedelta(hours=1),
            sweep_interval=timedelta(hours=1),
        ),
        principal_of=caller,
        now=lambda: clock[0],
    )
    declare_incidents(events)
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        secret = new_secret()
        await wire.subscribe("incident.created", receiver.url(), secret, ttlMs=3_600_000)
        clock[0] += timedelta(minutes=5)  # past the verification's own lifetime, the grant still live
        assert events._webhooks is not None
        await events._webhooks.sweep()
        await wire.subscribe("incident.created", receiver.url(), secret, ttlMs=3_600_000)  # a refresh
        await wire.subscribe("incident.created", receiver.url(), new_secret(), {"severity": "P1"})
        assert len(receiver.of("verification")) == 1
        # Once nothing to that URL is live, the lapsed handshake is asked for again.
        for arguments in ({}, {"severity": "P1"}):
            await wire.unsubscribe("incident.created", receiver.url(), arguments)
        await events._webhooks.sweep()
        await wire.subscribe("incident.created", receiver.url(), new_secret())
        assert len(receiver.of("verification")) == 2


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ((200, {"challenge": "not-the-nonce"}), "challenge_failed"),
        ((200, {}), "challenge_failed"),
        ((200, b"ok, sure"), "challenge_failed"),
        ((204, None), "challenge_failed"),
        ((401, {"error": "who are you? internal-host-7"}), "http_4xx"),
        ((503, {"error": "backend db-3 down"}), "http_5xx"),
        ((302, "https://127.0.0.1/elsewhere"), "http_4xx"),  # a redirect is a failure, never followed
    ],
)
async def test_an_endpoint_that_does_not_echo_is_a_callback_endpoint_error(
    ca: trustme.CA, reply: Reply, reason: str
) -> None:
    caller = Caller()
    events = incidents(ca, caller)
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        receiver.respond = lambda received: reply
        error = await wire.subscribe_error("incident.created", receiver.url(), new_secret())
        subscriptions = events.webhook_subscriptions()
    assert (error.code, error.message, error.data) == (-32015, "CallbackEndpointError", {"reason": reason})
    assert subscriptions == 0
    assert [r.path for r in receiver.received] == ["/hook"]  # one POST; a redirect target is never asked


async def test_a_refused_connection_is_connection_refused(ca: trustme.CA) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    caller = Caller()
    async with serving(incidents(ca, caller), caller) as wire:
        error = await wire.subscribe_error("incident.created", f"https://127.0.0.1:{port}/hook", new_secret())
    assert (error.code, error.data) == (-32015, {"reason": "connection_refused"})


async def test_a_certificate_that_does_not_match_the_host_is_tls_error(ca: trustme.CA) -> None:
    caller = Caller()
    dns = DNS(hooks_test="127.0.0.1", wrong_test="127.0.0.1")  # the cert names hooks.test, not wrong.test
    async with Receiver(ca) as receiver, serving(incidents(ca, caller, dns), caller) as wire:
        error = await wire.subscribe_error("incident.created", receiver.url(host="wrong.test"), new_secret())
    assert (error.code, error.data) == (-32015, {"reason": "tls_error"})
    assert receiver.received == []


async def test_an_untrusted_certificate_is_tls_error() -> None:
    caller = Caller()
    trusted, other = trustme.CA(), trustme.CA()
    events = incidents(trusted, caller)
    async with Receiver(other) as receiver, serving(events, caller) as wire:
        error = await wire.subscribe_error("incident.created", receiver.url(), new_secret())
    assert (error.code, error.data) == (-32015, {"reason": "tls_error"})


async def test_an_endpoint_slower_than_the_attempt_timeout_is_timeout(ca: trustme.CA) -> None:
    from datetime import timedelta

    caller = Caller()
    release = anyio.Event()

    async def stall(received: Received) -> Reply:
        await release.wait()
        return 200, {}

    events = incidents(ca, caller, attempt_timeout=timedelta(milliseconds=200))
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        receiver.respond = stall
        try:
            error = await wire.subscribe_error("incident.created", receiver.url(), new_secret())
        finally:
            release.set()
    assert (error.code, error.data) == (-32015, {"reason": "timeout"})


async def test_verifications_are_rate_limited_per_destination_host(ca: trustme.CA) -> None:
    caller = Caller()
    events = incidents(ca, caller, verifications_per_host=2)
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        for principal in ("p1", "p2"):
            await wire.subscribe("incident.created", receiver.url(), new_secret(), as_=principal)
        limited = await wire.subscribe_error("incident.created", receiver.url(), new_secret(), as_="p3")
        # Cached verifications cost nothing, and another host has its own bucket.
        await wire.subscribe("incident.created", receiver.url(), new_secret(), {"severity": "P1"}, as_="p1")
        await wire.subscribe("incident.created", receiver.url(host="hooks.test"), new_secret(), as_="p3")
    assert (limited.code, limited.data) == (-32013, {"limit": "verifications"})
    assert len(receiver.of("verification")) == 3


async def test_a_host_spelled_another_way_shares_its_verification_bucket(ca: trustme.CA) -> None:
    caller = Caller()
    events = incidents(ca, caller, verifications_per_host=1)
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        await wire.subscribe("incident.created", receiver.url(host="hooks.test"), new_secret(), as_="p1")
        # Upper case and a trailing dot name the same host: no second bucket for it.
        respelled = receiver.url(host="HOOKS.test.")
        limited = await wire.subscribe_error("incident.created", respelled, new_secret(), as_="p2")
    assert (limited.code, limited.data) == (-32013, {"limit": "verifications"})


# ---- the SSRF guard -------------------------------------------------------------------------------


async def test_loopback_is_refused_unless_allowlisted(ca: trustme.CA) -> None:
    caller = Caller()
    events = incidents(ca, caller, allow_networks=[])
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        literal = await wire.subscribe_error("incident.created", receiver.url(), new_secret())
        by_name = await wire.subscribe_error(
            "incident.created", receiver.url(host="hooks.test"), new_secret()
        )
    # An IP literal is refused as an invalid request, without a connection; a name that resolves to
    # a refused address is found out when connecting, so it is an endpoint the server cannot reach.
    assert literal.code == -32602 and "IP address deliveries may not go to" in literal.message
    assert (by_name.code, by_name.data) == (-32015, {"reason": "connection_refused"})
    for error in (literal, by_name):
        assert "127.0.0.1" not in f"{error.message} {error.data}"
    assert receiver.received == []


@pytest.mark.parametrize(
    ("allow", "reason"), [([], "connection_refused"), (["127.0.0.0/8", "::1/128"], None)]
)
async def test_the_system_resolver_is_guarded_too(
    ca: trustme.CA, allow: list[str], reason: str | None
) -> None:
    caller = Caller()
    events = EventsExtension(
        webhook=webhook_settings(ca, resolve=None, allow_networks=allow), principal_of=caller
    )
    declare_incidents(events)
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        url = receiver.url(host="localhost")  # getaddrinfo: loopback, from the hosts file
        if reason is None:
            await wire.subscribe("incident.created", url, new_secret())
        else:
            error = await wire.subscribe_error("incident.created", url, new_secret())
            assert error.data == {"reason": reason}
    assert len(receiver.received) == (1 if reason is None else 0)


async def test_ipv4_mapped_loopback_is_refused_even_with_loopback_allowlisted(ca: trustme.CA) -> None:
    caller = Caller()
    dns = DNS(hooks_test="::ffff:127.0.0.1")
    events = incidents(ca, caller, dns, allow_networks=["127.0.0.0/8"])
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        by_name = await wire.subscribe_error(
            "incident.created", receiver.url(host="hooks.test"), new_secret()
        )
        literal = await wire.subscribe_error(
            "incident.created", receiver.url(host="[::ffff:127.0.0.1]"), new_secret()
        )
    assert by_name.data == {"reason": "connection_refused"}
    assert literal.code == -32602
    assert receiver.received == []


async def test_the_host_is_resolved_and_checked_again_for_every_delivery(
    ca: trustme.CA, signals: Signals, caplog: pytest.LogCaptureFixture
) -> None:
    """DNS rebinding: subscribe-time resolution is allowed, the first delivery's is not."""
    caller = Caller()
    # The receiver listens on 127.0.0.1 and 127.0.0.2; only 127.0.0.1 is allowlisted, so without the
    # guard the rebound delivery would land on 127.0.0.2.
    dns = DNS()
    dns.set("hooks.test", "127.0.0.1", "127.0.0.2", "127.0.0.1")  # verification, 1st attempt, then on
    events = incidents(ca, caller, dns, allow_networks=["127.0.0.1/32"])
    caplog.set_level(logging.WARNING, logger="agentwake.server._ssrf")
    async with Receiver(ca, bind=("127.0.0.1", "127.0.0.2")) as receiver, serving(events, caller) as wire:
        await wire.subscribe("incident.created", receiver.url(host="hooks.test"), new_secret())
        events.emit(incident(1))
        assert await signals.done("inc-1") == ["acknowledged"]  # on the retry, after DNS came back

    assert [answer for _, answer in dns.lookups][:3] == [["127.0.0.1"], ["127.0.0.2"], ["127.0.0.1"]]
    assert [r.kind for r in receiver.received] == ["verification", "event"]  # nothing reached 127.0.0.2
    assert "hooks.test resolves to no permitted address" in caplog.text
    assert "127.0.0.2" not in caplog.text
    delivery = receiver.received[1]
    assert delivery.headers["host"] == f"hooks.test:{receiver.port}"
    assert delivery.sni == "hooks.test"


async def test_deliveries_do_not_follow_redirects(ca: trustme.CA, signals: Signals) -> None:
    caller = Caller()
    events = incidents(ca, caller, max_attempts=2)

    def redirect(received: Received) -> Reply:
        if received.kind == "verification":
            return 200, {"challenge": received.document["challenge"]}
        return 307, receiver.url("/internal")

    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        receiver.respond = redirect
        await wire.subscribe("incident.created", receiver.url(), new_secret())
        events.emit(incident(1))
        assert await signals.done("inc-1") == ["abandoned"]
        # The gap envelope reporting it is redirected too, and given up on the same way.
        await signals.until(
            lambda: any(m.startswith("msg_gap_") and o == "abandoned" for m, o in signals.finished.items())
        )
        status = (await wire.subscribe("incident.created", receiver.url(), new_secret()))["deliveryStatus"]
    # The verification, two attempts at inc-1, two at the gap: never /internal.
    assert [r.path for r in receiver.received] == ["/hook"] * 5
    assert status["lastError"] == "http_4xx"


# ---- the address table --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"],
)
def test_globally_reachable_addresses_pass(address: str) -> None:
    assert is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address",
    [
        "0.0.0.0",
        "10.1.2.3",
        "100.64.0.1",  # shared address space
        "127.0.0.1",
        "169.254.169.254",  # link-local: cloud metadata
        "172.16.0.1",
        "192.0.0.8",  # IETF protocol assignments; is_global says True on 3.11
        "192.0.2.1",
        "192.88.99.1",  # deprecated 6to4 relay anycast
        "192.168.1.1",
        "198.18.0.1",
        "224.0.0.1",  # multicast: is_global says True
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
        "::",
        "::1",
        "::7f00:1",  # IPv4-compatible loopback; is_global says True
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "64:ff9b::7f00:1",  # NAT64 of loopback
        "64:ff9b:1::1",  # local-use NAT64
        "100::1",
        "100:0:0:1::1",  # dummy prefix (2024)
        "2001:db8::1",
        "2002:7f00:1::1",  # 6to4 of loopback
        "2002:a00:1::1",  # 6to4 of 10.0.0.1
        "3fff::1",  # documentation (2024)
        "5f00::1",  # segment routing SIDs (2024)
        "fc00::1",
        "fd12:3456::1",
        "fe80::1",
        "fec0::1",  # deprecated site-local
        "ff02::1",
        "ff0e::1",
    ],
)
def test_special_purpose_addresses_are_refused(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))


def test_the_allowlist_covers_exactly_what_it_names() -> None:
    policy = AddressPolicy([ipaddress.ip_network("127.0.0.0/8")])
    assert policy.permits(ipaddress.ip_address("127.0.0.1"))
    assert not policy.permits(ipaddress.ip_address("::ffff:127.0.0.1"))
    assert not policy.permits(ipaddress.ip_address("10.0.0.1"))
    assert policy.permits_host("hooks.test") is None  # a name: the resolver decides
