"""Signed sample deliveries to a bridge's webhook listener (``agentwake bridge send-test``).

The sample bodies ship in the package (agentwake/defaults/samples/NAME/EVENT.json), shaped as
each upstream sends them. A body is made fresh for each send: a string that is exactly one of the
placeholders below becomes a new value ($ID, $NODE_ID and $UUID a new one at each occurrence), so
every delivery is a new event (new ids, timestamps of now, which the bridges' staleness checks
accept). A PagerDuty incident.triggered names its incident, and an incident triggers once: sent
again, the bridge logs it as a duplicate. The bodies name what the playground's fakes hold
(agentwake/fakes/playground.py): acme/demo issue #1 and pull request #2, channel C0GENERAL,
incident QPLAYGROUND001, so the agent's tool calls land on something.

Standard library and aiohttp only: it runs in ``agentwake bridge send-test`` and in a bridge.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import string
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

SAMPLES: Final = Path(__file__).resolve().parent.parent / "defaults" / "samples"


@dataclass(frozen=True)
class Upstream:
    """How one upstream delivers its webhooks, and where its bridge expects them by default."""

    name: str
    title: str
    secret_env: str
    webhook_path: str


UPSTREAMS: Final = {
    "github": Upstream("github", "GitHub", "GITHUB_WEBHOOK_SECRET", "/webhook"),
    "slack": Upstream("slack", "Slack", "SLACK_SIGNING_SECRET", "/slack/events"),
    "pagerduty": Upstream("pagerduty", "PagerDuty", "PAGERDUTY_WEBHOOK_SECRET", "/webhook"),
}


class UnknownSample(LookupError):
    """No sample of that event type ships for that upstream."""


def sample_events(upstream: str) -> list[str]:
    """The event types a sample ships for, sorted."""
    return sorted(path.name.removesuffix(".json") for path in (SAMPLES / upstream).glob("*.json"))


def sample_body(upstream: str, event: str, *, now: datetime | None = None) -> dict[str, Any]:
    """The sample body of ``event``, its placeholders filled in afresh."""
    path = SAMPLES / upstream / f"{event}.json"
    if event not in sample_events(upstream):
        known = ", ".join(sample_events(upstream)) or "none"
        raise UnknownSample(f"no {upstream} sample for {event!r}; the samples: {known}")
    moment = now or datetime.now(UTC)
    values: dict[str, Any] = {
        "$NOW": moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "$NOW_MS": moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z",
        "$EPOCH": int(moment.timestamp()),
        "$TS": f"{moment.timestamp():.6f}",
        "$SLACK_EVENT_ID": "Ev"
        + "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(10)),
    }

    def filled(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: filled(item) for key, item in value.items()}
        if isinstance(value, list):
            return [filled(item) for item in value]
        if value == "$UUID":
            return str(uuid.uuid4())
        if value in ("$ID", "$NODE_ID"):  # a new object each time: GitHub's event ids are its ids
            number = secrets.randbelow(1_000_000_000) + 1_000_000_000
            return number if value == "$ID" else f"N_{number}"
        if isinstance(value, str) and value in values:
            return values[value]
        return value

    body: dict[str, Any] = filled(json.loads(path.read_text(encoding="utf-8")))
    return body


def signed_headers(upstream: str, event: str, body: bytes, secret: str) -> dict[str, str]:
    """The headers ``upstream`` sends with ``body``, signed with ``secret`` as it signs them."""
    headers = {"Content-Type": "application/json"}
    if upstream == "github":
        digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        headers |= {
            "User-Agent": "GitHub-Hookshot/agentwake-sample",
            "X-GitHub-Event": event.split(".", 1)[0],
            "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-GitHub-Hook-ID": "1",
            "X-Hub-Signature-256": f"sha256={digest}",
        }
    elif upstream == "slack":
        timestamp = str(int(time.time()))
        base = f"v0:{timestamp}:".encode() + body
        headers |= {
            "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest(),
        }
    elif upstream == "pagerduty":
        headers |= {
            "User-Agent": "PagerDuty-Webhook/V3.0",
            "X-PagerDuty-Signature": "v1=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest(),
            "X-Webhook-Id": str(uuid.uuid4()),
            "X-Webhook-Subscription": "PSUB0SAMPLE",
        }
    else:
        raise UnknownSample(f"no upstream named {upstream!r}; the upstreams: {', '.join(UPSTREAMS)}")
    return headers


@dataclass(frozen=True)
class Answer:
    """The bridge's answer to one delivery."""

    status: int
    body: Any


class Unreachable(OSError):
    """Nothing answered at the URL."""


async def send(url: str, upstream: str, event: str, secret: str, *, timeout_s: float = 30) -> Answer:
    """POST one fresh, signed sample delivery of ``event`` to ``url``; the bridge's answer."""
    import aiohttp

    body = json.dumps(sample_body(upstream, event)).encode()
    headers = signed_headers(upstream, event, body, secret)
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s), trust_env=False) as session,
            session.post(url, data=body, headers=headers) as answer,
        ):
            text = await answer.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise Unreachable(f"no bridge answered at {url}: {exc or type(exc).__name__}") from None
    try:
        parsed: Any = json.loads(text)
    except ValueError:
        parsed = text
    return Answer(answer.status, parsed)
