"""The GitHub bridge's mapping: webhook bodies and REST items (tests/fixtures/github/) to typed MCP events."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from agentwake.bridges.github_events import (
    ARGUMENTS_SCHEMA,
    EVENT_TYPES,
    EXCERPT_CHARS,
    PAYLOAD_SCHEMAS,
    Mapped,
    Unmapped,
    from_issue,
    from_repo_event,
    from_webhook,
    from_workflow_run,
    is_bot,
    matches,
)

FIXTURES = Path(__file__).parent / "fixtures" / "github"
REPOSITORY = "octo-org/hello-world"
WEB = f"https://github.com/{REPOSITORY}"
ALERTS = ("dependabot_alert", "code_scanning_alert", "secret_scanning_alert")
WEBHOOKS = sorted(path.name for path in (FIXTURES / "webhooks").glob("*.json"))


def load(relative: str) -> Any:
    return json.loads((FIXTURES / relative).read_text(encoding="utf-8"))


def webhook(name: str) -> tuple[str, dict[str, Any]]:
    """A webhook fixture's X-GitHub-Event header (the file name up to the first dot) and body."""
    return name.partition(".")[0], load(f"webhooks/{name}.json")


def mapped_webhook(name: str) -> Mapped:
    result = from_webhook(*webhook(name))
    assert result is not None, name
    return result


def repo_events() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = load("rest/repo_events.json")
    return items


def repo_event(kind: str, action: str, actor: str | None = None, having: str | None = None) -> dict[str, Any]:
    """The first item of the events page of this type and action, by this actor, with this payload key."""
    for item in repo_events():
        body = item["payload"]
        if (
            (item["type"], body.get("action")) == (kind, action)
            and actor in (None, item["actor"]["login"])
            and (having is None or having in body)
        ):
            return item
    raise AssertionError(f"no {kind} {action} in rest/repo_events.json")


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def assert_valid(mapped: Mapped) -> None:
    errors = [e.message for e in Draft202012Validator(PAYLOAD_SCHEMAS[mapped.type]).iter_errors(mapped.data)]
    assert not errors, (mapped.type, errors)


def every_mapped() -> list[Mapped]:
    found = [m for name in WEBHOOKS if (m := from_webhook(*webhook(name.removesuffix(".json")))) is not None]
    found += [m for item in repo_events() if (m := from_repo_event(item)) is not None]
    found += [m for item in load("rest/issues.json") if (m := from_issue(item, REPOSITORY)) is not None]
    runs = load("rest/actions_runs.json")["workflow_runs"]
    found += [m for run in runs if (m := from_workflow_run(run, REPOSITORY)) is not None]
    return found


# ---- the declarations ----------------------------------------------------------------


def test_event_types_and_payload_schemas_name_the_same_types_in_order() -> None:
    assert list(EVENT_TYPES) == [
        "issues.opened",
        "issue_comment.created",
        "pull_request.opened",
        "pull_request.review_requested",
        "check_run.completed",
        "workflow_run.completed",
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
        "pull_request_review.submitted",
        "pull_request_review_comment.created",
        "check_suite.completed",
        "workflow_job.completed",
        "status.failed",
        "release.published",
        "discussion.created",
        "discussion_comment.created",
        *(f"{kind}.{action}" for kind in ALERTS for action in ("created", "reopened")),
    ]
    assert list(PAYLOAD_SCHEMAS) == list(EVENT_TYPES)
    assert all(description.strip() for description in EVENT_TYPES.values())


@pytest.mark.parametrize("kind", list(PAYLOAD_SCHEMAS))
def test_each_payload_schema_is_a_closed_described_2020_12_object(kind: str) -> None:
    schema = PAYLOAD_SCHEMAS[kind]
    Draft202012Validator.check_schema(schema)
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert sorted(schema["required"]) == sorted(schema["properties"])
    for name, prop in schema["properties"].items():
        assert prop.get("description"), f"{kind}.{name} has no description"
    common = {"repository", "url", "actor", "actorType", "occurredAt", "labels"}
    assert common <= set(schema["properties"])


