"""Scale-out on PostgreSQL: agent runs per second with one `agentwake run` against three, and webhook
ingest on PostgreSQL against SQLite, each pair measured in the same run.

    .venv/bin/python bench/scale_out.py                  # 300 events, 200 ms per LLM call, 1 vs 3
    .venv/bin/python bench/scale_out.py --events 600 --processes 4 --deliveries 8000 --json

Throughput. A throwaway PostgreSQL server (``tests/_postgres.py``: Debian's binaries, fsync off)
and a scripted LLM: ``tests/fake_llm.py`` on loopback, which answers every chat call after
``--llm-ms`` with a final answer (no tool calls), so each agent run is one LLM call. Each side
gets a fresh database into which ``--events`` ``ticket.created`` events are written through
the store API (``Store.ingest``) before any process starts: intake is not measured. The
config (``[store] url``, ``[agent] model = "openai/fake"`` with its ``api_base``, one
``delivery = "poll"`` subscription on the demo server, which has no tickets) is the same
file for every process, and ``[agent] concurrency`` (``--concurrency``, the default 4) bounds
the runs of each process, so N processes may run N times as many at once. Start-up (litellm's
import takes seconds, and N processes start side by side on a small machine) is kept out of
the clock with a gate: the LLM holds every call until processes x concurrency calls are
waiting, i.e. every process has filled its slots; it then lets them go (each after
``--llm-ms``, like every later call) and the clock starts. It stops at the first look at the
store (every 20 ms) that finds every event ``done``. Figures: events per second, N processes
against one (the ratio; ideal is N, while the LLM's latency and not CPU is the limit), LLM
calls against completed runs (more calls: runs that did not complete, listed with the reason
the store gives), how the runs spread over the processes (from their log lines), and CPU in
the window: agentwake's processes, PostgreSQL's, this bench's own (fake LLM, senders) and the
whole machine's, so that a window disturbed by other load on the machine shows (a note says
so); agentwake's and PostgreSQL's CPU per event is the figure such load disturbs least. The
bench fails (exit 1) unless every event is done with exactly one completed agent run, and
none has two.

Without subscription ownership every process also polls the (empty) demo subscription: it costs
a request a second each and stores nothing, as the inbox deduplicates.

Webhook ingest. ``agentwake run`` with a ``[webhook]`` receiver (TLS from a trustme CA, as
``examples/webhook_demo.py`` makes it: the demo server over HTTP, with a bearer token, checks
the callback URL with a signed challenge over https before it grants the subscription) and no
``[agent]``, once on a SQLite file and once on a fresh PostgreSQL database, otherwise the same.
Once the subscription is granted the bench reads its webhook id and secret from the store and
sends its own signed ``ticket.created`` deliveries straight to the receiver: ``--senders``
keep-alive TLS connections, one request in flight on each (``bench/webhook_ingest.py``'s
request builder and sender protocol): first WARMUP_DELIVERIES not counted, then
``--deliveries``, from the first write to the last answer. Every 2xx means the event was
committed. Figures: accepted per second for each store (and the PostgreSQL / SQLite ratio),
latency percentiles, CPU as above (and per delivery). The worker of the same process marks the
events done meanwhile (no agent), as it would in service. The bench fails unless the store
holds exactly the deliveries answered 2xx, each once, and nothing else.

Delivery spread. ``--subscriptions`` poll subscriptions (tests/balance_server.py: one stream each,
``--items`` items per stream, all behind a gate), on a fresh database, with one `agentwake run` and
then with ``--processes``, no ``[agent]``. Once the processes have spread the subscriptions
(agentwake.ownership: each its share) and every subscription's loop polls under its owner's fence
(the processes' log lines) past its first poll (a stored cursor), the gate opens and the clock runs
until every item is stored: a lease is taken before its process has even connected to the server,
so the leases alone would put start-up in one side's window. Figures: how many subscriptions each
process drove, how long from the spawn until they were spread with every loop polling, stored
events per second (and the ratio), CPU as above. The bench fails unless every item is stored
exactly once (no duplicate, no gap) on both sides.

Every process this bench starts, and the PostgreSQL server, is stopped on the way out, on a
failure and on Ctrl-C (or SIGTERM) too; ``--keep`` keeps the temp folder with every config and
process log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

import anyio
from _harness import BenchFailure, finish
from soak import cpu_seconds, launcher
from webhook_ingest import EVENT, HOST, WEBHOOK_ID, Deliveries, Phase, Sender, event_number, percentile

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
# The throwaway PostgreSQL server and the fake OpenAI server live with the tests. Appended:
# bench/'s own modules keep precedence.
sys.path.append(str(REPO_ROOT / "tests"))

import psycopg  # noqa: E402
from _postgres import PostgresError, PostgresServer, free_port  # noqa: E402
from fake_llm import FakeLLM, Reply, delay, hold, text  # noqa: E402

from agentwake import signing  # noqa: E402
from agentwake.clock import now_iso  # noqa: E402
from agentwake.config import load_config  # noqa: E402
from agentwake.delivery.common import subscription_key  # noqa: E402
from agentwake.store import IncomingEvent, Store, open_store  # noqa: E402
from examples.webhook_demo import (  # noqa: E402
    LISTENING,
    RUN_COMPLETED,
    TOKEN_VARIABLE,
    demo_server_command,
    make_certificates,
)

DEFAULT_EVENTS: Final = 300
DEFAULT_LLM_MS: Final = 200.0
DEFAULT_PROCESSES: Final = 3
DEFAULT_CONCURRENCY: Final = 4
DEFAULT_DELIVERIES: Final = 4000
DEFAULT_SENDERS: Final = 32
DEFAULT_SUBSCRIPTIONS: Final = 30
DEFAULT_ITEMS: Final = 200
WARMUP_DELIVERIES: Final = 300
KEY_ENV: Final = "BENCH_FAKE_LLM_KEY"
DEMO_DB_ENV: Final = "BENCH_DEMO_DB"
SUBSCRIPTION: Final = "tickets"
WEBHOOK_SUBSCRIPTION: Final = "bench"
STARTUP_TIMEOUT_S: Final = 120.0
STOP_TIMEOUT_S: Final = 30.0
DONE_CHECK_S: Final = 0.02
SEND_TIMEOUT_S: Final = 120.0
LOG_TAIL_CHARS: Final = 3000
NOISY_CORES: Final = 0.5  # other load in a window above this many cores is reported


def progress(message: str) -> None:
    print(f"scale_out: {message}", file=sys.stderr, flush=True)


# ---- child processes ---------------------------------------------------------------------------


class Child:
    """A subprocess with its output in a log file; stopped with SIGTERM (as a service manager does),
    then SIGKILL."""

    def __init__(
        self, name: str, command: list[str], *, cwd: Path, env: Mapping[str, str], log: Path
    ) -> None:
        self.name = name
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                command,
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise BenchFailure(f"{self.name} exited with {code}: {self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Children:
    """Every child this bench started, so that the outermost ``finally`` stops whatever is left."""

    def __init__(self) -> None:
        self.started: list[Child] = []

    def start(self, name: str, command: list[str], *, cwd: Path, env: Mapping[str, str], log: Path) -> Child:
        child = Child(name, command, cwd=cwd, env=env, log=log)
        self.started.append(child)
        return child

    def stop(self, *children: Child) -> None:
        # All signalled first: they stop side by side.
        for child in children:
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        for child in children:
            child.stop()

    def stop_all(self) -> None:
        self.stop(*reversed(self.started))


def agentwake_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", **extra}


CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """CPU seconds all cores spent busy so far, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLOCK_TICKS  # guest time is already in user


