"""Webhook delivery end to end: the demo server over Streamable HTTP (real bearer auth) signs and POSTs
each ticket over real TLS to our receiver, which stores it in the inbox; the agent runs on it through
litellm against the fake LLM on loopback. Short TTLs make the refresh loop do its work for real.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
import trustme
from _rig import KEY_ENV
from conftest import DemoHTTP, demo_stdio, free_port, running_demo_http
from fake_llm import FakeLLM, text

from agentwake import protocol, signing
from agentwake.agent.runner import AgentRunner
from agentwake.agent.tools import ConnectionPool
from agentwake.config import AgentwakeConfig, parse_config
from agentwake.errors import EventsCallError
from agentwake.logs import install_redaction
from agentwake.mcp import ServerConnection
from agentwake.store import Store, WebhookRecord
from agentwake.store.sqlite import SqliteCore, SqliteStore
from agentwake.supervisor import Supervisor
from agentwake.worker import Worker
from examples.demo_server import TicketStore

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
TOKEN = "demo-token-for-tests"
PROMPTS = Path(__file__).resolve().parent.parent / "prompts"


@dataclass
class Tls:
    cert: Path  # key and chain, for the receiver
    ca: Path  # the CA the demo server trusts for callbacks


@pytest.fixture
def tls(tmp_path: Path) -> Tls:
    ca = trustme.CA()
    cert = tmp_path / "receiver.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(cert))
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return Tls(cert, ca_file)


@asynccontextmanager
async def webhook_demo(
    tmp_path: Path, tls: Tls, ttl_ms: int = 1500, env: dict[str, str] | None = None
) -> AsyncIterator[DemoHTTP]:
    async with running_demo_http(
        tmp_path / "demo.db",
        DEMO_TOKEN=TOKEN,
        DEMO_WEBHOOK_TTL_MS=str(ttl_ms),
        DEMO_WEBHOOK_MIN_TTL_MS="500",
        DEMO_WEBHOOK_ALLOW="127.0.0.0/8",
        DEMO_WEBHOOK_CA=str(tls.ca),
        DEMO_WEBHOOK_RETRY_S="0.1",
        DEMO_NEXT_POLL_MS="100",
        **(env or {}),
    ) as demo:
        yield demo


def config(
    tmp_path: Path,
    demo: DemoHTTP,
    tls: Tls,
    port: int,
    *,
    subscriptions: list[dict[str, Any]],
    webhook: bool = True,
    agent: dict[str, Any] | None = None,
) -> AgentwakeConfig:
    data: dict[str, Any] = {
        "store": {"path": str(tmp_path / "aw.db")},
        "servers": {
            "demo": {
                "url": demo.url,
                "headers": {"Authorization": f"Bearer {TOKEN}"},
                "connect_timeout_s": 10,
            }
        },
        "subscriptions": subscriptions,
        "policy": {"dir": str(tmp_path / "no-policies")},
    }
    if webhook:
        data["webhook"] = {
            "listen": f"127.0.0.1:{port}",
            "public_url": f"https://127.0.0.1:{port}/hooks",
            "tls_cert": str(tls.cert),
            "tls_key": str(tls.cert),
            "ttl_ms": 1500,
        }
    if agent is not None:
        data["agent"] = agent
    return parse_config(data, env={})


TICKETS = {"name": "tickets", "server": "demo", "event": "ticket.created", "delivery": "auto"}


@asynccontextmanager
async def delivering(cfg: AgentwakeConfig) -> AsyncIterator[tuple[Store, Supervisor]]:
    """The service's delivery side (no worker) running on ``cfg``, with its store open."""
    store = await SqliteStore.open(cfg.store.path)
    try:
        supervisor = Supervisor(cfg, store)
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervisor.run)
            yield store, supervisor
            tg.cancel_scope.cancel()
    finally:
        await store.close()


async def ticket_arrives(demo: DemoHTTP, store: Store, supervisor: Supervisor, title: str) -> None:
    """Open a ticket on the demo server and wait until a delivery has put it in the inbox."""
    upstream = TicketStore(demo.db)
    try:
        upstream.create([("support", "P2", title, "", "al@example.com")])
    finally:
        upstream.close()
    with anyio.fail_after(30):
        while not store.core.event_ids("tickets"):
            await supervisor.next_stored()


