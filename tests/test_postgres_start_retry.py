"""A process that starts while its PostgreSQL server is down, starting up, shutting down or restarting
waits for it (issues 29 and 30), and one refused for good (a wrong password, no such database) fails
at once, with the message it always had.

A real throwaway server of this module's own (``tests/_postgres.py``) is killed and started again
on the same port while ``agentwake run`` (a subprocess) or ``PostgresStore.open`` (in process) waits
for it. The server's own "starting up" and "shutting down" answers last too short to be caught at
will, so a small proxy in front of the real server (``CannotConnectNow``) answers them for as long
as a test wants (as PostgreSQL does: an ErrorResponse with SQLSTATE 57P03 to the startup packet), then
forwards connections to the real server. Every wait is for a condition, under a deadline.
"""

from __future__ import annotations

import logging
import os
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import psycopg
import psycopg.errors
import pytest
from _postgres import PASSWORD, PASSWORD_USER, PostgresServer
from _support import agentwake_run, demo_server_toml
from anyio.streams.buffered import BufferedByteReceiveStream
from conftest import REPO

from agentwake.errors import StoreError
from agentwake.store import IncomingEvent, SubscriptionKey
from agentwake.store.postgres import START_WAIT_S, PostgresStore
from agentwake.store.postgres.base import is_transient, transient_reason

pytestmark = pytest.mark.anyio

TICKETS = SubscriptionKey("tickets", "demo", "ticket.created", {})
LOGGER = "agentwake.store.postgres"
# SSLRequest and GSSENCRequest: libpq asks for encryption first; "N" declines.
_ENCRYPTION_REQUESTS = (80877103, 80877104)
STARTING_UP = "the database system is starting up"
SHUTTING_DOWN = "the database system is shutting down"
URL_SECRET = "n0t-a-real-pa55word-in-the-url"


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    """A server of this module alone: its tests kill it."""
    own = PostgresServer()
    own.start()
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture
def db_url(server: PostgresServer) -> Iterator[str]:
    if not server.running():
        server.start()
    url = server.create_database("retry")
    try:
        yield url
    finally:
        if not server.running():
            server.start()
        server.drop_database(url)


