"""The GitHub bridge (``agentwake bridge github``) piece by piece: webhook ingress, the log's bounds and
cursors, filters, events/list, the poller, the tools, the command line and MCP authentication.

Most checks run the bridge in process: a ``BridgeServer`` with its real aiohttp webhook listener on
loopback, the SDK's in-memory ``mcp.Client`` for MCP, a real SQLite log in tmp_path, and
agentwake/fakes/github.py as GitHub. Two real ``agentwake bridge github`` processes cover what needs a
process boundary: a SIGKILL right after a 202, the restart on the same state dir, bearer auth over
``--http`` and the ``stdio`` principal.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import anyio
import httpx
import pytest
import trustme
from _support import RunningService
from _webhook_server_support import Receiver
from conftest import REPO
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter
from typer.testing import CliRunner

from agentwake import protocol
from agentwake.bridges import github_events
from agentwake.bridges.framework import BridgeOptions, BridgeServer
from agentwake.bridges.github import GitHubBridge, GitHubSettings
from agentwake.bridges.log import NewEvent
from agentwake.cli import app
from agentwake.config import ServerConfig
from agentwake.fakes import github as fake_github
from agentwake.fakes.github import FakeGitHub
from agentwake.mcp import ServerConnection, _EventsRequest, _Params

pytestmark = pytest.mark.anyio

SECRET = "it's a secret to everybody"
TOKEN = "gh-test-token-5f1c"
MCP_TOKEN = "mcp-bearer-9d27"
RESULT = TypeAdapter(dict[str, Any])
WAIT = 10.0
EVENT_TYPES = tuple(github_events.EVENT_TYPES)


def signed(body: bytes, secret: str = SECRET) -> str:
    """X-Hub-Signature-256 as GitHub computes it: sha256= and the hex HMAC-SHA256 of the raw body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def github_headers(event: str | None, delivery: str | None, signature: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/test"}
    for name, value in (
        ("X-GitHub-Event", event),
        ("X-GitHub-Delivery", delivery),
        ("X-Hub-Signature-256", signature),
    ):
        if value is not None:
            headers[name] = value
    return headers


@dataclass
class Hook:
    """GitHub's side of the webhook: POSTs to the bridge's listener."""

    url: str
    session: aiohttp.ClientSession

    async def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        async with self.session.post(self.url, data=body, headers=headers) as answer:
            return answer.status, await answer.json()

    async def deliver(
        self,
        event: str,
        payload: dict[str, Any],
        *,
        delivery: str | None = None,
        secret: str = SECRET,
    ) -> tuple[int, dict[str, Any]]:
        body = json.dumps(payload).encode()
        return await self.post(
            body, github_headers(event, delivery or str(uuid.uuid4()), signed(body, secret))
        )


@dataclass
class Wire:
    """events/* over the SDK's in-memory client."""

    client: Client

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request = _EventsRequest(method=method, params=_Params.model_validate(params))
        return await self.client.session.send_request(request, RESULT)  # type: ignore[type-var]

    async def poll(
        self, name: str, cursor: str | None, arguments: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"name": name, "cursor": cursor}
        if arguments is not None:
            params["arguments"] = arguments
        return await self.call("events/poll", params)


@dataclass
class InProcess:
    server: BridgeServer
    bridge: GitHubBridge
    wire: Wire
    hook: Hook

    def head(self) -> int:
        return self.server.log.head()


@asynccontextmanager
async def in_process(
    tmp_path: Path,
    github: FakeGitHub,
    *,
    max_events: int = 1000,
    max_body_bytes: int = 64 * 1024,
    max_delivery_age: timedelta = timedelta(hours=1),
    poll: bool = False,
    repos: tuple[str, ...] = (),
    poll_interval_s: float = 60.0,
    **more: Any,
) -> AsyncIterator[InProcess]:
    """A GitHub bridge in this process: its webhook listener on a free loopback port (as ``--listen
    127.0.0.1:0``), its MCP server behind an in-memory client, its poller with ``poll``. ``more`` are
    further ``GitHubSettings``."""
    options = BridgeOptions(
        state_dir=tmp_path / "bridge",
        listen="127.0.0.1:0",
        max_body_bytes=max_body_bytes,
        max_events=max_events,
        poll=poll,
    )
    settings = GitHubSettings(
        webhook_secret=SECRET.encode(),
        token=TOKEN,
        api_base=github.url,
        repos=repos,
        poll_interval_s=poll_interval_s,
        max_delivery_age=max_delivery_age,
        **more,
    )
    bridge = GitHubBridge(options, settings)
    server = BridgeServer(bridge)
    try:
        async with (
            server.events.running(),
            anyio.create_task_group() as tg,
            Client(server.mcp) as client,
            aiohttp.ClientSession() as session,
        ):
            await server._start_webhook_listener(tg)
            assert server.webhook_address is not None
            host, port = server.webhook_address
            if poll:
                tg.start_soon(bridge.poll_forever)
            yield InProcess(server, bridge, Wire(client), Hook(f"http://{host}:{port}/webhook", session))
            tg.cancel_scope.cancel()
    finally:
        await bridge.aclose()
        server.log.close()
        server.webhook_store.close()


def ids(result: dict[str, Any]) -> list[str]:
    return [event["eventId"] for event in result["events"]]


def issue_event_id(issue: dict[str, Any]) -> str:
    return f"issues.opened:{issue['id']}"


async def accept_opened(app_: InProcess, github: FakeGitHub, repo: str, title: str, **issue: Any) -> str:
    """An issue opened on the fake, logged the way the webhook handler logs it; its event id."""
    opened = github.open_issue(repo, title=title, **issue)
    mapped = github_events.from_webhook("issues", github.webhook_issue_opened(repo, opened["number"]))
    assert mapped is not None
    added = await app_.server.accept(
        [NewEvent(mapped.type, mapped.event_id, mapped.occurred_at, mapped.data)], source="test"
    )
    assert added == 1
    return mapped.event_id


@pytest.fixture
async def github() -> AsyncIterator[FakeGitHub]:
    async with FakeGitHub(token=TOKEN) as fake:
        for repo in ("acme/x", "acme/y"):
            fake.add_repo(repo)
        yield fake


# ---- 1. webhook ingress -----------------------------------------------------------------------------


async def test_a_signed_delivery_is_accepted_and_forged_ones_are_401_and_leave_nothing(
    tmp_path: Path, github: FakeGitHub
) -> None:
    async with in_process(tmp_path, github) as bridge:
        before = await bridge.wire.poll("issues.opened", None)
        issue = github.open_issue("acme/x", title="Crash on start", labels=["bug"])
        body = json.dumps(github.webhook_issue_opened("acme/x", issue["number"])).encode()
        delivery = str(uuid.uuid4())

        forged = {
            "wrong secret": signed(body, "not the secret"),
            "another body": signed(body + b" "),
            "sha1": "sha1=" + hmac.new(SECRET.encode(), body, hashlib.sha1).hexdigest(),
            "bare hex": signed(body).removeprefix("sha256="),
            "missing": None,
        }
        for what, signature in forged.items():
            status, answer = await bridge.hook.post(body, github_headers("issues", delivery, signature))
            assert (status, answer["status"]) == (401, "refused"), what
            assert "X-Hub-Signature-256" in answer["error"]
        assert bridge.head() == 0

        # The refusals remembered nothing: the same delivery id, rightly signed, is news.
        status, answer = await bridge.hook.post(body, github_headers("issues", delivery, signed(body)))
        assert (status, answer) == (202, {"status": "accepted", "delivery": delivery})
        polled = await bridge.wire.poll("issues.opened", before["cursor"])
        assert ids(polled) == [issue_event_id(issue)]
        event = polled["events"][0]
        assert event["data"]["repository"] == "acme/x"
        assert event["data"]["number"] == issue["number"]
        assert event["data"]["labels"] == ["bug"]
        assert polled["truncated"] is False


async def test_github_headers_are_required_and_ping_is_answered_pong(
    tmp_path: Path, github: FakeGitHub
) -> None:
    async with in_process(tmp_path, github) as bridge:
        issue = github.open_issue("acme/x", title="t")
        body = json.dumps(github.webhook_issue_opened("acme/x", issue["number"])).encode()
        for event, delivery in ((None, "d-1"), ("issues", None), ("", "d-1"), ("issues", "x" * 201)):
            status, answer = await bridge.hook.post(body, github_headers(event, delivery, signed(body)))
            assert status == 400, (event, delivery)
            assert "X-GitHub-Delivery" in answer["error"]
        ping = json.dumps({"zen": "Design for failure.", "hook_id": 1}).encode()
        status, answer = await bridge.hook.post(ping, github_headers("ping", "d-ping", signed(ping)))
        assert (status, answer) == (200, {"status": "pong"})
        # Signature first: an unsigned ping is refused like anything else.
        status, _ = await bridge.hook.post(ping, github_headers("ping", "d-ping", None))
        assert status == 401
        assert bridge.head() == 0


async def test_a_replay_is_a_duplicate_and_a_redelivered_issue_is_logged_once(
    tmp_path: Path, github: FakeGitHub
) -> None:
    async with in_process(tmp_path, github) as bridge:
        issue = github.open_issue("acme/x", title="t")
        payload = github.webhook_issue_opened("acme/x", issue["number"])
        status, answer = await bridge.hook.deliver("issues", payload, delivery="d-1")
        assert (status, answer["status"]) == (202, "accepted")
        status, answer = await bridge.hook.deliver("issues", payload, delivery="d-1")
        assert (status, answer) == (200, {"status": "duplicate", "delivery": "d-1"})
        # GitHub's "redeliver" sends a new delivery id for the same occurrence: accepted, kept once.
        status, answer = await bridge.hook.deliver("issues", payload, delivery="d-2")
        assert (status, answer["status"]) == (202, "accepted")
        assert ids(await bridge.wire.poll("issues.opened", "0")) == [issue_event_id(issue)]


async def test_a_form_encoded_delivery_is_accepted(tmp_path: Path, github: FakeGitHub) -> None:
    async with in_process(tmp_path, github) as bridge:
        issue = github.open_issue("acme/x", title="Sent as a form & signed as one")
        payload = json.dumps(github.webhook_issue_opened("acme/x", issue["number"]))
        body = urlencode({"payload": payload}).encode()
        headers = github_headers("issues", "d-form", signed(body))
        headers["Content-Type"] = "application/x-www-form-urlencoded"
        status, answer = await bridge.hook.post(body, headers)
        assert (status, answer["status"]) == (202, "accepted"), answer
        polled = await bridge.wire.poll("issues.opened", "0")
        assert ids(polled) == [issue_event_id(issue)]
        assert polled["events"][0]["data"]["title"] == "Sent as a form & signed as one"


async def test_oversize_unreadable_and_stale_deliveries_are_refused_and_unmapped_ones_ignored(
    tmp_path: Path, github: FakeGitHub
) -> None:
    async with in_process(tmp_path, github, max_body_bytes=16 * 1024) as bridge:
        issue = github.open_issue("acme/x", title="t", body="x" * 32 * 1024)
        big = json.dumps(github.webhook_issue_opened("acme/x", issue["number"])).encode()
        status, answer = await bridge.hook.post(big, github_headers("issues", "d-big", signed(big)))
        assert status == 413, answer

        junk = b"{not json"
        status, answer = await bridge.hook.post(junk, github_headers("issues", "d-junk", signed(junk)))
        assert status == 400 and "unreadable" in answer["error"], answer

        small = github.open_issue("acme/x", title="two hours ago")
        stale = github.webhook_issue_opened("acme/x", small["number"])
        stale["issue"]["created_at"] = (datetime.now(UTC) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
        status, answer = await bridge.hook.deliver("issues", stale, delivery="d-stale")
        assert status == 400 and "stale" in answer["error"], answer

        star = {"action": "created", "starred_at": None, "repository": {"full_name": "acme/x"}}
        status, answer = await bridge.hook.deliver("star", star, delivery="d-star")
        assert (status, answer) == (202, {"status": "ignored", "delivery": "d-star"})
        status, answer = await bridge.hook.deliver("star", star, delivery="d-star")
        assert (status, answer["status"]) == (200, "duplicate")
        # An action of a known event that is not emitted is ignored the same way.
        closed = {**github.webhook_issue_opened("acme/x", small["number"]), "action": "unlocked"}
        status, answer = await bridge.hook.deliver("issues", closed, delivery="d-closed")
        assert (status, answer["status"]) == (202, "ignored")
        assert bridge.head() == 0


async def test_the_tokens_own_actions_are_ignored_and_not_logged(tmp_path: Path, github: FakeGitHub) -> None:
    async with in_process(tmp_path, github) as bridge:
        issue = github.open_issue("acme/x", title="t")
        own = github.add_comment("acme/x", issue["number"], body="Labelled.", user=github.viewer_login)
        payload = github.webhook_issue_comment_created("acme/x", issue["number"], own["id"])
        status, answer = await bridge.hook.deliver("issue_comment", payload, delivery="d-own")
        assert (status, answer["status"]) == (202, "ignored")
        assert len(github.calls("GET", "/user")) == 1
        theirs = github.add_comment("acme/x", issue["number"], body="Me too.", user="hubot")
        payload = github.webhook_issue_comment_created("acme/x", issue["number"], theirs["id"])
        status, answer = await bridge.hook.deliver("issue_comment", payload, delivery="d-theirs")
        assert (status, answer["status"]) == (202, "accepted")
        assert ids(await bridge.wire.poll("issue_comment.created", "0")) == [
            f"issue_comment.created:{theirs['id']}"
        ]
        assert len(github.calls("GET", "/user")) == 1  # the login is learned once


# ---- 3. the log's bounds and cursors ------------------------------------------------------------------


async def test_a_pruned_cursor_is_truncated_and_unknown_cursors_restart_at_the_head(
    tmp_path: Path, github: FakeGitHub
) -> None:
    async with in_process(tmp_path, github, max_events=3) as bridge:
        start = await bridge.wire.poll("issues.opened", None)
        assert (start["cursor"], start["truncated"], start["events"]) == ("0", False, [])
        logged = [await accept_opened(bridge, github, "acme/x", f"issue {n}") for n in range(3)]
        # The poller hands the log every item of a changed page again: what is already logged
        # counts for nothing, so the 3 events stay.
        again = [
            github_events.from_webhook("issues", github.webhook_issue_opened("acme/x", n)) for n in (1, 2, 3)
        ]
        for _ in range(3):
            fresh = [NewEvent(m.type, m.event_id, m.occurred_at, m.data) for m in again if m is not None]
            assert await bridge.server.accept(fresh, source="poll") == 0
        polled = await bridge.wire.poll("issues.opened", "0")
        assert (polled["truncated"], ids(polled)) == (False, logged)
        logged += [await accept_opened(bridge, github, "acme/x", f"issue {n}") for n in (3, 4)]

        # Events 1 and 2 were pruned: the reader learns of the gap, then gets what is left.
        polled = await bridge.wire.poll("issues.opened", "0")
        assert polled["truncated"] is True
        assert ids(polled) == logged[2:]
        assert polled["cursor"] == "5"
        # From the last pruned position on, nothing was skipped.
        polled = await bridge.wire.poll("issues.opened", "2")
        assert (polled["truncated"], ids(polled)) == (False, logged[2:])

        # A null cursor bootstraps at the head, without history.
        polled = await bridge.wire.poll("issues.opened", None)
        assert (polled["cursor"], polled["truncated"], polled["events"]) == ("5", False, [])

        # A cursor the log never handed out (past its head, as after a state dir reset, or not a
        # position at all) restarts at the head with truncated.
        for cursor in ("6", "999999", "abc", "", "-1", "2.0", "²", "9" * 5000):
            polled = await bridge.wire.poll("issues.opened", cursor)
            assert (polled["cursor"], polled["truncated"], polled["events"]) == ("5", True, []), cursor

        later = await accept_opened(bridge, github, "acme/x", "after the reset")
        assert ids(await bridge.wire.poll("issues.opened", "5")) == [later]


# ---- 4. filters, 5. events/list -----------------------------------------------------------------------


async def test_repository_and_label_arguments_filter_and_bad_arguments_are_invalid_params(
    tmp_path: Path, github: FakeGitHub
) -> None:
    async with in_process(tmp_path, github) as bridge:
        x_bug = await accept_opened(bridge, github, "acme/x", "x bug", labels=["Bug"])
        x_plain = await accept_opened(bridge, github, "acme/x", "x plain")
        y_bug = await accept_opened(bridge, github, "acme/y", "y bug", labels=["bug", "ui"])

        async def selected(arguments: dict[str, Any]) -> list[str]:
            return ids(await bridge.wire.poll("issues.opened", "0", arguments))

        assert await selected({}) == [x_bug, x_plain, y_bug]
        assert await selected({"repository": "acme/x"}) == [x_bug, x_plain]
        assert await selected({"repository": "ACME/Y"}) == [y_bug]
        assert await selected({"repository": "acme/*"}) == [x_bug, x_plain, y_bug]
        assert await selected({"label": "bug"}) == [x_bug, y_bug]
        assert await selected({"repository": "acme/x", "label": "bug"}) == [x_bug]
        assert await selected({"repository": "other/x"}) == []

        for arguments in ({"repo": "acme/x"}, {"repository": 5}, {"repository": "no-slash"}, {"label": ""}):
            with pytest.raises(MCPError) as caught:
                await bridge.wire.poll("issues.opened", "0", arguments)
            assert caught.value.code == protocol.INVALID_PARAMS == -32602, arguments
            assert "inputSchema" in caught.value.message


async def test_events_list_names_the_types_with_their_schemas(tmp_path: Path, github: FakeGitHub) -> None:
    async with in_process(tmp_path, github) as bridge:
        listed = (await bridge.wire.call("events/list", {}))["events"]
    assert sorted(d["name"] for d in listed) == sorted(EVENT_TYPES)
    for descriptor in listed:
        name = descriptor["name"]
        assert descriptor["payloadSchema"] == github_events.PAYLOAD_SCHEMAS[name]
        assert descriptor["inputSchema"] == github_events.ARGUMENTS_SCHEMA
        assert descriptor["delivery"] == ["poll", "push", "webhook"]
        assert descriptor["description"] == github_events.EVENT_TYPES[name]


# ---- 6. the poller ------------------------------------------------------------------------------------


async def test_the_poller_baselines_sends_etags_honours_poll_interval_and_rate_limits(
    tmp_path: Path, github: FakeGitHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = "acme/x"
    events_path, runs_path = f"/repos/{repo}/events", f"/repos/{repo}/actions/runs"
    github.poll_interval_s = 0
    with monkeypatch.context() as patch:
        an_hour_ago = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch.setattr(fake_github, "now_iso", lambda: an_hour_ago)
        old = github.open_issue(repo, title="opened before the bridge started")
        github.fail_workflow_run(repo, name="old CI")

    async with in_process(tmp_path, github, poll=True, repos=(repo,), poll_interval_s=0.2) as bridge:
        # Round 1 is the baseline; what changes after it is news for round 2.
        await github.wait_for("GET", runs_path)
        assert "If-None-Match" not in github.calls("GET", events_path)[0].headers
        new = github.open_issue(repo, title="opened after the first poll")
        theirs = github.add_comment(repo, new["number"], body="Same here.", user="hubot")
        github.add_comment(repo, new["number"], body="Triaged.", user=github.viewer_login)
        failed = github.fail_workflow_run(repo, name="CI")
        github.add_workflow_run(repo, name="Lint", conclusion="success")

        await github.wait_for("GET", runs_path, count=2)
        assert "If-None-Match" in github.calls("GET", events_path)[1].headers
        github.poll_interval_s = 1  # X-Poll-Interval, above --poll-interval
        remaining = github.rate_limit_remaining

        # Round 3: nothing changed, every feed is a conditional GET answered 304, which costs nothing.
        await github.wait_for("GET", runs_path, count=3)
        round_3 = time.monotonic()
        assert all("If-None-Match" in call.headers for call in github.calls("GET", f"/repos/{repo}")[-3:])
        assert github.rate_limit_remaining == remaining
        head = bridge.head()

        # Round 4 waits for X-Poll-Interval and finds the quota spent; round 5 waits for its reset.
        reset = int(time.time()) + 2
        github.rate_limit_remaining, github.rate_limit_reset = 0, reset
        await github.wait_for("GET", events_path, count=4)
        assert time.monotonic() - round_3 >= 0.9
        github.rate_limit_remaining = fake_github.RATE_LIMIT
        await github.wait_for("GET", events_path, count=5, timeout=WAIT)
        assert time.time() >= reset - 0.25
        assert len(github.calls("GET", runs_path)) == 3  # the rate-limited round stopped at its first feed
        assert bridge.head() == head

        opened = await bridge.wire.poll("issues.opened", "0")
        assert ids(opened) == [issue_event_id(new)]
        assert old["number"] != new["number"]
        comments = await bridge.wire.poll("issue_comment.created", "0")
        assert ids(comments) == [f"issue_comment.created:{theirs['id']}"]
        runs = await bridge.wire.poll("workflow_run.completed", "0")
        assert ids(runs) == [f"workflow_run.completed:{failed['id']}:1"]
        assert runs["events"][0]["data"]["repository"] == repo


# ---- 7. tools -----------------------------------------------------------------------------------------


async def test_tools_reach_github_and_bad_arguments_reach_nothing(tmp_path: Path, github: FakeGitHub) -> None:
    async with in_process(tmp_path, github) as bridge:
        client = bridge.wire.client
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert names == {
            "get_issue",
            "add_labels",
            "remove_label",
            "comment",
            "assign",
            "request_reviewers",
            "search_issues",
            "reopen_issue",
        }
        issue = github.open_issue("acme/x", title="crash on start", labels=["needs info/triage", "bug"])
        pull = github.open_issue("acme/x", title="fix the crash", pull_request=True)

        result = await client.call_tool(
            "remove_label", {"repository": "acme/x", "number": issue["number"], "label": "needs info/triage"}
        )
        assert not result.is_error, result
        call = github.calls("DELETE")[-1]
        assert call.path == f"/repos/acme/x/issues/{issue['number']}/labels/needs%20info%2Ftriage"
        assert call.headers["Authorization"] == f"Bearer {TOKEN}"
        assert [label["name"] for label in github.issue("acme/x", issue["number"])["labels"]] == ["bug"]

        result = await client.call_tool(
            "request_reviewers",
            {
                "repository": "acme/x",
                "number": pull["number"],
                "reviewers": ["hubot"],
                "team_reviewers": ["core"],
            },
        )
        assert not result.is_error, result
        call = github.calls("POST")[-1]
        assert call.path == f"/repos/acme/x/pulls/{pull['number']}/requested_reviewers"
        assert call.json == {"reviewers": ["hubot"], "team_reviewers": ["core"]}

        result = await client.call_tool(
            "search_issues", {"query": "repo:acme/x is:issue crash", "per_page": 3}
        )
        assert not result.is_error, result
        call = github.calls("GET", "/search/issues")[-1]
        assert call.query == {"q": "repo:acme/x is:issue crash", "per_page": "3"}
        found = result.structured_content
        assert found is not None
        assert [item["number"] for item in found["items"]] == [issue["number"]]

        sent = len(github.requests)
        refused = [
            ("get_issue", {"repository": "not a repo", "number": 1}, "repository"),
            ("get_issue", {"repository": "acme/../x", "number": 1}, "repository"),
            ("get_issue", {"repository": "acme/x", "number": 0}, "number"),
            ("add_labels", {"repository": "acme/x", "number": 1, "labels": []}, "labels"),
            ("remove_label", {"repository": "acme/x", "number": 1, "label": ""}, "label"),
            ("request_reviewers", {"repository": "acme/x", "number": pull["number"]}, "reviewer"),
            ("search_issues", {"query": ""}, "query"),
        ]
        for tool, arguments, named in refused:
            result = await client.call_tool(tool, arguments)
            assert result.is_error, (tool, arguments)
            assert named in result.content[0].text, result.content[0].text  # type: ignore[union-attr]
        assert len(github.requests) == sent

        result = await client.call_tool("get_issue", {"repository": "acme/x", "number": 99})
        assert result.is_error
        text = result.content[0].text  # type: ignore[union-attr]
        assert "GET /repos/acme/x/issues/99" in text and "404" in text and "Not Found" in text, text
        assert TOKEN not in text


async def test_comments_mention_no_one_unless_allow_mentions(tmp_path: Path, github: FakeGitHub) -> None:
    async with in_process(tmp_path, github) as bridge:
        client = bridge.wire.client
        issue = github.open_issue("acme/x", title="login page looks odd")

        async def commented(body: str, **extra: Any) -> str:
            arguments = {"repository": "acme/x", "number": issue["number"], "body": body, **extra}
            result = await client.call_tool("comment", arguments)
            assert not result.is_error, result
            call = github.calls("POST")[-1]
            assert call.path == f"/repos/acme/x/issues/{issue['number']}/comments"
            assert isinstance(call.json, dict)
            sent = call.json["body"]
            assert isinstance(sent, str)
            return sent

        # A zero-width space after the @: it reads the same and notifies no one.
        assert await commented("@acme/security-team please look") == "@\u200bacme/security-team please look"
        assert await commented("cc @octocat") == "cc @\u200boctocat"
        assert await commented("cc @octocat", allow_mentions=False) == "cc @\u200boctocat"
        assert await commented("mail a@b.com, or `x@y`") == "mail a@b.com, or `x@y`"
        assert [c["body"] for c in github.comments("acme/x", issue["number"])][:2] == [
            "@\u200bacme/security-team please look",
            "cc @\u200boctocat",
        ]
        # allow_mentions (which the policy pins to false unless its rule allows it): as given.
        for body in ("@acme/security-team please look", "cc @octocat"):
            assert await commented(body, allow_mentions=True) == body

        tools = {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}
        allow = tools["comment"]["properties"]["allow_mentions"]
        assert allow["default"] is False and allow["type"] == "boolean"
        assert "policy" in allow["description"]


# ---- 8. the command line ------------------------------------------------------------------------------


def bridge_cli(tmp_path: Path, *args: str, env: dict[str, str | None]) -> Any:
    runner = CliRunner()
    level = logging.getLogger("agentwake.bridge").level
    try:
        return runner.invoke(
            app, ["bridge", "github", "--state-dir", str(tmp_path / "state"), *args], env=env
        )
    finally:
        logging.getLogger("agentwake.bridge").setLevel(level)


def test_bad_command_lines_exit_2_with_one_error_line_and_no_secret(tmp_path: Path) -> None:
    secrets: dict[str, str | None] = {
        "GITHUB_TOKEN": "ghp_never-print-this",
        "GITHUB_WEBHOOK_SECRET": "hook-never-print-this",
    }
    unset: dict[str, str | None] = {"AW_TEST_UNSET": None}
    cases: list[tuple[list[str], dict[str, str | None], list[str]]] = [
        (
            ["--listen", "127.0.0.1:0", "--webhook-secret-env", "AW_TEST_UNSET"],
            {**secrets, **unset},
            ["AW_TEST_UNSET"],
        ),
        (["--listen", "127.0.0.1:0"], {"GITHUB_WEBHOOK_SECRET": None}, ["GITHUB_WEBHOOK_SECRET"]),
        (["--poll"], secrets, ["--poll", "--repo"]),
        (
            ["--http", "127.0.0.1:0", "--mcp-token-env", "AW_TEST_UNSET"],
            {**secrets, **unset},
            ["AW_TEST_UNSET"],
        ),
        (["--mcp-token-env", "GITHUB_TOKEN"], secrets, ["--mcp-token-env", "--http"]),
        (["--listen", "localhost"], secrets, ["--listen", "HOST:PORT"]),
        (["--listen", "127.0.0.1:70000"], secrets, ["--listen"]),
        (["--http", "127.0.0.1:http"], secrets, ["--http"]),
        (["--allow-tool", "delete_repo"], secrets, ["delete_repo", "close_issue"]),
        (["--webhook-path", "hook"], secrets, ["--webhook-path"]),
    ]
    for args, env, named in cases:
        result = bridge_cli(tmp_path, *args, env=env)
        output = result.output
        assert result.exit_code == 2, (args, output)
        errors = [line for line in output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, (args, output)
        for needle in named:
            assert needle in errors[0], (args, output)
        for value in secrets.values():
            assert value is not None and value not in output, (args, output)
    assert not (tmp_path / "state").exists()


# ---- 2. durability across a SIGKILL, 9. MCP authentication (real processes) ------------------------------


@asynccontextmanager
async def bridge_process(args: list[str], env: dict[str, str]) -> AsyncIterator[RunningService]:
    """``agentwake bridge github`` as a subprocess, its stderr collected; killed on the way out."""
    process = await anyio.open_process(
        [sys.executable, "-m", "agentwake.cli", "bridge", "github", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )
    running = RunningService(process)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(running._read)
            try:
                yield running
            finally:
                if process.returncode is None:
                    process.kill()
                with anyio.CancelScope(shield=True), anyio.fail_after(30):
                    await process.wait()
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await process.aclose()


def announced(service: RunningService, index: int) -> str:
    return service.lines[index].split(" on ", 1)[1].strip()


def subscribe_params(receiver: Receiver) -> dict[str, Any]:
    return {
        "name": "issues.opened",
        "arguments": {"repository": "acme/x"},
        "delivery": {"mode": "webhook", "url": receiver.url(), "secret": "whsec_" + "A" * 32},
    }


async def poll(conn: ServerConnection, cursor: str | None) -> dict[str, Any]:
    return await conn.poll(
        protocol.PollParams(name="issues.opened", cursor=cursor).model_dump(by_alias=True, exclude_none=True)
    )


@pytest.mark.slow
async def test_an_accepted_event_survives_sigkill_and_auth_guards_http_but_not_stdio(
    tmp_path: Path, github: FakeGitHub, ca: trustme.CA
) -> None:
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    common = [
        "--state-dir",
        str(tmp_path / "state"),
        "--api-base",
        github.url,
        "--events-webhook-allow",
        "127.0.0.0/8",
        "--events-webhook-ca",
        str(ca_file),
    ]
    env = {"GITHUB_WEBHOOK_SECRET": SECRET, "GITHUB_TOKEN": TOKEN, "BRIDGE_MCP_TOKEN": MCP_TOKEN}
    async with Receiver(ca) as receiver, aiohttp.ClientSession() as session:
        http_args = [
            "--http",
            "127.0.0.1:0",
            "--mcp-token-env",
            "BRIDGE_MCP_TOKEN",
            "--listen",
            "127.0.0.1:0",
        ]
        async with bridge_process([*common, *http_args], env) as first:
            hook = Hook(
                announced(first, await first.wait_for("bridge: webhooks on http://", timeout=WAIT)), session
            )
            mcp_url = announced(first, await first.wait_for("bridge: MCP on http://", timeout=WAIT))

            initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
            async with httpx.AsyncClient() as http:
                for headers in ({}, {"Authorization": "Bearer not-the-token"}):
                    answer = await http.post(
                        mcp_url,
                        json=initialize,
                        headers={**headers, "Accept": "application/json, text/event-stream"},
                    )
                    assert answer.status_code == 401, answer.text

            config = ServerConfig(url=mcp_url, headers={"Authorization": f"Bearer {MCP_TOKEN}"})
            async with ServerConnection("github", config) as conn:
                over_http = await conn.subscribe(subscribe_params(receiver))
                assert len(receiver.of("verification")) == 1
                one = github.open_issue("acme/x", title="before the kill")
                status, _ = await hook.deliver("issues", github.webhook_issue_opened("acme/x", one["number"]))
                assert status == 202
                polled = await poll(conn, "0")
                assert ids(polled) == [issue_event_id(one)]
                cursor = polled["cursor"]

            two = github.open_issue("acme/x", title="answered, then killed")
            status, _ = await hook.deliver("issues", github.webhook_issue_opened("acme/x", two["number"]))
            assert status == 202
            first.process.kill()
            await first.process.wait()
        assert not any(secret in "\n".join(first.lines) for secret in (SECRET, TOKEN, MCP_TOKEN))

        errlog = (tmp_path / "second.log").open("w")
        stdio = ServerConfig(
            command=sys.executable,
            args=["-m", "agentwake.cli", "bridge", "github", *common, "--allow-tool", "close_issue"],
            env={"GITHUB_TOKEN": TOKEN},
            cwd=REPO,
        )
        try:
            async with ServerConnection("github", stdio, errlog=errlog) as conn:
                assert ids(await poll(conn, cursor)) == [issue_event_id(two)]
                assert ids(await poll(conn, "0")) == [issue_event_id(one), issue_event_id(two)]
                # Over stdio the caller is the principal "stdio", so webhook delivery is allowed; the
                # same key under another principal is another subscription.
                over_stdio = await conn.subscribe(subscribe_params(receiver))
                assert over_stdio.id != over_http.id
                assert len(receiver.of("verification")) == 2
                tools = {tool.name for tool in await conn.list_tools()}
                assert "close_issue" in tools
                result = await conn.call_tool(
                    "close_issue",
                    {"repository": "acme/x", "number": one["number"], "reason": "not_planned"},
                    timeout_s=WAIT,
                )
                assert not result.is_error, result
                assert github.calls("PATCH")[-1].json == {"state": "closed", "state_reason": "not_planned"}
        finally:
            errlog.close()
        assert TOKEN not in (tmp_path / "second.log").read_text()
