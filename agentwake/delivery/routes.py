"""The receiver's routing table: which subscription a delivery's X-MCP-Subscription-Id belongs to.

The webhook loops keep it current (bind on every subscribe and refresh, retire what is given up,
announce subscribes in flight); the receiver only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio

from agentwake import signing
from agentwake.store import SubscriptionKey


@dataclass(frozen=True, slots=True)
class Route:
    """Where a subscription id's deliveries go, and the secrets they may be signed with."""

    webhook_id: str
    key: SubscriptionKey
    # (keyed secret, accepted until (epoch seconds) or None for no limit)
    secrets: tuple[tuple[signing.SigningKey, float | None], ...] = field(repr=False)

    def keys(self, now: float) -> list[signing.SigningKey]:
        return [key for key, until in self.secrets if until is None or now < until]


@dataclass(slots=True)
class _InFlight:
    key: SubscriptionKey
    secrets: list[bytes] = field(repr=False)


class WebhookRoutes:
    """The receiver's routing table: subscription id -> route; ids we retired; subscribes in flight.

    The webhook loops keep it current; the receiver only reads it (an in-flight
    subscribe's secret identifies its verification challenge; deliveries wait for
    the id, with 503, until the subscribe response binds it).
    """

    def __init__(self) -> None:
        self._by_id: dict[str, Route] = {}
        self._id_of: dict[str, str] = {}
        # What each subscription was bound with: binding the same again changes nothing.
        self._bound_as: dict[str, tuple[str, SubscriptionKey, tuple[tuple[str, float | None], ...]]] = {}
        self._retired: set[str] = set()
        self._in_flight: dict[str, _InFlight] = {}
        # Subscribes another process sharing the store has under way (stored, not yet bound).
        self._elsewhere: dict[str, _InFlight] = {}
        self._ended: dict[str, anyio.Event] = {}
        self.end_reasons: dict[str, str] = {}
        self.binds = 0
        self._bound = anyio.Event()

    def bind(
        self,
        webhook_id: str,
        key: SubscriptionKey,
        secrets: list[tuple[str, float | None]],
        *,
        changed_only: bool = False,
    ) -> None:
        """Route ``webhook_id`` to ``key``'s subscription, accepting each secret until its time (None: always).

        ``changed_only``: nothing happens (not even a count in ``binds``) if it is bound so already.
        """
        bound_as = (webhook_id, key, tuple(secrets))
        if changed_only and self._bound_as.get(key.name) == bound_as:
            return
        self._bound_as[key.name] = bound_as
        old = self._id_of.get(key.name)
        if old is not None and old != webhook_id:
            self._by_id.pop(old, None)
        decoded = tuple(
            (signing.SigningKey(signing.decode_secret(secret)), until) for secret, until in secrets
        )
        self._by_id[webhook_id] = Route(webhook_id, key, decoded)
        self._id_of[key.name] = webhook_id
        # The server derives the id from the key, so a key subscribed again gets its retired id back.
        self._retired.discard(webhook_id)
        self.binds += 1
        bound, self._bound = self._bound, anyio.Event()
        bound.set()

    async def wait_binds(self, count: int) -> None:
        """Wait until ``bind`` was called ``count`` times in all (every subscribe and refresh binds)."""
        while self.binds < count:
            await self._bound.wait()

    def bound_names(self) -> set[str]:
        """The subscriptions whose deliveries are routed now."""
        return set(self._id_of)

    def unbind(self, name: str) -> str | None:
        self._bound_as.pop(name, None)
        webhook_id = self._id_of.pop(name, None)
        if webhook_id is not None:
            self._by_id.pop(webhook_id, None)
        return webhook_id

    def retire(self, webhook_id: str) -> None:
        self._retired.add(webhook_id)

    def lookup(self, webhook_id: str) -> Route | None:
        return self._by_id.get(webhook_id)

    def is_retired(self, webhook_id: str) -> bool:
        return webhook_id in self._retired

    def begin_subscribe(self, key: SubscriptionKey, secrets: list[str]) -> None:
        self._in_flight[key.name] = _InFlight(key, [signing.decode_secret(s) for s in secrets])

    def end_subscribe(self, name: str) -> None:
        self._in_flight.pop(name, None)

    def expect_elsewhere(self, pending: dict[str, tuple[SubscriptionKey, list[str]]]) -> None:
        """The subscribes under way in the store (a secret stored, no id bound yet), whichever
        process makes them: a load balancer may send their verification challenge here."""
        self._elsewhere = {
            name: _InFlight(key, [signing.decode_secret(s) for s in secrets])
            for name, (key, secrets) in pending.items()
        }

    @property
    def subscribing(self) -> bool:
        return bool(self._in_flight or self._elsewhere)

    def match_in_flight(
        self, msg_id: str, stamp: str, header: str, body: bytes
    ) -> tuple[SubscriptionKey, bytes] | None:
        """The in-flight subscribe (this process's or another's) whose secret signed this body, if any."""
        for pending in [*self._in_flight.values(), *self._elsewhere.values()]:
            key = signing.verify(pending.secrets, msg_id, stamp, header, body)
            if key is not None:
                return pending.key, key
        return None

    def ended(self, name: str) -> anyio.Event:
        """Set when the server terminated this subscription (a ``terminated`` envelope)."""
        return self._ended.setdefault(name, anyio.Event())

    def end(self, name: str, reason: str) -> None:
        self.end_reasons[name] = reason
        self.ended(name).set()
