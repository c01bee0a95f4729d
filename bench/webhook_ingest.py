"""Signed webhook deliveries into the real receiver and store, against a bare aiohttp handler.

    .venv/bin/python bench/webhook_ingest.py                 # 64 senders, 10 s per side
    .venv/bin/python bench/webhook_ingest.py --seconds 3 --senders 16 --json
    .venv/bin/python bench/webhook_ingest.py --tls           # both sides behind TLS (trustme)
    .venv/bin/python bench/webhook_ingest.py --profile /tmp/receiver.prof   # cProfile of the receiver
    .venv/bin/python bench/webhook_ingest.py --repeat 3      # rounds; medians (a shared machine is noisy)

The receiver under test is agentwake's real one: ``Receiver`` (aiohttp, Standard Webhooks
verification, JSON and shape checks, group commit) with a real ``Store`` on a SQLite file
in a temp dir (WAL, ``synchronous=normal``, the service's default), one subscription bound
in ``WebhookRoutes``, listening on loopback. Every 2xx means the event was committed. The
baseline, in the same run, is a bare aiohttp app whose only handler answers
``web.Response(status=200)``: no verification, no parsing, no storing. The receiver itself
runs on aiohttp's low-level server (``web.Server``: it needs no router), so the same bare
handler on that server is measured too and its ratio printed as a reference: it shows what
verifying and storing cost on top of the receiver's own HTTP layer. Each server runs in its
own subprocess (``--serve real|bare|bare-lowlevel``, started by this script), so its event
loop has a core to itself; the machine has two, the senders get the other. The bare sides
go first; the real one right after them, each for ``--seconds`` after ``--warmup`` seconds
that are not counted. The figures are the sender's view.

The senders are ``--senders`` keep-alive HTTP/1.1 connections, one request in flight on
each (a new one as soon as the answer is in), driven by a bare asyncio protocol rather
than an HTTP client library, so that the load generator is cheap next to what it
measures; its own CPU use is reported (``sender_cpu``, in cores). Each request is a
distinct ``ticket.created`` delivery with its own eventId and cursor, signed with
``agentwake.signing.sign``; bodies, signatures and request bytes are built before the
clock starts (the bare side cycles through its pool; the real side's pool is sized from
the bare side's count, and any request beyond it is built when sent, counted in
``built_inline``). The clock of one request runs from writing it to its whole response.

Plain HTTP by default: TLS adds the same record encryption to every request on both sides
(the connections are kept alive, so no handshake falls in the window), which would only
dilute the difference; ``--tls`` measures it anyway (a trustme CA, the receiver's own
``tls_context`` on both sides).

Nothing lost: after the real side stops, its store is opened and its events compared with
the deliveries answered 2xx: the same eventIds, each once, and as many as the receiver
counted. Any difference is a failure (exit 1), as is a side that accepted nothing or a
connection the server closed under a request. Non-2xx answers (503 when the commit backlog
is full) are counted and must not be in the store.

Besides rates and latencies: each server's CPU use in the window (from /proc; a loop near
1.00 cores is saturated) and its CPU time per answered request, which a busy machine
disturbs less than the rates; and how many commits the group commit made.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import ssl
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc
from _harness import BenchFailure, busy_loops, finish, loadavg
from anyio.streams.buffered import BufferedByteReceiveStream

SCRIPT: Final = Path(__file__).resolve()
REPO_ROOT: Final = SCRIPT.parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # `--serve` children and direct runs import agentwake from here

from agentwake import signing  # noqa: E402
from agentwake.config import WebhookConfig  # noqa: E402
from agentwake.service import settle_collector  # noqa: E402
from agentwake.store import Store, SubscriptionKey  # noqa: E402
from agentwake.store.sqlite import SqliteCore, SqliteStore  # noqa: E402

DEFAULT_SECONDS: Final = 10.0
DEFAULT_WARMUP: Final = 1.0
DEFAULT_SENDERS: Final = 64
DEFAULT_REPEAT: Final = 1
TARGET_RATIO: Final = 0.5
TARGET_P99_MS: Final = 25.0
HOST: Final = "127.0.0.1"
SUBSCRIPTION: Final = "bench"
SERVER: Final = "bench-server"
EVENT: Final = "ticket.created"
WEBHOOK_ID: Final = "wh_bench_0001"
BARE_POOL: Final = 20_000  # distinct requests the bare side cycles through
POOL_MARGIN: Final = 1.25  # the real side's pool: this many times the bare side's count
# Every request carries the timestamp of its pool; the receiver accepts 5 minutes.
MAX_RUN_S: Final = 240.0
STARTUP_TIMEOUT_S: Final = 60.0
DRAIN_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class Figures:
    seconds: float
    warmup_s: float
    senders: int
    tls: bool
    repeat: int
    # The real receiver (the last round's counts; rates and latencies: medians over rounds).
    sent: int
    accepted: int
    non_2xx: int
    rows: int
    duplicates: int
    accepted_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    receiver_cpu: float | None
    receiver_us_per_delivery: float | None
    commits: int
    deliveries_per_commit: float
    tail: dict[str, Any]  # inside the receiver, last round: commit times and GC pauses (TailProbe)
    sender_cpu: float
    built_inline: int
    statuses: dict[str, int]
    # The bare aiohttp handler.
    bare_sent: int
    bare_per_s: float
    bare_p50_ms: float
    bare_p99_ms: float
    bare_max_ms: float
    bare_server_cpu: float | None
    bare_us_per_request: float | None
    bare_sender_cpu: float
    # The same handler on aiohttp's low-level server (web.Server), which the receiver runs on: a reference.
    bare_lowlevel_per_s: float
    bare_lowlevel_us_per_request: float | None
    ratio_vs_lowlevel: float
    ratio: float
    ratios: list[float]
    cpu_ratio: float | None  # bare_us_per_request / receiver_us_per_delivery: the ratio, from CPU time
    target_ratio: float
    target_p99_ms: float
    pass_ratio: bool
    pass_p99: bool
    nothing_lost: bool
    load: int = 0  # busy-looping processes beside the measurement (--load)
    loadavg_before: list[float] = field(default_factory=list)
    loadavg_after: list[float] = field(default_factory=list)


# ---- the requests ------------------------------------------------------------------------


class Deliveries:
    """Signed delivery requests, as bytes ready for the socket; built up front, or when sent past the pool."""

    def __init__(self, key: bytes, *, prebuilt: int, cycle: bool, host_header: str) -> None:
        self.key = key
        self.host_header = host_header
        self.stamp = str(int(time.time()))
        self.cycle = cycle
        self.pool = [self.build(i) for i in range(prebuilt)]
        self.taken = 0
        self.inline = 0

    def build(self, n: int) -> bytes:
        event_id = f"evt-{n:09d}"
        body = (
            f'{{"eventId":"{event_id}","name":"{EVENT}","timestamp":"2024-06-01T12:00:00.000Z",'
            f'"cursor":"{n + 1}","data":{{"ticketId":"T-{n}","queue":"support","priority":"P2",'
            f'"title":"Cannot log in after password reset","reporter":"user{n % 997}@example.com"}}}}'
        ).encode()
        signature = signing.sign([self.key], event_id, self.stamp, body)
        head = (
            f"POST /hooks/{SUBSCRIPTION} HTTP/1.1\r\n"
            f"Host: {self.host_header}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"{signing.HEADER_ID}: {event_id}\r\n"
            f"{signing.HEADER_TIMESTAMP}: {self.stamp}\r\n"
            f"{signing.HEADER_SIGNATURE}: {signature}\r\n"
            f"{signing.HEADER_SUBSCRIPTION}: {WEBHOOK_ID}\r\n"
            "\r\n"
        ).encode()
        return head + body

    def take(self) -> tuple[int, bytes]:
        n = self.taken
        self.taken += 1
        if self.cycle:
            return n, self.pool[n % len(self.pool)]
        if n < len(self.pool):
            return n, self.pool[n]
        self.inline += 1
        return n, self.build(n)


def event_number(event_id: str) -> int:
    return int(event_id.removeprefix("evt-"))


# ---- the senders -------------------------------------------------------------------------


@dataclass
class Phase:
    """One side's run: the clock, and what came back."""

    deliveries: Deliveries
    warm_end: float = math.inf
    deadline: float = math.inf
    latencies: list[float] = field(default_factory=list)  # of the 2xx answers inside the window
    sent: int = 0
    accepted: set[int] = field(default_factory=set)  # every 2xx, warm-up and drain included
    statuses: dict[int, int] = field(default_factory=dict)

    def record(self, n: int, status: int, sent_at: float, now: float) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if 200 <= status < 300:
            self.accepted.add(n)
            if self.warm_end <= now < self.deadline:
                self.latencies.append(now - sent_at)


