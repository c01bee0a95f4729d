"""What the fake upstreams (agentwake/fakes) share: serving an aiohttp app on loopback, and for the
REST fakes, recording each request and waiting for one.

Standard library, anyio and aiohttp only: the fakes also run as programs, outside pytest.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Generic, Protocol, Self, TypeVar

import anyio
from aiohttp import web


async def serve(app: web.Application, port: int) -> web.AppRunner:
    """``app`` served on 127.0.0.1:``port`` (0: a free one, then in ``runner.addresses``)."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host="127.0.0.1", port=port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


async def until_stopped() -> None:
    """Until SIGINT or SIGTERM: how a fake run as a program serves."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


class Headers(dict[str, str]):
    """A request's headers, looked up by name in any case (``headers["authorization"]`` works too)."""

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__((name.lower(), value) for name, value in items)

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)


class _Request(Protocol):
    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...


RecordedT = TypeVar("RecordedT", bound=_Request)


class RecordingFake(Generic[RecordedT]):
    """A REST upstream served on 127.0.0.1: every request goes to ``_handle``, which records it with
    ``_record``; tests read them with ``calls`` and ``wait_for``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = ""
        self.requests: list[RecordedT] = []
        self._arrived: anyio.Event | None = None
        self._runner: web.AppRunner | None = None
        # Called with each request as it is recorded (the playground prints the writes).
        self.on_request: Callable[[RecordedT], None] | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    def _base_path(self) -> str:
        """What ``url`` has after the port."""
        return ""

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = await serve(app, self.port)
        self.port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}{self._base_path()}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            with anyio.CancelScope(shield=True):
                await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- what was asked ------------------------------------------------------------------------

    def calls(self, method: str | None = None, path_prefix: str | None = None) -> list[RecordedT]:
        """The requests so far, of one method and/or under one path prefix (as recorded)."""
        return [
            r
            for r in self.requests
            if (method is None or r.method == method.upper())
            and (path_prefix is None or r.path.startswith(path_prefix))
        ]

    # ASYNC109: the agreed interface takes a timeout argument.
    async def wait_for(self, method: str, path: str, *, timeout: float = 10, count: int = 1) -> RecordedT:  # noqa: ASYNC109
        """The ``count``-th request with this method and path, waiting for it if it has not come yet."""

        def matching() -> list[RecordedT]:
            return [r for r in self.requests if r.method == method.upper() and r.path == path]

        try:
            with anyio.fail_after(timeout):
                while len(matching()) < count:
                    await self._arrival().wait()
        except TimeoutError:
            seen = ", ".join(f"{r.method} {r.path}" for r in self.requests[-10:]) or "nothing"
            raise TimeoutError(
                f"no {method} {path} (#{count}) within {timeout} s; last seen: {seen}"
            ) from None
        return matching()[count - 1]

    def _arrival(self) -> anyio.Event:
        # Created lazily so it belongs to the loop that first waits on it.
        if self._arrived is None:
            self._arrived = anyio.Event()
        return self._arrived

    def _record(self, recorded: RecordedT) -> None:
        self.requests.append(recorded)
        if self.on_request is not None:
            self.on_request(recorded)
        arrived, self._arrived = self._arrived, None
        if arrived is not None:
            arrived.set()
