"""The GitHub bridge's tools that open, close and reopen issues, through MCP against the fake GitHub:
what reaches GitHub, what GitHub then holds, and the feed event GitHub adds for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_github_bridge import TOKEN, in_process

from agentwake.fakes.github import FakeGitHub

pytestmark = pytest.mark.anyio

REPO = "acme/x"
BOTH = ("close_issue", "create_issue")


@pytest.fixture
async def github() -> Any:
    async with FakeGitHub(token=TOKEN) as fake:
        fake.add_repo(REPO)
        yield fake


def feed(github: FakeGitHub) -> list[tuple[str, str]]:
    """The repository's events feed, oldest first, as (type, action)."""
    return [(item["type"], item["payload"].get("action", "")) for item in github.events(REPO)][::-1]


async def test_create_and_close_are_offered_only_when_allowed(tmp_path: Path, github: FakeGitHub) -> None:
    async with in_process(tmp_path / "off", github) as bridge:
        names = {tool.name for tool in (await bridge.wire.client.list_tools()).tools}
        assert "reopen_issue" in names and not names & set(BOTH)
    async with in_process(tmp_path / "on", github, allowed_tools=BOTH) as bridge:
        names = {tool.name for tool in (await bridge.wire.client.list_tools()).tools}
        assert names >= {"reopen_issue", *BOTH}


async def test_create_issue_opens_one_with_labels_and_neutralised_mentions(
    tmp_path: Path, github: FakeGitHub
) -> None:
    async with in_process(tmp_path, github, allowed_tools=BOTH) as bridge:
        client = bridge.wire.client
        arguments = {
            "repository": REPO,
            "title": "Dependabot alert #20: semver",
            "body": "cc @octocat and @acme/security",
            "labels": ["security"],
        }
        result = await client.call_tool("create_issue", arguments)
        assert not result.is_error, result
        call = github.calls("POST", f"/repos/{REPO}/issues")[-1]
        assert call.json == {
            "title": "Dependabot alert #20: semver",
            "body": "cc @\u200boctocat and @\u200bacme/security",
            "labels": ["security"],
        }
        created = result.structured_content
        assert created is not None
        issue = github.issue(REPO, created["number"])
        assert [label["name"] for label in issue["labels"]] == ["security"]
        assert issue["user"]["login"] == github.viewer_login
        assert feed(github)[-1] == ("IssuesEvent", "opened")

        # allow_mentions (the policy pins it to false unless its rule allows it): as given.
        result = await client.call_tool("create_issue", {**arguments, "allow_mentions": True})
        assert not result.is_error, result
        assert (
            github.calls("POST", f"/repos/{REPO}/issues")[-1].json["body"] == "cc @octocat and @acme/security"
        )  # type: ignore[index]

        sent = len(github.requests)
        for bad in (
            {**arguments, "title": ""},
            {**arguments, "repository": "no"},
            {**arguments, "labels": [""]},
        ):
            result = await client.call_tool("create_issue", bad)
            assert result.is_error, bad
        assert len(github.requests) == sent


@pytest.mark.parametrize("reason", ["completed", "not_planned", "duplicate"])
async def test_close_issue_takes_each_of_githubs_reasons_and_reopen_undoes_it(
    tmp_path: Path, github: FakeGitHub, reason: str
) -> None:
    issue = github.open_issue(REPO, title="Crash on start")
    async with in_process(tmp_path, github, allowed_tools=BOTH) as bridge:
        client = bridge.wire.client
        result = await client.call_tool(
            "close_issue", {"repository": REPO, "number": issue["number"], "reason": reason}
        )
        assert not result.is_error, result
        assert github.calls("PATCH")[-1].json == {"state": "closed", "state_reason": reason}
        closed = github.issue(REPO, issue["number"])
        assert (closed["state"], closed["state_reason"]) == ("closed", reason)
        assert feed(github)[-1] == ("IssuesEvent", "closed")

        result = await client.call_tool("reopen_issue", {"repository": REPO, "number": issue["number"]})
        assert not result.is_error, result
        assert github.calls("PATCH")[-1].json == {"state": "open", "state_reason": "reopened"}
        reopened = github.issue(REPO, issue["number"])
        assert (reopened["state"], reopened["state_reason"]) == ("open", "reopened")
        assert feed(github)[-1] == ("IssuesEvent", "reopened")


async def test_closing_as_a_duplicate_of_an_issue_names_the_original_first(
    tmp_path: Path, github: FakeGitHub
) -> None:
    original = github.open_issue(REPO, title="Crash on start")
    again = github.open_issue(REPO, title="Crashes when starting")
    async with in_process(tmp_path, github, allowed_tools=BOTH) as bridge:
        client = bridge.wire.client
        arguments = {"repository": REPO, "number": again["number"], "reason": "duplicate"}
        result = await client.call_tool("close_issue", {**arguments, "duplicate_of": original["number"]})
        assert not result.is_error, result
        assert [c["body"] for c in github.comments(REPO, again["number"])] == [
            f"Duplicate of #{original['number']}"
        ]
        assert github.issue(REPO, again["number"])["state_reason"] == "duplicate"
        assert feed(github)[-2:] == [("IssueCommentEvent", "created"), ("IssuesEvent", "closed")]

        sent = len(github.requests)
        for bad in (
            {**arguments, "reason": "not_planned", "duplicate_of": original["number"]},
            {**arguments, "duplicate_of": again["number"]},
            {**arguments, "reason": "wontfix"},
        ):
            result = await client.call_tool("close_issue", bad)
            assert result.is_error, bad
        assert len(github.requests) == sent
