"""Releases and discussions as the GitHub bridge's MCP events: what a repository publishes and what its
community talks about. Pure: no I/O; ``github_events`` dispatches to the tables here.

    release.published             release.published:<release.id>
    discussion.created            discussion.created:<discussion.id>
    discussion_comment.created    discussion_comment.created:<comment.id>

The events feed (GET /repos/{owner}/{repo}/events) carries a ``ReleaseEvent`` (action
``published``) and, on github.com, a ``DiscussionEvent`` (action ``created``) with the same
objects as the webhooks, so polling finds those two with the webhook's ids. GitHub's REST API
has no feed of discussion comments: ``discussion_comment.created`` comes by webhook only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from agentwake.bridges._payload import boolean_schema, integer_schema, text_schema
from agentwake.bridges.github_payload import (
    NAME_CHARS,
    TITLE_CHARS,
    URL_CHARS,
    Mapped,
    Origin,
    Payload,
    author_of,
    author_schema,
    body_excerpt,
    body_schema,
    event_schema,
    label_names,
)

EVENT_TYPES: Final[dict[str, str]] = {
    "release.published": (
        "A release (or a pre-release) was published. Arrives by webhook and by polling the events feed."
    ),
    "discussion.created": (
        "A discussion was started. Arrives by webhook and, on github.com, by polling the events feed."
    ),
    "discussion_comment.created": (
        "A comment (or a reply) was posted in a discussion. By webhook only: GitHub's REST API has no"
        " feed of discussion comments to poll."
    ),
}

# The webhook event (X-GitHub-Event) and the actions of it that we emit.
ACTIONS: Final[dict[str, tuple[str, ...]]] = {
    "release": ("published",),
    "discussion": ("created",),
    "discussion_comment": ("created",),
}
# The events feed's names of the same payloads.
REPO_EVENT_TYPES: Final[dict[str, str]] = {"ReleaseEvent": "release", "DiscussionEvent": "discussion"}


def _discussion_schema() -> dict[str, dict[str, Any]]:
    return {
        "number": integer_schema("The discussion number."),
        "title": text_schema("The discussion title.", TITLE_CHARS),
        "category": text_schema(
            'The name of the discussion\'s category ("General", "Q&A"...), or null.',
            NAME_CHARS,
            nullable=True,
        ),
    }


PAYLOAD_SCHEMAS: Final[dict[str, dict[str, Any]]] = {
    "release.published": event_schema(
        {
            "releaseId": integer_schema("The release's id."),
            "tag": text_schema("The release's tag.", NAME_CHARS),
            "name": text_schema("The release's name, or null; it may be ''.", TITLE_CHARS, nullable=True),
            "author": text_schema("The login of who created the release.", NAME_CHARS),
            "authorType": text_schema(
                'The account type of the release\'s author: "User", "Bot"...', NAME_CHARS
            ),
            "prerelease": boolean_schema("Whether it is marked a pre-release."),
            "draft": boolean_schema("Whether it is still a draft (false once published)."),
            "targetCommitish": text_schema(
                "The branch or commit the tag was made from, or null.", NAME_CHARS, nullable=True
            ),
            **body_schema("release notes'"),
        }
    ),
    "discussion.created": event_schema(
        {**_discussion_schema(), **author_schema("discussion's"), **body_schema("discussion's")}
    ),
    "discussion_comment.created": event_schema(
        {
            **_discussion_schema(),
            "discussionUrl": text_schema("The web page of the discussion.", URL_CHARS),
            "commentId": integer_schema("The comment's id."),
            "isReply": boolean_schema("Whether the comment replies to another comment of the discussion."),
            **author_schema("comment's"),
            **body_schema("comment's"),
        }
    ),
}


def _release_published(holder: Payload, origin: Origin) -> Mapped:
    release = holder.object("release")
    author = release.object("author")
    # A release created as a draft and published later is dated by its publication.
    when = release.moment("published_at") if release.raw.get("published_at") else release.moment("created_at")
    fields = {
        "releaseId": release.integer("id"),
        "tag": release.text("tag_name", NAME_CHARS),
        "name": release.optional_text("name", TITLE_CHARS),
        "author": author.text("login", NAME_CHARS),
        "authorType": author.optional_text("type", NAME_CHARS) or "User",
        "prerelease": release.boolean("prerelease"),
        "draft": release.boolean("draft"),
        "targetCommitish": release.optional_text("target_commitish", NAME_CHARS),
        **body_excerpt(release),
    }
    return origin.event(
        "release.published",
        str(fields["releaseId"]),
        when,
        release.text("html_url", URL_CHARS),
        [],
        fields,
    )


def _discussion_fields(discussion: Payload) -> dict[str, Any]:
    category = discussion.optional_object("category")
    return {
        "number": discussion.integer("number"),
        "title": discussion.text("title", TITLE_CHARS),
        "category": category.optional_text("name", NAME_CHARS) if category is not None else None,
    }


def _discussion_created(holder: Payload, origin: Origin) -> Mapped:
    discussion = holder.object("discussion")
    fields = {**_discussion_fields(discussion), **author_of(discussion), **body_excerpt(discussion)}
    return origin.event(
        "discussion.created",
        str(discussion.integer("id")),
        discussion.moment("created_at"),
        discussion.text("html_url", URL_CHARS),
        label_names(discussion),
        fields,
    )


def _discussion_comment_created(holder: Payload, origin: Origin) -> Mapped:
    discussion, comment = holder.object("discussion"), holder.object("comment")
    comment_id = comment.integer("id")
    fields = {
        **_discussion_fields(discussion),
        "discussionUrl": discussion.text("html_url", URL_CHARS),
        "commentId": comment_id,
        "isReply": comment.raw.get("parent_id") is not None,
        **author_of(comment),
        **body_excerpt(comment),
    }
    return origin.event(
        "discussion_comment.created",
        str(comment_id),
        comment.moment("created_at"),
        comment.text("html_url", URL_CHARS),
        label_names(discussion),
        fields,
    )


MAPPERS: Final[dict[str, Callable[[Payload, Origin], Mapped | None]]] = {
    "release.published": _release_published,
    "discussion.created": _discussion_created,
    "discussion_comment.created": _discussion_comment_created,
}
