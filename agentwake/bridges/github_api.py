"""The GitHub REST calls the GitHub bridge makes: its tools' writes and its poller's conditional GETs.

A thin ``httpx`` client for the handful of endpoints the bridge relays, not a GitHub SDK:
every call validates its inputs before anything is sent (a repository is ``owner/name``,
an issue number a positive int, a label name goes out as one percent-encoded path
segment), sends GitHub's versioned media type, follows no redirect and retries nothing
(a tool's write must not happen twice because a response was lost).

Every failure is a ``GitHubError`` naming the method, the path and the upstream's own
message, bounded; a rate limit is a ``RateLimited`` carrying when to try again; a
connection that fails is status 0. The token lives in the client's headers only: no
exception text, repr or log line carries it.

The polling calls are conditional: given the ETag of the last page they send
``If-None-Match``, and a 304 (which GitHub does not count against the rate limit) comes
back as a ``Page`` with ``changed=False``. A page carries the URL of the next one from its
``Link: <...>; rel="next"`` header, and ``next_page`` fetches it; a next URL that is not
under the base URL is dropped, so the token goes nowhere else. A secret scanning alert's leaked
``secret`` is never asked for (``hide_secret=true``) and is dropped from every item that has it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import quote

import httpx

from agentwake.bridges import _http
from agentwake.jsontext import encode_json
from agentwake.text import peer

GITHUB_API: Final = "https://api.github.com"
API_VERSION: Final = "2022-11-28"
MEDIA_TYPE: Final = "application/vnd.github+json"

# How much of the upstream's message an error carries.
MESSAGE_CHARS: Final = _http.MESSAGE_CHARS
# GitHub's guidance for a secondary rate limit that says nothing about when: wait a minute.
DEFAULT_RETRY_S: Final = 60.0
# GitHub's close reasons; "duplicate" is accepted by the REST API, which takes no link to the original.
CLOSE_REASONS: Final = frozenset({"completed", "not_planned", "duplicate"})
MAX_PER_PAGE: Final = 100
# Each security alert kind's list endpoint, under the repository.
ALERT_PATHS: Final = {
    "dependabot_alert": "dependabot/alerts",
    "code_scanning_alert": "code-scanning/alerts",
    "secret_scanning_alert": "secret-scanning/alerts",
}

# GitHub's rules: an owner is at most 39 characters, a repository name at most 100.
_OWNER: Final = re.compile(r"[A-Za-z0-9_.-]{1,39}")
_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,100}")
# A token goes into a header as it is: anything else would make the HTTP library quote it in an error.
_TOKEN: Final = re.compile(r"[\x21-\x7e]+")

Method = Literal["GET", "POST", "PATCH", "DELETE"]


class GitHubError(_http.ApiError):
    """A GitHub API call that failed: a non-2xx answer, a body that is not what the endpoint returns,
    or (status 0) no answer at all."""

    upstream = "GitHub"


class RateLimited(_http.RetryAt, GitHubError):
    """A 403 or 429 that is GitHub's rate limit (primary or secondary); ``retry_at`` is epoch seconds."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    """The quota as the last response's ``X-RateLimit-*`` headers told it (None until one did)."""

    limit: int | None = None
    remaining: int | None = None
    reset_at: float | None = None
    resource: str | None = None


@dataclass(frozen=True, slots=True)
class Page:
    """A conditional GET's outcome: the items, or ``changed=False`` when the upstream answered 304."""

    changed: bool
    items: list[dict[str, Any]]
    etag: str | None
    poll_interval_s: int | None
    # The next page's URL (its Link header's rel="next"), None on the last page.
    next_url: str | None = None
    # How many items a full page holds (the per_page asked for).
    per_page: int = MAX_PER_PAGE
    # Where the items are in the body: None for a bare list, else the key of an object.
    key: str | None = None
    # Keys dropped from every item of the listing, on this page and the next ones.
    drop: tuple[str, ...] = ()


