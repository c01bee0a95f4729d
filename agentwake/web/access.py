"""Who may use the operator's endpoint: where it listens, its token, browser sessions and their CSRF tokens.

The rules, in one place:

- ``[service] listen`` beyond loopback (anything but 127.0.0.0/8, ::1 or ``localhost``) needs a
  token: ``[service] token_env`` naming a set, non-empty environment variable. Without one the
  service refuses to start (``endpoint_settings`` raises ConfigError).
- With a token, everything but ``/healthz`` and ``/readyz`` (probes; the details of their errors
  are for holders of the token only) needs it: as
  ``Authorization: Bearer <token>``, or as the session cookie a browser gets by logging in
  with it (``/login``). Tokens are compared in constant time.
- Without a token (loopback only) the endpoint is open, and says so when it starts. Browsers
  still get a session: the cookie carries the CSRF token the forms must echo, and the Host
  header must be a loopback name (a DNS-rebinding page cannot pose as the endpoint).
- Every state-changing request is a POST. A POST that relies on the cookie must carry its
  session's CSRF token in the form; any POST whose Origin (or Sec-Fetch-Site) says it came from
  another site is refused. Session cookies are HttpOnly and SameSite=Strict.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

import anyio

from agentwake.config import ServiceConfig, parse_listen
from agentwake.errors import ConfigError

SESSION_COOKIE: Final = "agentwake_session"
# A browser session lasts this long after it was made; then the token is asked for again.
SESSION_TTL_S: Final = 12 * 3600.0
# Sessions kept at once; the oldest goes first (each login or open-mode visit makes one).
MAX_SESSIONS: Final = 512
# Wrong tokens tolerated per window, from anyone, before every further try is refused until it ends.
LOGIN_FAILURES_ALLOWED: Final = 20
LOGIN_FAILURE_WINDOW_S: Final = 60.0


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or ``localhost``: reachable from this machine only."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere


@dataclass(frozen=True)
class EndpointSettings:
    """Where the endpoint listens and the token it asks for (None: open, loopback only)."""

    host: str
    port: int
    token_env: str | None
    token: str | None = field(default=None, repr=False)

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def accepts(self, presented: str) -> bool:
        """``presented`` is the token, compared in constant time; False when there is no token."""
        if self.token is None:
            return False
        return hmac.compare_digest(presented.encode(), self.token.encode())


def endpoint_settings(service: ServiceConfig, env: Mapping[str, str] | None = None) -> EndpointSettings:
    """The settings of ``[service]``; ConfigError when they would expose the endpoint without a token."""
    env = os.environ if env is None else env
    assert service.listen is not None
    try:
        host, port = parse_listen(service.listen)
    except ValueError as exc:
        raise ConfigError(f"[service] listen: {exc}") from None
    token: str | None = None
    if service.token_env is not None:
        token = env.get(service.token_env) or None
        if token is None:
            raise ConfigError(
                f"[service] token_env names {service.token_env}, which is not set (or empty) in the"
                " environment: set it to the endpoint's access token, or remove token_env"
                " (possible on a loopback listen address only)"
            )
    elif not is_loopback(host):
        raise ConfigError(
            f"[service] listen = {service.listen!r} is reachable beyond this machine, and the endpoint"
            " serves the approvals page and metrics: set [service] token_env to an environment variable"
            " holding an access token, or listen on a loopback address (127.0.0.1, ::1, localhost)"
        )
    return EndpointSettings(host, port, service.token_env, token)


@dataclass
class Session:
    """One browser's session: its cookie value and the CSRF token its forms carry."""

    id: str
    csrf: str
    expires_at: float
    flash: list[str] = field(default_factory=list)

    def csrf_matches(self, presented: str) -> bool:
        return hmac.compare_digest(presented.encode(), self.csrf.encode())


@dataclass
class Sessions:
    """Sessions in memory: a restart logs everyone out, which is fine for an operator's page."""

    ttl_s: float = SESSION_TTL_S
    limit: int = MAX_SESSIONS
    clock: Callable[[], float] = anyio.current_time
    _by_id: OrderedDict[str, Session] = field(default_factory=OrderedDict, init=False)

    def create(self) -> Session:
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), self.clock() + self.ttl_s)
        self._by_id[session.id] = session
        while len(self._by_id) > self.limit:
            self._by_id.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is not None and session.expires_at <= self.clock():
            del self._by_id[session_id]
            return None
        return session

    def end(self, session_id: str) -> None:
        self._by_id.pop(session_id, None)


@dataclass
class LoginThrottle:
    """Counts wrong tokens; past LOGIN_FAILURES_ALLOWED in a window, every try waits for the next window."""

    allowed: int = LOGIN_FAILURES_ALLOWED
    window_s: float = LOGIN_FAILURE_WINDOW_S
    clock: Callable[[], float] = anyio.current_time
    _window_start: float = field(default=float("-inf"), init=False)
    _failures: int = field(default=0, init=False)

    def _roll(self) -> None:
        now = self.clock()
        if now - self._window_start >= self.window_s:
            self._window_start, self._failures = now, 0

    def blocked(self) -> bool:
        self._roll()
        return self._failures >= self.allowed

    def failed(self) -> None:
        self._roll()
        self._failures += 1


def same_origin(origin: str | None, fetch_site: str | None, host: str | None) -> bool:
    """False for a request a browser says came from another site (Origin or Sec-Fetch-Site).

    A request with neither header (curl, a script) is not a browser's cross-site request.
    """
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return False
    if origin is None:
        return True
    if origin == "null" or host is None:
        return False
    _, sep, rest = origin.partition("://")
    return bool(sep) and rest.rstrip("/").lower() == host.lower()


def loopback_host_header(host: str | None) -> bool:
    """The Host header names a loopback address (any port): no DNS-rebound name."""
    if not host:
        return False
    if host.startswith("["):  # [v6]:port
        name = host[1 : host.find("]")] if "]" in host else host
    else:
        name = host.rsplit(":", 1)[0]
    return is_loopback(name)


__all__ = [
    "SESSION_COOKIE",
    "EndpointSettings",
    "LoginThrottle",
    "Session",
    "Sessions",
    "endpoint_settings",
    "is_loopback",
    "loopback_host_header",
    "same_origin",
]
