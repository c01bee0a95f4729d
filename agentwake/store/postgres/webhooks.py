"""Webhook subscriptions: the key each was subscribed under, its secrets (held in clear: the receiver
verifies HMACs with them; access to the database guards them), the server-derived id, and the retired
ones to unsubscribe."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from agentwake.clock import now_iso
from agentwake.store.postgres.base import PostgresBase
from agentwake.store.postgres.owners import check_fence
from agentwake.store.records import RetiredWebhook, SubscriptionKey, WebhookRecord
from agentwake.store.rows import (
    WEBHOOK_COLUMNS,
    retired_values,
    retired_webhook,
    subscribed_params,
    webhook_record,
)


async def _load(conn: psycopg.AsyncConnection[Any], name: str, *, lock: bool = False) -> WebhookRecord | None:
    cur = await conn.execute(
        f"SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE subscription = %s{' FOR UPDATE' if lock else ''}",
        [name],
    )
    row = await cur.fetchone()
    return None if row is None else webhook_record(row)


async def _retire(
    conn: psycopg.AsyncConnection[Any], record: WebhookRecord, reason: str, *, unsubscribed: bool
) -> None:
    now = now_iso()
    await conn.execute(
        "INSERT INTO webhooks_retired (subscription, server, event, arguments, url, webhook_id, reason,"
        " retired_at, unsubscribed_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        retired_values(record, reason, now, unsubscribed=unsubscribed),
    )
    await conn.execute("DELETE FROM webhooks WHERE subscription = %s", [record.subscription])


class Webhooks(PostgresBase):
    async def webhook(self, name: str) -> WebhookRecord | None:
        async with self.transaction() as conn:
            return await _load(conn, name)

    async def webhooks(self) -> list[WebhookRecord]:
        async with self.transaction() as conn:
            cur = await conn.execute(f"SELECT {WEBHOOK_COLUMNS} FROM webhooks ORDER BY subscription")
            return [webhook_record(row) for row in await cur.fetchall()]

    async def prepare_webhook(self, key: SubscriptionKey, url: str, new_secret: str) -> WebhookRecord:
        """The stored webhook of this subscription, or a new one with ``new_secret``.

        A row stored under another key (server, event, arguments or url changed) is a
        different server-side subscription: it is retired, to be unsubscribed, and a
        fresh row with a fresh secret takes its place.
        """
        async with self.transaction() as conn:
            current = await _load(conn, key.name, lock=True)
            if current is not None and current.same_key(key, url):
                return current
            if current is not None:
                await _retire(
                    conn, current, "its server, event, arguments or callback url changed", unsubscribed=False
                )
            # Another process preparing the same new subscription at once: the first row stays.
            await conn.execute(
                "INSERT INTO webhooks (subscription, server, event, arguments, url, secret, created_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (subscription) DO NOTHING",
                [key.name, key.server, key.event, key.arguments_json, url, new_secret, now_iso()],
            )
            record = await _load(conn, key.name)
            assert record is not None
            return record

    async def webhook_subscribed(
        self,
        name: str,
        *,
        webhook_id: str,
        sent_secret: str,
        refresh_before: str | None,
        delivery_status: dict[str, Any] | None,
        previous_until: str,
        fence: int | None = None,
    ) -> WebhookRecord | None:
        """Record a successful subscribe or refresh; None if the subscription was retired meanwhile.

        If it carried a new secret (a rotation), that secret becomes current and the
        old one is kept as previous until ``previous_until``; a newer pending secret
        (rotated again meanwhile) stays pending for the next refresh.
        With a ``fence``, nothing is written unless it is the subscription's (FencedOut).
        """
        now = now_iso()
        async with self.transaction() as conn:
            await check_fence(conn, name, fence)
            await conn.execute(
                "UPDATE webhooks SET"
                " previous_secret = CASE WHEN secret = %(sent)s THEN previous_secret ELSE secret END,"
                " previous_until = CASE WHEN secret = %(sent)s THEN previous_until ELSE %(until)s END,"
                " secret = %(sent)s,"
                " pending_secret = CASE WHEN pending_secret = %(sent)s THEN NULL ELSE pending_secret END,"
                " webhook_id = %(id)s, refresh_before = %(refresh)s, no_expiry = %(no_expiry)s,"
                " delivery_status = %(status)s, refreshes = refreshes + 1, last_refresh_at = %(now)s"
                " WHERE subscription = %(name)s",
                subscribed_params(
                    name, webhook_id, sent_secret, refresh_before, delivery_status, previous_until, now
                ),
            )
            record = await _load(conn, name)
            if record is not None:
                # The server derives the id from the key: a key subscribed again (removed from the
                # config and added back) gets a retired id back. It is live now: no more 410s for it,
                # and no pending events/unsubscribe, which would end this very subscription.
                await conn.execute(
                    "UPDATE webhooks_retired SET webhook_id = NULL,"
                    " unsubscribed_at = coalesce(unsubscribed_at, %s) WHERE webhook_id = %s",
                    [now, webhook_id],
                )
            return record

    async def request_rotation(
        self, names: Sequence[str] | None, make_secret: Callable[[], str]
    ) -> list[str]:
        """Give each named webhook subscription (all, with None) a pending secret; returns the names."""
        async with self.transaction() as conn:
            cur = await conn.execute("SELECT subscription FROM webhooks ORDER BY subscription FOR UPDATE")
            chosen = [r[0] for r in await cur.fetchall() if names is None or r[0] in names]
            for name in chosen:
                await conn.execute(
                    "UPDATE webhooks SET pending_secret = %s WHERE subscription = %s", [make_secret(), name]
                )
            return chosen

    async def retire_webhook(self, name: str, reason: str, *, unsubscribed: bool) -> WebhookRecord | None:
        """Stop using a webhook subscription: its id answers 410 from now on.

        ``unsubscribed`` says the server already dropped it (terminated, or it never
        existed); otherwise it waits in the retired table for events/unsubscribe.
        """
        async with self.transaction() as conn:
            record = await _load(conn, name, lock=True)
            if record is not None:
                await _retire(conn, record, reason, unsubscribed=unsubscribed)
            return record

    async def to_unsubscribe(self, server: str | None = None) -> list[RetiredWebhook]:
        """Retired webhook subscriptions not yet unsubscribed (of one server, or all)."""
        where, args = "unsubscribed_at IS NULL", []
        if server is not None:
            where, args = where + " AND server = %s", [server]
        async with self.transaction() as conn:
            cur = await conn.execute(
                "SELECT id, subscription, server, event, arguments, url, webhook_id FROM webhooks_retired"
                f" WHERE {where} ORDER BY id",
                args,
            )
            rows = await cur.fetchall()
        return [retired_webhook(r) for r in rows]

    async def mark_unsubscribed(self, retired_id: int) -> None:
        async with self.transaction() as conn:
            await conn.execute(
                "UPDATE webhooks_retired SET unsubscribed_at = %s WHERE id = %s", [now_iso(), retired_id]
            )

    async def retired_webhook_ids(self) -> set[str]:
        async with self.transaction() as conn:
            cur = await conn.execute("SELECT webhook_id FROM webhooks_retired WHERE webhook_id IS NOT NULL")
            return {r[0] for r in await cur.fetchall()}
