"""The GitHub bridge: GitHub webhooks or API polling in, MCP events out; GitHub actions as tools.

Webhook ingress (``--listen``), in the order GitHub's deliveries are checked:

1. the body is read whole (at most ``--max-body-bytes``, else 413) and
   ``X-Hub-Signature-256`` (``sha256=`` + HMAC-SHA256 of the raw body with the webhook
   secret) is compared in constant time: missing or wrong is 401, before anything else
   of the delivery is looked at;
2. ``X-GitHub-Event`` and ``X-GitHub-Delivery`` must be there (400);
3. ``ping`` (sent when the webhook is created) is answered 200 ``pong``;
4. a delivery id already received is a replay: answered 200 ``duplicate`` (so a sender
   that retries stops) and stores nothing;
5. the payload is mapped (``github_events``); an event we do not emit, or one the token's own
   account caused (the agent's own comment must not wake it again), is remembered and
   answered 202 ``ignored``;
6. an event that happened more than ``--max-delivery-age`` ago is stale (400). GitHub
   signs no timestamp, so the occurrence's own time in the signed body is the clock;
   delivery ids are remembered for twice that long, so a replay is caught by one or the other;
7. the event is committed to the log, then the delivery is answered 202 ``accepted``.

Poll ingress (``--poll --repo OWNER/NAME``): per repository, the events API (issue
comments, pull requests, releases, discussions), the issues API (new issues), the Actions runs API (failed
workflow runs) and the Dependabot, code scanning and secret scanning alert lists (new alerts, by
number), each a conditional GET with the ETag of the last answer (a 304 costs
GitHub no rate limit). ``X-Poll-Interval`` and the rate-limit headers set the pace. What
was there before the first poll is not emitted; events ids are the webhook's, so both
ingress paths may run at once without duplicates. A changed feed is read page after page
(its ``Link: rel="next"``) back to the newest item the last poll saw, at most
``MAX_POLL_PAGES`` pages and never into the rate limit's reserve; when the feed's history
does not reach back that far (the page bound is hit, or its last page is full and has no
next) the missed stretch is recorded in the log as a gap, which its readers see as
``truncated``. An alert list GitHub refuses (401, 403 or 404: the feature is off for the repository,
or the token lacks the permission) is warned about once and not asked again until restart.

Tools call the REST API (``github_api``) with the token named by ``--token-env``;
``close_issue`` and ``create_issue`` are registered only with ``--allow-tool`` naming them.
``comment`` and ``create_issue`` post their ``@login`` and ``@org/team`` mentions as plain text
(agentwake.bridges.mentions) unless called with ``allow_mentions``, which the policy pins to false
unless its rule allows it.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final
from urllib.parse import parse_qs

import anyio
from aiohttp import web
from pydantic import Field

from agentwake.bridges import github_alert_events, github_events, mentions
from agentwake.bridges._payload import json_body
from agentwake.bridges.framework import (
    Bridge,
    BridgeOptions,
    BridgeServer,
    bridge_event_types,
    check_optional_tools,
    refuse,
    short_age,
)
from agentwake.bridges.github_api import GITHUB_API, GitHubAPI, GitHubError, Page, RateLimited
from agentwake.bridges.log import NewEvent
from agentwake.clock import iso, parse_iso

logger = logging.getLogger("agentwake.bridge.github")

DESCRIPTION: Final = (
    "GitHub as MCP events: issues, comments, pull requests, failed CI, releases, discussions and"
    " security alerts from GitHub webhooks or API polling, with tools to read, label, comment, assign,"
    " request reviews, search, and open, close and reopen issues."
)
SIGNATURE_HEADER: Final = "X-Hub-Signature-256"
DEFAULT_MAX_DELIVERY_AGE: Final = timedelta(hours=24)
DEFAULT_POLL_INTERVAL_S: Final = 60.0
# Below this many requests left, the poller waits for the rate limit's reset.
RATE_LIMIT_RESERVE: Final = 50
# How many pages of one feed a poll reads at most, to reach back to the last item seen.
MAX_POLL_PAGES: Final = 10
# The event types each polled feed can produce: what a gap in that feed may have lost.
EVENTS_FEED_TYPES: Final = (
    "issues.opened",
    "issue_comment.created",
    "pull_request.opened",
    "pull_request.review_requested",
    "issues.reopened",
    "issues.closed",
    "issues.labeled",
    "issues.assigned",
    "issues.edited",
    "issues.transferred",
    "issue_comment.edited",
    "pull_request.reopened",
    "pull_request.closed",
    "pull_request.synchronize",
    "pull_request.ready_for_review",
    "pull_request_review_comment.created",
    "release.published",
    "discussion.created",
)
ISSUES_FEED_TYPES: Final = ("issues.opened",)
RUNS_FEED_TYPES: Final = ("workflow_run.completed",)
# An alert list GitHub answers so is off for the repository or the token: asking again will not help.
ALERTS_UNAVAILABLE: Final = frozenset({401, 403, 404})
# What to enable or grant, per alert kind, when GitHub refuses its list.
ALERTS_NEED: Final = {
    "dependabot_alert": "enable Dependabot alerts in the repository's security settings, and give the"
    ' token the "Dependabot alerts" read permission (classic token: security_events or repo)',
    "code_scanning_alert": "enable code scanning (GitHub Code Security / Advanced Security on a private"
    ' repository), and give the token the "Code scanning alerts" read permission (classic token:'
    " security_events or repo)",
    "secret_scanning_alert": "enable secret scanning (GitHub Secret Protection / Advanced Security on a"
    ' private repository), and give the token the "Secret scanning alerts" read permission (classic'
    " token: security_events or repo)",
}
OWN_LOGIN_RETRY_S: Final = 60.0
# Short: a webhook waits for it when it was not learnt at start, and GitHub gives a delivery 10 s.
OWN_LOGIN_TIMEOUT_S: Final = 5.0
# Off unless --allow-tool names them: closing hides an issue, and opening one writes where people read.
OPTIONAL_TOOLS: Final = ("close_issue", "create_issue")
TOOLS: Final = (
    "get_issue",
    "add_labels",
    "remove_label",
    "comment",
    "assign",
    "request_reviewers",
    "search_issues",
    "reopen_issue",
    "close_issue",
    "create_issue",
)

Repository = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$",
        max_length=200,
        description='The repository as "owner/name".',
    ),
]
Number = Annotated[int, Field(ge=1, description="The issue or pull request number.")]


@dataclass(frozen=True)
class GitHubSettings:
    """What ``agentwake bridge github`` takes beyond the common bridge options."""

    webhook_secret: bytes | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    api_base: str = GITHUB_API
    repos: tuple[str, ...] = ()
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    max_delivery_age: timedelta = DEFAULT_MAX_DELIVERY_AGE
    allowed_tools: tuple[str, ...] = ()
    ignore_own_actions: bool = True
    poll_max_pages: int = MAX_POLL_PAGES


def signature_valid(secret: bytes, body: bytes, header: str | None) -> bool:
    """Whether ``header`` is GitHub's ``sha256=<hex HMAC-SHA256 of body>``, compared in constant time."""
    if not header or not header.startswith("sha256="):
        return False
    expected = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header.strip().encode("ascii", "replace"))