class Sender(asyncio.Protocol):
    """One keep-alive connection, one request in flight; the next goes out as soon as the answer is in."""

    def __init__(self, phase: Phase) -> None:
        self.phase = phase
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.current = -1
        self.sent_at = 0.0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self) -> None:
        assert self.transport is not None
        self.current, request = self.phase.deliveries.take()
        self.phase.sent += 1
        self.sent_at = time.perf_counter()
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].lower()
        status = int(head[9:12])
        length = 0
        if status >= 200 and status not in (204, 304):
            if b"\r\ntransfer-encoding:" in head:
                self._fail("a chunked response; the senders only read Content-Length bodies")
                return
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : stop if stop >= 0 else len(head)])
        if len(self.buffer) < end + 4 + length:
            return
        now = time.perf_counter()
        self.buffer = self.buffer[end + 4 + length :]
        n, self.current = self.current, -1
        if n < 0:
            self._fail(f"an answer ({status}) to no request")
            return
        self.phase.record(n, status, self.sent_at, now)
        if now < self.phase.deadline:
            self.send()
        elif not self.done.done():
            self.done.set_result(None)

    def _fail(self, why: str) -> None:
        if not self.done.done():
            self.done.set_exception(BenchFailure(why))
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        # The senders close only after their last answer; a server that closes first lost track of one.
        if self.current >= 0:
            self._fail(f"the server closed a connection with a request in flight ({exc or 'EOF'})")


