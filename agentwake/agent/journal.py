"""The tool-call journal as a run uses it: idempotency keys, resumable transcripts, unknown outcomes.

Every call a run sends is written to the store first ('sent', with its idempotency key) and
settled with its result and the reply the model got. The write is fenced on the run's claim: a
run whose lease lapsed, or whose event was claimed again, gets ``LeaseLost`` and sends nothing.
A rerun of the event goes on from the newest run's stored transcript that has an LLM answer
(``resumable``): the calls its last answer asked for that any run of the event settled get the
same reply again (``journaled_for``); one sent without a recorded outcome is not sent again, and
the event needs a person (``unknown_reason`` says what to do).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from agentwake.agent.fence import Fence
from agentwake.store import InboxEvent, JournaledCall, ResumePoint, RunKind, ToolCallRecord
from agentwake.store.records import SETTLED_CALLS

# A fenced value in a stored transcript: its boundary is the one a resumed run keeps using.
BOUNDARY: Final = re.compile(r'boundary="([0-9a-f]{8,64})"')
# Journal states whose reply the model already got: a rerun gives it the same reply, sends nothing.
SETTLED: Final = SETTLED_CALLS


@dataclass(frozen=True, slots=True)
class RunScope:
    """What a run's tool calls are journaled under."""

    run_id: int
    event: InboxEvent
    kind: RunKind

    def idempotency_key(self, step: int, call_id: str) -> str:
        """Stable for one call of one run: a resend after a crash carries the same key."""
        event = self.event
        return f"agentwake/{event.server}/{event.event_id}/run-{self.run_id}/step-{step}/{call_id}"


@dataclass(frozen=True, slots=True)
class CallDone:
    record: ToolCallRecord
    reply: dict[str, Any]
    # Already in the tool-call journal (sent, or reused from an earlier run): not recorded again.
    journaled: bool = False
    unknown: bool = False


def pending_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool calls of a stored transcript's last answer that have no reply yet."""
    if not messages or messages[-1].get("role") != "assistant":
        return []
    return list(messages[-1].get("tool_calls") or [])


def journaled_for(calls: list[dict[str, Any]], journal: dict[str, JournaledCall]) -> dict[str, JournaledCall]:
    """The journal entries of these pending calls: the same call id, asking for the same tool.

    The journal spans every run of the event, and a provider may number its call ids afresh in each
    answer; a row for another tool under the same id is another call, not this one.
    """
    found: dict[str, JournaledCall] = {}
    for call in calls:
        call_id = str(call.get("id"))
        known = journal.get(call_id)
        if known is not None and known.tool == str((call.get("function") or {}).get("name") or ""):
            found[call_id] = known
    return found


def resumable(resume: ResumePoint | None, datamark: bool) -> tuple[ResumePoint, Fence] | None:
    """The resume point and its run's fence, if its transcript can be continued."""
    if resume is None or len(resume.messages) < 3:
        return None
    found = BOUNDARY.search(str(resume.messages[1].get("content") or ""))
    if found is None:
        return None
    return resume, Fence(boundary=found.group(1), datamark=datamark)


def unknown_reason(event: InboxEvent, calls: Sequence[ToolCallRecord | JournaledCall]) -> str:
    names = ", ".join(call.tool for call in calls)
    return (
        f"tool call(s) {names} were sent but their outcome is unknown, so they are not sent again;"
        f" check on the server whether they happened, then: agentwake retry --resend-unknown {event.event_id}"
    )


__all__ = [
    "SETTLED",
    "CallDone",
    "RunScope",
    "journaled_for",
    "pending_calls",
    "resumable",
    "unknown_reason",
]
