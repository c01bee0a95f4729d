"""A webhook subscription the server forgot is found out within ``[webhook] max_refresh_s``, and each
refresh's deliveryStatus reaches `status` and the metrics.

The server here is hand-written and minimal: the events/subscribe of the spec, holding subscriptions
in a dict that ``restart()`` empties (a restart with a fresh store). A refresh of a key it holds is
answered with its deliveryStatus; one it does not hold creates the subscription anew, as the spec
says, and is answered without one. It grants an hour whatever is asked, so only the bound on the
refresh interval can bring the subscription back soon.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentwake import metrics, protocol
from agentwake.config import SubscriptionConfig, WebhookConfig
from agentwake.delivery.routes import WebhookRoutes
from agentwake.delivery.webhook import WebhookLoop
from agentwake.store import Store
from agentwake.store.sqlite import SqliteStore

pytestmark = pytest.mark.anyio
WAIT = 10.0
GRANT = timedelta(hours=1)


@dataclass
class ForgetfulServer:
    """events/subscribe only; subscriptions live in memory and ``restart()`` loses them."""

    held: dict[str, dict[str, Any]] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=lambda: {"active": True, "lastError": None})
    calls: int = 0
    changed: anyio.Event = field(default_factory=anyio.Event)

    def restart(self) -> None:
        self.held.clear()

    async def subscribe(self, params: dict[str, Any], *, subscription: str) -> protocol.SubscribeResult:
        self.calls += 1
        key = params["delivery"]["url"]
        refresh_before = (datetime.now(UTC) + GRANT).isoformat().replace("+00:00", "Z")
        existing = self.held.get(key)
        self.held[key] = {"cursor": params.get("cursor") or "c0"}
        document: dict[str, Any] = {"id": "sub_forgetful", "refreshBefore": refresh_before, "cursor": "c0"}
        if existing is not None:
            document["deliveryStatus"] = dict(self.status)
        event, self.changed = self.changed, anyio.Event()
        event.set()
        return protocol.SubscribeResult.model_validate(document)

    async def until(self, predicate: Any) -> None:
        with anyio.fail_after(WAIT):
            while not predicate():
                await self.changed.wait()


@asynccontextmanager
async def refreshing(tmp_path: Path, server: ForgetfulServer, **webhook: Any) -> AsyncIterator[Store]:
    store = await SqliteStore.open(tmp_path / "aw.db")
    loop = WebhookLoop(
        subscription=SubscriptionConfig.model_validate(
            {"name": "tickets", "server": "forgetful", "event": "ticket.created", "delivery": "webhook"}
        ),
        connection=server,  # type: ignore[arg-type]  # only subscribe() is used
        store=store,
        routes=WebhookRoutes(),
        config=WebhookConfig(public_url="https://hooks.example.com/aw", **webhook),
    )
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(loop.run)
            yield store
            tg.cancel_scope.cancel()
    finally:
        await store.close()


def test_max_refresh_s_defaults_to_a_few_minutes_and_is_a_config_setting() -> None:
    assert WebhookConfig(public_url="https://h.example").max_refresh_s == 300
    assert WebhookConfig(public_url="https://h.example", max_refresh_s=60).max_refresh_s == 60


async def test_a_subscription_the_server_forgot_is_subscribed_again_within_max_refresh_s(
    tmp_path: Path,
) -> None:
    server = ForgetfulServer()
    async with refreshing(tmp_path, server, max_refresh_s=1):
        await server.until(lambda: server.held)
        server.restart()  # within one refresh interval, with an hour's grant
        await server.until(lambda: server.held)  # came back through a refresh, not in 30-45 min
    assert server.calls == 2


async def test_each_refreshs_delivery_status_reaches_status_and_the_metrics(tmp_path: Path) -> None:
    server = ForgetfulServer()
    server.status = {
        "active": False,
        "lastError": "connection_refused",
        "failedSince": "2026-02-19T15:50:00Z",
        "throttled": True,
        "retryAfterMs": 60000,
    }
    async with refreshing(tmp_path, server, max_refresh_s=1) as store:
        # The third call comes after the second one's answer was stored and noted.
        await server.until(lambda: server.calls >= 3)
        (row,) = store.core.subscriptions()
        record = store.core.webhook("tickets")
        assert record is not None and record.delivery_status == server.status
    assert row["status"] == "active"
    assert "suspended, last error connection_refused" in row["last_error"]
    assert "throttled for about 60000 ms" in row["last_error"]
    sample = metrics.REGISTRY.get_sample_value
    assert sample("agentwake_webhook_delivery_active", {"subscription": "tickets"}) == 0
    assert (
        sample(
            "agentwake_webhook_delivery_error", {"subscription": "tickets", "category": "connection_refused"}
        )
        == 1
    )
    assert sample("agentwake_webhook_throttled", {"subscription": "tickets"}) == 1
    assert sample("agentwake_webhook_retry_after_seconds", {"subscription": "tickets"}) == 60