def test_the_arguments_schema_allows_repository_and_label_only() -> None:
    Draft202012Validator.check_schema(ARGUMENTS_SCHEMA)
    validator = Draft202012Validator(ARGUMENTS_SCHEMA)
    assert validator.is_valid({})
    assert validator.is_valid({"repository": "octo-org/*", "label": "bug"})
    assert not validator.is_valid({"repository": "octo-org"})
    assert not validator.is_valid({"branch": "main"})
    assert all(prop["description"] for prop in ARGUMENTS_SCHEMA["properties"].values())


def test_every_event_of_every_fixture_validates_against_its_schema() -> None:
    found = every_mapped()
    # The types these fixtures hold; tests/test_github_triage_events.py maps GitHub's own examples of the rest.
    assert {m.type for m in found} == set(list(EVENT_TYPES)[:6]) | {"issues.closed"}
    for mapped in found:
        assert_valid(mapped)
        assert mapped.occurred_at.utcoffset() is not None
        assert mapped.occurred_at.utcoffset() == UTC.utcoffset(None)
        assert mapped.event_id.startswith(f"{mapped.type}:")


# ---- webhooks, one fixture each ------------------------------------------------------


def test_issues_opened() -> None:
    body = load("webhooks/issues.opened.json")["issue"]["body"]
    assert len(body) < EXCERPT_CHARS
    assert mapped_webhook("issues.opened") == Mapped(
        type="issues.opened",
        event_id="issues.opened:2301458910",
        occurred_at=datetime(2024, 5, 2, 9, 14, 7, tzinfo=UTC),
        data={
            "number": 42,
            "title": "Config loader crashes on a UTF-8 BOM",
            "author": "mona-lisa",
            "authorType": "User",
            "authorAssociation": "MEMBER",
            "state": "open",
            "assignees": [],
            "milestone": None,
            "bodyExcerpt": body,
            "bodyTruncated": False,
            "repository": REPOSITORY,
            "url": f"{WEB}/issues/42",
            "actor": "mona-lisa",
            "actorType": "User",
            "occurredAt": "2024-05-02T09:14:07.000Z",
            "labels": ["bug", "needs triage"],
        },
    )


def test_issue_comment_created_on_an_issue() -> None:
    mapped = mapped_webhook("issue_comment.created.issue")
    body = load("webhooks/issue_comment.created.issue.json")["comment"]["body"]
    assert mapped == Mapped(
        type="issue_comment.created",
        event_id="issue_comment.created:2090317784",
        occurred_at=at("2024-05-02T10:02:51Z"),
        data={
            "number": 42,
            "issueTitle": "Config loader crashes on a UTF-8 BOM",
            "isPullRequest": False,
            "issueState": "open",
            "issueAuthor": "mona-lisa",
            "issueAuthorType": "User",
            "issueAuthorAssociation": "MEMBER",
            "assignees": [],
            "milestone": None,
            "issueUrl": f"{WEB}/issues/42",
            "commentId": 2090317784,
            "author": "octocat",
            "authorType": "User",
            "authorAssociation": "MEMBER",
            "bodyExcerpt": body,
            "bodyTruncated": False,
            "repository": REPOSITORY,
            "url": f"{WEB}/issues/42#issuecomment-2090317784",
            "actor": "octocat",
            "actorType": "User",
            "occurredAt": "2024-05-02T10:02:51.000Z",
            "labels": ["bug", "needs triage"],
        },
    )


def test_issue_comment_created_on_a_pull_request_by_a_bot() -> None:
    mapped = mapped_webhook("issue_comment.created.pull_request")
    assert mapped.event_id == "issue_comment.created:2090455121"
    data = mapped.data
    assert data["isPullRequest"] is True
    assert data["number"] == 43
    assert data["issueUrl"] == f"{WEB}/pull/43"
    assert data["url"] == f"{WEB}/pull/43#issuecomment-2090455121"
    assert (data["author"], data["authorType"]) == ("codecov[bot]", "Bot")
    assert (data["actor"], data["actorType"]) == ("codecov[bot]", "Bot")
    assert data["bodyExcerpt"].startswith("## [Codecov]")
    assert data["labels"] == ["enhancement"]


