"""Who may use the operator's endpoint: where it listens, its tokens and scopes, TLS, sessions, CSRF.

The rules, in one place:

- Tokens: ``[service] token_env`` is the full-scope token named ``operator``; each
  ``[service.tokens.NAME]`` is another, with its own ``scopes``: ``read`` (the pages, GET
  /approvals, /events, /runs, /pauses, /limits), ``approve`` (approve and deny, pause and resume),
  ``metrics`` (/metrics). The name is who acted in
  the approvals' audit record. A token without the scope a route needs gets 403.
- ``[service] listen`` beyond loopback (anything but 127.0.0.0/8, ::1 or ``localhost``) needs a
  token, and https: ``[service] tls_cert``/``tls_key``, or a ``trusted_proxy`` that terminates TLS.
  Otherwise the service refuses to start (``endpoint_settings`` raises ConfigError): a token sent
  in clear over a network is a token given away.
- With a token, everything but ``/healthz`` and ``/readyz`` (probes; the details of their errors
  are for holders of a token only) needs one: as ``Authorization: Bearer <token>``, or as the
  session cookie a browser gets by logging in with it (``/login``). Tokens are compared in
  constant time; a credential that is not UTF-8 text is a 401, like a wrong one.
- Wrong tokens are counted per client address (IPv6: per /64); past LOGIN_FAILURES_ALLOWED in a
  window its wrong tokens get 429. A right token is never refused: others' mistakes must not lock
  the operator, the Slack bridge or Prometheus out. Guessing is made hopeless by the token's length
  (at least MIN_TOKEN_CHARS), not by the throttle.
- Without a token (loopback only) the endpoint is open, and says so when it starts. The Host
  header must be a loopback name (a DNS-rebinding page cannot pose as the endpoint); forms carry
  a CSRF token signed by this process, so a visit makes no session.
- Sessions are made at a login only (and, open, when a form's answer needs a message carried to
  the next page); they end after ``session_ttl_s``, or ``session_idle_s`` unused. They are kept in
  the store by the hash of their id, so a restart logs nobody out (agentwake.web.sessions).
- Every state-changing request is a POST. A POST that relies on the cookie must carry its
  session's CSRF token in the form; any POST whose Origin (or Sec-Fetch-Site) says it came from
  another site is refused. Session cookies are HttpOnly, SameSite=Strict, and Secure when the
  request came over https (TLS here, or ``X-Forwarded-Proto: https`` from a trusted proxy).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import ssl
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import anyio

from agentwake.config import SERVICE_SCOPES, ServiceConfig, parse_listen
from agentwake.errors import ConfigError

SESSION_COOKIE: Final = "agentwake_session"
# The name [service] token_env's token acts under (its scopes are all of them).
OPERATOR: Final = "operator"
# A browser session lasts at most this long after the login, and ends sooner when unused.
SESSION_TTL_S: Final = 12 * 3600.0
SESSION_IDLE_S: Final = 3600.0
# Sessions kept at once; the least recently used goes first. Only a login (or, open, a form's
# answer) makes one, so a flood of visits cannot push the operator's out.
MAX_SESSIONS: Final = 512
# Wrong tokens tolerated per client address and window; past them its wrong tokens get 429.
LOGIN_FAILURES_ALLOWED: Final = 20
LOGIN_FAILURE_WINDOW_S: Final = 60.0
# Client addresses whose failures are remembered at once; the oldest entry goes first.
THROTTLED_CLIENTS: Final = 4096
# A token this short could be guessed online; the throttle never refuses a right one, so length must.
MIN_TOKEN_CHARS: Final = 16
# Strict-Transport-Security on answers given over https.
HSTS: Final = "max-age=31536000"
# An open endpoint's form token (HMAC-signed, no session) is good this long.
OPEN_CSRF_TTL_S: Final = SESSION_TTL_S


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or ``localhost``: reachable from this machine only."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere


def credential_bytes(presented: str) -> bytes | None:
    """A presented token or form value as UTF-8; None when it is not text (undecodable bytes)."""
    try:
        return presented.encode("utf-8")
    except UnicodeEncodeError:  # aiohttp keeps undecodable header bytes as surrogates
        return None


@dataclass(frozen=True)
class AccessToken:
    """One token of the endpoint: its name (who acts with it), its variable and its scopes."""

    name: str
    env: str
    scopes: frozenset[str]
    value: bytes = field(repr=False)


@dataclass(frozen=True)
class EndpointSettings:
    """Where the endpoint listens, its tokens (none: open, loopback only), TLS and the trusted proxies."""

    host: str
    port: int
    tokens: tuple[AccessToken, ...] = ()
    tls_cert: str | None = None
    tls_key: str | None = None
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    session_ttl_s: float = SESSION_TTL_S
    session_idle_s: float = SESSION_IDLE_S

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def open(self) -> bool:
        return not self.tokens

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def token_env(self) -> str | None:
        """The operator token's variable (the login form names it), else the first token's."""
        named = {token.name: token for token in self.tokens}
        first = named.get(OPERATOR) or (self.tokens[0] if self.tokens else None)
        return first.env if first is not None else None

    @property
    def token(self) -> str | None:
        """Whether a token is required, for callers that only ask that; never the value."""
        return None if self.open else "set"

    def accepts(self, presented: str) -> AccessToken | None:
        """The token ``presented`` is, compared in constant time against every one; None: no token."""
        given = credential_bytes(presented)
        if given is None:
            return None
        found: AccessToken | None = None
        for token in self.tokens:  # all of them, whichever matches: the time tells nothing
            if hmac.compare_digest(given, token.value):
                found = token
        return found

    def trusted(self, peer: str | None) -> bool:
        """Whether ``peer`` (the TCP peer's address) is a trusted reverse proxy."""
        if peer is None or not self.trusted_proxies:
            return False
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in network for network in self.trusted_proxies)

    def tls_context(self) -> ssl.SSLContext | None:
        from agentwake.delivery.receiver import server_tls_context

        return server_tls_context(self.tls_cert, self.tls_key, "service")


