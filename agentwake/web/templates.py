"""The operator pages' Jinja2 templates: the layout, the login form, the main page (held events with
their answers, pauses, limits, recent answers, runs and events), the events and runs lists, and the
pages of one event and one run. Autoescape is on for all of them: peer text is always shown as text.
"""

from __future__ import annotations

from typing import Final

from jinja2 import DictLoader, Environment, select_autoescape

from agentwake.web.style import SCRIPT, STYLE

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
{% if live_ms %}<script>@SCRIPT@</script>{% endif %}
</body>
</html>
"""

_MACROS = """
{% macro nav(who, logout, csrf) -%}
<header>
  <h1><a href="/">agentwake</a></h1>
  <nav aria-label="pages"><a href="/">approvals</a> <a href="/events">events</a> <a href="/runs">runs</a>
  <a href="/events?state=held">held</a></nav>
  {% if logout %}
  <form method="post" action="/logout">
    <input type="hidden" name="csrf" value="{{ csrf }}">
    <button type="submit">Log out</button>
  </form>
  {% endif %}
</header>
{%- endmacro %}

{% macro pager(page) -%}
<div class="pager" aria-label="pages">
  <span class="muted">{{ page.total }} in all; page {{ page.number }} of {{ page.pages }}</span>
  {% if page.prev %}<a rel="prev" href="{{ page.prev }}">&larr; newer</a>{% endif %}
  {% if page.next %}<a rel="next" href="{{ page.next }}">older &rarr;</a>{% endif %}
</div>
{%- endmacro %}

{% macro run_block(r, open=False) -%}
<section class="card" aria-label="run {{ r.run_id }}" id="run-{{ r.run_id }}">
  <h3><a href="/runs/{{ r.run_id }}">run {{ r.run_id }}</a>: {{ r.kind }}, {{ r.status }}{% if r.reason %} ({{ r.reason }}){% endif %}</h3>
  <dl>
    <dt>attempt</dt><dd>{{ r.attempt }}</dd>
    <dt>model</dt><dd>{{ r.model }}</dd>
    <dt>started, finished</dt><dd>{{ r.started_at }}, {{ r.finished_at or "not yet" }}{% if r.duration_ms is not none %} ({{ r.duration_ms }} ms){% endif %}</dd>
    <dt>steps, tokens, cost</dt><dd>{{ r.steps }}, {{ r.prompt_tokens }}{% if r.cached_tokens %} ({{ r.cached_tokens }} cached){% endif %} + {{ r.completion_tokens }}, {{ r.cost }}</dd>
    {% if r.rule %}<dt>rule</dt><dd><code>{{ r.rule }}</code></dd>{% endif %}
    {% if r.summary %}<dt>answer</dt><dd>{{ r.summary }}</dd>{% endif %}
  </dl>
  <h4>Tool calls ({{ r.tool_calls | length }})</h4>
  {% if not r.tool_calls %}<p class="muted">None.</p>{% else %}
  <div class="scroll"><table aria-label="tool calls of run {{ r.run_id }}">
  <thead><tr><th>step</th><th>tool</th><th>status</th><th>ms</th><th>arguments</th><th>result</th></tr></thead>
  <tbody>
  {% for c in r.tool_calls %}
  <tr><td>{{ c.step }}</td><td><code>{{ c.tool }}</code></td><td>{{ c.status }}</td><td>{{ c.duration_ms if c.duration_ms is not none else "" }}</td>
  <td><pre>{{ c.arguments }}</pre></td><td><pre>{{ c.result }}</pre></td></tr>
  {% endfor %}
  </tbody></table></div>
  {% endif %}
  <details{% if open %} open{% endif %}>
  <summary>Transcript ({{ r.messages | length }} messages)</summary>
  {% if r.system_prompt %}<div class="message"><strong>system prompt</strong><pre>{{ r.system_prompt }}</pre></div>{% endif %}
  {% for m in r.messages %}
  <div class="message"><strong>{{ m.role }}</strong>{% if m.name %} <code>{{ m.name }}</code>{% endif %}
  {% if m.content %}<pre>{{ m.content }}</pre>{% endif %}
  {% for call in m.calls %}<pre>&rarr; {{ call }}</pre>{% endfor %}</div>
  {% endfor %}
  </details>
