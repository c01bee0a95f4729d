"""A delivery the server gives up on while agentwake's receiver is down is never lost silently.

agentwake.server (in process, Streamable HTTP on loopback) delivers a durable ticket type by webhook
over real TLS (a trustme CA) to agentwake's own receiver, run by the Supervisor on a SQLite store.
The receiver goes down, a ticket is opened, the server spends its retries on it (and on the gap
envelope that reports it) and abandons it; the receiver comes back, agentwake refreshes, and the
refresh's ``truncated: true`` makes the store record a gap that `status` shows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import trustme
from _support import serving_mcp_http
from _webhook_server_support import Caller, Signals, Tickets, declare_tickets, webhook_settings
from conftest import free_port

from agentwake.cli.views import status_snapshot
from agentwake.config import AgentwakeConfig, parse_config
from agentwake.server import EventsExtension
from agentwake.store import Store
from agentwake.store.sqlite import SqliteStore
from agentwake.supervisor import Supervisor

pytestmark = [pytest.mark.anyio]
WAIT = 30.0


def agentwake_config(tmp_path: Path, url: str, ca: trustme.CA, port: int) -> AgentwakeConfig:
    cert = tmp_path / "receiver.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(cert))
    data: dict[str, Any] = {
        "store": {"path": str(tmp_path / "aw.db")},
        "servers": {"tickets": {"url": url, "connect_timeout_s": 10}},
        "subscriptions": [
            {"name": "tickets", "server": "tickets", "event": "ticket.created", "delivery": "webhook"}
        ],
        "policy": {"dir": str(tmp_path / "no-policies")},
        "webhook": {
            "listen": f"127.0.0.1:{port}",
            "public_url": f"https://127.0.0.1:{port}/hooks",
            "tls_cert": str(cert),
            "tls_key": str(cert),
            "ttl_ms": 600_000,
        },
    }
    return parse_config(data, env={})


@asynccontextmanager
async def delivering(cfg: AgentwakeConfig) -> AsyncIterator[tuple[Store, Supervisor]]:
    """agentwake's delivery side (receiver and refresh loop, no worker) on ``cfg``, store open."""
    store = await SqliteStore.open(cfg.store.path)
    try:
        supervisor = Supervisor(cfg, store)
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervisor.run)
            yield store, supervisor
            tg.cancel_scope.cancel()
    finally:
        await store.close()


async def wait_refreshes(supervisor: Supervisor, store: Store, count: int) -> None:
    """Every subscribe and refresh binds the receiver's route; wait for ``count`` stored ones."""
    with anyio.fail_after(WAIT):
        while True:
            record = store.core.webhook("tickets")
            if record is not None and record.refreshes >= count:
                return
            await supervisor.routes.wait_binds(supervisor.routes.binds + 1)


async def stored(supervisor: Supervisor, store: Store, event_id: str) -> None:
    with anyio.fail_after(WAIT):
        while event_id not in store.core.event_ids("tickets"):
            await supervisor.next_stored()


def gap_outcomes(signals: Signals) -> list[str]:
    return [outcome for msg_id, outcome in signals.finished.items() if msg_id.startswith("msg_gap_")]


async def test_a_delivery_abandoned_while_the_receiver_is_down_is_a_gap_once_it_is_back(
    tmp_path: Path, ca: trustme.CA, signals: Signals
) -> None:
    tickets = Tickets()
    events = EventsExtension(webhook=webhook_settings(ca, max_attempts=3), principal_of=Caller("alice"))
    declare_tickets(events, tickets, next_poll_ms=50)
    async with serving_mcp_http(events) as origin:
        url = f"{origin}/mcp"
        cfg = agentwake_config(tmp_path, url, ca, free_port())
        async with delivering(cfg) as (store, supervisor):
            await wait_refreshes(supervisor, store, 1)
            tickets.add("T-000001")
            await stored(supervisor, store, "t1")

        # The receiver is down: the server spends its attempts on T-000002, then on the gap
        # envelope that would report it, and gives up on both.
        tickets.add("T-000002")
        await signals.until(lambda: signals.finished.get("t2") == "abandoned")
        await signals.until(lambda: gap_outcomes(signals) == ["abandoned"])

        async with delivering(cfg) as (store, supervisor):
            await wait_refreshes(supervisor, store, 2)  # the resubscribe after the restart
            gaps = store.core.gaps("tickets")
            assert "t2" in store.core.event_ids("tickets") or len(gaps) == 1
            assert "t2" not in store.core.event_ids("tickets")  # the server kept no copy to replay
            (row,) = store.core.subscriptions()
            assert row["gaps"] == 1
            # Delivery goes on after the gap, with a cursor past the skipped ticket.
            tickets.add("T-000003")
            await stored(supervisor, store, "t3")
            assert store.core.cursor("tickets") == "3"

    _, rows = status_snapshot_of(tmp_path, cfg)
    assert [(r["subscription"], r["gaps"]) for r in rows] == [("tickets", 1)]


def status_snapshot_of(tmp_path: Path, cfg: AgentwakeConfig) -> tuple[Any, list[dict[str, Any]]]:
    """What `agentwake status` reads, from a config file naming the same store."""
    path = tmp_path / "agentwake.toml"
    path.write_text(
        f'[store]\npath = "{cfg.store.path}"\n\n'
        '[[subscriptions]]\nname = "tickets"\nserver = "tickets"\nevent = "ticket.created"\n\n'
        f'[servers.tickets]\nurl = "{cfg.servers["tickets"].url}"\n'
    )
    return status_snapshot(path)
