"""Webhook delivery on the client: config, mode choice, refresh timing, error messages, the stored subscription."""

from __future__ import annotations

import io
import json
import logging
import os
import random
import socket
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentwake import protocol, signing
from agentwake.cli import app
from agentwake.config import SubscriptionConfig, WebhookConfig, parse_config
from agentwake.delivery.select import choose_mode
from agentwake.delivery.webhook import (
    EXPIRED_GRANT_REFRESH_S,
    describe_subscribe_error,
    parse_time,
    refresh_delay,
)
from agentwake.errors import ConfigError, events_call_error
from agentwake.logs import install_redaction
from agentwake.store import IncomingEvent, Store, SubscriptionKey, WebhookDelivery
from agentwake.store.sqlite import SqliteCore, SqliteStore

runner = CliRunner()
pytestmark = pytest.mark.anyio
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
HOOK = WebhookConfig(public_url="https://hooks.example.com/agentwake")


def tickets(**overrides: object) -> SubscriptionConfig:
    return SubscriptionConfig.model_validate(
        {"name": "tickets", "server": "demo", "event": "ticket.created", **overrides}
    )


# ---- config ----------------------------------------------------------------------------


def test_webhook_config_needs_an_https_public_url_and_both_tls_files() -> None:
    for bad in ("http://hooks.example.com", "hooks.example.com", "https://h.example.com/x?y=1"):
        with pytest.raises(ConfigError, match="public_url must be an https:// URL"):
            parse_config({"webhook": {"public_url": bad}}, env={})
    with pytest.raises(ConfigError, match="set both tls_cert and tls_key"):
        parse_config({"webhook": {"public_url": "https://h.example", "tls_cert": "c.pem"}}, env={})
    with pytest.raises(ConfigError, match="listen must be HOST:PORT"):
        parse_config({"webhook": {"public_url": "https://h.example", "listen": "8787"}}, env={})


