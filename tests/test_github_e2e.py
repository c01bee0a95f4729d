"""The GitHub bridge end to end: GitHub's signed webhooks (or its API, polled) → ``agentwake bridge
github`` → ``agentwake run`` over poll, push and webhook delivery → a scripted LLM → tool calls that
reach the fake GitHub API.

Everything is real and on loopback: the bridge is the stdio server ``agentwake run`` starts, the
deliveries are signed as GitHub signs them (HMAC-SHA256 of the raw body with the webhook secret),
MCP webhook delivery goes over TLS (trustme) to agentwake's receiver, the LLM is tests/fake_llm.py
and GitHub is agentwake/fakes/github.py. One ``agentwake run`` covers the three delivery modes: each
subscription filters one repository, so each delivery mode carries its own issue.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from _support import (
    RunningService,
    agentwake_run,
    bootstrapped,
    bridge_server_toml,
    settled,
    write_bridge_config,
)
from conftest import free_port
from fake_llm import FakeLLM, Reply, text, tool_calls

from agentwake.fakes.github import FakeGitHub

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SECRET = "it's a secret to everybody"
MODES = {"poll": "acme/poll", "push": "acme/push", "webhook": "acme/hook"}
POLICY = """
[[rules]]
name = "label-new-issues"
action = "agent"
tools = ["github__get_issue", "github__add_labels"]
match.event = "issues.opened"

[[rules]]
name = "comment-on-polled-issues"
action = "agent"
tools = ["github__comment"]
match.event = "issue_comment.created"
"""


def signed(body: bytes, secret: str = SECRET) -> str:
    """X-Hub-Signature-256 as GitHub computes it."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass
class Hook:
    url: str

    async def deliver(
        self,
        event: str,
        payload: dict[str, Any],
        *,
        delivery: str | None = None,
        secret: str = SECRET,
        signature: str | None = None,
    ) -> tuple[int, dict[str, Any]]:
        body = json.dumps(payload).encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/e2e",
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
            "X-GitHub-Hook-ID": "1",
            "X-Hub-Signature-256": signature if signature is not None else signed(body, secret),
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.url, data=body, headers=headers) as answer,
        ):
            return answer.status, await answer.json()


def label_what_the_prompt_names(body: dict[str, Any]) -> Reply:
    """The scripted model: label the issue the event names; once the tool answered, stop."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return text("done")
    prompt = "\n".join(str(m.get("content")) for m in messages if m["role"] == "user")
    repo = re.search(r"acme/[a-z]+", prompt)
    number = re.search(r'"number":\s*(\d+)', prompt)
    assert repo and number, prompt
    if "issue_comment.created" in prompt:
        return tool_calls(
            (
                "github__comment",
                {"repository": repo.group(0), "number": int(number.group(1)), "body": "Thanks!"},
            )
        )
    return tool_calls(
        (
            "github__add_labels",
            {"repository": repo.group(0), "number": int(number.group(1)), "labels": ["triage"]},
        )
    )


def write_config(
    tmp_path: Path,
    github: FakeGitHub,
    llm: FakeLLM,
    *,
    bridge_args: list[str],
    subscriptions: str,
    webhook: bool,
) -> Path:
    server = bridge_server_toml(
        "github",
        tmp_path / "bridge",
        ["--api-base", github.url, *bridge_args],
        ["GITHUB_WEBHOOK_SECRET:-", "GITHUB_TOKEN"],
    )
    if webhook:
        port = free_port()
        subscriptions += (
            "\n[webhook]\n"
            f'listen = "127.0.0.1:{port}"\n'
            f'public_url = "https://127.0.0.1:{port}/hooks"\n'
            f'tls_cert = "{tmp_path / "receiver.pem"}"\n'
            f'tls_key = "{tmp_path / "receiver.pem"}"\n'
        )
    return write_bridge_config(tmp_path, server, llm.url, subscriptions, policies=("10-github.toml", POLICY))


def trust(tmp_path: Path) -> Path:
    """A CA and the receiver's certificate from it; the CA file the bridge trusts for delivery."""
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "receiver.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    return tmp_path / "ca.pem"


@asynccontextmanager
async def upstreams() -> AsyncIterator[tuple[FakeGitHub, FakeLLM]]:
    async with FakeGitHub(token="gh-test-token") as github, FakeLLM() as llm:
        llm.responder = label_what_the_prompt_names
        for repo in (*MODES.values(), "acme/polled"):
            github.add_repo(repo)
        yield github, llm


def webhook_url(service: RunningService, index: int) -> str:
    found = re.search(r"webhooks on (http://\S+)", service.lines[index])
    assert found, service.lines[index]
    return found.group(1)


