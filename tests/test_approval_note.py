"""An approval's note reaches the run: the approving person's words go into the user prompt as the
operator's instruction, in a fence of their own kind, apart from the event's data.

A real demo server over stdio, a real SQLite store and the fake LLM (the ``rig`` fixture)."""

from __future__ import annotations

import re

import pytest
from _rig import Rig
from fake_llm import text

from agentwake.clock import utc_now
from agentwake.decide import decide
from agentwake.policy import Policy
from agentwake.store import Settlement

pytestmark = pytest.mark.anyio

HOLD = {"action": "approve", "rule": "hold-suspicious", "why": "a test"}


async def approved_with(rig: Rig, note: str | None) -> None:
    """The rig's ticket stored, held, approved with ``note``; the next claim gets it back approved."""
    event = await rig.event()
    await rig.store.settle([Settlement(event.id, HOLD, "held")])
    await rig.store.answer(event.id, approve=True, note=note)


def user_prompt(rig: Rig) -> str:
    [request] = rig.fake.requests
    [user] = [m["content"] for m in request["messages"] if m["role"] == "user"]
    assert isinstance(user, str)
    return user


async def test_the_note_reaches_the_prompt_fenced_as_the_operators_instruction(rig: Rig) -> None:
    note = "Only add a comment; do not close it.\x07"
    await approved_with(rig, note)
    [claimed] = await rig.store.claim(1)
    assert claimed.approved and claimed.approval_note == note
    rig.fake.script(text("done"))
    runner = rig.runner(tools=["demo__add_comment"])
    outcome = await decide(claimed, config=runner.config, policy=Policy(), now=utc_now(), flow=None)
    result = await runner.run(outcome)
    assert result.status == "completed", result
    prompt = user_prompt(rig)
    [(boundary, body)] = re.findall(
        r'<operator-instruction boundary="([^"]+)">\n(.*?)\n</operator-instruction boundary="\1">',
        prompt,
        re.S,
    )
    assert body == "Only add a comment; do not close it."  # the control character is cleaned away
    assert f'<event-data boundary="{boundary}">' in prompt  # one run, one boundary for both fences
    event_block = prompt.split(f'<event-data boundary="{boundary}">', 1)[1].split("</event-data", 1)[0]
    assert "Only add a comment" not in event_block
    assert "comes from the operator, not from the event" in prompt
    # What the run sent is what the transcript keeps.
    [run] = rig.stored()["runs"]
    assert "Only add a comment; do not close it." in run["user_prompt"]


async def test_no_note_no_operator_block(rig: Rig) -> None:
    await approved_with(rig, None)
    [claimed] = await rig.store.claim(1)
    rig.fake.script(text("done"))
    runner = rig.runner(tools=["demo__add_comment"])
    outcome = await decide(claimed, config=runner.config, policy=Policy(), now=utc_now(), flow=None)
    await runner.run(outcome)
    assert "operator-instruction" not in user_prompt(rig)
