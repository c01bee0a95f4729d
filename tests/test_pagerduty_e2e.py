"""The PagerDuty bridge end to end: PagerDuty's signed V3 webhooks (and its API, polled) → ``agentwake
bridge pagerduty`` → ``agentwake run`` over push delivery → a scripted LLM → tool calls that reach the
fake PagerDuty API.

Everything is real and on loopback: the bridge is the stdio server ``agentwake run`` starts, with both
ingress paths on; the deliveries are signed as PagerDuty signs them (``v1=`` + HMAC-SHA256 of the raw
body); the LLM is tests/fake_llm.py and PagerDuty is agentwake/fakes/pagerduty.py. One incident comes by
webhook (with a forged, a stale, a replayed and a retried delivery around it), one by polling, and a
low-urgency one is filtered out by the subscription.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _support import agentwake_run, bridge_server_toml, until_rows, write_bridge_config
from fake_llm import FakeLLM, Reply, text, tool_calls

from agentwake.fakes.pagerduty import FakePagerDuty, post_webhook, sign

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SECRET = "ChPGG0QqGAXrFAQ+Ffx6cR7B5/Jz9MNWCg9XwiTVtJWmy1eVy3jjhI8y4AAHVq1t"
KEY = "u+Pd7ExAmPlEkEy_9f2c"
NOTE = "agentwake acknowledged this and is looking into it."
POLICY = """
[[rules]]
name = "acknowledge-urgent-incidents"
action = "agent"
tools = ["pagerduty__acknowledge", "pagerduty__add_note"]
match.event = "incident.triggered"
"""
SUBSCRIPTIONS = """
[[subscriptions]]
name = "urgent-incidents"
server = "pagerduty"
event = "incident.triggered"
delivery = "push"
arguments = { urgency = "high" }
"""


def acknowledge_what_the_prompt_names(body: dict[str, Any]) -> Reply:
    """The scripted model: acknowledge the incident the event names and leave a note; then stop."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return text("done")
    prompt = "\n".join(str(m.get("content")) for m in messages if m["role"] == "user")
    found = re.search(r'"incidentId":\s*"([A-Za-z0-9]+)"', prompt)
    assert found, prompt
    incident = found.group(1)
    return tool_calls(
        ("pagerduty__acknowledge", {"incident_id": incident}),
        ("pagerduty__add_note", {"incident_id": incident, "note": NOTE}),
    )


def write_config(tmp_path: Path, pd: FakePagerDuty, llm: FakeLLM) -> Path:
    args = ["--api-base", pd.url, "--from-email", pd.bot["email"], "--listen", "127.0.0.1:0"]
    server = bridge_server_toml(
        "pagerduty",
        tmp_path / "bridge",
        [*args, "--poll", "--poll-interval", "1"],
        ["PAGERDUTY_WEBHOOK_SECRET", "PAGERDUTY_API_KEY"],
    )
    return write_bridge_config(
        tmp_path, server, llm.url, SUBSCRIPTIONS, policies=("10-pagerduty.toml", POLICY)
    )


async def post(url: str, body: bytes, signature: str, webhook_id: str | None = None) -> tuple[int, str]:
    return await post_webhook(url, body, signature, webhook_id=webhook_id, subscription="PSUB0E2E")


