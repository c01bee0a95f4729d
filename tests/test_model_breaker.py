"""A dead model is visible: after circuit_breaker_failures transient failures in a row the worker stops
claiming, probes the model with backoff, says so once (log, status, metric), and resumes when it answers.
A real demo server, a real SQLite store, litellm against tests/fake_llm.py on loopback."""

from __future__ import annotations

import logging
import os
import re
import socket
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from _rig import Rig
from _support import agentwake_run, demo_server_toml, fake_agent_toml, start_from_cursor
from fake_llm import FakeLLM, error, text

from agentwake.agent.runner import AgentRunner
from agentwake.cli.tables import describe_service
from agentwake.cli.views import service_state
from agentwake.delivery.common import subscription_key
from agentwake.demo.store import TicketStore
from agentwake.metrics import REGISTRY
from agentwake.store import IncomingEvent
from agentwake.worker import Worker

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")]

EVENTS = 4


def is_probe(request: dict[str, Any]) -> bool:
    return request["messages"] == [{"role": "user", "content": "ping"}] and request["max_tokens"] == 1


def circuit(model: str) -> float | None:
    return REGISTRY.get_sample_value("agentwake_model_circuit_open", {"model": model})


async def test_a_failing_model_stops_the_claims_until_a_probe_gets_an_answer(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agentwake")
    cfg = rig.config(
        tools=[],
        llm_retries=0,
        circuit_breaker_failures=2,
        concurrency=1,
        max_attempts=10,
    )
    runner = AgentRunner.build(cfg, rig.store, rig.pool)
    await rig.store.service_started(pid=os.getpid(), host=socket.gethostname(), version=None, heartbeat_s=60)
    key = subscription_key(cfg.subscriptions[0])
    await rig.store.register(key)
    data = {"ticketId": rig.ticket["id"], "title": rig.ticket["title"]}
    await rig.store.ingest(
        key,
        [IncomingEvent(f"E-{n}", "ticket.created", rig.ticket["created_at"], data) for n in range(EVENTS)],
        "1",
    )
    rig.fake.responder = lambda body: error(500, "the model is down")
    worker = Worker(cfg, rig.store, agent=runner, pool=rig.pool)
    worker.breaker.probe_initial_s = 0.05
    worker.breaker.probe_max_s = 0.1
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        worker.wake(EVENTS)
        with anyio.fail_after(60):
            # Two runs fail, then only probes go out: three of them, all refused.
            while sum(map(is_probe, rig.fake.requests)) < 3:
                await rig.fake.wait_for_requests(len(rig.fake.requests) + 1)
        runs = [r for r in rig.fake.requests if not is_probe(r)]
        assert len(runs) == 2
        assert worker.breaker.is_open
        assert circuit("openai/fake") == 1.0
        service = service_state(await rig.store.services())
        assert service is not None
        line = describe_service(service)
        assert "the agent waits: model openai/fake failing since " in line
        assert "(InternalServerError)" in line
        rig.fake.responder = lambda body: text("back")
        with anyio.fail_after(60):
            # Each event's run: one answer each, then the worker is drained.
            while sum(not is_probe(r) for r in rig.fake.requests) < 2 + EVENTS:
                await rig.fake.wait_for_requests(len(rig.fake.requests) + 1)
            worker.stop_claiming()
            await worker.drained()
        assert (await rig.store.state_counts())["done"] == EVENTS
        tg.cancel_scope.cancel()
    assert not worker.breaker.is_open
    assert circuit("openai/fake") == 0.0
    assert service_state(await rig.store.services())["paused"] is None  # type: ignore[index]
    opened = [r for r in caplog.records if r.getMessage().startswith("agent waits: model openai/fake")]
    closed = [r for r in caplog.records if r.getMessage().startswith("agent resumes: model openai/fake")]
    assert (len(opened), len(closed)) == (1, 1)
    assert opened[0].levelno == logging.WARNING


def test_the_breaker_counts_transient_failures_in_a_row_only() -> None:
    from agentwake.agent.llm import LLMError
    from agentwake.worker import ModelBreaker

    breaker = ModelBreaker(3)
    down = LLMError("InternalServerError: down", transient=True)
    breaker.observe("m", down)
    breaker.observe("m", down)
    breaker.observe("m", None)  # an answer: the count starts again
    breaker.observe("m", down)
    breaker.observe("m", LLMError("BadRequestError: no", transient=False))  # the endpoint answered
    breaker.observe("m", down)
    breaker.observe("m", down)
    assert not breaker.is_open
    breaker.observe("m", down)
    assert breaker.is_open and breaker.error == "InternalServerError"
    assert breaker.reason().startswith("model m failing since ")
    never = ModelBreaker(0)
    for _ in range(50):
        never.observe("m", down)
    assert not never.is_open


def test_status_counts_every_event_state_and_the_failed_runs() -> None:
    from agentwake.cli.views import EVENT_STATES_SHOWN, event_totals
    from agentwake.store.records import EVENT_STATES

    assert sorted(EVENT_STATES_SHOWN) == sorted(EVENT_STATES)
    rows = [
        {"events_pending": 3, "events_held": 1, "events_done": 2, "runs_failed": 4},
        {"events_pending": 1, "events_denied": 2, "events_dead": 1, "runs_failed": 0},
    ]
    assert event_totals(rows) == "events: 4 pending, 2 done, 1 dead, 1 held, 2 denied; 4 failed run(s)"
    assert event_totals([{"events_done": 0}]) is None


async def test_readyz_of_a_running_service_is_503_while_its_model_is_down_and_200_once_it_answers(
    tmp_path: Path,
) -> None:
    """End to end: a real `agentwake run` whose model (tests/fake_llm.py) answers 500 opens its breaker
    after two runs; its /readyz says 503 naming the model, and 200 again once the model answers."""
    async with FakeLLM() as fake:
        fake.responder = lambda body: error(500, "the model is down")
        config = tmp_path / "agentwake.toml"
        config.write_text(
            '[store]\npath = "aw.db"\n\n[service]\nlisten = "127.0.0.1:0"\n\n'
            + fake_agent_toml(
                fake.url, llm_retries=0, circuit_breaker_failures=2, concurrency=1, max_attempts=10
            )
            + "\n"
            + demo_server_toml(tmp_path / "demo.db")
            + '\n[[subscriptions]]\nname = "tickets"\nserver = "demo"\nevent = "ticket.created"\n'
            'delivery = "poll"\npoll_floor_ms = 100\n'
        )
        tickets = TicketStore(tmp_path / "demo.db")
        tickets.create(
            [("support", "P2", f"printer {n} is on fire", "body", "amy@example.com") for n in range(4)]
        )
        tickets.close()
        start_from_cursor(config)
        async with agentwake_run(config, FAKE_LLM_KEY="sk-test") as run:
            line = run.lines[await run.wait_for("service endpoint listening on")]
            found = re.search(r"listening on (http://\S+)", line)
            assert found is not None
            readyz = f"{found.group(1)}/readyz"
            await run.wait_for("agent waits: model openai/fake")
            async with httpx.AsyncClient() as http:
                answer = await http.get(readyz)
                assert answer.status_code == 503, answer.text
                assert "model openai/fake failing since" in answer.json()["model"]
                fake.responder = lambda body: text("back")
                await run.wait_for("agent resumes: model openai/fake")
                assert (await http.get(readyz)).status_code == 200
