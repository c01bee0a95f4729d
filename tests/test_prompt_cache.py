"""Prompt caching: every request of a rule starts with the same bytes (system prompt, then the tools
sorted by name) and only the user message, which holds the event, differs from run to run."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _rig import Rig
from fake_llm import text

from agentwake.clock import utc_now
from agentwake.decide import decide
from agentwake.delivery.common import subscription_key
from agentwake.policy import Policy
from agentwake.store import IncomingEvent

pytestmark = pytest.mark.anyio


def prefix(request: dict[str, Any]) -> str:
    """What every run of one rule must send alike: the system message and the tools, as bytes."""
    return json.dumps([request["messages"][0], request.get("tools")], ensure_ascii=False)


async def run_two_events(rig: Rig) -> list[dict[str, Any]]:
    runner = rig.runner(tools=["demo__get_*", "demo__add_comment", "demo__close_ticket"])
    sub = runner.config.subscriptions[0]
    key = subscription_key(sub)
    await rig.store.register(key)
    events = [
        IncomingEvent(
            f"T-90000{n}",
            "ticket.created",
            f"2026-01-0{n}T10:0{n}:00Z",
            {"ticketId": f"T-90000{n}", "title": f"printer {n} on fire", "priority": f"P{n}"},
        )
        for n in (1, 2)
    ]
    await rig.store.ingest(key, events, "1")
    claimed = await rig.store.claim(2)
    assert len(claimed) == 2
    rig.fake.script(text("Nothing to do."), text("Nothing to do."))
    for event in claimed:
        outcome = await decide(event, config=runner.config, policy=Policy(), now=utc_now(), flow=None)
        result = await runner.run(outcome)
        assert result.status == "completed", result.reason
    return rig.fake.requests


async def test_two_runs_of_a_rule_share_their_prefix_and_differ_only_in_the_user_message(rig: Rig) -> None:
    first, second = await run_two_events(rig)
    assert prefix(first) == prefix(second)
    system = first["messages"][0]["content"]
    for variable in ("T-900001", "2026-01-01", "printer 1"):
        assert variable not in system
    # The tools come sorted by name, whatever order the server lists them in.
    names = [tool["function"]["name"] for tool in first["tools"]]
    assert names == sorted(names) and "demo__add_comment" in names
    # Only the last part, the user message with the event, differs.
    assert len(first["messages"]) == len(second["messages"]) == 2
    one, two = first["messages"][1]["content"], second["messages"][1]["content"]
    assert one != two
    assert "T-900001" in one and "T-900002" in two
    # The run's boundary is named in the user message only, before any data.
    boundary = one.split('boundary="')[1].split('"')[0]
    assert boundary not in system
    assert one.index(boundary) < one.index("printer 1")
