"""Idle connections cannot keep deliveries out: the receiver's connection gate.

The receiver caps open connections (``max_connections``, below the open-file limit) and the
connections of one client (``max_connections_per_client``), closing one over a cap at accept,
unread; above half of ``max_connections`` it closes connections that have sent nothing for
a second. The flood test runs the real receiver in a process of its own whose open-file limit
is 1,024 (soft and hard; or soft only, which the receiver raises) (tests/webhook_receiver_proc.py),
floods it with 2,000 idle TCP connections from 127.0.0.1 and meanwhile delivers 60 signed events
from 127.0.0.2: each is answered 204 within seconds (before the gate: none in 12 s).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import ssl
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.abc
import pytest
from _webhook_support import TLS, Hook, MeteredReceiver, event, make_tls, running_hook
from conftest import REPO, free_port

from agentwake import signing
from agentwake.delivery.connections import ConnectionGate, _Connection
from agentwake.store import Store
from agentwake.store.sqlite import SqliteCore, SqliteStore

pytestmark = pytest.mark.anyio

FLOOD = 2000
DELIVERIES = 60
IN_FLIGHT = 6  # a sender keeps several deliveries in flight
PROMPT_S = 5.0  # each delivery, from its connect to its answer
FLOODER, SENDER = "127.0.0.1", "127.0.0.2"
HOOK_ID = "sub_0123456789abcdef"


def second_loopback_address() -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((SENDER, 0))
        except OSError:
            return False
    return True


needs_second_address = pytest.mark.skipif(
    not second_loopback_address(), reason=f"{SENDER} is not a loopback address here (Linux has it)"
)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLS:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def open_files_for_the_flood() -> Iterator[None]:
    """The flood's sockets are this process's too: room for them, given back afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = FLOOD + 512
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"the open-file hard limit {hard} leaves no room for {FLOOD} connections")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@asynccontextmanager
async def receiver_process(
    tmp_path: Path, port: int, cert: Path, secret: str, nofile: str, result: dict[str, Any]
) -> AsyncIterator[None]:
    """The receiver in its own process; on exit it is stopped and ``result`` gets its counts and log."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HOOK_ID": HOOK_ID,
        "HOOK_SECRET": secret,
        "HOOK_NOFILE": nofile,
        "HOOK_LOG": "INFO",
    }
    log = tmp_path / "receiver.log"
    with log.open("wb") as stderr:
        process = await anyio.open_process(
            [
                sys.executable,
                str(REPO / "tests" / "webhook_receiver_proc.py"),
                str(tmp_path / "aw.db"),
                str(port),
                str(cert),
            ],
            env=env,
            stderr=stderr,
        )
    assert process.stdout is not None
    output = b""
    try:
        with anyio.fail_after(30):
            async for chunk in process.stdout:
                output += chunk
                if b"listening\n" in output:
                    break
        yield
        process.terminate()
        with anyio.fail_after(15):
            async for chunk in process.stdout:
                output += chunk
            await process.wait()
        result["counts"] = json.loads(output.split(b"listening\n", 1)[1])["counts"]
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.CancelScope(shield=True):
            await process.wait()
            await process.aclose()
        result["log"] = log.read_text()


async def idle_connection(port: int, host: str = FLOODER) -> socket.socket:
    """A TCP connection from ``host`` that sends nothing (a bare socket: no name lookup, no TLS)."""
    sock = socket.socket()
    sock.setblocking(False)
    sock.bind((host, 0))
    try:
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock


async def flood(port: int, opened: Callable[[int], None], sockets: list[socket.socket]) -> None:
    """FLOOD idle TCP connections from FLOODER, a few hundred connecting at a time."""
    limiter = anyio.CapacityLimiter(256)

    async def one() -> None:
        async with limiter:
            sockets.append(await idle_connection(port))
        opened(len(sockets))

    async with anyio.create_task_group() as tg:
        for _ in range(FLOOD):
            tg.start_soon(one)


def signed(secret: str, n: int) -> tuple[bytes, dict[str, str]]:
    event_id = f"T-{n:06}"
    body = json.dumps(
        {
            "eventId": event_id,
            "name": "ticket.created",
            "timestamp": "2026-12-02T12:00:00.000Z",
            "data": {"ticketId": event_id},
            "cursor": str(n),
        }
    ).encode()
    stamp = int(time.time())
    return body, {
        "Content-Type": "application/json",
        signing.HEADER_ID: event_id,
        signing.HEADER_TIMESTAMP: str(stamp),
        signing.HEADER_SIGNATURE: signing.sign([signing.decode_secret(secret)], event_id, stamp, body),
        signing.HEADER_SUBSCRIPTION: HOOK_ID,
    }


async def deliver_all(port: int, secret: str, context: ssl.SSLContext) -> list[tuple[int, float]]:
    """DELIVERIES signed events from SENDER, each on a connection of its own; (status, seconds) each."""
    results: list[tuple[int, float]] = []
    limiter = anyio.CapacityLimiter(IN_FLIGHT)
    connector = aiohttp.TCPConnector(ssl=context, local_addr=(SENDER, 0), force_close=True, limit=IN_FLIGHT)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one(n: int) -> None:
            async with limiter:
                body, headers = signed(secret, n)
                started = time.monotonic()
                with anyio.fail_after(PROMPT_S):
                    async with http.post(
                        f"https://127.0.0.1:{port}/tickets", data=body, headers=headers
                    ) as r:
                        await r.read()
                results.append((r.status, time.monotonic() - started))

        async with anyio.create_task_group() as tg:
            for n in range(1, DELIVERIES + 1):
                tg.start_soon(one, n)
    return results


@pytest.mark.slow
@needs_second_address
@pytest.mark.usefixtures("open_files_for_the_flood")
@pytest.mark.parametrize(
    ("nofile", "raised"),
    [("1024:1024", False), ("1024", True)],
    ids=["limit-1024-not-raisable", "soft-limit-1024-raised"],
)
async def test_a_flood_of_idle_connections_keeps_no_delivery_out(
    tmp_path: Path, tls: TLS, nofile: str, raised: bool
) -> None:
    cert, context = tls.pem, tls.client_context
    secret = signing.generate_secret()
    port = free_port()
    result: dict[str, Any] = {}
    sockets: list[socket.socket] = []
    half_open = anyio.Event()

    def opened(count: int) -> None:
        if count >= FLOOD // 2:
            half_open.set()

    async with receiver_process(tmp_path, port, cert, secret, nofile, result):
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(flood, port, opened, sockets)
                with anyio.fail_after(20):
                    await half_open.wait()
                # Half the flood is in, the rest comes while the deliveries run; all of it is held.
                delivered = await deliver_all(port, secret, context)
            assert len(sockets) == FLOOD
        finally:
            for sock in sockets:
                sock.close()

    assert sorted(status for status, _ in delivered) == [204] * DELIVERIES
    assert max(seconds for _, seconds in delivered) < PROMPT_S
    core = SqliteCore.open(tmp_path / "aw.db")
    try:
        assert sorted(core.event_ids("tickets")) == [f"T-{n:06}" for n in range(1, DELIVERIES + 1)]
    finally:
        core.close()
    counts, log = result["counts"], result["log"]
    assert counts["accepted"] == DELIVERIES
    # One client holds 256 connections at most (the default); the rest of its flood was closed unread.
    assert counts["refused_connections_per_client"] == FLOOD - 256
    assert "connection(s) over max_connections_per_client" in log
    if raised:
        assert "open-file limit raised from 1024 to" in log
    else:
        assert "open-file limit 1024 (already the hard limit)" in log
        assert "at most 896 connection(s), 256 per client" in log


class GateWatch:
    """Wakes a test whenever the gate admits, refuses or lets go of a connection."""

    def __init__(self, gate: ConnectionGate) -> None:
        self.gate = gate
        self.admitted = 0
        self._changed = anyio.Event()
        admit, release = gate.admit, gate.release

        def watched_admit(connection: _Connection, peer: Any) -> bool:
            admitted = admit(connection, peer)
            self.admitted += admitted
            self._poke()
            return admitted

        def watched_release(connection: _Connection) -> None:
            release(connection)
            self._poke()

        gate.admit = watched_admit  # type: ignore[method-assign]
        gate.release = watched_release  # type: ignore[method-assign]

    def _poke(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()


def stored(store: Store) -> list[str]:
    assert isinstance(store, SqliteStore)
    return store.core.event_ids("tickets")


async def connect(port: int, host: str = FLOODER) -> anyio.abc.SocketStream:
    return await anyio.connect_tcp("127.0.0.1", port, local_host=host)


async def closed_by_the_receiver(stream: anyio.abc.ByteStream) -> bool:
    try:
        await stream.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        return True
    return False


@needs_second_address
async def test_the_65th_connection_from_one_address_is_closed_unread_while_another_address_gets_in(
    tls: TLS, store: Store
) -> None:
    async with running_hook(tls, store, max_connections_per_client=64) as hook:
        gate = hook.receiver.connections
        assert gate is not None and hook.receiver.port is not None
        watch = GateWatch(gate)
        port = hook.receiver.port
        with anyio.fail_after(10):
            held = [await connect(port) for _ in range(64)]
            await watch.until(lambda: gate.open == 64)
            extra = await connect(port)
            assert await closed_by_the_receiver(extra)  # at once, not after any timeout
            assert hook.receiver.counts["refused_connections_per_client"] == 1
            with pytest.raises(aiohttp.ClientConnectionError):
                await hook.deliver(event("evt_1"))  # the same address, through a real client
            connector = aiohttp.TCPConnector(ssl=tls.client_context, local_addr=(SENDER, 0))
            async with aiohttp.ClientSession(connector=connector) as other:
                body = json.dumps(event("evt_2"))
                async with other.post(hook.url, data=body, headers=hook.headers(body, msg_id="evt_2")) as r:
                    assert r.status == 204
                assert gate.clients == {FLOODER: 64, SENDER: 1}
            # One of the 64 goes: the address gets in again.
            await held.pop().aclose()
            await watch.until(lambda: gate.clients.get(FLOODER) == 63)
            assert (await hook.deliver(event("evt_3"))).status == 204
            for stream in [*held, extra]:
                await stream.aclose()
        assert stored(store) == ["evt_2", "evt_3"]


async def keep_alive_delivery(stream: anyio.abc.ByteStream, hook: Hook, event_id: str) -> bytes:
    """One delivery on an open connection, kept open; the response head."""
    body = json.dumps(event(event_id)).encode()
    headers = hook.headers(body.decode(), msg_id=event_id)
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    await stream.send(
        f"POST /tickets HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    received = b""
    while b"\r\n\r\n" not in received:
        received += await stream.receive()
    return received.partition(b"\r\n\r\n")[0]


class PatientReceiver(MeteredReceiver):
    header_timeout_s = 60.0


async def test_silent_connections_are_closed_only_above_the_watermark_and_keep_alive_ones_survive(
    tls: TLS, store: Store
) -> None:
    # max_connections 6: above 3 open, a connection silent for 1 s is closed. The header timeout is
    # pushed out of the way: on a busy machine it could close them first, and this is about the watermark.
    async with running_hook(tls, store, receiver_class=PatientReceiver, max_connections=6) as hook:
        gate = hook.receiver.connections
        assert gate is not None and hook.receiver.port is not None
        assert (gate.limit, gate.watermark) == (6, 3)
        watch = GateWatch(gate)
        port = hook.receiver.port
        with anyio.fail_after(10):
            keep_alive = await anyio.connect_tcp(
                "127.0.0.1", port, ssl_context=tls.client_context, tls=True, tls_standard_compatible=False
            )
            assert (await keep_alive_delivery(keep_alive, hook, "evt_1")).startswith(b"HTTP/1.1 204")
            silent = [await connect(port), await connect(port)]
            await watch.until(lambda: gate.open == 3)
            # At the watermark (not above), silence is tolerated until the header timeout.
            assert gate.sweep(anyio.current_time() + 2) == 0
            assert gate.open == 3

            silent += [await connect(port) for _ in range(3)]
            await watch.until(lambda: watch.admitted == 6)
            refused = await connect(port)  # the 7th: over max_connections
            assert await closed_by_the_receiver(refused)
            assert hook.receiver.counts["refused_connections"] == 1
            # Above the watermark, the oldest silent ones go until it is no longer exceeded.
            await watch.until(lambda: gate.open <= gate.watermark)
            closed = hook.receiver.counts["closed_silent_connections"]
            assert closed >= 3
            assert sum([await closed_by_the_receiver(s) for s in silent[:closed]]) == closed

            # The keep-alive connection, idle all along, has spoken: it survived and serves on.
            assert (await keep_alive_delivery(keep_alive, hook, "evt_2")).startswith(b"HTTP/1.1 204")
            for stream in [keep_alive, *silent, refused]:
                await stream.aclose()
        assert stored(store) == ["evt_1", "evt_2"]
