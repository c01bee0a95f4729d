"""Naming a PostgreSQL store without its password, the pool every part shares, the server-side
timeouts of its sessions, turning every psycopg error into a StoreError, telling a server that is
not accepting connections yet (worth waiting for at start) from a permanent refusal, and text with
NUL characters.

Timeouts
--------
Several processes share the database, and a lock one of them holds stops the others: a process
frozen inside a transaction (SIGSTOP, a VM paused, a stalled event loop) would hold its row and
advisory locks for as long as it is frozen, and every other process's lease round and claim would
queue behind it. So every session of the store's pool is opened with (``SessionTimeouts``, set by
the pool's ``configure`` callback):

* ``idle_in_transaction_session_timeout``: a transaction idle that long is ended by the server
  (rolled back, its locks released, its connection closed): a sixth of ``[store] lease_s`` (at
  least 1 s), half a lease round, so a frozen holder is cut off well before the lease it may hold
  lapses, and another process's round that waited for it still ends within its round;
* ``lock_timeout``: a statement waits that long at most for a lock another session holds, then
  fails (nothing written; the caller tries again: a lease round at the next round): twice the
  idle cut-off, so a waiter behind a frozen holder gets its lock once the holder is cut off, with
  no error, and gives up only behind a session busy that long (a statement stuck, a session of
  another program left open in a transaction);
* ``statement_timeout``: no one statement runs longer (30 s, or the lease if longer).

Each of the store's transactions is a few short statements with nothing but the database awaited in
between, so none of these cuts a healthy one. The store's own long operations are not bounded: the
migration at start runs on a connection of its own without a lock or statement timeout, and a
transaction opened with ``transaction(bounded=False)`` (``agentwake store copy``) lifts all three
for itself (``SET LOCAL``). The CLI's readers (``PostgresReader``) use a plain connection of their
own. A transaction the server cut off surfaces as a StoreError that says so (``describe_error``).

Text with NUL
-------------
PostgreSQL cannot store U+0000 in ``text``; SQLite can, and both backends must store and return the
same values (an event id, a tool result, a prompt, an error message may hold one). So every
connection the store uses gets a ``str`` dumper and a ``text`` loader (``nul_safe``) that escape at
the boundary, reversibly:

* a string without NUL is sent and stored exactly as it is, unless it starts with ``NUL_MARK``
  (a backslash and U+0001, which no real text starts with);
* any other string is stored as ``NUL_MARK`` followed by the string with each backslash doubled and
  each NUL written as backslash-zero; a loaded text starting with ``NUL_MARK`` is turned back.

Only the rare strings with a NUL (or the marker) change, so JSON documents (never a raw NUL: JSON
escapes it), times, names and all other text stay readable and comparable in SQL as they are. The
encoding is injective, and the same function encodes every parameter (each ``%s``, and each element
of an array parameter) and every stored value: ``WHERE event_id = %s``, the events' unique
constraint (ingest's dedup), ``= ANY(%s)`` and ``GROUP BY`` give the same answers as on the strings
themselves. Only an ordering of escaped values by text differs (the store orders by row ids and
times, never by such text), and the store has no ``LIKE`` or prefix query: one would have to match
an escaped pattern against escaped values (a NUL-free prefix of a string with a NUL does not prefix
its escaped form).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar

import psycopg
import psycopg.errors
from psycopg.adapt import Buffer, PyFormat
from psycopg.conninfo import conninfo_to_dict
from psycopg.types import string as pg_string

from agentwake.errors import StoreError
from agentwake.store.postgres.views import View, run_async

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

P = ParamSpec("P")
T = TypeVar("T")

# A transaction that lost a deadlock or a serialization race is run again, this many times at most.
RETRIES: Final = 3
_RETRYABLE: Final = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


# ---- timeouts (see the module docstring) -------------------------------------------------------------

# A lease is renewed this many times over its length (agentwake.ownership ROUNDS_PER_LEASE): a frozen
# holder's transaction is cut off within half a round, so a round that waited for it ends in its round.
ROUNDS_PER_LEASE: Final = 3
IDLE_SHARE: Final = 1 / (2 * ROUNDS_PER_LEASE)
# But never sooner than this: a busy process's event loop may pause a transaction for a moment.
MIN_TIMEOUT_S: Final = 1.0
# A lock is waited for this many times the idle cut-off: a frozen holder is cut off first.
LOCK_WAIT_FACTOR: Final = 2
# No one statement of the store runs longer (nor than a lease, if longer).
STATEMENT_TIMEOUT_S: Final = 30.0
# The settings, as set on each session; 0 is "no limit".
_SETTINGS: Final = ("idle_in_transaction_session_timeout", "lock_timeout", "statement_timeout")
_SET_SQL: Final = "SELECT " + ", ".join(f"set_config('{name}', %s, %s)" for name in _SETTINGS)


@dataclass(frozen=True, slots=True)
class SessionTimeouts:
    """The server-side timeouts of a session, in seconds (0: none); see the module docstring."""

    idle_in_transaction_s: float
    lock_s: float
    statement_s: float

    @classmethod
    def for_lease(cls, lease_s: float) -> SessionTimeouts:
        """A sixth of the lease (at least ``MIN_TIMEOUT_S``) idle in a transaction, twice that
        waiting for a lock, ``STATEMENT_TIMEOUT_S`` (or the lease, if longer) for a statement."""
        idle = max(lease_s * IDLE_SHARE, MIN_TIMEOUT_S)
        return cls(idle, idle * LOCK_WAIT_FACTOR, max(STATEMENT_TIMEOUT_S, lease_s))

    def values(self) -> list[str]:
        """The three settings' values, in ms, in ``_SETTINGS`` order."""
        seconds = (self.idle_in_transaction_s, self.lock_s, self.statement_s)
        return [str(max(0, round(s * 1000))) for s in seconds]

    async def apply(self, conn: psycopg.AsyncConnection[Any], *, local: bool = False) -> None:
        """Set them on ``conn``: for its session (in autocommit mode), or ``local`` for the
        transaction it is in (``SET LOCAL``)."""
        values = self.values()
        await conn.execute(_SET_SQL, [part for value in values for part in (value, local)])