def server_cpu(pid: int | None) -> float:
    """CPU seconds of the PostgreSQL server: the postmaster, its live backends (its children, each in
    a session of its own) and those already reaped."""
    if pid is None:
        return 0.0
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            total += int(fields[11]) + int(fields[12])
        elif int(stat.parent.name) == pid:
            total += sum(int(v) for v in fields[11:15])
    return total / CLOCK_TICKS


@dataclass(frozen=True, slots=True)
class Usage:
    """CPU in a measured window, in cores (CPU seconds / wall seconds)."""

    agentwake: float  # the agentwake processes, summed (not their stdio demo servers)
    postgres: float  # the PostgreSQL server and its backends
    bench: float  # this process: the fake LLM, the webhook senders
    machine: float  # every core of the machine: the rest is other load (and demo servers)
    cores: int

    @property
    def elsewhere(self) -> float:
        """Cores busy with something this bench did not start (or does not count: demo servers)."""
        return max(0.0, self.machine - self.agentwake - self.postgres - self.bench)


class Window:
    """CPU from the start of a measured window to its end."""

    def __init__(self, pids: list[int], pg: PostgresServer) -> None:
        self.pids = pids
        self.postmaster = pg.pid()
        self.wall = time.perf_counter()
        self.start = self.sample()

    def sample(self) -> tuple[float, float, float, float]:
        return (
            sum(cpu_seconds(p) for p in self.pids),
            server_cpu(self.postmaster),
            time.process_time(),
            machine_busy(),
        )

    def end(self) -> Usage:
        wall = time.perf_counter() - self.wall
        used = [round((b - a) / wall, 2) for a, b in zip(self.start, self.sample(), strict=True)]
        return Usage(*used, cores=os.cpu_count() or 1)


# ---- throughput: agent runs with 1 and N processes ---------------------------------------------


class ScriptedLLM:
    """The fake LLM's answers: held while the gate is closed, then a final answer after ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.open = False

    def __call__(self, body: dict[str, Any]) -> Reply:
        return delay(self.seconds, text("Done: nothing to do.")) if self.open else hold()


@dataclass(frozen=True, slots=True)
class Leg:
    processes: int
    events: int
    startup_s: float  # spawn until every process had its slots waiting at the LLM
    seconds: float  # gate opened until every event was done
    events_per_s: float
    llm_calls: int
    completed_runs: int
    other_runs: dict[str, int]  # agent runs that did not complete, by status and reason
    runs_per_process: list[int]
    cpu: Usage
    cpu_ms_per_event: float  # agentwake + PostgreSQL: steadier than the rates on a busy machine


def throughput_config(url: str, llm_url: str, concurrency: int) -> str:
    return f"""\
