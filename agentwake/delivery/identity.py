"""Server identity on the receiving side: which server sent a webhook delivery (Standard Webhooks v1a).

``[servers.NAME] webhook_identity = "verify" | "require"`` makes the receiver check, on every
delivery and verification POST routed to one of that server's subscriptions (after its HMAC
``v1`` verified), the ``v1a`` ed25519 signature against the keys the server publishes at
``/.well-known/mcp-webhook-jwks.json`` on its own MCP origin: the ``url`` of its configuration,
fetched with the same headers (and so the same credentials) as its MCP connection, never a URL a
delivery names, and never through a redirect (which could lead to another origin).

- ``verify``: a ``v1a`` that does not verify is refused (401); a delivery without one is accepted.
- ``require``: a delivery without a verifying ``v1a`` is refused.

The key set is cached and fetched again after its ``Cache-Control: max-age`` (bounded to
[MIN_REFRESH_S, MAX_REFRESH_S]); a ``v1a`` that verifies under none of the cached keys (a key
rotated in since: "an unknown kid") fetches it once more at once, at most every
MIN_REFRESH_S. A fetch that fails keeps the keys already known; with none known, a delivery
carrying a ``v1a`` (or any, under ``require``) is refused (401, the sender retries) until one works.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

import anyio

from agentwake import metrics
from agentwake.config import ServerConfig

if TYPE_CHECKING:
    from agentwake.identity import PublicKey

logger = logging.getLogger(__name__)

IdentityMode = Literal["off", "verify", "require"]
MIN_REFRESH_S: Final = 30.0
MAX_REFRESH_S: Final = 3600.0
DEFAULT_REFRESH_S: Final = 300.0
FETCH_TIMEOUT_S: Final = 10.0
_MAX_AGE: Final = re.compile(r"(?:^|,)\s*max-age\s*=\s*(\d{1,9})\s*(?:,|$)", re.IGNORECASE)


def jwks_url(server_url: str) -> str:
    """The JWKS's URL on the origin (scheme, host and port) of a server's MCP URL."""
    from yarl import URL

    from agentwake.identity import JWKS_PATH

    origin = URL(server_url).origin()
    return str(origin.with_path(JWKS_PATH))


def refresh_after_s(cache_control: str | None) -> float:
    match = _MAX_AGE.search(cache_control or "")
    seconds = float(match.group(1)) if match else DEFAULT_REFRESH_S
    return min(max(seconds, MIN_REFRESH_S), MAX_REFRESH_S)


@dataclass(frozen=True, slots=True)
class Checked:
    """One request's identity check: ``refused`` is None when it may go on, else the reason."""

    refused: str | None = None
    kid: str | None = None