</section>
{%- endmacro %}
"""

_LOGIN = """{% extends "layout.html" %}
{% block title %}agentwake: log in{% endblock %}
{% block body %}
<h1>agentwake</h1>
<p>This page needs the access token (the environment variable <code>{{ token_env }}</code> of the service).</p>
{% if error %}<p class="flash error" role="alert">{{ error }}</p>{% endif %}
<form method="post" action="/login" class="row">
  <label class="grow">Access token <input type="password" name="token" autocomplete="current-password" autofocus></label>
  <button type="submit">Log in</button>
</form>
{% endblock %}
"""

_INDEX = """{% extends "layout.html" %}
{% import "macros.html" as m %}
{% block title %}agentwake: approvals ({{ held_total }}){% endblock %}
{% block body %}
{{ m.nav(who, logout, csrf) }}
<p class="muted"><span>{{ health }}</span>.
Servers: {% for name, state in servers.items() %}<code>{{ name }}</code> {{ state }}{% if not loop.last %}; {% endif %}{% endfor %}.
<span id="refreshed" data-every-ms="{{ live_ms }}" data-count="0" aria-live="off"></span></p>
{% for message in flash %}<p class="flash" role="status">{{ message }}</p>{% endfor %}

<section id="held-section" data-live aria-label="held events">
<h2 id="held">Held for approval ({{ held_total }})</h2>
{% if not held %}<p class="muted">No event is waiting for approval.</p>{% endif %}
{% if held_total > held | length %}
<p class="muted">The newest {{ held | length }} are shown; <a href="/events?state=held">all held events</a>,
or <code>agentwake approvals</code>.</p>
{% endif %}
{% if held and can_approve %}
<form id="bulk" class="bulk" method="post" action="/approvals/bulk" aria-label="answer the ticked events">
  <input type="hidden" name="csrf" value="{{ csrf }}">
  <div class="answers">
    <label>Note or reason, for every ticked event
      <textarea name="note" rows="1" maxlength="{{ note_chars }}"></textarea></label>
    <div class="row">
      <button type="submit" name="answer" value="approve">Approve ticked</button>
      <button type="submit" name="answer" value="deny">Deny ticked</button>
    </div>
  </div>
</form>
{% endif %}
<div class="cards">
{% for e in held %}
<section class="card held" aria-label="held {{ e.event_id }}">
  <h3>{% if can_approve %}<label class="check"><input type="checkbox" name="row" value="{{ e.row }}" form="bulk"
    aria-label="tick {{ e.event_id }}">{% endif %}
    <a href="/events/{{ e.row }}"><code>{{ e.event_id }}</code></a> {{ e.event }}{% if can_approve %}</label>{% endif %}</h3>
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
  <details{% if held | length <= 3 %} open{% endif %}><summary>Data</summary><pre>{{ e.data }}</pre></details>
  {% if can_approve %}
  <div class="answers">
    <form method="post" action="/approvals/{{ e.row }}/approve" aria-label="approve {{ e.event_id }}">
      <input type="hidden" name="csrf" value="{{ csrf }}">
      <label>Note <textarea name="note" rows="1" maxlength="{{ note_chars }}"></textarea></label>
      <button type="submit">Approve</button>
    </form>
    <form method="post" action="/approvals/{{ e.row }}/deny" aria-label="deny {{ e.event_id }}">
      <input type="hidden" name="csrf" value="{{ csrf }}">
      <label>Reason <textarea name="reason" rows="1" maxlength="{{ note_chars }}"></textarea></label>
      <button type="submit">Deny</button>
    </form>
  </div>
  {% else %}
  <p class="muted">The token {{ who }} cannot approve or deny (it has no approve scope).</p>
  {% endif %}
</section>
{% endfor %}
</div>
</section>

{% include "controls.html" %}

