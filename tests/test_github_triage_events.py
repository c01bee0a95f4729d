"""Issue 31's triage fields and event types, fed as GitHub's own webhook examples
(/work/shared/upstream-payloads/github/octokit-webhooks, read in place, never copied) through the
bridge's signed webhook listener, then read back over events/poll.

The examples are from 2019: their times are moved to now (all by the same amount, so their order
holds) so the bridge does not refuse them as stale.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from conftest import REPO, UPSTREAM_PAYLOADS
from jsonschema import Draft202012Validator
from test_github_bridge import TOKEN, in_process

from agentwake.bridges.github_events import PAYLOAD_SCHEMAS, from_issue, from_repo_event
from agentwake.fakes.github import FakeGitHub

pytestmark = pytest.mark.anyio

UPSTREAM = UPSTREAM_PAYLOADS / "github" / "octokit-webhooks"
FIXTURES = REPO / "tests" / "fixtures" / "github"
SPREAD = timedelta(minutes=10)
_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def _times(value: Any, found: list[datetime]) -> None:
    if isinstance(value, dict):
        for item in value.values():
            _times(item, found)
    elif isinstance(value, list):
        for item in value:
            _times(item, found)
    elif isinstance(value, str) and _TIME.match(value):
        found.append(datetime.fromisoformat(value.replace("Z", "+00:00")))


def _moved(value: Any, newest: datetime, squeeze: float, now: datetime) -> Any:
    if isinstance(value, dict):
        return {key: _moved(item, newest, squeeze, now) for key, item in value.items()}
    if isinstance(value, list):
        return [_moved(item, newest, squeeze, now) for item in value]
    if isinstance(value, str) and _TIME.match(value):
        moment = now - (newest - datetime.fromisoformat(value.replace("Z", "+00:00"))) * squeeze
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return value


def upstream(event: str, name: str, **changes: Any) -> dict[str, Any]:
    """GitHub's example ``<event>/<name>.payload.json`` (JSON or form-encoded), its newest time now."""
    path = UPSTREAM / event / f"{name}.payload.json"
    if not path.exists():
        path = UPSTREAM / event / f"{name}.json"
    text = path.read_text(encoding="utf-8")
    if text.startswith("payload="):
        text = parse_qs(text)["payload"][0]
    payload = json.loads(text)
    found: list[datetime] = []
    _times(payload, found)
    # The newest time becomes now and the others come within the last SPREAD, in the same order.
    spread = max(found) - min(found)
    squeeze = min(1.0, SPREAD / spread) if spread else 1.0
    moved: dict[str, Any] = _moved(payload, max(found), squeeze, datetime.now(UTC).replace(microsecond=0))
    for dotted, value in changes.items():
        holder = moved
        *parents, last = dotted.split("__")
        for key in parents:
            holder = holder[key]
        holder[last] = value
    return moved


@pytest.fixture
async def github() -> Any:
    async with FakeGitHub(token=TOKEN) as fake:
        yield fake


async def deliver(tmp_path: Path, github: FakeGitHub, kind: str, event: str, payload: dict[str, Any]) -> Any:
    async with in_process(tmp_path, github) as bridge:
        before = await bridge.wire.poll(kind, None)
        status, answer = await bridge.hook.deliver(event, payload)
        assert (status, answer["status"]) == (202, "accepted"), answer
        polled = await bridge.wire.poll(kind, before["cursor"])
    [served] = polled["events"]
    errors = [e.message for e in Draft202012Validator(PAYLOAD_SCHEMAS[kind]).iter_errors(served["data"])]
    assert not errors, errors
    return served


# ---- the triage fields on the existing types -----------------------------------------------------


async def test_a_pull_request_says_who_wrote_it_its_commits_fork_and_size(
    tmp_path: Path, github: FakeGitHub
) -> None:
    served = await deliver(
        tmp_path, github, "pull_request.opened", "pull_request", upstream("pull_request", "opened")
    )
    data = served["data"]
    assert (data["author"], data["authorType"], data["authorAssociation"]) == ("Codertocat", "User", "OWNER")
    assert (data["state"], data["assignees"], data["milestone"], data["draft"]) == (
        "open",
        ["Codertocat"],
        None,
        False,
    )
    assert (data["baseRef"], data["headRef"], data["headIsFork"]) == ("master", "changes", False)
    assert data["headSha"] == "ec26c3e57ca3a959ca5aad62de7213c562f8c821"
    assert data["baseSha"] == "f95f852bd8fca8fcc58a9a2d6c842781e32a215e"
    assert (data["additions"], data["deletions"], data["changedFiles"]) == (1, 1, 1)


