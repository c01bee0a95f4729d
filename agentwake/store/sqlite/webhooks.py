"""Webhook subscriptions: the key each was subscribed under, its secrets (held in clear: the receiver
verifies HMACs with them; the file is 0600), the server-derived id, and the retired ones to unsubscribe."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agentwake.clock import now_iso
from agentwake.store.records import RetiredWebhook, SubscriptionKey, WebhookRecord
from agentwake.store.rows import (
    WEBHOOK_COLUMNS,
    retired_values,
    retired_webhook,
    subscribed_params,
    webhook_record,
)
from agentwake.store.sqlite.base import SqliteBase
from agentwake.store.sqlite.owners import check_fence


class Webhooks(SqliteBase):
    def webhook(self, name: str) -> WebhookRecord | None:
        row = self.conn.execute(
            f"SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE subscription = ?", [name]
        ).fetchone()
        return None if row is None else webhook_record(row)

    def webhooks(self) -> list[WebhookRecord]:
        rows = self.conn.execute(f"SELECT {WEBHOOK_COLUMNS} FROM webhooks ORDER BY subscription")
        return [webhook_record(row) for row in rows.fetchall()]

    def prepare_webhook(self, key: SubscriptionKey, url: str, new_secret: str) -> WebhookRecord:
        """The stored webhook of this subscription, or a new one with ``new_secret``.

        A row stored under another key (server, event, arguments or url changed) is a
        different server-side subscription: it is retired, to be unsubscribed, and a
        fresh row with a fresh secret takes its place.
        """
        with self.transaction():
            current = self.webhook(key.name)
            if current is not None and current.same_key(key, url):
                return current
            if current is not None:
                self._retire(
                    current, "its server, event, arguments or callback url changed", unsubscribed=False
                )
            now = now_iso()
            self.conn.execute(
                "INSERT INTO webhooks (subscription, server, event, arguments, url, secret, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [key.name, key.server, key.event, key.arguments_json, url, new_secret, now],
            )
            record = self.webhook(key.name)
            assert record is not None
            return record

    def webhook_subscribed(
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
        with self.transaction():
            check_fence(self.conn, name, fence)
            self.conn.execute(
                "UPDATE webhooks SET"
                " previous_secret = CASE WHEN secret = :sent THEN previous_secret ELSE secret END,"
                " previous_until = CASE WHEN secret = :sent THEN previous_until ELSE :until END,"
                " secret = :sent,"
                " pending_secret = CASE WHEN pending_secret = :sent THEN NULL ELSE pending_secret END,"
                " webhook_id = :id, refresh_before = :refresh, no_expiry = :no_expiry,"
                " delivery_status = :status, refreshes = refreshes + 1, last_refresh_at = :now"
                " WHERE subscription = :name",
                subscribed_params(
                    name, webhook_id, sent_secret, refresh_before, delivery_status, previous_until, now
                ),
            )
            record = self.webhook(name)
            if record is not None:
                # The server derives the id from the key: a key subscribed again (removed from the
                # config and added back) gets a retired id back. It is live now: no more 410s for it,
                # and no pending events/unsubscribe, which would end this very subscription.
                self.conn.execute(
                    "UPDATE webhooks_retired SET webhook_id = NULL, unsubscribed_at = coalesce(unsubscribed_at, ?)"
                    " WHERE webhook_id = ?",
                    [now, webhook_id],
                )
            return record

    def request_rotation(self, names: Sequence[str] | None, make_secret: Callable[[], str]) -> list[str]:
        """Give each named webhook subscription (all, with None) a pending secret; returns the names."""
        with self.transaction():
            rows = self.conn.execute("SELECT subscription FROM webhooks ORDER BY subscription").fetchall()
            chosen = [r[0] for r in rows if names is None or r[0] in names]
            for name in chosen:
                self.conn.execute(
                    "UPDATE webhooks SET pending_secret = ? WHERE subscription = ?", [make_secret(), name]
                )
            return chosen

    def _retire(self, record: WebhookRecord, reason: str, *, unsubscribed: bool) -> None:
        now = now_iso()
        self.conn.execute(
            "INSERT INTO webhooks_retired (subscription, server, event, arguments, url, webhook_id, reason,"
            " retired_at, unsubscribed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            retired_values(record, reason, now, unsubscribed=unsubscribed),
        )
        self.conn.execute("DELETE FROM webhooks WHERE subscription = ?", [record.subscription])

    def retire_webhook(self, name: str, reason: str, *, unsubscribed: bool) -> WebhookRecord | None:
        """Stop using a webhook subscription: its id answers 410 from now on.

        ``unsubscribed`` says the server already dropped it (terminated, or it never
        existed); otherwise it waits in the retired table for events/unsubscribe.
        """
        with self.transaction():
            record = self.webhook(name)
            if record is not None:
                self._retire(record, reason, unsubscribed=unsubscribed)
            return record

    def to_unsubscribe(self, server: str | None = None) -> list[RetiredWebhook]:
        """Retired webhook subscriptions not yet unsubscribed (of one server, or all)."""
        where, args = "unsubscribed_at IS NULL", []
        if server is not None:
            where, args = where + " AND server = ?", [server]
        rows = self.conn.execute(
            "SELECT id, subscription, server, event, arguments, url, webhook_id FROM webhooks_retired"
            f" WHERE {where} ORDER BY id",
            args,
        ).fetchall()
        return [retired_webhook(r) for r in rows]

    def mark_unsubscribed(self, retired_id: int) -> None:
        with self.transaction():
            self.conn.execute(
                "UPDATE webhooks_retired SET unsubscribed_at = ? WHERE id = ?", [now_iso(), retired_id]
            )

    def retired_webhook_ids(self) -> set[str]:
        rows = self.conn.execute("SELECT webhook_id FROM webhooks_retired WHERE webhook_id IS NOT NULL")
        return {r[0] for r in rows.fetchall()}