<section id="answers-section" data-live aria-label="recent answers">
<h2 id="answers">Recent answers</h2>
{% if not answers %}<p class="muted">No held event answered yet.</p>{% else %}
<div class="scroll"><table aria-label="answers">
<thead><tr><th>when</th><th>event</th><th>answer</th><th>who</th><th>via</th><th>from</th><th>rule</th>
<th>tools granted</th><th>note</th></tr></thead>
<tbody>
{% for a in answers %}
<tr><td class="nowrap">{{ a.at }}</td><td><a href="/events/{{ a.row }}"><code>{{ a.event_id }}</code></a></td><td>{{ a.answer }}</td>
<td><code>{{ a.who }}</code></td><td>{{ a.via }}</td><td>{{ a.address or "" }}</td><td>{{ a.rule or "" }}</td>
<td>{{ a.tools | join(", ") }}{% if a.authority %}<br>{{ a.authority | join("; ") }}{% endif %}</td><td>{{ a.note or "" }}</td></tr>
{% endfor %}
</tbody>
</table></div>
{% endif %}
</section>

<section id="runs-section" data-live aria-label="recent runs">
<h2 id="runs">Recent runs</h2>
{% if not runs %}<p class="muted">No run yet.</p>{% else %}
{% include "runs_table.html" %}
<p><a href="/runs">All runs</a></p>
{% endif %}
</section>

<section id="events-section" data-live aria-label="recent events">
<h2 id="events">Recent events</h2>
{% if not events %}<p class="muted">No event stored yet.</p>{% else %}
{% include "events_table.html" %}
<p><a href="/events">All events</a></p>
{% endif %}
</section>
{% endblock %}
"""

_CONTROLS = """
<section id="pauses-section" data-live aria-label="pauses">
<h2 id="pauses">Paused ({{ pauses | length }})</h2>
{% if not pauses %}<p class="muted">Nothing is paused: runs start as events arrive.</p>{% else %}
<div class="scroll"><table aria-label="paused">
<thead><tr><th>what</th><th>by</th><th>since</th><th>why</th><th>runs cut short</th>{% if can_operate %}<th></th>{% endif %}</tr></thead>
<tbody>
{% for p in pauses %}
<tr><td>{{ p.what }}</td><td><code>{{ p.by }}</code></td><td class="nowrap">{{ p.at }}</td><td>{{ p.reason or "" }}</td>
<td>{{ "yes" if p.cut_short else "no" }}</td>
{% if can_operate %}<td><form method="post" action="/pauses/resume" aria-label="resume {{ p.what }}">
  <input type="hidden" name="csrf" value="{{ csrf }}"><input type="hidden" name="scope" value="{{ p.scope }}">
  <input type="hidden" name="name" value="{{ p.name }}"><button type="submit">Resume</button></form></td>{% endif %}</tr>
{% endfor %}
</tbody></table></div>
{% endif %}
</section>
{% if can_operate %}
<details class="bulk"><summary>Pause</summary>
<form method="post" action="/pauses" aria-label="pause" class="row">
  <input type="hidden" name="csrf" value="{{ csrf }}">
  <label>What <select name="scope">
    <option value="all">everything</option><option value="server">a server</option>
    <option value="subscription">a subscription</option><option value="rule">a rule</option></select></label>
  <label class="grow">Name (server, subscription or rule) <input type="text" name="name" maxlength="200"
    list="pause-names"></label>
  <datalist id="pause-names">{% for n in pause_names %}<option value="{{ n }}">{% endfor %}</datalist>
  <label class="grow">Why <input type="text" name="reason" maxlength="500"></label>
  <label class="check"><input type="checkbox" name="now" value="1"> stop its runs now</label>
  <button type="submit">Pause</button>
</form>
</details>
{% endif %}

