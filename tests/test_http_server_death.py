"""A Streamable HTTP server that dies under a live connection: reconnect, never a silent stop.

The SDK's HTTP transport ends a connection whose server went away by cancelling the task
the connection runs in. Taken at face value that cancellation ends the server's task in
the supervisor as if agentwake were stopping. Here the demo server is killed while its
subscription is delivering (poll, and webhook where nothing but the liveness probe talks
to the server), on both protocol eras; the failure must be recorded and delivery must
resume when the server is back on the same port.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import DemoHTTP, free_port
from test_webhook_e2e import TOKEN, Tls, delivering, ticket_arrives, tls, webhook_demo

from agentwake.config import parse_config
from agentwake.store import Store
from agentwake.supervisor import Supervisor
from examples.demo_server import TicketStore

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

__all__ = ["tls"]  # the fixture, shared with the webhook end-to-end tests


def rows(store: Store) -> list[dict[str, Any]]:
    return store.core.subscriptions()  # type: ignore[attr-defined, no-any-return]


def subscription_row(store: Store) -> dict[str, Any]:
    return next(r for r in rows(store) if r["subscription"] == "tickets")


async def until(condition: Any, within: float = 15.0) -> None:
    with anyio.fail_after(within):
        while not condition():  # noqa: ASYNC110 - the store signals nothing
            await anyio.sleep(0.02)


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
@pytest.mark.parametrize("delivery", ["poll", "webhook"])
async def test_a_killed_http_server_is_a_lost_connection_and_delivery_resumes_when_it_is_back(
    tmp_path: Path, tls: Tls, protocol: str, delivery: str
) -> None:
    port = free_port()
    async with webhook_demo(tmp_path, tls, ttl_ms=60_000) as demo:
        cfg = parse_config(
            {
                "store": {"path": str(tmp_path / "aw.db")},
                "servers": {
                    "demo": {
                        "url": demo.url,
                        "headers": {"Authorization": f"Bearer {TOKEN}"},
                        "protocol": protocol,
                        "ping_interval_s": 0.3,
                        "connect_timeout_s": 5,
                        "request_timeout_s": 5,
                    }
                },
                "subscriptions": [
                    {"name": "tickets", "server": "demo", "event": "ticket.created", "delivery": delivery}
                ],
                "webhook": {
                    "listen": f"127.0.0.1:{port}",
                    "public_url": f"https://127.0.0.1:{port}/hooks",
                    "tls_cert": str(tls.cert),
                    "tls_key": str(tls.cert),
                    "ttl_ms": 60_000,
                },
                "policy": {"dir": str(tmp_path / "no-policies")},
            },
            env={},
        )
        async with delivering(cfg) as (store, supervisor):
            await until(lambda: any(r["subscription"] == "tickets" and r["cursor"] for r in rows(store)))
            await ticket_arrives(demo, store, supervisor, "before the crash")
            assert subscription_row(store)["mode"] == delivery
            await demo.stop()
            await until(lambda: subscription_row(store)["recent_errors"])
            assert "demo" in subscription_row(store)["recent_errors"][-1]["error"]
            await demo.start()  # the same port and tickets file: the same server, back
            await second_ticket_arrives(demo, store, supervisor)
            assert len(set(store.core.event_ids("tickets"))) == 2


async def second_ticket_arrives(demo: DemoHTTP, store: Store, supervisor: Supervisor) -> None:
    upstream = TicketStore(demo.db)
    try:
        upstream.create([("support", "P2", "after the restart", "", "al@example.com")])
    finally:
        upstream.close()
    await until(lambda: len(store.core.event_ids("tickets")) >= 2, within=30)
