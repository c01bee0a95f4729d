"""Fault injection for the fault suite (tests/test_fault_suite.py). Test-only: it does nothing unless asked.

``AGENTWAKE_CRASH_AT=NAME`` (or ``NAME:N``), read once when this module is imported, makes the
first (or N-th) hit of ``crash_point(NAME)`` SIGKILL this process on the spot, as a power cut
or the OOM killer would, at an exact point that a test could not reach by timing a kill. Unset
(always, outside the tests) a call costs one check of a module global.

A hit counts only when ``when`` is truthy, so a point on a path that also runs with nothing to
do (a cursor-only ingest, say) can count just the calls that matter (the ones with new events).

The points:

- ``after_inbox_commit`` (store/sqlite/inbox.py): right after a transaction that stored new
  events committed, before anything else (the agent, the webhook's 2xx) has seen them.
- ``mid_cursor_write`` (store/sqlite/inbox.py): inside that transaction, the new events
  inserted and the cursor not yet written; the kill lands with the transaction open.
- ``webhook_accept`` (delivery/receiver.py): an event delivery read and its signature verified,
  not yet committed nor answered.
"""

from __future__ import annotations

import os
import signal
from typing import Final

ENV: Final = "AGENTWAKE_CRASH_AT"


def _parse(value: str) -> tuple[str, int]:
    """``NAME`` or ``NAME:N`` as (name, N); a bad N is an error, so a typo cannot silently disarm a test."""
    name, _, count = value.strip().partition(":")
    if not count:
        return name, 1
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"{ENV}={value!r}: the hit count after ':' must be a positive integer")
    return name, int(count)


_TARGET, _AT = _parse(os.environ.get(ENV, ""))
_ARMED: Final = bool(_TARGET)
_hits = 0


def crash_point(name: str, when: object = True) -> None:
    """SIGKILL this process if ``name`` is the armed point and this is its N-th hit (counting only
    the calls whose ``when`` is truthy); otherwise nothing."""
    if _ARMED and when:
        _hit(name)


def _hit(name: str) -> None:
    global _hits
    if name != _TARGET:
        return
    _hits += 1
    if _hits == _AT:
        os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["ENV", "crash_point"]