[store]
url = "{url}"

[agent]
model = "openai/fake"
api_base = "{llm_url}"
api_key_env = "{KEY_ENV}"
prompts = {json.dumps(str(REPO_ROOT / "prompts"))}
concurrency = {concurrency}
llm_retries = 0
attempt_backoff_s = 0
# The first calls wait at the gate while the other processes start.
request_timeout_s = {STARTUP_TIMEOUT_S + 60:g}
timeout_s = {STARTUP_TIMEOUT_S + 120:g}

# Each process starts its own demo server: its own (empty) tickets file, named by the environment.
[servers.demo]
command = "agentwake-demo"
env = {{ DEMO_DB = "${{{DEMO_DB_ENV}}}", DEMO_RATE = "0", DEMO_ALERT_INTERVAL = "0",\
 DEMO_LOAD_INTERVAL = "0" }}

[[subscriptions]]
name = "{SUBSCRIPTION}"
server = "demo"
event = "ticket.created"
delivery = "poll"
"""


def ticket(n: int) -> IncomingEvent:
    data = {
        "ticketId": f"T-{n:06d}",
        "queue": "support",
        "priority": "P2",
        "title": "Cannot log in after password reset",
        "reporter": f"user{n % 997}@example.com",
    }
    return IncomingEvent(f"scale-{n:06d}", "ticket.created", now_iso(), data)


async def preload(config: Path, events: int) -> Store:
    """The events in the inbox, pending, before any process starts; the store stays open to watch them."""
    loaded = load_config(config, env={**os.environ, DEMO_DB_ENV: "unused.db"})
    key = subscription_key(loaded.subscriptions[0])
    store = await open_store(loaded.store)
    await store.register(key)
    # A null cursor is not stored: the processes' first poll starts at the demo server's head.
    await store.ingest(key, [ticket(n) for n in range(events)], None)
    return store


async def throughput_leg(
    pg: PostgresServer,
    tmp: Path,
    children: Children,
    fake: FakeLLM,
    script: ScriptedLLM,
    processes: int,
    args: Any,
) -> Leg:
    folder = tmp / f"throughput-{processes}"
    folder.mkdir()
    config = folder / "agentwake.toml"
    url = pg.create_database("scale")
    config.write_text(throughput_config(url, fake.url, args.concurrency))
    store = await preload(config, args.events)
    try:
        script.open = False
        gate = processes * args.concurrency
        before = len(fake.requests)
        progress(f"{processes} process(es): {args.events} events pending; starting, gate at {gate} LLM calls")
        spawned = time.perf_counter()
        running = [
            children.start(
                f"agentwake run #{i + 1}",
                [*launcher(), "run", "-c", str(config)],
                cwd=folder,
                env=agentwake_env(**{KEY_ENV: "sk-bench", DEMO_DB_ENV: f"demo-{i + 1}.db"}),
                log=folder / f"agentwake-{i + 1}.log",
            )
            for i in range(processes)
        ]
        while len(fake.requests) - before < gate:
            for child in running:
                child.alive()
            if time.perf_counter() - spawned > STARTUP_TIMEOUT_S:
                raise BenchFailure(
                    f"{len(fake.requests) - before} of {gate} LLM calls after {STARTUP_TIMEOUT_S:g} s:"
                    f" {running[0].tail()}"
                )
            await anyio.sleep(0.05)
        startup = time.perf_counter() - spawned
        if len(fake.requests) - before > gate:
            raise BenchFailure(f"{len(fake.requests) - before} LLM calls at the gate, more than {gate}")
        progress(f"{processes} process(es): all up after {startup:.1f} s; gate open")
        window = Window([c.pid for c in running], pg)
        script.open = True
        fake.release()
        limit = max(60.0, 5 * args.events * args.llm_ms / 1000 / args.concurrency)
        while True:
            counts = await store.state_counts()
            if counts.get("done", 0) >= args.events:
                break
            if counts.get("failed", 0) or counts.get("dead", 0):
                raise BenchFailure(f"events failed: {counts}: {running[0].tail()}")
            for child in running:
                child.alive()
            if time.perf_counter() - window.wall > limit:
                raise BenchFailure(f"not done after {limit:g} s: {counts}")
            await anyio.sleep(DONE_CHECK_S)
        usage = window.end()
        seconds = time.perf_counter() - window.wall
        progress(f"{processes} process(es): {args.events} events done in {seconds:.2f} s; stopping")
        llm_calls = len(fake.requests) - before
        children.stop(*running)
    finally:
        await store.close()
    completed, others = check_runs(url, args.events)
    return Leg(
        processes=processes,
        events=args.events,
        startup_s=round(startup, 2),
        seconds=round(seconds, 3),
        events_per_s=round(args.events / seconds, 2),
        llm_calls=llm_calls,
        completed_runs=completed,
        other_runs=others,
        runs_per_process=[len(RUN_COMPLETED.findall(c.log.read_text(errors="replace"))) for c in running],
        cpu=usage,
        cpu_ms_per_event=round((usage.agentwake + usage.postgres) * seconds / args.events * 1000, 2),
    )


def check_runs(url: str, events: int) -> tuple[int, dict[str, int]]:
    """Every event done with exactly one completed agent run: (completed runs, the other runs by status
    and reason)."""
    with psycopg.connect(url) as conn:
        total, done = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE state = 'done') FROM events"
        ).fetchone()
        twice = conn.execute(
            "SELECT count(*) FROM (SELECT event_row FROM runs WHERE kind = 'agent' AND status = 'completed'"
            " GROUP BY event_row HAVING count(*) > 1) AS x"
        ).fetchone()[0]
        unrun = conn.execute(
            "SELECT count(*) FROM events e WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.event_row = e.id"
            " AND r.kind = 'agent' AND r.status = 'completed')"
        ).fetchone()[0]
        completed = conn.execute(
            "SELECT count(*) FROM runs WHERE kind = 'agent' AND status = 'completed'"
        ).fetchone()[0]
        others = {
            f"{status}: {reason}": count
            for status, reason, count in conn.execute(
                "SELECT status, coalesce(reason, '-'), count(*) FROM runs WHERE kind = 'agent'"
                " AND status != 'completed' GROUP BY 1, 2"
            ).fetchall()
        }
    if total != events or done != events:
        raise BenchFailure(f"{done} of {total} events done; {events} were loaded")
    if twice:
        raise BenchFailure(f"{twice} event(s) with two or more completed agent runs")
    if unrun:
        raise BenchFailure(f"{unrun} event(s) done without a completed agent run")
    if completed != events:
        raise BenchFailure(f"{completed} completed agent runs for {events} events")
    return completed, others


# ---- webhook ingest: SQLite vs PostgreSQL ------------------------------------------------------


class SignedDeliveries(Deliveries):
    """bench/webhook_ingest.py's requests, for the webhook id the demo server granted."""

    def __init__(self, key: bytes, webhook_id: str, *, prebuilt: int) -> None:
        self.id_header = f"{signing.HEADER_SUBSCRIPTION}: {webhook_id}\r\n".encode()
        super().__init__(key, prebuilt=prebuilt, cycle=False, host_header=HOST)

    def build(self, n: int) -> bytes:
        return (
            super()
            .build(n)
            .replace(f"{signing.HEADER_SUBSCRIPTION}: {WEBHOOK_ID}\r\n".encode(), self.id_header)
        )


