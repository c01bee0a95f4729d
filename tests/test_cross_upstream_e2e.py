"""The cross-upstream triage end to end: a PagerDuty P1 incident leads to a Slack post.

A signed PagerDuty V3 webhook → ``agentwake bridge pagerduty`` → ``agentwake run`` (push delivery) →
the repository's own policies folder (policies/triage.toml decides) and prompts → a scripted LLM →
tool calls on two servers: the incident is acknowledged and annotated on the fake PagerDuty, and a
summary is posted on the fake Slack, to the channel set in prompts/triage.settings.md.j2.

Everything is real and on loopback: both bridges are stdio servers ``agentwake run`` starts (the Slack
one on Socket Mode, for its mentions); the delivery is signed as PagerDuty signs it; the LLM is
tests/fake_llm.py, PagerDuty agentwake/fakes/pagerduty.py and Slack agentwake/fakes/slack.py. A low-urgency
incident without priority comes by the same path and is only logged.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from _support import agentwake_run, bridge_server_toml, read_db, until_rows, write_bridge_config
from conftest import REPO
from fake_llm import FakeLLM, Reply, text, tool_calls

from agentwake.fakes.pagerduty import FakePagerDuty, post_webhook, sign
from agentwake.fakes.slack import FakeSlack

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SECRET = "ChPGG0QqGAXrFAQ+Ffx6cR7B5/Jz9MNWCg9XwiTVtJWmy1eVy3jjhI8y4AAHVq1t"
KEY = "u+Pd7ExAmPlEkEy_9f2c"
NOTE = "Checkout 5xx above 5% since the 14:02 deploy; no related open incident. Look at the deploy first."
P1_TOOLS = {
    "pagerduty__get_incident",
    "pagerduty__list_recent_incidents",
    "pagerduty__acknowledge",
    "pagerduty__add_note",
    "slack__post_message",
}
SUBSCRIPTIONS = """
[[subscriptions]]
name = "pagerduty-triggered"
server = "pagerduty"
event = "incident.triggered"
delivery = "push"

[[subscriptions]]
name = "slack-mentions"
server = "slack"
event = "app_mention"
delivery = "push"
"""


def configured_channel() -> str:
    """The Slack channel of P1 summaries, as the one settings file of the triage prompts sets it."""
    found = re.search(
        r'{% set slack_channel = "([^"]+)" %}', (REPO / "prompts" / "triage.settings.md.j2").read_text()
    )
    assert found
    return found.group(1)


def field(name: str, prompt: str) -> str:
    found = re.search(rf'"{name}":\s*("[^"]*"|\d+)', prompt)
    assert found, (name, prompt)
    return str(json.loads(found.group(1)))


def triage_the_incident_the_prompt_names(body: dict[str, Any]) -> Reply:
    """The scripted model: on the P1 prompt, acknowledge, note, and post to the channel the prompt
    names; once the tools answered, stop. It is offered exactly the P1 rule's tools, from both servers."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return text("Acknowledged, noted, and posted the summary to Slack.")
    offered = {tool["function"]["name"] for tool in body.get("tools", [])}
    assert offered == P1_TOOLS, offered
    prompt = "\n".join(str(m.get("content")) for m in messages if m["role"] == "user")
    channel = re.search(r'slack__post_message \(channel "([A-Z0-9]+)"\)', prompt)
    assert channel, prompt
    incident, number, title, url = (field(name, prompt) for name in ("incidentId", "number", "title", "url"))
    summary = f"P1 #{number} {title}: acknowledged by agentwake, which is looking into it. {url}"
    return tool_calls(
        ("pagerduty__acknowledge", {"incident_id": incident}),
        ("pagerduty__add_note", {"incident_id": incident, "note": NOTE}),
        ("slack__post_message", {"channel": channel.group(1), "text": summary}),
    )


def write_config(tmp_path: Path, pd: FakePagerDuty, slack: FakeSlack, llm: FakeLLM) -> Path:
    pagerduty = bridge_server_toml(
        "pagerduty",
        tmp_path / "pagerduty",
        ["--api-base", pd.url, "--from-email", pd.bot["email"], "--listen", "127.0.0.1:0"],
        ["PAGERDUTY_WEBHOOK_SECRET", "PAGERDUTY_API_KEY"],
    )
    slack_server = bridge_server_toml(
        "slack",
        tmp_path / "slack",
        ["--socket-mode", "--api-base", slack.url],
        ["SLACK_BOT_TOKEN", "SLACK_APP_TOKEN"],
    )
    # The repository's own folder: triage.toml beside the demo's and GitHub's rules.
    return write_bridge_config(
        tmp_path, pagerduty + slack_server, llm.url, SUBSCRIPTIONS, policies=REPO / "policies"
    )