class GitHubBridge(Bridge):
    name = "github"
    description = DESCRIPTION
    event_types = bridge_event_types(
        github_events.EVENT_TYPES,
        github_events.PAYLOAD_SCHEMAS,
        dict.fromkeys(github_events.EVENT_TYPES, github_events.ARGUMENTS_SCHEMA),
        github_events.matches,
    )

    def __init__(self, options: BridgeOptions, settings: GitHubSettings) -> None:
        super().__init__(options)
        check_optional_tools(settings.allowed_tools, OPTIONAL_TOOLS)
        if options.listen and not settings.webhook_secret:
            raise ValueError("--listen needs the webhook secret: set the variable --webhook-secret-env names")
        if options.poll and not settings.repos:
            raise ValueError("--poll needs at least one --repo OWNER/NAME")
        self.settings = settings
        self.api = GitHubAPI(base_url=settings.api_base, token=settings.token)
        # Beyond the stale bound a replay is refused as stale; within it, by its remembered id.
        self.delivery_memory = max(2 * settings.max_delivery_age, Bridge.delivery_memory)
        # (repository, alert kind) whose list GitHub refused: not polled again until restart.
        self.alerts_off: set[tuple[str, str]] = set()

    async def background(self) -> None:
        # Learnt at start, so the first webhook does not wait for GitHub's answer.
        await self._learn_own_login()

    async def _learn_own_login(self) -> None:
        if not self.settings.ignore_own_actions or not self.settings.token or self._own_login is not None:
            return
        if time.monotonic() < self._own_login_retry_at:
            return
        self._own_login_retry_at = time.monotonic() + OWN_LOGIN_RETRY_S
        try:
            with anyio.fail_after(OWN_LOGIN_TIMEOUT_S):
                self._own_login = str((await self.api.viewer())["login"])
        except (GitHubError, KeyError, TimeoutError) as exc:
            logger.warning(
                "cannot learn the token's own account, so its actions may wake the agent: %s",
                exc or "no answer in time",
            )

    async def is_own_action(self, mapped: github_events.Mapped) -> bool:
        """Whether the event was caused by the token's own account: the agent's comment must not
        wake the agent again. Unknown (no token, GitHub unreachable) counts as not own."""
        if not self.settings.ignore_own_actions or not self.settings.token:
            return False
        await self._learn_own_login()
        own = self._own_login
        return own is not None and str(mapped.data.get("actor", "")).casefold() == own.casefold()

    _own_login: str | None = None
    _own_login_retry_at: float = 0.0

    async def aclose(self) -> None:
        await self.api.aclose()

    # ---- webhook ingress -------------------------------------------------------

    async def handle_webhook(self, request: web.Request) -> web.StreamResponse:
        secret = self.settings.webhook_secret
        assert secret is not None
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return refuse(413, f"the body is over {self.options.max_body_bytes} bytes")
        if not signature_valid(secret, body, request.headers.get(SIGNATURE_HEADER)):
            logger.warning("webhook: refused a delivery with a missing or wrong %s", SIGNATURE_HEADER)
            return refuse(401, f"missing or wrong {SIGNATURE_HEADER}")
        kind = request.headers.get("X-GitHub-Event", "")
        delivery = request.headers.get("X-GitHub-Delivery", "")
        if not kind or not delivery or len(delivery) > 200:
            return refuse(400, "X-GitHub-Event and X-GitHub-Delivery are required")
        if kind == "ping":
            return web.json_response({"status": "pong"})
        if await self.server_of().seen_delivery(delivery):
            logger.info("webhook: delivery %s was received before; ignored", delivery)
            return web.json_response({"status": "duplicate", "delivery": delivery})
        try:
            payload = _payload(body, request.content_type)
            mapped = github_events.from_webhook(kind, payload)
        except (ValueError, github_events.Unmapped) as exc:
            return refuse(400, f"unreadable {kind} payload: {exc}")
        if mapped is None or await self.is_own_action(mapped):
            await self.accept([], source="webhook", delivery_id=delivery)
            return web.json_response({"status": "ignored", "delivery": delivery}, status=202)
        age = datetime.now(UTC) - mapped.occurred_at
        if age > self.settings.max_delivery_age:
            logger.warning(
                "webhook: refused stale delivery %s (%s, %s old)", delivery, mapped.type, short_age(age)
            )
            return refuse(400, f"stale delivery: the event happened {short_age(age)} ago")
        if kind == "secret_scanning_alert" and isinstance(alert := payload.get("alert"), dict):
            alert.pop("secret", None)  # the leaked value is not kept, not even in the raw payload
        added = await self.accept(
            [NewEvent.of(mapped, payload)],
            source="webhook",
            delivery_id=delivery,
        )
        logger.info("webhook: %s %s (%s)", mapped.type, mapped.event_id, "new" if added else "already logged")
        return web.json_response({"status": "accepted", "delivery": delivery}, status=202)

    # ---- poll ingress ----------------------------------------------------------

    async def poll_forever(self) -> None:
        while True:
            wait = self.settings.poll_interval_s
            for repo in self.settings.repos:
                try:
                    wait = max(wait, await self.poll_repo(repo))
                except RateLimited as exc:
                    pause = max(0.0, exc.retry_at - time.time())
                    logger.warning("poll %s: rate limited; next poll in %.0fs", repo, pause)
                    wait = max(wait, pause)
                except GitHubError as exc:
                    logger.warning("poll %s: %s", repo, exc)
            limit = self.api.rate_limit
            if limit.remaining is not None and limit.remaining < RATE_LIMIT_RESERVE and limit.reset_at:
                wait = max(wait, limit.reset_at - time.time())
            await anyio.sleep(wait)

    async def poll_repo(self, repo: str) -> float:
        """One round over a repository's feeds; returns the interval GitHub asks for (or 0)."""
        log = self.server_of().log
        since = await anyio.to_thread.run_sync(log.get_state, f"{repo}:since")
        if since is None:
            # Whole seconds, as GitHub's timestamps are: an item of this very second is news.
            since = iso(datetime.now(UTC).replace(microsecond=0))
            await anyio.to_thread.run_sync(log.set_state, f"{repo}:since", since)
        # Nor what the log would already have pruned: logged again, it would come back as news.
        baseline = max(parse_iso(since) or datetime.now(UTC), datetime.now(UTC) - self.options.retention)
        events = await self._poll_feed(
            f"{repo}:events",
            lambda etag: self.api.repo_events(repo, etag=etag),
            github_events.from_repo_event,
            baseline,
            EVENTS_FEED_TYPES,
        )
        await self._poll_feed(
            f"{repo}:issues",
            lambda etag: self.api.repo_issues(repo, etag=etag, since=since),
            lambda item: github_events.from_issue(item, repo),
            baseline,
            ISSUES_FEED_TYPES,
        )
        await self._poll_feed(
            f"{repo}:runs",
            lambda etag: self.api.workflow_runs(repo, etag=etag),
            lambda run: github_events.from_workflow_run(run, repo),
            baseline,
            RUNS_FEED_TYPES,
        )
        for kind in github_alert_events.KINDS:
            await self._poll_alerts(repo, kind, baseline)
        return float(events.poll_interval_s or 0)

    async def _poll_alerts(self, repo: str, kind: str, baseline: datetime) -> None:
        """New alerts of one kind, by number; a list GitHub refuses is given up until restart."""
        if (repo, kind) in self.alerts_off:
            return
        # Its own start too: polled first by an upgraded bridge, the alerts before now are history.
        log, started_key = self.server_of().log, f"{repo}:{kind}:since"
        started = await anyio.to_thread.run_sync(log.get_state, started_key)
        if started is None:
            started = iso(datetime.now(UTC).replace(microsecond=0))
            await anyio.to_thread.run_sync(log.set_state, started_key, started)
        baseline = max(baseline, parse_iso(started) or baseline)

        def fetch(etag: str | None) -> Awaitable[Page]:
            return self.api.security_alerts(repo, kind, etag=etag)

        try:
            await self._poll_feed(
                f"{repo}:{kind}",
                fetch,
                lambda alert: github_alert_events.from_alert(kind, alert, repo),
                baseline,
                (f"{kind}.created",),
                item_id=_alert_number,
            )
        except RateLimited:
            raise
        except GitHubError as exc:
            if exc.status not in ALERTS_UNAVAILABLE:
                # Passing (a 5xx, a malformed page): the other kinds are still polled, this one next time.
                logger.warning("poll %s:%s: %s", repo, kind, exc)
                return
            self.alerts_off.add((repo, kind))
            logger.warning(
                "poll %s: GitHub refused the %s list (%s %s); not polling it again until restart: %s"
                " (its webhook still works)",
                repo,
                kind.replace("_", " ") + "s",
                exc.status,
                exc.message,
                ALERTS_NEED[kind],
            )

    async def _poll_feed(
        self,
        key: str,
        fetch: Callable[[str | None], Awaitable[Page]],
        mapper: Callable[[dict[str, Any]], github_events.Mapped | None],
        baseline: datetime,
        types: tuple[str, ...],
        *,
        item_id: Callable[[dict[str, Any]], int | None] | None = None,
    ) -> Page:
        """One poll of a feed: its new events into the log, then its ETag and newest item stored.

        In that order: a crash in between fetches the pages again, and the log's event ids
        drop what it already kept. What happened before ``baseline`` (the first poll) is history.
        A changed first page is followed by the next ones until one holds the newest item the
        last poll saw (see ``read_back``); a first poll reads its first page only. ``item_id`` is
        how an item's growing id is read (its ``id`` by default).
        """
        id_of = item_id or _item_id
        log = self.server_of().log
        etag_key, newest_key = f"{key}:etag", f"{key}:newest"
        etag = await anyio.to_thread.run_sync(log.get_state, etag_key)
        first = await fetch(etag)
        if not first.changed:
            return first
        newest = await anyio.to_thread.run_sync(log.get_state, newest_key)
        pages, outcome = [first], ReadBack.REACHED
        if isinstance(newest, int):
            pages, outcome = await self._read_back(key, first, newest, id_of)
        fresh = []
        # Oldest first, so the log holds them in the order they happened.
        for item in reversed([item for page in pages for item in page.items]):
            try:
                mapped = mapper(item)
            except github_events.Unmapped as exc:
                logger.warning("poll %s: skipped an item: %s", key, exc)
                continue
            if mapped is not None and mapped.occurred_at >= baseline and not await self.is_own_action(mapped):
                fresh.append(NewEvent.of(mapped, item))
        gap = outcome is ReadBack.GAP
        if gap:
            logger.warning(
                "poll %s: the feed does not reach back to the last item seen (%d page(s) read):"
                " what happened in between is lost, and recorded as a gap",
                key,
                len(pages),
            )
        if fresh or gap:
            added = await self.accept(fresh, source="poll", gap_types=types if gap else ())
            if added:
                logger.info("poll %s: %d new event(s)", key, added)
        if outcome is ReadBack.STOPPED:
            return first  # the rest next time: the same pages again, then further back
        seen = [number for item in first.items if (number := id_of(item)) is not None]
        if isinstance(newest, int):
            seen.append(newest)
        await anyio.to_thread.run_sync(log.set_state, newest_key, max(seen, default=0))
        if first.etag is not None:
            await anyio.to_thread.run_sync(log.set_state, etag_key, first.etag)
        return first

    async def _read_back(
        self, key: str, first: Page, newest: int, item_id: Callable[[dict[str, Any]], int | None]
    ) -> tuple[list[Page], ReadBack]:
        """``first`` and the pages after it, up to the one that holds an item at or before ``newest``."""
        pages = [first]
        while True:
            outcome = read_back(pages, newest, self.settings.poll_max_pages, item_id=item_id)
            if outcome is not ReadBack.MORE:
                return pages, outcome
            limit = self.api.rate_limit
            if limit.remaining is not None and limit.remaining < RATE_LIMIT_RESERVE:
                logger.warning(
                    "poll %s: stopped after %d page(s) to keep the rate limit's reserve", key, len(pages)
                )
                return pages, ReadBack.STOPPED
            page = await self.api.next_page(pages[-1])
            assert page is not None  # read_back says MORE only when there is a next page
            pages.append(page)

    # ---- tools -----------------------------------------------------------------

    def register_tools(self, server: BridgeServer) -> None:
        from mcp.server.mcpserver.exceptions import ToolError

        mcp, api = server.mcp, self.api

        async def call(action: Any) -> Any:
            try:
                return await action
            except (GitHubError, ValueError) as exc:
                raise ToolError(str(exc)) from None

        @mcp.tool()
        async def get_issue(repository: Repository, number: Number) -> dict[str, Any]:
            """Read an issue or pull request: title, body, labels, state, assignees."""
            result: dict[str, Any] = await call(api.get_issue(repository, number))
            return result

        @mcp.tool()
        async def add_labels(
            repository: Repository,
            number: Number,
            labels: Annotated[
                list[Annotated[str, Field(min_length=1, max_length=50)]], Field(min_length=1, max_length=20)
            ],
        ) -> list[dict[str, Any]]:
            """Add labels to an issue or pull request; returns its labels."""
            result: list[dict[str, Any]] = await call(api.add_labels(repository, number, labels))
            return result

        @mcp.tool()
        async def remove_label(
            repository: Repository, number: Number, label: Annotated[str, Field(min_length=1, max_length=50)]
        ) -> list[dict[str, Any]]:
            """Remove one label from an issue or pull request; returns the labels left."""
            result: list[dict[str, Any]] = await call(api.remove_label(repository, number, label))
            return result

        @mcp.tool()
        async def comment(
            repository: Repository,
            number: Number,
            body: Annotated[
                str,
                Field(
                    min_length=1,
                    max_length=65_536,
                    description="The comment, in GitHub Markdown. Unless allow_mentions, its @login and"
                    " @org/team mentions are posted as plain text that notifies no one.",
                ),
            ],
            allow_mentions: Annotated[
                bool,
                Field(
                    description="Post the body as given, so its @login and @org/team mentions notify."
                    " Only honoured when the policy rule allows it (allow_mentions = true); otherwise it is"
                    " set to false.",
                ),
            ] = False,
        ) -> dict[str, Any]:
            """Comment on an issue or pull request (Markdown); returns the comment."""
            text = body if allow_mentions else mentions.github_markdown(body)
            result: dict[str, Any] = await call(api.comment(repository, number, text))
            return result

        @mcp.tool()
        async def assign(
            repository: Repository,
            number: Number,
            assignees: Annotated[
                list[Annotated[str, Field(min_length=1, max_length=39)]], Field(min_length=1, max_length=10)
            ],
        ) -> dict[str, Any]:
            """Assign people (GitHub logins) to an issue or pull request."""
            result: dict[str, Any] = await call(api.assign(repository, number, assignees))
            return result

        @mcp.tool()
        async def request_reviewers(
            repository: Repository,
            number: Number,
            reviewers: Annotated[
                list[Annotated[str, Field(min_length=1, max_length=39)]], Field(max_length=15)
            ] = [],  # noqa: B006
            team_reviewers: Annotated[
                list[Annotated[str, Field(min_length=1, max_length=100)]], Field(max_length=15)
            ] = [],  # noqa: B006
        ) -> dict[str, Any]:
            """Request reviews on a pull request from people (logins) and teams (slugs)."""
            if not reviewers and not team_reviewers:
                raise ToolError("give at least one reviewer or team_reviewer")
            result: dict[str, Any] = await call(
                api.request_reviewers(repository, number, list(reviewers), list(team_reviewers))
            )
            return result

        @mcp.tool()
        async def search_issues(
            query: Annotated[str, Field(min_length=1, max_length=256)],
            per_page: Annotated[int, Field(ge=1, le=30)] = 5,
        ) -> dict[str, Any]:
            """Search issues and pull requests with GitHub's search syntax (e.g. 'repo:o/r is:issue crash on start'),
            to find likely duplicates."""
            result: dict[str, Any] = await call(api.search_issues(query, per_page=per_page))
            return result

        @mcp.tool()
        async def reopen_issue(repository: Repository, number: Number) -> dict[str, Any]:
            """Reopen a closed issue; returns the issue."""
            result: dict[str, Any] = await call(api.reopen_issue(repository, number))
            return result

        if "close_issue" in self.settings.allowed_tools:

            @mcp.tool()
            async def close_issue(
                repository: Repository,
                number: Number,
                reason: Annotated[str, Field(pattern="^(completed|not_planned|duplicate)$")] = "completed",
                duplicate_of: Annotated[
                    int | None,
                    Field(
                        ge=1,
                        description="With reason duplicate: the number of the original issue, which the"
                        ' bridge names in a comment "Duplicate of #N" (GitHub links the two from it).',
                    ),
                ] = None,
            ) -> dict[str, Any]:
                """Close an issue as completed, not_planned or duplicate (of duplicate_of)."""
                if duplicate_of is not None:
                    if reason != "duplicate":
                        raise ToolError("duplicate_of goes with reason duplicate")
                    if duplicate_of == number:
                        raise ToolError("an issue is not a duplicate of itself")
                    # GitHub's REST API takes no link to the original; this comment is GitHub's own way.
                    await call(api.comment(repository, number, f"Duplicate of #{duplicate_of}"))
                result: dict[str, Any] = await call(api.close_issue(repository, number, reason=reason))
                return result

        if "create_issue" in self.settings.allowed_tools:

            @mcp.tool()
            async def create_issue(
                repository: Repository,
                title: Annotated[str, Field(min_length=1, max_length=256)],
                body: Annotated[
                    str,
                    Field(
                        max_length=65_536,
                        description="The issue, in GitHub Markdown. Unless allow_mentions, its @login and"
                        " @org/team mentions are posted as plain text that notifies no one.",
                    ),
                ] = "",
                labels: Annotated[
                    list[Annotated[str, Field(min_length=1, max_length=50)]], Field(max_length=20)
                ] = [],  # noqa: B006
                allow_mentions: Annotated[
                    bool,
                    Field(
                        description="Post the body as given, so its mentions notify. Only honoured when the"
                        " policy rule allows it (allow_mentions = true); otherwise it is set to false.",
                    ),
                ] = False,
            ) -> dict[str, Any]:
                """Open an issue (Markdown), with labels; returns the issue."""
                text = body if allow_mentions else mentions.github_markdown(body)
                result: dict[str, Any] = await call(
                    api.create_issue(repository, title, text, labels=list(labels))
                )
                return result


