"""Operator sessions in the SQLite store (see agentwake.store.sessions)."""

from __future__ import annotations

from agentwake.store.sessions import (
    END_SQL,
    EXPIRE_SQL,
    GET_SQL,
    INSERT_SQL,
    TOUCH_SQL,
    StoredSession,
    session_of,
)
from agentwake.store.sqlite.base import SqliteBase


def _q(sql: str) -> str:
    return sql.replace("%s", "?")


class OperatorSessions(SqliteBase):
    def session_save(self, session: StoredSession, now: str) -> None:
        """Store a new session; sessions expired by ``now`` go in the same transaction."""
        with self.transaction():
            self.conn.execute(_q(EXPIRE_SQL), [now, now])
            self.conn.execute(_q(INSERT_SQL), session.row())

    def session_get(self, id_hash: str) -> StoredSession | None:
        row = self.conn.execute(_q(GET_SQL), [id_hash]).fetchone()
        return session_of(row) if row is not None else None

    def session_touch(self, id_hash: str, idle_until: str) -> None:
        with self.transaction():
            self.conn.execute(_q(TOUCH_SQL), [idle_until, id_hash])

    def session_end(self, id_hash: str) -> None:
        with self.transaction():
            self.conn.execute(_q(END_SQL), [id_hash])