@dataclass
class Counted(Phase):
    """A phase of ``limit`` requests: each sender stops after its answer once that many went out."""

    limit: int = 0

    def record(self, n: int, status: int, sent_at: float, now: float) -> None:
        super().record(n, status, sent_at, now)  # its own latencies stay off: warm_end is inf
        if 200 <= status < 300:
            self.latencies.append(now - sent_at)
        if self.sent >= self.limit:
            self.deadline = -math.inf


async def send(
    port: int, deliveries: Deliveries, limit: int, senders: int, context: ssl.SSLContext
) -> tuple[Counted, float]:
    """``limit`` deliveries over ``senders`` connections: the phase, and its seconds from the first
    write to the last answer."""
    loop = asyncio.get_running_loop()
    phase = Counted(deliveries, limit=limit)
    connections: list[Sender] = []
    try:
        for _ in range(min(senders, limit)):
            _transport, sender = await loop.create_connection(lambda: Sender(phase), HOST, port, ssl=context)
            connections.append(sender)
        start = time.perf_counter()
        for sender in connections:
            sender.send()
        try:
            await asyncio.wait_for(asyncio.gather(*(s.done for s in connections)), SEND_TIMEOUT_S)
        except TimeoutError:
            raise BenchFailure(f"{limit} deliveries not answered within {SEND_TIMEOUT_S:g} s") from None
        return phase, time.perf_counter() - start
    finally:
        for sender in connections:
            if sender.transport is not None:
                sender.transport.close()


@dataclass(frozen=True, slots=True)
class Ingest:
    store: str
    deliveries: int
    accepted: int
    non_2xx: int
    seconds: float
    accepted_per_s: float
    p50_ms: float
    p99_ms: float
    rows: int
    cpu: Usage
    cpu_us_per_delivery: float  # agentwake + PostgreSQL: steadier than the rates on a busy machine


def webhook_config(store: str, server_url: str, port: int) -> str:
    return f"""\
[store]
{store}

[log]
level = "WARNING"

[servers.demo]
url = "{server_url}"
headers = {{ Authorization = "Bearer ${{{TOKEN_VARIABLE}}}" }}

[webhook]
listen = "{HOST}:{port}"
public_url = "https://{HOST}:{port}/hooks"
tls_cert = "receiver.pem"
tls_key = "receiver-key.pem"

[[subscriptions]]
name = "{WEBHOOK_SUBSCRIPTION}"
server = "demo"
event = "{EVENT}"
delivery = "webhook"
"""


async def wait_until(what: str, check: Any, children: list[Child]) -> Any:
    start = time.perf_counter()
    while (found := await check()) is None:
        for child in children:
            child.alive()
        if time.perf_counter() - start > STARTUP_TIMEOUT_S:
            raise BenchFailure(f"no {what} after {STARTUP_TIMEOUT_S:g} s: {children[-1].tail()}")
        await anyio.sleep(0.1)
    return found


