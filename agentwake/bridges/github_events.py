"""GitHub's webhooks and REST API items as the GitHub bridge's MCP events. Pure: no I/O.

Some 950 lines, on purpose: one table of every event type's mapping and JSON Schema, side by side
for both ingresses, so a field is added in one place (split by upstream family if it grows further).

The bridge learns of one upstream occurrence by a webhook delivery or by polling the REST
API (a repository's events feed, its issues list, its workflow runs). Either way maps here
to the same event with the same ``event_id``, so agentwake's dedup (server, event name,
eventId) wakes the agent once, whichever way arrived first:

    issues.opened                   issues.opened:<issue.id>
    issue_comment.created           issue_comment.created:<comment.id>
    pull_request.opened             pull_request.opened:<pull_request.id>
    pull_request.review_requested   pull_request.review_requested:<pull_request.id>:<login | team:slug>:<updated_at>
    check_run.completed             check_run.completed:<check_run.id>
    workflow_run.completed          workflow_run.completed:<run.id>:<run_attempt>

A review request has no id of its own: the pull request's ``updated_at`` at the request
stands in for one (in UTC, to the second). A webhook and the events feed may carry snapshots
of the pull request taken moments apart, so the event also names its change without the time
(``same_prefix``, ``pull_request.review_requested:<pull_request.id>:<login | team:slug>:``) and
``SAME_CHANGE_WITHIN``: the log keeps the first sighting and drops another one of the same
request within that tolerance, whichever ingress was first. Check and workflow runs are
emitted only when they failed.

``data`` is small and typed, never the raw JSON: strings are kept as GitHub sent them
(agentwake sanitizes later) but each one is bounded, a body becomes an excerpt and lists
are capped, so an event stays a few kilobytes whatever a payload holds. A payload of a
type we emit with a missing or ill-typed field raises ``Unmapped`` naming the field, never
its value; everything we do not emit maps to None.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final

from agentwake.bridges import _payload, github_alert_events, github_community_events
from agentwake.bridges._payload import boolean_schema, integer_schema, text_schema
from agentwake.bridges.github_payload import ASSOCIATIONS as ASSOCIATIONS
from agentwake.bridges.github_payload import EXCERPT_CHARS as EXCERPT_CHARS
from agentwake.bridges.github_payload import MAX_LABELS as MAX_LABELS
from agentwake.bridges.github_payload import NAME_CHARS as NAME_CHARS
from agentwake.bridges.github_payload import TITLE_CHARS as TITLE_CHARS
from agentwake.bridges.github_payload import URL_CHARS as URL_CHARS
from agentwake.bridges.github_payload import Account as _Account
from agentwake.bridges.github_payload import Mapped as Mapped
from agentwake.bridges.github_payload import Origin as _Origin
from agentwake.bridges.github_payload import Payload as _Object
from agentwake.bridges.github_payload import Unmapped as Unmapped
from agentwake.bridges.github_payload import author_of as _author
from agentwake.bridges.github_payload import author_schema as _author_schema
from agentwake.bridges.github_payload import body_excerpt as _excerpt
from agentwake.bridges.github_payload import body_schema as _body_schema
from agentwake.bridges.github_payload import event_schema as _schema
from agentwake.bridges.github_payload import id_time as _id_time
from agentwake.bridges.github_payload import is_bot as is_bot
from agentwake.bridges.github_payload import label_names as _labels
from agentwake.bridges.github_payload import nullable_integer as _nullable_integer
from agentwake.clock import iso

MAX_PULL_REQUESTS: Final = 100
# GitHub allows 10 assignees on an issue or pull request.
MAX_ASSIGNEES: Final = 10
MAX_BRANCHES: Final = 10
FAILING_STATUSES: Final = frozenset({"failure", "error"})
FAILING_CONCLUSIONS: Final = frozenset({"failure", "timed_out", "startup_failure"})
# How far apart two sightings of one review request may be dated: a request of the same reviewer on
# the same pull request again within it (removed and asked again) is taken for the same one.
SAME_CHANGE_WITHIN: Final = timedelta(minutes=1)

EVENT_TYPES: dict[str, str] = {
    "issues.opened": "An issue was opened in a repository.",
    "issue_comment.created": "A comment was posted on an issue or a pull request.",
    "pull_request.opened": "A pull request was opened.",
    "pull_request.review_requested": "A review of a pull request was requested from a user or a team.",
    "check_run.completed": "A check run completed with a failing conclusion (failure, timed_out, startup_failure).",
    "workflow_run.completed": (
        "A GitHub Actions workflow run completed with a failing conclusion"
        " (failure, timed_out, startup_failure)."
    ),
    "issues.reopened": "A closed issue was reopened.",
    "issues.closed": "An issue was closed; stateReason says why (completed, not_planned, duplicate).",
    "issues.labeled": "A label was added to an issue.",
    "issues.assigned": "Someone was assigned to an issue.",
    "issues.edited": "An issue's title or body was edited.",
    "issues.transferred": "An issue was moved to another repository.",
    "issue_comment.edited": "A comment on an issue or a pull request was edited.",
    "pull_request.reopened": "A closed pull request was reopened.",
    "pull_request.closed": "A pull request was closed, merged or not (data.merged).",
    "pull_request.synchronize": "New commits were pushed to a pull request's branch.",
    "pull_request.ready_for_review": "A draft pull request was marked ready for review.",
    "pull_request_review.submitted": "A review of a pull request was submitted (approved, changes requested, commented).",
    "pull_request_review_comment.created": "A comment was posted on a pull request's diff.",
    "check_suite.completed": "A check suite completed with a failing conclusion (failure, timed_out, startup_failure).",
    "workflow_job.completed": (
        "A GitHub Actions job completed with a failing conclusion (failure, timed_out, startup_failure)."
    ),
    "status.failed": "A commit status was set to failure or error.",
    **github_community_events.EVENT_TYPES,
    **github_alert_events.EVENT_TYPES,
}

# The webhook event (X-GitHub-Event) and the actions of it that we emit.
_ACTIONS: Final[dict[str, tuple[str, ...]]] = {
    "issues": ("opened", "reopened", "closed", "labeled", "assigned", "edited", "transferred"),
    "issue_comment": ("created", "edited"),
    "pull_request": ("opened", "review_requested", "reopened", "closed", "synchronize", "ready_for_review"),
    "pull_request_review": ("submitted",),
    "pull_request_review_comment": ("created",),
    "check_run": ("completed",),
    "check_suite": ("completed",),
    "workflow_run": ("completed",),
    "workflow_job": ("completed",),
    **github_community_events.ACTIONS,
    **github_alert_events.ACTIONS,
}
# Events of the webhook without an action, and the event type each becomes.
_ACTIONLESS: Final = {"status": "status.failed"}
# The events API names the same payloads differently and has no check or workflow runs.
_REPO_EVENT_TYPES: Final = {
    "IssuesEvent": "issues",
    "IssueCommentEvent": "issue_comment",
    "PullRequestEvent": "pull_request",
    "PullRequestReviewCommentEvent": "pull_request_review_comment",
    **github_community_events.REPO_EVENT_TYPES,
}


# ---- payload schemas -----------------------------------------------------------------


def _numbers(description: str) -> dict[str, Any]:
    return {
        "type": "array",
        "items": {"type": "integer"},
        "maxItems": MAX_PULL_REQUESTS,
        "description": description,
    }


def _triage_schema(what: str) -> dict[str, dict[str, Any]]:
    """Assignees, milestone and state of an issue or pull request."""
    return {
        "state": text_schema(f'The {what} state now: "open" or "closed".', NAME_CHARS),
        "assignees": {
            "type": "array",
            "items": {"type": "string", "maxLength": NAME_CHARS},
            "maxItems": MAX_ASSIGNEES,
            "description": f"The logins assigned to the {what}; [] where there are none.",
        },
        "milestone": text_schema(
            f"The title of the {what}'s milestone, or null.", TITLE_CHARS, nullable=True
        ),
    }


def _issue_schema() -> dict[str, dict[str, Any]]:
    return {
        "number": integer_schema("The issue number."),
        "title": text_schema("The issue title.", TITLE_CHARS),
        **_author_schema("issue's"),
        **_triage_schema("issue"),
    }


def _pull_schema() -> dict[str, dict[str, Any]]:
    return {
        "number": integer_schema("The pull request number."),
        "title": text_schema("The pull request title.", TITLE_CHARS),
        **_author_schema("pull request's"),
        **_triage_schema("pull request"),
        "draft": boolean_schema("Whether the pull request is a draft."),
        "baseRef": text_schema("The branch it would merge into.", NAME_CHARS),
        "baseSha": text_schema(
            "The commit of the base branch it was compared with, or null where the payload does not say.",
            NAME_CHARS,
            nullable=True,
        ),
        "headRef": text_schema("The branch it comes from.", NAME_CHARS),
        "headSha": text_schema(
            "The newest commit of its branch, or null where the payload does not say.",
            NAME_CHARS,
            nullable=True,
        ),
        "headIsFork": boolean_schema(
            "Whether its branch is in another repository (a fork); a deleted fork counts as one."
        ),
        "additions": _nullable_integer("Lines added, or null where the payload does not say."),
        "deletions": _nullable_integer("Lines deleted, or null where the payload does not say."),
        "changedFiles": _nullable_integer("Files changed, or null where the payload does not say."),
    }


def _issue_of_comment_schema() -> dict[str, dict[str, Any]]:
    """What a comment event says of the issue or pull request commented on."""
    return {
        "number": integer_schema("The number of the issue or pull request commented on."),
        "issueTitle": text_schema("The title of the issue or pull request.", TITLE_CHARS),
        "isPullRequest": boolean_schema("Whether the comment is on a pull request."),
        "issueState": text_schema('The issue or pull request state now: "open" or "closed".', NAME_CHARS),
        "issueAuthor": text_schema("The login of the issue or pull request author.", NAME_CHARS),
        "issueAuthorType": text_schema(
            'The account type of the issue or pull request author: "User", "Bot"...', NAME_CHARS
        ),
        "issueAuthorAssociation": text_schema(
            f"The issue or pull request author's relation to the repository ({ASSOCIATIONS}), or null.",
            NAME_CHARS,
            nullable=True,
        ),
        "assignees": {
            "type": "array",
            "items": {"type": "string", "maxLength": NAME_CHARS},
            "maxItems": MAX_ASSIGNEES,
            "description": "The logins assigned to the issue or pull request; [] where there are none.",
        },
        "milestone": text_schema(
            "The title of the issue or pull request's milestone, or null.", TITLE_CHARS, nullable=True
        ),
        "issueUrl": text_schema("The web page of the issue or pull request.", URL_CHARS),
    }


def _comment_schema() -> dict[str, dict[str, Any]]:
    return {
        **_issue_of_comment_schema(),
        "commentId": integer_schema("The comment's id."),
        **_author_schema("comment's"),
        **_body_schema("comment's"),
    }


def _ci_schema() -> dict[str, dict[str, Any]]:
    return {
        "headBranch": text_schema("The branch it ran for, or null.", NAME_CHARS, nullable=True),
        "headSha": text_schema("The commit it ran for.", NAME_CHARS),
    }


_FAILED = 'How it failed: "failure", "timed_out" or "startup_failure".'

PAYLOAD_SCHEMAS: dict[str, dict[str, Any]] = {
    "issues.opened": _schema({**_issue_schema(), **_body_schema("issue's")}),
    "issue_comment.created": _schema(_comment_schema()),
    "pull_request.opened": _schema({**_pull_schema(), **_body_schema("pull request's")}),
    "pull_request.review_requested": _schema(
        {
            **_pull_schema(),
            "requestedReviewer": text_schema(
                "The login asked to review, or null for a team.", NAME_CHARS, nullable=True
            ),
            "requestedTeam": text_schema(
                "The slug of the team asked to review, or null.", NAME_CHARS, nullable=True
            ),
        }
    ),
    "check_run.completed": _schema(
        {
            "checkRunId": integer_schema("The check run's id."),
            "name": text_schema("The check's name.", NAME_CHARS),
            "conclusion": text_schema(_FAILED, NAME_CHARS),
            **_ci_schema(),
            "app": text_schema(
                "The slug of the GitHub App that ran the check, or null.", NAME_CHARS, nullable=True
            ),
            "pullRequests": _numbers("The numbers of the pull requests of this repository the check is for."),
            "outputTitle": text_schema(
                "The title of the check's output, or null.", TITLE_CHARS, nullable=True
            ),
            "outputSummary": text_schema(
                f"The first {EXCERPT_CHARS} characters of the check's output summary, or null.",
                EXCERPT_CHARS,
                nullable=True,
            ),
            "detailsUrl": text_schema(
                "The page of the check on its CI's own site, or null.", URL_CHARS, nullable=True
            ),
        }
    ),
    "workflow_run.completed": _schema(
        {
            "runId": integer_schema("The workflow run's id."),
            "runAttempt": integer_schema("The attempt, 1 for the first run and more for re-runs."),
            "name": text_schema("The workflow's name, or null.", NAME_CHARS, nullable=True),
            "conclusion": text_schema(_FAILED, NAME_CHARS),
            **_ci_schema(),
            "trigger": text_schema('The event that started the run: "push", "pull_request"...', NAME_CHARS),
            "pullRequests": _numbers("The numbers of the pull requests the run is for."),
        }
    ),
    "issues.reopened": _schema(_issue_schema()),
    "issues.closed": _schema(
        {
            **_issue_schema(),
            "stateReason": text_schema(
                'Why it was closed: "completed", "not_planned", "duplicate"..., or null.',
                NAME_CHARS,
                nullable=True,
            ),
        }
    ),
    "issues.labeled": _schema(
        {**_issue_schema(), "label": text_schema("The name of the label added.", NAME_CHARS)}
    ),
    "issues.assigned": _schema(
        {**_issue_schema(), "assignee": text_schema("The login assigned.", NAME_CHARS)}
    ),
    "issues.edited": _schema(
        {
            **_issue_schema(),
            "changed": {
                "type": "array",
                "items": {"type": "string", "maxLength": NAME_CHARS},
                "maxItems": 10,
                "description": 'What was edited: "title", "body"... (never the old text).',
            },
        }
    ),
    "issues.transferred": _schema(
        {
            **_issue_schema(),
            "newRepository": text_schema('The repository it moved to, "owner/name".', NAME_CHARS),
            "newNumber": integer_schema("Its number in that repository."),
        }
    ),
    "issue_comment.edited": _schema(_comment_schema()),
    "pull_request.reopened": _schema(_pull_schema()),
    "pull_request.closed": _schema(
        {**_pull_schema(), "merged": boolean_schema("Whether it was merged (false: closed unmerged).")}
    ),
    "pull_request.synchronize": _schema(
        {
            **_pull_schema(),
            "before": text_schema("The head commit before the push, or null.", NAME_CHARS, nullable=True),
        }
    ),
    "pull_request.ready_for_review": _schema(_pull_schema()),
    "pull_request_review.submitted": _schema(
        {
            **_pull_schema(),
            "reviewId": integer_schema("The review's id."),
            "reviewState": text_schema('"approved", "changes_requested" or "commented".', NAME_CHARS),
            "reviewer": text_schema("The login of the reviewer.", NAME_CHARS),
            "reviewerType": text_schema('The account type of the reviewer: "User", "Bot"...', NAME_CHARS),
            "reviewerAssociation": text_schema(
                f"The reviewer's relation to the repository ({ASSOCIATIONS}), or null.",
                NAME_CHARS,
                nullable=True,
            ),
            "commitId": text_schema("The commit reviewed, or null.", NAME_CHARS, nullable=True),
            **_body_schema("review's"),
        }
    ),
    "pull_request_review_comment.created": _schema(
        {
            "number": integer_schema("The pull request number."),
            "title": text_schema("The pull request title.", TITLE_CHARS),
            "commentId": integer_schema("The comment's id."),
            **_author_schema("comment's"),
            "path": text_schema("The file commented on.", URL_CHARS),
            "line": _nullable_integer("The line commented on, or null."),
            "commitId": text_schema("The commit commented on.", NAME_CHARS),
            **_body_schema("comment's"),
        }
    ),
    "check_suite.completed": _schema(
        {
            "checkSuiteId": integer_schema("The check suite's id."),
            "conclusion": text_schema(_FAILED, NAME_CHARS),
            **_ci_schema(),
            "app": text_schema(
                "The slug of the GitHub App that ran the checks, or null.", NAME_CHARS, nullable=True
            ),
            "pullRequests": _numbers(
                "The numbers of the pull requests of this repository the checks are for."
            ),
        }
    ),
    "workflow_job.completed": _schema(
        {
            "jobId": integer_schema("The job's id."),
            "runId": integer_schema("The id of the workflow run the job is part of."),
            "runAttempt": integer_schema("The attempt, 1 for the first run and more for re-runs."),
            "name": text_schema("The job's name.", NAME_CHARS),
            "workflowName": text_schema("The workflow's name, or null.", NAME_CHARS, nullable=True),
            "conclusion": text_schema(_FAILED, NAME_CHARS),
            **_ci_schema(),
        }
    ),
    "status.failed": _schema(
        {
            "statusId": integer_schema("The status's id."),
            "context": text_schema("The status's name, e.g. 'ci/circleci: test'.", NAME_CHARS),
            "state": text_schema('"failure" or "error".', NAME_CHARS),
            "description": text_schema(
                "The status's short description, or null.", TITLE_CHARS, nullable=True
            ),
            "detailsUrl": text_schema(
                "Its target_url, where the CI says more, or null.", URL_CHARS, nullable=True
            ),
            "headSha": text_schema("The commit the status is on.", NAME_CHARS),
            "branches": {
                "type": "array",
                "items": {"type": "string", "maxLength": NAME_CHARS},
                "maxItems": MAX_BRANCHES,
                "description": "The branches whose head is that commit (at most 10); [] where none.",
            },
        }
    ),
    **github_community_events.PAYLOAD_SCHEMAS,
    **github_alert_events.PAYLOAD_SCHEMAS,
}

ARGUMENTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "repository": {
            "type": "string",
            "minLength": 3,
            "maxLength": NAME_CHARS,
            "pattern": "^[^/]+/[^/]+$",
            "description": 'Only this repository, "owner/name" in any case, or a glob such as "owner/*".',
        },
        "label": {
            "type": "string",
            "minLength": 1,
            "maxLength": NAME_CHARS,
            "description": "Only issues and pull requests with this label (any case).",
        },
    },
    "additionalProperties": False,
}


# ---- reading a payload ---------------------------------------------------------------


def _assignees(holder: _Object) -> list[str]:
    return [assignee.text("login", NAME_CHARS) for assignee in holder.objects("assignees", MAX_ASSIGNEES)]


def _milestone(holder: _Object) -> str | None:
    milestone = holder.optional_object("milestone")
    return milestone.text("title", TITLE_CHARS) if milestone is not None else None


def _triage(holder: _Object) -> dict[str, Any]:
    """The state, assignees and milestone of an issue or pull request."""
    return {
        "state": holder.text("state", NAME_CHARS),
        "assignees": _assignees(holder),
        "milestone": _milestone(holder),
    }


def _issue_fields(issue: _Object) -> dict[str, Any]:
    return {
        "number": issue.integer("number"),
        "title": issue.text("title", TITLE_CHARS),
        **_author(issue),
        **_triage(issue),
    }


def _optional_integer(holder: _Object, key: str) -> int | None:
    return None if holder.raw.get(key) is None else holder.integer(key)


def _pull_fields(pull: _Object) -> dict[str, Any]:
    base, head = pull.object("base"), pull.object("head")
    base_repo, head_repo = base.optional_object("repo"), head.optional_object("repo")
    base_name = base_repo.text("full_name", NAME_CHARS) if base_repo is not None else None
    # A fork that was deleted leaves the head without a repository: still someone else's branch.
    fork = head_repo is None or head_repo.text("full_name", NAME_CHARS) != base_name
    return {
        "number": pull.integer("number"),
        "title": pull.text("title", TITLE_CHARS),
        **_author(pull),
        **_triage(pull),
        "draft": pull.boolean("draft"),
        "baseRef": base.text("ref", NAME_CHARS),
        "baseSha": base.optional_text("sha", NAME_CHARS),
        "headRef": head.text("ref", NAME_CHARS),
        "headSha": head.optional_text("sha", NAME_CHARS),
        "headIsFork": fork,
        "additions": _optional_integer(pull, "additions"),
        "deletions": _optional_integer(pull, "deletions"),
        "changedFiles": _optional_integer(pull, "changed_files"),
    }


def _issue_of_comment(issue: _Object) -> dict[str, Any]:
    return {
        "number": issue.integer("number"),
        "issueTitle": issue.text("title", TITLE_CHARS),
        "isPullRequest": _is_pull_request(issue),
        "issueState": issue.text("state", NAME_CHARS),
        **_author(issue, "issueAuthor"),
        "assignees": _assignees(issue),
        "milestone": _milestone(issue),
        "issueUrl": issue.text("html_url", URL_CHARS),
    }


def _pull_request_numbers(run: _Object) -> list[int]:
    pulls = run.items("pull_requests", MAX_PULL_REQUESTS)
    return [_Object.of(pull, path).integer("number") for pull, path in pulls]


def _is_pull_request(issue: _Object) -> bool:
    # GitHub's issue objects stand for pull requests too, and then carry a "pull_request" object.
    return issue.raw.get("pull_request") is not None


def _failing(run: _Object) -> str | None:
    """A run's conclusion if it is a failure, else None (still running, or did not fail)."""
    conclusion = run.optional_text("conclusion", NAME_CHARS)
    return conclusion if conclusion in FAILING_CONCLUSIONS else None


