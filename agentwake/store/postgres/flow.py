"""Policy flow control (dedup window, debounce batches, rate limit), checked and marked atomically.

The marks a check counts may not exist yet, so no row lock can guard them: a transaction first takes
a ``pg_advisory_xact_lock`` per (rule, check, key) it applies, in a fixed order, and holds them to its
end. Two processes gating events of one rule and key then run one after the other, as the SQLite
store's single writer does.
"""

from __future__ import annotations

from typing import Any

from agentwake.jsontext import encode_json
from agentwake.store.postgres.base import PostgresBase, lock_key
from agentwake.store.records import FlowGate, FlowOutcome


def flow_locks(rule: str, gate: FlowGate) -> list[int]:
    """The advisory lock keys of the checks ``gate`` applies for ``rule``, sorted (no lock-order cycle)."""
    keys = [
        lock_key("flow", rule, kind, key)
        for kind, key in (("dedup", gate.dedup_key), ("batch", gate.batch_key), ("rate", gate.rate_key))
        if key is not None
    ]
    return sorted(set(keys))


class FlowControl(PostgresBase):
    async def flow_gate(
        self, event_row: int, rule: str, record: dict[str, Any], gate: FlowGate
    ) -> FlowOutcome:
        """Apply a rule's flow control to one event, atomically: dedup, then rate limit, then debounce.

        Returns what to do: run it now, or it was a duplicate / over the limit (nothing
        stored but the mark of the check), or it joined or opened a batch (stored here).
        """
        async with self.transaction() as conn:
            for key in flow_locks(rule, gate):
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", [key])
            execute = conn.execute
            if gate.dedup_key is not None and gate.dedup_since is not None:
                cur = await execute(
                    "SELECT m.event_row, e.event_id FROM flow_marks m JOIN events e ON e.id = m.event_row"
                    " WHERE m.rule = %s AND m.kind = 'dedup' AND m.key = %s AND m.at >= %s AND m.event_row <> %s"
                    " ORDER BY m.at, m.id LIMIT 1",
                    [rule, gate.dedup_key, gate.dedup_since, event_row],
                )
                row = await cur.fetchone()
                if row is not None:
                    return FlowOutcome("duplicate", other=int(row[0]), other_event_id=str(row[1]))
                await execute(
                    "INSERT INTO flow_marks (rule, kind, key, event_row, at) VALUES (%s, 'dedup', %s, %s, %s)",
                    [rule, gate.dedup_key, event_row, gate.now],
                )
            if gate.batch_key is not None and gate.batch_since is not None:
                # The leader is locked: it must still be pending when this event joins it.
                cur = await execute(
                    "SELECT m.event_row FROM flow_marks m JOIN events e ON e.id = m.event_row"
                    " WHERE m.rule = %s AND m.kind = 'batch' AND m.key = %s AND m.at >= %s AND e.state = 'pending'"
                    " AND (SELECT count(*) FROM events f WHERE f.batch_leader = m.event_row) < %s"
                    " ORDER BY m.at DESC, m.id DESC LIMIT 1 FOR UPDATE OF e",
                    [rule, gate.batch_key, gate.batch_since, gate.batch_max - 1],
                )
                leader = await cur.fetchone()
                if leader is not None:
                    await execute(
                        "UPDATE events SET state = 'batched', batch_leader = %s, decision = %s,"
                        " state_changed_at = %s WHERE id = %s",
                        [leader[0], encode_json(record), gate.now, event_row],
                    )
                    return FlowOutcome("batched", other=int(leader[0]))
            if gate.rate_key is not None and gate.rate_since is not None:
                cur = await execute(
                    # Strictly after the window start: an event delayed to the window's end is then in.
                    "SELECT min(at), count(*) FROM flow_marks WHERE rule = %s AND kind = 'rate' AND key = %s"
                    " AND at > %s",
                    [rule, gate.rate_key, gate.rate_since],
                )
                counted = await cur.fetchone()
                assert counted is not None
                oldest, count = counted
                if count >= gate.rate_max:
                    return FlowOutcome("over_limit", oldest=oldest)
                await execute(
                    "INSERT INTO flow_marks (rule, kind, key, event_row, at) VALUES (%s, 'rate', %s, %s, %s)",
                    [rule, gate.rate_key, event_row, gate.now],
                )
            if gate.batch_key is not None and gate.batch_due is not None:
                await execute(
                    "INSERT INTO flow_marks (rule, kind, key, event_row, at) VALUES (%s, 'batch', %s, %s, %s)",
                    [rule, gate.batch_key, event_row, gate.now],
                )
                await execute(
                    "UPDATE events SET state = 'pending', attempts = greatest(0, attempts - 1), available_at = %s,"
                    " decision = %s, state_changed_at = %s WHERE id = %s",
                    [gate.batch_due, encode_json({**record, "batch_leader": True}), gate.now, event_row],
                )
                return FlowOutcome("leader")
            return FlowOutcome("run")