async def webhook_leg(kind: str, pg: PostgresServer, tmp: Path, children: Children, args: Any) -> Ingest:
    folder = tmp / f"webhook-{kind}"
    folder.mkdir()
    make_certificates(folder)  # ca.pem (the demo server trusts it), receiver.pem, receiver-key.pem
    token = secrets.token_urlsafe(24)
    command, env = demo_server_command(folder, token, 0.0, 3_600_000)
    demo = children.start("demo server", command, cwd=REPO_ROOT, env=env, log=folder / "demo.log")

    async def listening() -> str | None:
        found = LISTENING.search(demo.log.read_text(errors="replace"))
        return found.group(1) if found else None

    server_url = await wait_until("demo server listening", listening, [demo])
    port = free_port()
    store_line = (
        f'url = "{pg.create_database("ingest")}"' if kind == "postgresql" else 'path = "agentwake.db"'
    )
    config = folder / "agentwake.toml"
    config.write_text(webhook_config(store_line, server_url, port))
    loaded = load_config(config, env={**os.environ, TOKEN_VARIABLE: token})
    store = await open_store(loaded.store)  # created (migrated) here, before the service starts
    try:
        progress(f"webhook on {kind}: starting agentwake run, waiting for the subscription")
        service = children.start(
            f"agentwake run ({kind})",
            [*launcher(), "run", "-c", str(config)],
            cwd=folder,
            env=agentwake_env(**{TOKEN_VARIABLE: token}),
            log=folder / "agentwake.log",
        )

        async def granted() -> tuple[str, str] | None:
            record = await store.webhook(WEBHOOK_SUBSCRIPTION)
            if record is None or record.webhook_id is None:
                return None
            return record.webhook_id, record.secret

        webhook_id, secret = await wait_until("webhook subscription", granted, [demo, service])
    finally:
        await store.close()
    context = ssl.create_default_context(cafile=str(folder / "ca.pem"))
    deliveries = SignedDeliveries(
        signing.decode_secret(secret), webhook_id, prebuilt=1 + WARMUP_DELIVERIES + args.deliveries
    )
    accepted: set[int] = set()
    # The route is bound right after the grant is stored: until a probe is accepted.
    start = time.perf_counter()
    while True:
        probe, _ = await send(port, deliveries, 1, 1, context)
        accepted |= probe.accepted
        if probe.accepted:
            break
        if time.perf_counter() - start > STARTUP_TIMEOUT_S:
            raise BenchFailure(f"the receiver answered no probe with 2xx: {probe.statuses}")
        await anyio.sleep(0.1)
    warm, _ = await send(port, deliveries, WARMUP_DELIVERIES, args.senders, context)
    accepted |= warm.accepted
    progress(f"webhook on {kind}: sending {args.deliveries} deliveries over {args.senders} connections")
    window = Window([service.pid], pg)
    phase, seconds = await send(port, deliveries, args.deliveries, args.senders, context)
    usage = window.end()
    accepted |= phase.accepted
    refused = set(range(deliveries.taken)) - accepted
    children.stop(service, demo)
    rows = await check_rows(loaded, accepted, refused)
    return Ingest(
        store=kind,
        deliveries=phase.sent,
        accepted=len(phase.accepted),
        non_2xx=sum(c for s, c in phase.statuses.items() if not 200 <= s < 300),
        seconds=round(seconds, 3),
        accepted_per_s=round(len(phase.accepted) / seconds, 1),
        p50_ms=round(percentile(phase.latencies, 0.5) * 1000, 2),
        p99_ms=round(percentile(phase.latencies, 0.99) * 1000, 2),
        rows=rows,
        cpu=usage,
        cpu_us_per_delivery=round(
            (usage.agentwake + usage.postgres) * seconds / len(phase.accepted) * 1e6, 1
        ),
    )


async def check_rows(loaded: Any, accepted: set[int], refused: set[int]) -> int:
    """The store holds exactly the deliveries answered 2xx, each once."""
    store = await open_store(loaded.store, create=False)
    try:
        ids = await store.event_ids(WEBHOOK_SUBSCRIPTION)
    finally:
        await store.close()
    stored = {event_number(i) for i in ids}
    if len(ids) != len(stored):
        raise BenchFailure(f"{len(ids) - len(stored)} duplicate rows among {len(ids)}")
    if stored != accepted:
        lost, phantom = sorted(accepted - stored), sorted(stored - accepted)
        raise BenchFailure(
            f"{len(lost)} deliveries answered 2xx but not stored (e.g. {lost[:5]}),"
            f" {len(phantom)} stored but not answered 2xx (e.g. {phantom[:5]})"
        )
    if stored & refused:
        raise BenchFailure(f"{len(stored & refused)} refused deliveries are in the store")
    return len(ids)


