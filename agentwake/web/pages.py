"""The approvals page, server-rendered: what the store holds, made safe to show, and the templates.

Event data on the page is what the agent would see: ``sanitize`` (bounded, invisible
characters removed, secrets redacted) with the config's limits and the rule's redact_pii.
Every other text a peer supplied (event ids, names, errors, the model's summary) is cleaned
of control and bidi characters and clipped. Jinja2 escapes everything (autoescape on), and
the page's Content-Security-Policy allows no script at all: the page needs none.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from jinja2 import DictLoader, Environment, select_autoescape

from agentwake.sanitize import clean_text, sanitize_with

if TYPE_CHECKING:
    from agentwake.config import AgentwakeConfig
    from agentwake.policy import Policy

# Peer text in tables (ids, names, errors) is cut to this many characters.
SHOWN_CHARS: Final = 200
# The one-line data preview in the recent events table.
PREVIEW_CHARS: Final = 160

STYLE: Final = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #1b1b1b; max-width: 80rem; }
header { display: flex; gap: 1rem; align-items: baseline; flex-wrap: wrap; }
h1 { font-size: 1.4rem; margin: 0; }
h2 { font-size: 1.15rem; margin-top: 2rem; }
.muted { color: #666; }
.flash { background: #eef6ee; border: 1px solid #9c9; padding: .5rem .75rem; margin: .5rem 0; }
.error { background: #fbeeee; border-color: #c99; }
.held { border: 1px solid #ccc; border-radius: 6px; padding: .75rem 1rem; margin: 1rem 0; }
.held h3 { margin: 0 0 .5rem 0; font-size: 1.05rem; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; margin: .5rem 0; }
dt { color: #555; }
dd { margin: 0; }
pre { background: #f6f6f6; padding: .5rem; overflow: auto; max-height: 24rem; white-space: pre-wrap; }
.answers { display: flex; gap: 1.5rem; flex-wrap: wrap; align-items: end; }
.answers form { display: flex; gap: .5rem; align-items: end; }
input[type=text], input[type=password] { padding: .3rem; min-width: 16rem; }
button { padding: .35rem .9rem; cursor: pointer; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: .25rem .5rem; border-bottom: 1px solid #e3e3e3; vertical-align: top; }
code { font-size: .9em; }
.nowrap { white-space: nowrap; }
"""
# Allows exactly the stylesheet above, and nothing else inline.
STYLE_HASH: Final = "sha256-" + base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
CONTENT_SECURITY_POLICY: Final = (
    f"default-src 'none'; style-src '{STYLE_HASH}'; form-action 'self'; frame-ancestors 'none';"
    " base-uri 'none'"
)

_LAYOUT = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{% block title %}agentwake{% endblock %}</title>
<style>@STYLE@</style>
</head>
<body>
{% block body %}{% endblock %}
</body>
</html>
"""

_LOGIN = """{% extends "layout.html" %}
{% block title %}agentwake: log in{% endblock %}
{% block body %}
<h1>agentwake</h1>
<p>This page needs the access token (the environment variable <code>{{ token_env }}</code> of the service).</p>
{% if error %}<p class="flash error" role="alert">{{ error }}</p>{% endif %}
<form method="post" action="/login">
  <label>Access token <input type="password" name="token" autocomplete="current-password" autofocus></label>
  <button type="submit">Log in</button>
</form>
{% endblock %}
"""

_INDEX = """{% extends "layout.html" %}
{% block title %}agentwake: approvals ({{ held_total }}){% endblock %}
{% block body %}
<header>
  <h1>agentwake</h1>
  <span class="muted">{{ health }}</span>
  {% if logout %}
  <form method="post" action="/logout">
    <input type="hidden" name="csrf" value="{{ csrf }}">
    <button type="submit">Log out</button>
  </form>
  {% endif %}
</header>
{% for message in flash %}<p class="flash" role="status">{{ message }}</p>{% endfor %}
<p class="muted">Servers:
{% for name, state in servers.items() %}<code>{{ name }}</code> {{ state }}{% if not loop.last %}; {% endif %}{% endfor %}
</p>

