"""The kill switch's rows: what is paused (everything, a server, a subscription or a rule), by whom,
why and since when. Both backends keep them in one ``pauses`` table and share this SQL.

A claim takes no event of a paused server or subscription (nor any while everything is paused):
those wait in 'pending', across restarts and across every process on the store. A paused rule is
found only once an event is decided, so the worker gives such an event back (agentwake.pausing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, cast, get_args

PauseScope = Literal["all", "server", "subscription", "rule"]
PAUSE_SCOPES: Final = get_args(PauseScope)
REASON_MAX: Final = 500

# The same text in both backends: plain types only.
PAUSES_TABLE: Final = """
    CREATE TABLE pauses (
        scope text NOT NULL,
        name text NOT NULL,
        reason text,
        paused_by text NOT NULL,
        paused_at text NOT NULL,
        cut_short integer NOT NULL DEFAULT 0,
        PRIMARY KEY (scope, name)
    )
"""

# For a claim over ``subscriptions s``: the subscription is not paused, nor its server, nor everything.
NOT_PAUSED_SQL: Final = (
    "NOT EXISTS (SELECT 1 FROM pauses p WHERE p.scope = 'all'"
    " OR (p.scope = 'server' AND p.name = s.server) OR (p.scope = 'subscription' AND p.name = s.name))"
)
PAUSES_SQL: Final = (
    "SELECT scope, name, reason, paused_by, paused_at, cut_short FROM pauses ORDER BY paused_at, scope, name"
)
PAUSE_COLUMNS: Final = ("scope", "name", "reason", "by", "at", "cut_short")


@dataclass(frozen=True, slots=True)
class Pause:
    """One thing paused. ``name`` is empty for everything; ``cut_short`` asked running runs to stop."""

    scope: PauseScope
    name: str
    reason: str | None
    by: str
    at: str
    cut_short: bool = False

    def covers(self, *, server: str, subscription: str, rule: str | None) -> bool:
        """Whether an event of this server and subscription, decided by ``rule``, is paused by this."""
        if self.scope == "all":
            return True
        if self.scope == "server":
            return self.name == server
        if self.scope == "subscription":
            return self.name == subscription
        return rule is not None and self.name == rule

    def describe(self) -> str:
        what = "everything" if self.scope == "all" else f"{self.scope} {self.name}"
        why = f": {self.reason}" if self.reason else ""
        return f"{what} (paused by {self.by} at {self.at}{why})"


def pause_of(row: Sequence[Any]) -> Pause:
    scope, name, reason, by, at, cut_short = row
    return Pause(scope, name, reason, by, at, bool(cut_short))


def as_dict(pause: Pause) -> dict[str, Any]:
    """A pause as `status --json` and the operator endpoint show it."""
    return dict(
        zip(
            PAUSE_COLUMNS,
            (pause.scope, pause.name, pause.reason, pause.by, pause.at, pause.cut_short),
            strict=True,
        )
    )


def checked(scope: str, name: str | None, reason: str | None) -> tuple[PauseScope, str, str | None]:
    """A pause's scope, name and reason as stored; a ValueError says what is wrong with them."""
    if scope not in PAUSE_SCOPES:
        raise ValueError(f"unknown pause scope {scope!r}: one of {', '.join(PAUSE_SCOPES)}")
    if scope == "all":
        if name:
            raise ValueError("pausing everything takes no name")
        name = ""
    elif not name or not name.strip():
        raise ValueError(f"pausing a {scope} needs its name")
    reason = reason.strip() if reason else None
    if reason and len(reason) > REASON_MAX:
        raise ValueError(f"a pause's reason is at most {REASON_MAX} characters")
    return cast(PauseScope, scope), name, reason or None