UNBOUNDED: Final = SessionTimeouts(0, 0, 0)


# ---- text with NUL (see the module docstring) ------------------------------------------------------

NUL_MARK: Final = "\\\x01"
_ESCAPED: Final = re.compile(r"\\(.)", re.DOTALL)


def escape_text(value: str) -> str:
    """``value`` as stored: unchanged unless it holds a NUL or starts with ``NUL_MARK``."""
    if "\x00" not in value and not value.startswith(NUL_MARK):
        return value
    return NUL_MARK + value.replace("\\", "\\\\").replace("\x00", "\\0")


def unescape_text(stored: str) -> str:
    """The string ``escape_text`` stored as ``stored``."""
    if not stored.startswith(NUL_MARK):
        return stored
    return _ESCAPED.sub(lambda m: "\x00" if m[1] == "0" else m[1], stored[len(NUL_MARK) :])


def _escaping(dumper: type[pg_string._BaseStrDumper]) -> type[pg_string._BaseStrDumper]:
    """A subclass of psycopg's ``dumper`` that sends ``escape_text`` of each string."""

    class Escaping(dumper):  # type: ignore[valid-type,misc]
        def dump(self, obj: str) -> Buffer | None:
            encoded: bytes = escape_text(obj).encode(self._encoding)
            return encoded

    Escaping.__name__ = Escaping.__qualname__ = f"NulSafe{dumper.__name__}"
    return Escaping


class NulSafeTextLoader(pg_string.TextLoader):
    """psycopg's text loader, turning an escaped value back (``unescape_text``)."""

    def load(self, data: Buffer) -> str | bytes:
        loaded = super().load(data)  # bytes from a SQL_ASCII database, as psycopg's
        return unescape_text(loaded) if isinstance(loaded, str) else loaded


class NulSafeTextBinaryLoader(NulSafeTextLoader):
    format = psycopg.pq.Format.BINARY


# In psycopg's order: the last one registered per format is the default for ``%s`` (see
# psycopg.types.string.register_default_adapters); the others are found by oid (text[] elements).
_DUMPERS: Final = tuple(
    _escaping(d)
    for d in (
        pg_string.StrBinaryDumperName,
        pg_string.StrBinaryDumperVarchar,
        pg_string.StrBinaryDumper,
        pg_string.StrDumperName,
        pg_string.StrDumperVarchar,
        pg_string.StrDumper,
        pg_string.StrDumperUnknown,
    )
)
_TEXT_TYPES: Final = ("text", "varchar", "bpchar", "name")