class ReadBack(enum.Enum):
    """Where reading a feed back to the last item seen stands."""

    MORE = "more"  # read the next page
    REACHED = "reached"  # the pages read hold everything since the last item seen
    GAP = "gap"  # they do not, and no more pages will be read: something was missed
    STOPPED = "stopped"  # the poller stopped early (the rate limit): the next poll reads them again


def read_back(
    pages: list[Page],
    newest: int,
    max_pages: int,
    *,
    item_id: Callable[[dict[str, Any]], int | None] | None = None,
) -> ReadBack:
    """Whether the pages of a feed (newest first) reach back to ``newest``, the largest item id the
    last poll saw (0 when the feed was empty then).

    GitHub's feed ids grow with time, so a page holding an id at or below ``newest`` reaches it.
    Otherwise the next page is read, unless the last one has no next (the feed's history ends
    there: a gap if that page was full, as when the events API stops at its 300th event, the whole
    feed if it was not) or ``max_pages`` were read (a gap). ``item_id`` reads an item's id (its
    ``id`` by default; an alert's ``number``).
    """
    id_of = item_id or _item_id
    for page in pages:
        if any(number <= newest for item in page.items if (number := id_of(item)) is not None):
            return ReadBack.REACHED
    last = pages[-1]
    if last.next_url is None:
        return ReadBack.GAP if len(last.items) >= last.per_page else ReadBack.REACHED
    return ReadBack.GAP if len(pages) >= max_pages else ReadBack.MORE


def _item_id(item: dict[str, Any]) -> int | None:
    """A feed item's id as a number (the events API gives it as a string of digits), or None."""
    value = item.get("id")
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        return int(value)
    return None


def _alert_number(item: dict[str, Any]) -> int | None:
    """An alert's number: it grows with time within its repository and kind, as feed ids do."""
    value = item.get("number")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _payload(body: bytes, content_type: str) -> dict[str, Any]:
    """The JSON payload, sent as JSON or, when the webhook is so configured, form-encoded."""
    if content_type == "application/x-www-form-urlencoded":
        fields = parse_qs(body.decode("utf-8", "replace"))
        if "payload" not in fields:
            raise ValueError("a form-encoded delivery without its payload field")
        text = fields["payload"][0]
    else:
        text = body.decode("utf-8")
    value = json_body(text)
    if not isinstance(value, dict):
        raise ValueError("the payload is not a JSON object")
    return value