def test_pull_request_opened() -> None:
    body = load("webhooks/pull_request.opened.json")["pull_request"]["body"]
    assert mapped_webhook("pull_request.opened") == Mapped(
        type="pull_request.opened",
        event_id="pull_request.opened:1848226771",
        occurred_at=at("2024-05-02T11:30:12Z"),
        data={
            "number": 43,
            "title": "Accept a UTF-8 BOM at the start of the config file",
            "author": "mona-lisa",
            "authorType": "User",
            "authorAssociation": "MEMBER",
            "state": "open",
            "assignees": [],
            "milestone": None,
            "draft": False,
            "baseRef": "main",
            "baseSha": "4be0c6d2a1f9e8b7c6d5e4f3a2b1c0d9e8f7a6b5",
            "headRef": "fix/bom-config",
            "headSha": "9f1c3b2e7d4a5068b1e2c3d4f5a6b7c8d9e0f1a2",
            "headIsFork": False,
            "additions": 24,
            "deletions": 2,
            "changedFiles": 3,
            "bodyExcerpt": body,
            "bodyTruncated": False,
            "repository": REPOSITORY,
            "url": f"{WEB}/pull/43",
            "actor": "mona-lisa",
            "actorType": "User",
            "occurredAt": "2024-05-02T11:30:12.000Z",
            "labels": ["enhancement"],
        },
    )


def test_pull_request_review_requested_from_a_user() -> None:
    assert mapped_webhook("pull_request.review_requested.user") == Mapped(
        type="pull_request.review_requested",
        event_id="pull_request.review_requested:1848226771:octocat:2024-05-02T11:30:15Z",
        occurred_at=at("2024-05-02T11:30:15Z"),
        data={
            "number": 43,
            "title": "Accept a UTF-8 BOM at the start of the config file",
            "author": "mona-lisa",
            "authorType": "User",
            "authorAssociation": "MEMBER",
            "state": "open",
            "assignees": [],
            "milestone": None,
            "draft": False,
            "baseRef": "main",
            "baseSha": "4be0c6d2a1f9e8b7c6d5e4f3a2b1c0d9e8f7a6b5",
            "headRef": "fix/bom-config",
            "headSha": "9f1c3b2e7d4a5068b1e2c3d4f5a6b7c8d9e0f1a2",
            "headIsFork": False,
            "additions": 24,
            "deletions": 2,
            "changedFiles": 3,
            "requestedReviewer": "octocat",
            "requestedTeam": None,
            "repository": REPOSITORY,
            "url": f"{WEB}/pull/43",
            "actor": "mona-lisa",
            "actorType": "User",
            "occurredAt": "2024-05-02T11:30:15.000Z",
            "labels": ["enhancement"],
        },
        # The id holds a time: another sighting of this request within a minute is the same one.
        same_prefix="pull_request.review_requested:1848226771:octocat:",
        same_within=timedelta(minutes=1),
    )


def test_pull_request_review_requested_from_a_team() -> None:
    mapped = mapped_webhook("pull_request.review_requested.team")
    assert mapped.event_id == (
        "pull_request.review_requested:1848226771:team:platform-reviewers:2024-05-02T11:30:16Z"
    )
    assert mapped.occurred_at == at("2024-05-02T11:30:16Z")
    assert mapped.data["requestedReviewer"] is None
    assert mapped.data["requestedTeam"] == "platform-reviewers"


def test_a_review_request_after_another_edit_is_another_event() -> None:
    event, payload = webhook("pull_request.review_requested.user")
    later = copy.deepcopy(payload)
    later["pull_request"]["updated_at"] = "2024-05-02T12:00:00Z"
    first, second = from_webhook(event, payload), from_webhook(event, later)
    assert first is not None and second is not None
    assert first.event_id != second.event_id
    # The same moment written with an offset is the same request.
    shifted = copy.deepcopy(payload)
    shifted["pull_request"]["updated_at"] = "2024-05-02T13:30:15+02:00"
    again = from_webhook(event, shifted)
    assert again is not None and again.event_id == first.event_id


def test_check_run_completed_with_a_failure() -> None:
    assert mapped_webhook("check_run.completed.failure") == Mapped(
        type="check_run.completed",
        event_id="check_run.completed:24518337213",
        occurred_at=at("2024-05-02T11:36:48Z"),
        data={
            "checkRunId": 24518337213,
            "name": "test (3.11)",
            "conclusion": "failure",
            "headBranch": "fix/bom-config",
            "headSha": "9f1c3b2e7d4a5068b1e2c3d4f5a6b7c8d9e0f1a2",
            "app": "github-actions",
            "pullRequests": [43],
            "outputTitle": None,
            "outputSummary": "Process completed with exit code 1.",
            "detailsUrl": f"{WEB}/actions/runs/9120577123/job/24518337213",
            "repository": REPOSITORY,
            "url": f"{WEB}/actions/runs/9120577123/job/24518337213",
            "actor": "github-actions[bot]",
            "actorType": "Bot",
            "occurredAt": "2024-05-02T11:36:48.000Z",
            "labels": [],
        },
    )


