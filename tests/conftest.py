"""Shared fixtures: real demo servers (stdio and HTTP subprocesses), real SQLite stores."""

from __future__ import annotations

import gc
import os
import random
import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc
import pytest

from agentwake.config import ServerConfig
from agentwake.store import Store
from agentwake.store.sqlite import SqliteStore

REPO = Path(__file__).resolve().parent.parent


def _upstream_payloads() -> Path:
    """The upstreams' own published payloads (read in place, never copied into the repo): beside the
    checkout (``../shared``), or where ``AGENTWAKE_UPSTREAM_PAYLOADS`` or the workplace keeps them, so a
    clone elsewhere (``git clone . /tmp/x``) finds them too."""
    candidates = [
        os.environ.get("AGENTWAKE_UPSTREAM_PAYLOADS"),
        REPO.parent / "shared" / "upstream-payloads",
        "/work/shared/upstream-payloads",
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return REPO.parent / "shared" / "upstream-payloads"


UPSTREAM_PAYLOADS = _upstream_payloads()
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# The throwaway PostgreSQL server's fixtures (postgres_server, postgres_url), for every test module:
# one server per pytest process (per xdist worker), however many modules use it.
pytest_plugins = ["_postgres"]

QUIET_DEMO = {"DEMO_RATE": "0", "DEMO_ALERT_INTERVAL": "0", "DEMO_LOAD_INTERVAL": "0"}


@pytest.fixture(autouse=True)
def _collector_thresholds_kept() -> Iterator[None]:
    """A service run in this process (``run_service``) sets the collector's thresholds for the whole
    process; the tests after it keep CPython's."""
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# Below Linux's ephemeral range (32768-60999 by default): the kernel never hands these out to
# outgoing connections, so a port picked here stays free between a stop and a restart even while
# another copy of the suite opens thousands of client sockets.
FREE_PORTS: Final = range(20000, 32768)


def free_port() -> int:
    """A loopback port nobody listens on now (for a server that must be restarted on the same port)."""
    for _ in range(200):
        port = random.choice(FREE_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def demo_stdio(db: Path, **env: str) -> ServerConfig:
    """A ServerConfig that spawns the demo server over stdio with a quiet default."""
    return ServerConfig(
        command=sys.executable,
        args=["-m", "examples.demo_server"],
        env={**QUIET_DEMO, "DEMO_DB": str(db), **env},
        cwd=REPO,
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await SqliteStore.open(tmp_path / "agentwake.db")
    try:
        yield opened
    finally:
        await opened.close()


@dataclass
class DemoHTTP:
    """A demo server running as a real subprocess over Streamable HTTP on loopback."""

    db: Path
    env: dict[str, str]
    port: int = 0
    process: anyio.abc.Process | None = None
    stderr_lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def config(self, **overrides: Any) -> ServerConfig:
        return ServerConfig(url=self.url, **overrides)

    async def start(self) -> None:
        env = {**os.environ, **QUIET_DEMO, "DEMO_DB": str(self.db), **self.env}
        self.process = await anyio.open_process(
            [sys.executable, "-m", "examples.demo_server", "--http", f"127.0.0.1:{self.port}"],
            cwd=REPO,
            env=env,
        )
        assert self.process.stderr is not None
        buffered = b""
        with anyio.fail_after(20):
            async for chunk in self.process.stderr:
                buffered += chunk
                if b"listening on http://" in buffered:
                    break
        line = next(x for x in buffered.decode().splitlines() if "listening on http://" in x)
        self.port = int(line.rsplit(":", 1)[1].split("/")[0])

    async def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            with anyio.CancelScope(shield=True):
                await self.process.wait()
                await self.process.aclose()
            self.process = None


@asynccontextmanager
async def running_demo_http(db: Path, **env: str) -> AsyncIterator[DemoHTTP]:
    demo = DemoHTTP(db=db, env=env)
    await demo.start()
    try:
        yield demo
    finally:
        await demo.stop()


@pytest.fixture
def demo_http_factory(tmp_path: Path) -> Callable[..., Any]:
    def factory(**env: str) -> Any:
        return running_demo_http(tmp_path / "demo-http.db", **env)

    return factory


@pytest.fixture
async def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    """A real demo server, a ConnectionPool attached to it, a Store and the fake LLM (tests/_rig.py)."""
    from _rig import build_rig

    async for built in build_rig(tmp_path, monkeypatch):
        yield built


@pytest.fixture(scope="module")
def ca() -> Any:
    """A trustme certificate authority for the server webhook tests' HTTPS receivers."""
    import trustme

    return trustme.CA()


@pytest.fixture
def signals() -> Iterator[Any]:
    """The server webhook tests' log watcher (tests/_webhook_server_support.py)."""
    from _webhook_server_support import watching

    with watching() as handler:
        yield handler