@pytest.mark.parametrize(
    "url", ["https://user:hunter2@proxy.example/hooks", "http://user:hunter2@proxy.example"]
)
def test_a_public_url_with_a_password_is_refused_without_repeating_it(url: str) -> None:
    # It would go to every server as delivery.url and show in logs and status.
    with pytest.raises(ConfigError, match="must not hold a user name or password") as refused:
        parse_config({"webhook": {"public_url": url}}, env={})
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize(
    ("webhook", "expected"),
    [
        ({"public_url": "https://h.example:99999/x"}, "public_url is not a valid URL"),
        ({"public_url": "https://h.example:0/x"}, "a port from 1 to 65535"),
        ({"public_url": "https://h.example", "health_refresh_s": 0.001}, "health_refresh_s"),
        ({"public_url": "https://h.example", "max_body_bytes": 10**9}, "max_body_bytes"),
    ],
)
def test_webhook_settings_out_of_range_are_config_errors(webhook: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        parse_config({"webhook": webhook}, env={})


def test_each_subscription_gets_its_own_callback_url_under_the_public_url() -> None:
    config = WebhookConfig(public_url="https://hooks.example.com/agentwake/", listen="[::1]:9000")
    assert config.callback_url("tickets") == "https://hooks.example.com/agentwake/tickets"
    assert config.address == ("::1", 9000)


def test_tls_paths_resolve_against_the_config_folder(tmp_path: Path) -> None:
    config = parse_config(
        {"webhook": {"public_url": "https://h.example", "tls_cert": "c.pem", "tls_key": "k.pem"}},
        source=tmp_path / "agentwake.toml",
        env={},
    )
    assert config.webhook is not None
    assert config.webhook.tls_cert == tmp_path / "c.pem"


def test_forcing_webhook_without_a_webhook_section_is_a_config_error() -> None:
    data = {
        "servers": {"demo": {"url": "http://127.0.0.1:1/mcp"}},
        "subscriptions": [{"server": "demo", "event": "ticket.created", "delivery": "webhook"}],
    }
    with pytest.raises(ConfigError, match=r"there is no \[webhook\] section"):
        parse_config(data, env={})


# ---- mode choice ------------------------------------------------------------------------


def test_auto_prefers_webhook_when_there_is_a_receiver_and_the_type_offers_it() -> None:
    auto = tickets(delivery="auto")
    assert choose_mode(auto, ["poll", "push", "webhook"], receiver=True) == "webhook"
    assert choose_mode(auto, ["poll", "push", "webhook"], receiver=False) == "push"
    assert choose_mode(auto, ["poll", "push"], receiver=True) == "push"
    assert choose_mode(tickets(delivery="webhook"), ["webhook"], receiver=True) == "webhook"
    with pytest.raises(ConfigError, match=r"needs a \[webhook\] section"):
        choose_mode(tickets(delivery="webhook"), ["webhook"], receiver=False)
    with pytest.raises(ConfigError, match="does not offer 'webhook' delivery"):
        choose_mode(tickets(delivery="webhook"), ["poll"], receiver=True)


# ---- refresh timing ------------------------------------------------------------------------


def test_refresh_comes_well_before_refresh_before_with_jitter() -> None:
    rng = random.Random(7)
    delays = [
        refresh_delay(NOW + timedelta(seconds=100), NOW, requested_ttl_s=300, health_refresh_s=3600, rng=rng)
        for _ in range(200)
    ]
    assert all(50 <= d <= 75 for d in delays)
    assert len({round(d, 3) for d in delays}) > 100  # jittered, not one cadence for everyone


def test_no_expiry_gets_a_health_refresh() -> None:
    health = refresh_delay(None, NOW, requested_ttl_s=None, health_refresh_s=3600, rng=random.Random(1))
    assert 0.8 * 3600 <= health <= 3600


@pytest.mark.parametrize("requested_ttl_s", [100.0, None])
def test_a_grant_already_over_by_this_clock_is_refreshed_on_the_ttl_asked_for_not_at_once(
    requested_ttl_s: float | None,
) -> None:
    # A clock ahead of the server's: "at once" would re-subscribe in a tight loop for as long as it lasts.
    rng = random.Random(3)
    delays = [
        refresh_delay(
            NOW - timedelta(seconds=1), NOW, requested_ttl_s=requested_ttl_s, health_refresh_s=3600, rng=rng
        )
        for _ in range(50)
    ]
    pace = requested_ttl_s if requested_ttl_s is not None else EXPIRED_GRANT_REFRESH_S
    assert all(0.5 * pace <= d <= 0.75 * pace for d in delays)


def test_a_clock_behind_the_servers_cannot_stretch_the_plan_past_the_ttl_asked_for() -> None:
    # The grant looks an hour long here, but a 60 s TTL was asked for (a grant SHOULD be at most that).
    rng = random.Random(5)
    delay = refresh_delay(NOW + timedelta(hours=1), NOW, requested_ttl_s=60, health_refresh_s=3600, rng=rng)
    assert 30 <= delay <= 45


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-02-19T16:30:00Z", datetime(2026, 2, 19, 16, 30, tzinfo=UTC)),
        ("2026-02-19t16:30:00z", datetime(2026, 2, 19, 16, 30, tzinfo=UTC)),  # RFC 3339 allows lowercase
        ("2026-02-19T16:30:00.123456789Z", datetime(2026, 2, 19, 16, 30, 0, 123456, tzinfo=UTC)),
        ("2026-02-19T17:30:00+01:00", datetime(2026, 2, 19, 16, 30, tzinfo=UTC)),
        ("2026-02-19T16:30:00", datetime(2026, 2, 19, 16, 30, tzinfo=UTC)),  # no offset: UTC
    ],
)
def test_refresh_before_is_read_as_rfc_3339(text: str, expected: datetime) -> None:
    assert parse_time(text) == expected


@pytest.mark.parametrize("text", ["garbage", "2026-02-19T24:61:00Z", ""])
def test_a_refresh_before_that_is_not_a_time_is_an_error_not_no_expiry(text: str) -> None:
    with pytest.raises(ValueError, match="not a time"):
        parse_time(text)