def test_workflow_run_completed_with_a_failure() -> None:
    assert mapped_webhook("workflow_run.completed.failure") == Mapped(
        type="workflow_run.completed",
        event_id="workflow_run.completed:9120577123:1",
        occurred_at=at("2024-05-02T11:37:02Z"),
        data={
            "runId": 9120577123,
            "runAttempt": 1,
            "name": "CI",
            "conclusion": "failure",
            "headBranch": "fix/bom-config",
            "headSha": "9f1c3b2e7d4a5068b1e2c3d4f5a6b7c8d9e0f1a2",
            "trigger": "pull_request",
            "pullRequests": [43],
            "repository": REPOSITORY,
            "url": f"{WEB}/actions/runs/9120577123",
            "actor": "mona-lisa",
            "actorType": "User",
            "occurredAt": "2024-05-02T11:37:02.000Z",
            "labels": [],
        },
    )


@pytest.mark.parametrize("name", ["check_run.completed.success", "workflow_run.completed.success", "ping"])
def test_runs_that_did_not_fail_and_ping_map_to_nothing(name: str) -> None:
    assert from_webhook(*webhook(name)) is None


@pytest.mark.parametrize("conclusion", ["failure", "timed_out", "startup_failure"])
def test_every_failing_conclusion_is_emitted(conclusion: str) -> None:
    event, payload = webhook("check_run.completed.failure")
    payload["check_run"]["conclusion"] = conclusion
    check = from_webhook(event, payload)
    assert check is not None and check.data["conclusion"] == conclusion
    event, payload = webhook("workflow_run.completed.failure")
    payload["workflow_run"]["conclusion"] = conclusion
    run = from_webhook(event, payload)
    assert run is not None and run.data["conclusion"] == conclusion


@pytest.mark.parametrize(
    "conclusion", ["success", "cancelled", "neutral", "skipped", "action_required", "stale", None]
)
def test_no_other_conclusion_is_emitted(conclusion: str | None) -> None:
    event, payload = webhook("check_run.completed.failure")
    payload["check_run"]["conclusion"] = conclusion
    assert from_webhook(event, payload) is None
    event, payload = webhook("workflow_run.completed.failure")
    payload["workflow_run"]["conclusion"] = conclusion
    assert from_webhook(event, payload) is None


@pytest.mark.parametrize(
    ("name", "action"),
    [
        ("issues.opened", "unlabeled"),
        ("issues.opened", "locked"),
        ("issue_comment.created.issue", "deleted"),
        ("pull_request.opened", "converted_to_draft"),
        ("pull_request.review_requested.user", "review_request_removed"),
        ("check_run.completed.failure", "created"),
        ("workflow_run.completed.failure", "requested"),
    ],
)
def test_other_actions_map_to_nothing(name: str, action: str) -> None:
    event, payload = webhook(name)
    payload["action"] = action
    assert from_webhook(event, payload) is None


@pytest.mark.parametrize("event", ["push", "star", "release", "pull_request_review", "check_suite", ""])
def test_events_we_do_not_emit_map_to_nothing(event: str) -> None:
    assert from_webhook(event, {"action": "opened", "zen": "Keep it logically awesome."}) is None


# ---- the REST API: the same occurrence gets the same id ------------------------------


@pytest.mark.parametrize(
    ("kind", "action", "actor", "having", "name"),
    [
        ("IssuesEvent", "opened", None, None, "issues.opened"),
        ("IssueCommentEvent", "created", "octocat", None, "issue_comment.created.issue"),
        ("PullRequestEvent", "opened", None, None, "pull_request.opened"),
        (
            "PullRequestEvent",
            "review_requested",
            None,
            "requested_reviewer",
            "pull_request.review_requested.user",
        ),
        (
            "PullRequestEvent",
            "review_requested",
            None,
            "requested_team",
            "pull_request.review_requested.team",
        ),
    ],
)
def test_an_events_api_item_and_its_webhook_agree(
    kind: str, action: str, actor: str | None, having: str | None, name: str
) -> None:
    polled, pushed = from_repo_event(repo_event(kind, action, actor, having)), mapped_webhook(name)
    assert polled is not None
    assert (polled.type, polled.event_id, polled.occurred_at) == (
        pushed.type,
        pushed.event_id,
        pushed.occurred_at,
    )
    # The events API gives no actor type; for these humans it is "User", like the webhook's sender.
    assert polled.data == pushed.data