<h2 id="held">Held for approval ({{ held_total }})</h2>
{% if not held %}<p class="muted">No event is waiting for approval.</p>{% endif %}
{% if held_total > held | length %}
<p class="muted">The oldest {{ held | length }} are shown; <code>agentwake approvals</code> lists them all.</p>
{% endif %}
{% for e in held %}
<section class="held" aria-label="held {{ e.event_id }}">
  <h3><code>{{ e.event_id }}</code> {{ e.event }}</h3>
  <dl>
    <dt>server, subscription</dt><dd>{{ e.server }}, {{ e.subscription }}</dd>
    <dt>received</dt><dd>{{ e.received_at }}</dd>
    <dt>held by rule</dt><dd><code>{{ e.rule }}</code>: {{ e.why }}</dd>
    <dt>injection score</dt><dd>{{ e.injection_score }}{% if e.signals %} ({{ e.signals | join(", ") }}){% endif %}</dd>
    <dt>tools if approved</dt>
    <dd>{% for tool in e.tools %}<code>{{ tool }}</code>{% if not loop.last %}, {% endif %}{% else %}none{% endfor %}</dd>
    {% if e.notes %}<dt>sanitized</dt><dd>{{ e.notes | join("; ") }}</dd>{% endif %}
  </dl>
  {% if e.authority is not none %}
  <h4>If approved, the agent may:</h4>
  <ul aria-label="authority {{ e.event_id }}">{% for line in e.authority %}<li><code>{{ line }}</code></li>{% endfor %}</ul>
  {% endif %}
  <pre>{{ e.data }}</pre>
  {% if can_approve %}
  <div class="answers">
    <form method="post" action="/approvals/{{ e.row }}/approve" aria-label="approve {{ e.event_id }}">
      <input type="hidden" name="csrf" value="{{ csrf }}">
      <label>Note <input type="text" name="note" maxlength="{{ note_chars }}"></label>
      <button type="submit">Approve</button>
    </form>
    <form method="post" action="/approvals/{{ e.row }}/deny" aria-label="deny {{ e.event_id }}">
      <input type="hidden" name="csrf" value="{{ csrf }}">
      <label>Reason <input type="text" name="reason" maxlength="{{ note_chars }}"></label>
      <button type="submit">Deny</button>
    </form>
  </div>
  {% else %}
  <p class="muted">The token {{ who }} cannot approve or deny (it has no approve scope).</p>
  {% endif %}
</section>
{% endfor %}

<h2 id="answers">Recent answers</h2>
{% if not answers %}<p class="muted">No held event answered yet.</p>{% else %}
<table aria-label="answers">
<thead><tr><th>when</th><th>event</th><th>answer</th><th>who</th><th>via</th><th>from</th><th>rule</th>
<th>tools granted</th><th>note</th></tr></thead>
<tbody>
{% for a in answers %}
<tr><td class="nowrap">{{ a.at }}</td><td class="nowrap"><code>{{ a.event_id }}</code></td><td>{{ a.answer }}</td>
<td><code>{{ a.who }}</code></td><td>{{ a.via }}</td><td>{{ a.address or "" }}</td><td>{{ a.rule or "" }}</td>
<td>{{ a.tools | join(", ") }}{% if a.authority %}<br>{{ a.authority | join("; ") }}{% endif %}</td><td>{{ a.note or "" }}</td></tr>
{% endfor %}
</tbody>
</table>
{% endif %}

<h2 id="runs">Recent runs</h2>
{% if not runs %}<p class="muted">No run yet.</p>{% else %}
<table aria-label="runs">
<thead><tr><th>run</th><th>event</th><th>subscription</th><th>kind</th><th>status</th><th>model</th>
<th>tools called</th><th>started</th><th>ms</th><th>summary</th></tr></thead>
<tbody>
{% for r in runs %}
<tr><td>{{ r.run_id }}</td><td class="nowrap"><code>{{ r.event_id }}</code></td><td>{{ r.subscription }}</td><td>{{ r.kind }}</td>
<td>{{ r.status }}{% if r.reason %}: {{ r.reason }}{% endif %}</td><td>{{ r.model }}</td>
<td>{{ r.tools | join(", ") }}{% if r.refused %} ({{ r.refused }} refused){% endif %}</td>
<td class="nowrap">{{ r.started_at }}</td><td>{{ r.duration_ms }}</td><td>{{ r.summary }}</td></tr>
{% endfor %}
</tbody>
</table>
{% endif %}

<h2 id="events">Recent events</h2>
{% if not events %}<p class="muted">No event stored yet.</p>{% else %}
<table aria-label="events">
<thead><tr><th>event</th><th>name</th><th>subscription</th><th>received</th><th>state</th><th>data</th></tr></thead>
<tbody>
{% for e in events %}
<tr><td class="nowrap"><code>{{ e.event_id }}</code></td><td>{{ e.event }}</td><td>{{ e.subscription }}</td>
<td class="nowrap">{{ e.received_at }}</td>
<td>{{ e.state }}{% if e.last_error %}: {{ e.last_error }}{% endif %}</td><td><code>{{ e.preview }}</code></td></tr>
{% endfor %}
</tbody>
</table>
{% endif %}
{% endblock %}
"""

# The stylesheet goes into the template's source as is (not a value, so not escaped): STYLE_HASH must match it.
TEMPLATES: Final = Environment(
    loader=DictLoader(
        {"layout.html": _LAYOUT.replace("@STYLE@", STYLE), "login.html": _LOGIN, "index.html": _INDEX}
    ),
    autoescape=select_autoescape(default=True, default_for_string=True),
)


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
    return {
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


__all__ = [
    "CONTENT_SECURITY_POLICY",
    "TEMPLATES",
    "HeldEvent",
    "answer_shown",
    "authority_lines",
    "granted_tools",
    "held_event",
    "recent_event",
    "recent_run",
    "shown",
]
