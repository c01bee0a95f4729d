"""Operator sessions of the service endpoint, kept in the store so a restart logs nobody out.

Only a hash of the session id is stored (the cookie's value never is), with whose token it was
made by, a check binding it to that token's value (so a token rotated or removed from the config
ends its sessions; see agentwake.web.sessions) and its two expiries. Both backends keep them in
one ``operator_sessions`` table and share this SQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

# The same text in both backends: plain types only. Times are ISO strings (agentwake.clock.iso).
SESSIONS_TABLE: Final = """
    CREATE TABLE operator_sessions (
        id_hash text PRIMARY KEY,
        token text,
        scopes text NOT NULL,
        token_check text NOT NULL,
        created_at text NOT NULL,
        expires_at text NOT NULL,
        idle_until text NOT NULL
    )
"""
SESSIONS_INDEX: Final = "CREATE INDEX operator_sessions_expiry ON operator_sessions (expires_at)"

SESSION_COLUMNS: Final = "id_hash, token, scopes, token_check, created_at, expires_at, idle_until"
INSERT_SQL: Final = f"INSERT INTO operator_sessions ({SESSION_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s)"
GET_SQL: Final = f"SELECT {SESSION_COLUMNS} FROM operator_sessions WHERE id_hash = %s"
TOUCH_SQL: Final = "UPDATE operator_sessions SET idle_until = %s WHERE id_hash = %s"
END_SQL: Final = "DELETE FROM operator_sessions WHERE id_hash = %s"
# Sessions past either expiry; run at each new session, so the table holds live ones only.
EXPIRE_SQL: Final = "DELETE FROM operator_sessions WHERE expires_at <= %s OR idle_until <= %s"


@dataclass(frozen=True, slots=True)
class StoredSession:
    """One operator session as stored: ``token`` is the token's name (None: an open endpoint's)."""

    id_hash: str
    token: str | None
    scopes: tuple[str, ...]
    token_check: str
    created_at: str
    expires_at: str
    idle_until: str

    def row(self) -> list[Any]:
        return [
            self.id_hash,
            self.token,
            " ".join(self.scopes),
            self.token_check,
            self.created_at,
            self.expires_at,
            self.idle_until,
        ]


def session_of(row: Sequence[Any]) -> StoredSession:
    id_hash, token, scopes, check, created, expires, idle = row
    return StoredSession(id_hash, token, tuple(str(scopes).split()), check, created, expires, idle)


__all__ = [
    "END_SQL",
    "EXPIRE_SQL",
    "GET_SQL",
    "INSERT_SQL",
    "SESSIONS_INDEX",
    "SESSIONS_TABLE",
    "TOUCH_SQL",
    "StoredSession",
    "session_of",
]
