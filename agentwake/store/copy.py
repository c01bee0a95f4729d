"""Copying a SQLite store into an empty PostgreSQL one (``agentwake store copy``).

Driven by the two databases' own column lists, not a list per table: every table of the SQLite
store (but the engines' bookkeeping and ``SKIPPED_TABLES``) is copied into the PostgreSQL table of
the same name, column by column, its row ids kept. A SQLite table or column the PostgreSQL schema
lacks stops the copy before anything is written; a PostgreSQL column SQLite lacks gets its default.

The source is read in one read transaction of a read-only connection (a consistent snapshot, never
migrated: its schema must be the one this agentwake writes). The target is created (migrated) by
``PostgresStore.open`` first, then filled in ONE transaction that first locks its tables and checks
they are empty: a failure anywhere leaves it as it was. Each identity column then continues after
the largest id copied (or SQLite's AUTOINCREMENT counter, if higher), so new rows never clash.

Rows go through ``COPY ... FROM STDIN``; values are copied as stored (webhook secrets included)
and never appear in a message.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from agentwake.errors import StoreError
from agentwake.store.sqlite.versions import MIGRATION_NAMES, MIGRATION_SET

if TYPE_CHECKING:
    import psycopg

    from agentwake.store.postgres import PostgresStore

# Tables never copied: who owns a subscription is the state of a running process, not of the store.
SKIPPED_TABLES: Final = frozenset({"subscription_owners"})
# Each engine's record of its own schema version: the target has its own.
SQLITE_BOOKKEEPING: Final = frozenset(
    {"_sqlite_migrations", "sqlite_sequence", "sqlite_stat1", "sqlite_stat4"}
)
POSTGRES_BOOKKEEPING: Final = frozenset({"schema_migrations"})
# Rows read from SQLite and written per step (and per progress report).
BATCH_ROWS: Final = 5000

# (table, rows copied so far, rows in the table): called after each batch, and once per table.
Progress = Callable[[str, int, int], None]


@dataclass
class CopyReport:
    """What was copied: rows per table, in the order they were copied."""

    source: str
    target: str
    tables: dict[str, int] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(self.tables.values())

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "target": self.target, "tables": dict(self.tables), "rows": self.rows}


@dataclass(frozen=True)
class TargetColumn:
    name: str
    data_type: str
    identity: bool
    serial: bool


# ---- the source --------------------------------------------------------------------------------


def open_source(path: Path) -> sqlite3.Connection:
    """The SQLite store at ``path``, read-only, its schema the one this agentwake writes."""
    if not path.is_file():
        raise StoreError(f"no SQLite store at {path}")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreError(f"the store {path} cannot be opened: {exc}") from None
    try:
        check_source_schema(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


def check_source_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a store whose migrations are not exactly this agentwake's (older: migrate it first)."""
    try:
        rows = conn.execute(
            "SELECT name FROM _sqlite_migrations WHERE migration_set = ?", [MIGRATION_SET]
        ).fetchall()
    except sqlite3.OperationalError:
        raise StoreError(f"{path} is not an agentwake store (it has no schema version)") from None
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"the store {path} is not a readable agentwake store ({exc})") from None
    applied = {row[0] for row in rows}
    if applied - set(MIGRATION_NAMES):
        raise StoreError(
            f"the store {path} has a newer schema than this agentwake: copy it with the agentwake that wrote it"
        )
    if set(MIGRATION_NAMES) - applied:
        raise StoreError(
            f"the store {path} has an older schema than this agentwake: migrate it first (any command that"
            " opens it, e.g. 'agentwake status', does), then copy it"
        )


def source_services(path: Path) -> list[dict[str, Any]]:
    """The most recent starts of the service on the SQLite store at ``path`` (read-only, as
    ``Store.services`` shows them): whether one still runs there is for the caller to judge."""
    from agentwake.store.sqlite import SqliteCore

    conn = open_source(path)
    try:
        return SqliteCore(conn, path).services()
    finally:
        conn.close()


def source_tables(conn: sqlite3.Connection) -> list[str]:
    """The tables to copy, in the order they were created."""
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid").fetchall()
    return [
        name
        for (name,) in rows
        if name not in SQLITE_BOOKKEEPING and not name.startswith("sqlite_") and name not in SKIPPED_TABLES
    ]


def source_columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA table_info({quote_sqlite(table)})").fetchall()]


