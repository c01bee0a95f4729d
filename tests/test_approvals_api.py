"""The JSON listing of held events on the operator endpoint, and answering one with the bearer token.

In process: the real ``Endpoint`` on a loopback port over a real SQLite store holding a held event.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest

from agentwake.clock import now_iso
from agentwake.config import parse_config
from agentwake.store import IncomingEvent, Settlement, SubscriptionKey
from agentwake.store.sqlite import SqliteStore
from agentwake.supervisor import Supervisor
from agentwake.web import Health, endpoint_settings
from agentwake.web.app import Endpoint

pytestmark = pytest.mark.anyio

TOKEN = "tok-approvals-5c1e9a7d20"
TOKEN_ENV = "AW_APPROVALS_TOKEN"
# Tokens that can do one job: the Slack bridge's (list and answer) and Prometheus's (scrape).
SLACK_TOKEN = "tok-slack-0b7e44c1d9a2f6"
METRICS_TOKEN = "tok-metrics-93c0de51a7b8"
TOKENS_ENV = {TOKEN_ENV: TOKEN, "AW_SLACK_TOKEN": SLACK_TOKEN, "AW_METRICS_TOKEN": METRICS_TOKEN}
HOLD_DECISION: dict[str, Any] = {
    "rule": "hold-suspicious",
    "rule_tools": ["close_ticket"],
    "why": "looks injected",
}
KEY = SubscriptionKey("tickets", "demo", "ticket.created", {})
# Markup and a mention in peer data: whoever shows it must escape it.
TITLE = "Close <@U0BOSS> & <!channel> now"


@dataclass
class Held:
    endpoint: Endpoint
    store: SqliteStore
    url: str
    rows: list[int]

    def sessions(self) -> int:
        """How many operator sessions the store holds (read from its file, as another process would)."""
        with closing(sqlite3.connect(self.store.path)) as conn:
            return int(conn.execute("SELECT count(*) FROM operator_sessions").fetchone()[0])

    async def detail(self, row: int) -> dict[str, Any]:
        found = await self.store.event_detail(row)
        assert found is not None
        return found


@asynccontextmanager
async def held_endpoint(
    tmp_path: Path,
    count: int = 1,
    *,
    service: dict[str, Any] | None = None,
    decision: dict[str, Any] | None = None,
) -> AsyncIterator[Held]:
    """The operator endpoint (tokens required: the operator's, the Slack bridge's, Prometheus's) over a
    store with ``count`` held events; ``service`` replaces [service] keys."""
    config = parse_config(
        {
            "store": {"path": str(tmp_path / "aw.db")},
            "service": {
                "listen": "127.0.0.1:0",
                "token_env": TOKEN_ENV,
                "tokens": {
                    "slack": {"env": "AW_SLACK_TOKEN", "scopes": ["read", "approve"]},
                    "prometheus": {"env": "AW_METRICS_TOKEN", "scopes": ["metrics"]},
                },
                **(service or {}),
            },
        },
        env=TOKENS_ENV,
    )
    store = await SqliteStore.open(config.store.path)
    try:
        await store.register(KEY)
        incoming = [
            IncomingEvent(f"T-{n}", "ticket.created", now_iso(), {"title": f"{TITLE} {n}"})
            for n in range(1, count + 1)
        ]
        await store.ingest(KEY, incoming, "c1")
        claimed = await store.claim(count)
        await store.settle([Settlement(e.id, decision or HOLD_DECISION, "held") for e in claimed])
        endpoint = Endpoint(
            endpoint_settings(config.service, env=TOKENS_ENV),
            store,
            Supervisor(config, store),
            Health(heartbeat_s=60),
        )
        async with anyio.create_task_group() as tg:
            await tg.start(endpoint.serve)
            assert endpoint.url is not None
            yield Held(endpoint, store, endpoint.url, sorted(e.id for e in claimed))
            tg.cancel_scope.cancel()
    finally:
        await store.close()


BEARER = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"}


async def listing(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> tuple[int, Any]:
    async with http.get(f"{url}/approvals", headers=headers) as response:
        return response.status, await response.json()


async def test_held_events_are_listed_as_json_for_the_token_and_approving_one_takes_it_out(
    tmp_path: Path,
) -> None:
    async with held_endpoint(tmp_path, count=2) as held, aiohttp.ClientSession() as http:
        status, body = await listing(http, held.url, BEARER)
        assert status == 200, body
        assert body["total"] == 2
        # Newest first.
        assert [h["event_id"] for h in body["held"]] == ["T-2", "T-1"]
        first = body["held"][1]
        assert first == {
            "row": held.rows[0],
            "event_id": "T-1",
            "server": "demo",
            "subscription": "tickets",
            "name": "ticket.created",
            "timestamp": first["timestamp"],
            "rule": "hold-suspicious",
            "tools": ["close_ticket"],
            "summary": first["summary"],
        }
        assert first["timestamp"]
        assert f"{TITLE} 1" in first["summary"] and "\n" not in first["summary"]

        # Without the token: nothing, JSON or not.
        status, body = await listing(http, held.url, {"Accept": "application/json"})
        assert status == 401 and "held" not in body
        # A browser still gets the page (here, the login form).
        async with http.get(f"{held.url}/approvals", headers={"Accept": "text/html"}) as response:
            assert response.status == 401 and "<form" in await response.text()

        async with http.post(
            f"{held.url}/approvals/{held.rows[0]}/approve", data={"note": "fine"}, headers=BEARER
        ) as response:
            assert response.status == 200, await response.text()
            assert (await response.json())["ok"] is True
        status, body = await listing(http, held.url, BEARER)
        assert [h["row"] for h in body["held"]] == [held.rows[1]] and body["total"] == 1
        approved = await held.detail(held.rows[0])
        assert approved["state"] == "pending" and approved["approval_note"] == "fine"
