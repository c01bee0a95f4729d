"""What the operator pages show, made safe: the store's records turned into plain values for the
templates (agentwake.web.templates).

Event data on the page is what the agent would see: ``sanitize`` (bounded, invisible
characters removed, secrets redacted) with the config's limits and the rule's redact_pii.
Every other text a peer supplied (event ids, names, errors, the model's text, tool results) is
cleaned of control and bidi characters, redacted and clipped. Jinja2 escapes everything
(autoescape on), and the Content-Security-Policy allows the one script and stylesheet of the
page by hash, nothing else (agentwake.web.style).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from agentwake.redaction import redact
from agentwake.sanitize import clean_text, sanitize_with
from agentwake.web.style import CONTENT_SECURITY_POLICY
from agentwake.web.templates import TEMPLATES

if TYPE_CHECKING:
    from agentwake.config import AgentwakeConfig
    from agentwake.policy import Policy

# Peer text in tables (ids, names, errors) is cut to this many characters.
SHOWN_CHARS: Final = 200
# The one-line data preview in the events tables.
PREVIEW_CHARS: Final = 160
# A block of text on an event's or run's page (a message, a tool's arguments or result).
BLOCK_CHARS: Final = 20_000


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """Peer text for the page: one line, no control or bidi characters, at most ``limit`` characters."""
    text = clean_text("" if value is None else str(value))[0]
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class HeldEvent:
    """A held event as the page shows it: its sanitized data and what approving it would allow."""

    row: int
    event_id: str
    event: str
    server: str
    subscription: str
    received_at: str
    rule: str
    why: str
    tools: list[str]
    injection_score: float
    signals: list[str]
    notes: list[str]
    data: str
    # What the agent may do if approved (the decision's "authority" lines); None: not recorded.
    authority: list[str] | None = None


def authority_lines(decision: dict[str, Any] | None) -> list[str] | None:
    """The decision's "authority" lines (what approving lets the agent do), made safe; None without them."""
    lines = (decision or {}).get("authority")
    if not isinstance(lines, list):
        return None
    return [shown(line, 500) for line in lines]


def granted_tools(decision: dict[str, Any] | None, subscription: str, config: AgentwakeConfig) -> list[str]:
    """The tools a run would get if approved: the rule's, else the subscription's (agentwake.decide.run_spec)."""
    tools = (decision or {}).get("rule_tools")
    if isinstance(tools, list):
        return [str(t) for t in tools]
    sub = next((s for s in config.subscriptions if s.name == subscription), None)
    return list(sub.tools) if sub is not None else []


def answer_shown(answer: dict[str, Any]) -> dict[str, Any]:
    """One record of the approvals' audit trail (``store.answers()``), made safe to show."""
    authority = answer.get("authority")
    return {
        "row": answer.get("row"),
        "event_id": shown(answer["event_id"]),
        "subscription": shown(answer["subscription"]),
        "answer": shown(answer["answer"]),
        "who": shown(answer["who"]),
        "via": shown(answer["via"]),
        "address": shown(answer["address"]) if answer.get("address") else None,
        "at": shown(answer["at"]),
        "rule": shown(answer["rule"]) if answer.get("rule") else None,
        "tools": [shown(t) for t in answer.get("tools") or []],
        "authority": [shown(line, 500) for line in authority] if isinstance(authority, list) else None,
        "note": shown(answer["note"], 500) if answer.get("note") else None,
    }


def held_event(held: dict[str, Any], config: AgentwakeConfig, policy: Policy | None) -> HeldEvent:
    """One row of ``store.approvals()`` for the page."""
    decision = held.get("decision") or {}
    rule_name = str(decision.get("rule") or "default")
    rule = policy.rule(rule_name) if policy is not None else None
    cleaned = sanitize_with(config.sanitize, held["data"], pii=bool(rule and rule.redact_pii))
    tools = granted_tools(decision, held["subscription"], config)
    notes = [*cleaned.cuts]
    if cleaned.redactions:
        notes.append("redacted: " + ", ".join(f"{k} ({v})" for k, v in sorted(cleaned.redactions.items())))
    if cleaned.removed_characters:
        notes.append(f"{cleaned.removed_characters} invisible or control character(s) removed")
    return HeldEvent(
        row=int(held["id"]),
        event_id=shown(held["event_id"]),
        event=shown(held["event"]),
        server=shown(held["server"]),
        subscription=shown(held["subscription"]),
        received_at=shown(held["received_at"]),
        rule=shown(rule_name),
        why=shown(decision.get("why"), 500),
        tools=[shown(t) for t in tools],
        injection_score=round(float(cleaned.injection_score), 2),
        signals=[shown(s) for s in cleaned.injection_signals],
        notes=[shown(n, 500) for n in notes],
        data=json.dumps(cleaned.value, indent=2, ensure_ascii=False, sort_keys=True),
        authority=authority_lines(decision),
    )


def recent_event(row: dict[str, Any], config: AgentwakeConfig) -> dict[str, Any]:
    """One row of ``store.inbox()`` for the page, its data as a one-line sanitized preview."""
    preview = json.dumps(sanitize_with(config.sanitize, row["data"]).value, ensure_ascii=False)
    decision = row.get("decision") or {}
    return {
        "row": int(row["id"]),
        "server": shown(row["server"]),
        "rule": shown(decision["rule"]) if decision.get("rule") else None,
        "event_id": shown(row["event_id"]),
        "event": shown(row["event"]),
        "subscription": shown(row["subscription"]),
        "received_at": shown(row["received_at"]),
        "state": shown(row["state"]),
        "last_error": shown(row["last_error"]) if row.get("last_error") else None,
        "preview": shown(preview, PREVIEW_CHARS),
    }


