"""A former owner's late ``register`` and ``webhook_subscribed`` write nothing (issue 30).

Two ``PostgresStore`` instances on one database are two processes as far as the store knows. Process
"a" drives a subscription under fence 1 and pauses past its lease; "b" takes it over (fence 2) under a
changed config and stores past it. "a"'s delivery loop then registers the subscription under its old
config (which would drop "b"'s cursor) or records its subscribe's answer (which would overwrite "b"'s
webhook id and secrets): the store refuses both (``FencedOut``), and the loop ends as a loop fenced
out of ``ingest`` does: this process stops driving the subscription until a round gives it back.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from _postgres import postgres_server, postgres_url  # noqa: F401 - fixtures, found by pytest by name

from agentwake import protocol
from agentwake.config import SubscriptionConfig, WebhookConfig, parse_config
from agentwake.delivery.common import subscription_key
from agentwake.delivery.poll import PollLoop
from agentwake.delivery.routes import WebhookRoutes
from agentwake.delivery.webhook import WebhookLoop
from agentwake.ownership import LeaseManager
from agentwake.store import IncomingEvent
from agentwake.store.postgres import PostgresStore
from agentwake.supervisor import Supervisor

pytestmark = pytest.mark.anyio

LEASE_S = 0.6
FAR: tuple[str, str] = ("2999-01-01T00:00:00.000Z", "2998-01-01T00:00:00.000Z")  # until, now
OLD_ARGS = {"queue": "support"}
NEW_ARGS = {"queue": "billing"}
URL = "https://hooks.example.com/aw"


@pytest.fixture
async def stores(postgres_url: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:  # noqa: F811
    """Two stores on one database: two processes."""
    first = await PostgresStore.open(postgres_url)
    second = await PostgresStore.open(postgres_url)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


def subscription(delivery: str, arguments: dict[str, Any]) -> SubscriptionConfig:
    return SubscriptionConfig.model_validate(
        {
            "name": "tickets",
            "server": "demo",
            "event": "ticket.created",
            "delivery": delivery,
            "arguments": arguments,
        }
    )


def supervisor_of(store: PostgresStore, url: str) -> tuple[Supervisor, LeaseManager]:
    """A supervisor whose ``_run_loop`` drives the loops under ``store``'s leases ("a")."""
    config = parse_config(
        {
            "store": {"url": url, "lease_s": LEASE_S},
            "servers": {"demo": {"command": "demo"}},
            "subscriptions": [{"name": "tickets", "server": "demo", "event": "ticket.created"}],
        }
    )
    owners = LeaseManager(store, lambda: ["tickets"], LEASE_S)
    return Supervisor(config, store, ownership=owners), owners


async def take_over(a: LeaseManager, b: PostgresStore) -> int:
    """Behind "a"'s back (as after a pause past its lease), "b" holds the subscription; its fence."""
    await b.release_subscriptions(a.owner)
    held = await b.hold_subscriptions("b", ["tickets"], *FAR)
    return held["tickets"]


class Unreachable:
    """A server connection the loop must not get to: the fenced write comes first."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the loop used its connection ({name}) after it was fenced out")


async def test_a_former_owners_late_register_drops_nothing_and_ends_its_loop(
    stores: tuple[PostgresStore, PostgresStore],
    postgres_url: str,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agentwake")
    first, second = stores
    old = subscription_key(subscription("poll", OLD_ARGS))
    await first.register(old)
    supervisor, a = supervisor_of(first, postgres_url)
    await a.round()
    assert a.held() == {"tickets": 1}
    # "b" took over under a changed config (another queue) and stored its cursor.
    fence = await take_over(a, second)
    new = subscription_key(subscription("poll", NEW_ARGS))
    assert await second.register(new, fence=fence) is None
    await second.ingest(
        new, [IncomingEvent("E-1", new.event, "2026-12-03T08:00:00.000Z", {})], "c1", fence=fence
    )
    before = await second.subscriptions()
    # "a" resumes: its loop, under its old config and fence 1, starts by registering.
    loop = PollLoop(subscription=subscription("poll", OLD_ARGS), connection=Unreachable(), store=first)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(supervisor._run_loop, loop, "poll")
        with anyio.fail_after(5):
            while a.held():  # noqa: ASYNC110 - the loop's task runs meanwhile
                await anyio.sleep(0.01)
        assert "subscription tickets is now driven by another process (fence 2 > 1)" in caplog.text
        tg.cancel_scope.cancel()
    assert await second.subscriptions() == before
    assert await second.cursor("tickets") == "c1"
    assert await second.register(new, fence=fence) == "c1"


class LateAnswer:
    """events/subscribe whose answer comes back after "b" took the subscription over and subscribed."""

    def __init__(self, a: LeaseManager, b: PostgresStore) -> None:
        self.a, self.b = a, b
        self.calls = 0

    async def subscribe(self, params: dict[str, Any], *, subscription: str) -> protocol.SubscribeResult:
        self.calls += 1
        fence = await take_over(self.a, self.b)
        record = await self.b.prepare_webhook(subscription_key(sub_webhook()), URL + "/tickets", "unused")
        await self.b.request_rotation(["tickets"], lambda: "b-secret")
        await self.b.webhook_subscribed(
            "tickets",
            webhook_id="wh-b",
            sent_secret="b-secret",
            refresh_before=None,
            delivery_status=None,
            previous_until="2026-12-03T08:10:00.000Z",
            fence=fence,
        )
        assert record.secret == params["delivery"]["secret"]  # the one "a" sent
        grant = (datetime.now(UTC) + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
        return protocol.SubscribeResult.model_validate({"id": "wh-a", "refreshBefore": grant, "cursor": "c0"})


def sub_webhook() -> SubscriptionConfig:
    return subscription("webhook", OLD_ARGS)


async def test_a_former_owners_late_subscribe_answer_is_not_recorded_and_ends_its_loop(
    stores: tuple[PostgresStore, PostgresStore],
    postgres_url: str,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agentwake")
    first, second = stores
    supervisor, a = supervisor_of(first, postgres_url)
    await first.register(subscription_key(sub_webhook()))
    await a.round()
    server = LateAnswer(a, second)
    loop = WebhookLoop(
        subscription=sub_webhook(),
        connection=server,  # type: ignore[arg-type]  # only subscribe() is used
        store=first,
        routes=WebhookRoutes(),
        config=WebhookConfig(public_url=URL),
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(supervisor._run_loop, loop, "webhook")
        with anyio.fail_after(5):
            while a.held() or server.calls == 0:  # noqa: ASYNC110 - the loop's task runs meanwhile
                await anyio.sleep(0.01)
        assert "subscription tickets is now driven by another process (fence 2 > 1)" in caplog.text
        tg.cancel_scope.cancel()
    assert server.calls == 1
    record = await second.webhook("tickets")
    assert record is not None
    assert (record.webhook_id, record.secret, record.pending_secret, record.refreshes) == (
        "wh-b",
        "b-secret",
        None,
        1,
    )
    assert await second.cursor("tickets") is None