# ---- one mapper per event type -------------------------------------------------------


def _issue_opened(issue: _Object, origin: _Origin) -> Mapped:
    fields = {**_issue_fields(issue), **_excerpt(issue)}
    return origin.event(
        "issues.opened",
        str(issue.integer("id")),
        issue.moment("created_at"),
        issue.text("html_url", URL_CHARS),
        _labels(issue),
        fields,
    )


def _issues_opened(holder: _Object, origin: _Origin) -> Mapped:
    return _issue_opened(holder.object("issue"), origin)


def _comment_created(holder: _Object, origin: _Origin) -> Mapped:
    issue, comment = holder.object("issue"), holder.object("comment")
    comment_id = comment.integer("id")
    fields = {
        **_issue_of_comment(issue),
        "commentId": comment_id,
        **_author(comment),
        **_excerpt(comment),
    }
    return origin.event(
        "issue_comment.created",
        str(comment_id),
        comment.moment("created_at"),
        comment.text("html_url", URL_CHARS),
        _labels(issue),
        fields,
    )


def _pull_request_opened(holder: _Object, origin: _Origin) -> Mapped:
    pull = holder.object("pull_request")
    fields = {**_pull_fields(pull), **_excerpt(pull)}
    return origin.event(
        "pull_request.opened",
        str(pull.integer("id")),
        pull.moment("created_at"),
        pull.text("html_url", URL_CHARS),
        _labels(pull),
        fields,
    )