def recent_run(action: dict[str, Any]) -> dict[str, Any]:
    """One row of ``store.actions()`` for the page."""
    return {
        "run_id": action["run_id"],
        "event_row": action.get("event_row"),
        "event_id": shown(action["event_id"]),
        "subscription": shown(action["subscription"]),
        "kind": shown(action["kind"]),
        "status": shown(action["status"]),
        "reason": shown(action["reason"]) if action.get("reason") else None,
        "model": shown(action["model"]),
        "tools": [shown(t) for t in action.get("tools") or []],
        "refused": action.get("refused") or 0,
        "started_at": shown(action["started_at"]),
        "duration_ms": action.get("duration_ms"),
        "summary": shown(action["summary"], 300) if action.get("summary") else "",
    }


def block(value: object, limit: int = BLOCK_CHARS) -> str:
    """Peer text for a block on the page (lines kept): no control or bidi characters, secrets
    redacted, at most ``limit`` characters."""
    if value is None:
        return ""
    text = (
        value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    )
    text = redact(clean_text(text)[0])[0]
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _message(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text
        content = "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            calls.append(f"{shown(function.get('name'))}({block(function.get('arguments'), 2000)})")
        else:
            calls.append(block(call, 2000))
    return {
        "role": shown(message.get("role")),
        "name": shown(message.get("name") or message.get("tool_call_id") or ""),
        "content": block(content),
        "calls": calls,
    }


def run_shown(run: dict[str, Any]) -> dict[str, Any]:
    """One run of ``store.event_detail()`` for its page: the run, its tool calls and its transcript."""
    cost = run.get("cost_usd")
    decision = run.get("decision") or {}
    messages = run.get("messages") or []
    return {
        "run_id": int(run["run_id"]),
        "kind": shown(run["kind"]),
        "attempt": run.get("attempt"),
        "model": shown(run.get("model")),
        "status": shown(run.get("status")),
        "reason": shown(run["reason"]) if run.get("reason") else None,
        "rule": shown(decision.get("rule")) if isinstance(decision, dict) and decision.get("rule") else None,
        "started_at": shown(run.get("started_at")),
        "finished_at": shown(run["finished_at"]) if run.get("finished_at") else None,
        "duration_ms": run.get("duration_ms"),
        "steps": run.get("steps") or 0,
        "prompt_tokens": run.get("prompt_tokens") or 0,
        "completion_tokens": run.get("completion_tokens") or 0,
        "cached_tokens": run.get("cached_tokens") or 0,
        "cost": f"${cost:.4f}" if isinstance(cost, int | float) else "unknown",
        "summary": shown(run["summary"], 500) if run.get("summary") else None,
        "system_prompt": block(run.get("system_prompt")),
        "messages": [_message(m) for m in messages if isinstance(m, dict)],
        "tool_calls": [
            {
                "step": c.get("step"),
                "tool": shown(c.get("tool")),
                "status": shown(c.get("status")),
                "duration_ms": c.get("duration_ms"),
                "arguments": block(c.get("arguments"), 5000),
                "result": block(c.get("result"), 5000),
            }
            for c in run.get("tool_calls") or []
        ],
    }


def event_shown(detail: dict[str, Any], config: AgentwakeConfig, policy: Policy | None) -> dict[str, Any]:
    """One event of ``store.event_detail()`` for its page: data, decision, answers and runs."""
    decision = detail.get("decision")
    rule_name = str(decision.get("rule") or "default") if isinstance(decision, dict) else None
    rule = policy.rule(rule_name) if policy is not None and rule_name is not None else None
    cleaned = sanitize_with(config.sanitize, detail["data"], pii=bool(rule and rule.redact_pii))
    notes = [*cleaned.cuts]
    if cleaned.redactions:
        notes.append("redacted: " + ", ".join(f"{k} ({v})" for k, v in sorted(cleaned.redactions.items())))
    tools = (decision or {}).get("rule_tools") if isinstance(decision, dict) else None
    score = detail.get("injection_score")
    return {
        "row": int(detail["id"]),
        "event_id": shown(detail["event_id"]),
        "event": shown(detail["event"]),
        "server": shown(detail["server"]),
        "subscription": shown(detail["subscription"]),
        "state": shown(detail["state"]),
        "attempts": detail.get("attempts") or 0,
        "last_error": shown(detail["last_error"], 500) if detail.get("last_error") else None,
        "timestamp": shown(detail.get("timestamp")),
        "received_at": shown(detail.get("received_at")),
        "injection_score": round(float(score), 2) if isinstance(score, int | float) else "not scored",
        "notes": [shown(n, 500) for n in notes],
        "data": json.dumps(cleaned.value, indent=2, ensure_ascii=False, sort_keys=True),
        "decision": block(decision) if decision is not None else None,
        "rule": shown(rule_name) if rule_name is not None else None,
        "why": shown((decision or {}).get("why"), 500) if isinstance(decision, dict) else "",
        "tools": [shown(t) for t in tools] if isinstance(tools, list) else None,
        "authority": authority_lines(decision if isinstance(decision, dict) else None),
        "answers": [answer_shown(a) for a in detail.get("answers") or []],
        "runs": [run_shown(r) for r in detail.get("runs") or []],
    }


__all__ = [
    "CONTENT_SECURITY_POLICY",
    "TEMPLATES",
    "HeldEvent",
    "answer_shown",
    "authority_lines",
    "block",
    "event_shown",
    "granted_tools",
    "held_event",
    "recent_event",
    "recent_run",
    "run_shown",
    "shown",
]
