"""New security alerts by polling (issue 31): the poller lists each repository's Dependabot, code scanning
and secret scanning alerts, newest first, back to the newest it saw, and emits each new one as the
webhook's ``<kind>.created`` with the webhook's id and fields.

The bridge runs in process (tests/test_github_bridge.py's ``in_process``) against
agentwake/fakes/github.py, whose alert lists are REST-shaped, paginated and conditional as GitHub's
are, and can be switched off as GitHub answers when a repository lacks the feature. Each test drives
the poll rounds itself (``poll_repo``), so a round happens exactly when the test says.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from jsonschema import Draft202012Validator
from test_github_bridge import TOKEN, in_process
from test_github_poll_pages import read_all

from agentwake.bridges import github_alert_events
from agentwake.bridges.github_api import GitHubAPI
from agentwake.bridges.github_events import EVENT_TYPES, PAYLOAD_SCHEMAS, from_webhook
from agentwake.fakes._http import serve
from agentwake.fakes.github import FakeGitHub

pytestmark = pytest.mark.anyio

REPO = "acme/x"
OTHER = "acme/y"
LEAKED = "aio_ThisIsTheLeakedSecretValue0123456789"
KINDS = github_alert_events.KINDS
AN_HOUR_AGO = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
async def github() -> AsyncIterator[FakeGitHub]:
    async with FakeGitHub(token=TOKEN) as fake:
        fake.add_repo(REPO)
        yield fake


def add_one(github: FakeGitHub, kind: str, repo: str = REPO, **fields: Any) -> dict[str, Any]:
    adders = {
        "dependabot_alert": github.add_dependabot_alert,
        "code_scanning_alert": github.add_code_scanning_alert,
        "secret_scanning_alert": github.add_secret_scanning_alert,
    }
    return adders[kind](repo, **fields)


def alert_calls(github: FakeGitHub, kind: str, repo: str = REPO) -> list[Any]:
    path = {"dependabot_alert": "dependabot", "code_scanning_alert": "code-scanning"}.get(
        kind, "secret-scanning"
    )
    return github.calls("GET", f"/repos/{repo}/{path}/alerts")


def refusal_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "not polling it again" in r.getMessage()]


async def test_alerts_created_between_two_polls_arrive_once_each_as_the_webhook_maps_them(
    tmp_path: Path, github: FakeGitHub
) -> None:
    for kind in KINDS:
        add_one(github, kind, created_at=AN_HOUR_AGO)  # before the first poll: history, never emitted
    async with in_process(tmp_path, github, repos=(REPO,)) as bridge:
        await bridge.bridge.poll_repo(REPO)
        start = str(bridge.head())
        assert start == "0"
        new = {
            "dependabot_alert": github.add_dependabot_alert(REPO, package="lodash", severity="critical"),
            "code_scanning_alert": github.add_code_scanning_alert(REPO, rule_id="py/path-injection"),
            "secret_scanning_alert": github.add_secret_scanning_alert(REPO, secret=LEAKED),
        }
        await bridge.bridge.poll_repo(REPO)
        before = {kind: len(alert_calls(github, kind)) for kind in KINDS}
        await bridge.bridge.poll_repo(REPO)  # unchanged: one conditional GET each, nothing stored again
        assert {kind: len(alert_calls(github, kind)) - before[kind] for kind in KINDS} == dict.fromkeys(
            KINDS, 1
        )
        assert bridge.head() == 3

        for kind, alert in new.items():
            polled = await bridge.wire.poll(f"{kind}.created", start)
            [event] = polled["events"]
            webhook = from_webhook(kind, github.webhook_alert_created(REPO, kind, alert["number"]))
            assert webhook is not None
            assert event["eventId"] == webhook.event_id == f"{kind}.created:{REPO}:2"
            assert event["data"] == json.loads(json.dumps(webhook.data, default=str)), kind
            errors = list(Draft202012Validator(PAYLOAD_SCHEMAS[f"{kind}.created"]).iter_errors(event["data"]))
            assert not errors, errors

        data = (await bridge.wire.poll("dependabot_alert.created", start))["events"][0]["data"]
        assert (data["package"], data["severity"], data["ecosystem"], data["patchedVersion"]) == (
            "lodash",
            "critical",
            "npm",
            "7.5.2",
        )
        assert (data["actor"], data["actorType"], data["state"]) == ("github", "Organization", "open")
        data = (await bridge.wire.poll("code_scanning_alert.created", start))["events"][0]["data"]
        assert (data["ruleId"], data["severity"], data["tool"], data["ref"], data["path"]) == (
            "py/path-injection",
            "high",
            "CodeQL",
            "refs/heads/main",
            "src/db.js",
        )
        assert data["url"] == f"https://github.com/{REPO}/security/code-scanning/2"
        # Reopenings stay webhook only.
        for kind in KINDS:
            assert (await bridge.wire.poll(f"{kind}.reopened", "0"))["events"] == []


async def test_a_bridge_that_polled_before_alerts_were_polled_takes_the_older_alerts_for_history(
    tmp_path: Path, github: FakeGitHub
) -> None:
    half_an_hour_ago = (datetime.now(UTC) - timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    github.add_dependabot_alert(REPO, created_at=half_an_hour_ago)
    async with in_process(tmp_path, github, repos=(REPO,)) as bridge:
        # Its other feeds began an hour ago; its alert lists begin now.
        bridge.server.log.set_state(f"{REPO}:since", AN_HOUR_AGO)
        await bridge.bridge.poll_repo(REPO)
        assert (await bridge.wire.poll("dependabot_alert.created", "0"))["events"] == []
        alert = github.add_dependabot_alert(REPO)
        await bridge.bridge.poll_repo(REPO)
        polled = await bridge.wire.poll("dependabot_alert.created", "0")
        assert [e["data"]["number"] for e in polled["events"]] == [alert["number"]]


async def test_150_alerts_between_two_polls_are_read_over_two_pages_and_stored_once_each(
    tmp_path: Path, github: FakeGitHub, caplog: pytest.LogCaptureFixture
) -> None:
    github.add_dependabot_alert(REPO, created_at=AN_HOUR_AGO)
    async with in_process(tmp_path, github, repos=(REPO,)) as bridge:
        await bridge.bridge.poll_repo(REPO)
        start = str(bridge.head())
        for n in range(160):
            github.add_dependabot_alert(REPO, package=f"package-{n}")
        before = len(alert_calls(github, "dependabot_alert"))
        await bridge.bridge.poll_repo(REPO)
        # 100 a page: the second holds alert 1, which the first poll saw.
        assert len(alert_calls(github, "dependabot_alert")) - before == 2
        await bridge.bridge.poll_repo(REPO)

        ids, truncated, _ = await read_all(bridge, "dependabot_alert.created", start)
        assert ids == [f"dependabot_alert.created:{REPO}:{n}" for n in range(2, 162)]  # oldest first, once
        assert not any(truncated)
        assert bridge.head() == 160
    assert not [r for r in caplog.records if "recorded as a gap" in r.getMessage()]


async def test_alerts_past_the_page_bound_are_recorded_as_a_gap_of_that_kind(
    tmp_path: Path, github: FakeGitHub
) -> None:
    async with in_process(tmp_path, github, repos=(REPO,), poll_max_pages=1) as bridge:
        await bridge.bridge.poll_repo(REPO)
        for n in range(150):
            github.add_code_scanning_alert(REPO, rule_id=f"rule-{n}")
        await bridge.bridge.poll_repo(REPO)
        ids, truncated, _ = await read_all(bridge, "code_scanning_alert.created", "0")
        assert len(ids) == 100 and truncated[0] is True
        _, truncated, _ = await read_all(bridge, "dependabot_alert.created", "0")
        assert not any(truncated)


async def test_a_repository_without_the_feature_is_warned_about_once_per_kind_and_left_alone(
    tmp_path: Path, github: FakeGitHub, caplog: pytest.LogCaptureFixture
) -> None:
    github.add_repo(OTHER)
    github.disable_alerts(REPO, "dependabot_alert")  # 403 "Dependabot alerts are disabled ..."
    github.disable_alerts(REPO, "secret_scanning_alert")  # 404 "Secret scanning is disabled ..."
    caplog.set_level(logging.WARNING, logger="agentwake.bridge.github")
    async with in_process(tmp_path, github, repos=(REPO, OTHER)) as bridge:
        for repo in (REPO, OTHER):
            await bridge.bridge.poll_repo(repo)
        start = str(bridge.head())
        for kind in KINDS:
            for repo in (REPO, OTHER):
                add_one(github, kind, repo)
        issue = github.open_issue(REPO, title="Still seen")
        for _ in range(3):
            for repo in (REPO, OTHER):
                await bridge.bridge.poll_repo(repo)

        warnings = refusal_warnings(caplog)
        assert len(warnings) == 2, warnings
        dependabot, secret = sorted(warnings, key=lambda w: "secret" in w)
        assert REPO in dependabot and "403" in dependabot and "Dependabot alerts are disabled" in dependabot
        assert (
            "enable Dependabot alerts" in dependabot and '"Dependabot alerts" read permission' in dependabot
        )
        assert "404" in secret and "enable secret scanning" in secret
        # Asked once, never again; the kind that works, and the other repository, go on.
        assert len(alert_calls(github, "dependabot_alert")) == 1
        assert len(alert_calls(github, "secret_scanning_alert")) == 1
        assert len(alert_calls(github, "code_scanning_alert")) == 4
        assert len(alert_calls(github, "dependabot_alert", OTHER)) == 4

        def repos(result: dict[str, Any]) -> list[str]:
            return sorted(event["data"]["repository"] for event in result["events"])

        assert repos(await bridge.wire.poll("dependabot_alert.created", start)) == [OTHER]
        assert repos(await bridge.wire.poll("secret_scanning_alert.created", start)) == [OTHER]
        assert repos(await bridge.wire.poll("code_scanning_alert.created", start)) == [REPO, OTHER]
        polled = await bridge.wire.poll("issues.opened", start)
        assert [e["eventId"] for e in polled["events"]] == [f"issues.opened:{issue['id']}"]


async def test_a_passing_failure_of_one_alert_list_is_retried_and_loses_nothing(
    tmp_path: Path, github: FakeGitHub, caplog: pytest.LogCaptureFixture
) -> None:
    async with in_process(tmp_path, github, repos=(REPO,)) as bridge:
        await bridge.bridge.poll_repo(REPO)
        alert = github.add_dependabot_alert(REPO)
        github.disable_alerts(REPO, "dependabot_alert", status=502, message="Server Error")
        code = github.add_code_scanning_alert(REPO)
        await bridge.bridge.poll_repo(REPO)
        assert refusal_warnings(caplog) == []
        assert any("502" in r.getMessage() for r in caplog.records)
        polled = await bridge.wire.poll("code_scanning_alert.created", "0")
        assert [e["data"]["number"] for e in polled["events"]] == [code["number"]]
        github.enable_alerts(REPO, "dependabot_alert")
        await bridge.bridge.poll_repo(REPO)
        polled = await bridge.wire.poll("dependabot_alert.created", "0")
        assert [e["eventId"] for e in polled["events"]] == [
            f"dependabot_alert.created:{REPO}:{alert['number']}"
        ]


async def test_the_secret_is_never_asked_for_nor_kept(tmp_path: Path, github: FakeGitHub) -> None:
    async with in_process(tmp_path, github, repos=(REPO,)) as bridge:
        await bridge.bridge.poll_repo(REPO)
        polled_alert = github.add_secret_scanning_alert(REPO, secret=LEAKED)
        await bridge.bridge.poll_repo(REPO)
        assert all(c.query.get("hide_secret") == "true" for c in alert_calls(github, "secret_scanning_alert"))

        # And by webhook, whose payload carries the secret: neither the event nor its raw payload keeps it.
        hooked = github.add_secret_scanning_alert(REPO, secret=LEAKED)
        status, answer = await bridge.hook.deliver(
            "secret_scanning_alert",
            github.webhook_alert_created(REPO, "secret_scanning_alert", hooked["number"]),
        )
        assert (status, answer["status"]) == (202, "accepted")
        polled = await bridge.wire.poll("secret_scanning_alert.created", "0")
        assert [e["data"]["number"] for e in polled["events"]] == [polled_alert["number"], hooked["number"]]
        assert LEAKED not in json.dumps(polled)
        for event in polled["events"]:
            raw = bridge.server.log.raw(event["eventId"])
            assert raw is not None and LEAKED not in json.dumps(raw)


async def test_the_client_drops_a_secret_the_upstream_sends_anyway() -> None:
    item = {"number": 1, "secret_type": "adafruit_io_key", "secret": LEAKED}

    async def alerts(request: web.Request) -> web.Response:
        assert request.query["hide_secret"] == "true"
        port = request.url.port
        link = f'<http://127.0.0.1:{port}/repos/octo/x/secret-scanning/alerts?hide_secret=true&page=2>; rel="next"'
        headers = {"Link": link} if "page" not in request.query else {}
        return web.json_response([item], headers=headers)

    app = web.Application()
    app.router.add_get("/repos/octo/x/secret-scanning/alerts", alerts)
    runner = await serve(app, 0)
    try:
        port = runner.addresses[0][1]
        async with GitHubAPI(base_url=f"http://127.0.0.1:{port}", token=TOKEN) as api:
            first = await api.security_alerts("octo/x", "secret_scanning_alert")
            second = await api.next_page(first)
            assert second is not None
            assert first.items == second.items == [{"number": 1, "secret_type": "adafruit_io_key"}]
    finally:
        await runner.cleanup()


def test_created_says_polling_and_reopened_says_webhook_only() -> None:
    for kind in KINDS:
        assert "polling" in EVENT_TYPES[f"{kind}.created"]
        assert "webhook only" in EVENT_TYPES[f"{kind}.reopened"]