def _review_requested(holder: _Object, origin: _Origin) -> Mapped:
    pull = holder.object("pull_request")
    reviewer, team = holder.optional_object("requested_reviewer"), holder.optional_object("requested_team")
    login = reviewer.text("login", NAME_CHARS) if reviewer is not None else None
    slug = team.text("slug", NAME_CHARS) if team is not None and login is None else None
    if login is None and slug is None:
        raise Unmapped(
            f"{holder.name('requested_reviewer')}: missing, and no {holder.name('requested_team')}"
        )
    fields = {
        **_pull_fields(pull),
        "requestedReviewer": login,
        "requestedTeam": slug,
    }
    updated_at = pull.moment("updated_at")
    change = f"{pull.integer('id')}:{login or f'team:{slug}'}:"
    mapped = origin.event(
        "pull_request.review_requested",
        f"{change}{_id_time(updated_at)}",
        updated_at,
        pull.text("html_url", URL_CHARS),
        _labels(pull),
        fields,
    )
    return dataclasses.replace(
        mapped, same_prefix=f"pull_request.review_requested:{change}", same_within=SAME_CHANGE_WITHIN
    )


def _check_run_completed(holder: _Object, origin: _Origin) -> Mapped | None:
    run = holder.object("check_run")
    conclusion = _failing(run)
    if conclusion is None:
        return None
    app, suite, output = (
        run.optional_object("app"),
        run.optional_object("check_suite"),
        run.optional_object("output"),
    )
    summary = output.optional_text("summary", EXCERPT_CHARS) if output is not None else None
    fields = {
        "checkRunId": run.integer("id"),
        "name": run.text("name", NAME_CHARS),
        "conclusion": conclusion,
        "headBranch": suite.optional_text("head_branch", NAME_CHARS) if suite is not None else None,
        "headSha": run.text("head_sha", NAME_CHARS),
        "app": app.optional_text("slug", NAME_CHARS) if app is not None else None,
        "pullRequests": _pull_request_numbers(run),
        "outputTitle": output.optional_text("title", TITLE_CHARS) if output is not None else None,
        "outputSummary": summary,
        "detailsUrl": run.optional_text("details_url", URL_CHARS),
    }
    return origin.event(
        "check_run.completed",
        str(fields["checkRunId"]),
        run.moment("completed_at"),
        run.text("html_url", URL_CHARS),
        [],
        fields,
    )


