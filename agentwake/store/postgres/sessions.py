"""Operator sessions in the PostgreSQL store (see agentwake.store.sessions)."""

from __future__ import annotations

from agentwake.store.postgres.base import PostgresBase
from agentwake.store.sessions import (
    END_SQL,
    EXPIRE_SQL,
    GET_SQL,
    INSERT_SQL,
    TOUCH_SQL,
    StoredSession,
    session_of,
)


class OperatorSessions(PostgresBase):
    async def session_save(self, session: StoredSession, now: str) -> None:
        """Store a new session; sessions expired by ``now`` go in the same transaction."""
        async with self.transaction() as conn:
            await conn.execute(EXPIRE_SQL, [now, now])
            await conn.execute(INSERT_SQL, session.row())

    async def session_get(self, id_hash: str) -> StoredSession | None:
        async with self.transaction() as conn:
            row = await (await conn.execute(GET_SQL, [id_hash])).fetchone()
        return session_of(row) if row is not None else None

    async def session_touch(self, id_hash: str, idle_until: str) -> None:
        async with self.transaction() as conn:
            await conn.execute(TOUCH_SQL, [idle_until, id_hash])

    async def session_end(self, id_hash: str) -> None:
        async with self.transaction() as conn:
            await conn.execute(END_SQL, [id_hash])
