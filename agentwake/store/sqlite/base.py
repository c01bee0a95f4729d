"""Opening a SQLite store, its JSON encoding, and turning every sqlite3 error into a StoreError."""

from __future__ import annotations

import fcntl
import functools
import itertools
import json
import os
import sqlite3
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from agentwake.errors import StoreError
from agentwake.redaction import redact
from agentwake.store.sqlite.versions import MIGRATION_NAMES, MIGRATION_SET
from agentwake.text import peer

if TYPE_CHECKING:
    import sqlite_utils

BUSY_TIMEOUT_MS: Final = 10_000

T = TypeVar("T")


def decode_json(text: str | None) -> Any:
    return json.loads(text) if text else None


def redacted(error: str | None) -> str | None:
    """An error as stored: bounded (a server chooses its messages), and redacted (one may quote a secret)."""
    return None if error is None else redact(peer(error))[0]


def describe_error(path: Path, exc: sqlite3.Error) -> str:
    """A sqlite3 error as a sentence that says which store and what to do."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        return f"the store {path} is locked by another process ({text}); try again when it is less busy"
    if isinstance(exc, sqlite3.DatabaseError) and ("malformed" in text or "not a database" in text):
        return f"the store {path} is not a readable agentwake store ({text})"
    if "readonly" in text or "read-only" in text:
        return f"the store {path} cannot be written ({text}); check its permissions and its folder's"
    return f"store {path}: {text}"


class StoreErrors:
    """Makes every public method of a core class raise StoreError, never a bare sqlite3 error."""

    @staticmethod
    def wrap(method: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(method)
        def guarded(self: SqliteBase, *args: Any, **kwargs: Any) -> T:
            try:
                return method(self, *args, **kwargs)
            except sqlite3.Error as exc:
                raise StoreError(describe_error(self.path, exc)) from exc

        return guarded

    @classmethod
    def install(cls, core: type[T]) -> type[T]:
        for klass in core.__mro__:
            for name, member in vars(klass).items():
                if (
                    name.startswith("_")
                    or not callable(member)
                    or isinstance(member, staticmethod | classmethod)
                ):
                    continue
                if getattr(core, name) is member:  # the one the core really uses
                    setattr(core, name, cls.wrap(member))
        return core


class SqliteBase:
    """The connection and path every part of the SQLite core shares.

    Statements run on the plain ``sqlite3`` connection; sqlite-utils applies the schema's
    migrations, and is only imported when one is pending, so the CLI's quick read-only
    commands never pay for it.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path
        self._savepoints = itertools.count(1)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction; inside another, a savepoint.

        ``BEGIN IMMEDIATE`` takes the write lock first, waiting up to the busy timeout for
        another process (the CLI's ``approve`` while the service commits). A deferred
        ``BEGIN`` (sqlite-utils' ``atomic()``) that reads before it writes would instead
        fail at once with "database is locked" when its read snapshot is already stale.
        """
        conn = self.conn
        if conn.in_transaction:
            savepoint = f"nested_{next(self._savepoints)}"
            conn.execute(f"SAVEPOINT {savepoint}")
            try:
                yield
            except BaseException:
                if conn.in_transaction:  # an error may have ended the whole transaction already
                    conn.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")
                    conn.execute(f"RELEASE SAVEPOINT {savepoint}")
                raise
            conn.execute(f"RELEASE SAVEPOINT {savepoint}")
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.rollback()
            raise
        conn.commit()

    @staticmethod
    def connect(
        path: Path,
        *,
        synchronous: str = "normal",
        create: bool = True,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    ) -> sqlite3.Connection:
        """A migrated connection: WAL, a busy timeout, foreign keys; the file private (0600)."""
        if not create and not path.exists():
            raise StoreError(f"no store at {path} yet: run 'agentwake run' first")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                # Created private: the store holds cursors and webhook secrets.
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
            elif stat.S_IMODE(path.stat().st_mode) & 0o077:
                os.chmod(path, 0o600)
            conn = sqlite3.connect(path, check_same_thread=False, timeout=busy_timeout_ms / 1000)
            default_isolation = conn.isolation_level
            conn.isolation_level = None  # journal_mode cannot change inside a transaction
            if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                # One opener at a time switches a new file: two switching at once each hold the lock
                # the other waits for, and SQLite answers one of them "locked" at once.
                with migrating(path):
                    if path.stat().st_size == 0:
                        # A new store gives pruned pages back (agentwake.store.retention); set before
                        # anything is written, WAL mode included, or it has no effect.
                        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
                    conn.execute("PRAGMA journal_mode=WAL")
            conn.isolation_level = default_isolation
            conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
            conn.execute("PRAGMA foreign_keys=ON")
            if not up_to_date(conn):
                from agentwake.store.sqlite.schema import migrations

                with migrating(path):
                    if not up_to_date(conn):  # another process may have migrated meanwhile
                        migrations.apply(sqlite_utils_database(conn))
        except sqlite3.Error as exc:
            raise StoreError(describe_error(path, exc)) from exc
        except OSError as exc:
            raise StoreError(f"cannot create the store {path}: {exc.strerror}") from exc
        return conn

    def close(self) -> None:
        self.conn.close()


@contextmanager
def migrating(path: Path) -> Iterator[None]:
    """One process at a time migrates the store at ``path`` (say ``agentwake run`` creating it while
    a CLI command opens it): sqlite-utils applies each migration in a transaction of its own, so two
    at once would both create the same table. The lock is ``flock`` on the store's folder, not on the
    file: closing another descriptor of the file would drop SQLite's own POSIX locks on it."""
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)  # releases the flock


def sqlite_utils_database(conn: sqlite3.Connection) -> sqlite_utils.Database:
    import sqlite_utils

    return sqlite_utils.Database(conn)


def up_to_date(conn: sqlite3.Connection) -> bool:
    """Whether every migration of the schema is applied, asked without loading sqlite-utils."""
    try:
        rows = conn.execute(
            "SELECT name FROM _sqlite_migrations WHERE migration_set = ?", [MIGRATION_SET]
        ).fetchall()
    except sqlite3.OperationalError:  # no migrations table: a new store
        return False
    return {row[0] for row in rows} >= set(MIGRATION_NAMES)