def nul_safe(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Give ``conn`` the escaping text dumpers and loaders, once (a cheap check after that)."""
    adapters = conn.adapters
    if adapters.get_dumper(str, PyFormat.TEXT) is _DUMPERS[-1]:
        return
    for dumper in _DUMPERS:
        adapters.register_dumper(str, dumper)
    for name in _TEXT_TYPES:
        adapters.register_loader(name, NulSafeTextLoader)
        adapters.register_loader(name, NulSafeTextBinaryLoader)


def describe_target(url: str) -> str:
    """``database "agentwake" on db.example:5432 as user "aw"``: the store named without its password."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.Error:
        return "a PostgreSQL database (its url cannot be parsed)"
    dbname = parts.get("dbname") or parts.get("user") or "(default)"
    host = str(parts.get("host") or "the local socket")
    where = f"{host}:{parts['port']}" if parts.get("port") else host
    user = f' as user "{parts["user"]}"' if parts.get("user") else ""
    return f'the PostgreSQL database "{dbname}" on {where}{user}'


def describe_server(url: str) -> str:
    """``PostgreSQL at db.example:5432``: the server alone, for the lines logged while waiting for it."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.Error:
        return "the PostgreSQL server"
    host = str(parts.get("host") or "the local socket")
    return f"PostgreSQL at {host}:{parts.get('port') or 5432}"


# A server starting, stopping or restarting (SQLSTATE class 57P: cannot_connect_now, admin_shutdown,
# crash_shutdown) or a connection that failed (class 08) is worth waiting for when a process starts;
# a refused password, a missing database or a bad url is not.
_TRANSIENT_SQLSTATES: Final = frozenset({"57P01", "57P02", "57P03"})
# libpq reports a failure to connect without a SQLSTATE: these are its words for the same states.
_TRANSIENT_WORDS: Final = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "the database system is not accepting connections",
    "terminating connection due to administrator command",
    "terminating connection because of crash of another server process",
    "connection refused",
    "server closed the connection unexpectedly",
    "connection reset by peer",
    # A Unix socket not there yet: the server is not listening (yet).
    "no such file or directory",
)
_PERMANENT_WORDS: Final = ("authentication failed", "no password supplied", "does not exist")
_LIBPQ_PREFIX: Final = re.compile(r"^.*failed:\s*(?:FATAL:\s*)?", re.IGNORECASE)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` says the server is not accepting connections yet (starting, shutting down,
    restarting, refusing them), rather than refusing this client for good."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    from psycopg_pool import PoolTimeout

    if isinstance(exc, PoolTimeout):
        return False
    sqlstate = exc.sqlstate or ""
    if sqlstate in _TRANSIENT_SQLSTATES or sqlstate.startswith("08"):
        return True
    lowered = str(exc).lower()
    if any(words in lowered for words in _PERMANENT_WORDS):
        return False
    return any(words in lowered for words in _TRANSIENT_WORDS)


def transient_reason(exc: BaseException, *secrets: str | None) -> str:
    """What the server said, short: ``the database system is starting up``, ``connection refused``;
    never one of ``secrets``."""
    reason = _LIBPQ_PREFIX.sub("", _first_line(exc)).strip().rstrip(".") or type(exc).__name__
    reason = reason[:1].lower() + reason[1:]
    for secret in secrets:
        if secret:
            reason = reason.replace(secret, "***")
    return reason


def url_password(url: str) -> str | None:
    """The password written in ``url``, if any (to keep it out of messages)."""
    try:
        value = conninfo_to_dict(url).get("password")
    except psycopg.Error:
        return None
    return str(value) if value else None


def lock_key(*parts: str) -> int:
    """A stable signed 64-bit key for ``pg_advisory_xact_lock`` (the same in every process)."""
    digest = hashlib.blake2b("\x00".join(parts).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def describe_error(target: str, exc: psycopg.Error, password: str | None = None) -> str:
    """A psycopg error as a sentence that says which store, what happened and what to do; never the
    password (psycopg's messages do not quote it, and it is scrubbed here should one ever do)."""
    from psycopg_pool import PoolClosed, PoolTimeout

    text = _first_line(exc)
    lowered = str(exc).lower()
    if (
        isinstance(exc, psycopg.errors.IdleInTransactionSessionTimeout)
        or "idle-in-transaction timeout" in lowered
    ):
        message = (
            f"{target} ended a transaction of this process that stayed idle longer than its"
            " idle_in_transaction_session_timeout (was the process paused or stalled?); it was rolled"
            " back, nothing of it was written; try again"
        )
    elif isinstance(exc, psycopg.errors.LockNotAvailable):
        message = (
            f"{target}: a lock this transaction needed was held by another session for longer than"
            f" lock_timeout (another process busy, or paused inside a transaction); nothing was written;"
            f" try again ({text})"
        )
    elif isinstance(exc, psycopg.errors.QueryCanceled):
        message = (
            f"{target} cancelled a statement ({text}): it ran longer than statement_timeout, or an"
            " operator cancelled it; nothing of its transaction was written; try again"
        )
    elif isinstance(exc, PoolClosed):
        message = f"{target} is closed in this process (the store was closed)"
    elif isinstance(exc, PoolTimeout):
        message = (
            f"no connection to {target} came free in time ({text}); the server may be unreachable,"
            " or every connection of the pool busy"
        )
    elif "password authentication failed" in lowered or "authentication failed" in lowered:
        message = f"authentication to {target} failed: check the user name and the password"
    elif "no password supplied" in lowered:
        message = f"{target} wants a password and none was given: set the one named by [store] password_env"
    elif "does not exist" in lowered and "database" in lowered and isinstance(exc, psycopg.OperationalError):
        message = f"{target} does not exist on that server: create it first (createdb)"
    elif (
        "connection refused" in lowered
        or "could not connect" in lowered
        or "could not translate host name" in lowered
        or "timeout expired" in lowered
        or "no route to host" in lowered
        or "no such file or directory" in lowered
    ):
        message = f"the server of {target} cannot be reached ({text}); check that it runs and listens there"
    elif isinstance(exc, _RETRYABLE):
        message = f"{target} kept aborting a transaction that raced another process ({text}); try again"
    elif isinstance(exc, psycopg.errors.InsufficientPrivilege):
        message = f"{target} refused an operation ({text}); check the user's privileges"
    elif isinstance(exc, psycopg.OperationalError):
        message = f"{target} failed ({text})"
    else:
        message = f"{target}: {text}"
    if password:
        message = message.replace(password, "***")
    return message


class StoreErrors:
    """Makes every public method of a store class raise StoreError, never a bare psycopg error.

    A transaction aborted by a deadlock or a serialization failure (two processes racing) is run
    again first: each method is one transaction, so running it again is safe.
    """

    @staticmethod
    def wrap(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        @functools.wraps(method)
        async def guarded(self: Named, *args: Any, **kwargs: Any) -> T:
            for attempt in range(1, RETRIES + 1):
                try:
                    return await method(self, *args, **kwargs)
                except _RETRYABLE as exc:
                    if attempt == RETRIES:
                        raise self.store_error(exc) from None
                except psycopg.Error as exc:
                    raise self.store_error(exc) from None
            raise AssertionError("unreachable")

        return guarded

    @staticmethod
    def wrap_sync(method: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(method)
        def guarded(self: Named, *args: Any, **kwargs: Any) -> T:
            # The synchronous reader's one connection (its ``conn``) reads text NUL-safe too.
            conn = getattr(self, "conn", None)
            if isinstance(conn, psycopg.Connection):
                nul_safe(conn)
            try:
                return method(self, *args, **kwargs)
            except psycopg.Error as exc:
                raise self.store_error(exc) from None

        return guarded

    @classmethod
    def install(cls, store: type[T]) -> type[T]:
        """Wrap every public coroutine of ``store`` (the async store)."""
        return cls._install(store, inspect.iscoroutinefunction, cls.wrap)

    @classmethod
    def install_sync(cls, store: type[T]) -> type[T]:
        """Wrap every public plain method of ``store`` (the synchronous reader)."""
        return cls._install(store, inspect.isfunction, cls.wrap_sync)

    @staticmethod
    def _install(store: type[T], chosen: Callable[[Any], bool], wrap: Callable[[Any], Any]) -> type[T]:
        for klass in store.__mro__:
            for name, member in vars(klass).items():
                if name.startswith("_") or not chosen(member) or name == "store_error":
                    continue
                if getattr(store, name) is member:  # the one the store really uses
                    setattr(store, name, wrap(member))
        return store


class Named:
    """A store that names its database in errors: ``target``, and the password to keep out of them."""

    target: str
    _password: str | None

    @staticmethod
    def error_for(target: str, password: str | None, exc: psycopg.Error) -> StoreError:
        # Raised `from None` by callers: psycopg's exception and its traceback stay out of logs.
        return StoreError(describe_error(target, exc, password))

    def store_error(self, exc: psycopg.Error) -> StoreError:
        return self.error_for(self.target, self._password, exc)


class PostgresBase(Named):
    """The connection pool and the store's name that every part of the PostgreSQL store shares."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        target: str,
        password: str | None,
        timeouts: SessionTimeouts = UNBOUNDED,
    ) -> None:
        self.pool = pool
        self.target = target
        self._password = password
        # What every session of the pool was opened with (``SessionTimeouts.apply``).
        self.timeouts = timeouts

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.target}>"

    @asynccontextmanager
    async def transaction(self, *, bounded: bool = True) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """One connection of the pool (NUL-safe: ``nul_safe``), in one transaction (committed when
        the block ends), under the session's timeouts; ``bounded=False`` lifts them for this
        transaction alone, for one of the store's own long operations (``agentwake store copy``)."""
        async with self.pool.connection() as conn:
            nul_safe(conn)
            async with conn.transaction():
                if not bounded:
                    await UNBOUNDED.apply(conn, local=True)
                yield conn

    async def _read(self, view: View[T]) -> T:
        """A read-only view (``agentwake.store.postgres.views``), in one transaction."""
        async with self.transaction() as conn:
            return await run_async(conn, view)

    async def close(self) -> None:
        await self.pool.close()