def sqlite_sequences(conn: sqlite3.Connection) -> dict[str, int]:
    """SQLite's AUTOINCREMENT counters: the largest id ever given, per table (rows may be gone since)."""
    try:
        return {name: int(seq) for name, seq in conn.execute("SELECT name, seq FROM sqlite_sequence")}
    except sqlite3.OperationalError:  # no AUTOINCREMENT table at all
        return {}


def quote_sqlite(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def read_rows(conn: sqlite3.Connection, table: str, columns: list[str]) -> Iterator[list[tuple[Any, ...]]]:
    cursor = conn.execute(
        f"SELECT {', '.join(quote_sqlite(c) for c in columns)} FROM {quote_sqlite(table)} ORDER BY rowid"
    )
    while batch := cursor.fetchmany(BATCH_ROWS):
        yield batch


# ---- the target --------------------------------------------------------------------------------


async def target_columns(conn: psycopg.AsyncConnection[Any]) -> dict[str, dict[str, TargetColumn]]:
    """Every table of the current schema (but the bookkeeping) with its columns."""
    cursor = await conn.execute(
        "SELECT c.table_name, c.column_name, c.data_type, c.is_identity, coalesce(c.column_default, '')"
        " FROM information_schema.columns c JOIN information_schema.tables t"
        " ON t.table_schema = c.table_schema AND t.table_name = c.table_name"
        " WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'"
        " ORDER BY c.table_name, c.ordinal_position"
    )
    tables: dict[str, dict[str, TargetColumn]] = {}
    for table, column, data_type, is_identity, default in await cursor.fetchall():
        if table in POSTGRES_BOOKKEEPING:
            continue
        tables.setdefault(table, {})[column] = TargetColumn(
            column, data_type, is_identity == "YES", str(default).startswith("nextval(")
        )
    return tables


async def foreign_keys(conn: psycopg.AsyncConnection[Any]) -> set[tuple[str, str]]:
    """(table, the table it references) for every foreign key of the current schema."""
    cursor = await conn.execute(
        "SELECT src.relname, ref.relname FROM pg_constraint c"
        " JOIN pg_class src ON src.oid = c.conrelid JOIN pg_class ref ON ref.oid = c.confrelid"
        " JOIN pg_namespace n ON n.oid = src.relnamespace"
        " WHERE c.contype = 'f' AND n.nspname = current_schema()"
    )
    return {(src, ref) for src, ref in await cursor.fetchall() if src != ref}


def copy_order(tables: list[str], references: set[tuple[str, str]]) -> list[str]:
    """``tables`` with each after those it references (else in the given order)."""
    order: list[str] = []
    waiting = list(tables)
    while waiting:
        ready = next(
            (
                t
                for t in waiting
                if all(ref in order or ref not in waiting for src, ref in references if src == t)
            ),
            waiting[0],  # a cycle: the foreign keys would refuse it anyway, and say so
        )
        order.append(ready)
        waiting.remove(ready)
    return order


def held_rows(counts: dict[str, int]) -> str:
    """``3 events, 1 subscriptions``: the non-empty tables, events first."""
    shown = sorted(((n, t) for t, n in counts.items() if n), key=lambda item: (item[1] != "events", item[1]))
    return ", ".join(f"{n} {t}" for n, t in shown)


async def check_empty(conn: psycopg.AsyncConnection[Any], tables: list[str]) -> None:
    from psycopg import sql

    counts: dict[str, int] = {}
    for table in tables:
        cursor = await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        row = await cursor.fetchone()
        counts[table] = int(row[0]) if row else 0
    if any(counts.values()):
        raise StoreError(
            f"the target database already holds an agentwake store ({held_rows(counts)}); copy only into an"
            " empty one"
        )


def check_columns(
    tables: list[str], columns: dict[str, list[str]], target: dict[str, dict[str, TargetColumn]]
) -> None:
    """Every SQLite table and column has its PostgreSQL counterpart, or nothing is copied."""
    for table in tables:
        if table not in target:
            raise StoreError(
                f"the PostgreSQL schema has no table {table!r}, which the SQLite store has: this agentwake"
                " cannot copy it"
            )
        missing = [c for c in columns[table] if c not in target[table]]
        if missing:
            raise StoreError(
                f"the PostgreSQL table {table!r} has no column {', '.join(map(repr, missing))}, which the"
                " SQLite store has: this agentwake cannot copy it"
            )


def converter(column: TargetColumn) -> Callable[[Any], Any] | None:
    """How a SQLite value becomes the PostgreSQL column's, where plain text would not do."""
    if column.data_type == "boolean":
        return lambda value: None if value is None else bool(value)
    return None


async def copy_table(
    conn: psycopg.AsyncConnection[Any],
    source: sqlite3.Connection,
    table: str,
    columns: list[str],
    target: dict[str, TargetColumn],
    total: int,
    progress: Progress | None,
) -> int:
    from psycopg import sql

    converters = [(i, fn) for i, c in enumerate(columns) if (fn := converter(target[c])) is not None]
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    )
    copied = 0
    async with conn.cursor() as cursor, cursor.copy(statement) as copy:
        for batch in read_rows(source, table, columns):
            for row in batch:
                if converters:
                    values = list(row)
                    for index, fn in converters:
                        values[index] = fn(values[index])
                    row = tuple(values)
                await copy.write_row(row)
            copied += len(batch)
            if progress is not None and copied < total:
                progress(table, copied, total)
    if progress is not None:
        progress(table, copied, total)
    return copied