async def test_signed_webhooks_reach_the_agent_over_poll_push_and_webhook_delivery(tmp_path: Path) -> None:
    ca = trust(tmp_path)
    subscriptions = "".join(
        f'[[subscriptions]]\nname = "{mode}-issues"\nserver = "github"\nevent = "issues.opened"\n'
        f'delivery = "{mode}"\narguments = {{ repository = "{repo}" }}\n\n'
        for mode, repo in MODES.items()
    )
    async with upstreams() as (github, llm):
        config = write_config(
            tmp_path,
            github,
            llm,
            bridge_args=[
                "--listen",
                "127.0.0.1:0",
                "--events-webhook-allow",
                "127.0.0.0/8",
                "--events-webhook-ca",
                str(ca),
            ],
            subscriptions=subscriptions,
            webhook=True,
        )
        env = {"GITHUB_WEBHOOK_SECRET": SECRET, "GITHUB_TOKEN": "gh-test-token", "FAKE_LLM_KEY": "sk-test"}
        async with agentwake_run(config, **env) as service:
            hook = Hook(webhook_url(service, await service.wait_for("webhooks on http://")))
            await bootstrapped(tmp_path / "aw.db", [f"{mode}-issues" for mode in MODES], service)

            # Refused: a wrong signature, a missing one, and a stale event; none reach the log.
            forged = github.open_issue("acme/poll", title="forged", body="pay me")
            status, answer = await hook.deliver(
                "issues", github.webhook_issue_opened("acme/poll", forged["number"]), secret="wrong"
            )
            assert status == 401, answer
            status, _ = await hook.deliver(
                "issues", github.webhook_issue_opened("acme/poll", forged["number"]), signature=""
            )
            assert status == 401
            stale = github.webhook_issue_opened("acme/poll", forged["number"])
            stale["issue"]["created_at"] = (datetime.now(UTC) - timedelta(days=3)).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            )
            status, answer = await hook.deliver("issues", stale)
            assert status == 400 and "stale" in answer["error"], answer
            status, answer = await hook.deliver("ping", {"zen": "Keep it logically awesome.", "hook_id": 1})
            assert (status, answer["status"]) == (200, "pong")

            # One issue per delivery mode, each delivered once; then the first delivery replayed.
            deliveries, numbers = {}, {}
            for mode, repo in MODES.items():
                numbers[mode] = github.open_issue(
                    repo, title=f"crash in {mode}", body="It crashes on start."
                )["number"]
                deliveries[mode] = str(uuid.uuid4())
                status, answer = await hook.deliver(
                    "issues", github.webhook_issue_opened(repo, numbers[mode]), delivery=deliveries[mode]
                )
                assert (status, answer["status"]) == (202, "accepted"), answer
            replayed = github.webhook_issue_opened(MODES["poll"], numbers["poll"])
            status, answer = await hook.deliver("issues", replayed, delivery=deliveries["poll"])
            assert (status, answer["status"]) == (200, "duplicate"), answer

            for mode, repo in MODES.items():
                call = await github.wait_for(
                    "POST", f"/repos/{repo}/issues/{numbers[mode]}/labels", timeout=60
                )
                assert call.json == {"labels": ["triage"]}
                assert call.headers["Authorization"] == "Bearer gh-test-token"
            # Exactly one event per delivery mode reached the inbox, and each one's run completed.
            runs = await settled(tmp_path / "aw.db", len(MODES))
            assert sorted(runs) == sorted((f"{mode}-issues", "done") for mode in MODES), service.log()
        assert len(github.calls("POST", "/repos/")) == 3
        assert not any("forged" in json.dumps(request) for request in llm.requests)


async def test_polled_issues_and_comments_reach_the_agent(tmp_path: Path) -> None:
    subscriptions = (
        '[[subscriptions]]\nname = "polled-issues"\nserver = "github"\nevent = "issues.opened"\n'
        'delivery = "push"\narguments = { repository = "acme/polled" }\n\n'
        '[[subscriptions]]\nname = "polled-comments"\nserver = "github"\nevent = "issue_comment.created"\n'
        'delivery = "poll"\n\n'
    )
    async with upstreams() as (github, llm):
        github.poll_interval_s = 1
        old = github.open_issue("acme/polled", title="from before the bridge started")
        config = write_config(
            tmp_path,
            github,
            llm,
            bridge_args=["--poll", "--repo", "acme/polled", "--poll-interval", "1"],
            subscriptions=subscriptions,
            webhook=False,
        )
        env = {"GITHUB_WEBHOOK_SECRET": "", "GITHUB_TOKEN": "gh-test-token", "FAKE_LLM_KEY": "sk-test"}
        async with agentwake_run(config, **env) as service:
            await bootstrapped(tmp_path / "aw.db", ["polled-issues", "polled-comments"], service)
            # The bridge's first poll is its baseline: what it saw then is history, not news.
            await github.wait_for("GET", "/repos/acme/polled/issues", timeout=30)
            issue = github.open_issue("acme/polled", title="login page is blank", body="Since today.")
            call = await github.wait_for(
                "POST", f"/repos/acme/polled/issues/{issue['number']}/labels", timeout=60
            )
            assert call.json == {"labels": ["triage"]}
            github.add_comment("acme/polled", issue["number"], body="Same here, on Firefox.")
            call = await github.wait_for(
                "POST", f"/repos/acme/polled/issues/{issue['number']}/comments", timeout=60
            )
            assert call.json == {"body": "Thanks!"}
            # Conditional requests: the ETag of the last answer went back, and 304s came.
            events_polls = github.calls("GET", "/repos/acme/polled/events")
            assert any("If-None-Match" in request.headers for request in events_polls[1:])
        assert not github.calls("POST", f"/repos/acme/polled/issues/{old['number']}/labels")
