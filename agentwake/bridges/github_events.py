"""GitHub's webhooks and REST API items as the GitHub bridge's MCP events. Pure: no I/O.

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
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from agentwake.bridges import _payload
from agentwake.bridges._payload import boolean_schema, closed_schema, integer_schema, text_schema
from agentwake.clock import iso

EXCERPT_CHARS: Final = 1000
TITLE_CHARS: Final = 512
NAME_CHARS: Final = 256
URL_CHARS: Final = 2048
# GitHub allows 100 labels on an issue; the caps keep a hostile payload's lists small too.
MAX_LABELS: Final = 100
MAX_PULL_REQUESTS: Final = 100
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
}

# The webhook event (X-GitHub-Event) and the actions of it that we emit.
_ACTIONS: Final[dict[str, tuple[str, ...]]] = {
    "issues": ("opened",),
    "issue_comment": ("created",),
    "pull_request": ("opened", "review_requested"),
    "check_run": ("completed",),
    "workflow_run": ("completed",),
}
# The events API names the same payloads differently and has no check or workflow runs.
_REPO_EVENT_TYPES: Final = {
    "IssuesEvent": "issues",
    "IssueCommentEvent": "issue_comment",
    "PullRequestEvent": "pull_request",
}


@dataclass(frozen=True, slots=True)
class Mapped:
    """One MCP event: its type, an id stable across webhook and polling, when it happened, its payload."""

    type: str
    event_id: str
    occurred_at: datetime
    data: dict[str, Any]
    # Where the id holds a time: the id less the time, and how far apart two sightings may be.
    same_prefix: str | None = None
    same_within: timedelta = timedelta(0)


class Unmapped(_payload.Unmapped):
    """A payload of a type we emit with a missing or ill-typed field; the message names the field."""


# ---- payload schemas -----------------------------------------------------------------


def _numbers(description: str) -> dict[str, Any]:
    return {
        "type": "array",
        "items": {"type": "integer"},
        "maxItems": MAX_PULL_REQUESTS,
        "description": description,
    }


def _common() -> dict[str, dict[str, Any]]:
    return {
        "repository": text_schema('The repository, "owner/name".', NAME_CHARS),
        "url": text_schema("The web page of what happened (its html_url).", URL_CHARS),
        "actor": text_schema("The login of who caused the event.", NAME_CHARS),
        "actorType": text_schema(
            'The account type of the actor: "User", "Bot", "Organization"...', NAME_CHARS
        ),
        "occurredAt": {
            "type": "string",
            "format": "date-time",
            "description": "When it happened on GitHub, ISO 8601 in UTC.",
        },
        "labels": {
            "type": "array",
            "items": {"type": "string", "maxLength": NAME_CHARS},
            "maxItems": MAX_LABELS,
            "description": "The label names of the issue or pull request; [] where there are none.",
        },
    }


def _schema(fields: dict[str, dict[str, Any]]) -> dict[str, Any]:
    properties = {**fields, **_common()}
    return closed_schema(properties)


def _author_schema(whose: str) -> dict[str, dict[str, Any]]:
    return {
        "author": text_schema(f"The login of the {whose} author.", NAME_CHARS),
        "authorType": text_schema(f'The account type of the {whose} author: "User", "Bot"...', NAME_CHARS),
    }


def _body_schema(whose: str) -> dict[str, dict[str, Any]]:
    return {
        "bodyExcerpt": text_schema(
            f"The first {EXCERPT_CHARS} characters of the {whose} body, as written; '' when empty.",
            EXCERPT_CHARS,
        ),
        "bodyTruncated": boolean_schema("Whether the body is longer than the excerpt."),
    }


PAYLOAD_SCHEMAS: dict[str, dict[str, Any]] = {
    "issues.opened": _schema(
        {
            "number": integer_schema("The issue number."),
            "title": text_schema("The issue title.", TITLE_CHARS),
            **_author_schema("issue's"),
            **_body_schema("issue's"),
            "state": text_schema('The issue state now: "open" or "closed".', NAME_CHARS),
        }
    ),
    "issue_comment.created": _schema(
        {
            "number": integer_schema("The number of the issue or pull request commented on."),
            "issueTitle": text_schema("The title of the issue or pull request.", TITLE_CHARS),
            "isPullRequest": boolean_schema("Whether the comment is on a pull request."),
            "commentId": integer_schema("The comment's id."),
            **_author_schema("comment's"),
            **_body_schema("comment's"),
            "issueUrl": text_schema("The web page of the issue or pull request.", URL_CHARS),
        }
    ),
    "pull_request.opened": _schema(
        {
            "number": integer_schema("The pull request number."),
            "title": text_schema("The pull request title.", TITLE_CHARS),
            **_author_schema("pull request's"),
            "draft": boolean_schema("Whether the pull request is a draft."),
            "baseRef": text_schema("The branch it would merge into.", NAME_CHARS),
            "headRef": text_schema("The branch it comes from.", NAME_CHARS),
            **_body_schema("pull request's"),
        }
    ),
    "pull_request.review_requested": _schema(
        {
            "number": integer_schema("The pull request number."),
            "title": text_schema("The pull request title.", TITLE_CHARS),
            **_author_schema("pull request's"),
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
            "conclusion": text_schema(
                'How it failed: "failure", "timed_out" or "startup_failure".', NAME_CHARS
            ),
            "headSha": text_schema("The commit checked.", NAME_CHARS),
            "app": text_schema(
                "The slug of the GitHub App that ran the check, or null.", NAME_CHARS, nullable=True
            ),
            "pullRequests": _numbers("The numbers of the pull requests of this repository the check is for."),
        }
    ),
    "workflow_run.completed": _schema(
        {
            "runId": integer_schema("The workflow run's id."),
            "runAttempt": integer_schema("The attempt, 1 for the first run and more for re-runs."),
            "name": text_schema("The workflow's name, or null.", NAME_CHARS, nullable=True),
            "conclusion": text_schema(
                'How it failed: "failure", "timed_out" or "startup_failure".', NAME_CHARS
            ),
            "headBranch": text_schema("The branch the run was for, or null.", NAME_CHARS, nullable=True),
            "headSha": text_schema("The commit the run was for.", NAME_CHARS),
            "trigger": text_schema('The event that started the run: "push", "pull_request"...', NAME_CHARS),
            "pullRequests": _numbers("The numbers of the pull requests the run is for."),
        }
    ),
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


class _Object(_payload.Fields):
    __slots__ = ()
    error = Unmapped


@dataclass(frozen=True, slots=True)
class _Account:
    login: str
    type: str

    @classmethod
    def read(cls, user: _Object) -> _Account:
        login = user.text("login", NAME_CHARS)
        return cls(login, user.optional_text("type", NAME_CHARS) or _type_of_login(login))

    @classmethod
    def of_login(cls, login: str) -> _Account:
        return cls(login, _type_of_login(login))


def is_bot(login: str, user_type: str | None) -> bool:
    """Whether an account is a bot: GitHub says so, or its login is an app's ``name[bot]``."""
    return user_type == "Bot" or login.lower().endswith("[bot]")