async def test_a_pull_request_from_a_fork_says_so(tmp_path: Path, github: FakeGitHub) -> None:
    payload = upstream("pull_request", "opened", pull_request__author_association="FIRST_TIME_CONTRIBUTOR")
    payload["pull_request"]["head"]["repo"] = {
        **payload["pull_request"]["head"]["repo"],
        "full_name": "mallory/Hello-World",
    }
    data = (await deliver(tmp_path, github, "pull_request.opened", "pull_request", payload))["data"]
    assert (data["headIsFork"], data["authorAssociation"]) == (True, "FIRST_TIME_CONTRIBUTOR")


async def test_a_comment_says_its_authors_association_and_the_issues_state_and_author(
    tmp_path: Path, github: FakeGitHub
) -> None:
    served = await deliver(
        tmp_path, github, "issue_comment.created", "issue_comment", upstream("issue_comment", "created")
    )
    data = served["data"]
    assert (data["author"], data["authorType"], data["authorAssociation"]) == ("Codertocat", "User", "OWNER")
    assert (data["issueState"], data["issueAuthor"], data["issueAuthorType"]) == (
        "open",
        "Codertocat",
        "User",
    )
    assert data["issueAuthorAssociation"] == "OWNER"
    assert data["assignees"] == ["Codertocat"] and data["milestone"] == "v1.0"


async def test_a_failed_check_run_says_its_output_details_and_branch(
    tmp_path: Path, github: FakeGitHub
) -> None:
    payload = upstream(
        "check_run",
        "completed",
        check_run__conclusion="failure",
        check_run__output={"title": "3 tests failed", "summary": "x" * 5000, "text": "secret log"},
    )
    data = (await deliver(tmp_path, github, "check_run.completed", "check_run", payload))["data"]
    assert (data["outputTitle"], data["detailsUrl"], data["headBranch"]) == (
        "3 tests failed",
        "https://octocoders.io",
        "changes",
    )
    assert len(data["outputSummary"]) == 1000 and data["outputSummary"].endswith("…")
    assert "secret log" not in json.dumps(data)


def test_the_pollers_items_carry_the_triage_fields_too() -> None:
    items = json.loads((FIXTURES / "rest" / "issues.json").read_text())
    polled = [m for item in items if (m := from_issue(item, "octo-org/hello-world")) is not None]
    assert [(m.data["author"], m.data["authorAssociation"]) for m in polled][:2] == [
        ("mona-lisa", "MEMBER"),
        ("renovate[bot]", "NONE"),
    ]
    assert all("assignees" in m.data and "milestone" in m.data for m in polled)
    feed = json.loads((FIXTURES / "rest" / "repo_events.json").read_text())
    pulls = [
        m for item in feed if (m := from_repo_event(item)) is not None and m.type == "pull_request.opened"
    ]
    assert pulls and pulls[0].data["authorAssociation"] == "MEMBER" and pulls[0].data["additions"] == 24


# ---- the new event types, one of GitHub's examples each ------------------------------------------