async def wait_refreshes(supervisor: Supervisor, store: Store, name: str, count: int) -> None:
    """Every subscribe and refresh binds the receiver's route; wait for ``count`` stored refreshes."""
    while True:
        record = store.core.webhook(name)
        if record is not None and record.refreshes >= count:
            return
        await supervisor.routes.wait_binds(supervisor.routes.binds + 1)


async def test_tickets_arrive_by_webhook_wake_the_agent_and_refreshes_keep_the_subscription_alive(
    tmp_path: Path, tls: Tls, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test")
    port = free_port()
    async with webhook_demo(tmp_path, tls) as demo, FakeLLM() as fake:
        fake.responder = lambda body: text("noted")
        cfg = config(
            tmp_path,
            demo,
            tls,
            port,
            subscriptions=[TICKETS],
            agent={
                "model": "openai/fake",
                "api_base": fake.url,
                "api_key_env": KEY_ENV,
                "prompts": str(PROMPTS),
                "attempt_backoff_s": 0,
            },
        )
        store = await SqliteStore.open(cfg.store.path)
        pool = ConnectionPool()
        try:
            runner = AgentRunner.build(cfg, store, pool)
            supervisor = Supervisor(cfg, store, worker=Worker(cfg, store, agent=runner, pool=pool), pool=pool)
            async with anyio.create_task_group() as tg:
                tg.start_soon(supervisor.run)
                with anyio.fail_after(30):
                    # Several short TTLs pass: only the refreshes keep the server delivering.
                    await wait_refreshes(supervisor, store, "tickets", 5)
                upstream = TicketStore(demo.db)
                try:
                    upstream.create(
                        [("support", "P2", f"webhook ticket {n}", "", "amy@example.com") for n in range(3)]
                    )
                finally:
                    upstream.close()
                with anyio.fail_after(30):
                    await fake.wait_for_requests(3, timeout=30)
                    while store.core.state_counts()["done"] < 3:
                        await supervisor.routes.wait_binds(supervisor.routes.binds + 1)
                    # One more refresh: its cursor is the watermark after every delivery was acknowledged.
                    record = store.core.webhook("tickets")
                    assert record is not None
                    await wait_refreshes(supervisor, store, "tickets", record.refreshes + 1)
                tg.cancel_scope.cancel()
            [row] = store.core.subscriptions()
            assert row["mode"] == "webhook"  # auto picked it: [webhook] is configured and the type offers it
            # Several deliveries are in flight at once: arrival order is best effort (the spec says so).
            assert sorted(store.core.event_ids("tickets")) == ["T-000001", "T-000002", "T-000003"]
            assert (row["events_received"], row["duplicates"]) == (3, 0)
            assert row["cursor"] == "3"
            webhook = row["webhook"]
            assert webhook["id"].startswith("sub_") and webhook["refreshes"] >= 5
            assert webhook["url"] == f"https://127.0.0.1:{port}/hooks/tickets"
            assert webhook["delivery_status"]["active"] is True
            runs = [r for e in store.core.find_events("T-000002") for r in e["runs"]]
            assert [r["status"] for r in runs] == ["completed"]
            assert supervisor.receiver is not None and supervisor.receiver.counts["verifications"] == 1
        finally:
            await store.close()


async def test_a_restart_keeps_the_subscription_and_removing_it_from_the_config_unsubscribes_it(
    tmp_path: Path, tls: Tls
) -> None:
    port = free_port()
    async with webhook_demo(tmp_path, tls, ttl_ms=60_000) as demo:
        with_tickets = config(tmp_path, demo, tls, port, subscriptions=[TICKETS])
        ids = []
        for _ in range(2):  # a start, then a restart with the same config
            async with delivering(with_tickets) as (store, supervisor):
                with anyio.fail_after(30):
                    await wait_refreshes(supervisor, store, "tickets", len(ids) + 1)
                record = store.core.webhook("tickets")
                assert record is not None
                ids.append(record.webhook_id)
                assert store.core.to_unsubscribe() == []
        assert ids[0] == ids[1]  # the same server-side subscription, refreshed

        without = config(tmp_path, demo, tls, port, subscriptions=[], webhook=False)
        store = await SqliteStore.open(without.store.path)
        try:
            with anyio.fail_after(30):
                # Only the clean-up has to happen: the run ends once the server is told.
                await Supervisor(without, store).run()
            assert store.core.to_unsubscribe() == []
            assert store.core.retired_webhook_ids() == {ids[0]}
            assert store.core.webhook("tickets") is None
        finally:
            await store.close()

        async with ServerConnection("demo", without.servers["demo"]) as conn:
            with pytest.raises(EventsCallError) as gone:
                await conn.unsubscribe(
                    "ticket.created", {}, f"https://127.0.0.1:{port}/hooks/tickets", subscription="tickets"
                )
        assert gone.value.code == protocol.NOT_FOUND  # the server no longer has it

    # Added back, to a restarted server (which verifies the endpoint again): the server derives the
    # same id from the same key, and the receiver takes it as live, not as the retired one.
    async with webhook_demo(tmp_path, tls, ttl_ms=60_000) as demo:
        with_tickets = config(tmp_path, demo, tls, port, subscriptions=[TICKETS])
        async with delivering(with_tickets) as (store, supervisor):
            with anyio.fail_after(30):
                await wait_refreshes(supervisor, store, "tickets", 1)
            record = store.core.webhook("tickets")
            assert record is not None and record.webhook_id == ids[0]
            assert store.core.retired_webhook_ids() == set()
            assert store.core.to_unsubscribe() == []  # nothing would unsubscribe the live one
            await ticket_arrives(demo, store, supervisor, "after coming back")
            assert supervisor.receiver is not None
            assert supervisor.receiver.counts["rejected_410"] == 0


async def test_a_rotated_secret_goes_out_on_the_next_refresh_and_deliveries_keep_verifying(
    tmp_path: Path, tls: Tls, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    install_redaction(caplog.handler)  # as `agentwake run` does for its own handlers
    port = free_port()
    async with webhook_demo(tmp_path, tls) as demo:
        cfg = config(tmp_path, demo, tls, port, subscriptions=[TICKETS])
        async with delivering(cfg) as (store, supervisor):
            with anyio.fail_after(30):
                await wait_refreshes(supervisor, store, "tickets", 1)
                before = store.core.webhook("tickets")
                assert before is not None
                # What `agentwake rotate-secret tickets` does, from another connection to the file.
                cli_store = SqliteCore.open(cfg.store.path, create=False)
                try:
                    assert cli_store.request_rotation(["tickets"], signing.generate_secret) == ["tickets"]
                finally:
                    cli_store.close()
                while (after := store.core.webhook("tickets")) is None or after.secret == before.secret:
                    await supervisor.routes.wait_binds(supervisor.routes.binds + 1)
            assert after.previous_secret == before.secret and after.pending_secret is None
            assert after.webhook_id == before.webhook_id
            await ticket_arrives(demo, store, supervisor, "after the rotation")
            assert store.core.event_ids("tickets") == ["T-000001"]
            # No secret, old or new, in any log line (DEBUG included, where the SDK logs each request).
            for secret in (before.secret, after.secret):
                assert secret.removeprefix("whsec_") not in caplog.text
            assert "whsec_" not in caplog.text


async def test_a_terminated_envelope_ends_the_subscription_and_its_id_is_refused_from_then_on(
    tmp_path: Path, tls: Tls
) -> None:
    port = free_port()
    context = ssl.create_default_context(cafile=str(tls.ca))
    async with webhook_demo(tmp_path, tls, ttl_ms=60_000) as demo:
        cfg = config(tmp_path, demo, tls, port, subscriptions=[TICKETS])
        async with delivering(cfg) as (store, supervisor):
            with anyio.fail_after(30):
                await wait_refreshes(supervisor, store, "tickets", 1)
            record = store.core.webhook("tickets")
            assert record is not None and record.webhook_id is not None
            # Signed as the server signs it: the subscription's own secret.
            envelope = {
                "type": "terminated",
                "error": {"code": -32012, "message": "Forbidden", "data": {"reason": "access revoked"}},
            }
            assert await post_signed(port, context, record, "msg_terminated_1", envelope) == 204
            [row] = store.core.subscriptions()
            assert row["status"] == "ended"
            assert "access revoked" in row["last_error"]
            assert store.core.webhook("tickets") is None
            late = {
                "eventId": "T-9",
                "name": "ticket.created",
                "timestamp": "2026-12-02T00:00:00Z",
                "data": {},
            }
            assert await post_signed(port, context, record, "T-9", late) == 410
            assert store.core.event_ids("tickets") == []
            assert store.core.to_unsubscribe() == []  # the server already dropped it


class TerminatedDuringRefresh(SqliteStore):
    """A store that lets a terminated envelope reach the receiver while a refresh stores its cursor.

    ``written`` is set as that write returns; the refresh goes on without yielding to bind its
    route or not, so a task woken by it sees the outcome.
    """

    envelope: Callable[[], Awaitable[None]] | None = None
    written: anyio.Event | None = None

    async def ingest(self, key: Any, events: Any, cursor: Any, **kwargs: Any) -> Any:
        envelope, self.envelope = self.envelope, None
        if envelope is not None:
            await envelope()
        result = await super().ingest(key, events, cursor, **kwargs)
        if envelope is not None and self.written is not None:
            self.written.set()
        return result


async def test_a_terminated_envelope_during_a_refresh_leaves_the_id_refused_not_routed_again(
    tmp_path: Path, tls: Tls
) -> None:
    port = free_port()
    context = ssl.create_default_context(cafile=str(tls.ca))
    async with webhook_demo(tmp_path, tls, ttl_ms=1500) as demo:
        cfg = config(tmp_path, demo, tls, port, subscriptions=[TICKETS])
        store = await TerminatedDuringRefresh.open(cfg.store.path)
        assert isinstance(store, TerminatedDuringRefresh)
        try:
            supervisor = Supervisor(cfg, store)
            async with anyio.create_task_group() as tg:
                tg.start_soon(supervisor.run)
                with anyio.fail_after(30):
                    await wait_refreshes(supervisor, store, "tickets", 1)
                record = store.core.webhook("tickets")
                assert record is not None and record.webhook_id is not None
                envelope = {"type": "terminated", "error": {"code": -32012, "message": "Forbidden"}}

                async def terminate() -> None:
                    assert await post_signed(port, context, record, "msg_terminated_1", envelope) == 204

                store.written = anyio.Event()
                store.envelope = terminate  # the next refresh (within the 1.5 s grant) meets it
                with anyio.fail_after(30):
                    await store.written.wait()
                assert supervisor.routes.lookup(record.webhook_id) is None
                assert supervisor.routes.is_retired(record.webhook_id)
                late = {
                    "eventId": "T-9",
                    "name": "ticket.created",
                    "timestamp": "2026-12-02T00:00:00Z",
                    "data": {},
                }
                assert await post_signed(port, context, record, "T-9", late) == 410
                tg.cancel_scope.cancel()
        finally:
            await store.close()


async def post_signed(
    port: int, context: ssl.SSLContext, record: WebhookRecord, msg_id: str, document: dict[str, Any]
) -> int:
    assert record.webhook_id is not None
    body = json.dumps(document).encode()
    stamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        signing.HEADER_ID: msg_id,
        signing.HEADER_TIMESTAMP: str(stamp),
        signing.HEADER_SIGNATURE: signing.sign([signing.decode_secret(record.secret)], msg_id, stamp, body),
        signing.HEADER_SUBSCRIPTION: record.webhook_id,
    }
    async with aiohttp.ClientSession() as http:
        url = f"https://127.0.0.1:{port}/hooks/tickets"
        async with http.post(url, data=body, headers=headers, ssl=context) as reply:
            return reply.status


async def test_webhook_over_an_unauthenticated_connection_ends_with_a_clear_forbidden_message(
    tmp_path: Path, tls: Tls
) -> None:
    port = free_port()
    server = demo_stdio(tmp_path / "demo.db", DEMO_WEBHOOK_TTL_MS="60000", DEMO_WEBHOOK_ALLOW="127.0.0.0/8")
    cfg = parse_config(
        {
            "store": {"path": str(tmp_path / "aw.db")},
            "webhook": {
                "listen": f"127.0.0.1:{port}",
                "public_url": f"https://127.0.0.1:{port}",
                "tls_cert": str(tls.cert),
                "tls_key": str(tls.cert),
            },
            "servers": {"demo": server.model_dump(exclude_defaults=True, mode="json")},
            "subscriptions": [{**TICKETS, "delivery": "webhook"}],
        },
        env={},
    )
    async with delivering(cfg) as (store, supervisor):
        with anyio.fail_after(30):
            # stdio carries no principal, and webhook delivery needs one.
            await supervisor.wait_ended("tickets")
        [row] = store.core.subscriptions()
    assert row["status"] == "ended"
    assert "subscription 'tickets'" in row["last_error"]
    assert "refused the webhook subscription (Forbidden" in row["last_error"]
    assert "needs an authenticated connection" in row["last_error"]