def _type_of_login(login: str) -> str:
    # Where GitHub gives no account type (the events API's actor), the login tells apps apart.
    return "Bot" if is_bot(login, None) else "User"


def _author(holder: _Object) -> dict[str, str]:
    author = _Account.read(holder.object("user"))
    return {"author": author.login, "authorType": author.type}


def _excerpt(holder: _Object) -> dict[str, Any]:
    """The body's first EXCERPT_CHARS characters, and whether it had more; no body is ''."""
    body = holder.raw.get("body")
    if body is None:
        body = ""
    if not isinstance(body, str):
        raise Unmapped(f"{holder.name('body')}: must be a string or null, not {_payload.kind(body)}")
    return {"bodyExcerpt": body[:EXCERPT_CHARS], "bodyTruncated": len(body) > EXCERPT_CHARS}


def _labels(holder: _Object) -> list[str]:
    names = []
    for label, path in holder.items("labels", MAX_LABELS):
        if isinstance(label, str):
            names.append(_payload.bounded(label, NAME_CHARS))
        else:
            names.append(_Object.of(label, path).text("name", NAME_CHARS))
    return names


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


def _id_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- one mapper per event type -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where an event happened and who caused it, as its delivery (webhook or REST item) says."""

    repository: str
    actor: _Account

    def event(
        self,
        kind: str,
        event_id: str,
        occurred_at: datetime,
        url: str,
        labels: list[str],
        fields: dict[str, Any],
    ) -> Mapped:
        data = {
            **fields,
            "repository": self.repository,
            "url": url,
            "actor": self.actor.login,
            "actorType": self.actor.type,
            "occurredAt": iso(occurred_at),
            "labels": labels,
        }
        return Mapped(kind, f"{kind}:{event_id}", occurred_at, data)


def _issue_opened(issue: _Object, origin: _Origin) -> Mapped:
    fields = {
        "number": issue.integer("number"),
        "title": issue.text("title", TITLE_CHARS),
        **_author(issue),
        **_excerpt(issue),
        "state": issue.text("state", NAME_CHARS),
    }
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
        "number": issue.integer("number"),
        "issueTitle": issue.text("title", TITLE_CHARS),
        "isPullRequest": _is_pull_request(issue),
        "commentId": comment_id,
        **_author(comment),
        **_excerpt(comment),
        "issueUrl": issue.text("html_url", URL_CHARS),
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
    fields = {
        "number": pull.integer("number"),
        "title": pull.text("title", TITLE_CHARS),
        **_author(pull),
        "draft": pull.boolean("draft"),
        "baseRef": pull.object("base").text("ref", NAME_CHARS),
        "headRef": pull.object("head").text("ref", NAME_CHARS),
        **_excerpt(pull),
    }
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
        "number": pull.integer("number"),
        "title": pull.text("title", TITLE_CHARS),
        **_author(pull),
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
    app = run.optional_object("app")
    fields = {
        "checkRunId": run.integer("id"),
        "name": run.text("name", NAME_CHARS),
        "conclusion": conclusion,
        "headSha": run.text("head_sha", NAME_CHARS),
        "app": app.optional_text("slug", NAME_CHARS) if app is not None else None,
        "pullRequests": _pull_request_numbers(run),
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


# Each takes the object that holds the payload's parts (a webhook body or an events API "payload").
_MAPPERS: Final[dict[str, Callable[[_Object, _Origin], Mapped | None]]] = {
    "issues.opened": _issues_opened,
    "issue_comment.created": _comment_created,
    "pull_request.opened": _pull_request_opened,
    "pull_request.review_requested": _review_requested,
    "check_run.completed": _check_run_completed,
    "workflow_run.completed": _workflow_run_webhook,
}


# ---- the entry points ----------------------------------------------------------------


def from_webhook(event: str, payload: dict[str, Any]) -> Mapped | None:
    """A webhook delivery (``event`` is its X-GitHub-Event header) as an event, or None if we do not emit it."""
    actions = _ACTIONS.get(event)
    if actions is None:
        return None  # ping, and every event we do not emit
    body = _Object.of(payload, "")
    action = body.text("action", NAME_CHARS)
    if action not in actions:
        return None
    repository = body.object("repository").text("full_name", NAME_CHARS)
    origin = _Origin(repository, _Account.read(body.object("sender")))
    return _MAPPERS[f"{event}.{action}"](body, origin)


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