def _workflow_run_completed(run: _Object, origin: _Origin) -> Mapped | None:
    conclusion = _failing(run)
    if conclusion is None:
        return None
    fields = {
        "runId": run.integer("id"),
        "runAttempt": run.integer("run_attempt"),
        "name": run.optional_text("name", NAME_CHARS),
        "conclusion": conclusion,
        "headBranch": run.optional_text("head_branch", NAME_CHARS),
        "headSha": run.text("head_sha", NAME_CHARS),
        "trigger": run.text("event", NAME_CHARS),
        "pullRequests": _pull_request_numbers(run),
    }
    return origin.event(
        "workflow_run.completed",
        f"{fields['runId']}:{fields['runAttempt']}",
        run.moment("updated_at"),
        run.text("html_url", URL_CHARS),
        [],
        fields,
    )


def _workflow_run_webhook(holder: _Object, origin: _Origin) -> Mapped | None:
    return _workflow_run_completed(holder.object("workflow_run"), origin)


def _changed(
    kind: str, holder: _Object, origin: _Origin, item: _Object, change: str, fields: dict[str, Any]
) -> Mapped:
    """An event of a change to an issue or pull request (``item``) that has no id of its own: the id is
    the item's id, ``change`` and its ``updated_at``, matched within SAME_CHANGE_WITHIN."""
    updated_at = item.moment("updated_at")
    key = f"{item.integer('id')}:{change}:"
    mapped = origin.event(
        kind,
        f"{key}{_id_time(updated_at)}",
        updated_at,
        item.text("html_url", URL_CHARS),
        _labels(item),
        fields,
    )
    return dataclasses.replace(mapped, same_prefix=f"{kind}:{key}", same_within=SAME_CHANGE_WITHIN)


