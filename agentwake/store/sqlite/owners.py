"""Who drives each subscription's delivery loop: a lease per subscription, with a fence.

One process uses a SQLite file, so nothing contends for these rows there; the methods exist so
the store keeps one contract (``agentwake.ownership`` does not renew leases on SQLite). A whole
round costs a few statements however many subscriptions there are: the names go in as one
JSON array.

The same table holds the processes' own rows, leased like subscriptions and named so that no
subscription can be (a config name is letters, digits, '.', '_', '-'): ``@<owner>``, the process
is alive (``agentwake.ownership`` shares the subscriptions among the live ones); ``!<owner>
<server> <since>``, it cannot reach that server since then; ``?<owner> <server>``, it has not
reached it yet. A round deletes such rows once lapsed; ``subscription_owners`` leaves them out
unless asked (``processes=True``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any, Final

from agentwake.errors import FencedOut
from agentwake.store.sqlite.base import SqliteBase

# What a released lease ends at: before any time a process can hold, so the next round takes it.
RELEASED: Final = "1970-01-01T00:00:00.000Z"
OWNER_COLUMNS: Final = ("subscription", "owner", "fence", "lease_until")
# The first character of a process's own row (see the module): alive, cannot reach, not reached yet.
ALIVE: Final = "@"
UNREACHABLE: Final = "!"
UNREACHED: Final = "?"
PROCESS_MARKS: Final = (ALIVE, UNREACHABLE, UNREACHED)
_PROCESS_ROW_SQL: Final = "substr(subscription, 1, 1) IN ('@', '!', '?')"


def is_process_row(name: str) -> bool:
    """Whether a lease row is a process's own (alive, a server it cannot reach) and no subscription."""
    return name[:1] in PROCESS_MARKS


# Take what has no row or a lapsed lease (a new owner raises the fence); renew what is still ours.
_HOLD_SQL: Final = (
    "INSERT INTO subscription_owners (subscription, owner, fence, lease_until, acquired_at)"
    " SELECT value, :owner, 1, :until, :now FROM json_each(:names) WHERE true"
    " ON CONFLICT (subscription) DO UPDATE SET"
    " fence = CASE WHEN owner = excluded.owner THEN fence ELSE fence + 1 END,"
    " acquired_at = CASE WHEN owner = excluded.owner THEN acquired_at ELSE excluded.acquired_at END,"
    " owner = excluded.owner, lease_until = excluded.lease_until"
    " WHERE owner = excluded.owner OR lease_until < :now"
)


class Owners(SqliteBase):
    def hold_subscriptions(self, owner: str, names: Sequence[str], until: str, now: str) -> dict[str, int]:
        """Renew this owner's leases among ``names`` and take those free or lapsed; {name: fence} held."""
        listed = json.dumps(sorted(set(names)))
        with self.transaction():
            self.conn.execute(
                f"DELETE FROM subscription_owners WHERE {_PROCESS_ROW_SQL} AND lease_until < ?", [now]
            )
            self.conn.execute(_HOLD_SQL, {"owner": owner, "until": until, "now": now, "names": listed})
            rows = self.conn.execute(
                "SELECT subscription, fence FROM subscription_owners"
                " WHERE owner = ? AND lease_until = ? AND subscription IN (SELECT value FROM json_each(?))",
                [owner, until, listed],
            ).fetchall()
        return {str(name): int(fence) for name, fence in rows}

    def release_subscriptions(self, owner: str, names: Sequence[str] | None = None) -> None:
        """Give up this owner's leases (all, with None); the fences stay, so a take raises them."""
        with self.transaction():
            if names is None:
                self.conn.execute(
                    "UPDATE subscription_owners SET lease_until = ? WHERE owner = ?", [RELEASED, owner]
                )
            else:
                self.conn.execute(
                    "UPDATE subscription_owners SET lease_until = ?"
                    " WHERE owner = ? AND subscription IN (SELECT value FROM json_each(?))",
                    [RELEASED, owner, json.dumps(list(names))],
                )

    def subscription_owners(self, *, processes: bool = False) -> list[dict[str, Any]]:
        """Each subscription's owner, fence and lease end (a lease in the past is free to take); the
        processes' own rows too with ``processes``."""
        where = "" if processes else f" WHERE NOT {_PROCESS_ROW_SQL}"
        rows = self.conn.execute(
            f"SELECT {', '.join(OWNER_COLUMNS)} FROM subscription_owners{where} ORDER BY subscription"
        ).fetchall()
        return [dict(zip(OWNER_COLUMNS, r, strict=True)) for r in rows]


def check_fence(conn: sqlite3.Connection, name: str, fence: int | None) -> None:
    """Inside a write transaction: raise FencedOut unless ``fence`` (None: unfenced) is the stored one."""
    if fence is None:
        return
    row = conn.execute("SELECT fence FROM subscription_owners WHERE subscription = ?", [name]).fetchone()
    stored = None if row is None else int(row[0])
    if stored != fence:
        raise FencedOut(name, stored, fence)
