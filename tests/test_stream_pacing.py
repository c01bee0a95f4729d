"""StreamRoutes.pace: the stdio reader waits for a stream far behind, and idle streams cost it nothing."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from agentwake import protocol, streams
from agentwake.streams import StreamRoute, StreamRoutes

pytestmark = pytest.mark.anyio

PACE_ABOVE = 3


@pytest.fixture(autouse=True)
def small_pacing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams, "PACE_ABOVE", PACE_ABOVE)
    monkeypatch.setattr(streams, "PACE_WAIT_S", 5.0)


class Routes(StreamRoutes):
    """A connection's routes, opened as ServerConnection.open_stream_route does; closed after the test."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[StreamRoute] = []

    def open(self, request_id: str) -> StreamRoute:
        route = StreamRoute(request_id, capacity=100)
        self.routes[request_id] = route
        self.opened.append(route)
        return route


@pytest.fixture
def routes() -> Iterator[Routes]:
    routes = Routes()
    yield routes
    for route in routes.opened:
        route.close()


def heartbeat(routes: Routes, request_id: str) -> None:
    params = {"cursor": "1", "_meta": {protocol.SUBSCRIPTION_ID_META: request_id}}
    assert routes.intercept(protocol.NOTIFICATION_HEARTBEAT, params)


async def drain_later(route: StreamRoute, taken: list[float]) -> None:
    await anyio.sleep(0.05)
    while route.take(1):
        taken.append(anyio.current_time())


async def test_the_reader_waits_while_a_stream_is_behind_until_its_loop_takes_the_queue(
    routes: Routes,
) -> None:
    route = routes.open("s-1")
    for _ in range(PACE_ABOVE + 1):
        heartbeat(routes, "s-1")
    taken: list[float] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain_later, route, taken)
            await routes.pace()
            returned = anyio.current_time()
    assert taken and returned >= taken[-1]
    assert route.queued == 0


async def test_a_stream_still_behind_at_the_next_read_is_waited_for_though_it_got_nothing_new(
    routes: Routes, monkeypatch: pytest.MonkeyPatch
) -> None:
    route = routes.open("s-1")
    for _ in range(PACE_ABOVE + 1):
        heartbeat(routes, "s-1")
    monkeypatch.setattr(streams, "PACE_WAIT_S", 0.01)
    await routes.pace()  # gives up waiting: the loop is stuck
    assert route.queued > PACE_ABOVE
    monkeypatch.setattr(streams, "PACE_WAIT_S", 5.0)
    taken: list[float] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain_later, route, taken)
            await routes.pace()
    assert taken and route.queued == 0


async def test_a_read_looks_only_at_the_streams_it_gave_something_not_at_every_idle_one(
    routes: Routes, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(1000):
        routes.open(f"s-{n}")
    looked: list[str] = []
    queued = StreamRoute.queued

    def counting(route: StreamRoute) -> int:
        looked.append(route.request_id)
        return queued.fget(route)  # type: ignore[attr-defined,no-any-return]

    monkeypatch.setattr(StreamRoute, "queued", property(counting))
    heartbeat(routes, "s-7")
    await routes.pace()
    assert looked == ["s-7"]
    looked.clear()
    await routes.pace()
    assert looked == []


async def test_a_closed_stream_is_never_waited_for(routes: Routes) -> None:
    route = routes.open("s-1")
    for _ in range(PACE_ABOVE + 1):
        heartbeat(routes, "s-1")
    del routes.routes["s-1"]
    with anyio.fail_after(1):
        await routes.pace()
    assert route.queued > PACE_ABOVE