def _issue_change(action: str) -> Callable[[_Object, _Origin], Mapped]:
    def mapper(holder: _Object, origin: _Origin) -> Mapped:
        issue = holder.object("issue")
        fields, change = _issue_fields(issue), ""
        if action == "closed":
            fields["stateReason"] = issue.optional_text("state_reason", NAME_CHARS)
        elif action == "labeled":
            fields["label"] = change = holder.object("label").text("name", NAME_CHARS)
        elif action == "assigned":
            fields["assignee"] = change = holder.object("assignee").text("login", NAME_CHARS)
        elif action == "edited":
            changes = holder.optional_object("changes")
            fields["changed"] = sorted(str(key)[:NAME_CHARS] for key in changes.raw)[:10] if changes else []
        elif action == "transferred":
            changes = holder.object("changes")
            fields["newRepository"] = changes.object("new_repository").text("full_name", NAME_CHARS)
            fields["newNumber"] = changes.object("new_issue").integer("number")
        return _changed(f"issues.{action}", holder, origin, issue, change, fields)

    return mapper


def _comment_edited(holder: _Object, origin: _Origin) -> Mapped:
    created = _comment_created(holder, origin)
    comment = holder.object("comment")
    updated_at = comment.moment("updated_at")
    kind, key = "issue_comment.edited", f"{comment.integer('id')}:"
    return dataclasses.replace(
        created,
        type=kind,
        event_id=f"{kind}:{key}{_id_time(updated_at)}",
        occurred_at=updated_at,
        data={**created.data, "occurredAt": iso(updated_at)},
        same_prefix=f"{kind}:{key}",
        same_within=SAME_CHANGE_WITHIN,
    )