async def continue_identities(
    conn: psycopg.AsyncConnection[Any], table: str, target: dict[str, TargetColumn], sequence: int
) -> None:
    """Each generated id column of ``table`` goes on after the largest id in it (or ``sequence``)."""
    from psycopg import sql

    for column in target.values():
        if not (column.identity or column.serial):
            continue
        cursor = await conn.execute(
            sql.SQL("SELECT max({}) FROM {}").format(sql.Identifier(column.name), sql.Identifier(table))
        )
        row = await cursor.fetchone()
        largest = max(int(row[0]) if row and row[0] is not None else 0, sequence)
        if not largest:
            continue
        if column.identity:
            await conn.execute(
                sql.SQL("ALTER TABLE {} ALTER COLUMN {} RESTART WITH {}").format(
                    sql.Identifier(table), sql.Identifier(column.name), sql.Literal(largest + 1)
                )
            )
        else:
            await conn.execute(
                "SELECT setval(pg_get_serial_sequence(%s, %s), %s, false)",
                [sql.Identifier(table).as_string(conn), column.name, largest + 1],
            )


# ---- the copy ----------------------------------------------------------------------------------


async def copy_store(
    source: Path, url: str, *, password: str | None = None, progress: Progress | None = None
) -> CopyReport:
    """Copy the SQLite store at ``source`` into the empty PostgreSQL database at ``url``, in one
    transaction; what was copied. Every failure is a StoreError, and leaves the target as it was
    (but its schema, created first)."""
    from agentwake.store.postgres import PostgresStore

    conn = open_source(source)
    try:
        conn.execute("BEGIN")  # one snapshot of the whole store
        tables = source_tables(conn)
        columns = {table: source_columns(conn, table) for table in tables}
        totals = {
            table: conn.execute(f"SELECT count(*) FROM {quote_sqlite(table)}").fetchone()[0]
            for table in tables
        }
        sequences = sqlite_sequences(conn)
        store = await PostgresStore.open(url, password=password, create=True, min_size=1, max_size=1)
        try:
            report = CopyReport(str(source), store.target)
            await _fill(store, conn, tables, columns, totals, sequences, report, progress)
        finally:
            await store.close()
    except sqlite3.Error as exc:
        raise StoreError(f"reading the store {source} failed: {exc}") from None
    finally:
        conn.close()
    return report


async def _fill(
    store: PostgresStore,
    source: sqlite3.Connection,
    tables: list[str],
    columns: dict[str, list[str]],
    totals: dict[str, int],
    sequences: dict[str, int],
    report: CopyReport,
    progress: Progress | None,
) -> None:
    import psycopg
    from psycopg import sql

    try:
        # One long transaction, reading SQLite between its statements: the session timeouts that
        # cut off a frozen process's transaction are lifted for it.
        async with store.transaction(bounded=False) as conn:
            target = await target_columns(conn)
            if target:
                # Taken first: no process writes into the target between the check and the copy.
                await conn.execute(
                    sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(
                        sql.SQL(", ").join(sql.Identifier(t) for t in sorted(target))
                    )
                )
            await check_empty(conn, sorted(target))
            check_columns(tables, columns, target)
            for table in copy_order(tables, await foreign_keys(conn)):
                report.tables[table] = await copy_table(
                    conn, source, table, columns[table], target[table], totals[table], progress
                )
            for table in tables:
                await continue_identities(conn, table, target[table], sequences.get(table, 0))
    except psycopg.Error as exc:
        raise StoreError(f"the copy failed, nothing was copied: {store.store_error(exc)}") from None


__all__ = ["SKIPPED_TABLES", "CopyReport", "Progress", "copy_store", "source_services"]
