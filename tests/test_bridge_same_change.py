"""One upstream change is one event, whichever ingress saw it first (issue 31, "Nothing lost, nothing
twice"): for every GitHub and PagerDuty event type that both webhooks and polling produce, a webhook
then a poll, and a poll then a webhook, store it once.

Where the upstream gives the change no id both ingresses see, its two sightings are dated by two
clocks, as on the real upstreams: PagerDuty's webhook ``occurred_at`` has milliseconds and its log
entry's ``created_at`` whole seconds (here 12:00:00.950 against 12:00:01), and GitHub's webhook and
events feed carry snapshots of a pull request taken moments apart (here two seconds). The bridges run
in process against the fakes, with real signed webhook POSTs and real poll rounds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import test_github_bridge as github_tests
import test_pagerduty_bridge as pagerduty_tests

from agentwake.bridges.log import EventLog, NewEvent
from agentwake.fakes.github import FakeGitHub
from agentwake.fakes.pagerduty import FakePagerDuty

pytestmark = pytest.mark.anyio

REPO = "acme/x"
ORDERS = ["webhook then poll", "poll then webhook"]


def later(stamp: str, seconds: float) -> str:
    moment = datetime.fromisoformat(stamp.replace("Z", "+00:00")) + timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# Each makes one change on the fake GitHub and returns its webhook (X-GitHub-Event, body).
GitHubChange = Callable[[FakeGitHub], tuple[str, dict[str, Any]]]


def issue_opened(github: FakeGitHub) -> tuple[str, dict[str, Any]]:
    issue = github.open_issue(REPO, title="Crash on start")
    return "issues", github.webhook_issue_opened(REPO, issue["number"])


def comment_created(github: FakeGitHub) -> tuple[str, dict[str, Any]]:
    issue = github.open_issue(REPO, title="Crash on start")
    comment = github.add_comment(REPO, issue["number"], body="Me too", user="hubot")
    return "issue_comment", github.webhook_issue_comment_created(REPO, issue["number"], comment["id"])


def pull_request_opened(github: FakeGitHub) -> tuple[str, dict[str, Any]]:
    pull = github.open_issue(REPO, title="Fix the crash", pull_request=True)
    return "pull_request", github.webhook_pull_request(REPO, pull["number"], "opened")


def review_requested(github: FakeGitHub) -> tuple[str, dict[str, Any]]:
    pull = github.open_issue(REPO, title="Fix the crash", pull_request=True)
    github.request_review(REPO, pull["number"], "hubot")
    body = github.webhook_pull_request(REPO, pull["number"], "review_requested", requested_reviewer="hubot")
    # The webhook's snapshot of the pull request is two seconds younger than the feed's.
    body["pull_request"]["updated_at"] = later(body["pull_request"]["updated_at"], 2)
    return "pull_request", body


def workflow_run_failed(github: FakeGitHub) -> tuple[str, dict[str, Any]]:
    run = github.fail_workflow_run(REPO)
    return "workflow_run", github.webhook_workflow_run_completed(REPO, run["id"])


def release_published(github: FakeGitHub) -> tuple[str, dict[str, Any]]:
    release = github.publish_release(REPO, tag="v1.2.0", name="1.2.0", body="Fixes the crash")
    return "release", github.webhook_release_published(REPO, release["id"])


def discussion_created(github: FakeGitHub) -> tuple[str, dict[str, Any]]:
    discussion = github.start_discussion(REPO, title="How do I configure it?", category="Q&A")
    return "discussion", github.webhook_discussion_created(REPO, discussion["number"])


def alert_created(kind: str) -> GitHubChange:
    def change(github: FakeGitHub) -> tuple[str, dict[str, Any]]:
        add = {
            "dependabot_alert": github.add_dependabot_alert,
            "code_scanning_alert": github.add_code_scanning_alert,
            "secret_scanning_alert": github.add_secret_scanning_alert,
        }[kind]
        alert = add(REPO)
        return kind, github.webhook_alert_created(REPO, kind, alert["number"])

    return change


GITHUB_CHANGES: dict[str, GitHubChange] = {
    "issues.opened": issue_opened,
    "issue_comment.created": comment_created,
    "pull_request.opened": pull_request_opened,
    "pull_request.review_requested": review_requested,
    "workflow_run.completed": workflow_run_failed,
    "release.published": release_published,
    "discussion.created": discussion_created,
    "dependabot_alert.created": alert_created("dependabot_alert"),
    "code_scanning_alert.created": alert_created("code_scanning_alert"),
    "secret_scanning_alert.created": alert_created("secret_scanning_alert"),
}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("event_type", list(GITHUB_CHANGES))
async def test_a_github_change_seen_by_webhook_and_by_poll_is_one_event(
    tmp_path: Path, event_type: str, order: str
) -> None:
    async with (
        FakeGitHub(token=github_tests.TOKEN) as github,
        github_tests.in_process(tmp_path, github, repos=(REPO,)) as bridge,
    ):
        github.add_repo(REPO)
        await bridge.bridge.poll_repo(REPO)  # the baseline
        kind, body = GITHUB_CHANGES[event_type](github)

        async def by_webhook() -> None:
            status, answer = await bridge.hook.deliver(kind, body)
            assert (status, answer["status"]) == (202, "accepted")

        steps = [by_webhook, lambda: bridge.bridge.poll_repo(REPO)]
        for step in steps if order == ORDERS[0] else steps[::-1]:
            await step()
        polled = await bridge.wire.poll(event_type, "0")
        assert len(polled["events"]) == 1, github_tests.ids(polled)


PAGERDUTY_CHANGES = {
    "incident.triggered": lambda pd, incident, user: None,
    "incident.acknowledged": lambda pd, incident, user: pd.acknowledge(incident, user),
    "incident.escalated": lambda pd, incident, user: pd.escalate(incident, 2, user),
    "incident.resolved": lambda pd, incident, user: pd.resolve(incident, user),
}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("event_type", list(PAGERDUTY_CHANGES))
async def test_a_pagerduty_change_seen_by_webhook_and_by_poll_is_one_event(
    tmp_path: Path, event_type: str, order: str
) -> None:
    async with (
        FakePagerDuty(api_key=pagerduty_tests.KEY) as pd,
        pagerduty_tests.in_process(tmp_path, pd) as bridge,
    ):
        grace = pd.add_user("Grace Hopper", "grace@example.com")
        assert await bridge.bridge.poll_once() == 30.0  # the baseline
        incident = pd.trigger("Checkout error rate above 5%")["id"]
        PAGERDUTY_CHANGES[event_type](pd, incident, grace)
        [entry] = [e for e in pd.log_entries() if e["incident"]["id"] == incident][:1]
        # The log entry says 12:00:01; the webhook says 12:00:00.950.
        stamped = datetime.fromisoformat(entry["created_at"].replace("Z", "+00:00"))
        payload = pd.webhook(event_type, incident, occurred_at=stamped - timedelta(milliseconds=50))

        async def by_webhook() -> None:
            status, answer = await bridge.hook.deliver(payload)
            assert (status, answer["status"]) == (202, "accepted"), answer

        async def by_poll() -> None:
            await bridge.bridge.poll_once()

        for step in [by_webhook, by_poll] if order == ORDERS[0] else [by_poll, by_webhook]:
            await step()
        assert len(await bridge.poll(event_type)) == 1
        # Both ingresses did see it: the poll read the change's log entry (the trigger's, at least).
        assert len(await bridge.poll("incident.triggered")) == 1


def test_the_same_change_is_recognised_only_within_its_tolerance_and_under_its_own_prefix(
    tmp_path: Path,
) -> None:
    log = EventLog(tmp_path / "events.db")
    at = datetime(2026, 1, 1, 12, 0, 1, tzinfo=UTC)

    def acknowledged(incident: str, moment: datetime) -> NewEvent:
        prefix = f"incident.acknowledged:{incident}:"
        return NewEvent(
            "incident.acknowledged",
            prefix + moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
            moment,
            {},
            same_prefix=prefix,
            same_within=timedelta(seconds=10),
        )

    try:
        assert log.append([acknowledged("P1", at)], source="poll") == ["incident.acknowledged"]
        assert log.append([acknowledged("P1", at - timedelta(milliseconds=50))], source="webhook") == []
        assert log.append([acknowledged("P1", at + timedelta(seconds=10))], source="webhook") == []
        # Another incident whose id starts like it, and the same incident a minute later, are news.
        assert len(log.append([acknowledged("P12", at)], source="poll")) == 1
        assert len(log.append([acknowledged("P1", at + timedelta(minutes=1))], source="poll")) == 1
        events = log.read("incident.acknowledged", 0, 10).events
        assert [json.dumps(e.event_id) for e in events] == [
            json.dumps("incident.acknowledged:P1:2026-01-01T12:00:01Z"),
            json.dumps("incident.acknowledged:P12:2026-01-01T12:00:01Z"),
            json.dumps("incident.acknowledged:P1:2026-01-01T12:01:01Z"),
        ]
    finally:
        log.close()
