"""A rule's ``args``: tool arguments pinned to the event or checked, enforced when the agent calls.

The unit half checks ``agentwake.authority`` directly. The run half drives the real runner (the demo
server over stdio, litellm over loopback to the scripted, obedient fake LLM) with a policy rule whose
``args`` pin the ticket: every call on another ticket is refused, recorded and never sent.
"""

from __future__ import annotations

import sqlite3
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _rig import Rig
from fake_llm import Reply, text, tool_calls

from agentwake import metrics
from agentwake.authority import Authority, Constraint, parse_args, payload_can_have, render
from agentwake.clock import utc_now
from agentwake.decide import decide
from agentwake.errors import PolicyError
from agentwake.policy import Policy, load_file

VIEW = {
    "server": "github",
    "subscription": "issues",
    "name": "issues.opened",
    "event_id": "e-1",
    "data": {"repository": "acme/demo", "number": 42, "labels": ["bug"], "pullRequests": [7, 9]},
}


def bound(args: dict[str, Any], *, allow_mentions: bool = False) -> Authority:
    return Authority.bind(args, VIEW, allow_mentions=allow_mentions, rule="r")


# ---- templates and pins -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ data.repository }}", "acme/demo"),
        ("{{data.number}}", 42),  # one template alone keeps the field's type
        ("{{ data.repository }}#{{ data.number }}", "acme/demo#42"),
        ("{{ data.pullRequests.1 }}", 9),
        ("{{ server }}", "github"),
        ("plain", "plain"),
        (7, 7),
    ],
)
def test_a_template_is_filled_from_the_stored_event(template: Any, expected: Any) -> None:
    assert render(template, VIEW) == (expected, None)


def test_a_template_naming_a_missing_field_cannot_be_bound() -> None:
    _, problem = render("{{ data.nope }}", VIEW)
    assert problem == "the event has no data.nope"
    authority = bound({"github__comment": {"number": "{{ data.nope }}"}})
    _, refused = authority.check("github__comment", None, {"number": 42})
    assert refused is not None and "data.nope" in refused


def test_a_pinned_argument_refuses_another_value_and_fills_in_a_missing_one() -> None:
    authority = bound(
        {"github__comment": {"repository": "{{ data.repository }}", "number": "{{ data.number }}"}}
    )
    sent, refused = authority.check("github__comment", None, {"body": "hi"})
    assert refused is None
    assert sent == {"body": "hi", "repository": "acme/demo", "number": 42}
    assert (
        authority.check("github__comment", None, {"repository": "acme/demo", "number": 42.0, "body": "x"})[1]
        is None
    )
    _, refused = authority.check(
        "github__comment", None, {"repository": "acme/secret", "number": 1, "body": "x"}
    )
    assert refused == 'argument \'repository\' must be "acme/demo", not "acme/secret"'
    _, refused = authority.check("github__comment", None, {"repository": "acme/demo", "number": "42"})
    assert refused == "argument 'number' must be 42, not \"42\""


@pytest.mark.parametrize(
    ("constraint", "good", "bad", "says"),
    [
        ({"in": ["C0123ABCD"]}, "C0123ABCD", "C0SECRET01", "must be one of"),
        ({"in": "{{ data.pullRequests }}"}, 9, 8, "must be one of [7, 9]"),
        ({"glob": "acme/*"}, "acme/web", "evil/web", "glob"),
        ({"regex": "[a-z]+"}, "abc", "abc1", "regex"),  # the whole value must match
        ({"max_length": 5}, "12345", "123456", "at most 5"),
        ({"subset_of": ["bug", "question"]}, ["bug"], ["bug", "wontfix"], '["wontfix"]'),
        ({"range": {"min": 1, "max": 2}}, 2, 3, "outside"),
        ({"range": {"min": 1}}, 1, True, "must be a number"),
        ({"value": {"a": [1]}}, {"a": [1]}, {"a": [2]}, "must be"),
    ],
)
def test_each_check_lets_through_what_holds_and_refuses_what_does_not(
    constraint: dict[str, Any], good: Any, bad: Any, says: str
) -> None:
    authority = bound({"s__t": {"x": constraint}})
    assert authority.check("s__t", None, {"x": good})[1] is None
    refused = authority.check("s__t", None, {"x": bad})[1]
    assert refused is not None and says in refused, refused