def test_the_events_api_has_no_actor_type_so_the_login_tells_a_bot() -> None:
    item = repo_event("IssueCommentEvent", "created", actor="codecov[bot]")
    polled = from_repo_event(item)
    assert polled is not None
    assert (polled.data["actor"], polled.data["actorType"]) == ("codecov[bot]", "Bot")
    assert polled == mapped_webhook("issue_comment.created.pull_request")


def test_events_api_items_we_do_not_emit_map_to_nothing() -> None:
    mapped = {item["id"]: from_repo_event(item) for item in repo_events()}
    skipped = {
        item["type"] + "/" + item["payload"].get("action", "")
        for item in repo_events()
        if mapped[item["id"]] is None
    }
    assert skipped == {"CreateEvent/", "PushEvent/", "WatchEvent/started"}


def test_the_issues_list_and_the_webhook_give_one_issue_the_same_event() -> None:
    items = load("rest/issues.json")
    pull, issue_42, bot_issue, closed = (from_issue(item, REPOSITORY) for item in items)
    assert pull is None  # a pull request, listed as an issue
    pushed = mapped_webhook("issues.opened")
    assert issue_42 is not None
    assert (issue_42.event_id, issue_42.occurred_at) == (pushed.event_id, pushed.occurred_at)
    assert issue_42.data == pushed.data  # the opener is the actor both ways
    assert bot_issue is not None
    assert bot_issue.data["bodyExcerpt"] == "" and bot_issue.data["bodyTruncated"] is False
    assert (bot_issue.data["actor"], bot_issue.data["actorType"]) == ("renovate[bot]", "Bot")
    assert closed is not None and closed.data["state"] == "closed"


def test_the_runs_list_maps_only_the_failed_run_as_its_webhook_does() -> None:
    runs = load("rest/actions_runs.json")["workflow_runs"]
    mapped = [from_workflow_run(run, REPOSITORY) for run in runs]
    assert [m is not None for m in mapped] == [
        False,
        True,
        False,
        False,
    ]  # running, failed, passed, cancelled
    assert mapped[1] == mapped_webhook("workflow_run.completed.failure")


def test_a_rerun_is_another_event() -> None:
    run = load("rest/actions_runs.json")["workflow_runs"][1]
    run["run_attempt"] = 2
    mapped = from_workflow_run(run, REPOSITORY)
    assert mapped is not None and mapped.event_id == "workflow_run.completed:9120577123:2"


# ---- malformed payloads --------------------------------------------------------------


def without(payload: dict[str, Any], *path: str) -> dict[str, Any]:
    changed = copy.deepcopy(payload)
    holder = changed
    for key in path[:-1]:
        holder = holder[key]
    del holder[path[-1]]
    return changed


def replaced(payload: dict[str, Any], value: Any, *path: str) -> dict[str, Any]:
    changed = copy.deepcopy(payload)
    holder = changed
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return changed


def unmapped(call: Any, *args: Any) -> str:
    with pytest.raises(Unmapped) as caught:
        call(*args)
    message = str(caught.value)
    assert len(message) < 200
    return message


def test_a_webhook_missing_its_issue_names_the_field() -> None:
    event, payload = webhook("issues.opened")
    assert unmapped(from_webhook, event, without(payload, "issue")) == "issue: missing"


def test_an_ill_typed_field_is_named_and_its_value_never_shown() -> None:
    event, payload = webhook("issues.opened")
    huge = "4" * 1_000_000
    message = unmapped(from_webhook, event, replaced(payload, huge, "issue", "number"))
    assert message == "issue.number: must be an integer, not a string"
    message = unmapped(from_webhook, event, replaced(payload, True, "issue", "id"))
    assert message == "issue.id: must be an integer, not a boolean"
    message = unmapped(from_webhook, event, replaced(payload, "yesterday", "issue", "created_at"))
    assert message == "issue.created_at: must be an ISO 8601 time, not a string"