# -- input validation --------------------------------------------------------------------------


def repo_path(repo: str) -> str:
    """``/repos/owner/name`` for ``owner/name``; ValueError for anything else."""
    if not isinstance(repo, str):
        raise ValueError("a repository is a string 'owner/name'")
    parts = repo.split("/")
    if len(parts) != 2:
        raise ValueError(f"a repository is 'owner/name', not {peer(repo, 100)!r}")
    owner, name = parts
    for part, pattern in ((owner, _OWNER), (name, _NAME)):
        # "." and ".." would be dot segments: the URL would lose them and reach another path.
        if not pattern.fullmatch(part) or part in (".", ".."):
            raise ValueError(
                f"a repository is 'owner/name' of letters, digits, '-', '_' and '.', not {peer(repo, 100)!r}"
            )
    return f"/repos/{owner}/{name}"


def _issue_number(number: int) -> int:
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ValueError(f"an issue or pull request number is a positive integer, not {peer(number, 40)}")
    return number


def _strings(values: Sequence[str], what: str) -> list[str]:
    # A bare string is a Sequence[str] too: "bug" must not become ["b", "u", "g"].
    if isinstance(values, str | bytes) or not all(isinstance(v, str) and v for v in values):
        raise ValueError(f"{what} must be a list of non-empty strings")
    return list(values)


def _per_page(per_page: int) -> int:
    if isinstance(per_page, bool) or not isinstance(per_page, int) or not 1 <= per_page <= MAX_PER_PAGE:
        raise ValueError(f"per_page is 1 to {MAX_PER_PAGE}, not {peer(per_page, 40)}")
    return per_page


def path_segment(value: str) -> str:
    """``value`` as exactly one path segment: every reserved character quoted, dot segments too."""
    if not value:
        raise ValueError("a path segment cannot be empty")
    if value.strip(".") == "":
        return "%2E" * len(value)
    return quote(value, safe="")


# -- response reading --------------------------------------------------------------------------


def _header_int(headers: httpx.Headers, name: str) -> int | None:
    try:
        return int(headers[name])
    except (KeyError, ValueError):
        return None


def read_rate_limit(headers: httpx.Headers, previous: RateLimit) -> RateLimit:
    """The quota from a response's headers; the previous one when the response has none (a proxy's)."""
    if not any(name.lower().startswith("x-ratelimit-") for name in headers):
        return previous
    reset = _header_int(headers, "X-RateLimit-Reset")
    return RateLimit(
        limit=_header_int(headers, "X-RateLimit-Limit"),
        remaining=_header_int(headers, "X-RateLimit-Remaining"),
        reset_at=float(reset) if reset is not None else None,
        resource=headers.get("X-RateLimit-Resource"),
    )


def _upstream_message(response: httpx.Response) -> str:
    """GitHub's ``message`` (with its validation ``errors``), else the start of whatever the body was."""
    try:
        body = response.json()
    except ValueError:
        return peer(response.text, MESSAGE_CHARS) if response.content else ""
    if not isinstance(body, dict):
        return peer(encode_json(body), MESSAGE_CHARS)
    message = body.get("message")
    text = message if isinstance(message, str) else ""
    errors = body.get("errors")
    if errors:
        text = f"{text} {encode_json(errors)}".strip()
    return peer(text or encode_json(body), MESSAGE_CHARS)


def _rate_limit_retry_at(response: httpx.Response, message: str, now: float) -> float | None:
    """When to try again if this 403/429 is a rate limit; None if it is a plain refusal."""
    if response.status_code not in (403, 429):
        return None
    retry_after = response.headers.get("Retry-After")
    if retry_after is not None:
        retry_at = _http.retry_after(retry_after, now)
        return retry_at if retry_at is not None else now + DEFAULT_RETRY_S
    if response.headers.get("X-RateLimit-Remaining") == "0":
        reset = _header_int(response.headers, "X-RateLimit-Reset")
        return float(reset) if reset is not None else now + DEFAULT_RETRY_S
    # A secondary limit may come with neither header; a 429 is a rate limit by definition.
    if response.status_code == 429 or "rate limit" in message.lower():
        return now + DEFAULT_RETRY_S
    return None


