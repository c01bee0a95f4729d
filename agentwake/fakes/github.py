"""A fake GitHub REST API on loopback, for the GitHub bridge's tests and offline walkthroughs.

It keeps repositories, issues, pull requests, comments, workflow runs, releases, discussions, security
alerts (Dependabot, code scanning, secret scanning) and each repository's events feed in memory, and answers the endpoints the bridge uses with JSON shaped as
GitHub's REST API shapes it: 404 ``Not Found`` for what does not exist, 422 for bodies
GitHub refuses, 401 ``Bad credentials`` without the token, ETags that change with the
content and 304 on a matching ``If-None-Match``, ``X-Poll-Interval`` on the events feed,
``X-RateLimit-*`` on every answer (and 403 once the quota is spent). Lists are paginated as
GitHub paginates them: ``per_page`` (30 by default, at most 100) and ``page``, with a ``Link``
header naming the ``prev``, ``next``, ``first`` and ``last`` pages as absolute URLs (omitted
when everything fits on one page); the events feed holds only the newest ``events_cap`` (300)
events, and a page past them is 422, as on GitHub. The alert lists sort by ``created`` or ``updated``
in either ``direction`` and filter by ``state`` as GitHub's do (GitHub pages the Dependabot list
with cursors in its ``Link``, the fake with ``page``: a client that follows ``Link`` sees no
difference); the secret scanning list leaves out each alert's ``secret`` with ``hide_secret=true``.
``disable_alerts`` makes a list answer as GitHub does when the feature is off (403 or 404).

Writes through the API behave as on GitHub: they change the issue and add the matching
event to the feed (a comment posted by the bridge shows up as an ``IssueCommentEvent``
whose actor is ``viewer_login``, as the bridge's own would on GitHub).

It is one module of over 700 lines because it is one API's fake: splitting it by endpoint
would scatter the shared state every endpoint reads.

Tests drive it directly::

    async with FakeGitHub() as gh:
        issue = gh.open_issue("octo/repo", title="Crash on start")
        ...  # point the code under test at gh.url, token "test-token"
        seen = await gh.wait_for("POST", "/repos/octo/repo/issues/1/labels")

``python -m agentwake.fakes.github --port N [--repo owner/name]`` serves it until interrupted,
printing its URL on stdout (``POST /repos/{owner}/{repo}/issues`` opens issues, as on GitHub).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import itertools
import json
import secrets
import sys
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any
from urllib.parse import quote, unquote, urlencode

from aiohttp import web

from agentwake.fakes._http import Headers, RecordingFake, until_stopped

HTML_BASE = "https://github.com"
DOCS = "https://docs.github.com/rest"
RATE_LIMIT = 5000
# GitHub's feed pages: 30 items unless per_page says otherwise, never more than 100.
DEFAULT_PER_PAGE = 30
MAX_PER_PAGE = 100
STATE_REASONS = {"completed", "not_planned", "reopened", "duplicate"}
# The alert kinds (as their webhooks are named), their list paths under a repository, and how GitHub
# refuses a list when the feature is off for the repository.
ALERT_PATHS = {
    "dependabot_alert": ("dependabot", "alerts"),
    "code_scanning_alert": ("code-scanning", "alerts"),
    "secret_scanning_alert": ("secret-scanning", "alerts"),
}
ALERT_REFUSALS = {
    "dependabot_alert": (403, "Dependabot alerts are disabled for this repository."),
    "code_scanning_alert": (
        403,
        "Advanced Security must be enabled for this repository to use code scanning.",
    ),
    "secret_scanning_alert": (404, "Secret scanning is disabled on this repository."),
}


def now_iso() -> str:
    """GitHub's timestamp form: UTC to the second with a trailing Z."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Recorded:
    """One request as the fake received it. ``path`` is the raw path, percent-encoding kept."""

    method: str
    path: str
    query: dict[str, str]
    headers: Headers
    json: Any | None


@dataclass
class _Call:
    """A request being answered: the recorded form plus the path split into decoded segments."""

    recorded: Recorded
    segments: list[str]
    raw_body: bytes

    @property
    def query(self) -> dict[str, str]:
        return self.recorded.query