# ---- error messages --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "data", "expected"),
    [
        (protocol.INVALID_PARAMS, None, "rejected the webhook subscribe as invalid: bad url"),
        (protocol.FORBIDDEN, {"reason": "no principal"}, "needs an authenticated connection"),
        (
            protocol.RESOURCE_EXHAUSTED,
            {"limit": "subscriptions", "max": 5},
            "subscriptions limit is reached (at most 5)",
        ),
        (
            protocol.UNSUPPORTED,
            {"feature": "deliveryMode", "value": "webhook"},
            "does not support deliveryMode 'webhook'",
        ),
        (
            protocol.CALLBACK_ENDPOINT_ERROR,
            {"reason": "challenge_failed"},
            "could not verify our webhook endpoint",
        ),
    ],
)
def test_each_subscribe_error_is_a_clear_message_naming_the_subscription(
    code: int, data: object, expected: str
) -> None:
    exc = events_call_error("events/subscribe", code, "bad url", data, server="demo", subscription="tickets")
    message = describe_subscribe_error(exc, tickets(), HOOK)
    assert "subscription 'tickets'" in message
    assert expected in message
    if code == protocol.CALLBACK_ENDPOINT_ERROR:
        assert "https://hooks.example.com/agentwake/tickets (challenge_failed)" in message


def test_an_unknown_callback_error_reason_is_not_echoed() -> None:
    exc = events_call_error(
        "events/subscribe", protocol.CALLBACK_ENDPOINT_ERROR, "x", {"reason": "<html>500"}
    )
    assert "<html>" not in describe_subscribe_error(exc, tickets(), HOOK)


# ---- the stored webhook subscription -----------------------------------------------------------

KEY = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "support"})
URL = "https://hooks.example.com/agentwake/tickets"


async def test_a_webhook_keeps_its_secret_until_its_key_changes_then_the_old_one_is_retired(
    store: Store,
) -> None:
    await store.register(KEY)
    first = await store.prepare_webhook(KEY, URL, signing.generate_secret())
    again = await store.prepare_webhook(KEY, URL, signing.generate_secret())
    assert again.secret == first.secret
    await store.webhook_subscribed(
        "tickets",
        webhook_id="sub_1",
        sent_secret=first.secret,
        refresh_before="2026-12-02T13:00:00.000Z",
        delivery_status={"active": True},
        previous_until="2026-12-02T12:10:00.000Z",
    )
    moved = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "billing"})
    fresh = await store.prepare_webhook(moved, URL, signing.generate_secret())
    assert fresh.secret != first.secret and fresh.webhook_id is None
    [retired] = await store.to_unsubscribe("demo")
    assert (retired.arguments, retired.url, retired.webhook_id) == ({"queue": "support"}, URL, "sub_1")
    assert store.core.retired_webhook_ids() == {"sub_1"}
    await store.mark_unsubscribed(retired.id)
    assert await store.to_unsubscribe() == []


async def test_a_refresh_with_a_new_secret_keeps_the_old_one_as_previous(store: Store) -> None:
    await store.register(KEY)
    record = await store.prepare_webhook(KEY, URL, signing.generate_secret())
    [name] = store.core.request_rotation(None, signing.generate_secret)
    assert name == "tickets"
    pending = await store.webhook("tickets")
    assert pending is not None and pending.pending_secret
    updated = await store.webhook_subscribed(
        "tickets",
        webhook_id="sub_1",
        sent_secret=pending.pending_secret,
        refresh_before=None,
        delivery_status=None,
        previous_until="2026-12-02T12:10:00.000Z",
    )
    assert updated is not None
    assert updated.secret == pending.pending_secret
    assert updated.previous_secret == record.secret
    assert updated.pending_secret is None
    assert updated.no_expiry is True


async def test_secrets_stay_out_of_reprs_and_status_and_the_file_is_private(store: Store) -> None:
    await store.register(KEY)
    record = await store.prepare_webhook(KEY, URL, signing.generate_secret())
    assert record.secret not in repr(record)
    assert "whsec_" not in json.dumps(store.core.subscriptions())
    assert store.core.subscriptions()[0]["webhook"]["url"] == URL
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600


async def test_a_servers_error_that_quotes_a_secret_is_stored_and_shown_without_it(store: Store) -> None:
    # A server's -32602 message may echo the delivery.secret it was sent; status shows last_error.
    await store.register(KEY)
    secret = signing.generate_secret()
    await store.record_error(KEY.name, f"events/subscribe: InvalidParams: bad secret {secret}")
    assert secret not in json.dumps(store.core.subscriptions())
    await store.set_state(KEY.name, status="ended", error=f"refused: {secret}")
    [row] = store.core.subscriptions()
    assert row["last_error"] == "refused: [REDACTED]"