class Lines(logging.Handler):
    """The store's log lines, each waking whoever waits for one (logged in the event loop's thread)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self._changed = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def wait_for(self, needle: str, timeout: float = 30) -> str:  # noqa: ASYNC109
        try:
            with anyio.fail_after(timeout):
                while True:
                    for line in self.lines:
                        if needle in line:
                            return line
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"no log line with {needle!r} in {timeout:g}s: {self.lines}") from None


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger(LOGGER)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def works(store: PostgresStore) -> None:
    await store.register(TICKETS)
    await store.ingest(TICKETS, [IncomingEvent("T-1", "ticket.created", "2026-12-03T08:00:00.000Z", {})], "1")
    assert await store.event_ids() == ["T-1"]


# ---- the server down, then up again ------------------------------------------------------------------


async def test_a_store_opened_while_the_server_is_down_waits_and_opens_once_it_is_back(
    server: PostgresServer, db_url: str, lines: Lines
) -> None:
    server.kill()
    opened: list[PostgresStore] = []

    async def open_it() -> None:
        opened.append(await PostgresStore.open(db_url, start_wait_s=START_WAIT_S))

    started = time.monotonic()
    with anyio.fail_after(START_WAIT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(open_it)
            waiting = await lines.wait_for("is not accepting connections yet")
            assert waiting == (
                f"PostgreSQL at 127.0.0.1:{server.port} is not accepting connections yet"
                f" (connection refused); retrying for up to {START_WAIT_S:g}s"
            )
            await anyio.to_thread.run_sync(server.start)
    [store] = opened
    try:
        await works(store)
    finally:
        await store.close()
    assert time.monotonic() - started < START_WAIT_S
    accepted = await lines.wait_for("accepts connections now")
    assert accepted.startswith(f"PostgreSQL at 127.0.0.1:{server.port} accepts connections now (after ")
    # One line per change of what the server answers, however many attempts: refused, maybe
    # "starting up" (a killed server recovers first), then accepted.
    assert len(lines.lines) <= 3, lines.lines


async def test_agentwake_run_started_while_postgresql_is_down_waits_for_it_and_starts(
    tmp_path: Path, server: PostgresServer, db_url: str
) -> None:
    config = tmp_path / "agentwake.toml"
    config.write_text(
        f'[store]\nurl = "{db_url}"\n\n'
        + demo_server_toml(tmp_path / "demo.db", DEMO_NEXT_POLL_MS="100")
        + '\n[[subscriptions]]\nname = "tickets"\nserver = "demo"\nevent = "ticket.created"\ndelivery = "poll"\n'
    )
    server.kill()
    async with agentwake_run(config) as run:
        await run.wait_for(
            f"PostgreSQL at 127.0.0.1:{server.port} is not accepting connections yet (connection refused)",
            "retrying",
        )
        await anyio.to_thread.run_sync(server.start)
        await run.wait_for(f"PostgreSQL at 127.0.0.1:{server.port} accepts connections now")
        await run.wait_for("subscription tickets: this process drives it now")
        assert await run.stop() == 0
    assert not [line for line in run.lines if "Traceback" in line], run.log()
    store = await PostgresStore.open(db_url, create=False)
    try:
        assert [s["subscription"] for s in await store.subscriptions()] == ["tickets"]
    finally:
        await store.close()


# ---- "starting up" and "shutting down", as long as a test wants -------------------------------------


class CannotConnectNow:
    """A loopback proxy to a real PostgreSQL server that, while ``refusing`` holds a message, answers
    every connection as a server starting or stopping does (FATAL, SQLSTATE 57P03, the message), and
    else forwards it to the server."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.refusing: str | None = STARTING_UP
        self.port = 0
        self.refused = 0

    async def handle(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            if self.refusing is None:
                await self._forward(client)
                return
            reader = BufferedByteReceiveStream(client)
            packet = await self._packet(reader)
            if struct.unpack("!I", packet[:4])[0] in _ENCRYPTION_REQUESTS:
                await client.send(b"N")
                await self._packet(reader)
            fields = b"".join(
                code + text.encode() + b"\0"
                for code, text in ((b"S", "FATAL"), (b"V", "FATAL"), (b"C", "57P03"), (b"M", self.refusing))
            )
            fields += b"\0"
            self.refused += 1
            await client.send(b"E" + struct.pack("!I", len(fields) + 4) + fields)

    @staticmethod
    async def _packet(reader: BufferedByteReceiveStream) -> bytes:
        (length,) = struct.unpack("!I", await reader.receive_exactly(4))
        return await reader.receive_exactly(length - 4)

    async def _forward(self, client: anyio.abc.SocketStream) -> None:
        async with await anyio.connect_tcp("127.0.0.1", self.upstream_port) as upstream:

            async def pipe(source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream) -> None:
                try:
                    async for chunk in source:
                        await sink.send(chunk)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass
                tg.cancel_scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(pipe, client, upstream)
                tg.start_soon(pipe, upstream, client)


@asynccontextmanager
async def cannot_connect_now(server: PostgresServer) -> AsyncIterator[CannotConnectNow]:
    proxy = CannotConnectNow(server.port)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    proxy.port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, proxy.handle)
        try:
            yield proxy
        finally:
            tg.cancel_scope.cancel()