# ---- the run -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Figures:
    events: int
    llm_ms: float
    concurrency: int
    one: Leg
    many: Leg
    throughput_ratio: float  # many / one; ideal: many.processes
    ideal_one_per_s: float  # concurrency / LLM latency: what one process could do with no overhead
    deliveries: int
    senders: int
    sqlite: Ingest
    postgresql: Ingest
    ingest_ratio: float  # PostgreSQL / SQLite
    spread_one: Spread | None = None
    spread_many: Spread | None = None


async def measure_all(pg: PostgresServer, tmp: Path, children: Children, args: Any) -> Figures:
    script = ScriptedLLM(args.llm_ms / 1000)
    async with FakeLLM() as fake:
        fake.responder = script
        one = await throughput_leg(pg, tmp, children, fake, script, 1, args)
        many = await throughput_leg(pg, tmp, children, fake, script, args.processes, args)
    sqlite = await webhook_leg("sqlite", pg, tmp, children, args)
    postgresql = await webhook_leg("postgresql", pg, tmp, children, args)
    spread_one = spread_many = None
    if args.subscriptions:
        spread_one = await spread_leg(pg, tmp, children, 1, args)
        spread_many = await spread_leg(pg, tmp, children, args.processes, args)
    return Figures(
        events=args.events,
        llm_ms=args.llm_ms,
        concurrency=args.concurrency,
        one=one,
        many=many,
        throughput_ratio=round(many.events_per_s / one.events_per_s, 3),
        ideal_one_per_s=round(args.concurrency / (args.llm_ms / 1000), 2),
        deliveries=args.deliveries,
        senders=args.senders,
        sqlite=sqlite,
        postgresql=postgresql,
        ingest_ratio=round(postgresql.accepted_per_s / sqlite.accepted_per_s, 3),
        spread_one=spread_one,
        spread_many=spread_many,
    )