# ---- rotate-secret -------------------------------------------------------------------------------


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "agentwake.toml"
    path.write_text(
        '[store]\npath = "aw.db"\n[webhook]\npublic_url = "https://hooks.example.com/aw"\nrotation_grace_s = 60\n'
    )
    return path


async def test_rotate_secret_stores_a_pending_secret_and_never_prints_it(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    opened = await SqliteStore.open(tmp_path / "aw.db")
    await opened.register(KEY)
    await opened.prepare_webhook(KEY, URL, signing.generate_secret())
    await opened.close()
    result = runner.invoke(app, ["rotate-secret", "tickets", "-c", str(config)])
    assert result.exit_code == 0, result.output
    assert "tickets: new secret stored" in result.output and "60s" in result.output
    assert "whsec_" not in result.output
    reopened = SqliteCore.open(tmp_path / "aw.db", create=False)
    try:
        record = reopened.webhook("tickets")
        assert record is not None and record.pending_secret is not None
        status = runner.invoke(app, ["status", "--json", "-c", str(config)])
        assert json.loads(status.output)[0]["webhook"]["rotation_pending"] is True
    finally:
        reopened.close()
    unknown = runner.invoke(app, ["rotate-secret", "nope", "-c", str(config)])
    assert unknown.exit_code == 2
    assert "no webhook subscription named 'nope'" in unknown.output


def test_run_says_plainly_when_the_webhook_port_is_taken(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = tmp_path / "agentwake.toml"
        path.write_text(
            f'[store]\npath = "aw.db"\n[webhook]\nlisten = "127.0.0.1:{port}"\n'
            f'public_url = "https://127.0.0.1:{port}"\n'
        )
        result = runner.invoke(app, ["run", "-c", str(path)])
    assert result.exit_code == 1
    assert f"the webhook receiver cannot listen on 127.0.0.1:{port}" in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_log_records_are_redacted_of_secrets_in_messages_arguments_and_tracebacks() -> None:
    secret = signing.generate_secret()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    install_redaction(handler)
    log = logging.getLogger("agentwake.test.redaction")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        log.debug(
            "sending %s",
            {"delivery": {"secret": secret}, "headers": "Authorization: Bearer abcdef0123456789xyz"},
        )
        try:
            raise ValueError(f"bad secret {secret}")
        except ValueError:
            log.exception("failed")
        log.info("nothing to hide here")
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    assert secret.removeprefix("whsec_") not in text
    assert "abcdef0123456789xyz" not in text
    assert text.count("[REDACTED]") >= 3
    assert "nothing to hide here" in text


async def test_a_group_commit_counts_each_delivery_and_keeps_arrival_order_for_cursors_and_gaps(
    store: Store,
) -> None:
    other = SubscriptionKey("alerts", "demo", "alert.fired", {})
    for key in (KEY, other):
        await store.register(key)
    await store.ingest(KEY, [IncomingEvent("T-1", "ticket.created", "t", {"n": 1})], "c1")

    def event(event_id: str, name: str = "ticket.created") -> IncomingEvent:
        return IncomingEvent(event_id, name, "t", {"id": event_id})

    results = await store.ingest_deliveries(
        [
            WebhookDelivery(KEY, event("T-1"), "c2"),  # stored before: a duplicate
            WebhookDelivery(KEY, event("T-2"), "c3"),
            WebhookDelivery(other, event("A-1", "alert.fired"), None),  # no replay: the cursor stays
            WebhookDelivery(KEY, event("T-2"), "c4"),  # a retry inside the same batch
            WebhookDelivery(KEY, None, "c9", truncated=True),  # a gap after c4
            WebhookDelivery(KEY, event("T-3"), "c10"),
        ]
    )
    assert [(r.inserted, r.duplicates) for r in results] == [(0, 1), (1, 0), (1, 0), (0, 1), (0, 0), (1, 0)]
    rows = {row["subscription"]: row for row in store.core.subscriptions()}
    assert (rows["tickets"]["cursor"], rows["tickets"]["events_received"], rows["tickets"]["duplicates"]) == (
        "c10",
        3,
        2,
    )
    assert (rows["alerts"]["cursor"], rows["alerts"]["events_received"]) == (None, 1)
    [gap] = store.core.gaps("tickets")
    assert (gap["cursor_before"], gap["cursor_after"]) == ("c4", "c9")
    assert store.core.event_ids() == ["T-1", "T-2", "A-1", "T-3"]
