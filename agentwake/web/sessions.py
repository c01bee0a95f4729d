"""Operator sessions kept in the store: a restart of the service logs nobody out.

The cookie's value is never stored: the store keeps its SHA-256 (``id_hash``), the name and
scopes of the token the login used, and ``token_check``, an HMAC of the id hash keyed with that
token's value. A session is honoured only while its token is still configured with the same
value: rotating or removing a token ends its sessions (the check no longer matches), and its
scopes are the token's current ones. The CSRF token of a session's forms is derived from the
cookie's value (an HMAC), so it is not stored either. Sessions end after ``ttl_s``, or after
``idle_s`` unused; the idle time is written back at most every ``TOUCH_S`` of use, not at each
request. Messages for the next page (``flash``) are kept in memory: a restart may drop one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

from agentwake.clock import iso, parse_iso
from agentwake.config import SERVICE_SCOPES
from agentwake.store.sessions import StoredSession
from agentwake.web.access import SESSION_IDLE_S, SESSION_TTL_S, AccessToken, Session, credential_bytes

if TYPE_CHECKING:
    from agentwake.store import Store

# A session's idle expiry is written back once it would move by this much, or a tenth of the idle
# time if less (not at every request: a session may end that much before its idle time).
TOUCH_S: Final = 60.0
# Sessions whose next-page messages are kept at once (in memory).
FLASH_SESSIONS: Final = 512


def _iso(at: float) -> str:
    return iso(datetime.fromtimestamp(at, UTC))


def _epoch(value: str) -> float:
    parsed = parse_iso(value)
    return parsed.timestamp() if parsed is not None else 0.0


def id_hash(cookie: str) -> str:
    return hashlib.sha256(cookie.encode()).hexdigest()


def csrf_of(cookie: str) -> str:
    return hmac.new(cookie.encode(), b"agentwake csrf", hashlib.sha256).hexdigest()


def token_check(token: AccessToken | None, hashed: str) -> str:
    """What binds a session to its token's value; '' for an open endpoint's session."""
    if token is None:
        return ""
    return hmac.new(token.value, hashed.encode(), hashlib.sha256).hexdigest()


@dataclass
class StoredSessions:
    """The endpoint's sessions, in the store. ``tokens``: the endpoint's tokens, by name."""

    store: Store
    tokens: dict[str, AccessToken]
    ttl_s: float = SESSION_TTL_S
    idle_s: float = SESSION_IDLE_S
    clock: Callable[[], float] = time.time
    _flash: OrderedDict[str, list[str]] = field(default_factory=OrderedDict, init=False)

    async def create(self, token: AccessToken | None = None) -> Session:
        """A new session for ``token`` (None: an open endpoint's), stored; its cookie value is ``id``."""
        now = self.clock()
        cookie = secrets.token_urlsafe(32)
        hashed = id_hash(cookie)
        idle = now + min(self.idle_s, self.ttl_s)
        scopes = tuple(sorted(token.scopes if token is not None else SERVICE_SCOPES))
        await self.store.session_save(
            StoredSession(
                hashed,
                token.name if token is not None else None,
                scopes,
                token_check(token, hashed),
                _iso(now),
                _iso(now + self.ttl_s),
                _iso(idle),
            ),
            _iso(now),
        )
        return self._session(cookie, now + self.ttl_s, idle, token.name if token else None, scopes)

    def _session(
        self, cookie: str, expires: float, idle: float, token: str | None, scopes: tuple[str, ...]
    ) -> Session:
        hashed = id_hash(cookie)
        flash = self._flash.setdefault(hashed, [])
        self._flash.move_to_end(hashed)
        while len(self._flash) > FLASH_SESSIONS:
            self._flash.popitem(last=False)
        return Session(cookie, csrf_of(cookie), expires, idle, token, frozenset(scopes), flash)

    async def get(self, cookie: str | None) -> Session | None:
        """The live session of this cookie value (now used: its idle time starts again), or None."""
        if not cookie or credential_bytes(cookie) is None or len(cookie) > 256:
            return None
        hashed = id_hash(cookie)
        stored = await self.store.session_get(hashed)
        if stored is None:
            return None
        now = self.clock()
        expires, idle = _epoch(stored.expires_at), _epoch(stored.idle_until)
        token = self.tokens.get(stored.token) if stored.token is not None else None
        bound = (
            stored.token is None
            if not self.tokens
            else token is not None and hmac.compare_digest(stored.token_check, token_check(token, hashed))
        )
        if expires <= now or idle <= now or not bound:
            await self.store.session_end(hashed)
            self._flash.pop(hashed, None)
            return None
        renewed = min(now + self.idle_s, expires)
        if renewed - idle >= min(TOUCH_S, self.idle_s / 10):
            await self.store.session_touch(hashed, _iso(renewed))
            idle = renewed
        scopes = tuple(sorted(token.scopes)) if token is not None else stored.scopes
        return self._session(cookie, expires, idle, stored.token, scopes)

    async def end(self, cookie: str) -> None:
        hashed = id_hash(cookie)
        self._flash.pop(hashed, None)
        await self.store.session_end(hashed)


__all__ = ["TOUCH_S", "StoredSessions", "csrf_of", "id_hash", "token_check"]