def test_a_webhook_missing_its_repository_or_sender_names_the_field() -> None:
    event, payload = webhook("pull_request.opened")
    assert unmapped(from_webhook, event, without(payload, "repository")) == "repository: missing"
    message = unmapped(from_webhook, event, without(payload, "repository", "full_name"))
    assert message == "repository.full_name: missing"
    assert unmapped(from_webhook, event, replaced(payload, None, "sender")) == (
        "sender: must be an object, not null"
    )


@pytest.mark.parametrize(
    ("name", "path", "field"),
    [
        ("issue_comment.created.issue", ("comment", "user"), "comment.user"),
        ("pull_request.opened", ("pull_request", "head"), "pull_request.head"),
        ("pull_request.review_requested.user", ("requested_reviewer",), "requested_reviewer"),
        ("check_run.completed.failure", ("check_run", "completed_at"), "check_run.completed_at"),
        ("workflow_run.completed.failure", ("workflow_run", "run_attempt"), "workflow_run.run_attempt"),
        ("issues.opened", ("action",), "action"),
    ],
)
def test_each_emitted_type_names_a_missing_field(name: str, path: tuple[str, ...], field: str) -> None:
    event, payload = webhook(name)
    assert unmapped(from_webhook, event, without(payload, *path)).startswith(f"{field}: missing")


def test_a_label_or_pull_request_of_the_wrong_shape_is_named_by_index() -> None:
    event, payload = webhook("issues.opened")
    message = unmapped(from_webhook, event, replaced(payload, [{"name": "bug"}, 7], "issue", "labels"))
    assert message == "issue.labels[1]: must be an object, not a number"
    event, payload = webhook("check_run.completed.failure")
    message = unmapped(from_webhook, event, replaced(payload, [{"id": 1}], "check_run", "pull_requests"))
    assert message == "check_run.pull_requests[0].number: missing"


def test_a_body_that_is_not_an_object_is_unmapped() -> None:
    assert unmapped(from_webhook, "issues", ["opened"]) == "(payload): must be an object, not an array"


def test_rest_items_name_their_fields_too() -> None:
    item = repo_event("IssuesEvent", "opened")
    message = unmapped(from_repo_event, replaced(item, "42", "payload", "issue", "number"))
    assert message == "payload.issue.number: must be an integer, not a string"
    assert unmapped(from_repo_event, without(item, "repo")) == "repo: missing"
    issue = load("rest/issues.json")[1]
    assert unmapped(from_issue, replaced(issue, "42", "number"), REPOSITORY) == (
        "issue.number: must be an integer, not a string"
    )
    run = load("rest/actions_runs.json")["workflow_runs"][1]
    assert unmapped(from_workflow_run, without(run, "id"), REPOSITORY) == "workflow_run.id: missing"


def test_a_review_request_naming_nobody_is_unmapped() -> None:
    event, payload = webhook("pull_request.review_requested.user")
    message = unmapped(from_webhook, event, without(payload, "requested_reviewer"))
    assert message == "requested_reviewer: missing, and no requested_team"


# ---- bounds --------------------------------------------------------------------------


def test_a_megabyte_body_and_title_stay_small() -> None:
    event, payload = webhook("issues.opened")
    issue = payload["issue"]
    issue["body"] = "b" * 1_000_000
    issue["title"] = "t" * 1_000_000
    issue["user"]["login"] = "u" * 1_000_000
    issue["html_url"] = "https://github.com/" + "p" * 1_000_000
    issue["labels"] = [{"name": "l" * 10_000} for _ in range(1_000)]
    payload["sender"]["type"] = "T" * 1_000_000
    mapped = from_webhook(event, payload)
    assert mapped is not None
    data = mapped.data
    assert data["bodyExcerpt"] == "b" * EXCERPT_CHARS and data["bodyTruncated"] is True
    assert len(data["title"]) == 512 and data["title"].endswith("…")
    assert len(data["author"]) == 256
    assert len(data["url"]) == 2048
    assert len(data["actorType"]) == 256
    assert len(data["labels"]) == 100 and all(len(name) == 256 for name in data["labels"])
    assert_valid(mapped)
    assert len(json.dumps(data)) < 40_000