class ServerKeys:
    """One server's published identity keys, fetched from its origin and kept fresh."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        mode: IdentityMode,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if config.url is None:
            raise ValueError(f"server {name!r}: webhook_identity needs a Streamable HTTP server")
        self.name = name
        self.config = config
        self.mode = mode
        self.url = jwks_url(config.url)
        self.keys: list[PublicKey] = []
        self.fetched = False
        self.last_error: str | None = None
        self._clock = clock
        self._fresh_until = 0.0
        self._last_forced = -MIN_REFRESH_S
        self._lock = anyio.Lock()
        metrics.observe_identity_keys(name, mode, 0)

    async def refresh(self, *, forced: bool = False) -> None:
        """Fetch the key set now (``forced``: because a signature verified under none of ours, at most
        every MIN_REFRESH_S), or if it is stale. Failures keep what we had and are logged."""
        async with self._lock:
            now = self._clock()
            if forced:
                if now - self._last_forced < MIN_REFRESH_S:
                    return
                self._last_forced = now
            elif self.fetched and now < self._fresh_until:
                return
            try:
                keys, fresh_s = await self._fetch()
            except Exception as exc:  # any failure to get the keys: keep the old ones, say why
                self.last_error = str(exc) or type(exc).__name__
                self._fresh_until = now + MIN_REFRESH_S
                logger.warning(
                    "server %s: identity keys not fetched from %s: %s%s",
                    self.name,
                    self.url,
                    self.last_error,
                    f"; keeping the {len(self.keys)} known" if self.keys else "",
                    extra={"server": self.name},
                )
                return
            if [k.kid for k in keys] != [k.kid for k in self.keys]:
                logger.info(
                    "server %s: identity keys %s (from %s)",
                    self.name,
                    ", ".join(k.kid for k in keys) or "none",
                    self.url,
                    extra={"server": self.name},
                )
            self.keys, self.fetched, self.last_error = keys, True, None
            self._fresh_until = now + fresh_s
            metrics.observe_identity_keys(self.name, self.mode, len(keys))

    async def _fetch(self) -> tuple[list[PublicKey], float]:
        from agentwake._compat import http_client
        from agentwake.identity import MAX_JWKS_BYTES, IdentityError, parse_jwks

        client = http_client(self.config.headers)
        try:
            with anyio.fail_after(FETCH_TIMEOUT_S):
                async with client.stream("GET", self.url, follow_redirects=False) as response:
                    if response.status_code != 200:
                        where = response.headers.get("location")
                        raise IdentityError(
                            f"HTTP {response.status_code}"
                            + (
                                " (a redirect: the keys must be served by the server's own origin)"
                                if where
                                else ""
                            )
                        )
                    body = b""
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) > MAX_JWKS_BYTES:
                            raise IdentityError(f"the JWKS is larger than {MAX_JWKS_BYTES} bytes")
                    fresh_s = refresh_after_s(response.headers.get("cache-control"))
        except TimeoutError:
            raise IdentityError(f"no answer within {FETCH_TIMEOUT_S:g} s") from None
        finally:
            await client.aclose()
        keys = parse_jwks(body)
        if not keys:
            raise IdentityError("the JWKS lists no ed25519 signing key")
        return keys, fresh_s

    async def check(self, msg_id: str, stamp: str, header: str, body: bytes) -> Checked:
        """The identity check of one request whose HMAC already verified."""
        from agentwake.identity import identity_signatures, verify_identity

        if not identity_signatures(header):
            return Checked("missing") if self.mode == "require" else Checked()
        await self.refresh()
        key = verify_identity(self.keys, msg_id, stamp, header, body)
        if key is None:
            # Perhaps signed with a key rotated in since we fetched: one more look, rate-limited.
            await self.refresh(forced=True)
            key = verify_identity(self.keys, msg_id, stamp, header, body)
        if key is None:
            return Checked("no_keys" if not self.keys else "invalid")
        return Checked(kid=key.kid)


class IdentityChecks:
    """The servers whose deliveries are identity-checked, by server name (the others are not)."""

    def __init__(self, servers: dict[str, ServerKeys] | None = None) -> None:
        self.servers = servers or {}

    @classmethod
    def from_config(cls, servers: dict[str, ServerConfig]) -> IdentityChecks:
        return cls(
            {
                name: ServerKeys(name, server, server.webhook_identity)
                for name, server in servers.items()
                if server.webhook_identity != "off"
            }
        )

    def reloaded(self, servers: dict[str, ServerConfig]) -> IdentityChecks:
        """The checks of a reloaded config: a server whose configuration is unchanged keeps its keys."""
        fresh = IdentityChecks.from_config(
            {name: server for name, server in servers.items() if self._kept(name, server) is None}
        )
        kept = {
            name: keys for name, server in servers.items() if (keys := self._kept(name, server)) is not None
        }
        return IdentityChecks({**fresh.servers, **kept})

    def _kept(self, name: str, server: ServerConfig) -> ServerKeys | None:
        keys = self.servers.get(name)
        return (
            keys if keys is not None and keys.config == server and server.webhook_identity != "off" else None
        )

    async def check(self, server: str, msg_id: str, stamp: str, header: str, body: bytes) -> Checked:
        keys = self.servers.get(server)
        if keys is None:
            return Checked()
        checked = await keys.check(msg_id, stamp, header, body)
        if checked.refused is not None or checked.kid is not None:
            metrics.observe_identity(server, checked.refused)
        return checked

    async def prefetch(self) -> None:
        """Fetch every server's keys once, side by side (before the first delivery needs them)."""
        async with anyio.create_task_group() as tg:
            for keys in self.servers.values():
                tg.start_soon(keys.refresh)


async def keys_problem(name: str, config: ServerConfig) -> str | None:
    """Why the identity keys of server ``name`` cannot be had now (for ``agentwake check``), or None."""
    keys = ServerKeys(name, config, config.webhook_identity)
    await keys.refresh()
    if keys.keys:
        return None
    return (
        f"webhook_identity = {config.webhook_identity!r}, but its identity keys could not be fetched from"
        f" {keys.url}: {keys.last_error}; its webhook deliveries would be refused"
    )