def _error(response: httpx.Response, method: str, path: str) -> GitHubError:
    message = _upstream_message(response)
    status, reason = response.status_code, response.reason_phrase
    retry_at = _rate_limit_retry_at(response, message, time.time())
    if retry_at is not None:
        return RateLimited(status, method, path, message, reason=reason, retry_at=retry_at)
    return GitHubError(status, method, path, message, reason=reason)


# -- the client --------------------------------------------------------------------------------


class GitHubAPI(_http.ApiClient):
    """GitHub's REST API at ``base_url`` (GitHub Enterprise: ``https://ghe.example/api/v3``)."""

    error = GitHubError
    redacted = "[token]"

    def __init__(
        self,
        *,
        base_url: str = GITHUB_API,
        token: str | None = None,
        timeout_s: float = 30.0,
        user_agent: str = "agentwake-bridge",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        url = _http.base_url(base_url, "token as token")
        if token is not None and not _TOKEN.fullmatch(token):
            raise ValueError("the GitHub token must be printable ASCII without spaces")
        headers = {"Accept": MEDIA_TYPE, "X-GitHub-Api-Version": API_VERSION, "User-Agent": user_agent}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        super().__init__(url, headers, token, timeout_s, transport)
        self.rate_limit = RateLimit()

    def __repr__(self) -> str:
        authenticated = "with a token" if self._secret else "without a token"
        return f"<GitHubAPI {self.base_url} {authenticated}>"

    async def viewer(self) -> dict[str, Any]:
        """The account the token authenticates (GET /user)."""
        return self._object(await self._call("GET", "/user"), "GET", "/user")

    # -- tools ---------------------------------------------------------------------------------

    async def get_issue(self, repo: str, number: int) -> dict[str, Any]:
        """An issue (or a pull request, seen as an issue)."""
        path = f"{repo_path(repo)}/issues/{_issue_number(number)}"
        return self._object(await self._call("GET", path), "GET", path)

    async def add_labels(self, repo: str, number: int, labels: Sequence[str]) -> list[dict[str, Any]]:
        """Add labels (GitHub creates the ones the repository lacks); returns the issue's labels now."""
        path = f"{repo_path(repo)}/issues/{_issue_number(number)}/labels"
        body = {"labels": _strings(labels, "labels")}
        return self._objects(await self._call("POST", path, json=body), "POST", path)

    async def remove_label(self, repo: str, number: int, label: str) -> list[dict[str, Any]]:
        """Remove one label; returns the issue's remaining labels."""
        if not isinstance(label, str) or not label:
            raise ValueError("a label is a non-empty string")
        path = f"{repo_path(repo)}/issues/{_issue_number(number)}/labels/{path_segment(label)}"
        return self._objects(await self._call("DELETE", path), "DELETE", path)

    async def comment(self, repo: str, number: int, body: str) -> dict[str, Any]:
        """Comment on an issue or pull request; returns the comment."""
        if not isinstance(body, str):
            raise ValueError("a comment body is a string")
        path = f"{repo_path(repo)}/issues/{_issue_number(number)}/comments"
        return self._object(await self._call("POST", path, json={"body": body}), "POST", path)

    async def assign(self, repo: str, number: int, assignees: Sequence[str]) -> dict[str, Any]:
        """Add assignees (GitHub ignores logins that cannot be assigned); returns the issue."""
        path = f"{repo_path(repo)}/issues/{_issue_number(number)}/assignees"
        body = {"assignees": _strings(assignees, "assignees")}
        return self._object(await self._call("POST", path, json=body), "POST", path)

    async def request_reviewers(
        self, repo: str, number: int, reviewers: Sequence[str], team_reviewers: Sequence[str] = ()
    ) -> dict[str, Any]:
        """Request reviews on a pull request; returns the pull request."""
        path = f"{repo_path(repo)}/pulls/{_issue_number(number)}/requested_reviewers"
        body: dict[str, list[str]] = {"reviewers": _strings(reviewers, "reviewers")}
        teams = _strings(team_reviewers, "team_reviewers")
        if teams:
            body["team_reviewers"] = teams
        return self._object(await self._call("POST", path, json=body), "POST", path)

    async def search_issues(self, query: str, *, per_page: int = 10) -> dict[str, Any]:
        """GitHub's issue search: ``{"total_count", "incomplete_results", "items"}``."""
        if not isinstance(query, str) or not query.strip():
            raise ValueError("a search query is a non-empty string")
        path = "/search/issues"
        params = {"q": query, "per_page": str(_per_page(per_page))}
        return self._object(await self._call("GET", path, params=params), "GET", path)

    async def create_issue(
        self, repo: str, title: str, body: str, *, labels: Sequence[str] = ()
    ) -> dict[str, Any]:
        """Open an issue (GitHub creates the labels the repository lacks); returns the issue."""
        if not isinstance(title, str) or not title.strip():
            raise ValueError("an issue title is a non-empty string")
        if not isinstance(body, str):
            raise ValueError("an issue body is a string")
        path = f"{repo_path(repo)}/issues"
        payload: dict[str, Any] = {"title": title, "body": body}
        names = _strings(labels, "labels")
        if names:
            payload["labels"] = names
        return self._object(await self._call("POST", path, json=payload), "POST", path)

    async def reopen_issue(self, repo: str, number: int) -> dict[str, Any]:
        """Reopen a closed issue; returns the issue."""
        path = f"{repo_path(repo)}/issues/{_issue_number(number)}"
        body = {"state": "open", "state_reason": "reopened"}
        return self._object(await self._call("PATCH", path, json=body), "PATCH", path)

    async def close_issue(self, repo: str, number: int, *, reason: str = "completed") -> dict[str, Any]:
        """Close an issue as ``completed``, ``not_planned`` or ``duplicate``; returns the issue."""
        if reason not in CLOSE_REASONS:
            raise ValueError(f"a close reason is one of {sorted(CLOSE_REASONS)}, not {peer(reason, 40)!r}")
        path = f"{repo_path(repo)}/issues/{_issue_number(number)}"
        body = {"state": "closed", "state_reason": reason}
        return self._object(await self._call("PATCH", path, json=body), "PATCH", path)

    # -- polling -------------------------------------------------------------------------------

    async def repo_events(self, repo: str, *, etag: str | None = None, per_page: int = 100) -> Page:
        """The repository's activity feed, newest first (GitHub keeps its last 300 events, 90 days at most)."""
        path = f"{repo_path(repo)}/events"
        return await self._page(path, {"per_page": str(_per_page(per_page))}, etag, key=None)

    async def next_page(self, page: Page) -> Page | None:
        """The page after ``page`` in the same listing (an unconditional GET), or None on the last one."""
        if page.next_url is None:
            return None
        return await self._page(
            page.next_url, None, None, key=page.key, per_page=page.per_page, drop=page.drop
        )

    async def repo_issues(
        self, repo: str, *, etag: str | None = None, since: str | None = None, per_page: int = 100
    ) -> Page:
        """Issues and pull requests in every state, newest first; ``since`` bounds their last update."""
        path = f"{repo_path(repo)}/issues"
        params = {
            "state": "all",
            "sort": "created",
            "direction": "desc",
            "per_page": str(_per_page(per_page)),
        }
        if since is not None:
            params["since"] = since
        return await self._page(path, params, etag, key=None)

    async def workflow_runs(self, repo: str, *, etag: str | None = None, per_page: int = 50) -> Page:
        """The repository's completed workflow runs, newest first."""
        path = f"{repo_path(repo)}/actions/runs"
        params = {"status": "completed", "per_page": str(_per_page(per_page))}
        return await self._page(path, params, etag, key="workflow_runs")

    async def security_alerts(
        self, repo: str, kind: str, *, etag: str | None = None, per_page: int = 100
    ) -> Page:
        """A repository's Dependabot, code scanning or secret scanning alerts (``kind`` is the webhook's
        event name), in every state, newest first. A secret scanning alert's leaked ``secret`` is asked
        to be left out (``hide_secret``) and dropped if it comes all the same."""
        if kind not in ALERT_PATHS:
            raise ValueError(f"an alert kind is one of {sorted(ALERT_PATHS)}, not {peer(kind, 40)!r}")
        path = f"{repo_path(repo)}/{ALERT_PATHS[kind]}"
        params = {"sort": "created", "direction": "desc", "per_page": str(_per_page(per_page))}
        drop: tuple[str, ...] = ()
        if kind == "secret_scanning_alert":
            params["hide_secret"] = "true"
            drop = ("secret",)
        return await self._page(path, params, etag, key=None, drop=drop)

    # -- internals -----------------------------------------------------------------------------

    async def _page(
        self,
        path: str,
        params: dict[str, str] | None,
        etag: str | None,
        *,
        key: str | None,
        per_page: int | None = None,
        drop: tuple[str, ...] = (),
    ) -> Page:
        headers = {"If-None-Match": etag} if etag else None
        response = await self._call("GET", path, params=params, headers=headers, not_modified_ok=True)
        where = response.request.url.path
        poll_interval_s = _header_int(response.headers, "X-Poll-Interval")
        if per_page is None:
            per_page = int(params["per_page"]) if params and "per_page" in params else MAX_PER_PAGE
        if response.status_code == 304:
            return Page(changed=False, items=[], etag=etag, poll_interval_s=poll_interval_s, key=key)
        body = self._json(response, "GET", where)
        if key is not None:
            body = body.get(key) if isinstance(body, dict) else None
        items = self._objects_of(body, response, "GET", where)
        if drop:
            items = [{k: v for k, v in item.items() if k not in drop} for item in items]
        return Page(
            changed=True,
            items=items,
            etag=response.headers.get("ETag"),
            poll_interval_s=poll_interval_s,
            next_url=self._next_url(response),
            per_page=per_page,
            key=key,
            drop=drop,
        )

    def _next_url(self, response: httpx.Response) -> str | None:
        """The Link header's rel="next" URL, if it is under the base URL (same origin and path prefix)."""
        link = response.links.get("next", {}).get("url")
        if not link:
            return None
        try:
            url = response.request.url.join(link)
        except httpx.InvalidURL:
            return None
        base = httpx.URL(self.base_url)
        prefix = base.path.rstrip("/") + "/"
        if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port) or not url.path.startswith(
            prefix
        ):
            return None
        return str(url)

    async def _call(
        self,
        method: Method,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        not_modified_ok: bool = False,
    ) -> httpx.Response:
        response = await self._send(method, path, params=params, json=json, headers=headers)
        self.rate_limit = read_rate_limit(response.headers, self.rate_limit)
        if response.is_success or (not_modified_ok and response.status_code == 304):
            return response
        raise _error(response, method, path)

    def _object(self, response: httpx.Response, method: str, path: str) -> dict[str, Any]:
        body = self._json(response, method, path)
        if not isinstance(body, dict):
            raise self._shape_error(response, method, path, "an object")
        return body

    def _objects(self, response: httpx.Response, method: str, path: str) -> list[dict[str, Any]]:
        return self._objects_of(self._json(response, method, path), response, method, path)

    def _objects_of(
        self, body: Any, response: httpx.Response, method: str, path: str
    ) -> list[dict[str, Any]]:
        if not isinstance(body, list) or not all(isinstance(item, dict) for item in body):
            raise self._shape_error(response, method, path, "a list of objects")
        return body