def _token_value(name: str, env_name: str, env: Mapping[str, str], where: str) -> bytes:
    value = env.get(env_name) or None
    if value is None:
        raise ConfigError(
            f"{where} names {env_name}, which is not set (or empty) in the environment: set it to the"
            f" access token of {name!r}, or remove it"
        )
    if len(value) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"the access token in {env_name} is shorter than {MIN_TOKEN_CHARS} characters: use a random one"
            " (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
        )
    encoded = credential_bytes(value)
    if encoded is None or not value.isprintable() or value != value.strip():
        raise ConfigError(f"the access token in {env_name} must be printable text without surrounding spaces")
    return encoded


def endpoint_settings(service: ServiceConfig, env: Mapping[str, str] | None = None) -> EndpointSettings:
    """The settings of ``[service]``; ConfigError when they would expose the endpoint without a token
    or, beyond loopback, without https."""
    env = os.environ if env is None else env
    assert service.listen is not None
    try:
        host, port = parse_listen(service.listen)
    except ValueError as exc:
        raise ConfigError(f"[service] listen: {exc}") from None
    tokens: list[AccessToken] = []
    if service.token_env is not None:
        value = _token_value(OPERATOR, service.token_env, env, "[service] token_env")
        tokens.append(AccessToken(OPERATOR, service.token_env, frozenset(SERVICE_SCOPES), value))
    for name, spec in service.tokens.items():
        value = _token_value(name, spec.env, env, f"[service.tokens.{name}] env")
        tokens.append(AccessToken(name, spec.env, frozenset(spec.scopes), value))
    seen: dict[bytes, str] = {}
    for token in tokens:
        if token.value in seen:
            # Two names for one secret: the audit record could not tell who acted.
            raise ConfigError(
                f"the tokens {seen[token.value]!r} and {token.name!r} have the same value: each needs its own"
            )
        seen[token.value] = token.name
    exposed = not is_loopback(host)
    if exposed and not tokens:
        raise ConfigError(
            f"[service] listen = {service.listen!r} is reachable beyond this machine, and the endpoint"
            " serves the approvals page and metrics: set [service] token_env to an environment variable"
            " holding an access token, or listen on a loopback address (127.0.0.1, ::1, localhost)"
        )
    if exposed and service.tls_cert is None and not service.trusted_proxy:
        raise ConfigError(
            f"[service] listen = {service.listen!r} is reachable beyond this machine over plain http, where"
            " the access token would travel in clear: set [service] tls_cert and tls_key, or put a TLS"
            " reverse proxy in front and name it in [service] trusted_proxy"
        )
    return EndpointSettings(
        host,
        port,
        tuple(tokens),
        str(service.tls_cert) if service.tls_cert is not None else None,
        str(service.tls_key) if service.tls_key is not None else None,
        tuple(ipaddress.ip_network(entry, strict=False) for entry in service.trusted_proxy),
        service.session_ttl_s,
        service.session_idle_s,
    )