def _pull_change(action: str) -> Callable[[_Object, _Origin], Mapped]:
    def mapper(holder: _Object, origin: _Origin) -> Mapped:
        pull = holder.object("pull_request")
        fields = _pull_fields(pull)
        kind = f"pull_request.{action}"
        if action == "synchronize":
            # The new head commit names the push: no time needed.
            after = holder.optional_text("after", NAME_CHARS) or fields["headSha"]
            fields["before"] = holder.optional_text("before", NAME_CHARS)
            return origin.event(
                kind,
                f"{pull.integer('id')}:{after}",
                pull.moment("updated_at"),
                pull.text("html_url", URL_CHARS),
                _labels(pull),
                fields,
            )
        if action == "closed":
            merged = pull.raw.get("merged")
            fields["merged"] = merged if isinstance(merged, bool) else pull.raw.get("merged_at") is not None
        return _changed(kind, holder, origin, pull, "", fields)

    return mapper


def _review_submitted(holder: _Object, origin: _Origin) -> Mapped:
    pull, review = holder.object("pull_request"), holder.object("review")
    review_id = review.integer("id")
    fields = {
        **_pull_fields(pull),
        "reviewId": review_id,
        "reviewState": review.text("state", NAME_CHARS).lower(),
        **_author(review, "reviewer"),
        "commitId": review.optional_text("commit_id", NAME_CHARS),
        **_excerpt(review),
    }
    return origin.event(
        "pull_request_review.submitted",
        str(review_id),
        review.moment("submitted_at"),
        review.text("html_url", URL_CHARS),
        _labels(pull),
        fields,
    )