async def test_a_server_shutting_down_then_starting_up_is_waited_for_with_one_line_per_change(
    server: PostgresServer, db_url: str, lines: Lines
) -> None:
    async with cannot_connect_now(server) as proxy:
        proxy.refusing = SHUTTING_DOWN
        # A password written in the url (which the config refuses, but the store may be given one)
        # never shows: the trusting server ignores it.
        url = db_url.replace("agentwake@127.0.0.1", f"agentwake:{URL_SECRET}@127.0.0.1").replace(
            f":{server.port}/", f":{proxy.port}/"
        )
        opened: list[PostgresStore] = []

        async def open_it() -> None:
            opened.append(await PostgresStore.open(url, password="an0ther-secret", start_wait_s=START_WAIT_S))

        with anyio.fail_after(START_WAIT_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(open_it)
                where = f"PostgreSQL at 127.0.0.1:{proxy.port}"
                first = await lines.wait_for(SHUTTING_DOWN)
                assert first == (
                    f"{where} is not accepting connections yet ({SHUTTING_DOWN});"
                    f" retrying for up to {START_WAIT_S:g}s"
                )
                proxy.refusing = STARTING_UP
                refused = proxy.refused
                await lines.wait_for(STARTING_UP)
                # Still starting up, attempt after attempt: no new line until the answer changes.
                with anyio.fail_after(30):
                    while proxy.refused < refused + 3:  # noqa: ASYNC110 - the proxy has no event to wait on
                        await anyio.sleep(0.05)
                assert len(lines.lines) == 2, lines.lines
                proxy.refusing = None
        [store] = opened
        try:
            await works(store)
        finally:
            await store.close()
    assert lines.lines[1] == (
        f"{where} is not accepting connections yet ({STARTING_UP}); retrying for up to {START_WAIT_S:g}s"
    )
    assert lines.lines[2].startswith(f"{where} accepts connections now (after ")
    assert len(lines.lines) == 3
    assert not [line for line in lines.lines if URL_SECRET in line or "an0ther-secret" in line]


async def test_a_server_still_starting_up_when_the_wait_ends_is_a_store_error_that_says_so(
    server: PostgresServer, db_url: str, lines: Lines
) -> None:
    async with cannot_connect_now(server) as proxy:
        url = db_url.replace(f":{server.port}/", f":{proxy.port}/")
        started = time.monotonic()
        with anyio.fail_after(30), pytest.raises(StoreError) as caught:
            await PostgresStore.open(url, password="an0ther-secret", start_wait_s=1.0)
        took = time.monotonic() - started
    message = str(caught.value)
    assert STARTING_UP in message and "gave up waiting for it after" in message
    assert message.startswith(f'the PostgreSQL database "{PostgresServer.dbname(db_url)}" on 127.0.0.1:')
    assert "an0ther-secret" not in message
    assert proxy.refused >= 2  # retried, with a backoff well under the second given
    assert took < 1.0 + 10, took
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


# ---- refused for good: at once, as before --------------------------------------------------------------


async def test_a_wrong_password_or_a_missing_database_fails_at_once_with_its_message(
    server: PostgresServer, db_url: str, lines: Lines
) -> None:
    locked = server.url(PostgresServer.dbname(db_url), user=PASSWORD_USER)
    wrong = PASSWORD[::-1]
    started = time.monotonic()
    with pytest.raises(StoreError, match=r"authentication to the PostgreSQL database .* failed") as caught:
        await PostgresStore.open(locked, password=wrong, start_wait_s=START_WAIT_S)
    assert wrong not in str(caught.value) and PASSWORD not in str(caught.value)
    missing = server.url("no_such_database")
    with pytest.raises(
        StoreError, match=r'"no_such_database" on .* does not exist on that server: create it'
    ):
        await PostgresStore.open(missing, start_wait_s=START_WAIT_S)
    with pytest.raises(StoreError) as bad_url:
        await PostgresStore.open("postgresql://agentwake@127.0.0.1:notaport/x", start_wait_s=START_WAIT_S)
    assert "gave up" not in str(bad_url.value)
    # START_WAIT_S would have passed had any of them been retried; none was even logged.
    assert time.monotonic() - started < START_WAIT_S / 2
    assert lines.lines == []


def test_agentwake_run_on_a_missing_database_exits_1_at_once_with_its_message(
    tmp_path: Path, server: PostgresServer
) -> None:
    config = tmp_path / "agentwake.toml"
    config.write_text(f'[store]\nurl = "{server.url("no_such_database")}"\n')
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "agentwake.cli", "run", "-c", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 1, done.stderr
    assert '"no_such_database"' in done.stderr and "does not exist on that server" in done.stderr
    assert "retrying" not in done.stderr
    assert time.monotonic() - started < START_WAIT_S / 2


# ---- what is transient ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (psycopg.errors.CannotConnectNow(STARTING_UP), True),
        (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), True),
        (psycopg.errors.CrashShutdown("terminating connection because of crash"), True),
        (psycopg.errors.ConnectionFailure("connection failure"), True),
        (psycopg.OperationalError('connection to server at "h", port 1 failed: Connection refused'), True),
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (psycopg.OperationalError('failed: FATAL:  password authentication failed for user "x"'), False),
        (psycopg.OperationalError('failed: FATAL:  database "x" does not exist'), False),
        (psycopg.errors.InvalidCatalogName('database "x" does not exist'), False),
        (psycopg.ProgrammingError('invalid connection option "x"'), False),
        (psycopg.errors.UndefinedTable("relation x does not exist"), False),
    ],
)
def test_only_a_server_not_accepting_connections_yet_is_waited_for(
    error: psycopg.Error, transient: bool
) -> None:
    assert is_transient(error) is transient


def test_the_reason_logged_is_what_the_server_said_without_a_secret() -> None:
    said = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5 failed: FATAL:  '
        "the database system is starting up\n\tmore"
    )
    assert transient_reason(said) == STARTING_UP
    refused = psycopg.OperationalError(f'port 5 failed: Connection refused for "{URL_SECRET}"')
    assert transient_reason(refused, None, URL_SECRET) == 'connection refused for "***"'