<section id="limits-section" data-live aria-label="limits">
<h2 id="limits">Limits</h2>
<div class="scroll"><table aria-label="limits">
<thead><tr><th>limit</th><th>set to</th><th>in use</th></tr></thead>
<tbody>
{% for l in limits %}
<tr><td><code>{{ l.name }}</code></td><td>{{ l.limit if l.limit is not none else "none" }}</td><td>{{ l.used }}</td></tr>
{% endfor %}
</tbody></table></div>
</section>
"""

_RUNS_TABLE = """<div class="scroll"><table aria-label="runs">
<thead><tr><th>run</th><th>event</th><th>subscription</th><th>kind</th><th>status</th><th>model</th>
<th>tools called</th><th>started</th><th>ms</th><th>summary</th></tr></thead>
<tbody>
{% for r in runs %}
<tr><td><a href="/runs/{{ r.run_id }}">{{ r.run_id }}</a></td>
<td>{% if r.event_row %}<a href="/events/{{ r.event_row }}"><code>{{ r.event_id }}</code></a>{% else %}<code>{{ r.event_id }}</code>{% endif %}</td>
<td>{{ r.subscription }}</td><td>{{ r.kind }}</td>
<td>{{ r.status }}{% if r.reason %}: {{ r.reason }}{% endif %}</td><td>{{ r.model }}</td>
<td>{{ r.tools | join(", ") }}{% if r.refused %} ({{ r.refused }} refused){% endif %}</td>
<td class="nowrap">{{ r.started_at }}</td><td>{{ r.duration_ms if r.duration_ms is not none else "" }}</td><td>{{ r.summary }}</td></tr>
{% endfor %}
</tbody>
</table></div>
"""

_EVENTS_TABLE = """<div class="scroll"><table aria-label="events">
<thead><tr><th>event</th><th>name</th><th>server, subscription</th><th>received</th><th>state</th><th>rule</th><th>data</th></tr></thead>
<tbody>
{% for e in events %}
<tr><td><a href="/events/{{ e.row }}"><code>{{ e.event_id }}</code></a></td><td>{{ e.event }}</td>
<td>{{ e.server }}, {{ e.subscription }}</td><td class="nowrap">{{ e.received_at }}</td>
<td>{{ e.state }}{% if e.last_error %}: {{ e.last_error }}{% endif %}</td><td>{{ e.rule or "" }}</td><td><code>{{ e.preview }}</code></td></tr>
{% endfor %}
</tbody>
</table></div>
"""

_EVENTS = """{% extends "layout.html" %}
{% import "macros.html" as m %}
{% block title %}agentwake: events ({{ page.total }}){% endblock %}
{% block body %}
{{ m.nav(who, logout, csrf) }}
<h2>Events</h2>
<form method="get" action="/events" class="row" aria-label="filter events">
  <label>State <select name="state"><option value="">any</option>
    {% for s in states %}<option value="{{ s }}"{% if filters.state == s %} selected{% endif %}>{{ s }}</option>{% endfor %}</select></label>
  <label class="grow">Server <input type="text" name="server" value="{{ filters.server or "" }}" list="servers"></label>
  <label class="grow">Subscription <input type="text" name="subscription" value="{{ filters.subscription or "" }}" list="subscriptions"></label>
  <label class="grow">Rule <input type="text" name="rule" value="{{ filters.rule or "" }}"></label>
  <datalist id="servers">{% for n in server_names %}<option value="{{ n }}">{% endfor %}</datalist>
  <datalist id="subscriptions">{% for n in subscription_names %}<option value="{{ n }}">{% endfor %}</datalist>
  <button type="submit">Show</button>
</form>
{{ m.pager(page) }}
{% if not events %}<p class="muted">No event matches.</p>{% else %}{% include "events_table.html" %}{% endif %}
{% endblock %}
"""

_RUNS = """{% extends "layout.html" %}
{% import "macros.html" as m %}
{% block title %}agentwake: runs ({{ page.total }}){% endblock %}
{% block body %}
{{ m.nav(who, logout, csrf) }}
<h2>Runs</h2>
<form method="get" action="/runs" class="row" aria-label="filter runs">
  <label>Status <select name="status"><option value="">any</option>
    {% for s in statuses %}<option value="{{ s }}"{% if filters.status == s %} selected{% endif %}>{{ s }}</option>{% endfor %}</select></label>
  <label class="grow">Server <input type="text" name="server" value="{{ filters.server or "" }}"></label>
  <label class="grow">Subscription <input type="text" name="subscription" value="{{ filters.subscription or "" }}"></label>
  <button type="submit">Show</button>
</form>
{{ m.pager(page) }}
{% if not runs %}<p class="muted">No run matches.</p>{% else %}{% include "runs_table.html" %}{% endif %}
{% endblock %}
"""

_EVENT = """{% extends "layout.html" %}
{% import "macros.html" as m %}
{% block title %}agentwake: event {{ e.event_id }}{% endblock %}
{% block body %}
{{ m.nav(who, logout, csrf) }}
<section class="card" aria-label="event {{ e.event_id }}">
<h2><code>{{ e.event_id }}</code> {{ e.event }}</h2>
<dl>
  <dt>server, subscription</dt><dd><a href="/events?server={{ e.server | urlencode }}">{{ e.server }}</a>,
    <a href="/events?subscription={{ e.subscription | urlencode }}">{{ e.subscription }}</a></dd>
  <dt>state</dt><dd>{{ e.state }}{% if e.last_error %}: {{ e.last_error }}{% endif %} ({{ e.attempts }} attempt(s))</dd>
  <dt>timestamp, received</dt><dd>{{ e.timestamp }}, {{ e.received_at }}</dd>
  <dt>injection score</dt><dd>{{ e.injection_score }}</dd>
  {% if e.notes %}<dt>sanitized</dt><dd>{{ e.notes | join("; ") }}</dd>{% endif %}