def test_a_checked_argument_must_be_given() -> None:
    refused = bound({"s__t": {"x": {"max_length": 3}}}).check("s__t", None, {})[1]
    assert refused is not None and "must be given" in refused


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"comment": {"x": 1}}, "'<server>__<tool>'"),
        ({"s__t": "x"}, "must be a table"),
        ({"s__t": {"x": {"bogus": 1}}}, "unknown check 'bogus'"),
        ({"s__t": {"x": {}}}, "empty table"),
        ({"s__t": {"x": {"in": []}}}, "non-empty list"),
        ({"s__t": {"x": {"in": "{{ data.a }} and {{ data.b }}"}}}, "one template"),
        ({"s__t": {"x": {"regex": "("}}}, "bad regex"),
        ({"s__t": {"x": {"max_length": -1}}}, "whole number"),
        ({"s__t": {"x": {"range": {"min": 3, "max": 1}}}}, "above max"),
        ({"s__t": {"x": {"value": 1, "in": [1]}}}, "no other check"),
        ({"s__t": {"x": "{{ payload.id }}"}}, "must name a field of the event"),
        ({"s__t": {"x": "{{ data..id }}"}}, "must name a field of the event"),
    ],
)
def test_a_malformed_constraint_is_refused_with_its_tool_and_argument(
    args: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_args(args)


# ---- what the model is shown ----------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "channel": {"type": "string", "description": "Where."},
        "text": {"type": "string"},
        "labels": {"type": "array", "items": {"type": "string"}},
        "allow_mentions": {"type": "boolean", "default": False},
    },
    "required": ["text"],
}


def test_the_schema_shows_pins_as_const_and_in_as_enum() -> None:
    authority = bound(
        {
            "slack__post": {
                "channel": {"in": ["C1", "C2"]},
                "text": {"max_length": 10},
                "labels": {"subset_of": ["a"]},
            }
        }
    )
    shown = authority.schema("slack__post", SCHEMA)
    properties = shown["properties"]
    assert properties["channel"]["enum"] == ["C1", "C2"] and properties["channel"]["description"] == "Where."
    assert properties["text"]["maxLength"] == 10
    assert properties["labels"]["items"]["enum"] == ["a"]
    assert properties["allow_mentions"]["const"] is False  # the rule does not allow mentions
    assert set(shown["required"]) == {"text", "channel", "labels", "allow_mentions"}
    assert SCHEMA["properties"]["channel"] == {
        "type": "string",
        "description": "Where.",
    }  # not changed in place
    pinned = bound({"slack__post": {"channel": "C1"}}).schema("slack__post", SCHEMA)["properties"]["channel"]
    assert pinned["const"] == "C1" and pinned["enum"] == ["C1"]


def test_mentions_are_pinned_off_unless_the_rule_allows_them() -> None:
    strict = bound({})
    sent, refused = strict.check("slack__post", SCHEMA, {"text": "hi"})
    assert refused is None and sent["allow_mentions"] is False
    refused = strict.check("slack__post", SCHEMA, {"text": "<!channel>", "allow_mentions": True})[1]
    assert refused is not None and "allow_mentions" in refused
    # Even a rule's own args cannot turn them on: only allow_mentions = true does.
    assert bound({"slack__post": {"allow_mentions": True}}).check(
        "slack__post", SCHEMA, {"allow_mentions": True}
    )[1]
    loose = bound({}, allow_mentions=True)
    assert loose.check("slack__post", SCHEMA, {"text": "<!channel>", "allow_mentions": True}) == (
        {"text": "<!channel>", "allow_mentions": True},
        None,
    )
    # A tool without the switch is not touched.
    assert strict.check("demo__x", {"properties": {"a": {}}}, {"a": 1}) == ({"a": 1}, None)


def test_describe_says_what_each_tool_may_be_called_with() -> None:
    authority = bound(
        {"github__comment": {"repository": "{{ data.repository }}", "number": "{{ data.number }}"}}
    )
    lines = authority.describe(["github__get_issue", "github__comment"])
    assert lines[0] == "github__get_issue: any arguments"
    assert lines[1] == (
        'github__comment: repository = "acme/demo" (from {{ data.repository }}); number = 42 (from {{ data.number }})'
    )
    assert "escaped" in lines[-1]


@pytest.mark.parametrize(
    ("path", "can"),
    [
        (["repository"], True),
        (["repo"], False),
        (["labels", "0"], True),
        (["labels", "name"], False),
        (["extra", "deep"], True),
    ],
)
def test_payload_can_have_reads_the_event_types_schema(path: list[str], can: bool) -> None:
    schema = {
        "type": "object",
        "properties": {
            "repository": {"type": "string"},
            "labels": {"type": "array", "items": {"type": "string"}},
            "extra": {"type": "object"},
        },
        "additionalProperties": False,
    }
    assert payload_can_have(schema, path) is can
    assert payload_can_have({"type": "object"}, path)  # a schema that lists nothing may have anything


