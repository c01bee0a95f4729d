"""One client's idle connections cannot keep deliveries out when every sender shares its address.

Behind the TLS reverse proxy the README recommends, or on one host, the flood and the senders come
from one address, and the per-client cap (256) alone let 600 idle connections refuse every
delivery for as long as they were held. Two defences, each tested with 600 idle TCP connections
from 127.0.0.1, the senders' address too:

* whatever the totals, a connection with no complete request head within 3 s is closed, so the
  address's places come back within seconds and a sender that retries gets in;
* with ``[webhook] trusted_proxy``, the proxy's connections are not held to the per-client cap at
  all, and each client named by its X-Forwarded-For has at most ``max_connections_per_client``
  requests in progress (more: 429).
"""

from __future__ import annotations

import json
import resource
import socket
import time
from collections.abc import Iterator

import aiohttp
import anyio
import anyio.abc
import pytest
from _webhook_support import TLS, Hook, event, make_tls, running_hook
from test_webhook_receiver_flood import FLOODER, GateWatch, idle_connection, stored

from agentwake.store import Store

pytestmark = pytest.mark.anyio

IDLE = 600
DELIVERIES = 20


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLS:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def open_files() -> Iterator[None]:
    """Both ends of each idle connection are this process's: room for them, given back afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * IDLE + 512
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"the open-file hard limit {hard} leaves no room for {IDLE} connections")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def idle_flood(port: int) -> list[socket.socket]:
    sockets: list[socket.socket] = []
    for _ in range(IDLE):
        try:
            sockets.append(await idle_connection(port))
        except OSError:  # refused at once over the per-client cap: routine here
            continue
    return sockets


@pytest.mark.usefixtures("open_files")
async def test_idle_connections_from_the_senders_address_are_closed_and_deliveries_get_in(
    tls: TLS, store: Store
) -> None:
    async with running_hook(tls, store) as hook:
        gate = hook.receiver.connections
        assert gate is not None and hook.receiver.port is not None
        watch = GateWatch(gate)
        sockets = await idle_flood(hook.receiver.port)
        try:
            with anyio.fail_after(10):
                await watch.until(lambda: gate.clients.get(FLOODER) == gate.per_client == 256)
            flooded = time.monotonic()
            with anyio.fail_after(8):  # the idle connections are held for 15 s without the fix
                for n in range(1, DELIVERIES + 1):
                    while True:  # a sender retries a refused connection
                        try:
                            reply = await hook.deliver(event(f"evt_{n}"))
                            break
                        except aiohttp.ClientConnectionError:
                            await watch.until(lambda: gate.clients.get(FLOODER, 0) < gate.per_client)
                    assert reply.status == 204
            assert time.monotonic() - flooded < 8
            assert hook.receiver.counts["closed_idle_connections"] > 0
        finally:
            for sock in sockets:
                sock.close()
    assert stored(store) == [f"evt_{n}" for n in range(1, DELIVERIES + 1)]


async def forwarded(hook: Hook, event_id: str, client: str) -> int:
    body = json.dumps(event(event_id))
    headers = {**hook.headers(body, msg_id=event_id), "X-Forwarded-For": client}
    return (await hook.post(body.encode(), headers)).status


async def held_request(hook: Hook, tls: TLS, event_id: str, client: str) -> anyio.abc.ByteStream:
    """A delivery whose head is sent and body is not: in progress until the stream closes."""
    assert hook.receiver.port is not None
    stream = await anyio.connect_tcp(
        "127.0.0.1",
        hook.receiver.port,
        ssl_context=tls.client_context,
        tls=True,
        tls_standard_compatible=False,
    )
    body = json.dumps(event(event_id))
    headers = {**hook.headers(body, msg_id=event_id), "X-Forwarded-For": client}
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    await stream.send(
        f"POST /tickets HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode()
    )
    return stream


@pytest.mark.usefixtures("open_files")
async def test_behind_a_trusted_proxy_its_idle_connections_refuse_nothing_and_each_forwarded_client_is_capped(
    tls: TLS, store: Store
) -> None:
    async with running_hook(tls, store, trusted_proxy="127.0.0.1", max_connections_per_client=2) as hook:
        gate = hook.receiver.connections
        assert gate is not None and hook.receiver.port is not None
        watch = GateWatch(gate)
        sockets = await idle_flood(hook.receiver.port)
        held: list[anyio.abc.ByteStream] = []
        try:
            assert len(sockets) == IDLE
            with anyio.fail_after(10):
                await watch.until(lambda: gate.clients.get(FLOODER, 0) >= IDLE)
                # Far over the per-client cap of 2, from the proxy's address: every delivery gets in.
                for n in range(1, DELIVERIES + 1):
                    assert await forwarded(hook, f"evt_{n}", "203.0.113.7") == 204
                assert hook.receiver.counts["refused_connections_per_client"] == 0

                # The cap is the forwarded client's: two requests in progress, the third is refused.
                held.append(await held_request(hook, tls, "evt_held_1", "203.0.113.9"))
                held.append(await held_request(hook, tls, "evt_held_2", "198.51.100.1, 203.0.113.9"))
                while hook.receiver._forwarded.get("203.0.113.9", 0) < 2:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
                assert await forwarded(hook, "evt_over", "203.0.113.9") == 429
                assert await forwarded(hook, "evt_other", "203.0.113.10") == 204
        finally:
            for stream in held:
                await stream.aclose()
            for sock in sockets:
                sock.close()
    assert "evt_over" not in stored(store)
    assert [f"evt_{n}" for n in range(1, DELIVERIES + 1)] == [
        e for e in stored(store) if e.startswith("evt_") and e[4:].isdigit()
    ]