@dataclass
class Session:
    """One browser's session: its cookie value, the CSRF token its forms carry, and whose it is."""

    id: str
    csrf: str
    expires_at: float
    idle_until: float
    token: str | None = None  # the token logged in with; None: an open endpoint's session
    scopes: frozenset[str] = frozenset(SERVICE_SCOPES)
    flash: list[str] = field(default_factory=list)

    def csrf_matches(self, presented: str) -> bool:
        given = credential_bytes(presented)
        return given is not None and hmac.compare_digest(given, self.csrf.encode())


@dataclass
class Sessions:
    """Sessions in memory, least recently used first out (the endpoint keeps its own in the store:
    agentwake.web.sessions.StoredSessions)."""

    ttl_s: float = SESSION_TTL_S
    idle_s: float = SESSION_IDLE_S
    limit: int = MAX_SESSIONS
    clock: Callable[[], float] = anyio.current_time
    _by_id: OrderedDict[str, Session] = field(default_factory=OrderedDict, init=False)

    def create(self, token: str | None = None, scopes: Sequence[str] = SERVICE_SCOPES) -> Session:
        now = self.clock()
        session = Session(
            secrets.token_urlsafe(32),
            secrets.token_urlsafe(32),
            now + self.ttl_s,
            now + min(self.idle_s, self.ttl_s),
            token,
            frozenset(scopes),
        )
        self._by_id[session.id] = session
        while len(self._by_id) > self.limit:
            self._by_id.popitem(last=False)  # the least recently used
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of this cookie value (now used: its idle time starts again), or None."""
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None:
            return None
        now = self.clock()
        if session.expires_at <= now or session.idle_until <= now:
            del self._by_id[session_id]
            return None
        session.idle_until = min(now + self.idle_s, session.expires_at)
        self._by_id.move_to_end(session_id)
        return session

    def end(self, session_id: str) -> None:
        self._by_id.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._by_id)


@dataclass
class OpenFormTokens:
    """An open endpoint's CSRF tokens: signed by this process with a time, so a visit stores nothing."""

    ttl_s: float = OPEN_CSRF_TTL_S
    clock: Callable[[], float] = anyio.current_time
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32), init=False, repr=False)

    def _sign(self, issued: str) -> str:
        return hmac.new(self._key, issued.encode(), hashlib.sha256).hexdigest()

    def issue(self) -> str:
        issued = f"{self.clock():.3f}"
        return f"{issued}.{self._sign(issued)}"

    def valid(self, presented: str) -> bool:
        if credential_bytes(presented) is None:
            return False
        issued, _, signature = presented.rpartition(".")
        try:
            age = self.clock() - float(issued)
        except ValueError:
            return False
        return hmac.compare_digest(signature.encode(), self._sign(issued).encode()) and 0 <= age < self.ttl_s


def client_key(address: str) -> str:
    """What failures are counted under: the address, or its /64 for IPv6 (one host has many)."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)


@dataclass
class LoginThrottle:
    """Wrong tokens per client address; past ``allowed`` in a window, that address's wrong tokens get 429.

    A right token is checked first and never refused here: someone else's wrong tokens (even
    from the same address) must not lock the operator out.
    """

    allowed: int = LOGIN_FAILURES_ALLOWED
    window_s: float = LOGIN_FAILURE_WINDOW_S
    clients: int = THROTTLED_CLIENTS
    clock: Callable[[], float] = anyio.current_time
    # client key -> (window start, failures in it)
    _failures: OrderedDict[str, tuple[float, int]] = field(default_factory=OrderedDict, init=False)

    def _current(self, key: str) -> tuple[float, int]:
        now = self.clock()
        start, count = self._failures.get(key, (float("-inf"), 0))
        if now - start >= self.window_s:
            return now, 0
        return start, count

    def blocked(self, client: str) -> bool:
        return self._current(client_key(client))[1] >= self.allowed

    def failed(self, client: str) -> bool:
        """Count one wrong token from ``client``; whether it is the first of its window (worth a log line)."""
        key = client_key(client)
        start, count = self._current(key)
        self._failures[key] = (start, count + 1)
        self._failures.move_to_end(key)
        while len(self._failures) > self.clients:
            self._failures.popitem(last=False)
        return count == 0


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
    "HSTS",
    "OPERATOR",
    "SESSION_COOKIE",
    "AccessToken",
    "EndpointSettings",
    "LoginThrottle",
    "OpenFormTokens",
    "Session",
    "Sessions",
    "client_key",
    "credential_bytes",
    "endpoint_settings",
    "is_loopback",
    "loopback_host_header",
    "same_origin",
]