def test_constraint_parse_keeps_literals_as_pins() -> None:
    assert Constraint.parse("channel", "C0123").pinned
    assert not Constraint.parse("channel", {"in": ["C0123"]}).pinned


# ---- in policy files ------------------------------------------------------------------------------


def policy_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "rules.toml"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def test_a_bad_args_table_is_a_policy_error_with_file_and_line(tmp_path: Path) -> None:
    path = policy_file(
        tmp_path,
        """
        [[rules]]
        name = "ok"
        action = "log"

        [[rules]]
        name = "bad"
        action = "agent"
        tools = ["github__comment"]
        args."github__comment" = { number = { between = [1, 2] } }
        """,
    )
    with pytest.raises(PolicyError) as caught:
        load_file(path)
    assert f"{path}:6: rule 'bad': args: " in str(caught.value)
    assert "unknown check 'between'" in str(caught.value)


def test_args_for_a_tool_the_rule_does_not_allow_is_an_error(tmp_path: Path) -> None:
    path = policy_file(
        tmp_path,
        """
        [[rules]]
        name = "stray"
        action = "agent"
        tools = ["github__get_issue"]
        args."github__comment" = { number = 1 }
        """,
    )
    with pytest.raises(PolicyError, match="args names 'github__comment', which 'tools' does not allow"):
        load_file(path)


def test_args_on_a_rule_that_runs_no_agent_is_an_error(tmp_path: Path) -> None:
    path = policy_file(
        tmp_path,
        """
        [[rules]]
        name = "quiet"
        action = "log"
        args."github__comment" = { number = 1 }
        """,
    )
    with pytest.raises(PolicyError, match="only apply to action 'agent' or 'approve'"):
        load_file(path)


# ---- enforced in a real run ------------------------------------------------------------------------

PINNED = """
[[rules]]
name = "comment-on-its-ticket"
action = "agent"
tools = ["demo__get_ticket", "demo__add_comment", "demo__close_ticket"]
args."demo__add_comment" = { ticket_id = "{{ data.ticketId }}", body = { max_length = 40 } }
args."demo__close_ticket" = { ticket_id = { in = ["T-none"] } }
"""


def other_ticket(rig: Rig) -> str:
    """A second ticket on the demo server: the object an injected instruction aims at."""
    other = {**rig.ticket, "id": "T-999999", "seq": 999999}
    columns = ", ".join(other)
    with sqlite3.connect(rig.demo_db) as db:
        db.execute(
            f"INSERT INTO tickets ({columns}) VALUES ({', '.join('?' * len(other))})", list(other.values())
        )
    return "T-999999"


def comments_on(rig: Rig, ticket: str) -> list[str]:
    with sqlite3.connect(rig.demo_db) as db:
        return [r[0] for r in db.execute("SELECT body FROM comments WHERE ticket_id = ?", [ticket])]


@pytest.mark.anyio
async def test_an_obedient_model_cannot_act_on_another_object_and_is_told_why(
    rig: Rig, tmp_path: Path
) -> None:
    runner = rig.runner(tools=[])
    policy = Policy(rules=load_file(policy_file(tmp_path, PINNED)))
    elsewhere = other_ticket(rig)
    own = rig.ticket["id"]
    rig.fake.script(
        tool_calls(
            ("demo__add_comment", {"ticket_id": elsewhere, "body": "pwned"}),
            ("demo__close_ticket", {"ticket_id": own}),
            ("demo__add_comment", {"ticket_id": own, "body": "x" * 41}),
            ("demo__nuke_everything", {"really": True}),
        ),
        tool_calls(("demo__add_comment", {"body": "triaged"})),  # the pinned ticket is filled in
        text("done"),
    )
    refused_here = metrics.TOOL_CALLS.labels("demo__add_comment", "refused")
    refused_elsewhere = metrics.TOOL_CALLS.labels(metrics.REFUSED_TOOL, "refused")
    before = (refused_here._value.get(), refused_elsewhere._value.get())
    event = await rig.event()
    outcome = await decide(event, config=runner.config, policy=policy, now=utc_now(), flow=None)
    assert outcome.verdict == "run", outcome.why
    result = await runner.run(outcome)

    assert result.status == "completed"
    assert comments_on(rig, elsewhere) == []
    assert comments_on(rig, own) == ["triaged"]
    assert rig.status() == "open"
    calls = rig.stored()["runs"][0]["tool_calls"]
    assert [(c["tool"], c["status"]) for c in calls] == [
        ("demo__add_comment", "refused"),
        ("demo__close_ticket", "refused"),
        ("demo__add_comment", "refused"),
        ("demo__nuke_everything", "refused"),
        ("demo__add_comment", "ok"),
    ]
    assert f'must be "{own}", not "{elsewhere}"' in calls[0]["result"]
    assert "must be one of" in calls[1]["result"] and "at most 40" in calls[2]["result"]
    assert calls[4]["arguments"] == {"body": "triaged", "ticket_id": own}
    # The model was told which constraint failed, and was shown the pin up front.
    replies = [m for m in rig.fake.requests[1]["messages"] if m["role"] == "tool"]
    assert replies[0]["content"].startswith("refused: argument 'ticket_id' must be")
    offered = {t["function"]["name"]: t["function"]["parameters"] for t in rig.fake.requests[0]["tools"]}
    # The pin to this event is in the user message (fenced: it is the event's value), not in the
    # tools, which stay the same for every event of the rule (a prefix providers can cache).
    # Pinned to the event: taken out of the schema; the runtime fills it in, and refuses another value.
    assert "ticket_id" not in offered["demo__add_comment"]["properties"]
    user = rig.fake.requests[0]["messages"][1]["content"]
    bound = user.split('<bound-arguments boundary="')[1].split("</bound-arguments")[0]
    assert f'- demo__add_comment: ticket_id = "{own}" (from {{{{ data.ticketId }}}})' in bound
    assert offered["demo__close_ticket"]["properties"]["ticket_id"]["enum"] == ["T-none"]
    # Counted: the argument refusals under the tool, the made-up name under one shared label.
    assert (refused_here._value.get(), refused_elsewhere._value.get()) == (before[0] + 2, before[1] + 1)
    assert "demo__nuke_everything" not in {
        s.labels["tool"] for m in metrics.REGISTRY.collect() for s in m.samples if "tool" in s.labels
    }
    record = rig.stored()["runs"][0]["decision"]
    assert any(line.startswith(f'demo__add_comment: ticket_id = "{own}"') for line in record["authority"])