@dataclass
class _Repo:
    data: dict[str, Any]
    issues: dict[int, dict[str, Any]] = field(default_factory=dict)
    pulls: dict[int, dict[str, Any]] = field(default_factory=dict)  # number -> the pull-only fields
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)
    labels: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)  # oldest first; served newest first
    runs: list[dict[str, Any]] = field(default_factory=list)  # oldest first; served newest first
    releases: dict[int, dict[str, Any]] = field(default_factory=dict)  # id -> release
    discussions: dict[int, dict[str, Any]] = field(default_factory=dict)  # number -> discussion
    next_number: int = 1  # issues, pull requests and discussions share one sequence, as on GitHub
    # Each alert kind numbers its own alerts from 1, oldest first.
    alerts: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {k: [] for k in ALERT_PATHS})
    alerts_refused: dict[str, tuple[int, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Failure:
    status: int
    message: str | None
    headers: dict[str, str]


class ApiError(Exception):
    """An answer other than success, raised by a handler."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"message": message, **extra, "documentation_url": DOCS}


def _not_found() -> ApiError:
    return ApiError(404, "Not Found")


def _invalid(message: str = "Validation Failed", **extra: Any) -> ApiError:
    return ApiError(422, message, **extra)


def _etag(body: Any) -> str:
    return '"' + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32] + '"'


def _per_page(query: dict[str, str]) -> int:
    try:
        return max(1, min(MAX_PER_PAGE, int(query.get("per_page", DEFAULT_PER_PAGE))))
    except ValueError:
        return DEFAULT_PER_PAGE


def _page_number(query: dict[str, str]) -> int:
    try:
        return max(1, int(query.get("page", "1")))
    except ValueError:
        return 1


def _page(items: list[dict[str, Any]], query: dict[str, str]) -> list[dict[str, Any]]:
    per_page, page = _per_page(query), _page_number(query)
    return items[(page - 1) * per_page : page * per_page]


def _link(url: str, query: dict[str, str], total: int) -> str | None:
    """GitHub's ``Link`` header for page ``query["page"]`` of ``total`` items at ``url``; None for one page."""
    per_page, page = _per_page(query), _page_number(query)
    last = max(1, -(-total // per_page))
    if last == 1:
        return None

    def at(number: int) -> str:
        return f"{url}?{urlencode({**query, 'per_page': str(per_page), 'page': str(number)})}"

    links = []
    if page > 1:
        links.append(f'<{at(page - 1)}>; rel="prev"')
    if page < last:
        links.append(f'<{at(page + 1)}>; rel="next"')
        links.append(f'<{at(last)}>; rel="last"')
    if page > 1:
        links.append(f'<{at(1)}>; rel="first"')
    return ", ".join(links)


class FakeGitHub(RecordingFake[Recorded]):
    """GitHub's REST API in memory, served on 127.0.0.1 on a free port."""

    def __init__(self, *, token: str | None = "test-token", port: int = 0, path_prefix: str = "") -> None:
        """``path_prefix`` (like GitHub Enterprise's ``/api/v3``) goes into ``url`` and every recorded path."""
        super().__init__(port)
        self.token = token
        self.path_prefix = path_prefix.rstrip("/")
        # Knobs a test may change at any time.
        self.poll_interval_s = 60
        self.rate_limit_remaining = RATE_LIMIT
        self.rate_limit_reset = int(time.time()) + 3600
        self.viewer_login = "agentwake-bot"  # whom the token authenticates: the actor of API writes
        self.viewer_type = "User"
        # GitHub's events feed keeps the newest 300 events; a page past them is refused.
        self.events_cap = 300
        self._repos: dict[str, _Repo] = {}
        self._users: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1_000_001)
        self._failures: deque[_Failure] = deque()

    def _base_path(self) -> str:
        return self.path_prefix

    # -- state: set up -------------------------------------------------------------------------

    def add_repo(self, full_name: str) -> dict[str, Any]:
        """A public repository (the same one if it exists); returns its JSON."""
        if full_name not in self._repos:
            owner, name = full_name.split("/")
            repo_id = next(self._ids)
            self._repos[full_name] = _Repo(
                data={
                    "id": repo_id,
                    "node_id": f"R_{repo_id}",
                    "name": name,
                    "full_name": full_name,
                    "private": False,
                    "owner": self._user(owner, "Organization" if owner != "octocat" else "User"),
                    "html_url": f"{HTML_BASE}/{full_name}",
                    "description": None,
                    "fork": False,
                    "url": self._api(f"/repos/{full_name}"),
                    "events_url": self._api(f"/repos/{full_name}/events"),
                    "issues_url": self._api(f"/repos/{full_name}/issues{{/number}}"),
                    "pulls_url": self._api(f"/repos/{full_name}/pulls{{/number}}"),
                    "created_at": now_iso(),
                    "updated_at": now_iso(),
                    "pushed_at": now_iso(),
                    "default_branch": "main",
                    "visibility": "public",
                }
            )
        return copy.deepcopy(self._repos[full_name].data)

    def open_issue(
        self,
        repo: str,
        *,
        title: str,
        body: str = "",
        user: str = "octocat",
        user_type: str = "User",
        labels: Iterable[str] = (),
        pull_request: bool = False,
    ) -> dict[str, Any]:
        """A new issue (or pull request) by ``user``, with its IssuesEvent (PullRequestEvent) in the feed."""
        self.add_repo(repo)
        issue = self._new_issue(repo, title=title, body=body, author=self._user(user, user_type))
        for name in labels:
            issue["labels"].append(self._label(repo, name))
        if pull_request:
            self._make_pull(repo, issue)
            self._event(repo, "PullRequestEvent", issue["user"], self._pull_payload(repo, issue, "opened"))
        else:
            self._event(
                repo, "IssuesEvent", issue["user"], {"action": "opened", "issue": copy.deepcopy(issue)}
            )
        return copy.deepcopy(issue)

    def add_comment(
        self, repo: str, number: int, *, body: str, user: str = "octocat", user_type: str = "User"
    ) -> dict[str, Any]:
        """A comment by ``user`` on an issue or pull request, with its IssueCommentEvent in the feed."""
        return copy.deepcopy(
            self._comment(repo, self._issue(repo, number), body, self._user(user, user_type))
        )

    def add_workflow_run(
        self,
        repo: str,
        *,
        name: str = "CI",
        head_branch: str = "main",
        conclusion: str | None = "success",
        status: str = "completed",
        actor: str = "octocat",
    ) -> dict[str, Any]:
        """A workflow run in the repository's actions runs list."""
        self.add_repo(repo)
        state = self._repos[repo]
        run_id = next(self._ids)
        head_sha = hashlib.sha1(f"{repo}{run_id}".encode()).hexdigest()
        who = self._user(actor)
        stamp = now_iso()
        run = {
            "id": run_id,
            "name": name,
            "node_id": f"WFR_{run_id}",
            "head_branch": head_branch,
            "head_sha": head_sha,
            "path": f".github/workflows/{name.lower().replace(' ', '-')}.yml",
            "display_title": f"Update {head_branch}",
            "run_number": len(state.runs) + 1,
            "event": "push",
            "status": status,
            "conclusion": conclusion if status == "completed" else None,
            "workflow_id": int(hashlib.sha1(name.encode()).hexdigest()[:6], 16),
            "url": self._api(f"/repos/{repo}/actions/runs/{run_id}"),
            "html_url": f"{HTML_BASE}/{repo}/actions/runs/{run_id}",
            "jobs_url": self._api(f"/repos/{repo}/actions/runs/{run_id}/jobs"),
            "logs_url": self._api(f"/repos/{repo}/actions/runs/{run_id}/logs"),
            "created_at": stamp,
            "updated_at": stamp,
            "run_started_at": stamp,
            "run_attempt": 1,
            "actor": who,
            "triggering_actor": who,
            "head_commit": {
                "id": head_sha,
                "message": f"Update {head_branch}",
                "timestamp": stamp,
                "author": {"name": actor, "email": f"{actor}@users.noreply.github.com"},
            },
            "repository": self._repo_brief(repo),
            "head_repository": self._repo_brief(repo),
        }
        state.runs.append(run)
        return copy.deepcopy(run)

    def fail_workflow_run(self, repo: str, *, name: str = "CI", head_branch: str = "main") -> dict[str, Any]:
        """A completed workflow run whose conclusion is ``failure``."""
        return self.add_workflow_run(repo, name=name, head_branch=head_branch, conclusion="failure")

    def request_review(self, repo: str, number: int, reviewer: str, *, by: str = "octocat") -> dict[str, Any]:
        """``by`` asks ``reviewer`` to review a pull request, with its PullRequestEvent in the feed."""
        issue = self._issue(repo, number)
        extra = self._repos[repo].pulls[number]
        who = self._user(reviewer)
        if not any(r["login"] == reviewer for r in extra["requested_reviewers"]):
            extra["requested_reviewers"].append(who)
        issue["updated_at"] = now_iso()
        payload = self._pull_payload(repo, issue, "review_requested", requested_reviewer=who)
        self._event(repo, "PullRequestEvent", self._user(by), payload)
        return self._pull_json(repo, issue)

    def publish_release(
        self,
        repo: str,
        *,
        tag: str,
        name: str = "",
        body: str = "",
        prerelease: bool = False,
        user: str = "octocat",
        user_type: str = "User",
    ) -> dict[str, Any]:
        """A release published by ``user``, with its ReleaseEvent (action ``published``) in the feed."""
        self.add_repo(repo)
        release_id = next(self._ids)
        stamp = now_iso()
        release: dict[str, Any] = {
            "url": self._api(f"/repos/{repo}/releases/{release_id}"),
            "html_url": f"{HTML_BASE}/{repo}/releases/tag/{quote(tag, safe='')}",
            "id": release_id,
            "node_id": f"RE_{release_id}",
            "tag_name": tag,
            "target_commitish": "main",
            "name": name,
            "draft": False,
            "prerelease": prerelease,
            "author": self._user(user, user_type),
            "created_at": stamp,
            "published_at": stamp,
            "assets": [],
            "body": body or None,
        }
        self._repos[repo].releases[release_id] = release
        self._event(repo, "ReleaseEvent", release["author"], {"action": "published", "release": release})
        return copy.deepcopy(release)

    def start_discussion(
        self,
        repo: str,
        *,
        title: str,
        body: str = "",
        category: str = "General",
        user: str = "octocat",
        user_type: str = "User",
    ) -> dict[str, Any]:
        """A discussion started by ``user``, with its DiscussionEvent (action ``created``) in the feed."""
        self.add_repo(repo)
        state = self._repos[repo]
        number, state.next_number = state.next_number, state.next_number + 1
        discussion_id = next(self._ids)
        author = self._user(user, user_type)
        stamp = now_iso()
        slug = category.lower().replace(" ", "-")
        discussion = {
            "repository_url": self._api(f"/repos/{repo}"),
            "category": {"id": next(self._ids), "name": category, "slug": slug, "is_answerable": False},
            "html_url": f"{HTML_BASE}/{repo}/discussions/{number}",
            "id": discussion_id,
            "node_id": f"D_{discussion_id}",
            "number": number,
            "title": title,
            "user": author,
            "state": "open",
            "locked": False,
            "comments": 0,
            "created_at": stamp,
            "updated_at": stamp,
            "author_association": "OWNER" if author["login"] == state.data["owner"]["login"] else "NONE",
            "body": body,
        }
        state.discussions[number] = discussion
        self._event(repo, "DiscussionEvent", author, {"action": "created", "discussion": discussion})
        return copy.deepcopy(discussion)

    def add_dependabot_alert(
        self,
        repo: str,
        *,
        package: str = "semver",
        ecosystem: str = "npm",
        severity: str = "medium",
        ghsa_id: str = "GHSA-c2qf-rxjj-qqgw",
        cve_id: str | None = "CVE-2022-25883",
        summary: str = "semver vulnerable to Regular Expression Denial of Service",
        manifest_path: str = "package-lock.json",
        vulnerable_range: str = "< 7.5.2",
        patched_version: str | None = "7.5.2",
        created_at: str | None = None,
    ) -> dict[str, Any]:
        """A new open Dependabot alert, as ``GET /repos/{repo}/dependabot/alerts`` lists it."""
        vulnerability = {
            "package": {"ecosystem": ecosystem, "name": package},
            "severity": severity,
            "vulnerable_version_range": vulnerable_range,
            "first_patched_version": {"identifier": patched_version} if patched_version else None,
        }
        return self._new_alert(
            repo,
            "dependabot_alert",
            "security/dependabot",
            {
                "dependency": {
                    "package": {"ecosystem": ecosystem, "name": package},
                    "manifest_path": manifest_path,
                    "scope": "runtime",
                    "relationship": "direct",
                },
                "security_advisory": {
                    "ghsa_id": ghsa_id,
                    "cve_id": cve_id,
                    "summary": summary,
                    "description": summary,
                    "vulnerabilities": [vulnerability],
                    "severity": severity,
                    "identifiers": [{"value": ghsa_id, "type": "GHSA"}]
                    + ([{"value": cve_id, "type": "CVE"}] if cve_id else []),
                    "references": [{"url": f"https://nvd.nist.gov/vuln/detail/{cve_id or ghsa_id}"}],
                    "published_at": now_iso(),
                    "updated_at": now_iso(),
                    "withdrawn_at": None,
                },
                "security_vulnerability": vulnerability,
                "dismissed_at": None,
                "dismissed_by": None,
                "dismissed_reason": None,
                "dismissed_comment": None,
                "fixed_at": None,
                "auto_dismissed_at": None,
            },
            created_at,
        )

    def add_code_scanning_alert(
        self,
        repo: str,
        *,
        rule_id: str = "js/sql-injection",
        rule_severity: str = "error",
        security_severity: str | None = "high",
        description: str = "Database query built from user-controlled sources",
        tool: str = "CodeQL",
        path: str = "src/db.js",
        ref: str = "refs/heads/main",
        created_at: str | None = None,
    ) -> dict[str, Any]:
        """A new open code scanning alert, as ``GET /repos/{repo}/code-scanning/alerts`` lists it."""
        return self._new_alert(
            repo,
            "code_scanning_alert",
            "security/code-scanning",
            {
                "fixed_at": None,
                "dismissed_by": None,
                "dismissed_at": None,
                "dismissed_reason": None,
                "dismissed_comment": None,
                "rule": {
                    "id": rule_id,
                    "severity": rule_severity,
                    "tags": ["security"],
                    "description": description,
                    "name": rule_id,
                    "security_severity_level": security_severity,
                },
                "tool": {"name": tool, "guid": None, "version": "2.20.0"},
                "most_recent_instance": {
                    "ref": ref,
                    "analysis_key": ".github/workflows/codeql.yml:analyze",
                    "category": ".github/workflows/codeql.yml:analyze",
                    "environment": "{}",
                    "state": "open",
                    "commit_sha": hashlib.sha1(f"{repo}{rule_id}".encode()).hexdigest(),
                    "message": {"text": description},
                    "location": {
                        "path": path,
                        "start_line": 12,
                        "end_line": 12,
                        "start_column": 5,
                        "end_column": 40,
                    },
                    "classifications": [],
                },
            },
            created_at,
        )

    def add_secret_scanning_alert(
        self,
        repo: str,
        *,
        secret_type: str = "adafruit_io_key",
        display_name: str = "Adafruit IO Key",
        secret: str = "aio_0123456789abcdefghijklmnopqrstuv",
        validity: str = "active",
        created_at: str | None = None,
    ) -> dict[str, Any]:
        """A new open secret scanning alert, with its ``secret``, as the list gives it without ``hide_secret``."""
        return self._new_alert(
            repo,
            "secret_scanning_alert",
            "security/secret-scanning",
            {
                "resolution": None,
                "resolved_at": None,
                "resolved_by": None,
                "resolution_comment": None,
                "secret_type": secret_type,
                "secret_type_display_name": display_name,
                "secret": secret,
                "validity": validity,
                "push_protection_bypassed": False,
                "push_protection_bypassed_by": None,
                "push_protection_bypassed_at": None,
                "publicly_leaked": False,
                "multi_repo": False,
                "is_base64_encoded": False,
            },
            created_at,
        )

    def disable_alerts(
        self, repo: str, kind: str, *, status: int | None = None, message: str | None = None
    ) -> None:
        """From now on the ``kind`` alert list answers as GitHub does when the feature is off (or the
        token lacks the permission): by default 403 for Dependabot and code scanning, 404 for secret
        scanning, with GitHub's message."""
        self.add_repo(repo)
        default_status, default_message = ALERT_REFUSALS[kind]
        self._repos[repo].alerts_refused[kind] = (status or default_status, message or default_message)

    def enable_alerts(self, repo: str, kind: str) -> None:
        """The ``kind`` alert list answers again."""
        self._repos[repo].alerts_refused.pop(kind, None)

    def fail_next(
        self, status: int, *, message: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        """The next request (after any already queued failures) gets this error instead of its answer."""
        self._failures.append(_Failure(status, message, dict(headers or {})))

    # -- state: inspect ------------------------------------------------------------------------

    def issue(self, repo: str, number: int) -> dict[str, Any]:
        """An issue (or pull request) as ``GET /repos/{repo}/issues/{number}`` returns it."""
        return copy.deepcopy(self._issue(repo, number))

    def pull(self, repo: str, number: int) -> dict[str, Any]:
        """A pull request as ``GET /repos/{repo}/pulls/{number}`` returns it."""
        return self._pull_json(repo, self._issue(repo, number))

    def comments(self, repo: str, number: int) -> list[dict[str, Any]]:
        """The comments on an issue, oldest first."""
        issue_url = self._issue(repo, number)["url"]
        return [copy.deepcopy(c) for c in self._repos[repo].comments.values() if c["issue_url"] == issue_url]

    def events(self, repo: str) -> list[dict[str, Any]]:
        """The repository's events feed, newest first."""
        return copy.deepcopy(self._repos[repo].events[::-1])

    def alerts(self, repo: str, kind: str) -> list[dict[str, Any]]:
        """The repository's alerts of ``kind``, newest first, secrets included."""
        return copy.deepcopy(self._repos[repo].alerts[kind][::-1])

    # -- webhook bodies ------------------------------------------------------------------------

    def webhook_issue_opened(self, repo: str, number: int) -> dict[str, Any]:
        """The ``issues`` webhook body (action ``opened``) for an issue as it is now."""
        issue = self._issue(repo, number)
        return {
            "action": "opened",
            "issue": copy.deepcopy(issue),
            "repository": self._repo_full(repo),
            "sender": copy.deepcopy(issue["user"]),
        }

    def webhook_issue_comment_created(self, repo: str, number: int, comment_id: int) -> dict[str, Any]:
        """The ``issue_comment`` webhook body (action ``created``)."""
        issue = self._issue(repo, number)
        comment = self._repos[repo].comments.get(comment_id)
        if comment is None or comment["issue_url"] != issue["url"]:
            raise KeyError(f"no comment {comment_id} on {repo}#{number}")
        return {
            "action": "created",
            "issue": copy.deepcopy(issue),
            "comment": copy.deepcopy(comment),
            "repository": self._repo_full(repo),
            "sender": copy.deepcopy(comment["user"]),
        }

    def webhook_pull_request(
        self, repo: str, number: int, action: str, *, requested_reviewer: str | None = None
    ) -> dict[str, Any]:
        """The ``pull_request`` webhook body for a pull request as it is now."""
        issue = self._issue(repo, number)
        if number not in self._repos[repo].pulls:
            raise KeyError(f"{repo}#{number} is not a pull request")
        body: dict[str, Any] = {
            "action": action,
            "number": number,
            "pull_request": self._pull_json(repo, issue),
            "repository": self._repo_full(repo),
            "sender": copy.deepcopy(issue["user"]),
        }
        if requested_reviewer is not None:
            body["requested_reviewer"] = self._user(requested_reviewer)
        return body

    def webhook_workflow_run_completed(self, repo: str, run_id: int) -> dict[str, Any]:
        """The ``workflow_run`` webhook body (action ``completed``)."""
        run = next((r for r in self._repos[repo].runs if r["id"] == run_id), None)
        if run is None:
            raise KeyError(f"no workflow run {run_id} in {repo}")
        return {
            "action": "completed",
            "workflow_run": copy.deepcopy(run),
            "workflow": {
                "id": run["workflow_id"],
                "name": run["name"],
                "path": run["path"],
                "state": "active",
            },
            "repository": self._repo_full(repo),
            "sender": copy.deepcopy(run["actor"]),
        }

    def webhook_release_published(self, repo: str, release_id: int) -> dict[str, Any]:
        """The ``release`` webhook body (action ``published``)."""
        release = self._repos[repo].releases[release_id]
        return {
            "action": "published",
            "release": copy.deepcopy(release),
            "repository": self._repo_full(repo),
            "sender": copy.deepcopy(release["author"]),
        }

    def webhook_alert_created(self, repo: str, kind: str, number: int) -> dict[str, Any]:
        """The ``dependabot_alert``, ``code_scanning_alert`` or ``secret_scanning_alert`` webhook body
        (action ``created``), sent by GitHub's own account as GitHub sends it."""
        alert = next((a for a in self._repos[repo].alerts[kind] if a["number"] == number), None)
        if alert is None:
            raise KeyError(f"no {kind} {number} in {repo}")
        body: dict[str, Any] = {
            "action": "created",
            "alert": copy.deepcopy(alert),
            "repository": self._repo_full(repo),
            "sender": self._user("github", "Organization"),
        }
        if kind == "code_scanning_alert":
            instance = alert["most_recent_instance"]
            body["alert"]["instances"] = [copy.deepcopy(instance)]
            body["ref"], body["commit_oid"] = instance["ref"], instance["commit_sha"]
        return body

    def webhook_discussion_created(self, repo: str, number: int) -> dict[str, Any]:
        """The ``discussion`` webhook body (action ``created``)."""
        discussion = self._repos[repo].discussions[number]
        return {
            "action": "created",
            "discussion": copy.deepcopy(discussion),
            "repository": self._repo_full(repo),
            "sender": copy.deepcopy(discussion["user"]),
        }

    # -- shapes --------------------------------------------------------------------------------

    def _api(self, path: str) -> str:
        if not self.url:
            raise RuntimeError("start the fake before adding state to it: its URLs name its port")
        return self.url + path

    def _user(self, login: str, user_type: str | None = None) -> dict[str, Any]:
        """The user ``login`` (one id per login); ``user_type`` given sets its type, "User" at first."""
        if login not in self._users:
            user_id = next(self._ids)
            self._users[login] = {
                "login": login,
                "id": user_id,
                "node_id": f"U_{user_id}",
                "avatar_url": f"https://avatars.githubusercontent.com/u/{user_id}?v=4",
                "gravatar_id": "",
                "url": self._api(f"/users/{login}"),
                "html_url": f"{HTML_BASE}/{login}",
                "type": user_type or "User",
                "site_admin": False,
            }
        elif user_type is not None:
            self._users[login]["type"] = user_type
        return copy.deepcopy(self._users[login])

    def _viewer(self) -> dict[str, Any]:
        return self._user(self.viewer_login, self.viewer_type)

    def _repo_brief(self, repo: str) -> dict[str, Any]:
        data = self._repos[repo].data
        return {
            key: data[key]
            for key in ("id", "node_id", "name", "full_name", "private", "owner", "html_url", "url")
        }

    def _repo_full(self, repo: str) -> dict[str, Any]:
        return copy.deepcopy(self._repos[repo].data)

    def _label(self, repo: str, name: str) -> dict[str, Any]:
        labels = self._repos[repo].labels
        existing = next((label for key, label in labels.items() if key.lower() == name.lower()), None)
        if existing is None:
            label_id = next(self._ids)
            existing = labels[name] = {
                "id": label_id,
                "node_id": f"LA_{label_id}",
                "url": self._api(f"/repos/{repo}/labels/{quote(name, safe='')}"),
                "name": name,
                "color": hashlib.sha1(name.encode()).hexdigest()[:6],
                "default": False,
                "description": None,
            }
        return copy.deepcopy(existing)

    def _new_issue(self, repo: str, *, title: str, body: str, author: dict[str, Any]) -> dict[str, Any]:
        state = self._repos[repo]
        number, state.next_number = state.next_number, state.next_number + 1
        issue_id = next(self._ids)
        base = f"/repos/{repo}/issues/{number}"
        stamp = now_iso()
        owner = state.data["owner"]["login"]
        issue: dict[str, Any] = {
            "url": self._api(base),
            "repository_url": self._api(f"/repos/{repo}"),
            "labels_url": self._api(f"{base}/labels{{/name}}"),
            "comments_url": self._api(f"{base}/comments"),
            "events_url": self._api(f"{base}/events"),
            "html_url": f"{HTML_BASE}/{repo}/issues/{number}",
            "id": issue_id,
            "node_id": f"I_{issue_id}",
            "number": number,
            "title": title,
            "user": author,
            "labels": [],
            "state": "open",
            "locked": False,
            "assignee": None,
            "assignees": [],
            "milestone": None,
            "comments": 0,
            "created_at": stamp,
            "updated_at": stamp,
            "closed_at": None,
            "author_association": "OWNER" if author["login"] == owner else "NONE",
            "active_lock_reason": None,
            "body": body or None,
            "closed_by": None,
            "state_reason": None,
        }
        state.issues[number] = issue
        return issue

    def _make_pull(self, repo: str, issue: dict[str, Any]) -> None:
        number = issue["number"]
        issue["html_url"] = f"{HTML_BASE}/{repo}/pull/{number}"
        issue["pull_request"] = {
            "url": self._api(f"/repos/{repo}/pulls/{number}"),
            "html_url": issue["html_url"],
            "diff_url": f"{issue['html_url']}.diff",
            "patch_url": f"{issue['html_url']}.patch",
            "merged_at": None,
        }
        pull_id = next(self._ids)
        head_sha = hashlib.sha1(f"{repo}#{number}".encode()).hexdigest()
        self._repos[repo].pulls[number] = {
            "id": pull_id,
            "node_id": f"PR_{pull_id}",
            "requested_reviewers": [],
            "requested_teams": [],
            "head": {
                "label": f"{issue['user']['login']}:patch-{number}",
                "ref": f"patch-{number}",
                "sha": head_sha,
            },
            "base": {"label": f"{repo.split('/')[0]}:main", "ref": "main", "sha": "0" * 40},
        }

    def _pull_json(self, repo: str, issue: dict[str, Any]) -> dict[str, Any]:
        extra = self._repos[repo].pulls.get(issue["number"])
        if extra is None:
            raise _not_found()
        number = issue["number"]
        brief = self._repo_brief(repo)
        return copy.deepcopy(
            {
                "url": issue["pull_request"]["url"],
                "id": extra["id"],
                "node_id": extra["node_id"],
                "html_url": issue["html_url"],
                "diff_url": issue["pull_request"]["diff_url"],
                "patch_url": issue["pull_request"]["patch_url"],
                "issue_url": issue["url"],
                "number": number,
                "state": issue["state"],
                "locked": issue["locked"],
                "title": issue["title"],
                "user": issue["user"],
                "body": issue["body"],
                "labels": issue["labels"],
                "created_at": issue["created_at"],
                "updated_at": issue["updated_at"],
                "closed_at": issue["closed_at"],
                "merged_at": None,
                "assignee": issue["assignee"],
                "assignees": issue["assignees"],
                "requested_reviewers": extra["requested_reviewers"],
                "requested_teams": extra["requested_teams"],
                "head": {**extra["head"], "user": issue["user"], "repo": brief},
                "base": {**extra["base"], "user": brief["owner"], "repo": brief},
                "author_association": issue["author_association"],
                "draft": False,
                "merged": False,
                "comments": issue["comments"],
            }
        )

    def _pull_payload(self, repo: str, issue: dict[str, Any], action: str, **extra: Any) -> dict[str, Any]:
        return {
            "action": action,
            "number": issue["number"],
            "pull_request": self._pull_json(repo, issue),
            **extra,
        }

    def _event(self, repo: str, kind: str, actor: dict[str, Any], payload: dict[str, Any]) -> None:
        self._repos[repo].events.append(
            {
                "id": str(next(self._ids) * 1000),
                "type": kind,
                "actor": {
                    "id": actor["id"],
                    "login": actor["login"],
                    "display_login": actor["login"],
                    "gravatar_id": "",
                    "url": actor["url"],
                    "avatar_url": actor["avatar_url"],
                },
                "repo": {
                    "id": self._repos[repo].data["id"],
                    "name": repo,
                    "url": self._api(f"/repos/{repo}"),
                },
                "payload": copy.deepcopy(payload),
                "public": True,
                "created_at": now_iso(),
            }
        )

    def _new_alert(
        self, repo: str, kind: str, page: str, fields: dict[str, Any], created_at: str | None
    ) -> dict[str, Any]:
        """``created_at`` (GitHub's form) backdates the alert: one from before a poller started."""
        self.add_repo(repo)
        alerts = self._repos[repo].alerts[kind]
        number = len(alerts) + 1
        stamp = created_at or now_iso()
        path = "/".join(ALERT_PATHS[kind])
        alert = {
            "number": number,
            "state": "open",
            "created_at": stamp,
            "updated_at": stamp,
            "url": self._api(f"/repos/{repo}/{path}/{number}"),
            "html_url": f"{HTML_BASE}/{repo}/{page}/{number}",
            **fields,
        }
        if kind == "code_scanning_alert":
            alert["instances_url"] = self._api(f"/repos/{repo}/{path}/{number}/instances")
        if kind == "secret_scanning_alert":
            alert["locations_url"] = self._api(f"/repos/{repo}/{path}/{number}/locations")
        alerts.append(alert)
        return copy.deepcopy(alert)

    def _issue(self, repo: str, number: int) -> dict[str, Any]:
        state = self._repos.get(repo)
        if state is None or number not in state.issues:
            raise KeyError(f"no issue {repo}#{number}")
        return state.issues[number]

    def _comment(self, repo: str, issue: dict[str, Any], body: str, author: dict[str, Any]) -> dict[str, Any]:
        state = self._repos[repo]
        comment_id = next(self._ids)
        stamp = now_iso()
        comment = {
            "id": comment_id,
            "node_id": f"IC_{comment_id}",
            "url": self._api(f"/repos/{repo}/issues/comments/{comment_id}"),
            "html_url": f"{issue['html_url']}#issuecomment-{comment_id}",
            "issue_url": issue["url"],
            "body": body,
            "user": author,
            "created_at": stamp,
            "updated_at": stamp,
            "author_association": "OWNER" if author["login"] == state.data["owner"]["login"] else "NONE",
        }
        state.comments[comment_id] = comment
        issue["comments"] += 1
        issue["updated_at"] = stamp
        payload = {"action": "created", "issue": copy.deepcopy(issue), "comment": copy.deepcopy(comment)}
        self._event(repo, "IssueCommentEvent", author, payload)
        return comment

    def _issue_event(self, repo: str, issue: dict[str, Any], action: str, **extra: Any) -> None:
        issue["updated_at"] = now_iso()
        if "pull_request" in issue:
            payload = self._pull_payload(repo, issue, action, **extra)
            self._event(repo, "PullRequestEvent", self._viewer(), payload)
        else:
            payload = {"action": action, "issue": copy.deepcopy(issue), **copy.deepcopy(extra)}
            self._event(repo, "IssuesEvent", self._viewer(), payload)

    # -- serving -------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw_path = request.raw_path.split("?", 1)[0]
        raw_body = await request.read()
        try:
            parsed: Any = json.loads(raw_body) if raw_body else None
            malformed = False
        except ValueError:
            parsed, malformed = None, True
        recorded = Recorded(
            method=request.method,
            path=raw_path,
            query=dict(request.query.items()),
            headers=Headers(request.headers.items()),
            json=parsed,
        )
        self._record(recorded)
        routed = (
            raw_path.removeprefix(self.path_prefix) if raw_path.startswith(self.path_prefix + "/") else "/"
        )
        call = _Call(recorded, [unquote(s) for s in routed.split("/")[1:]], raw_body)
        injected = self._failures[0].headers if self._failures else None
        try:
            response = self._refusal(call)
            if response is None:
                if malformed:
                    raise ApiError(400, "Problems parsing JSON")
                response = await self._route(call)
        except ApiError as error:
            response = web.json_response(error.body, status=error.status)
        self._spend(response, call, injected)
        return response

    def _refusal(self, call: _Call) -> web.Response | None:
        """An injected failure, bad credentials or a spent quota, before the request is served."""
        if self._failures:
            failure = self._failures.popleft()
            body = {"message": failure.message or _reason(failure.status), "documentation_url": DOCS}
            return web.json_response(body, status=failure.status, headers=failure.headers)
        if self.token is not None:
            authorization = call.recorded.headers.get("Authorization", "")
            scheme, _, credential = authorization.partition(" ")
            if scheme.lower() not in ("bearer", "token") or credential != self.token:
                return web.json_response(
                    {"message": "Bad credentials", "documentation_url": DOCS}, status=401
                )
        if self.rate_limit_remaining <= 0:
            message = "API rate limit exceeded for user. (But here's the good news: ...)"
            return web.json_response({"message": message, "documentation_url": DOCS}, status=403)
        return None

    def _spend(self, response: web.Response, call: _Call, injected: dict[str, str] | None = None) -> None:
        # A 304 is free on GitHub; everything else the fake answered costs one request.
        if response.status != 304 and response.status != 401 and self.rate_limit_remaining > 0:
            self.rate_limit_remaining -= 1
        resource = "search" if call.segments[:1] == ["search"] else "core"
        standard = {
            "X-RateLimit-Limit": str(RATE_LIMIT),
            "X-RateLimit-Remaining": str(self.rate_limit_remaining),
            "X-RateLimit-Used": str(max(0, RATE_LIMIT - self.rate_limit_remaining)),
            "X-RateLimit-Reset": str(self.rate_limit_reset),
            "X-RateLimit-Resource": resource,
            "X-GitHub-Api-Version-Selected": "2022-11-28",
            "X-GitHub-Request-Id": secrets.token_hex(8).upper(),
        }
        # Headers a test injected with fail_next win over the fake's own rate-limit headers.
        response.headers.update({**standard, **(injected or {})})

    async def _route(self, call: _Call) -> web.Response:
        method, s = call.recorded.method, call.segments
        if s[:2] == ["search", "issues"] and len(s) == 2 and method == "GET":
            return self._json(self._search(call.query))
        if s == ["user"] and method == "GET":
            return self._json(self._viewer())
        if len(s) < 3 or s[0] != "repos":
            raise _not_found()
        repo = f"{s[1]}/{s[2]}"
        if repo not in self._repos:
            raise _not_found()
        rest = s[3:]
        if method == "GET" and rest == []:
            return self._json(self._repo_full(repo))
        if method == "GET" and rest == ["events"]:
            feed = self._repos[repo].events[::-1][: self.events_cap]
            if (_page_number(call.query) - 1) * _per_page(call.query) >= self.events_cap:
                raise ApiError(
                    422,
                    "In order to keep the API fast for everyone, pagination is limited for this resource.",
                )
            return self._conditional(
                call, _page(feed, call.query), poll=True, link=self._link(call, len(feed))
            )
        if rest == ["issues"]:
            if method == "GET":
                issues = self._issues(repo, call.query)
                return self._conditional(call, _page(issues, call.query), link=self._link(call, len(issues)))
            if method == "POST":
                return self._json(self._create_issue(repo, self._object(call)), status=201)
        if method == "GET" and tuple(rest) in ALERT_PATHS.values():
            kind = next(k for k, path in ALERT_PATHS.items() if path == tuple(rest))
            refused = self._repos[repo].alerts_refused.get(kind)
            if refused is not None:
                raise ApiError(*refused)
            alerts = self._alerts(repo, kind, call.query)
            return self._conditional(call, _page(alerts, call.query), link=self._link(call, len(alerts)))
        if method == "GET" and rest == ["actions", "runs"]:
            runs = self._runs(repo, call.query)
            body = {"total_count": len(runs), "workflow_runs": _page(runs, call.query)}
            return self._conditional(call, body, link=self._link(call, len(runs)))
        if len(rest) >= 2 and rest[0] in ("issues", "pulls"):
            number = _number(rest[1])
            return self._issue_route(call, repo, rest[0], number, rest[2:])
        raise _not_found()

    def _issue_route(self, call: _Call, repo: str, kind: str, number: int, rest: list[str]) -> web.Response:
        method = call.recorded.method
        issue = self._repos[repo].issues.get(number)
        if issue is None:
            raise _not_found()
        if kind == "pulls":
            if number not in self._repos[repo].pulls:
                raise _not_found()
            if method == "GET" and rest == []:
                return self._json(self._pull_json(repo, issue))
            if method == "POST" and rest == ["requested_reviewers"]:
                return self._json(self._request_reviewers(repo, issue, self._object(call)), status=201)
            raise _not_found()
        if rest == []:
            if method == "GET":
                return self._json(issue)
            if method == "PATCH":
                return self._json(self._update_issue(repo, issue, self._object(call)))
        if rest == ["labels"]:
            if method == "GET":
                return self._json(issue["labels"])
            if method == "POST":
                return self._json(self._add_labels(repo, issue, call.recorded.json))
        if len(rest) == 2 and rest[0] == "labels" and method == "DELETE":
            return self._json(self._remove_label(repo, issue, rest[1]))
        if rest == ["comments"]:
            if method == "GET":
                return self._json(self.comments(repo, number))
            if method == "POST":
                body = self._object(call).get("body")
                if not isinstance(body, str) or not body:
                    raise _invalid(
                        errors=[{"resource": "IssueComment", "code": "missing_field", "field": "body"}]
                    )
                return self._json(self._comment(repo, issue, body, self._viewer()), status=201)
        if rest == ["assignees"] and method == "POST":
            return self._json(self._assign(repo, issue, self._object(call)), status=201)
        raise _not_found()

    @staticmethod
    def _json(body: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
        return web.json_response(copy.deepcopy(body), status=status, headers=headers)

    def _link(self, call: _Call, total: int) -> str | None:
        origin = self.url.removesuffix(self.path_prefix)
        return _link(origin + call.recorded.path, call.query, total)

    def _conditional(
        self, call: _Call, body: Any, *, poll: bool = False, link: str | None = None
    ) -> web.Response:
        etag = _etag(body)
        headers = {"ETag": etag, "Cache-Control": "private, max-age=60, s-maxage=60"}
        if poll:
            headers["X-Poll-Interval"] = str(self.poll_interval_s)
        if link is not None:
            headers["Link"] = link
        candidates = [tag.strip() for tag in call.recorded.headers.get("If-None-Match", "").split(",")]
        if etag in candidates or f"W/{etag}" in candidates:
            return web.Response(status=304, headers=headers)
        return self._json(body, headers=headers)

    @staticmethod
    def _object(call: _Call) -> dict[str, Any]:
        body = call.recorded.json
        if not isinstance(body, dict):
            raise ApiError(400, "Problems parsing JSON")
        return body

    # -- endpoints -----------------------------------------------------------------------------

    def _issues(self, repo: str, query: dict[str, str]) -> list[dict[str, Any]]:
        state = query.get("state", "open")
        items = [i for i in self._repos[repo].issues.values() if state == "all" or i["state"] == state]
        since = query.get("since")
        if since:
            items = [i for i in items if i["updated_at"] >= _normalized_time(since)]
        sort = query.get("sort", "created")
        key = {"updated": "updated_at", "comments": "comments"}.get(sort, "created_at")
        # Ties (the same second) go by number, as creation order.
        items.sort(key=lambda i: (i[key], i["number"]), reverse=query.get("direction", "desc") != "asc")
        return items

    def _alerts(self, repo: str, kind: str, query: dict[str, str]) -> list[dict[str, Any]]:
        alerts = list(self._repos[repo].alerts[kind])
        states = {s for s in query.get("state", "").split(",") if s}
        if states:
            alerts = [a for a in alerts if a["state"] in states]
        key = "updated_at" if query.get("sort") == "updated" else "created_at"
        # Ties (the same second) go by number, as creation order.
        alerts.sort(key=lambda a: (a[key], a["number"]), reverse=query.get("direction", "desc") != "asc")
        if kind == "secret_scanning_alert" and query.get("hide_secret") == "true":
            alerts = [{k: v for k, v in a.items() if k != "secret"} for a in alerts]
        return alerts

    def _runs(self, repo: str, query: dict[str, str]) -> list[dict[str, Any]]:
        runs = self._repos[repo].runs[::-1]
        status = query.get("status")
        if status:
            runs = [r for r in runs if status in (r["status"], r["conclusion"])]
        if query.get("branch"):
            runs = [r for r in runs if r["head_branch"] == query["branch"]]
        return runs

    def _search(self, query: dict[str, str]) -> dict[str, Any]:
        q = query.get("q", "").strip()
        if not q:
            raise _invalid(errors=[{"resource": "Search", "field": "q", "code": "missing"}])
        words: list[str] = []
        repos: list[str] = []
        kinds: set[str] = set()
        states: set[str] = set()
        for term in q.split():
            qualifier, colon, value = term.partition(":")
            if not colon:
                words.append(term.lower())
            elif qualifier == "repo":
                repos.append(value)
            elif qualifier in ("is", "state") and value in ("issue", "pr"):
                kinds.add(value)
            elif qualifier in ("is", "state") and value in ("open", "closed"):
                states.add(value)
        found = []
        for full_name, state in self._repos.items():
            if repos and full_name not in repos:
                continue
            for issue in state.issues.values():
                kind = "pr" if "pull_request" in issue else "issue"
                text = f"{issue['title']}\n{issue['body'] or ''}".lower()
                if (kinds and kind not in kinds) or (states and issue["state"] not in states):
                    continue
                if all(word in text for word in words):
                    found.append({**issue, "score": 1.0})
        found.sort(key=lambda i: (i["created_at"], i["id"]), reverse=True)
        return {"total_count": len(found), "incomplete_results": False, "items": _page(found, query)}

    def _create_issue(self, repo: str, body: dict[str, Any]) -> dict[str, Any]:
        title = body.get("title")
        if not isinstance(title, str | int) or title == "":
            raise _invalid(errors=[{"resource": "Issue", "code": "missing_field", "field": "title"}])
        text = body.get("body")
        issue = self._new_issue(
            repo, title=str(title), body=text if isinstance(text, str) else "", author=self._viewer()
        )
        for name in _string_list(body.get("labels", [])):
            issue["labels"].append(self._label(repo, name))
        for login in _string_list(body.get("assignees", [])):
            issue["assignees"].append(self._user(login))
        issue["assignee"] = issue["assignees"][0] if issue["assignees"] else None
        self._event(repo, "IssuesEvent", issue["user"], {"action": "opened", "issue": copy.deepcopy(issue)})
        return issue

    def _update_issue(self, repo: str, issue: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        for key in ("title", "body"):
            if key in body:
                if not isinstance(body[key], str | None):
                    raise _invalid(errors=[{"resource": "Issue", "code": "invalid", "field": key}])
                issue[key] = body[key]
        state = body.get("state")
        reason = body.get("state_reason")
        if state is not None and state not in ("open", "closed"):
            raise _invalid(errors=[{"resource": "Issue", "code": "invalid", "field": "state"}])
        if reason is not None and reason not in STATE_REASONS:
            raise _invalid(errors=[{"resource": "Issue", "code": "invalid", "field": "state_reason"}])
        if state == "closed" and issue["state"] == "open":
            issue.update(
                state="closed",
                state_reason=reason or "completed",
                closed_at=now_iso(),
                closed_by=self._viewer(),
            )
            self._issue_event(repo, issue, "closed")
        elif state == "open" and issue["state"] == "closed":
            issue.update(state="open", state_reason="reopened", closed_at=None, closed_by=None)
            self._issue_event(repo, issue, "reopened")
        else:
            issue["updated_at"] = now_iso()
        return issue

    def _add_labels(self, repo: str, issue: dict[str, Any], body: Any) -> list[dict[str, Any]]:
        # GitHub takes {"labels": [...]}, a bare list, or label objects with a name.
        names = body.get("labels") if isinstance(body, dict) else body
        if isinstance(names, list):
            names = [n.get("name") if isinstance(n, dict) else n for n in names]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise _invalid('Invalid request.\n\nNo subschema in "anyOf" matched.')
        for name in names:
            if not any(label["name"].lower() == name.lower() for label in issue["labels"]):
                label = self._label(repo, name)
                issue["labels"].append(label)
                self._issue_event(repo, issue, "labeled", label=label)
        labels: list[dict[str, Any]] = issue["labels"]
        return labels

    def _remove_label(self, repo: str, issue: dict[str, Any], name: str) -> list[dict[str, Any]]:
        label = next((x for x in issue["labels"] if x["name"].lower() == name.lower()), None)
        if label is None:
            raise ApiError(404, "Label does not exist")
        issue["labels"].remove(label)
        self._issue_event(repo, issue, "unlabeled", label=label)
        labels: list[dict[str, Any]] = issue["labels"]
        return labels

    def _assign(self, repo: str, issue: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        logins = body.get("assignees")
        if not isinstance(logins, list) or not all(isinstance(login, str) for login in logins):
            raise _invalid(errors=[{"resource": "Issue", "code": "invalid", "field": "assignees"}])
        for login in logins:
            if not any(a["login"] == login for a in issue["assignees"]):
                assignee = self._user(login)
                issue["assignees"].append(assignee)
                issue["assignee"] = issue["assignees"][0]
                self._issue_event(repo, issue, "assigned", assignee=assignee)
        return issue

    def _request_reviewers(self, repo: str, issue: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        reviewers = body.get("reviewers", [])
        teams = body.get("team_reviewers", [])
        lists_of_strings = all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in (reviewers, teams)
        )
        if not lists_of_strings or not (reviewers or teams):
            raise _invalid('Invalid request.\n\nNo subschema in "anyOf" matched.')
        if issue["user"]["login"] in reviewers:
            raise _invalid("Review cannot be requested from pull request author.")
        extra = self._repos[repo].pulls[issue["number"]]
        for login in reviewers:
            if not any(r["login"] == login for r in extra["requested_reviewers"]):
                reviewer = self._user(login)
                extra["requested_reviewers"].append(reviewer)
                self._issue_event(repo, issue, "review_requested", requested_reviewer=reviewer)
        for slug in teams:
            if not any(t["slug"] == slug for t in extra["requested_teams"]):
                extra["requested_teams"].append({"id": next(self._ids), "name": slug, "slug": slug})
        return self._pull_json(repo, issue)


def _number(segment: str) -> int:
    if not segment.isdigit() or int(segment) < 1:
        raise _not_found()
    return int(segment)


def _string_list(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _invalid()
    return value


def _normalized_time(value: str) -> str:
    """An ISO 8601 time in GitHub's own form, so that it compares as text with the stored ones."""
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise _invalid(errors=[{"resource": "Issue", "code": "invalid", "field": "since"}]) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


async def _serve(port: int, token: str | None, repos: list[str], viewer: str) -> None:
    async with FakeGitHub(token=token, port=port) as fake:
        fake.viewer_login = viewer
        for repo in repos:
            fake.add_repo(repo)
        sys.stdout.write(fake.url + "\n")
        sys.stdout.flush()
        await until_stopped()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A fake GitHub REST API on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    parser.add_argument(
        "--token", default="test-token", help="the token clients must send (default: test-token)"
    )
    parser.add_argument("--no-token", action="store_true", help="accept requests without a token")
    parser.add_argument("--repo", action="append", default=[], help="a repository to create (owner/name)")
    parser.add_argument(
        "--viewer", default="agentwake-bot", help="the login the token stands for: the author of API writes"
    )
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.port, None if args.no_token else args.token, args.repo, args.viewer))


if __name__ == "__main__":
    main()
