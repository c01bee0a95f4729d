"""Latency from an event's inbox commit to the first byte of its LLM request, against bare litellm.

    .venv/bin/python bench/pipeline_overhead.py              # 1000 events
    .venv/bin/python bench/pipeline_overhead.py --events 200 --json

Our overhead is agentwake's real processing path, one event at a time: ``Store.ingest``
commits the event (a real store on a temp file), the clock starts when it returns, the
poll loop's wake-up (``Worker.wake``) reaches the service's ``Worker``, which claims the
event, decides it (``agentwake.decide``: sanitizing, policy, flow control) and runs
``AgentRunner.run`` on it (prompt rendering, the run
record, ``complete()`` through litellm), and the clock stops when the request arrives at
the fake OpenAI server (``tests/fake_llm.py`` on loopback, answering ``text("ok")`` at
once, no tools; an empty ``ConnectionPool``). The next event is ingested only after the
run has finished. The baseline, in the same run and interleaved with it, is the bare cost
of one ``litellm.acompletion`` call with the same messages and options to the same
server: from calling it to the request's arrival. "Arrival" is when aiohttp hands the
request to the handler (headers parsed, body not read yet), the same point for both.

The first ``--warmup`` events and baseline calls are not counted: litellm's first call
imports and sets up its HTTP client, which takes seconds.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
from _harness import BenchFailure, finish

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
# The fake OpenAI server lives with the tests, not in the package.
sys.path.insert(0, str(REPO_ROOT / "tests"))

from fake_llm import FakeLLM  # noqa: E402

from agentwake.agent.llm import load_litellm_async  # noqa: E402
from agentwake.agent.prompts import PromptRenderer  # noqa: E402
from agentwake.agent.runner import AgentRunner, RunResult  # noqa: E402
from agentwake.agent.tools import ConnectionPool  # noqa: E402
from agentwake.clock import now_iso  # noqa: E402
from agentwake.config import AgentwakeConfig  # noqa: E402
from agentwake.decide import Outcome  # noqa: E402
from agentwake.delivery.common import subscription_key  # noqa: E402
from agentwake.service import settle_collector  # noqa: E402
from agentwake.store import IncomingEvent, RunKind, Store, SubscriptionKey  # noqa: E402
from agentwake.store.sqlite import SqliteStore  # noqa: E402
from agentwake.worker import Worker  # noqa: E402

DEFAULT_EVENTS: Final = 1000
DEFAULT_WARMUP: Final = 5
TARGET_P50_MS: Final = 10.0
KEY_ENV: Final = "BENCH_FAKE_LLM_KEY"
STEP_TIMEOUT_S: Final = 60.0  # the first (warm-up) run waits for litellm's import


@dataclass(frozen=True, slots=True)
class Figures:
    events: int
    warmup: int
    seconds: float
    overhead_p50_ms: float
    overhead_p99_ms: float
    wake_p50_ms: float
    wake_p99_ms: float
    litellm_p50_ms: float
    litellm_p99_ms: float
    difference_p50_ms: float
    difference_p99_ms: float
    target_p50_ms: float
    passed: bool


@dataclass
class SignalingRunner(AgentRunner):
    """The real runner; it reports when each run starts and ends, so the bench waits on that, not a sleep."""

    on_start: Callable[[], None] = lambda: None
    on_finish: Callable[[RunResult], None] = lambda result: None

    async def run(self, outcome: Outcome, *, kind: RunKind = "agent", **options: Any) -> RunResult:
        self.on_start()
        result = await super().run(outcome, kind=kind, **options)
        self.on_finish(result)
        return result


@dataclass
class Step:
    """One event through the pipeline: when it committed, when its run started, how it ended."""

    committed: float = 0.0
    started: float = 0.0
    result: RunResult | None = None
    done: anyio.Event = field(default_factory=anyio.Event)


def bench_config(llm_url: str) -> AgentwakeConfig:
    return AgentwakeConfig.model_validate(
        {
            "agent": {
                "model": "openai/fake",
                "api_base": llm_url,
                "api_key_env": KEY_ENV,
                "prompts": REPO_ROOT / "prompts",
                "llm_retries": 0,
                "concurrency": 1,
                "attempt_backoff_s": 0,
            },
            # Never connected: only the agent stage runs. The subscription picks the prompt and no tools.
            "servers": {"demo": {"command": sys.executable}},
            "subscriptions": [{"name": "tickets", "server": "demo", "event": "ticket.created"}],
        }
    )


def ticket(n: int) -> IncomingEvent:
    event_id = f"B-{n:06d}"
    data = {
        "ticketId": event_id,
        "queue": "support",
        "priority": "P2",
        "title": "Cannot log in after password reset",
        "reporter": f"user{n % 997}@example.com",
    }
    return IncomingEvent(event_id, "ticket.created", now_iso(), data)


def percentile(values: list[float], p: float) -> float:
    """Nearest rank: the smallest value with at least p of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