@dataclass(frozen=True, slots=True)
class Window:
    wall_s: float
    sender_cpu_s: float
    server_cpu_s: float | None


async def drive(
    port: int,
    pid: int,
    phase: Phase,
    senders: int,
    warmup: float,
    seconds: float,
    context: ssl.SSLContext | None,
) -> Window:
    """All senders connect, then send through warm-up and the window, then collect their last answers."""
    loop = asyncio.get_running_loop()
    connections: list[Sender] = []
    for _ in range(senders):
        _transport, sender = await loop.create_connection(lambda: Sender(phase), HOST, port, ssl=context)
        connections.append(sender)
    start = time.perf_counter()
    phase.warm_end = start + warmup
    phase.deadline = phase.warm_end + seconds
    for sender in connections:
        sender.send()
    done = asyncio.gather(*(s.done for s in connections))
    # Timer wake-ups, not answers, mark the window; the senders run on in the callbacks meanwhile.
    await asyncio.wait([done], timeout=max(0.0, phase.warm_end - time.perf_counter()))
    wall0, cpu0, server0 = time.perf_counter(), time.process_time(), process_cpu(pid)
    await asyncio.wait([done], timeout=max(0.0, phase.deadline - time.perf_counter()))
    wall1, cpu1, server1 = time.perf_counter(), time.process_time(), process_cpu(pid)
    try:
        await asyncio.wait_for(done, timeout=DRAIN_TIMEOUT_S)
    except TimeoutError:
        raise BenchFailure(f"no answer {DRAIN_TIMEOUT_S:g}s after the end of the run") from None
    finally:
        for sender in connections:
            if sender.transport is not None:
                sender.transport.close()
    server_cpu = None if server0 is None or server1 is None else server1 - server0
    return Window(wall1 - wall0, cpu1 - cpu0, server_cpu)


def process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (Linux /proc), None where that is not available."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


# ---- the two servers (subprocesses) ------------------------------------------------------

SECRET_ENV: Final = "BENCH_WEBHOOK_SECRET"