def test_a_glob_may_name_the_events_values_which_match_literally() -> None:
    view = {**VIEW, "data": {**VIEW["data"], "repository": "acme/d*"}}
    authority = Authority.bind(
        {"github__search_issues": {"query": {"glob": "repo:{{ data.repository }} *"}}}, view
    )
    assert authority.check("github__search_issues", None, {"query": "repo:acme/d* crash"})[1] is None
    refused = authority.check("github__search_issues", None, {"query": "repo:acme/demo crash"})[1]
    assert refused is not None and "glob" in refused


HELD = """
[[rules]]
name = "hold-and-bind"
action = "approve"
tools = ["demo__get_ticket", "demo__add_comment"]
args."demo__add_comment" = { ticket_id = "{{ data.ticketId }}" }
"""


@pytest.mark.anyio
async def test_a_held_event_says_what_approval_grants_and_the_approved_run_keeps_those_args(
    rig: Rig, tmp_path: Path
) -> None:
    runner = rig.runner(tools=[])
    event = await rig.event()
    held = await decide(
        event,
        config=runner.config,
        policy=Policy(rules=load_file(policy_file(tmp_path, HELD))),
        now=utc_now(),
        flow=None,
    )
    assert held.verdict == "hold"
    own = rig.ticket["id"]
    assert held.record["authority"][:2] == [
        "demo__get_ticket: any arguments",
        f'demo__add_comment: ticket_id = "{own}" (from {{{{ data.ticketId }}}})',
    ]
    assert held.record["rule_args"] == {"demo__add_comment": {"ticket_id": "{{ data.ticketId }}"}}
    # Approved later, under a policy that no longer has the rule: the stored decision still binds.
    approved = replace(event, decision=held.record, approved=True)
    outcome = await decide(approved, config=runner.config, policy=Policy(), now=utc_now(), flow=None)
    assert outcome.verdict == "run"
    elsewhere = other_ticket(rig)
    rig.fake.script(tool_calls(("demo__add_comment", {"ticket_id": elsewhere, "body": "x"})), text("done"))
    result = await runner.run(outcome)
    assert [c.status for c in result.tool_calls] == ["refused"]
    assert comments_on(rig, elsewhere) == []


@pytest.mark.anyio
async def test_an_unknown_tool_is_refused_before_its_arguments_are_parsed(rig: Rig) -> None:
    runner = rig.runner(tools=["demo__get_ticket"])
    # Malformed JSON for a tool the event does not allow: a refusal, not an argument error.
    rig.fake.script(Reply("tool_calls", calls=(("demo__close_ticket", "{not json"),)), text("done"))
    event = await rig.event()
    outcome = await decide(event, config=runner.config, policy=Policy(), now=utc_now(), flow=None)
    result = await runner.run(outcome)
    assert [(c.status, c.arguments) for c in result.tool_calls] == [("refused", "{not json")]