</dl>
<h3>Data</h3>
<pre aria-label="data">{{ e.data }}</pre>
</section>

<section class="card" aria-label="decision">
<h3>Decision</h3>
{% if e.decision is none %}<p class="muted">Not decided yet.</p>{% else %}
<dl>
  <dt>rule</dt><dd><a href="/events?rule={{ e.rule | urlencode }}"><code>{{ e.rule }}</code></a></dd>
  <dt>why</dt><dd>{{ e.why }}</dd>
  {% if e.tools is not none %}<dt>tools</dt><dd>{% for t in e.tools %}<code>{{ t }}</code>{% if not loop.last %}, {% endif %}{% else %}none{% endfor %}</dd>{% endif %}
</dl>
{% if e.authority is not none %}
<h4>If approved, the agent may:</h4>
<ul aria-label="authority">{% for line in e.authority %}<li><code>{{ line }}</code></li>{% endfor %}</ul>
{% endif %}
<details><summary>The whole decision</summary><pre>{{ e.decision }}</pre></details>
{% endif %}
</section>

<section class="card" aria-label="answers">
<h3>Approval</h3>
{% if not e.answers %}<p class="muted">{% if e.state == "held" %}Held: waiting for an answer (<a href="/#held">answer it</a>).{% else %}Not answered by a person.{% endif %}</p>{% else %}
<div class="scroll"><table aria-label="answers of this event">
<thead><tr><th>when</th><th>answer</th><th>who</th><th>via</th><th>from</th><th>rule</th><th>tools granted</th><th>note</th></tr></thead>
<tbody>{% for a in e.answers %}
<tr><td class="nowrap">{{ a.at }}</td><td>{{ a.answer }}</td><td><code>{{ a.who }}</code></td><td>{{ a.via }}</td>
<td>{{ a.address or "" }}</td><td>{{ a.rule or "" }}</td><td>{{ a.tools | join(", ") }}{% if a.authority %}<br>{{ a.authority | join("; ") }}{% endif %}</td><td>{{ a.note or "" }}</td></tr>
{% endfor %}</tbody></table></div>
{% endif %}
</section>

<h3>Runs ({{ e.runs | length }})</h3>
{% if not e.runs %}<p class="muted">No run yet.</p>{% endif %}
{% for r in e.runs %}{{ m.run_block(r) }}{% endfor %}
{% endblock %}
"""

_RUN = """{% extends "layout.html" %}
{% import "macros.html" as m %}
{% block title %}agentwake: run {{ r.run_id }}{% endblock %}
{% block body %}
{{ m.nav(who, logout, csrf) }}
<p>Run {{ r.run_id }} of event <a href="/events/{{ event_row }}"><code>{{ event_id }}</code></a> ({{ subscription }}).</p>
{{ m.run_block(r, open=True) }}
{% endblock %}
"""

# The stylesheet and script go into the layout's source as is (not values, so not escaped): their
# hashes in the Content-Security-Policy must match them byte for byte.
TEMPLATES: Final = Environment(
    loader=DictLoader(
        {
            "layout.html": _LAYOUT.replace("@STYLE@", STYLE).replace("@SCRIPT@", SCRIPT),
            "macros.html": _MACROS,
            "login.html": _LOGIN,
            "index.html": _INDEX,
            "controls.html": _CONTROLS,
            "runs_table.html": _RUNS_TABLE,
            "events_table.html": _EVENTS_TABLE,
            "events.html": _EVENTS,
            "runs.html": _RUNS,
            "event.html": _EVENT,
            "run.html": _RUN,
        }
    ),
    autoescape=select_autoescape(default=True, default_for_string=True),
)

__all__ = ["TEMPLATES"]