def _review_comment_created(holder: _Object, origin: _Origin) -> Mapped:
    pull, comment = holder.object("pull_request"), holder.object("comment")
    comment_id = comment.integer("id")
    line = comment.raw.get("line")
    fields = {
        "number": pull.integer("number"),
        "title": pull.text("title", TITLE_CHARS),
        "commentId": comment_id,
        **_author(comment),
        "path": comment.text("path", URL_CHARS),
        "line": line if isinstance(line, int) and not isinstance(line, bool) else None,
        "commitId": comment.text("commit_id", NAME_CHARS),
        **_excerpt(comment),
    }
    return origin.event(
        "pull_request_review_comment.created",
        str(comment_id),
        comment.moment("created_at"),
        comment.text("html_url", URL_CHARS),
        _labels(pull),
        fields,
    )


def _check_suite_completed(holder: _Object, origin: _Origin) -> Mapped | None:
    suite = holder.object("check_suite")
    conclusion = _failing(suite)
    if conclusion is None:
        return None
    app = suite.optional_object("app")
    head_sha = suite.text("head_sha", NAME_CHARS)
    fields = {
        "checkSuiteId": suite.integer("id"),
        "conclusion": conclusion,
        "headBranch": suite.optional_text("head_branch", NAME_CHARS),
        "headSha": head_sha,
        "app": app.optional_text("slug", NAME_CHARS) if app is not None else None,
        "pullRequests": _pull_request_numbers(suite),
    }
    # A suite has no web page of its own: its commit's checks page.
    page = holder.object("repository").text("html_url", URL_CHARS)
    updated_at = suite.moment("updated_at")
    return origin.event(
        "check_suite.completed",
        f"{fields['checkSuiteId']}:{_id_time(updated_at)}",
        updated_at,
        _payload.bounded(f"{page}/commit/{head_sha}/checks", URL_CHARS),
        [],
        fields,
    )


def _workflow_job_completed(holder: _Object, origin: _Origin) -> Mapped | None:
    job = holder.object("workflow_job")
    conclusion = _failing(job)
    if conclusion is None:
        return None
    fields = {
        "jobId": job.integer("id"),
        "runId": job.integer("run_id"),
        "runAttempt": job.integer("run_attempt"),
        "name": job.text("name", NAME_CHARS),
        "workflowName": job.optional_text("workflow_name", NAME_CHARS),
        "conclusion": conclusion,
        "headBranch": job.optional_text("head_branch", NAME_CHARS),
        "headSha": job.text("head_sha", NAME_CHARS),
    }
    return origin.event(
        "workflow_job.completed",
        f"{fields['jobId']}:{fields['runAttempt']}",
        job.moment("completed_at"),
        job.text("html_url", URL_CHARS),
        [],
        fields,
    )


def _status_failed(body: _Object, origin: _Origin) -> Mapped | None:
    state = body.text("state", NAME_CHARS)
    if state not in FAILING_STATUSES:
        return None
    sha = body.text("sha", NAME_CHARS)
    target = body.optional_text("target_url", URL_CHARS)
    commit = body.optional_object("commit")
    page = commit.optional_text("html_url", URL_CHARS) if commit is not None else None
    fields = {
        "statusId": body.integer("id"),
        "context": body.text("context", NAME_CHARS),
        "state": state,
        "description": body.optional_text("description", TITLE_CHARS),
        "detailsUrl": target,
        "headSha": sha,
        "branches": [branch.text("name", NAME_CHARS) for branch in body.objects("branches", MAX_BRANCHES)],
    }
    return origin.event(
        "status.failed",
        str(fields["statusId"]),
        body.moment("updated_at"),
        target or page or body.object("repository").text("html_url", URL_CHARS),
        [],
        fields,
    )


