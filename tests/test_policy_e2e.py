"""Policy end to end: a real demo server over stdio, litellm to the fake LLM, the service's agent stage.

The rule's allowlist is the authority (not the subscription's, not the model's wish),
and an 'approve' rule holds the event until `agentwake approve` or `deny`.
"""

from __future__ import annotations

import json

import pytest
from _rig import Rig
from fake_llm import text, tool_calls
from typer.testing import CliRunner

from agentwake.agent.runner import AgentRunner
from agentwake.cli import app
from agentwake.policy import load_policy
from agentwake.worker import Worker

# pydantic builds some of litellm's models lazily and warns about a ReadOnly TypedDict item inside
# litellm in whichever test first gets there (see tests/test_agent_units.py); nothing of agentwake's.
pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")]

READ_ONLY = """
[[rules]]
name = "read-only-tickets"
action = "agent"
tools = ["demo__get_*"]
match.event = "ticket.created"
"""
HOLD = """
[[rules]]
name = "hold-tickets"
action = "approve"
tools = ["demo__add_comment"]
match.event = "ticket.created"
"""


def worker_with(rig: Rig, policy_text: str, *, subscription_tools: list[str]) -> Worker:
    """The service's worker, with this policy file and the rig's agent."""
    folder = rig.tmp / "policies"
    folder.mkdir(exist_ok=True)
    (folder / "10-test.toml").write_text(policy_text)
    cfg = rig.config(tools=subscription_tools)
    runner = AgentRunner.build(cfg, rig.store, rig.pool)
    return Worker(cfg, rig.store, policy=load_policy(folder), agent=runner, pool=rig.pool)


def cli(rig: Rig, *args: str) -> str:
    config = rig.tmp / "cli.toml"
    config.write_text(f'[store]\npath = "{rig.tmp / "aw.db"}"\n')
    result = CliRunner().invoke(app, [*args, "-c", str(config)])
    assert result.exit_code == 0, result.output
    return result.output


async def test_a_read_only_rule_keeps_the_server_unchanged_whatever_the_model_asks(rig: Rig) -> None:
    # The subscription would allow add_comment; the matching rule allows only reads, and wins.
    worker = worker_with(rig, READ_ONLY, subscription_tools=["demo__add_comment"])
    rig.fake.script(
        tool_calls(("demo__add_comment", {"ticket_id": rig.ticket["id"], "body": "I was told to"})),
        text("could not comment"),
    )
    await worker.handle(await rig.event())

    offered = [t["function"]["name"] for t in rig.fake.requests[0]["tools"]]
    assert offered == ["demo__get_alert", "demo__get_ticket"]  # sorted: the same prefix every run
    assert rig.comments() == []
    stored = rig.stored()
    [run] = stored["runs"]
    assert run["decision"]["rule"] == "read-only-tickets"
    assert "rule 'read-only-tickets' (10-test.toml:2)" in run["decision"]["why"]
    assert [(c["tool"], c["status"]) for c in run["tool_calls"]] == [("demo__add_comment", "refused")]
    assert stored["state"] == "done"


async def test_an_approve_rule_holds_the_event_until_a_person_approves_it(rig: Rig) -> None:
    worker = worker_with(rig, HOLD, subscription_tools=[])
    await worker.handle(await rig.event())
    assert rig.stored()["state"] == "held"
    assert rig.stored()["injection_score"] == 0.0  # recorded with the event, though no run happened
    assert rig.fake.requests == []  # nothing reached the LLM
    [held] = json.loads(cli(rig, "approvals", "--json"))
    assert (held["event_id"], held["decision"]["rule"]) == (rig.ticket["id"], "hold-tickets")
    assert await rig.store.claim(1) == []  # held events are not claimed

    assert "approved" in cli(rig, "approve", rig.ticket["id"], "--note", "looks fine")
    rig.fake.script(
        tool_calls(("demo__add_comment", {"ticket_id": rig.ticket["id"], "body": "approved triage"})),
        text("done"),
    )
    [again] = await rig.store.claim(1)
    assert again.approved
    await worker.handle(again)

    assert rig.comments() == ["approved triage"]  # with the rule's tools, though the subscription has none
    stored = rig.stored()
    assert stored["state"] == "done" and stored["approval_note"] == "looks fine"
    [run] = stored["runs"]
    assert "approved by a person" in run["decision"]["why"]
    assert json.loads(cli(rig, "approvals", "--json")) == []


async def test_a_denied_event_never_runs_and_keeps_the_reason(rig: Rig) -> None:
    worker = worker_with(rig, HOLD, subscription_tools=["demo__add_comment"])
    await worker.handle(await rig.event())
    assert "denied" in cli(rig, "deny", rig.ticket["id"], "--reason", "spam")
    stored = rig.stored()
    assert (stored["state"], stored["approval_note"], stored["runs"]) == ("denied", "spam", [])
    assert await rig.store.claim(1) == []
    assert rig.fake.requests == []
    # A second answer is refused with a clear message.
    config = rig.tmp / "cli.toml"
    result = CliRunner().invoke(app, ["approve", rig.ticket["id"], "-c", str(config)])
    assert result.exit_code == 1 and "'denied', not held for approval" in result.output
