"""The PagerDuty REST API (v2) calls the PagerDuty bridge makes: its tools' reads and writes, its poller's lists.

A thin ``httpx`` client for the handful of endpoints the bridge relays, not a PagerDuty SDK.
The official ``pagerduty`` package is not used: it is synchronous (``requests``), so every
call would need a thread, and it retries on its own, where a tool's write must not happen
twice because a response was lost. Here every call validates its inputs before anything is
sent (an id is letters and digits, a level a positive int), sends PagerDuty's versioned
media type and ``Authorization: Token token=<key>``, follows no redirect and retries nothing.

Writes (acknowledge, resolve, escalate, notes) carry ``From: <email>``, the PagerDuty user
they are done as: an account-level API key has no user of its own, and PagerDuty refuses a
write without one. With no From email the client refuses writes before sending.

Every failure is a ``PagerDutyError`` naming the method, the path and PagerDuty's own message,
bounded; a 429 is a ``RateLimited`` carrying when to try again (``Retry-After``, else
``ratelimit-reset``); a connection that fails is status 0. The key lives in the client's
headers only: no exception text, repr or log line carries it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

import httpx

from agentwake.bridges import _http
from agentwake.clock import iso
from agentwake.jsontext import encode_json
from agentwake.text import peer

PAGERDUTY_API: Final = "https://api.pagerduty.com"
MEDIA_TYPE: Final = "application/vnd.pagerduty+json;version=2"

# How much of the upstream's message an error carries.
MESSAGE_CHARS: Final = _http.MESSAGE_CHARS
# A 429 that says nothing about when: PagerDuty's limits are per minute.
DEFAULT_RETRY_S: Final = 60.0
MAX_LIMIT: Final = 100
MAX_ESCALATION_LEVEL: Final = 20
MAX_NOTE_CHARS: Final = 25_000
STATUSES: Final = ("triggered", "acknowledged", "resolved")

# PagerDuty ids are letters and digits (PIJ90N7, Q02JTSNZWHSEKV): nothing that could leave the path segment.
_ID: Final = re.compile(r"[A-Za-z0-9]{1,64}")
# A key and an email go into headers as they are: anything else would make the HTTP library quote them in an error.
_KEY: Final = re.compile(r"[\x21-\x7e]+")
# One address: no "@" in its parts, no "," that would make it a list.
_EMAIL: Final = re.compile(r"[\x21-\x2b\x2d-\x3f\x41-\x7e]{1,64}@[\x21-\x2b\x2d-\x3f\x41-\x7e]{1,189}")

Method = Literal["GET", "POST", "PUT"]
Params = Sequence[tuple[str, str]]


class PagerDutyError(_http.ApiError):
    """A PagerDuty API call that failed: a non-2xx answer, a body that is not what the endpoint returns,
    or (status 0) no answer at all."""

    upstream = "PagerDuty"


class RateLimited(_http.RetryAt, PagerDutyError):
    """A 429: PagerDuty's rate limit; ``retry_at`` is epoch seconds."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    """The quota as the last response's ``ratelimit-*`` headers told it (None until one did)."""

    limit: int | None = None
    remaining: int | None = None
    reset_at: float | None = None


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a list: its items, and whether PagerDuty has more after it (``offset`` + ``limit``)."""

    items: list[dict[str, Any]]
    more: bool


# -- input validation --------------------------------------------------------------------------


def pagerduty_id(value: str, what: str = "an incident id") -> str:
    """``value`` if it is a PagerDuty id (letters and digits); ValueError naming ``what`` otherwise."""
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise ValueError(f"{what} is letters and digits (like PT4KHLK), not {peer(value, 80)!r}")
    return value


def _level(level: int) -> int:
    if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= MAX_ESCALATION_LEVEL:
        raise ValueError(f"an escalation level is 1 to {MAX_ESCALATION_LEVEL}, not {peer(level, 40)}")
    return level


def _limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit is 1 to {MAX_LIMIT}, not {peer(limit, 40)}")
    return limit


def _offset(offset: int) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset is 0 or more, not {peer(offset, 40)}")
    return offset


def _statuses(statuses: Sequence[str]) -> list[str]:
    if isinstance(statuses, str) or not all(status in STATUSES for status in statuses):
        raise ValueError(f"statuses is a list of {', '.join(STATUSES)}")
    return list(statuses)


def _moment(value: datetime, what: str) -> str:
    if not isinstance(value, datetime):
        raise ValueError(f"{what} is a datetime")
    return iso(value)


def email_address(value: str) -> str:
    """``value`` if it can go into the ``From`` header as an email; ValueError otherwise (without the value)."""
    if not isinstance(value, str) or len(value) > 254 or not _EMAIL.fullmatch(value):
        raise ValueError("the From email must be one address, like oncall-bot@example.com")
    return value