def test_a_comment_and_a_pull_request_body_are_bounded_too() -> None:
    event, payload = webhook("issue_comment.created.issue")
    payload["comment"]["body"] = "c" * 1_000_000
    payload["issue"]["title"] = "t" * 1_000_000
    comment = from_webhook(event, payload)
    assert comment is not None
    assert len(comment.data["bodyExcerpt"]) == EXCERPT_CHARS and comment.data["bodyTruncated"]
    assert len(comment.data["issueTitle"]) == 512
    event, payload = webhook("pull_request.opened")
    payload["pull_request"]["body"] = "p" * 1_000_000
    payload["pull_request"]["head"]["ref"] = "r" * 1_000_000
    pull = from_webhook(event, payload)
    assert pull is not None
    assert len(pull.data["bodyExcerpt"]) == EXCERPT_CHARS and pull.data["bodyTruncated"]
    assert len(pull.data["headRef"]) == 256


@pytest.mark.parametrize(
    ("body", "excerpt", "truncated"),
    [
        (None, "", False),
        ("", "", False),
        ("x" * EXCERPT_CHARS, "x" * EXCERPT_CHARS, False),
        ("x" * (EXCERPT_CHARS + 1), "x" * EXCERPT_CHARS, True),
        ("\u202e\x1b[31m<script>", "\u202e\x1b[31m<script>", False),  # kept as sent: agentwake sanitizes
    ],
)
def test_the_excerpt_is_the_first_characters_of_the_body(
    body: str | None, excerpt: str, truncated: bool
) -> None:
    event, payload = webhook("issues.opened")
    payload["issue"]["body"] = body
    mapped = from_webhook(event, payload)
    assert mapped is not None
    assert (mapped.data["bodyExcerpt"], mapped.data["bodyTruncated"]) == (excerpt, truncated)


def test_no_raw_json_reaches_the_data() -> None:
    for mapped in every_mapped():
        for value in mapped.data.values():
            assert isinstance(value, str | int | bool | list | type(None)), (mapped.type, value)
            if isinstance(value, list):
                assert all(isinstance(item, str | int) for item in value)


# ---- bots and the subscription filter ------------------------------------------------


@pytest.mark.parametrize(
    ("login", "user_type", "expected"),
    [
        ("dependabot[bot]", "Bot", True),
        ("renovate[bot]", None, True),
        ("my-ci-app", "Bot", True),
        ("octocat", "User", False),
        ("octocat", None, False),
        ("octo-org", "Organization", False),
        ("robot", "User", False),
    ],
)
def test_is_bot(login: str, user_type: str | None, expected: bool) -> None:
    assert is_bot(login, user_type) is expected


def test_matches_a_repository_exactly_in_any_case_or_by_glob() -> None:
    data = mapped_webhook("issues.opened").data
    assert matches({}, data)
    assert matches({"repository": "octo-org/hello-world"}, data)
    assert matches({"repository": "Octo-Org/Hello-World"}, data)
    assert matches({"repository": "octo-org/*"}, data)
    assert matches({"repository": "OCTO-ORG/*"}, data)
    assert matches({"repository": "*/hello-world"}, data)
    assert matches({"repository": "octo-org/hello-*"}, data)
    assert not matches({"repository": "octo-org/hello"}, data)
    assert not matches({"repository": "other-org/*"}, data)
    assert not matches({"repository": "octo-org/hello-world-2"}, data)


def test_matches_a_label_in_any_case() -> None:
    data = mapped_webhook("issues.opened").data  # labels: bug, needs triage
    assert matches({"label": "bug"}, data)
    assert matches({"label": "BUG"}, data)
    assert matches({"label": "Needs Triage"}, data)
    assert not matches({"label": "needs"}, data)
    assert not matches({"label": "enhancement"}, data)
    assert matches({"repository": "octo-org/*", "label": "bug"}, data)
    assert not matches({"repository": "other/*", "label": "bug"}, data)
    assert not matches({"repository": "octo-org/*", "label": "enhancement"}, data)


def test_a_run_has_no_labels_so_a_label_filter_passes_none() -> None:
    data = mapped_webhook("workflow_run.completed.failure").data
    assert matches({"repository": "octo-org/*"}, data)
    assert not matches({"label": "bug"}, data)
    assert matches({"repository": None, "label": None}, data)
