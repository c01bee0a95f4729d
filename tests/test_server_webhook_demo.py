"""The demo server's webhook delivery, end to end: a real subprocess over Streamable HTTP with
the SDK's bearer auth, delivering to a real HTTPS receiver that trusts a test CA.

The settings are the ones our client's end-to-end tests use (DEMO_TOKEN,
DEMO_WEBHOOK_TTL_MS=2000, DEMO_WEBHOOK_MIN_TTL_MS=500, DEMO_WEBHOOK_ALLOW=127.0.0.0/8,
DEMO_WEBHOOK_CA=<the CA's PEM>).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import trustme
from _webhook_server_support import Caller, Receiver, Wire, new_secret
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from agentwake.server import subscription_id
from agentwake.server._types import parse_timestamp

pytestmark = pytest.mark.anyio

TOKEN = "s3cret"


def webhook_env(ca_path: Path, **extra: str) -> dict[str, str]:
    return {
        "DEMO_WEBHOOK_TTL_MS": "2000",
        "DEMO_WEBHOOK_MIN_TTL_MS": "500",
        "DEMO_WEBHOOK_ALLOW": "127.0.0.0/8",
        "DEMO_WEBHOOK_CA": str(ca_path),
        **extra,
    }


@pytest.fixture
def ca_file(tmp_path: Path) -> tuple[trustme.CA, Path]:
    ca = trustme.CA()
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return ca, path


async def test_the_demo_delivers_a_new_ticket_to_a_verified_https_callback(
    demo_http_factory: Any, ca_file: tuple[trustme.CA, Path]
) -> None:
    ca, path = ca_file
    secret = new_secret()
    async with (
        Receiver(ca) as receiver,
        demo_http_factory(DEMO_TOKEN=TOKEN, **webhook_env(path)) as demo,
        create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"}) as http,
        Client(streamable_http_client(demo.url, http_client=http)) as client,
    ):
        wire = Wire(client, Caller())
        listed = {d["name"]: d["delivery"] for d in (await wire.call("events/list", {}))["events"]}
        granted = await wire.subscribe(
            "ticket.created", receiver.url(), secret, {"queue": "billing"}, ttlMs=60_000
        )
        asked_at = datetime.now(UTC)
        created = await client.call_tool(
            "create_ticket", {"queue": "billing", "priority": "P2", "title": "Refund not received"}
        )
        delivered = await receiver.next("event")
        await wire.unsubscribe("ticket.created", receiver.url(), {"queue": "billing"})

    assert all("webhook" in modes for modes in listed.values()) and set(listed) >= {
        "ticket.created",
        "alert.fired",
        "system.load",
    }
    # The principal is the bearer token's subject; the 60 s suggestion is clamped to 2 s.
    assert granted["id"] == subscription_id(
        "demo-user", receiver.url(), "ticket.created", {"queue": "billing"}
    )
    refresh_before = parse_timestamp(granted["refreshBefore"])
    assert refresh_before is not None and refresh_before <= asked_at + timedelta(seconds=2)
    (challenge,) = receiver.of("verification")
    challenge.verify(secret)
    ticket_id = created.structured_content["result"] if created.structured_content else None
    body = delivered.verify(secret)
    assert body["eventId"] == ticket_id and body["data"]["queue"] == "billing"
    assert delivered.subscription == granted["id"]


async def test_without_a_token_the_demo_offers_webhook_but_refuses_to_subscribe(
    demo_http_factory: Any, ca_file: tuple[trustme.CA, Path]
) -> None:
    ca, path = ca_file
    async with (
        Receiver(ca) as receiver,
        demo_http_factory(**webhook_env(path)) as demo,
        Client(streamable_http_client(demo.url)) as client,
    ):
        wire = Wire(client, Caller())
        with pytest.raises(MCPError) as refused:
            await wire.subscribe("ticket.created", receiver.url(), new_secret())
    assert refused.value.code == -32012
    assert receiver.received == []


def test_the_demo_webhook_settings_come_from_the_environment_and_flags(tmp_path: Path) -> None:
    from examples.demo_server import DemoSettings, parse_args, webhook_settings

    assert DemoSettings.from_env({}).webhook_ttl_ms is None
    assert webhook_settings(DemoSettings.from_env({}), None) is None  # unset: no webhook
    settings = DemoSettings.from_env(
        {
            "DEMO_WEBHOOK_TTL_MS": "2000",
            "DEMO_WEBHOOK_MIN_TTL_MS": "500",
            "DEMO_WEBHOOK_ALLOW": "127.0.0.0/8, ::1/128",
            "DEMO_WEBHOOK_RETRY_S": "0.25",
            "DEMO_WEBHOOK_STORE": str(tmp_path / "hooks.db"),
        }
    )
    built = webhook_settings(settings, None)
    assert built is not None
    assert (built.max_ttl, built.min_ttl) == (timedelta(seconds=2), timedelta(milliseconds=500))
    assert [str(n) for n in built.allow_networks] == ["127.0.0.0/8", "::1/128"]
    assert built.retry_initial == timedelta(milliseconds=250)
    assert settings.webhook_store == tmp_path / "hooks.db"
    assert DemoSettings.from_env({}).webhook_min_ttl_ms == 1000
    assert DemoSettings.from_env({}).webhook_retry_s == 1.0
    flags = parse_args(["--webhook-ttl-ms", "3000", "--webhook-allow", "10.0.0.0/8"])[1]
    assert (flags.webhook_ttl_ms, flags.webhook_allow) == (3000, ("10.0.0.0/8",))