# Each takes the object that holds the payload's parts (a webhook body or an events API "payload").
_MAPPERS: Final[dict[str, Callable[[_Object, _Origin], Mapped | None]]] = {
    "issues.opened": _issues_opened,
    "issue_comment.created": _comment_created,
    "pull_request.opened": _pull_request_opened,
    "pull_request.review_requested": _review_requested,
    "check_run.completed": _check_run_completed,
    "workflow_run.completed": _workflow_run_webhook,
    **{f"issues.{action}": _issue_change(action) for action in _ACTIONS["issues"] if action != "opened"},
    "issue_comment.edited": _comment_edited,
    **{
        f"pull_request.{action}": _pull_change(action)
        for action in ("reopened", "closed", "synchronize", "ready_for_review")
    },
    "pull_request_review.submitted": _review_submitted,
    "pull_request_review_comment.created": _review_comment_created,
    "check_suite.completed": _check_suite_completed,
    "workflow_job.completed": _workflow_job_completed,
    "status.failed": _status_failed,
    **github_community_events.MAPPERS,
    **github_alert_events.MAPPERS,
}


# ---- the entry points ----------------------------------------------------------------


def from_webhook(event: str, payload: dict[str, Any]) -> Mapped | None:
    """A webhook delivery (``event`` is its X-GitHub-Event header) as an event, or None if we do not emit it."""
    actions = _ACTIONS.get(event)
    kind = _ACTIONLESS.get(event)
    if actions is None and kind is None:
        return None  # ping, and every event we do not emit
    body = _Object.of(payload, "")
    if kind is None:
        action = body.text("action", NAME_CHARS)
        if actions is None or action not in actions:
            return None
        kind = f"{event}.{action}"
    repository = body.object("repository").text("full_name", NAME_CHARS)
    origin = _Origin(repository, _Account.read(body.object("sender")))
    return _MAPPERS[kind](body, origin)


def from_repo_event(item: dict[str, Any]) -> Mapped | None:
    """One item of GET /repos/{owner}/{repo}/events as an event, or None if we do not emit it."""
    root = _Object.of(item, "")
    event = _REPO_EVENT_TYPES.get(root.text("type", NAME_CHARS))
    if event is None:
        return None
    payload = root.object("payload")
    action = payload.text("action", NAME_CHARS)
    if action not in _ACTIONS[event]:
        return None
    repository = root.object("repo").text("name", NAME_CHARS)
    origin = _Origin(repository, _Account.of_login(root.object("actor").text("login", NAME_CHARS)))
    return _MAPPERS[f"{event}.{action}"](payload, origin)


def from_issue(item: dict[str, Any], repository: str) -> Mapped | None:
    """One item of GET /repos/{owner}/{repo}/issues as issues.opened; None for a pull request."""
    issue = _Object.of(item, "issue")
    if _is_pull_request(issue):
        return None
    author = _Account.read(issue.object("user"))
    return _issue_opened(issue, _Origin(_payload.bounded(repository, NAME_CHARS), author))


def from_workflow_run(run: dict[str, Any], repository: str) -> Mapped | None:
    """One item of GET /repos/{owner}/{repo}/actions/runs as workflow_run.completed if it failed, else None."""
    fields = _Object.of(run, "workflow_run")
    if _failing(fields) is None:
        return None
    user = fields.optional_object("triggering_actor") or fields.object("actor")
    return _workflow_run_completed(
        fields, _Origin(_payload.bounded(repository, NAME_CHARS), _Account.read(user))
    )


# ---- the subscription filter ---------------------------------------------------------


def matches(arguments: dict[str, Any], data: dict[str, Any]) -> bool:
    """Whether an event's data passes a subscription's arguments; an absent argument lets all through."""
    repository = arguments.get("repository")
    if repository is not None and not _repository_matches(repository, data.get("repository")):
        return False
    label = arguments.get("label")
    return label is None or _has_label(label, data.get("labels"))


def _repository_matches(pattern: Any, repository: Any) -> bool:
    if not isinstance(pattern, str) or not isinstance(repository, str):
        return False
    # GitHub names are case-insensitive; fnmatch's translation avoids catastrophic backtracking.
    return fnmatch.fnmatchcase(repository.casefold(), pattern.casefold())


def _has_label(label: Any, labels: Any) -> bool:
    if not isinstance(label, str) or not isinstance(labels, list):
        return False
    wanted = label.casefold()
    return any(isinstance(name, str) and name.casefold() == wanted for name in labels)