async def deliver(url: str, pd: FakePagerDuty, incident_id: str) -> tuple[int, str]:
    """The incident's incident.triggered webhook, signed as PagerDuty signs it."""
    body = json.dumps(pd.webhook("incident.triggered", incident_id)).encode()
    return await post_webhook(url, body, sign(body, SECRET), subscription="PSUB0TRIAGE")


async def test_a_p1_pagerduty_incident_is_acknowledged_noted_and_summed_up_in_slack(tmp_path: Path) -> None:
    channel = configured_channel()
    async with FakePagerDuty(api_key=KEY) as pd, FakeSlack() as slack, FakeLLM() as llm:
        slack.add_channel(channel, "incidents")
        llm.responder = triage_the_incident_the_prompt_names
        config = write_config(tmp_path, pd, slack, llm)
        env = {
            "PAGERDUTY_WEBHOOK_SECRET": SECRET,
            "PAGERDUTY_API_KEY": KEY,
            "SLACK_BOT_TOKEN": slack.bot_token,
            "SLACK_APP_TOKEN": slack.app_token,
            "FAKE_LLM_KEY": "sk-test",
        }
        store = tmp_path / "aw.db"
        async with agentwake_run(config, **env) as service:
            line = service.lines[await service.wait_for("webhooks on http://")]
            hook = line.split(" on ", 1)[1].strip()
            # Until both subscriptions have their first cursor: an event sent before would predate it.
            await until_rows(
                store,
                "SELECT name FROM subscriptions WHERE cursor IS NOT NULL",
                lambda rows: {name for (name,) in rows} >= {"pagerduty-triggered", "slack-mentions"},
                service,
            )

            quiet = pd.trigger("Nightly export late", service="Nightly Batch", urgency="low")
            p1 = pd.trigger("Checkout error rate above 5%", priority="P1")
            assert await deliver(hook, pd, quiet["id"]) == (202, "accepted")
            assert await deliver(hook, pd, p1["id"]) == (202, "accepted")

            path = f"/incidents/{p1['id']}"
            ack = await pd.wait_for("PUT", path, timeout=60)
            note = await pd.wait_for("POST", f"{path}/notes", timeout=60)
            post = await slack.wait_for("chat.postMessage", timeout=60)
            events = await until_rows(
                store,
                "SELECT event_id, state, decision FROM events ORDER BY id",
                lambda rows: (
                    len(rows) == 2 and all(state not in ("pending", "processing") for _, state, _ in rows)
                ),
                service,
            )
            calls = read_db(store, "SELECT tool, status FROM tool_calls ORDER BY id")

        # PagerDuty: acknowledged and annotated, as the bridge's From user.
        assert ack.json == {"incident": {"type": "incident_reference", "status": "acknowledged"}}
        assert note.json == {"note": {"content": NOTE}}
        for request in (ack, note):
            assert request.headers["From"] == pd.bot["email"]
        assert pd.incident(p1["id"])["status"] == "acknowledged"
        # Slack: one summary, in the configured channel, naming the incident.
        assert post.json is not None and post.json["channel"] == channel and "thread_ts" not in post.json
        summary = post.json["text"]
        assert f"#{p1['incident_number']}" in summary and "Checkout error rate above 5%" in summary
        assert p1["html_url"] in summary
        assert post.headers["Authorization"] == f"Bearer {slack.bot_token}"
        assert [message["text"] for message in slack.messages(channel)] == [summary]
        # The shipped policy decided both: the P1 by its P1 rule, the other by its log rule.
        decided = {event_id: (state, json.loads(decision)) for event_id, state, decision in events}
        state, decision = decided[f"incident.triggered:{p1['id']}"]
        assert (state, decision["rule"], decision["action"]) == ("done", "triage-pagerduty-p1", "agent")
        assert "(triage.toml:" in decision["why"]
        assert set(decision["allowlist"]) == P1_TOOLS
        state, decision = decided[f"incident.triggered:{quiet['id']}"]
        assert (state, decision["rule"], decision["action"]) == ("done", "triage-pagerduty-log-rest", "log")
        assert decision["where"].startswith("triage.toml:")
        assert [tool for tool, _ in calls] == [
            "pagerduty__acknowledge",
            "pagerduty__add_note",
            "slack__post_message",
        ]
        assert {status for _, status in calls} == {"ok"}, calls
        assert not pd.calls("PUT", f"/incidents/{quiet['id']}")
        assert len(pd.calls("PUT")) == len(pd.calls("POST")) == 1
        assert len(llm.requests) == 2  # one run: a tool round and a final answer