def run(args: argparse.Namespace) -> Figures:
    children = Children()
    try:
        pg = PostgresServer()
    except PostgresError as exc:
        raise BenchFailure(str(exc)) from None
    if pg.as_root:
        # As root, tests/_postgres.py runs PostgreSQL's tools through runuser, which lives in
        # /usr/sbin: not on a minimal PATH (tests/test_bench_smoke.py's).
        path = os.environ.get("PATH", "").split(os.pathsep)
        os.environ["PATH"] = os.pathsep.join([*path, *(d for d in ("/usr/sbin", "/sbin") if d not in path)])
    tmp = Path(tempfile.mkdtemp(prefix="agentwake-bench-scale-"))
    try:
        progress("starting a throwaway PostgreSQL server")
        try:
            pg.start()
        except (PostgresError, OSError, subprocess.TimeoutExpired) as exc:
            raise BenchFailure(f"could not start a throwaway PostgreSQL server: {exc}") from None
        return anyio.run(measure_all, pg, tmp, children, args)
    finally:
        try:
            children.stop_all()
        finally:
            pg.stop()
            if args.keep:
                progress(f"configs and logs kept in {tmp}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)


# ---- delivery: subscriptions spread over 1 and N processes --------------------------------------


@dataclass(frozen=True, slots=True)
class Spread:
    processes: int
    subscriptions: int
    items: int
    settle_s: float  # spawn until the subscriptions were spread (each process its share, each loop polling)
    held: list[int]  # subscriptions each process drove when the gate opened
    seconds: float  # gate opened until every item was stored
    events_per_s: float
    cpu: Usage


DRIVES: Final = re.compile(r"subscription (\S+): this process drives it now \(fence (\d+)\)")
POLLING: Final = re.compile(r"subscription (\S+): polling ")


def polling_loops(log: Path) -> set[tuple[str, int]]:
    """(subscription, fence) of every loop a process's log shows polling, each under the fence it
    last took the subscription with (``agentwake.ownership``'s and ``PollLoop``'s log lines)."""
    fences: dict[str, int] = {}
    polling: set[tuple[str, int]] = set()
    for line in log.read_text(errors="replace").splitlines():
        if (took := DRIVES.search(line)) is not None:
            fences[took[1]] = int(took[2])
        elif (polled := POLLING.search(line)) is not None and polled[1] in fences:
            polling.add((polled[1], fences[polled[1]]))
    return polling


def spread_config(url: str, gate: Path, subscriptions: int, items: int) -> str:
    server = REPO_ROOT / "tests" / "balance_server.py"
    env = {"BALANCE_ITEMS": str(items), "BALANCE_PERIOD_MS": "0", "BALANCE_GATE_FILE": str(gate)}
    env_toml = ", ".join(f"{key} = {json.dumps(value)}" for key, value in env.items())
    text = (
        f'[store]\nurl = "{url}"\nlease_s = 3\n\n[servers.balance]\ncommand = {json.dumps(sys.executable)}\n'
        f"args = {json.dumps([str(server)])}\nenv = {{ {env_toml} }}\n"
    )
    for n in range(subscriptions):
        text += (
            f'\n[[subscriptions]]\nname = "s{n:03d}"\nserver = "balance"\nevent = "stream.item"\n'
            f'delivery = "poll"\npoll_floor_ms = 100\narguments = {{ stream = "s{n:03d}" }}\n'
        )
    return text


async def spread_leg(pg: PostgresServer, tmp: Path, children: Children, processes: int, args: Any) -> Spread:
    folder = tmp / f"spread-{processes}"
    folder.mkdir()
    gate = folder / "gate"
    config = folder / "agentwake.toml"
    config.write_text(spread_config(pg.create_database("spread"), gate, args.subscriptions, args.items))
    store = await open_store(load_config(config).store)
    total = args.subscriptions * args.items
    try:
        progress(f"spread, {processes} process(es): {args.subscriptions} subscriptions; starting")
        spawned = time.perf_counter()
        running = [
            children.start(
                f"agentwake run #{i + 1}",
                [*launcher(), "run", "-c", str(config)],
                cwd=folder,
                env=agentwake_env(),
                log=folder / f"agentwake-{i + 1}.log",
            )
            for i in range(processes)
        ]

        async def spread() -> list[int] | None:
            now = now_iso()
            owners = [o for o in await store.subscription_owners() if o["lease_until"] > now]
            counts = sorted(Counter(o["owner"] for o in owners).values())
            share = math.ceil(args.subscriptions / processes)
            if len(counts) != processes or sum(counts) != args.subscriptions or counts[-1] > share:
                return None
            # A lease is taken before the process has connected to its server: settled once every
            # subscription's loop polls under its owner's fence and has its first cursor (bootstrap).
            polling = {pid: polling_loops(child.log) for pid, child in ((c.pid, c) for c in running)}
            for owner in owners:
                pid = int(str(owner["owner"]).split(":")[1])
                if (owner["subscription"], owner["fence"]) not in polling.get(pid, set()):
                    return None
            if any(row["cursor"] is None for row in await store.subscriptions()):
                return None
            return counts

        held = await wait_until("spread of the subscriptions", spread, running)
        settle = time.perf_counter() - spawned
        progress(f"spread, {processes} process(es): {held} after {settle:.1f} s; gate open")
        window = Window([c.pid for c in running], pg)
        gate.touch()
        limit = max(60.0, total / 100)
        while True:
            rows = await store.subscriptions()
            if sum(r["events_received"] for r in rows) >= total:
                break
            for child in running:
                child.alive()
            if time.perf_counter() - window.wall > limit:
                raise BenchFailure(f"not every item stored after {limit:g} s")
            await anyio.sleep(DONE_CHECK_S)
        usage = window.end()
        seconds = time.perf_counter() - window.wall
        children.stop(*running)
        rows = await store.subscriptions()
        wrong = [
            r["subscription"]
            for r in rows
            if (r["events_received"], r["duplicates"], r["gaps"]) != (args.items, 0, 0)
        ]
        if len(rows) != args.subscriptions or wrong:
            raise BenchFailure(f"not every item stored exactly once: {wrong[:5]}")
    finally:
        await store.close()
    return Spread(
        processes=processes,
        subscriptions=args.subscriptions,
        items=args.items,
        settle_s=round(settle, 2),
        held=held,
        seconds=round(seconds, 3),
        events_per_s=round(total / seconds, 1),
        cpu=usage,
    )


# ---- reporting ---------------------------------------------------------------------------------


def cpu_rows(row: Callable[[str, str, str], None], a: Usage, b: Usage) -> None:
    row("CPU in the window (cores): agentwake", f"{a.agentwake:.2f}", f"{b.agentwake:.2f}")
    row("  PostgreSQL", f"{a.postgres:.2f}", f"{b.postgres:.2f}")
    row("  this bench (fake LLM, senders)", f"{a.bench:.2f}", f"{b.bench:.2f}")
    row(f"  the whole machine, of {a.cores}", f"{a.machine:.2f}", f"{b.machine:.2f}")
    if max(a.elsewhere, b.elsewhere) > NOISY_CORES:
        print(
            f"note: up to {max(a.elsewhere, b.elsewhere):.1f} of {a.cores} cores were busy with other work"
            " in the windows: the figures and the ratio are disturbed by it"
        )


def report(f: Figures) -> None:
    one, many = f.one, f.many
    print(
        f"scale-out on PostgreSQL: {f.events} events, a scripted LLM answering in {f.llm_ms:g} ms,"
        f" [agent] concurrency = {f.concurrency} per process"
    )

    def row(name: str, a: str, b: str, ratio: str = "") -> None:
        print(f"{name:45} {a:>12} {b:>12} {ratio:>8}")

    row("", "1 process", f"{many.processes} processes", "ratio")
    row(
        "events/s to completed agent runs",
        f"{one.events_per_s:.1f}",
        f"{many.events_per_s:.1f}",
        f"{f.throughput_ratio:.2f}x",
    )
    row("seconds (gate open to all done)", f"{one.seconds:.2f}", f"{many.seconds:.2f}")
    row(
        "ideal events/s (concurrency / LLM)",
        f"{f.ideal_one_per_s:.1f}",
        f"{f.ideal_one_per_s * many.processes:.1f}",
    )
    row("start-up until the gate filled (s)", f"{one.startup_s:.1f}", f"{many.startup_s:.1f}")
    row(
        "CPU per event, agentwake + PostgreSQL (ms)",
        f"{one.cpu_ms_per_event:.1f}",
        f"{many.cpu_ms_per_event:.1f}",
    )
    cpu_rows(row, one.cpu, many.cpu)
    row(
        "LLM calls / completed runs",
        f"{one.llm_calls} / {one.completed_runs}",
        f"{many.llm_calls} / {many.completed_runs}",
    )
    row(
        "runs per process",
        "/".join(map(str, one.runs_per_process)),
        "/".join(map(str, many.runs_per_process)),
    )
    if one.other_runs or many.other_runs:
        row("other runs (not completed)", str(one.other_runs), str(many.other_runs))
    print(f"every event done with exactly one completed agent run: PASS ({f.events} events, both sides)")
    print()
    s, p = f.sqlite, f.postgresql
    print(
        f"webhook ingest by agentwake run's receiver: https, {f.senders} connections,"
        f" {f.deliveries} deliveries"
    )
    row("", "SQLite", "PostgreSQL", "ratio")
    row("accepted/s", f"{s.accepted_per_s:,.0f}", f"{p.accepted_per_s:,.0f}", f"{f.ingest_ratio:.2f}x")
    row("p50 / p99 (ms)", f"{s.p50_ms:.1f} / {s.p99_ms:.1f}", f"{p.p50_ms:.1f} / {p.p99_ms:.1f}")
    row("accepted / not 2xx", f"{s.accepted} / {s.non_2xx}", f"{p.accepted} / {p.non_2xx}")
    row(
        "CPU per delivery, agentwake + PostgreSQL (us)",
        f"{s.cpu_us_per_delivery:.0f}",
        f"{p.cpu_us_per_delivery:.0f}",
        f"{p.cpu_us_per_delivery / s.cpu_us_per_delivery:.2f}x",
    )
    cpu_rows(row, s.cpu, p.cpu)
    print(
        f"the store holds exactly the 2xx deliveries, each once: PASS ({s.rows:,} and {p.rows:,} rows,"
        " warm-up included)"
    )
    one_s, many_s = f.spread_one, f.spread_many
    if one_s is None or many_s is None:
        return
    print()
    print(
        f"delivery spread: {one_s.subscriptions} poll subscriptions x {one_s.items} items,"
        " each process its share (agentwake.ownership)"
    )
    row("", "1 process", f"{many_s.processes} processes", "ratio")
    row("subscriptions per process", "/".join(map(str, one_s.held)), "/".join(map(str, many_s.held)))
    row("spawn until spread, every loop polling (s)", f"{one_s.settle_s:.1f}", f"{many_s.settle_s:.1f}")
    row(
        "stored events/s",
        f"{one_s.events_per_s:,.0f}",
        f"{many_s.events_per_s:,.0f}",
        f"{many_s.events_per_s / one_s.events_per_s:.2f}x",
    )
    row("seconds (gate open to all stored)", f"{one_s.seconds:.2f}", f"{many_s.seconds:.2f}")
    cpu_rows(row, one_s.cpu, many_s.cpu)
    print(f"every item stored exactly once: PASS ({one_s.subscriptions * one_s.items:,} events, both sides)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--events", type=int, default=DEFAULT_EVENTS, help=f"events per side (default {DEFAULT_EVENTS})"
    )
    parser.add_argument(
        "--llm-ms",
        type=float,
        default=DEFAULT_LLM_MS,
        help=f"the LLM's latency per call (default {DEFAULT_LLM_MS:g})",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=DEFAULT_PROCESSES,
        help=f"processes against one (default {DEFAULT_PROCESSES})",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help=f"[agent] concurrency of each process (default {DEFAULT_CONCURRENCY})",
    )
    parser.add_argument(
        "--deliveries",
        type=int,
        default=DEFAULT_DELIVERIES,
        help=f"webhook deliveries per store (default {DEFAULT_DELIVERIES})",
    )
    parser.add_argument(
        "--senders",
        type=int,
        default=DEFAULT_SENDERS,
        help=f"webhook connections (default {DEFAULT_SENDERS})",
    )
    parser.add_argument(
        "--subscriptions",
        type=int,
        default=DEFAULT_SUBSCRIPTIONS,
        help=f"poll subscriptions spread over the processes (default {DEFAULT_SUBSCRIPTIONS}; 0: skip)",
    )
    parser.add_argument(
        "--items",
        type=int,
        default=DEFAULT_ITEMS,
        help=f"items per subscription (default {DEFAULT_ITEMS})",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument(
        "--keep", action="store_true", help="keep the temp folder: configs, every process's log"
    )
    args = parser.parse_args(argv)
    if (
        args.processes < 2
        or args.concurrency < 1
        or args.llm_ms < 0
        or args.senders < 1
        or args.deliveries < 1
    ):
        parser.error("--processes at least 2; --concurrency, --senders, --deliveries at least 1")
    if args.events < args.processes * args.concurrency:
        parser.error("--events must fill every slot of every process: at least --processes x --concurrency")
    # A service manager's SIGTERM unwinds like Ctrl-C: children and the PostgreSQL server are stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return finish(partial(run, args), as_json=args.json, report=report)
    except KeyboardInterrupt:
        print("scale_out: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
