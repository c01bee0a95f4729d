"""``agentwake policy test`` goes through the service's own decision: the rule's hook runs, and the
flow control a sample event would face is shown (as the first event of its window).

All offline: no server is asked for its tools, no LLM is called.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO
from typer.testing import CliRunner

from agentwake.cli import app

AGENT = f"""
[agent]
model = "agentwake/offline"
prompts = {json.dumps(str(REPO / "prompts"))}
"""
SUBSCRIPTION = """
[servers.demo]
command = "/nonexistent/server"

[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
"""
BURSTS = """
[[rules]]
name = "bursts"
action = "agent"
tools = ["demo__get_*"]
match.event = "ticket.created"
debounce = { window_s = 30, key = "data.queue" }
dedup = { key = "data.ticketId", window_s = 600 }
"""
PLAIN = """
[[rules]]
name = "plain"
action = "agent"
match.event = "ticket.created"
"""
HOOKED = """
[[rules]]
name = "hooked"
action = "agent"
match.event = "ticket.created"
hook = "policies/spam.py:decide"
"""
SPAM_HOOK = """
def decide(event):
    if "spam" in event["data"].get("title", ""):
        return {"action": "ignore", "why": "looks like spam"}
    return None
"""


def policy_test(tmp_path: Path, rules: str, title: str = "Printer jammed", *, agent: bool = True) -> str:
    """The output of `agentwake policy test --offline` for one ticket under these rules."""
    (tmp_path / "agentwake.toml").write_text((AGENT if agent else "") + SUBSCRIPTION)
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "10-test.toml").write_text(rules)
    (policies / "spam.py").write_text(SPAM_HOOK)
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"ticketId": "T-9", "queue": "support", "title": title}))
    config = tmp_path / "agentwake.toml"
    args = ["policy", "test", str(event), "--subscription", "tickets", "--offline", "-c", str(config)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_a_debounced_rule_shows_the_batch_the_sample_would_open_and_its_flow_control(tmp_path: Path) -> None:
    out = policy_test(tmp_path, BURSTS)
    assert "action: agent" in out and "verdict: batched" in out
    assert "why: opens a batch (rule bursts); it runs in 30s" in out
    assert (
        "flow control: dedup on data.ticketId within 600s; debounce 30s per data.queue (up to 50 events in one run)"
        in out
    )
    assert "a sample event is the first in its window" in out
    assert "the event would open a debounce batch" in out
    assert "allowlist: demo__get_*" in out  # and then the plan, as for a run


def test_a_rule_without_flow_control_says_so(tmp_path: Path) -> None:
    out = policy_test(tmp_path, PLAIN)
    assert "verdict: run" in out and "flow control: none" in out
    assert "first in its window" not in out


@pytest.mark.parametrize(
    ("title", "verdict", "said"),
    [
        ("Printer jammed", "run", "hook policies/spam.py:decide kept the rule's decision"),
        ("Buy cheap spam now", "ignore", "hook policies/spam.py:decide answered ignore"),
    ],
)
def test_the_rules_hook_runs_and_what_it_did_is_shown(
    tmp_path: Path, title: str, verdict: str, said: str
) -> None:
    out = policy_test(tmp_path, HOOKED, title)
    assert f"verdict: {verdict}" in out and f"hook: {said}" in out
    if verdict == "ignore":
        assert "looks like spam" in out and "the agent would not run for this event" in out


def test_without_an_agent_section_the_sample_is_only_logged(tmp_path: Path) -> None:
    out = policy_test(tmp_path, PLAIN, agent=False)
    assert "action: agent" in out and "verdict: log" in out
    assert "why: agent wanted, but no [agent] section in the config" in out
    assert "the agent would not run for this event" in out
    assert "flow control" not in out
