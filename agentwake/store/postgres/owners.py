"""Who drives each subscription's delivery loop: a lease per subscription, with a fence.

Several processes share the database, and PostgreSQL's row locks do the coordination: a round
is ONE ``INSERT ... ON CONFLICT DO UPDATE`` over every name, which locks each existing row and
re-checks the lease on its latest version, so two processes racing for a subscription never both
get it. A new owner raises the fence; every fenced cursor write locks the row ``FOR SHARE`` and
compares, so a takeover waits for an ingest in flight, and a former owner's later one is refused.
The processes' own rows (``@owner`` and the like, see ``agentwake.store.sqlite.owners``) go through
the same round; lapsed ones are deleted, skipping any another round has locked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import psycopg

from agentwake.errors import FencedOut
from agentwake.store.postgres import views
from agentwake.store.postgres.base import PostgresBase
from agentwake.store.sqlite.owners import OWNER_COLUMNS, RELEASED

# Names in a fixed order: two rounds racing lock their rows in the same order (no deadlock).
_HOLD_SQL: Final = (
    "INSERT INTO subscription_owners AS o (subscription, owner, fence, lease_until, acquired_at)"
    " SELECT n, %(owner)s, 1, %(until)s, %(now)s FROM unnest(%(names)s::text[]) AS n ORDER BY n"
    " ON CONFLICT (subscription) DO UPDATE SET"
    " fence = CASE WHEN o.owner = excluded.owner THEN o.fence ELSE o.fence + 1 END,"
    " acquired_at = CASE WHEN o.owner = excluded.owner THEN o.acquired_at ELSE excluded.acquired_at END,"
    " owner = excluded.owner, lease_until = excluded.lease_until"
    " WHERE o.owner = excluded.owner OR o.lease_until < %(now)s"
    " RETURNING o.subscription, o.fence"
)
_PROCESS_ROW_SQL: Final = "left(subscription, 1) IN ('@', '!', '?')"
# Lapsed process rows (dead processes, servers reached again), skipping those a racing round locked.
_SWEEP_SQL: Final = (
    "DELETE FROM subscription_owners WHERE subscription IN (SELECT subscription FROM subscription_owners"
    f" WHERE {_PROCESS_ROW_SQL} AND lease_until < %s ORDER BY subscription FOR UPDATE SKIP LOCKED)"
)
# Rows locked in the order a round locks them: a release racing a take cannot deadlock.
_RELEASE_SQL: Final = (
    "UPDATE subscription_owners SET lease_until = %s WHERE subscription IN (SELECT subscription FROM"
    " subscription_owners WHERE owner = %s{names} ORDER BY subscription FOR UPDATE)"
)


class Owners(PostgresBase):
    async def hold_subscriptions(
        self, owner: str, names: Sequence[str], until: str, now: str
    ) -> dict[str, int]:
        """Renew this owner's leases among ``names`` and take those free or lapsed; {name: fence} held."""
        # Each name once: ON CONFLICT cannot touch one row twice in a statement.
        listed = sorted(set(names))
        async with self.transaction() as conn:
            await conn.execute(_SWEEP_SQL, [now])
            cur = await conn.execute(_HOLD_SQL, {"owner": owner, "until": until, "now": now, "names": listed})
            rows = await cur.fetchall()
        return {str(name): int(fence) for name, fence in rows}

    async def release_subscriptions(self, owner: str, names: Sequence[str] | None = None) -> None:
        """Give up this owner's leases (all, with None); the fences stay, so a take raises them."""
        async with self.transaction() as conn:
            if names is None:
                await conn.execute(_RELEASE_SQL.format(names=""), [RELEASED, owner])
            else:
                await conn.execute(
                    _RELEASE_SQL.format(names=" AND subscription = ANY(%s)"), [RELEASED, owner, list(names)]
                )

    async def subscription_owners(self, *, processes: bool = False) -> list[dict[str, Any]]:
        """Each subscription's owner, fence and lease end (a lease in the past is free to take); the
        processes' own rows too with ``processes``."""
        if processes:
            return await self._read(views.subscription_owners())
        async with self.transaction() as conn:
            cur = await conn.execute(
                f"SELECT {', '.join(OWNER_COLUMNS)} FROM subscription_owners WHERE NOT {_PROCESS_ROW_SQL}"
                " ORDER BY subscription"
            )
            rows = await cur.fetchall()
        return [dict(zip(OWNER_COLUMNS, r, strict=True)) for r in rows]


async def check_fence(conn: psycopg.AsyncConnection[Any], name: str, fence: int | None) -> None:
    """Inside a transaction: raise FencedOut unless ``fence`` (None: unfenced) is the stored one.

    The row stays share-locked until the transaction ends: a takeover waits for this write.
    """
    if fence is None:
        return
    cur = await conn.execute(
        "SELECT fence FROM subscription_owners WHERE subscription = %s FOR SHARE", [name]
    )
    row = await cur.fetchone()
    stored = None if row is None else int(row[0])
    if stored != fence:
        raise FencedOut(name, stored, fence)