def announce(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def until_stdin_closes() -> None:
    await anyio.to_thread.run_sync(sys.stdin.buffer.read)


def webhook_config(cert: Path | None, key: Path | None) -> WebhookConfig:
    return WebhookConfig(
        listen=f"{HOST}:0", public_url="https://bench.invalid/hooks", tls_cert=cert, tls_key=key
    )


async def serve_real(db: Path, cert: Path | None, key: Path | None) -> None:
    """The real receiver and store, as `agentwake run` sets them up, until stdin closes."""
    from agentwake.delivery.receiver import Receiver, WebhookRoutes

    store = await SqliteStore.open(db)
    try:
        subscription = SubscriptionKey(SUBSCRIPTION, SERVER, EVENT, {})
        await store.register(subscription)
        routes = WebhookRoutes()
        routes.bind(WEBHOOK_ID, subscription, [(os.environ[SECRET_ENV], None)])
        receiver = Receiver(webhook_config(cert, key), store, routes)
        probe = TailProbe(store)
        async with anyio.create_task_group() as tg:
            await tg.start(receiver.serve)
            # As `agentwake run` does after start-up (agentwake/service.py).
            settle_collector()
            probe.watch_gc()
            announce({"port": receiver.port})
            await until_stdin_closes()
            tg.cancel_scope.cancel()
    finally:
        await store.close()
    announce({"counts": dict(receiver.counts), "tail": probe.figures()})


class TailProbe:
    """Where a slow answer can come from, seen inside the receiver: how long each group commit took
    (the store's transaction with its thread hop: a delivery waits for the one in progress and then
    its own), and the garbage collector's pauses (they stop the event loop). One wrapper call per
    batch and one callback per collection: nothing per delivery."""

    def __init__(self, store: Store) -> None:
        self.commit_s: list[float] = []
        self.gc_s: list[tuple[int, float]] = []  # (generation, seconds)
        self._gc_start = 0.0
        ingest = store.ingest_deliveries

        async def timed(deliveries: Any) -> Any:
            start = time.perf_counter()
            try:
                return await ingest(deliveries)
            finally:
                self.commit_s.append(time.perf_counter() - start)

        store.ingest_deliveries = timed  # type: ignore[method-assign]

    def watch_gc(self) -> None:
        """From now on (after start-up's own collection and freeze), time each collection."""
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_s.append((int(info.get("generation", 0)), time.perf_counter() - self._gc_start))

    def figures(self) -> dict[str, Any]:
        pauses = [s for _, s in self.gc_s]
        return {
            "commits": len(self.commit_s),
            "commit_p50_ms": ms(percentile(self.commit_s, 0.5)),
            "commit_p99_ms": ms(percentile(self.commit_s, 0.99)),
            "commit_max_ms": ms(max(self.commit_s, default=math.nan)),
            "gc_pauses": len(pauses),
            "gc_gen2": sum(1 for generation, _ in self.gc_s if generation == 2),
            "gc_max_ms": ms(max(pauses, default=0.0)),
            "gc_total_ms": ms(sum(pauses)),
        }


async def serve_bare(cert: Path | None, key: Path | None, *, lowlevel: bool) -> None:
    """A handler that answers 200 to everything, on the same kind of site, until stdin closes: in an
    aiohttp app (the baseline), or on aiohttp's low-level server, as the receiver runs (a reference)."""
    from aiohttp import web

    from agentwake.delivery.receiver import LISTEN_BACKLOG, tls_context

    async def ok(request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(status=200)

    runner: web.BaseRunner[Any]
    if lowlevel:
        runner = web.ServerRunner(web.Server(ok, access_log=None), handle_signals=False, shutdown_timeout=2.0)
    else:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", ok)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    try:
        context = tls_context(webhook_config(cert, key))
        site = web.TCPSite(runner, HOST, 0, ssl_context=context, backlog=LISTEN_BACKLOG)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        settle_collector()
        announce({"port": sockets[0].getsockname()[1]})
        await until_stdin_closes()
    finally:
        await runner.cleanup()
    announce({"counts": {}, "commits": 0})


def serve_main(args: argparse.Namespace) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    cert, key = args.tls_cert, args.tls_key
    if args.serve == "real":
        main_ = partial(anyio.run, serve_real, args.db, cert, key)
    else:
        main_ = partial(anyio.run, partial(serve_bare, cert, key, lowlevel=args.serve == "bare-lowlevel"))
    if args.profile is None:
        main_()
        return 0
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        main_()
    finally:
        profiler.disable()
        profiler.dump_stats(args.profile)
    return 0


# ---- one side, one round -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Side:
    kind: str
    sent: int
    accepted: int
    statuses: dict[int, int]
    per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    sender_cpu: float
    server_cpu: float | None
    rows: int = 0
    duplicates: int = 0
    commits: int = 0
    built_inline: int = 0
    tail: dict[str, Any] | None = None  # the real side's TailProbe figures

    @property
    def us_per_request(self) -> float | None:
        """Server CPU microseconds per answered request in the window."""
        return None if self.server_cpu is None or not self.per_s else self.server_cpu / self.per_s * 1e6


@dataclass(frozen=True, slots=True)
class Setup:
    tmp: Path
    secret: str
    senders: int
    warmup: float
    seconds: float
    tls: tuple[Path, Path, ssl.SSLContext] | None
    profile: Path | None


def percentile(values: list[float], p: float) -> float:
    """Nearest rank: the smallest value with at least p of the values at or below it."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


async def run_side(setup: Setup, kind: str, deliveries: Deliveries, db: Path | None) -> Side:
    """Start one server, send through it for warm-up + window, stop it; for the real one, count the rows."""
    command = [sys.executable, str(SCRIPT), "--serve", kind]
    if db is not None:
        command += ["--db", str(db)]
    if setup.tls is not None:
        command += ["--tls-cert", str(setup.tls[0]), "--tls-key", str(setup.tls[1])]
    if setup.profile is not None and kind == "real":
        command += ["--profile", str(setup.profile)]
    env = {**os.environ, SECRET_ENV: setup.secret, "PYTHONPATH": str(REPO_ROOT)}
    log = setup.tmp / f"{kind}-server.log"
    phase = Phase(deliveries)
    with log.open("wb") as stderr:
        process = await anyio.open_process(command, stdin=-1, stdout=-1, stderr=stderr, env=env)
    async with process:
        assert process.stdout is not None and process.stdin is not None
        out = BufferedByteReceiveStream(process.stdout)
        try:
            try:
                with anyio.fail_after(STARTUP_TIMEOUT_S):
                    port = json.loads(await out.receive_until(b"\n", 65536))["port"]
            except (TimeoutError, anyio.EndOfStream, anyio.IncompleteRead) as exc:
                raise BenchFailure(f"the {kind} server did not start ({type(exc).__name__})") from None
            window = await drive(
                port,
                process.pid,
                phase,
                setup.senders,
                setup.warmup,
                setup.seconds,
                setup.tls[2] if setup.tls else None,
            )
            await process.stdin.aclose()
            with anyio.fail_after(STARTUP_TIMEOUT_S):
                final = json.loads(await out.receive_until(b"\n", 65536))
                code = await process.wait()
        except BaseException:
            with anyio.CancelScope(shield=True):
                process.kill()
                await process.wait()
            tail = log.read_text(errors="replace")[-2000:]
            if tail:
                print(f"{kind} server's stderr:\n{tail}", file=sys.stderr)
            raise
    if code != 0:
        raise BenchFailure(f"the {kind} server exited with {code}: {log.read_text(errors='replace')[-2000:]}")
    latencies = phase.latencies
    side = Side(
        kind=kind,
        sent=phase.sent,
        accepted=len(phase.accepted),
        statuses=dict(sorted(phase.statuses.items())),
        per_s=len(latencies) / setup.seconds,  # answers completed inside the window
        p50_ms=ms(percentile(latencies, 0.5)),
        p99_ms=ms(percentile(latencies, 0.99)),
        max_ms=ms(max(latencies, default=math.nan)),
        sender_cpu=round(window.sender_cpu_s / window.wall_s, 3),
        server_cpu=None if window.server_cpu_s is None else round(window.server_cpu_s / window.wall_s, 3),
        built_inline=deliveries.inline,
    )
    if not phase.accepted:
        raise BenchFailure(f"the {kind} server accepted nothing: statuses {side.statuses}")
    if db is None:
        return side
    rows, duplicates = count_rows(db, phase.accepted, final.get("counts", {}))
    return Side(
        **{
            **asdict(side),
            "rows": rows,
            "duplicates": duplicates,
            "commits": final["tail"]["commits"],
            "tail": final["tail"],
        }
    )


def count_rows(db: Path, accepted: set[int], counts: dict[str, int]) -> tuple[int, int]:
    """The events in the store, checked against the 2xx answers: (rows, duplicates the receiver counted)."""
    store = SqliteCore.open(db)
    try:
        ids = store.event_ids(SUBSCRIPTION)
    finally:
        store.close()
    stored = {event_number(i) for i in ids}
    lost = accepted - stored
    phantom = stored - accepted
    if len(ids) != len(stored) or lost or phantom or len(ids) != len(accepted):
        raise BenchFailure(
            f"the store holds {len(ids)} events ({len(stored)} distinct) for {len(accepted)} deliveries"
            f" answered 2xx: {len(lost)} answered but not stored (e.g. {sorted(lost)[:5]}),"
            f" {len(phantom)} stored but never answered 2xx (e.g. {sorted(phantom)[:5]})"
        )
    if counts.get("accepted", 0) != len(ids):
        raise BenchFailure(f"the receiver counted {counts} but the store holds {len(ids)} events")
    return len(ids), counts.get("duplicates", 0)


# ---- the run -----------------------------------------------------------------------------


def tls_setup(tmp: Path) -> tuple[Path, Path, ssl.SSLContext]:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert(HOST)
    chain, key = tmp / "receiver.pem", tmp / "receiver.key"
    cert.private_key_pem.write_to_path(str(key))
    with chain.open("wb") as out:
        for blob in cert.cert_chain_pems:
            out.write(blob.bytes())
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return chain, key, context


async def run(
    seconds: float,
    warmup: float,
    senders: int,
    repeat: int = DEFAULT_REPEAT,
    *,
    tls: bool = False,
    profile: Path | None = None,
) -> Figures:
    """``repeat`` rounds of (bare side, then the real side); medians over rounds are reported.

    These machines are noisy: a baseline measured right before its own run, and the median
    over rounds, keeps one slow moment from deciding the ratio.
    """
    bares: list[Side] = []
    lowlevels: list[Side] = []
    reals: list[Side] = []
    with tempfile.TemporaryDirectory(prefix="agentwake-bench-") as tmpdir:
        tmp = Path(tmpdir)
        secret = signing.generate_secret()
        key = signing.decode_secret(secret)
        setup = Setup(tmp, secret, senders, warmup, seconds, tls_setup(tmp) if tls else None, profile)
        for round_ in range(repeat):
            host_header = HOST
            bare = await run_side(
                setup, "bare", Deliveries(key, prebuilt=BARE_POOL, cycle=True, host_header=host_header), None
            )
            lowlevel = await run_side(
                setup,
                "bare-lowlevel",
                Deliveries(key, prebuilt=BARE_POOL, cycle=True, host_header=host_header),
                None,
            )
            pool = max(1000, math.ceil(bare.sent * POOL_MARGIN))
            deliveries = Deliveries(key, prebuilt=pool, cycle=False, host_header=host_header)
            real = await run_side(setup, "real", deliveries, tmp / f"round-{round_}.db")
            bares.append(bare)
            lowlevels.append(lowlevel)
            reals.append(real)
    last = reals[-1]
    ratios = [r.per_s / b.per_s for r, b in zip(reals, bares, strict=True)]
    ratio = statistics.median(ratios)
    p99 = statistics.median(r.p99_ms for r in reals)
    return Figures(
        seconds=seconds,
        warmup_s=warmup,
        senders=senders,
        tls=tls,
        repeat=repeat,
        sent=last.sent,
        accepted=last.accepted,
        non_2xx=sum(count for status, count in last.statuses.items() if not 200 <= status < 300),
        rows=last.rows,
        duplicates=last.duplicates,
        accepted_per_s=round(statistics.median(r.per_s for r in reals), 1),
        p50_ms=statistics.median(r.p50_ms for r in reals),
        p99_ms=p99,
        max_ms=max(r.max_ms for r in reals),
        receiver_cpu=median_or_none([r.server_cpu for r in reals]),
        receiver_us_per_delivery=rounded(median_or_none([r.us_per_request for r in reals]), 1),
        commits=last.commits,
        deliveries_per_commit=round(last.accepted / last.commits, 1) if last.commits else 0.0,
        tail=last.tail or {},
        sender_cpu=statistics.median(r.sender_cpu for r in reals),
        built_inline=sum(r.built_inline for r in reals),
        statuses={str(k): v for k, v in last.statuses.items()},
        bare_sent=bares[-1].sent,
        bare_per_s=round(statistics.median(b.per_s for b in bares), 1),
        bare_p50_ms=statistics.median(b.p50_ms for b in bares),
        bare_p99_ms=statistics.median(b.p99_ms for b in bares),
        bare_max_ms=max(b.max_ms for b in bares),
        bare_server_cpu=median_or_none([b.server_cpu for b in bares]),
        bare_us_per_request=rounded(median_or_none([b.us_per_request for b in bares]), 1),
        bare_sender_cpu=statistics.median(b.sender_cpu for b in bares),
        bare_lowlevel_per_s=round(statistics.median(b.per_s for b in lowlevels), 1),
        bare_lowlevel_us_per_request=rounded(median_or_none([b.us_per_request for b in lowlevels]), 1),
        ratio_vs_lowlevel=round(
            statistics.median(r.per_s / b.per_s for r, b in zip(reals, lowlevels, strict=True)), 4
        ),
        ratio=round(ratio, 4),
        ratios=[round(r, 4) for r in ratios],
        cpu_ratio=rounded(median_or_none([cpu_ratio(r, b) for r, b in zip(reals, bares, strict=True)]), 4),
        target_ratio=TARGET_RATIO,
        target_p99_ms=TARGET_P99_MS,
        pass_ratio=ratio >= TARGET_RATIO,
        pass_p99=p99 <= TARGET_P99_MS,
        nothing_lost=True,  # count_rows raised otherwise
    )


def median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def cpu_ratio(real: Side, bare: Side) -> float | None:
    if real.us_per_request is None or bare.us_per_request is None or not real.us_per_request:
        return None
    return bare.us_per_request / real.us_per_request


def rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


# ---- reporting ---------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def cores(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} cores"


def micros(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} us"


def report(f: Figures) -> None:
    window = f"{f.seconds:g} s after {f.warmup_s:g} s warm-up, {f.senders} senders"
    print(f"webhook ingest, {'https' if f.tls else 'http'} on loopback ({window}, {f.repeat} round(s))")
    beside = f"{f.load} busy-looping process(es) beside it" if f.load else "no load of its own"
    print(
        f"machine:                 {os.cpu_count()} CPU(s), {beside}; load average"
        f" {' '.join(map(str, f.loadavg_before))} before, {' '.join(map(str, f.loadavg_after))} after"
    )
    print(
        f"real receiver + store:   {f.accepted_per_s:>9,.0f} accepted/s   p50 {f.p50_ms:7.2f} ms"
        f"   p99 {f.p99_ms:7.2f} ms   max {f.max_ms:7.2f} ms"
    )
    print(
        f"bare aiohttp handler:    {f.bare_per_s:>9,.0f} answered/s   p50 {f.bare_p50_ms:7.2f} ms"
        f"   p99 {f.bare_p99_ms:7.2f} ms   max {f.bare_max_ms:7.2f} ms"
    )
    print(
        f"bare, low-level server:  {f.bare_lowlevel_per_s:>9,.0f} answered/s"
        f"   (the receiver's own aiohttp layer; {micros(f.bare_lowlevel_us_per_request)} per request)"
    )
    print(
        f"deliveries (last round): {f.sent:,} sent, {f.accepted:,} answered 2xx, {f.non_2xx:,} not"
        f" {f.statuses}; {f.rows:,} rows in the store ({f.duplicates} duplicates)"
    )
    print(
        f"CPU in the window:       receiver {cores(f.receiver_cpu)}, its senders {cores(f.sender_cpu)};"
        f" bare server {cores(f.bare_server_cpu)}, its senders {cores(f.bare_sender_cpu)}"
    )
    print(
        f"server CPU per request:  receiver {micros(f.receiver_us_per_delivery)},"
        f" bare {micros(f.bare_us_per_request)}"
    )
    print(
        f"group commit:            {f.commits:,} commits, {f.deliveries_per_commit:g} deliveries each on average"
    )
    t = f.tail
    if t:
        print(
            f"inside the receiver:     a commit takes p50 {t['commit_p50_ms']:.2f} ms, p99"
            f" {t['commit_p99_ms']:.2f} ms, max {t['commit_max_ms']:.2f} ms; {t['gc_pauses']:,} GC pauses"
            f" ({t['gc_gen2']} full), longest {t['gc_max_ms']:.2f} ms, {t['gc_total_ms']:.0f} ms in all"
        )
    if f.built_inline:
        print(f"requests built while sending (pool too small): {f.built_inline:,}")
    ratios = ", ".join(f"{r:.3f}" for r in f.ratios)
    print(f"ratio real / bare:       {f.ratio:.3f} (per round: {ratios})")
    if f.cpu_ratio is not None:
        print(f"  the same from CPU time: {f.cpu_ratio:.3f} (bare us per request / receiver us per delivery)")
    print(f"  against the low-level bare server: {f.ratio_vs_lowlevel:.3f} (a reference, not the target)")
    print(f"target ratio >= {f.target_ratio}:     {verdict(f.pass_ratio)} ({f.ratio:.3f})")
    print(f"target p99 <= {f.target_p99_ms:g} ms:     {verdict(f.pass_p99)} ({f.p99_ms:.2f} ms)")
    print(f"nothing lost:            {verdict(f.nothing_lost)} ({f.rows:,} rows = {f.accepted:,} 2xx)")


def print_profile(path: Path, limit: int = 25) -> None:
    import pstats

    print(f"\nreceiver profile (cProfile of the last round's real side; it slows the receiver): {path}")
    pstats.Stats(str(path), stream=sys.stdout).sort_stats("tottime").print_stats(limit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=DEFAULT_SECONDS, help="measured seconds per side (default 10)"
    )
    parser.add_argument(
        "--warmup", type=float, default=DEFAULT_WARMUP, help="seconds sent before the window (default 1)"
    )
    parser.add_argument(
        "--senders", type=int, default=DEFAULT_SENDERS, help="concurrent connections (default 64)"
    )
    parser.add_argument(
        "--repeat", type=int, default=DEFAULT_REPEAT, help="rounds of bare + real; medians (default 1)"
    )
    parser.add_argument("--tls", action="store_true", help="both servers behind TLS (a trustme CA)")
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        metavar="N",
        help="run N busy-looping processes beside both sides (default 0; N = cores: a loaded machine)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="write a cProfile of the real receiver to this file (it slows the receiver: not for figures)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    # The servers: this script started by itself.
    parser.add_argument("--serve", choices=("real", "bare", "bare-lowlevel"), help=argparse.SUPPRESS)
    parser.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tls-cert", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tls-key", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        return serve_main(args)
    if args.seconds <= 0 or args.warmup < 0:
        parser.error("--seconds must be positive and --warmup not negative")
    if args.seconds + args.warmup > MAX_RUN_S:
        parser.error(
            f"--seconds + --warmup at most {MAX_RUN_S:g}: the signatures' timestamps must stay fresh"
        )
    if args.senders < 1 or args.repeat < 1:
        parser.error("--senders and --repeat must be at least 1")
    if args.load < 0:
        parser.error("--load must be 0 or more")
    measure = partial(
        run,
        args.seconds,
        args.warmup,
        args.senders,
        args.repeat,
        tls=args.tls,
        profile=args.profile.resolve() if args.profile else None,
    )

    def report_and_profile(figures: Figures) -> None:
        report(figures)
        if args.profile is not None:
            print_profile(args.profile)

    def loaded() -> Figures:
        with busy_loops(args.load):
            before = loadavg()
            figures = anyio.run(measure)
            return replace(figures, load=args.load, loadavg_before=before, loadavg_after=loadavg())

    return finish(loaded, as_json=args.json, report=report_and_profile)


if __name__ == "__main__":
    sys.exit(main())
