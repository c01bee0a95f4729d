"""Poll leases: the soft state that drives on_subscribe/on_unsubscribe for poll.

Keyed on (principal-or-None, event name, canonical hash of arguments). A key
seen for the first time is a subscribe; a key not renewed within the TTL is an
unsubscribe. Never persisted: after a restart the next poll is first sight again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

from agentwake.server._types import canonical_hash

DEFAULT_POLL_LEASE_TTL: Final = timedelta(minutes=5)

LeaseKey = tuple[str | None, str, str]


@dataclass(slots=True)
class Lease:
    principal: str | None
    name: str
    arguments: dict[str, Any]
    expires_at: float
    # Position for no-replay emit-only types, whose cursor on the wire is always null.
    position: int | None = None
    subscription_id: str = field(default="")


class LeaseTable:
    def __init__(
        self, ttl: timedelta = DEFAULT_POLL_LEASE_TTL, *, clock: Callable[[], float] = time.monotonic
    ):
        if ttl <= timedelta(0):
            raise ValueError("poll lease TTL must be positive")
        self.ttl = ttl.total_seconds()
        self._clock = clock
        self._leases: dict[LeaseKey, Lease] = {}

    @staticmethod
    def key(principal: str | None, name: str, arguments: dict[str, Any]) -> LeaseKey:
        return (principal, name, canonical_hash(arguments))

    def get(self, key: LeaseKey) -> Lease | None:
        return self._leases.get(key)

    def touch(self, principal: str | None, name: str, arguments: dict[str, Any]) -> tuple[Lease, bool]:
        """Renew the lease for this key; the flag says whether it is new."""
        key = self.key(principal, name, arguments)
        expires_at = self._clock() + self.ttl
        lease = self._leases.get(key)
        if lease is not None:
            lease.expires_at = expires_at
            return lease, False
        lease = Lease(principal, name, dict(arguments), expires_at, subscription_id=f"poll:{key[2]}")
        self._leases[key] = lease
        return lease, True

    def drop(self, principal: str | None, name: str, arguments: dict[str, Any]) -> None:
        self._leases.pop(self.key(principal, name, arguments), None)

    def expired(self) -> list[Lease]:
        """Remove and return every lease past its expiry."""
        now = self._clock()
        gone = [key for key, lease in self._leases.items() if lease.expires_at <= now]
        return [self._leases.pop(key) for key in gone]

    def __len__(self) -> int:
        return len(self._leases)
