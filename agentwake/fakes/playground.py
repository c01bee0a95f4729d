"""A bridge with its upstream faked in the same process: ``agentwake bridge NAME --fake``.

What ``agentwake init --example NAME`` configures, so that ``agentwake run`` shows the whole path
offline, from an installed agentwake: the packaged fake (agentwake/fakes) is served on a free
loopback port, the bridge's API base, token and webhook secret are pointed at it (the secret is
generated unless the bridge's variable holds one), and the fake holds what the sample deliveries
name (acme/demo issue #1 and pull request #2, channel C0GENERAL, incident QPLAYGROUND001 of the
Checkout API service).

Once a client reads events of the bridge's first type (agentwake's subscription is live, so what
comes next reaches it), the fake sends one event as its upstream would: a signed GitHub
``issues.opened`` delivery, a Slack mention (Socket Mode if connected, else the Events API), a P1
PagerDuty incident's V3 webhook. Each request the fake gets (the agent's tool calls) is printed.

While it runs, ``playground.json`` in the state dir (owner-only, as the dir) holds the webhook URL
and secret, for ``agentwake bridge send-test``; it is removed when the bridge stops. A short look
(agentwake check: no ingress) starts the fake for the tools but sends nothing and writes no file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import anyio

from agentwake.bridges.framework import ANY_TYPE, BridgeOptions, BridgeServer, announce
from agentwake.fakes import deliver

PLAYGROUND_FILE: Final = "playground.json"
REPO: Final = "acme/demo"
SERVICE: Final = "Checkout API"
INCIDENT: Final = "QPLAYGROUND001"
# The channel the triage policy posts incident summaries to.
INCIDENT_CHANNEL: Final = "C0123ABCD"
FIRST_EVENT: Final = {"github": "issues.opened", "slack": "app_mention", "pagerduty": "incident.triggered"}


def secret_from(value: str | None) -> str:
    """The webhook secret: the bridge's variable's, else a new one (the playground file holds it)."""
    return value or secrets.token_urlsafe(24)


def playground_file(state_dir: Path) -> Path:
    return state_dir / PLAYGROUND_FILE


def read_playground(state_dir: Path) -> dict[str, Any] | None:
    """What a running playground bridge wrote in ``state_dir``, or None."""
    try:
        found = json.loads(playground_file(state_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


async def serve(upstream: str, options: BridgeOptions, settings: Any, secret: str) -> None:
    """Serve the bridge of ``upstream`` (its ``settings`` as the command line made them) against
    its fake, until stopped. ValueError or OSError: a setting the bridge refuses, a port taken."""
    async with _fake(upstream, secret) as fake:
        bridge = _bridge(upstream, options, _pointed(upstream, settings, fake, secret))
        server = BridgeServer(bridge)
        title = deliver.UPSTREAMS[upstream].title
        announce(f"fake {title} on {fake.url} (in this process; its state is lost when the bridge stops)")
        try:
            async with anyio.create_task_group() as tg:
                if options.ingress:
                    tg.start_soon(_first_event, upstream, server, fake, secret)
                await server.serve()
                tg.cancel_scope.cancel()
        finally:
            if options.ingress:
                with contextlib.suppress(FileNotFoundError):
                    playground_file(options.state_dir).unlink()


@contextlib.asynccontextmanager
async def _fake(upstream: str, secret: str) -> AsyncIterator[Any]:
    title = deliver.UPSTREAMS[upstream].title
    if upstream == "github":
        from agentwake.fakes.github import FakeGitHub

        async with FakeGitHub() as github:
            github.add_repo(REPO)
            github.open_issue(REPO, title="Crash on start", body="The app exits at start since 2.4.")
            github.open_issue(
                REPO,
                title="Read the config as utf-8-sig",
                body="A config saved by Notepad starts with a BOM; this reads it.",
                user="hubot",
                pull_request=True,
            )
            github.on_request = lambda call: _show_request(title, call.method, call.path)
            yield github
    elif upstream == "slack":
        async with _shown_slack(title)(signing_secret=secret) as slack:
            slack.add_channel(INCIDENT_CHANNEL, "incidents")
            yield slack
    elif upstream == "pagerduty":
        from agentwake.fakes.pagerduty import FakePagerDuty

        # An account-level key, as most integrations use: the bridge writes as its From user.
        async with FakePagerDuty(account_key=True) as pagerduty:
            pagerduty.add_service(SERVICE)
            pagerduty.add_user("Dev Oncall", "dev@example.com")
            # The incident the sample deliveries name (agentwake bridge send-test), not announced.
            pagerduty.trigger(
                "Checkout latency above 2 s", service=SERVICE, priority="P1", incident_id=INCIDENT
            )
            pagerduty.on_request = lambda call: _show_request(title, call.method, call.path)
            yield pagerduty
    else:
        raise ValueError(f"no fake for {upstream!r}")


def _shown_slack(title: str) -> Any:
    """FakeSlack, printing each Web API call it gets (its own hook is for writes only)."""
    from aiohttp import web

    from agentwake.fakes.slack import FakeSlack

    class ShownSlack(FakeSlack):
        async def _api(self, request: web.Request) -> web.Response:
            args = dict(request.query)
            if request.content_type == "application/json" and request.can_read_body:
                body = await request.json()
                args |= body if isinstance(body, dict) else {}
            _show_request(title, request.method, request.match_info["method"], args.get("channel"))
            return await super()._api(request)

    return ShownSlack


def _show_request(title: str, verb: str, what: str, where: Any = None) -> None:
    announce(f"fake {title} got {verb.upper()} {what}" + (f" in {where}" if where else ""))


def _pointed(upstream: str, settings: Any, fake: Any, secret: str) -> Any:
    """``settings`` pointed at ``fake``: its URL, its credentials, the webhook secret."""
    if upstream == "github":
        return dataclasses.replace(
            settings, api_base=fake.url, token=fake.token, webhook_secret=secret.encode()
        )
    if upstream == "slack":
        app_token = fake.app_token if settings.app_token else None  # set: Socket Mode was asked for
        return dataclasses.replace(
            settings,
            api_base=fake.url,
            bot_token=fake.bot_token,
            app_token=app_token,
            signing_secret=secret.encode(),
        )
    return dataclasses.replace(
        settings,
        api_base=fake.url,
        api_key=fake.api_key,
        from_email=fake.bot["email"],
        webhook_secrets=(secret.encode(),),
    )


def _bridge(upstream: str, options: BridgeOptions, settings: Any) -> Any:
    if upstream == "github":
        from agentwake.bridges.github import GitHubBridge

        return GitHubBridge(options, settings)
    if upstream == "slack":
        from agentwake.bridges.slack import SlackBridge

        return SlackBridge(options, settings)
    from agentwake.bridges.pagerduty import PagerDutyBridge

    return PagerDutyBridge(options, settings)


async def _first_event(upstream: str, server: BridgeServer, fake: Any, secret: str) -> None:
    await server.watched(ANY_TYPE).wait()
    url = None
    if server.webhook_address is not None:
        port = server.webhook_address[1]
        url = f"http://127.0.0.1:{port}{server.options.webhook_path}"
        _write_playground(server.options.state_dir, {"webhook": url, "secret": secret, "fake": fake.url})
    first = FIRST_EVENT[upstream]
    await server.watched(first).wait()
    if upstream == "github":
        if url is None:
            announce("no --listen: no first event (the fake GitHub sends webhooks only)")
            return
        answer = await deliver.send(url, "github", first, secret)
        announce(f"the fake GitHub sent {first} (issue #1): HTTP {answer.status}")
    elif upstream == "slack":
        from agentwake.fakes.slack import BOT_USER, CHANNEL

        fake.events_url = url
        _, bodies = fake.say(
            CHANNEL, f"<@{BOT_USER}> checkout returns 500 since the deploy, is anything known?"
        )
        for body in bodies:
            await fake.emit(body)
        announce(f"the fake Slack sent a mention of the app in {CHANNEL}")
    else:
        if url is None:
            announce("no --listen: no first event (the fake PagerDuty sends webhooks only)")
            return
        fake.webhook_url, fake.webhook_secret = url, secret
        incident = fake.trigger(
            "Checkout error rate above 5%", service=SERVICE, urgency="high", priority="P1"
        )
        announce(f"the fake PagerDuty triggered P1 incident {incident['id']} on {SERVICE}")


def _write_playground(state_dir: Path, content: dict[str, str]) -> None:
    path = playground_file(state_dir)
    temporary = path.with_suffix(".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(content, handle)
    temporary.replace(path)