async def run(count: int, warmup: int) -> Figures:
    os.environ[KEY_ENV] = "sk-test"
    overheads: list[float] = []
    wakes: list[float] = []
    bare: list[float] = []
    with tempfile.TemporaryDirectory(prefix="agentwake-bench-") as tmpdir:
        async with FakeLLM() as fake:
            config = bench_config(fake.url)
            assert config.agent is not None
            store = await SqliteStore.open(Path(tmpdir) / "agentwake.db")
            try:
                key = subscription_key(config.subscriptions[0])
                await store.register(key)
                pool = ConnectionPool()  # no servers: the runs get no tools
                runner = SignalingRunner(config, config.agent, store, pool, PromptRenderer(config.agent))
                # No pool on the worker: it would wait for the never-connected server's tools.
                worker = Worker(config, store, agent=runner, pool=None)
                # As `agentwake run` does after start-up (agentwake/service.py).
                settle_collector()
                async with anyio.create_task_group() as tg:
                    await tg.start(worker.run)
                    litellm = await load_litellm_async()
                    start = time.perf_counter()
                    for n in range(warmup + count):
                        overhead, wake, messages = await one_event(fake, store, worker, runner, key, n)
                        baseline = await one_bare_call(fake, litellm, config, messages)
                        if n >= warmup:
                            overheads.append(overhead)
                            wakes.append(wake)
                            bare.append(baseline)
                    seconds = time.perf_counter() - start
                    tg.cancel_scope.cancel()
                counts = store.core.state_counts()
                if counts["done"] != warmup + count:
                    raise BenchFailure(f"{counts['done']} events done, expected {warmup + count}: {counts}")
            finally:
                await store.close()
    p50, p99 = percentile(overheads, 0.5), percentile(overheads, 0.99)
    bare50, bare99 = percentile(bare, 0.5), percentile(bare, 0.99)
    return Figures(
        events=count,
        warmup=warmup,
        seconds=round(seconds, 3),
        overhead_p50_ms=ms(p50),
        overhead_p99_ms=ms(p99),
        wake_p50_ms=ms(percentile(wakes, 0.5)),
        wake_p99_ms=ms(percentile(wakes, 0.99)),
        litellm_p50_ms=ms(bare50),
        litellm_p99_ms=ms(bare99),
        difference_p50_ms=ms(p50 - bare50),
        difference_p99_ms=ms(p99 - bare99),
        target_p50_ms=TARGET_P50_MS,
        passed=p50 * 1000 <= TARGET_P50_MS,
    )


async def one_event(
    fake: FakeLLM,
    store: Store,
    worker: Worker,
    runner: SignalingRunner,
    key: SubscriptionKey,
    n: int,
) -> tuple[float, float, list[dict[str, Any]]]:
    """Ingest one event, wake the agent stage, wait for its run; (overhead, commit to run start, messages)."""
    step = Step()

    def started() -> None:
        step.started = time.perf_counter()

    def finished(result: RunResult) -> None:
        step.result = result
        step.done.set()

    runner.on_start, runner.on_finish = started, finished
    before = len(fake.arrivals)
    event = ticket(n)
    await store.ingest(key, [event], str(n + 1))
    step.committed = time.perf_counter()
    worker.wake(1)  # what PollLoop does right after the commit
    try:
        with anyio.fail_after(STEP_TIMEOUT_S):
            await step.done.wait()
    except TimeoutError:
        raise BenchFailure(f"event {event.event_id}: no finished run after {STEP_TIMEOUT_S:g}s") from None
    result = step.result
    assert result is not None
    if result.status != "completed" or result.event_state != "done":
        raise BenchFailure(f"event {event.event_id}: run {result.status} ({result.reason})")
    if len(fake.arrivals) != before + 1:
        raise BenchFailure(f"event {event.event_id}: {len(fake.arrivals) - before} LLM requests, expected 1")
    request = fake.requests[before]
    if not any(event.event_id in str(m.get("content")) for m in request["messages"]):
        raise BenchFailure(f"event {event.event_id}: the LLM request is not about this event")
    return fake.arrivals[before] - step.committed, step.started - step.committed, request["messages"]


async def one_bare_call(fake: FakeLLM, litellm: Any, config: AgentwakeConfig, messages: list[Any]) -> float:
    """One litellm.acompletion with what agentwake's complete() passes; seconds until the request arrived."""
    assert config.agent is not None
    agent = config.agent
    before = len(fake.arrivals)
    start = time.perf_counter()
    await litellm.acompletion(
        model=agent.model,
        messages=messages,
        max_tokens=agent.max_tokens,
        timeout=agent.request_timeout_s,
        max_retries=0,
        num_retries=0,
        api_base=agent.api_base,
        api_key=os.environ[KEY_ENV],
    )
    if len(fake.arrivals) != before + 1:
        raise BenchFailure(f"bare litellm call: {len(fake.arrivals) - before} requests arrived, expected 1")
    return float(fake.arrivals[before] - start)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report(f: Figures) -> None:
    print(
        f"events:                              {f.events:,} one at a time, after {f.warmup} warm-up (not counted)"
    )
    print(f"wall time:                           {f.seconds:.2f} s (both measurements)")
    print(
        f"commit -> first byte of LLM request: p50 {f.overhead_p50_ms:.2f} ms, p99 {f.overhead_p99_ms:.2f} ms"
    )
    print(f"  of which commit -> run start:      p50 {f.wake_p50_ms:.2f} ms, p99 {f.wake_p99_ms:.2f} ms")
    print(
        f"bare litellm call -> first byte:     p50 {f.litellm_p50_ms:.2f} ms, p99 {f.litellm_p99_ms:.2f} ms"
    )
    print(
        f"difference (ours - litellm, per pct): p50 {f.difference_p50_ms:.2f} ms, p99 {f.difference_p99_ms:.2f} ms"
    )
    print(
        f"target commit -> first byte p50 <= {f.target_p50_ms:g} ms (total, litellm included):"
        f" {verdict(f.passed)} ({f.overhead_p50_ms:.2f} ms)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=DEFAULT_EVENTS, help="events measured (default 1000)")
    parser.add_argument(
        "--warmup", type=int, default=DEFAULT_WARMUP, help="events run first and not counted (default 5)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    if args.events < 1:
        parser.error("--events must be at least 1")
    if args.warmup < 1:
        parser.error("--warmup must be at least 1: litellm's first call is not representative")
    return finish(lambda: anyio.run(run, args.events, args.warmup), as_json=args.json, report=report)


if __name__ == "__main__":
    sys.exit(main())