# -- response reading --------------------------------------------------------------------------


def _header_float(headers: httpx.Headers, name: str) -> float | None:
    try:
        value = float(headers[name])
    except (KeyError, ValueError):
        return None
    return value if value >= 0 else None


def _reset_at(headers: httpx.Headers, now: float) -> float | None:
    """``ratelimit-reset`` as epoch seconds: PagerDuty sends the seconds left in the window."""
    reset = _header_float(headers, "ratelimit-reset")
    if reset is None:
        return None
    # An epoch time instead (some proxies rewrite it so) is kept as it is.
    return reset if reset > 1_000_000_000 else now + reset


def read_rate_limit(headers: httpx.Headers, previous: RateLimit, now: float) -> RateLimit:
    """The quota from a response's headers; the previous one when the response has none."""
    if not any(name.lower().startswith("ratelimit-") for name in headers):
        return previous
    limit, remaining = (
        _header_float(headers, "ratelimit-limit"),
        _header_float(headers, "ratelimit-remaining"),
    )
    return RateLimit(
        limit=int(limit) if limit is not None else None,
        remaining=int(remaining) if remaining is not None else None,
        reset_at=_reset_at(headers, now),
    )


def _upstream_message(response: httpx.Response) -> str:
    """PagerDuty's ``error.message`` with its ``errors``, else the start of whatever the body was."""
    try:
        body = response.json()
    except ValueError:
        return peer(response.text, MESSAGE_CHARS) if response.content else ""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return peer(encode_json(body), MESSAGE_CHARS)
    message = error.get("message")
    text = message if isinstance(message, str) else ""
    errors = error.get("errors")
    if isinstance(errors, list) and errors:
        text = f"{text}: {'; '.join(str(e) for e in errors)}" if text else "; ".join(str(e) for e in errors)
    if error.get("code") is not None:
        text = f"{text} (code {error['code']})".strip()
    return peer(text or encode_json(body), MESSAGE_CHARS)


def _error(response: httpx.Response, method: str, path: str) -> PagerDutyError:
    message = _upstream_message(response)
    status, reason = response.status_code, response.reason_phrase
    if status != 429:
        return PagerDutyError(status, method, path, message, reason=reason)
    now = time.time()
    retry_after = response.headers.get("Retry-After")
    retry_at = _http.retry_after(retry_after, now) if retry_after is not None else None
    if retry_at is None:
        retry_at = _reset_at(response.headers, now)
    return RateLimited(
        status, method, path, message, reason=reason, retry_at=retry_at or now + DEFAULT_RETRY_S
    )


# -- the client --------------------------------------------------------------------------------


