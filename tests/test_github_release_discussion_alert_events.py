"""Releases, discussions and security alerts (issue 31): GitHub's own webhook examples
(octokit-webhooks, read in place, never copied) through the bridge's signed webhook listener, then
read back over events/poll; releases and discussions by polling the fake's events feed too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from test_github_bridge import TOKEN, ids, in_process
from test_github_triage_events import deliver, upstream

from agentwake.bridges.github_events import EVENT_TYPES, PAYLOAD_SCHEMAS, from_repo_event, from_webhook
from agentwake.fakes.github import FakeGitHub

pytestmark = pytest.mark.anyio

REPO = "acme/x"
LEAKED = "aio_ThisIsTheLeakedSecretValue0123456789"


@pytest.fixture
async def github() -> Any:
    async with FakeGitHub(token=TOKEN) as fake:
        yield fake


CASES: list[tuple[str, str, str, dict[str, Any], dict[str, Any]]] = [
    (
        "release.published",
        "release",
        "published",
        {"release__body": "## Fixes\n" + "x" * 3000, "release__prerelease": True},
        {
            "releaseId": 17372790,
            "tag": "0.0.1",
            "name": "",
            "author": "Codertocat",
            "authorType": "User",
            "prerelease": True,
            "draft": False,
            "bodyTruncated": True,
            "url": "https://github.com/Codertocat/Hello-World/releases/tag/0.0.1",
        },
    ),
    (
        "discussion.created",
        "discussion",
        "created",
        {"discussion__author_association": "FIRST_TIME_CONTRIBUTOR"},
        {
            "number": 4,
            "title": "TEST edit",
            "category": "General",
            "author": "Codertocat",
            "authorType": "User",
            "authorAssociation": "FIRST_TIME_CONTRIBUTOR",
            "bodyExcerpt": "TEST edit",
            "url": "https://github.com/Codertocat/Hello-World/discussions/4",
        },
    ),
    (
        "discussion_comment.created",
        "discussion_comment",
        "created",
        {},
        {
            "number": 4,
            "title": "TEST edit",
            "commentId": 550062,
            "author": "Codertocat",
            "authorAssociation": "OWNER",
            "bodyExcerpt": "ANSWER",
            "isReply": False,
            "discussionUrl": "https://github.com/Codertocat/Hello-World/discussions/4",
        },
    ),
    (
        "dependabot_alert.created",
        "dependabot_alert",
        "created",
        {},
        {
            "number": 20,
            "state": "open",
            "severity": "medium",
            "package": "semver",
            "ecosystem": "npm",
            "ghsaId": "GHSA-c2qf-rxjj-qqgw",
            "cveId": "CVE-2022-25883",
            "patchedVersion": "7.5.2",
            "url": "https://github.com/wolfy1339/pika-pack/security/dependabot/20",
        },
    ),
    (
        "dependabot_alert.reopened",
        "dependabot_alert",
        "created",  # GitHub publishes no reopened example: the created one, reopened
        {"action": "reopened"},
        {"number": 20, "state": "open", "package": "semver"},
    ),
    (
        "code_scanning_alert.created",
        "code_scanning_alert",
        "created",
        {},
        {
            "number": 10,
            "state": "open",
            "severity": "error",
            "ruleId": "java/sql-injection",
            "ruleSeverity": "error",
            "tool": "CodeQL",
            "ref": "refs/heads/code-feature",
            "path": "src/main/java/com/github/demo/service/BookService.java",
        },
    ),
    (
        "code_scanning_alert.reopened",
        "code_scanning_alert",
        "reopened",
        {},
        {"number": 10, "severity": "note", "ruleId": "Style/FrozenStringLiteralComment", "tool": "Rubocop"},
    ),
    (
        "secret_scanning_alert.reopened",
        "secret_scanning_alert",
        "reopened",
        # GitHub's payload today carries more than the example: its type's display name, state and
        # the secret itself, which must go nowhere.
        {
            "alert__secret_type_display_name": "Adafruit IO Key",
            "alert__state": "open",
            "alert__secret": LEAKED,
        },
        {
            "number": 191,
            "secretType": "adafruit_io_key",
            "secretTypeDisplayName": "Adafruit IO Key",
            "state": "open",
            "url": "https://github.com/Codertocat/Hello-World/security/secret-scanning/191",
        },
    ),
    (
        "secret_scanning_alert.created",
        "secret_scanning_alert",
        "reopened",  # GitHub publishes no created example: the reopened one, as created
        {"action": "created", "alert__secret": LEAKED},
        {"number": 191, "secretType": "adafruit_io_key", "secretTypeDisplayName": None},
    ),
]


@pytest.mark.parametrize(
    ("kind", "event", "example", "changes", "expected"), CASES, ids=[c[0] for c in CASES]
)
async def test_each_type_arrives_by_a_signed_webhook_with_its_fields(
    tmp_path: Path,
    github: FakeGitHub,
    kind: str,
    event: str,
    example: str,
    changes: dict[str, Any],
    expected: dict[str, Any],
) -> None:
    served = await deliver(tmp_path, github, kind, event, upstream(event, example, **changes))
    assert served["eventId"].startswith(f"{kind}:")
    assert {key: served["data"][key] for key in expected} == expected
    assert LEAKED not in json.dumps(served)
    assert len(served["data"].get("bodyExcerpt", "")) <= 1000


def test_every_new_type_is_documented_with_a_schema_and_says_how_it_arrives() -> None:
    for kind, *_ in CASES:
        assert kind in PAYLOAD_SCHEMAS and kind in EVENT_TYPES
        assert "webhook" in EVENT_TYPES[kind]
    assert "only" in EVENT_TYPES["discussion_comment.created"]
    assert "polling" in EVENT_TYPES["release.published"]


@pytest.mark.parametrize(
    ("event", "example"),
    [
        ("release", "created"),
        ("release", "prereleased"),
        ("discussion", "edited"),
        ("discussion_comment", "edited"),
    ],
)
async def test_other_actions_of_these_webhooks_are_ignored(
    tmp_path: Path, github: FakeGitHub, event: str, example: str
) -> None:
    async with in_process(tmp_path, github) as bridge:
        status, answer = await bridge.hook.deliver(event, upstream(event, example))
        assert (status, answer["status"]) == (202, "ignored")
        assert bridge.head() == 0


def test_an_alerts_id_names_its_repository_and_a_reopening_its_time() -> None:
    created = upstream("dependabot_alert", "created")
    first = from_webhook("dependabot_alert", created)
    assert first is not None and first.event_id == "dependabot_alert.created:wolfy1339/pika-pack:20"
    elsewhere = {**created, "repository": {**created["repository"], "full_name": "acme/other"}}
    other = from_webhook("dependabot_alert", elsewhere)
    assert other is not None and other.event_id != first.event_id
    reopened = upstream(
        "dependabot_alert", "created", action="reopened", alert__updated_at="2030-01-01T00:00:00Z"
    )
    again = upstream(
        "dependabot_alert", "created", action="reopened", alert__updated_at="2030-02-01T00:00:00Z"
    )
    one, two = from_webhook("dependabot_alert", reopened), from_webhook("dependabot_alert", again)
    assert one is not None and two is not None
    assert one.event_id == "dependabot_alert.reopened:wolfy1339/pika-pack:20:2030-01-01T00:00:00Z"
    assert one.event_id != two.event_id


async def test_releases_and_discussions_arrive_by_polling_with_the_webhooks_ids(
    tmp_path: Path, github: FakeGitHub
) -> None:
    async with in_process(tmp_path, github, repos=(REPO,)) as bridge:
        github.add_repo(REPO)
        await bridge.bridge.poll_repo(REPO)  # the baseline
        release = github.publish_release(
            REPO, tag="v2.0.0", name="Two", body="@octocat thanks", prerelease=True
        )
        discussion = github.start_discussion(REPO, title="Roadmap?", body="What is next?", category="Ideas")
        await bridge.bridge.poll_repo(REPO)

        by_webhook = from_webhook("release", github.webhook_release_published(REPO, release["id"]))
        assert by_webhook is not None
        polled = await bridge.wire.poll("release.published", "0")
        assert ids(polled) == [by_webhook.event_id] == [f"release.published:{release['id']}"]
        data = polled["events"][0]["data"]
        assert (data["tag"], data["name"], data["prerelease"], data["author"]) == (
            "v2.0.0",
            "Two",
            True,
            "octocat",
        )
        errors = list(Draft202012Validator(PAYLOAD_SCHEMAS["release.published"]).iter_errors(data))
        assert not errors, errors

        mapped = from_webhook("discussion", github.webhook_discussion_created(REPO, discussion["number"]))
        assert mapped is not None
        polled = await bridge.wire.poll("discussion.created", "0")
        assert ids(polled) == [mapped.event_id]
        data = polled["events"][0]["data"]
        assert (data["number"], data["title"], data["category"], data["authorAssociation"]) == (
            discussion["number"],
            "Roadmap?",
            "Ideas",
            "NONE",
        )


def test_a_feed_release_that_is_not_published_is_not_emitted() -> None:
    item = {
        "id": "1",
        "type": "ReleaseEvent",
        "actor": {"login": "octocat"},
        "repo": {"name": REPO},
        "payload": {"action": "edited", "release": {}},
    }
    assert from_repo_event(item) is None
