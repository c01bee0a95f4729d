"""How the bundled triage policy (policies/triage.toml) decides the Slack bridge's newer events: a DM to
the app is taken as a mention is, edits and deletions are ignored, joins and private channels' messages
are logged. The events are Slack's own examples through the bridge's mapping; the deciding is
tests/test_triage_policy.py's (``agentwake.decide.decide`` on the example config).
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from conftest import REPO
from test_slack_events import upstream
from test_triage_policy import MENTION, Sample, decided, example

from agentwake.bridges import slack_events
from agentwake.config import AgentwakeConfig, load_config
from agentwake.policy import Policy

__all__ = ["example"]  # the fixture, used by name

pytestmark = pytest.mark.anyio


def sample(label: str, **changes: Any) -> Sample:
    body = upstream(label, app_user="U0APPBOT")
    body["event"].update(changes)
    mapped = slack_events.from_callback(body)
    assert mapped is not None and not mapped.own
    return Sample("slack", mapped.type, mapped.event_id, mapped.data)


CASES = [
    ("a DM", sample("message.im"), "triage-slack-answer-mentions", "run", MENTION),
    (
        "a DM asking to resolve",
        sample("message.im", text="please resolve Q2KX7Z4M9FJHTA, the fix is out"),
        "triage-slack-hold-incident-actions",
        "hold",
        None,
    ),
    ("an edit", sample("message.message_changed"), "triage-slack-ignore-edits", "ignore", None),
    ("a deletion", sample("message.message_deleted"), "triage-slack-ignore-edits", "ignore", None),
    ("a join", sample("member_joined_channel"), "triage-slack-log-rest", "log", None),
    ("a private channel's file", sample("message.file_share.group"), "triage-slack-log-rest", "log", None),
    ("a thread broadcast", sample("message.thread_broadcast"), "triage-slack-log-rest", "log", None),
]


@pytest.mark.parametrize(
    ("event", "rule", "verdict", "tools"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
async def test_the_triage_policy_decides_dms_edits_deletions_and_joins_deliberately(
    example: tuple[AgentwakeConfig, Policy, Any],
    event: Sample,
    rule: str,
    verdict: str,
    tools: list[str] | None,
) -> None:
    cfg, policy, _ = example
    outcome = await decided(cfg, policy, event)
    assert (outcome.rule, outcome.verdict) == (rule, verdict), outcome.why
    if tools is not None:
        assert list(outcome.run.tools) == tools
        # The reply goes to the DM's own thread, whatever the model says.
        pinned = policy.rule(rule)
        assert pinned is not None and pinned.args["slack__reply_in_thread"]["channel"] == "{{ data.channel }}"


def test_the_slack_examples_subscriptions_are_the_bridges_events_with_pinned_replies() -> None:
    cfg = load_config(
        REPO / "examples" / "slack" / "agentwake.toml",
        env={"SLACK_BOT_TOKEN": "xoxb-token", "SLACK_APP_TOKEN": "xapp-token"},
    )
    assert {s.event for s in cfg.subscriptions} == {"app_mention", "message.im"}
    for subscription in cfg.subscriptions:
        assert subscription.event in slack_events.EVENT_TYPES
        jsonschema.validate(subscription.arguments, slack_events.ARGUMENTS_SCHEMAS[subscription.event])
        assert subscription.args["slack__reply_in_thread"] == {
            "channel": "{{ data.channel }}",
            "thread_ts": "{{ data.threadTs }}",
        }
