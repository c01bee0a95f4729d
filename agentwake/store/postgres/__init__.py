"""The PostgreSQL backend of the store: natively async over a psycopg connection pool.

``PostgresStore`` is assembled from one class per concern (subscriptions, inbox, owners, webhook secrets,
work queue, flow control, action log, the service's own record, read-only views), each in its own
module, with the same semantics as the SQLite store (``agentwake.store.sqlite``), whose code is
the specification. Each method runs in one transaction on a pooled connection, and every public
one turns a psycopg error into a StoreError naming the database (never its password).

Unlike the SQLite store, one database may be shared by several processes: claims skip the rows
another process has locked, ingest deduplicates on a unique constraint, flow control holds an
advisory lock per rule and key, each subscription's delivery loop is driven by one process under a
fenced lease (``owners``), and migrations run under an advisory lock.

A process that starts while its server starts, stops or restarts (``the database system is starting
up``, a refused connection) waits for it, retrying with backoff for up to ``START_WAIT_S`` and logging
each change of what the server answers; a permanent refusal (a wrong password, no such database, a
bad url) fails at once.

Every session of the pool gets server-side timeouts derived from ``[store] lease_s``
(``SessionTimeouts``, see ``base``): a process frozen inside a transaction is cut off by the server
within a sixth of the lease, its locks released, and another process waits for a lock a third of it
at most; so one frozen process cannot stall the others' lease rounds and claims.
``PostgresReader`` is the synchronous reader of the views, for the CLI's quick commands.

psycopg is imported only here: ``agentwake.store`` imports this package only for a configured url.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Final

import anyio
import psycopg
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_before_delay

from agentwake.backoff import tenacity_wait
from agentwake.config import StoreConfig
from agentwake.errors import StoreError
from agentwake.store.postgres.base import (
    UNBOUNDED,
    Named,
    PostgresBase,
    SessionTimeouts,
    StoreErrors,
    describe_error,
    describe_server,
    describe_target,
    is_transient,
    transient_reason,
    url_password,
)
from agentwake.store.postgres.browse import Browse
from agentwake.store.postgres.flow import FlowControl
from agentwake.store.postgres.inbox import Inbox
from agentwake.store.postgres.owners import Owners
from agentwake.store.postgres.pauses import Pauses
from agentwake.store.postgres.reads import PostgresReader, Views, connect_kwargs
from agentwake.store.postgres.runs import ActionLog
from agentwake.store.postgres.schema import migrate
from agentwake.store.postgres.service import ServiceLog
from agentwake.store.postgres.sessions import OperatorSessions
from agentwake.store.postgres.subscriptions import Subscriptions
from agentwake.store.postgres.webhooks import Webhooks
from agentwake.store.postgres.work import WorkQueue

logger = logging.getLogger(__name__)

# How long opening waits for the pool's first connections.
POOL_OPEN_TIMEOUT_S: Final = 30.0
# How long a starting process waits for a server that is not accepting connections yet (starting up,
# shutting down, restarting, refusing), and the backoff between its attempts (agentwake.backoff).
START_WAIT_S: Final = 60.0
START_RETRY_INITIAL_S: Final = 0.25
START_RETRY_MAX_S: Final = 4.0
# The lease the session timeouts follow when none is given: [store] lease_s's default.
DEFAULT_LEASE_S: Final[float] = StoreConfig.model_fields["lease_s"].default


@StoreErrors.install
class PostgresStore(
    Subscriptions,
    Inbox,
    Owners,
    Webhooks,
    WorkQueue,
    FlowControl,
    ActionLog,
    ServiceLog,
    Pauses,
    Browse,
    OperatorSessions,
    Views,
    PostgresBase,
):
    """The async store over one PostgreSQL database. ``await PostgresStore.open(url)``; ``await store.close()``."""

    # Several processes may share the database: delivery loops are driven under leases (agentwake.ownership).
    shared = True

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        password: str | None = None,
        create: bool = True,
        min_size: int = 1,
        max_size: int = 10,
        start_wait_s: float = 0.0,
        lease_s: float | None = None,
        timeouts: SessionTimeouts | None = None,
    ) -> PostgresStore:
        """Connect, apply pending migrations (``create=False`` refuses a database without the
        schema), and open a pool of ``min_size`` to ``max_size`` connections.

        ``url`` is a libpq url or conninfo string; the password is passed apart (never in a message).
        A server that is not accepting connections yet is waited for up to ``start_wait_s``: the
        service starting passes ``START_WAIT_S``; a command (0, the default) says at once that it cannot.
        Every session of the pool is opened with ``timeouts``, by default those of ``lease_s``
        (``[store] lease_s``; its default when None): ``SessionTimeouts.for_lease``.
        """
        from psycopg_pool import AsyncConnectionPool

        target = describe_target(url)
        kwargs = connect_kwargs(url, password)
        wait_s = start_wait_s
        if timeouts is None:
            timeouts = SessionTimeouts.for_lease(DEFAULT_LEASE_S if lease_s is None else lease_s)
        # Migrating may wait for another process's migration, and run long: only a frozen
        # migration is cut off (its lock released for the next process to migrate).
        migrating = SessionTimeouts(timeouts.idle_in_transaction_s, UNBOUNDED.lock_s, UNBOUNDED.statement_s)

        async def connect_and_migrate() -> None:
            async with await psycopg.AsyncConnection.connect(url, **kwargs) as conn:
                await migrating.apply(conn)
                await migrate(conn, target, create=create)

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            assert timeouts is not None
            await timeouts.apply(conn)

        await _when_accepting(connect_and_migrate, url, target, password, wait_s)
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            url,
            kwargs=kwargs,
            min_size=min_size,
            max_size=max_size,
            open=False,
            # A connection the server dropped (a restart, a transaction it cut off) is replaced
            # before it is handed out.
            check=AsyncConnectionPool.check_connection,
            configure=configure,
        )
        try:
            await pool.open(wait=True, timeout=POOL_OPEN_TIMEOUT_S)
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, psycopg.Error):
                raise Named.error_for(target, password, exc) from None
            raise
        return cls(pool, target, password, timeouts)


async def _when_accepting(
    attempt: Callable[[], Awaitable[None]], url: str, target: str, password: str | None, wait_s: float
) -> None:
    """``await attempt()``, again with backoff while the server is not accepting connections yet
    (``is_transient``), for up to ``wait_s``: one line logged each time what the server answers
    changes, and one once it accepts. Any other psycopg error, or the last one, is a StoreError."""
    server = describe_server(url)
    secrets = (password, url_password(url))
    started = time.monotonic()
    waiting_for: str | None = None

    def note(state: RetryCallState) -> None:
        nonlocal waiting_for
        failed = state.outcome.exception() if state.outcome else None
        reason = transient_reason(failed, *secrets) if failed else "no answer"
        if reason != waiting_for:
            waiting_for = reason
            logger.warning(
                "%s is not accepting connections yet (%s); retrying for up to %gs", server, reason, wait_s
            )

    retrying = AsyncRetrying(
        retry=retry_if_exception(is_transient),
        stop=stop_before_delay(wait_s),
        wait=tenacity_wait(initial_s=START_RETRY_INITIAL_S, max_s=START_RETRY_MAX_S),
        sleep=anyio.sleep,
        before_sleep=note,
        reraise=True,
    )
    try:
        async for trying in retrying:
            with trying:
                await attempt()
    except psycopg.Error as exc:
        message = describe_error(target, exc, password)
        if waiting_for is not None:
            message += f" (gave up waiting for it after {time.monotonic() - started:.0f}s)"
        for secret in secrets:
            if secret:
                message = message.replace(secret, "***")
        # Raised `from None`: psycopg's exception and its traceback stay out of logs.
        raise StoreError(message) from None
    if waiting_for is not None:
        logger.info("%s accepts connections now (after %.1fs)", server, time.monotonic() - started)


if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from agentwake.store.interface import Store, StoreReader

    # mypy checks both against the protocols they implement.
    _store_check: type[Store] = PostgresStore
    _reader_check: type[StoreReader] = PostgresReader


__all__ = [
    "DEFAULT_LEASE_S",
    "POOL_OPEN_TIMEOUT_S",
    "START_WAIT_S",
    "PostgresReader",
    "PostgresStore",
    "SessionTimeouts",
]
