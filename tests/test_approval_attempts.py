"""Holding an event for approval costs it no attempt: with ``[agent] max_attempts = 1`` an approved
event runs (it used to go dead, its one attempt spent on the claim that held it).

The service's worker loop (``Worker.run``) over a real SQLite store, the demo server over stdio
and the fake LLM (tests/_rig.py); the event is approved with `agentwake approve`, as a person does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from _rig import Rig
from fake_llm import text, tool_calls
from test_policy_e2e import HOLD, cli

from agentwake.agent.runner import AgentRunner
from agentwake.delivery.common import subscription_key
from agentwake.policy import load_policy
from agentwake.store import IncomingEvent
from agentwake.worker import Worker

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")]

WAIT_S = 20.0


async def until(rig: Rig, holds: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The stored event once ``holds`` is true of it (the worker runs in this process: asked, not told)."""
    with anyio.fail_after(WAIT_S):
        while True:
            stored = rig.stored()
            if holds(stored):
                return stored
            await anyio.sleep(0.02)


async def test_an_approved_event_runs_with_max_attempts_1(rig: Rig) -> None:
    folder = rig.tmp / "policies"
    folder.mkdir()
    (folder / "10-test.toml").write_text(HOLD)
    cfg = rig.config(tools=[], max_attempts=1)
    runner = AgentRunner.build(cfg, rig.store, rig.pool)
    worker = Worker(cfg, rig.store, policy=load_policy(folder), agent=runner, pool=rig.pool)
    key = subscription_key(cfg.subscriptions[0])
    await rig.store.register(key)
    data = {k: rig.ticket[k] for k in ("queue", "priority", "title", "reporter")}
    ticket = rig.ticket["id"]
    event = IncomingEvent(ticket, "ticket.created", rig.ticket["created_at"], {"ticketId": ticket, **data})
    await rig.store.ingest(key, [event], "1")
    rig.fake.script(
        tool_calls(("demo__add_comment", {"ticket_id": ticket, "body": "approved triage"})),
        text("done"),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        held = await until(rig, lambda e: e["state"] == "held")
        assert held["attempts"] == 0  # holding it was no attempt
        assert "approved" in cli(rig, "approve", ticket, "--note", "go")
        worker.wake()
        done = await until(rig, lambda e: e["state"] not in ("held", "pending", "processing"))
        tg.cancel_scope.cancel()
    assert (done["state"], done["last_error"], done["attempts"]) == ("done", None, 1)
    assert rig.comments() == ["approved triage"]
    [run] = done["runs"]
    assert run["attempt"] == 1 and "approved by a person" in run["decision"]["why"]
    [answer] = done["answers"]
    assert answer["answer"] == "approved" and answer["who"].startswith("cli:")
