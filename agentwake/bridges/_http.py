"""What the bridges' thin REST clients share: their errors, the base URL's checks, sending one request
and reading a JSON body. Each upstream's client adds its endpoints, headers and rate-limit reading.
"""

from __future__ import annotations

import email.utils
from types import TracebackType
from typing import Any, ClassVar, Final, Self

import httpx

from agentwake.text import peer

# How much of the upstream's message an error carries.
MESSAGE_CHARS: Final = 300


class ApiError(Exception):
    """An API call that failed: a non-2xx answer, a body that is not what the endpoint returns, or
    (status 0) no answer at all. Each client subclasses it to name its upstream."""

    upstream: ClassVar[str] = "the"

    def __init__(self, status: int, method: str, path: str, message: str, *, reason: str = "") -> None:
        self.status = status
        self.method = method
        self.path = path
        self.message = message
        outcome = f"{status} {reason}".rstrip() if status else "no response"
        super().__init__(f"{self.upstream} API: {method} {path}: {outcome}: {message}")


class RetryAt(ApiError):
    """A rate limit; ``retry_at`` is epoch seconds. Mixed into each client's own ``RateLimited``."""

    def __init__(
        self, status: int, method: str, path: str, message: str, *, reason: str = "", retry_at: float
    ) -> None:
        super().__init__(status, method, path, message, reason=reason)
        self.retry_at = retry_at


def retry_after(value: str, now: float) -> float | None:
    """Retry-After as epoch seconds: delta seconds or an HTTP date."""
    value = value.strip()
    if value.isdigit():
        return now + int(value)
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


def base_url(value: str, credential: str) -> httpx.URL:
    """``value`` as an http(s) URL with a host and no credentials in it; ValueError otherwise, naming
    ``credential`` (how the client takes its secret) but never quoting the URL: a mistyped one may
    hold a credential."""
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL:
        url = httpx.URL()
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError("the API base URL must be an http(s) URL with a host")
    if url.userinfo:
        raise ValueError(f"the API base URL must not carry credentials: pass the {credential}")
    return url


class ApiClient:
    """An ``httpx`` client at one base URL that follows no redirect, retries nothing, and keeps its
    secret out of every error it raises."""

    error: ClassVar[type[ApiError]] = ApiError
    # What stands for the secret in a library's message that quoted it.
    redacted: ClassVar[str] = "[secret]"

    def __init__(
        self,
        url: httpx.URL,
        headers: dict[str, str],
        secret: str | None,
        timeout_s: float,
        transport: httpx.AsyncBaseTransport | None,
    ) -> None:
        self.base_url = str(url)
        self._secret = secret
        self._client = httpx.AsyncClient(
            base_url=url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=False,
            transport=transport,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _send(self, method: str, path: str, **request: Any) -> httpx.Response:
        """The answer to one request, whatever its status; no answer at all is a status 0 error."""
        try:
            return await self._client.request(method, path, **request)
        except httpx.TimeoutException:
            raise self.error(0, method, path, "timed out") from None
        except httpx.HTTPError as exc:
            # from None: the cause holds the request, and with it the Authorization header.
            raise self.error(0, method, path, self._scrub(f"{type(exc).__name__}: {exc}")) from None

    def _scrub(self, text: str) -> str:
        """A message from a library, bounded, without the secret even if the library quoted a header."""
        if self._secret:
            text = text.replace(self._secret, self.redacted)
        return peer(text, MESSAGE_CHARS)

    @classmethod
    def _json(cls, response: httpx.Response, method: str, path: str) -> Any:
        try:
            return response.json()
        except ValueError:
            raise cls.error(
                response.status_code,
                method,
                path,
                f"the response is not JSON: {peer(response.text, 100)!r}",
                reason=response.reason_phrase,
            ) from None

    @classmethod
    def _shape_error(cls, response: httpx.Response, method: str, path: str, expected: str) -> ApiError:
        return cls.error(
            response.status_code,
            method,
            path,
            f"expected {expected}, got {peer(response.text, 100)!r}",
            reason=response.reason_phrase,
        )
