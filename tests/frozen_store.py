"""A process that stops itself (SIGSTOP) inside one of a PostgreSQL store's transactions, holding
its locks: the frozen process of tests/test_postgres_frozen.py.

    python frozen_store.py URL LEASE_S MODE

It opens the store as ``agentwake run`` does (``PostgresStore.open`` with ``[store] lease_s`` =
LEASE_S), then, by MODE:

* ``ingest``: takes subscription ``sub``'s lease (owner ``frozen``), stores event E-1 under its
  fence (committed), and freezes inside the fenced ingest of E-2: after the fence check's
  ``FOR SHARE``, with the subscription's row locked and E-2 inserted, before the commit.
* ``round``: takes ``sub``'s lease, then freezes inside its next lease round (the round's statement
  done, its rows locked, not committed).
* ``claim-limits``: stores E-1 and freezes inside a claim under a server cap (the claims' advisory
  lock taken, E-1 and ``sub``'s row locked), before the commit.
* ``claim``: the same claim without limits.

Just before it stops it prints one JSON line, ``{"lease_until": ...}`` (the end of the lease it
committed, or null). Once continued (SIGCONT), the transaction's end is tried and its outcome
printed, ``committed`` or ``error: MESSAGE``, and it exits.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio

from agentwake.clock import iso, utc_now
from agentwake.errors import StoreError
from agentwake.store import IncomingEvent, SubscriptionKey
from agentwake.store.postgres import PostgresStore
from agentwake.store.postgres.base import PostgresBase
from agentwake.store.quotas import ClaimLimits

KEY = SubscriptionKey("sub", "demo", "ticket.created", {})
OWNER = "frozen"

# Set just before the call whose transaction is to freeze; the hook below stops there, once.
armed = False
said: dict[str, Any] = {"lease_until": None}
_transaction = PostgresBase.transaction


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@asynccontextmanager
async def freezing_transaction(self: PostgresBase, **kwargs: Any) -> AsyncIterator[Any]:
    """The store's own transaction; the armed one stops this process at its end, before the commit."""
    global armed
    async with _transaction(self, **kwargs) as conn:
        yield conn
        if armed:
            armed = False
            say(json.dumps(said))
            os.kill(os.getpid(), signal.SIGSTOP)


PostgresBase.transaction = freezing_transaction  # type: ignore[method-assign]


def event(n: int) -> IncomingEvent:
    return IncomingEvent(f"E-{n}", KEY.event, "2026-12-03T08:00:00.000Z", {"n": n})


async def take_lease(store: PostgresStore, lease_s: float) -> int:
    now = utc_now()
    until = iso(now + timedelta(seconds=lease_s))
    held = await store.hold_subscriptions(OWNER, [KEY.name], until, iso(now))
    said["lease_until"] = until
    return held[KEY.name]


async def main(url: str, lease_s: float, mode: str) -> None:
    global armed
    store = await PostgresStore.open(url, lease_s=lease_s)
    try:
        await store.register(KEY)
        try:
            if mode == "ingest":
                fence = await take_lease(store, lease_s)
                await store.ingest(KEY, [event(1)], "1", fence=fence)
                armed = True
                await store.ingest(KEY, [event(2)], "2", fence=fence)
            elif mode == "round":
                await take_lease(store, lease_s)
                armed = True
                now = utc_now()
                await store.hold_subscriptions(
                    OWNER, [KEY.name], iso(now + timedelta(seconds=lease_s)), iso(now)
                )
            elif mode in ("claim", "claim-limits"):
                await store.ingest(KEY, [event(1)], "1")
                limits = ClaimLimits({KEY.server: 10}) if mode == "claim-limits" else ClaimLimits()
                armed = True
                await store.claim(1, limits=limits)
            else:
                raise SystemExit(f"unknown mode {mode!r}")
        except StoreError as exc:
            say(f"error: {exc}")
        else:
            say("committed")
    finally:
        await store.close()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], float(sys.argv[2]), sys.argv[3])
