"""The webhook sender's HTTP side: one signed POST through the SSRF guard, reduced to an ``Outcome``.

aiohttp is the client. Its connector uses ``GuardedResolver`` (every connection
resolves and checks the host anew: no DNS cache, no keep-alive), never follows
a redirect, and trusts ``ssl_context`` (the system store by default). Every
failure becomes one of the spec's ``lastError`` categories; nothing the
endpoint said (body, headers, status line) leaves this module except the
status code, the ``Retry-After`` of a 429 or 503 (as a number of seconds), and, for the
verification handshake, a bounded prefix of a 2xx body.
"""

from __future__ import annotations

import email.utils
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Final

import aiohttp
from yarl import URL

from agentwake import signing
from agentwake.identity import ServerIdentity
from agentwake.server._ssrf import AddressPolicy, GuardedResolver, Resolve

logger = logging.getLogger(__name__)

# The spec's lastError categories (also data.reason of -32015 CallbackEndpointError).
CONNECTION_REFUSED: Final = "connection_refused"
TIMEOUT: Final = "timeout"
TLS_ERROR: Final = "tls_error"
HTTP_4XX: Final = "http_4xx"
HTTP_5XX: Final = "http_5xx"
CHALLENGE_FAILED: Final = "challenge_failed"
CATEGORIES: Final = frozenset({CONNECTION_REFUSED, TIMEOUT, TLS_ERROR, HTTP_4XX, HTTP_5XX, CHALLENGE_FAILED})

CONTENT_TYPE: Final = "application/json"
# Statuses whose Retry-After says when the endpoint will take the delivery (it is alive, only busy).
RETRY_LATER: Final = frozenset({429, 503})


def retry_after_s(value: str | None, now: float) -> float | None:
    """A Retry-After header as seconds from ``now`` (delta-seconds or an HTTP date); None if unusable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(int(value[:9]))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


def status_category(status: int) -> str | None:
    """None for a 2xx; a redirect or any other non-2xx below 500 counts as the client's error."""
    if 200 <= status < 300:
        return None
    return HTTP_5XX if status >= 500 else HTTP_4XX


@dataclass(frozen=True, slots=True)
class Outcome:
    """One POST attempt: the status (None if no response came) and the failure category (None on 2xx)."""

    status: int | None
    category: str | None
    body: bytes = b""
    # A 429 or 503 that said when to come back: the endpoint is alive and asks for time.
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.category is None


class WebhookSender:
    """Signed POSTs to callback URLs. An async context manager: it owns the aiohttp session."""

    def __init__(
        self,
        *,
        policy: AddressPolicy,
        resolve: Resolve | None,
        ssl_context: ssl.SSLContext | None,
        timeout_s: float,
        clock: Callable[[], float] = time.time,
        identity: ServerIdentity | None = None,
    ) -> None:
        self._policy = policy
        self._identity = identity
        self._resolve = resolve
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> WebhookSender:
        connector = aiohttp.TCPConnector(
            resolver=GuardedResolver(self._policy, self._resolve),
            use_dns_cache=False,
            force_close=True,  # a new connection, so a fresh checked resolution, for every POST
            ssl=self._ssl,
        )
        self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(
        self,
        url: str,
        msg_id: str,
        body: bytes,
        keys: Sequence[bytes],
        subscription_id: str,
        *,
        read_limit: int = 0,
    ) -> Outcome:
        """POST ``body`` signed with every key; a fresh timestamp and signature each call. With a
        server identity its newest key signs the same content too: a ``v1a,`` entry after the ``v1,`` ones.

        With ``read_limit`` the first bytes of a 2xx response body come back (the
        verification handshake reads the echoed challenge); otherwise none are read.
        """
        if self._session is None:
            raise RuntimeError("WebhookSender used outside its context")
        host = URL(url).raw_host or ""
        if self._policy.permits_host(host) is False:
            logger.warning(
                "webhook subscription %s: the callback address is not public; not connecting", subscription_id
            )
            return Outcome(None, CONNECTION_REFUSED)
        stamp = int(self._clock())
        signature = signing.sign(keys, msg_id, stamp, body)
        if self._identity is not None:
            signature += " " + self._identity.signer.sign(msg_id, stamp, body)
        headers = {
            "Content-Type": CONTENT_TYPE,
            signing.HEADER_ID: msg_id,
            signing.HEADER_TIMESTAMP: str(stamp),
            signing.HEADER_SIGNATURE: signature,
            signing.HEADER_SUBSCRIPTION: subscription_id,
        }
        try:
            async with self._session.post(
                url, data=body, headers=headers, allow_redirects=False, timeout=self._timeout
            ) as response:
                category = status_category(response.status)
                content = b""
                if read_limit and category is None:
                    content = await _read_at_most(response, read_limit)
                later = None
                if response.status in RETRY_LATER:
                    later = retry_after_s(response.headers.get("Retry-After"), self._clock())
                return Outcome(response.status, category, content, later)
        except TimeoutError:
            return Outcome(None, TIMEOUT)
        except (aiohttp.ClientSSLError, ssl.SSLError):
            return Outcome(None, TLS_ERROR)
        except (aiohttp.ClientError, OSError):
            # Refused by the guard (DestinationRefused, logged there), refused by the peer,
            # unresolvable, reset mid-request: all "could not deliver to that endpoint".
            return Outcome(None, CONNECTION_REFUSED)


async def _read_at_most(response: aiohttp.ClientResponse, limit: int) -> bytes:
    content = bytearray()
    while len(content) < limit:
        chunk = await response.content.read(limit - len(content))
        if not chunk:
            break
        content += chunk
    return bytes(content)