OUTSIDER = "FIRST_TIME_CONTRIBUTOR"
NEW_TYPES: list[tuple[str, str, str, dict[str, Any], dict[str, Any]]] = [
    (
        "issues.reopened",
        "issues",
        "reopened",
        {},
        {"number": 1, "state": "open", "author": "Codertocat", "authorAssociation": "OWNER"},
    ),
    (
        "issues.closed",
        "issues",
        "reopened",  # GitHub publishes no closed example: the reopened one, closed as not planned
        {"action": "closed", "issue__state": "closed", "issue__state_reason": "not_planned"},
        {"number": 1, "state": "closed", "stateReason": "not_planned"},
    ),
    (
        "issues.labeled",
        "issues",
        "labeled",
        {},
        {"label": "bug", "milestone": "v1.0", "authorAssociation": "OWNER"},
    ),
    ("issues.assigned", "issues", "assigned", {}, {"assignee": "Codertocat", "assignees": ["Codertocat"]}),
    ("issues.edited", "issues", "edited", {"changes": {"title": {"from": "old"}}}, {"changed": ["title"]}),
    (
        "issues.transferred",
        "issues",
        "transferred",
        {},
        {"newRepository": "Codertocat/Hello-World", "newNumber": 1},
    ),
    (
        "issue_comment.edited",
        "issue_comment",
        "edited",
        {"comment__author_association": OUTSIDER},
        {"authorAssociation": OUTSIDER, "issueState": "open", "commentId": 492700400},
    ),
    ("pull_request.reopened", "pull_request", "reopened", {}, {"number": 2, "state": "open"}),
    (
        "pull_request.closed",
        "pull_request",
        "closed",
        {},
        {"number": 2, "state": "closed", "merged": False, "authorAssociation": "OWNER"},
    ),
    (
        "pull_request.synchronize",
        "pull_request",
        "synchronize",
        {},
        {
            "headSha": "ec26c3e57ca3a959ca5aad62de7213c562f8c821",
            "before": "f95f852bd8fca8fcc58a9a2d6c842781e32a215e",
        },
    ),
    ("pull_request.ready_for_review", "pull_request", "ready_for_review", {}, {"draft": False}),
    (
        "pull_request_review.submitted",
        "pull_request_review",
        "submitted",
        {"review__state": "CHANGES_REQUESTED"},
        {
            "reviewId": 237895671,
            "reviewState": "changes_requested",
            "reviewer": "Codertocat",
            "reviewerAssociation": "OWNER",
            "additions": None,
            "bodyExcerpt": "",
        },
    ),
    (
        "pull_request_review_comment.created",
        "pull_request_review_comment",
        "created",
        {},
        {"commentId": 284312630, "path": "README.md", "authorAssociation": "OWNER", "number": 2},
    ),
    (
        "check_suite.completed",
        "check_suite",
        "completed",
        {"check_suite__conclusion": "failure"},
        {"checkSuiteId": 118578147, "conclusion": "failure", "headBranch": "changes", "pullRequests": [2]},
    ),
    (
        "workflow_job.completed",
        "workflow_job",
        "completed.failure.with-organization",
        {},
        {
            "jobId": 289782451,
            "runId": 2202229078,
            "name": "linters",
            "workflowName": "CodeQL",
            "headBranch": "main",
        },
    ),
    (
        "status.failed",
        "status",
        "payload",
        {"state": "error", "description": "The build broke", "target_url": "https://ci.example/1"},
        {
            "statusId": 6805126730,
            "state": "error",
            "context": "default",
            "detailsUrl": "https://ci.example/1",
        },
    ),
]


@pytest.mark.parametrize(
    ("kind", "event", "example", "changes", "expected"), NEW_TYPES, ids=[case[0] for case in NEW_TYPES]
)
async def test_each_new_event_type_arrives_by_a_signed_webhook(
    tmp_path: Path,
    github: FakeGitHub,
    kind: str,
    event: str,
    example: str,
    changes: dict[str, Any],
    expected: dict[str, Any],
) -> None:
    payload = upstream(event, example, **changes)
    served = await deliver(tmp_path, github, kind, event, payload)
    assert served["eventId"].startswith(f"{kind}:")
    assert {key: served["data"][key] for key in expected} == expected
    assert served["data"]["repository"].lower() in ("codertocat/hello-world", "octo-org/octo-repo")


@pytest.mark.parametrize(
    ("event", "example", "changes"),
    [
        ("check_suite", "completed", {}),
        ("workflow_job", "completed.success.with-organization", {}),
        ("status", "payload", {}),
        ("status", "payload", {"state": "pending"}),
    ],
)
async def test_ci_that_did_not_fail_is_ignored(
    tmp_path: Path, github: FakeGitHub, event: str, example: str, changes: dict[str, Any]
) -> None:
    async with in_process(tmp_path, github) as bridge:
        status, answer = await bridge.hook.deliver(event, upstream(event, example, **changes))
        assert (status, answer["status"]) == (202, "ignored")
        assert bridge.head() == 0
