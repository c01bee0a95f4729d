"""The tool-call journal across kill -9: a call already made is never made again.

A real `agentwake run` (demo server for the events, tests/journal_tools_server.py for a tool
whose calls it writes down, litellm against the in-test fake LLM) is killed between a call's
send and its answer: the rerun does not send it again; the event is dead with the reason,
`agentwake retry` refuses it, and `retry --resend-unknown` sends it once more with the same
idempotency key. (A kill after a call's result was recorded, in every delivery mode, is in
tests/test_fault_suite.py.)
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
import pytest
from _support import agentwake_run, demo_server_toml, fake_agent_toml, start_from_cursor
from conftest import REPO
from fake_llm import FakeLLM, hold, text, tool_calls

from agentwake.store.sqlite import SqliteCore

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TICKET: Final = "T-000001"
NOTE: Final = {"text": "triaged T-000001"}
TOOLS_READY: Final = "server notes: 1 tool(s)"


@dataclass
class Scenario:
    config: Path
    store: Path
    calls: Path
    block: Path

    def calls_made(self) -> list[dict[str, Any]]:
        if not self.calls.exists():
            return []
        return [json.loads(line) for line in self.calls.read_text().splitlines()]

    def event(self) -> dict[str, Any]:
        store = SqliteCore.open(self.store)
        try:
            [event] = store.find_events(TICKET)
        finally:
            store.close()
        return event

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agentwake.cli", *args, "-c", str(self.config)],
            capture_output=True,
            text=True,
            timeout=60,
        )


def scenario(tmp_path: Path, llm_url: str) -> Scenario:
    calls, block = tmp_path / "calls.jsonl", tmp_path / "block"
    path = tmp_path / "agentwake.toml"
    path.write_text(
        f"""
[store]
path = "aw.db"

{fake_agent_toml(llm_url, attempt_backoff_s=0, llm_retries=0, concurrency=1, timeout_s=30)}
{demo_server_toml(tmp_path / "demo.db", DEMO_BACKLOG="1")}
[servers.notes]
command = "python"
args = ["{REPO / "tests" / "journal_tools_server.py"}"]
env = {{ CALLS_FILE = "{calls}", BLOCK_FILE = "{block}" }}

[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
poll_floor_ms = 100
tools = ["notes__post_note"]
"""
    )
    return Scenario(path, start_from_cursor(path), calls, block)


async def wait_for_calls(scenario: Scenario, count: int, timeout: float = 20) -> None:  # noqa: ASYNC109
    with anyio.fail_after(timeout):
        while len(scenario.calls_made()) < count:  # noqa: ASYNC110 - the tool server writes a file
            await anyio.sleep(0.02)


def replies_in(request: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in request["messages"] if m.get("role") == "tool"]


async def test_a_call_sent_without_an_answer_is_not_resent_until_a_person_says_so(tmp_path: Path) -> None:
    async with FakeLLM() as fake:
        s = scenario(tmp_path, fake.url)
        s.block.touch()  # the tool server writes the call down, then never answers
        fake.script(hold(), tool_calls(("notes__post_note", NOTE)))
        async with agentwake_run(s.config, FAKE_LLM_KEY="sk-test") as first:
            await first.wait_for(TOOLS_READY)
            await fake.wait_for_requests(1)
            fake.release()
            await wait_for_calls(s, 1)
            assert await first.stop(signal.SIGKILL) == -signal.SIGKILL
        [sent] = s.calls_made()
        assert sent["key"] and sent["key"].startswith(f"agentwake/demo/{TICKET}/run-1/step-1/")
        s.block.unlink()

        async with agentwake_run(s.config, FAKE_LLM_KEY="sk-test") as second:
            await second.wait_for(f"event {TICKET}", "outcome is unknown")
            assert await second.stop(signal.SIGTERM) == 0, second.log()
        assert len(s.calls_made()) == 1 and len(fake.requests) == 1  # nothing resent, no LLM call
        event = s.event()
        assert event["state"] == "dead"
        assert "notes__post_note" in event["last_error"]
        assert f"agentwake retry --resend-unknown {TICKET}" in event["last_error"]

        refused = s.cli("retry", TICKET)
        assert refused.returncode != 0
        assert "outcome is unknown" in refused.stderr and "--resend-unknown" in refused.stderr
        assert s.event()["state"] == "dead"  # a refusal changes nothing

        allowed = s.cli("retry", "--resend-unknown", TICKET)
        assert allowed.returncode == 0, allowed.stderr
        assert "1 tool call(s) of unknown outcome will be sent again" in allowed.stdout

        fake.script(text("done: noted"))
        async with agentwake_run(s.config, FAKE_LLM_KEY="sk-test") as third:
            await third.wait_for(f"agent: event {TICKET} (tickets) run", "completed")
            assert await third.stop(signal.SIGTERM) == 0, third.log()

    first_send, resend = s.calls_made()
    assert resend == first_send  # the same call, with the same idempotency key
    assert any("note posted: triaged T-000001" in reply for reply in replies_in(fake.requests[-1]))
    event = s.event()
    assert event["state"] == "done"
    assert [r["status"] for r in event["runs"]] == ["interrupted", "failed", "completed"]


async def test_retry_refuses_an_event_that_did_not_fail(tmp_path: Path) -> None:
    async with FakeLLM() as fake:
        s = scenario(tmp_path, fake.url)
        fake.script(text("nothing to do"))
        async with agentwake_run(s.config, FAKE_LLM_KEY="sk-test") as service:
            await service.wait_for(f"agent: event {TICKET} (tickets) run", "completed")
            assert await service.stop(signal.SIGTERM) == 0, service.log()
    refused = s.cli("retry", TICKET)
    assert refused.returncode != 0
    assert "only failed or dead events are retried" in refused.stderr
    missing = s.cli("retry", "T-999999")
    assert missing.returncode != 0 and "T-999999" in missing.stderr
