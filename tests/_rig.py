"""The agent test rig: a real demo server over stdio, a ConnectionPool, a real Store and the fake LLM.

The ``rig`` fixture (in conftest.py) builds one; tests drive the agent through it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import demo_stdio
from fake_llm import FakeLLM

from agentwake.agent.runner import AgentRunner, RunResult
from agentwake.agent.tools import ConnectionPool
from agentwake.clock import utc_now
from agentwake.config import AgentwakeConfig, parse_config
from agentwake.decide import decide
from agentwake.delivery.common import subscription_key
from agentwake.mcp import ServerConnection
from agentwake.policy import Policy
from agentwake.store import InboxEvent, IncomingEvent, RunKind, Store
from agentwake.store.sqlite import SqliteStore

KEY_ENV = "AGENTWAKE_TEST_LLM_KEY"


@dataclass
class Rig:
    fake: FakeLLM
    store: Store
    pool: ConnectionPool
    demo_db: Path
    tmp: Path
    ticket: dict[str, Any]

    def config(self, *, tools: list[str], **agent: Any) -> AgentwakeConfig:
        server = demo_stdio(self.demo_db)
        return parse_config(
            {
                "store": {"path": str(self.tmp / "aw.db")},
                "agent": {
                    "model": "openai/fake",
                    "api_base": self.fake.url,
                    "api_key_env": KEY_ENV,
                    "llm_retries": 3,
                    "retry_initial_s": 0.01,
                    "retry_max_s": 0.05,
                    "attempt_backoff_s": 0,
                    "prompts": str(Path(__file__).resolve().parent.parent / "prompts"),
                    **agent,
                },
                "servers": {"demo": server.model_dump(exclude_defaults=True, mode="json")},
                "subscriptions": [
                    {"name": "tickets", "server": "demo", "event": "ticket.created", "tools": tools}
                ],
            },
            env={},
        )

    def runner(self, *, tools: list[str], **agent: Any) -> AgentRunner:
        return AgentRunner.build(self.config(tools=tools, **agent), self.store, self.pool)

    async def event(self) -> InboxEvent:
        """The ticket as an inbox event, claimed for processing the way the service does."""
        sub = self.config(tools=[]).subscriptions[0]
        key = subscription_key(sub)
        await self.store.register(key)
        data = {k: self.ticket[k] for k in ("queue", "priority", "title", "reporter")}
        await self.store.ingest(
            key,
            [
                IncomingEvent(
                    self.ticket["id"],
                    "ticket.created",
                    self.ticket["created_at"],
                    {"ticketId": self.ticket["id"], **data},
                )
            ],
            "1",
        )
        [claimed] = await self.store.claim(1)
        return claimed

    async def run(
        self, runner: AgentRunner, event: InboxEvent | None = None, *, kind: RunKind = "agent"
    ) -> RunResult:
        """Decide the event (or the ticket) as the service does, with no policy files, and run the agent on it."""
        event = event or await self.event()
        outcome = await decide(event, config=runner.config, policy=Policy(), now=utc_now(), flow=None)
        assert outcome.verdict == "run", outcome.why
        return await runner.run(outcome, kind=kind)

    def comments(self) -> list[str]:
        with sqlite3.connect(self.demo_db) as db:
            return [
                r[0] for r in db.execute("SELECT body FROM comments WHERE ticket_id = ?", [self.ticket["id"]])
            ]

    def status(self) -> str:
        with sqlite3.connect(self.demo_db) as db:
            return str(
                db.execute("SELECT status FROM tickets WHERE id = ?", [self.ticket["id"]]).fetchone()[0]
            )

    def stored(self) -> dict[str, Any]:
        [event] = self.store.core.find_events(self.ticket["id"])
        return event


async def build_rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Rig]:
    """The body of the ``rig`` fixture."""
    monkeypatch.setenv(KEY_ENV, "sk-test")
    demo_db = tmp_path / "demo.db"
    async with FakeLLM() as fake, ServerConnection("demo", demo_stdio(demo_db, DEMO_BACKLOG="1")) as conn:
        with sqlite3.connect(demo_db) as db:
            db.row_factory = sqlite3.Row
            ticket = dict(db.execute("SELECT * FROM tickets ORDER BY seq LIMIT 1").fetchone())
        pool = ConnectionPool()
        await pool.attach(conn)
        store = await SqliteStore.open(tmp_path / "aw.db")
        try:
            yield Rig(fake, store, pool, demo_db, tmp_path, ticket)
        finally:
            await store.close()