class PagerDutyAPI(_http.ApiClient):
    """PagerDuty's REST API at ``base_url`` (EU service region: ``https://api.eu.pagerduty.com``)."""

    error = PagerDutyError
    redacted = "[key]"

    def __init__(
        self,
        *,
        base_url: str = PAGERDUTY_API,
        api_key: str | None = None,
        from_email: str | None = None,
        timeout_s: float = 30.0,
        user_agent: str = "agentwake-bridge",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        url = _http.base_url(base_url, "key as api_key")
        if api_key is not None and not _KEY.fullmatch(api_key):
            raise ValueError("the PagerDuty API key must be printable ASCII without spaces")
        headers = {"Accept": MEDIA_TYPE, "User-Agent": user_agent}
        if api_key is not None:
            headers["Authorization"] = f"Token token={api_key}"
        self.from_email = email_address(from_email) if from_email is not None else None
        super().__init__(url, headers, api_key, timeout_s, transport)
        self.rate_limit = RateLimit()

    def __repr__(self) -> str:
        authenticated = "with a key" if self._secret else "without a key"
        return f"<PagerDutyAPI {self.base_url} {authenticated}>"

    # -- who the key is ------------------------------------------------------------------------

    async def me(self) -> dict[str, Any]:
        """The user a user-level API key authenticates (GET /users/me; an account-level key gets a 400)."""
        return await self._get_object("/users/me", "user")

    async def user_by_email(self, address: str) -> dict[str, Any] | None:
        """The user with exactly this email (GET /users?query=), or None."""
        path = "/users"
        response = await self._call("GET", path, params=[("query", email_address(address))])
        for user in self._list(response, "GET", path, "users")[0]:
            if isinstance(user.get("email"), str) and user["email"].casefold() == address.casefold():
                return user
        return None

    # -- tools ---------------------------------------------------------------------------------

    async def get_incident(self, incident_id: str) -> dict[str, Any]:
        """An incident (GET /incidents/{id})."""
        return await self._get_object(f"/incidents/{pagerduty_id(incident_id)}", "incident")

    async def acknowledge(self, incident_id: str) -> dict[str, Any]:
        """Acknowledge an incident as the From user; returns the incident."""
        return await self._update(incident_id, {"status": "acknowledged"})

    async def resolve(self, incident_id: str) -> dict[str, Any]:
        """Resolve an incident as the From user; returns the incident."""
        return await self._update(incident_id, {"status": "resolved"})

    async def escalate(self, incident_id: str, level: int) -> dict[str, Any]:
        """Escalate an incident to a level of its escalation policy; returns the incident."""
        return await self._update(incident_id, {"escalation_level": _level(level)})

    async def add_note(self, incident_id: str, content: str) -> dict[str, Any]:
        """Add a note to an incident's timeline as the From user; returns the note."""
        if not isinstance(content, str) or not content.strip() or len(content) > MAX_NOTE_CHARS:
            raise ValueError(f"a note is 1 to {MAX_NOTE_CHARS} characters of text")
        path = f"/incidents/{pagerduty_id(incident_id)}/notes"
        response = await self._call("POST", path, json={"note": {"content": content}}, write=True)
        return self._field(response, "POST", path, "note")

    async def list_incidents(
        self,
        *,
        since: datetime,
        until: datetime,
        service_ids: Sequence[str] = (),
        statuses: Sequence[str] = (),
        limit: int = 25,
        offset: int = 0,
        sort_by: str | None = None,
    ) -> Page:
        """Incidents created in [since, until), of these services and statuses (none given: all)."""
        if isinstance(service_ids, str):
            raise ValueError("service_ids is a list of service ids")
        params: list[tuple[str, str]] = [
            ("since", _moment(since, "since")),
            ("until", _moment(until, "until")),
            ("limit", str(_limit(limit))),
            ("offset", str(_offset(offset))),
        ]
        params += [("service_ids[]", pagerduty_id(s, "a service id")) for s in service_ids]
        params += [("statuses[]", status) for status in _statuses(statuses)]
        if sort_by is not None:
            params.append(("sort_by", sort_by))
        return await self._page("/incidents", params, "incidents")

    # -- polling -------------------------------------------------------------------------------

    async def log_entries(
        self, *, since: datetime, until: datetime, limit: int = 100, offset: int = 0
    ) -> Page:
        """The account's overview log entries (triggers, acknowledgements, escalations, resolutions) in
        [since, until), each with its whole incident (``include[]=incidents``)."""
        params = [
            ("since", _moment(since, "since")),
            ("until", _moment(until, "until")),
            ("is_overview", "true"),
            ("include[]", "incidents"),
            ("limit", str(_limit(limit))),
            ("offset", str(_offset(offset))),
        ]
        return await self._page("/log_entries", params, "log_entries")

    # -- internals -----------------------------------------------------------------------------

    async def _update(self, incident_id: str, change: dict[str, Any]) -> dict[str, Any]:
        path = f"/incidents/{pagerduty_id(incident_id)}"
        body = {"incident": {"type": "incident_reference", **change}}
        response = await self._call("PUT", path, json=body, write=True)
        return self._field(response, "PUT", path, "incident")

    async def _get_object(self, path: str, key: str) -> dict[str, Any]:
        return self._field(await self._call("GET", path), "GET", path, key)

    async def _page(self, path: str, params: Params, key: str) -> Page:
        items, body = self._list(await self._call("GET", path, params=params), "GET", path, key)
        return Page(items=items, more=body.get("more") is True)

    async def _call(
        self,
        method: Method,
        path: str,
        *,
        params: Params | None = None,
        json: Any = None,
        write: bool = False,
    ) -> httpx.Response:
        headers: Mapping[str, str] | None = None
        if write:
            if self.from_email is None:
                raise ValueError(
                    "PagerDuty writes need the email of the user they are done as (--from-email)"
                )
            headers = {"From": self.from_email}
        response = await self._send(method, path, params=list(params or ()), json=json, headers=headers)
        self.rate_limit = read_rate_limit(response.headers, self.rate_limit, time.time())
        if response.is_success:
            return response
        raise _error(response, method, path)

    def _field(self, response: httpx.Response, method: str, path: str, key: str) -> dict[str, Any]:
        """The object under ``key`` of a response body (PagerDuty wraps each: ``{"incident": {...}}``)."""
        body = self._json(response, method, path)
        value = body.get(key) if isinstance(body, dict) else None
        if not isinstance(value, dict):
            raise self._shape_error(response, method, path, f'an object with an object "{key}"')
        return value

    def _list(
        self, response: httpx.Response, method: str, path: str, key: str
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The list of objects under ``key`` of a response body, and the body (its ``more``)."""
        body = self._json(response, method, path)
        items = body.get(key) if isinstance(body, dict) else None
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise self._shape_error(response, method, path, f'an object with a list of objects "{key}"')
        return items, body
