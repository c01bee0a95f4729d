"""What the GitHub bridge's event mappings share: the bounds, the ``Mapped`` event, reading a payload
field by field, and the parts of every payload schema (the repository, the actor, an author, a body).

``github_events`` maps issues, pull requests and CI; ``github_community_events`` releases and
discussions; ``github_alert_events`` security alerts. Each builds on this module only, and
``github_events`` gathers their tables into one. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from agentwake.bridges import _payload
from agentwake.bridges._payload import boolean_schema, closed_schema, text_schema
from agentwake.clock import iso

EXCERPT_CHARS: Final = 1000
TITLE_CHARS: Final = 512
NAME_CHARS: Final = 256
URL_CHARS: Final = 2048
# GitHub allows 100 labels on an issue; the caps keep a hostile payload's lists small too.
MAX_LABELS: Final = 100


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


def common_schema() -> dict[str, dict[str, Any]]:
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


def event_schema(fields: dict[str, dict[str, Any]]) -> dict[str, Any]:
    properties = {**fields, **common_schema()}
    return closed_schema(properties)


ASSOCIATIONS: Final = (
    "OWNER, MEMBER, COLLABORATOR, CONTRIBUTOR, FIRST_TIME_CONTRIBUTOR, FIRST_TIMER, MANNEQUIN or NONE"
)


def nullable_integer(description: str) -> dict[str, Any]:
    return {"type": ["integer", "null"], "description": description}


def author_schema(whose: str) -> dict[str, dict[str, Any]]:
    return {
        "author": text_schema(f"The login of the {whose} author.", NAME_CHARS),
        "authorType": text_schema(f'The account type of the {whose} author: "User", "Bot"...', NAME_CHARS),
        "authorAssociation": text_schema(
            f"The {whose} author's relation to the repository ({ASSOCIATIONS}), as GitHub says"
            " (author_association); null where GitHub did not say.",
            NAME_CHARS,
            nullable=True,
        ),
    }


def body_schema(whose: str) -> dict[str, dict[str, Any]]:
    return {
        "bodyExcerpt": text_schema(
            f"The first {EXCERPT_CHARS} characters of the {whose} body, as written; '' when empty.",
            EXCERPT_CHARS,
        ),
        "bodyTruncated": boolean_schema("Whether the body is longer than the excerpt."),
    }


class Payload(_payload.Fields):
    __slots__ = ()
    error = Unmapped


@dataclass(frozen=True, slots=True)
class Account:
    login: str
    type: str

    @classmethod
    def read(cls, user: Payload) -> Account:
        login = user.text("login", NAME_CHARS)
        return cls(login, user.optional_text("type", NAME_CHARS) or _type_of_login(login))

    @classmethod
    def of_login(cls, login: str) -> Account:
        return cls(login, _type_of_login(login))


def is_bot(login: str, user_type: str | None) -> bool:
    """Whether an account is a bot: GitHub says so, or its login is an app's ``name[bot]``."""
    return user_type == "Bot" or login.lower().endswith("[bot]")


def _type_of_login(login: str) -> str:
    # Where GitHub gives no account type (the events API's actor), the login tells apps apart.
    return "Bot" if is_bot(login, None) else "User"


def author_of(holder: Payload, prefix: str = "author") -> dict[str, str | None]:
    """Who wrote ``holder`` (its ``user``), their account type and their relation to the repository."""
    author = Account.read(holder.object("user"))
    return {
        prefix: author.login,
        f"{prefix}Type": author.type,
        f"{prefix}Association": holder.optional_text("author_association", NAME_CHARS),
    }


def body_excerpt(holder: Payload) -> dict[str, Any]:
    """The body's first EXCERPT_CHARS characters, and whether it had more; no body is ''."""
    body = holder.raw.get("body")
    if body is None:
        body = ""
    if not isinstance(body, str):
        raise Unmapped(f"{holder.name('body')}: must be a string or null, not {_payload.kind(body)}")
    return {"bodyExcerpt": body[:EXCERPT_CHARS], "bodyTruncated": len(body) > EXCERPT_CHARS}


def label_names(holder: Payload) -> list[str]:
    names = []
    for label, path in holder.items("labels", MAX_LABELS):
        if isinstance(label, str):
            names.append(_payload.bounded(label, NAME_CHARS))
        else:
            names.append(Payload.of(label, path).text("name", NAME_CHARS))
    return names


def id_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an event happened and who caused it, as its delivery (webhook or REST item) says."""

    repository: str
    actor: Account

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
