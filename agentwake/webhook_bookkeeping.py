"""Webhook bookkeeping: retiring the webhook subscriptions the config no longer wants, and unsubscribing them.

A webhook subscription is retired when its subscription leaves the config, moves (server, event,
arguments or callback url changed) or stops using webhook delivery, or when the server terminates
it; a retired one is unsubscribed on its server at the next connection, and one the server will
not drop shows ``lingering``. A mixin of ``agentwake.supervisor.Supervisor``, whose config, store,
routes and ended subscriptions it shares.
"""

from __future__ import annotations

import logging

from agentwake import protocol
from agentwake.config import AgentwakeConfig, SubscriptionConfig
from agentwake.delivery.common import subscription_key
from agentwake.delivery.routes import WebhookRoutes
from agentwake.delivery.select import SubscriptionPlan
from agentwake.errors import EventsCallError, TransientEventsError
from agentwake.logs import event_fields
from agentwake.mcp import ServerConnection
from agentwake.store import Store

# The supervisor's name, as before the split: each log line names its logger.
logger = logging.getLogger("agentwake.supervisor")


class WebhookBookkeeping:
    """The supervisor's webhook bookkeeping; the attributes are the supervisor's."""

    config: AgentwakeConfig
    store: Store
    routes: WebhookRoutes
    _ended: set[str]

    async def _end(self, sub: SubscriptionConfig, reason: str) -> None:
        raise NotImplementedError  # the supervisor's: the subscription stops, for good

    async def _retire_unconfigured_webhooks(self) -> None:
        """Webhook subscriptions whose subscription left the config (or moved) are retired, to be unsubscribed.

        A restart with the same config retires nothing: the refresh picks up where it was.
        """
        configured = {s.name: s for s in self.config.subscriptions}
        for record in await self.store.webhooks():
            sub = configured.get(record.subscription)
            if sub is None:
                reason = "removed from the config"
            elif self.config.webhook is None:
                reason = "the config has no [webhook] section any more"
            elif not record.same_key(subscription_key(sub), self.config.webhook.callback_url(sub.name)):
                reason = "its server, event, arguments or callback url changed"
            else:
                continue
            await self._retire(record.subscription, reason)

    async def _retire(self, name: str, reason: str, *, unsubscribed: bool = False) -> None:
        record = await self.store.retire_webhook(name, reason, unsubscribed=unsubscribed)
        self.routes.unbind(name)
        if record is not None and record.webhook_id is not None:
            self.routes.retire(record.webhook_id)
        if record is not None and not unsubscribed:
            logger.info(
                "subscription %s: webhook subscription retired (%s); unsubscribing it",
                name,
                reason,
                extra=event_fields(subscription=name),
            )

    async def _on_terminated(self, name: str, error: dict[str, object]) -> None:
        """A ``terminated`` envelope: the server dropped the subscription; it ends here too."""
        data = error.get("data")
        detail = data.get("reason") if isinstance(data, dict) else None
        reason = f"{error.get('message') or 'terminated'} ({error.get('code')})" + (
            f": {detail}" if detail else ""
        )
        await self._retire(name, f"terminated by the server: {reason}", unsubscribed=True)
        sub = next((s for s in self.config.subscriptions if s.name == name), None)
        if sub is not None:
            await self._end(sub, f"the server ended the webhook subscription: {reason}")
        self.routes.end(name, reason)

    async def _unsubscribe_stale(
        self, server: str, conn: ServerConnection, plans: list[SubscriptionPlan]
    ) -> None:
        """Retire this server's webhook subscriptions that no planned subscription uses, then unsubscribe them."""
        webhook = self.config.webhook
        planned = {p.subscription.name: p.subscription for p in plans if p.mode == "webhook"}
        for record in await self.store.webhooks():
            if record.server != server:
                continue
            sub = planned.get(record.subscription)
            if sub is None:
                await self._retire(record.subscription, "the subscription no longer uses webhook delivery")
            elif webhook is not None and not record.same_key(
                subscription_key(sub), webhook.callback_url(sub.name)
            ):
                await self._retire(record.subscription, "its event, arguments or callback url changed")
        for retired in await self.store.to_unsubscribe(server):
            try:
                await conn.unsubscribe(
                    retired.event, retired.arguments, retired.url, subscription=retired.subscription
                )
            except TransientEventsError as exc:
                logger.warning(
                    "subscription %s: events/unsubscribe failed, retrying later: %s",
                    retired.subscription,
                    exc,
                    extra=event_fields(subscription=retired.subscription),
                )
                await self.store.record_error(
                    retired.subscription, f"events/unsubscribe failed, retrying at the next connection: {exc}"
                )
                continue
            except EventsCallError as exc:
                if exc.code != protocol.NOT_FOUND:
                    lapse = (
                        "it lapses at its TTL, or, if it was granted no expiry, stays until it is"
                        " removed on the server"
                    )
                    logger.warning(
                        "subscription %s: events/unsubscribe refused (%s); %s",
                        retired.subscription,
                        exc,
                        lapse,
                        extra=event_fields(subscription=retired.subscription),
                    )
                    await self._note_lingering(
                        retired.subscription, f"events/unsubscribe refused by the server: {exc}; {lapse}"
                    )
            else:
                logger.info(
                    "subscription %s: webhook unsubscribed on server %s (%s)",
                    retired.subscription,
                    server,
                    retired.url,
                    extra=event_fields(subscription=retired.subscription),
                )
                if not any(s.name == retired.subscription for s in self.config.subscriptions):
                    await self.store.set_state(retired.subscription, status="unsubscribed")
            await self.store.mark_unsubscribed(retired.id)

    async def _note_lingering(self, name: str, reason: str) -> None:
        """A webhook subscription the server would not drop: ``status`` says so.

        A subscription still running under another key keeps its own state (its loop
        reports it); the refusal stays in its recent errors.
        """
        running = any(s.name == name for s in self.config.subscriptions) and name not in self._ended
        if running:
            await self.store.record_error(name, reason)
        else:
            await self.store.set_state(name, status="lingering", error=reason)