async def test_webhook_and_polled_incidents_are_acknowledged_and_annotated_by_the_agent(
    tmp_path: Path,
) -> None:
    async with FakePagerDuty(api_key=KEY) as pd, FakeLLM() as llm:
        llm.responder = acknowledge_what_the_prompt_names
        grace = pd.add_user("Grace Hopper", "grace@example.com")
        config = write_config(tmp_path, pd, llm)
        env = {"PAGERDUTY_WEBHOOK_SECRET": SECRET, "PAGERDUTY_API_KEY": KEY, "FAKE_LLM_KEY": "sk-test"}
        async with agentwake_run(config, **env) as service:
            line = service.lines[await service.wait_for("webhooks on http://")]
            hook = line.split(" on ", 1)[1].strip()
            await until_rows(
                tmp_path / "aw.db",
                "SELECT cursor FROM subscriptions",
                lambda rows: rows and rows[0][0],
                service,
            )
            # The poller's first round is its baseline; from its second on, a new incident is news.
            await pd.wait_for("GET", "/log_entries", timeout=30)

            # By webhook: forged and stale deliveries are refused; the valid one, replayed or retried
            # by PagerDuty, wakes the agent once. Triggered before the poller's baseline, this incident
            # can come by webhook only.
            before = datetime.now(UTC) - timedelta(minutes=5)
            hooked = pd.trigger("Checkout error rate above 5%", priority="P1", at=before)
            body = json.dumps(pd.webhook("incident.triggered", hooked["id"])).encode()
            assert await post(hook, body, sign(body, "not the secret")) == (401, "refused")
            stale = pd.webhook(
                "incident.triggered", hooked["id"], occurred_at=datetime.now(UTC) - timedelta(days=2)
            )
            stale_body = json.dumps(stale).encode()
            assert await post(hook, stale_body, sign(stale_body, SECRET)) == (400, "refused")
            assert await post(hook, body, sign(body, SECRET), "W1") == (202, "accepted")
            assert await post(hook, body, sign(body, SECRET), "W1") == (200, "duplicate")
            assert await post(hook, body, sign(body, SECRET), "W2") == (200, "duplicate")

            path = f"/incidents/{hooked['id']}"
            ack = await pd.wait_for("PUT", path, timeout=60)
            note = await pd.wait_for("POST", f"{path}/notes", timeout=60)
            assert ack.json == {"incident": {"type": "incident_reference", "status": "acknowledged"}}
            assert note.json == {"note": {"content": NOTE}}
            for request in (ack, note):
                assert request.headers["From"] == pd.bot["email"]
                assert request.headers["Authorization"] == f"Token token={KEY}"
            assert pd.incident(hooked["id"])["status"] == "acknowledged"

            # By polling only: a low-urgency incident is filtered out, an urgent one reaches the agent.
            # A person acknowledges the first incident too: unlike the agent's own, that is an event.
            quiet = pd.trigger("Nightly export late", service="Nightly Batch", urgency="low")
            polled = pd.trigger("Checkout latency above 2 s")
            pd.acknowledge(hooked["id"], grace)
            await pd.wait_for("PUT", f"/incidents/{polled['id']}", timeout=60)
            await pd.wait_for("POST", f"/incidents/{polled['id']}/notes", timeout=60)

            runs = await until_rows(
                tmp_path / "aw.db",
                "SELECT state FROM events",
                lambda rows: (
                    len(rows) >= 2 and all(state not in ("pending", "processing") for (state,) in rows)
                ),
                service,
            )
            assert runs == [("done",), ("done",)], service.log()
            # The poll round that read the person's acknowledgement read the agent's own one before it
            # too, and dropped that one.
            logged = await until_rows(
                tmp_path / "bridge" / "events.db",
                "SELECT type, source, data FROM events ORDER BY seq",
                lambda rows: any(kind == "incident.acknowledged" for kind, _, _ in rows),
                service,
            )
        # Both triggers of a poll round have the same second, so their order in the log is not asserted.
        assert sorted((kind, source) for kind, source, _ in logged) == [
            ("incident.acknowledged", "poll"),
            ("incident.triggered", "poll"),
            ("incident.triggered", "poll"),
            ("incident.triggered", "webhook"),
        ]
        acknowledged = [json.loads(data) for kind, _, data in logged if kind == "incident.acknowledged"]
        assert [data["actor"] for data in acknowledged] == ["Grace Hopper"]
        assert not pd.calls("PUT", f"/incidents/{quiet['id']}")
        assert len(pd.calls("PUT")) == 2 and len(pd.calls("POST")) == 2
        assert len(llm.requests) == 4  # two runs, each a tool round and a final answer
