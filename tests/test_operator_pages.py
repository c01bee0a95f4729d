"""The operator's lists and detail pages, pausing and resuming, the limits, bulk answers, and
sessions that outlive the endpoint, over HTTP.

In process: the real ``Endpoint`` on a loopback port over a real SQLite store holding held events
(tests/test_approvals_api.py), real aiohttp clients.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from test_approvals_api import SLACK_TOKEN, TOKEN, TOKENS_ENV, Held, held_endpoint
from test_operator_access import client_from, csrf_of, status_of

from agentwake.config import parse_config
from agentwake.store.records import RunProgress, ToolCallRecord
from agentwake.supervisor import Supervisor
from agentwake.web import Health, endpoint_settings
from agentwake.web.app import Endpoint

pytestmark = pytest.mark.anyio

OPERATOR = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"}
SLACK = {"Authorization": f"Bearer {SLACK_TOKEN}", "Accept": "application/json"}
HTML = {"Authorization": f"Bearer {TOKEN}", "Accept": "text/html"}
AUTHORITY = ["close_ticket: ticket = 'T-1' (pinned)"]
T_EPOCH = "2026-01-01T00:00:00.000Z"


async def get(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> tuple[int, Any]:
    async with http.get(url, headers=headers, allow_redirects=False) as response:
        if response.content_type == "application/json":
            return response.status, await response.json()
        return response.status, await response.text()


async def a_run(held: Held, row: int) -> int:
    """A finished agent run of ``row`` with one tool call, its transcript quoting peer markup."""
    run_id = await held.store.start_run(
        row,
        kind="agent",
        attempt=1,
        model="agentwake/offline",
        decision={"rule": "hold-suspicious"},
        system_prompt="You triage tickets.",
        user_prompt="ticket",
    )
    call = ToolCallRecord(
        1,
        "c1",
        "close_ticket",
        "demo",
        "close_ticket",
        {"ticket": "<b>T-1</b>"},
        "ok",
        "closed <i>it</i>",
        12,
    )
    messages = [
        {"role": "user", "content": "ticket <img src=x>"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "function": {"name": "close_ticket", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "closed"},
        {"role": "assistant", "content": "Closed the ticket <script>x</script>."},
    ]
    progress = RunProgress(messages, 2, 10, 5, 0.001)
    await held.store.record_progress(run_id, progress, [call])
    await held.store.finish_run(
        run_id, status="completed", reason=None, progress=progress, duration_ms=40, verdict=None
    )
    return run_id


# ---- lists: filtered, paged, clear 400s -----------------------------------------------------------


async def test_the_events_list_is_filtered_and_paged_and_refuses_bad_filters_with_400(tmp_path: Path) -> None:
    async with held_endpoint(tmp_path, count=3) as held, aiohttp.ClientSession() as http:
        status, body = await get(http, f"{held.url}/events?state=held", OPERATOR)
        assert status == 200 and body["total"] == 3 and body["pages"] == 1
        assert [e["event_id"] for e in body["events"]] == ["T-3", "T-2", "T-1"]  # newest first
        assert all(e["rule"] == "hold-suspicious" for e in body["events"])
        for query in ("server=demo", "subscription=tickets", "rule=hold-suspicious", "state=held&page=1"):
            status, body = await get(http, f"{held.url}/events?{query}", OPERATOR)
            assert status == 200 and body["total"] == 3, query
        for query in ("server=nope", "rule=other", "state=done", "state=held&page=2"):
            status, body = await get(http, f"{held.url}/events?{query}", OPERATOR)
            assert status == 200 and body["events"] == [], query
        for query, said in (
            ("state=bogus", "unknown state"),
            ("page=0", "page must be"),
            ("page=abc", "page must be"),
            ("page=99999999999999999999", "page must be"),
            ("colour=red", "unknown parameter"),
            ("state=held&state=done", "more than once"),
            ("server=" + "x" * 300, "at most"),
            ("server=a%00b", "printable"),
        ):
            status, body = await get(http, f"{held.url}/events?{query}", OPERATOR)
            assert status == 400 and said in body["error"], (query, body)
        status, text = await get(http, f"{held.url}/events?state=bogus", HTML)
        assert status == 400 and "unknown state" in text
        status, text = await get(http, f"{held.url}/events?state=held", HTML)
        assert status == 200 and 'href="/events/1"' in text and "3 in all; page 1 of 1" in text
        # Markup in the data is text on the page.
        assert "&lt;@U0BOSS&gt;" in text and "<@U0BOSS>" not in text
        status, body = await get(http, f"{held.url}/runs?status=nope", OPERATOR)
        assert status == 400 and "unknown status" in body["error"]
        # Without the read scope, no list.
        status, _ = await get(http, f"{held.url}/events", {"Accept": "application/json"})
        assert status == 401


async def test_paging_walks_the_list_newest_first(tmp_path: Path) -> None:
    async with held_endpoint(tmp_path, count=55) as held, aiohttp.ClientSession() as http:
        status, first = await get(http, f"{held.url}/events?state=held", OPERATOR)
        assert status == 200 and first["total"] == 55 and first["pages"] == 2 and len(first["events"]) == 50
        assert first["next"] == "/events?state=held&page=2" and first["prev"] is None
        status, second = await get(http, f"{held.url}{first['next']}", OPERATOR)
        assert [e["event_id"] for e in second["events"]] == ["T-5", "T-4", "T-3", "T-2", "T-1"]
        assert second["prev"] == "/events?state=held&page=1" and second["next"] is None


# ---- the pages of one event and one run ------------------------------------------------------------


async def test_an_events_page_shows_data_decision_approval_and_every_run_as_text(tmp_path: Path) -> None:
    decision = {
        "rule": "hold-suspicious",
        "rule_tools": ["close_ticket"],
        "why": "looks <b>injected</b>",
        "authority": AUTHORITY,
    }
    async with held_endpoint(tmp_path, decision=decision) as held, aiohttp.ClientSession() as http:
        row = held.rows[0]
        async with http.post(
            f"{held.url}/approvals/{row}/approve", data={"note": "ok <u>fine</u>"}, headers=OPERATOR
        ) as r:
            assert r.status == 200
        run_id = await a_run(held, row)
        status, text = await get(http, f"{held.url}/events/{row}", HTML)
        assert status == 200
        for expected in (
            "&lt;@U0BOSS&gt; &amp; &lt;!channel&gt;",  # the data, as text
            "hold-suspicious",
            "looks &lt;b&gt;injected&lt;/b&gt;",
            "If approved, the agent may:",
            "close_ticket: ticket = &#39;T-1&#39; (pinned)",
            "ok &lt;u&gt;fine&lt;/u&gt;",  # the approval's note
            "bearer token operator",
            f'href="/runs/{run_id}"',
            "closed &lt;i&gt;it&lt;/i&gt;",  # the tool call's result
            "ticket &lt;img src=x&gt;",  # the transcript
            "Closed the ticket &lt;script&gt;x&lt;/script&gt;.",
            "You triage tickets.",
        ):
            assert expected in text, expected
        assert "<script>x" not in text and "<img" not in text and "<b>" not in text
        status, text = await get(http, f"{held.url}/runs/{run_id}", HTML)
        assert status == 200 and f'href="/events/{row}"' in text and "close_ticket" in text
        status, body = await get(http, f"{held.url}/runs/{run_id}", OPERATOR)
        assert body["event_row"] == row and body["run"]["tool_calls"][0]["status"] == "ok"
        # The lists link to both.
        status, text = await get(http, f"{held.url}/runs", HTML)
        assert f'href="/runs/{run_id}"' in text and f'href="/events/{row}"' in text
        status, text = await get(http, f"{held.url}/", HTML)
        assert f'href="/runs/{run_id}"' in text and f'href="/events/{row}"' in text
        for missing in ("/events/999", "/runs/999", "/events/99999999999999999999"):
            status, body = await get(http, f"{held.url}{missing}", OPERATOR)
            assert status == 404, missing


# ---- bulk answers -----------------------------------------------------------------------------------


async def test_ticked_events_are_answered_at_once_each_with_its_audit_record(tmp_path: Path) -> None:
    async with held_endpoint(tmp_path, count=3) as held, client_from("127.0.0.1") as browser:
        assert await status_of(browser, "POST", f"{held.url}/login", data={"token": TOKEN}) == 303
        async with browser.get(f"{held.url}/") as response:
            page = await response.text()
        assert page.count('type="checkbox" name="row"') == 3
        ticked = [
            ("row", str(held.rows[0])),
            ("row", str(held.rows[2])),
            ("answer", "deny"),
            ("note", "spam"),
        ]
        bulk = f"{held.url}/approvals/bulk"
        assert await status_of(browser, "POST", bulk, data=ticked) == 403  # no CSRF token
        assert await status_of(browser, "POST", bulk, data=[*ticked, ("csrf", csrf_of(page))]) == 303
        async with browser.get(f"{held.url}/") as response:
            page = await response.text()
        assert "denied 2 of 2: denied T-1: spam; denied T-3: spam" in page
        for row in (held.rows[0], held.rows[2]):
            detail = await held.detail(row)
            assert detail["state"] == "denied"
            [answer] = detail["answers"]
            assert (answer["who"], answer["via"], answer["note"]) == (
                "operator",
                "browser session operator",
                "spam",
            )
        assert (await held.detail(held.rows[1]))["state"] == "held"
        # A bearer token: JSON, one result per row; a row not held is a 409 of its own.
        async with aiohttp.ClientSession() as http:
            data = [("row", str(held.rows[1])), ("row", str(held.rows[0])), ("answer", "approve")]
            async with http.post(bulk, data=data, headers=SLACK) as response:
                body = await response.json()
            assert response.status == 200 and not body["ok"]
            assert [r["ok"] for r in body["results"]] == [True, False]
            for bad in (
                [("answer", "approve")],
                [("row", "x"), ("answer", "deny")],
                [("row", "1"), ("answer", "maybe")],
            ):
                async with http.post(bulk, data=bad, headers=OPERATOR) as response:
                    assert response.status == 400, bad


# ---- pausing and resuming -------------------------------------------------------------------------


async def test_pause_and_resume_over_the_api_record_who_and_why(tmp_path: Path) -> None:
    async with held_endpoint(tmp_path) as held, aiohttp.ClientSession() as http:
        url = f"{held.url}/pauses"
        async with http.post(
            url,
            json={"scope": "subscription", "name": "tickets", "reason": "noisy", "now": True},
            headers=OPERATOR,
        ) as r:
            body = await r.json()
        assert r.status == 200 and body["pause"]["by"] == "operator" and body["pause"]["cut_short"] is True
        # The Slack bridge relays who asked.
        data = {"scope": "all", "reason": "incident", "on_behalf_of": "slack:U0123ABCD"}
        async with http.post(url, data=data, headers=SLACK) as r:
            assert r.status == 200
        status, body = await get(http, url, OPERATOR)
        assert {(p["scope"], p["name"], p["by"], p["reason"]) for p in body["paused"]} == {
            ("subscription", "tickets", "operator", "noisy"),
            ("all", "", "slack:U0123ABCD", "incident"),
        }
        # Both in the store (made within the same millisecond, their order is the scope's).
        assert {(p.scope, p.by) for p in await held.store.pauses()} == {
            ("subscription", "operator"),
            ("all", "slack:U0123ABCD"),
        }
        status, text = await get(http, f"{held.url}/", HTML)
        assert (
            status == 200
            and "subscription tickets" in text
            and "slack:U0123ABCD" in text
            and "incident" in text
        )
        for bad, said in (
            ({"scope": "server", "name": "nope"}, "no server named"),
            ({"scope": "galaxy"}, "unknown scope"),
            ({"scope": "server"}, "needs its name"),
            ({"scope": "all", "reason": "x" * 600}, "at most"),
        ):
            async with http.post(url, json=bad, headers=OPERATOR) as r:
                body = await r.json()
            assert r.status == 400 and said in body["message"], (bad, body)
        async with http.post(
            url, json={"scope": "all"}, headers={"Authorization": f"Bearer {TOKENS_ENV['AW_METRICS_TOKEN']}"}
        ) as r:
            assert r.status == 403
        async with http.delete(f"{url}?scope=all", headers=OPERATOR) as r:
            assert r.status == 200 and (await r.json())["pause"]["by"] == "slack:U0123ABCD"
        async with http.post(
            f"{url}/resume", data={"scope": "subscription", "name": "tickets"}, headers=OPERATOR
        ) as r:
            assert r.status == 200
        async with http.post(f"{url}/resume", data={"scope": "all"}, headers=OPERATOR) as r:
            assert r.status == 404
        assert await held.store.pauses() == []


async def test_the_page_pauses_only_with_its_csrf_token(tmp_path: Path) -> None:
    async with held_endpoint(tmp_path) as held, client_from("127.0.0.1") as browser:
        assert await status_of(browser, "POST", f"{held.url}/login", data={"token": TOKEN}) == 303
        async with browser.get(f"{held.url}/") as response:
            csrf = csrf_of(await response.text())
        form = {"scope": "server", "name": "demo", "reason": "upgrade"}
        assert await status_of(browser, "POST", f"{held.url}/pauses", data=form) == 403
        assert await status_of(browser, "DELETE", f"{held.url}/pauses?scope=all") == 403
        assert await status_of(browser, "POST", f"{held.url}/pauses", data={**form, "csrf": csrf}) == 303
        [paused] = await held.store.pauses()
        assert (paused.scope, paused.name, paused.by, paused.reason) == (
            "server",
            "demo",
            "operator",
            "upgrade",
        )
        async with browser.get(f"{held.url}/") as response:
            page = await response.text()
        assert (
            "paused server demo" in page and "upgrade" in page and 'aria-label="resume server demo"' in page
        )
        resume = {"scope": "server", "name": "demo", "csrf": csrf}
        assert await status_of(browser, "POST", f"{held.url}/pauses/resume", data=resume) == 303
        assert await held.store.pauses() == []


# ---- limits --------------------------------------------------------------------------------------------


async def test_the_limits_are_shown_with_their_use(tmp_path: Path) -> None:
    async with held_endpoint(tmp_path) as held, aiohttp.ClientSession() as http:
        await a_run(held, held.rows[0])
        status, body = await get(http, f"{held.url}/limits", OPERATOR)
        assert status == 200
        named = {row["name"]: row for row in body["limits"]}
        assert named["[agent] max_runs_per_hour"]["used"] == 1
        assert named["[agent] max_cost_per_day_usd"]["used"] == pytest.approx(0.001)
        assert named["[agent] concurrency"]["used"] == 0
        status, text = await get(http, f"{held.url}/", HTML)
        assert "max_runs_per_hour" in text and 'aria-label="limits"' in text


# ---- sessions outlive the endpoint ------------------------------------------------------------------


def endpoint_on(held: Held, tmp_path: Path, env: dict[str, str]) -> Endpoint:
    """Another endpoint over the same store (a restarted service), with the tokens in ``env``."""
    config = parse_config(
        {
            "store": {"path": str(tmp_path / "aw.db")},
            "service": {
                "listen": "127.0.0.1:0",
                "token_env": "AW_APPROVALS_TOKEN",
                "session_ttl_s": 600,
                "session_idle_s": 300,
            },
        },
        env=env,
    )
    return Endpoint(
        endpoint_settings(config.service, env=env), held.store, Supervisor(config, held.store), Health(60)
    )


async def test_a_session_survives_a_restart_but_not_its_expiry_nor_a_rotated_token(tmp_path: Path) -> None:
    async with (
        held_endpoint(tmp_path, service={"session_ttl_s": 600, "session_idle_s": 300}) as held,
        client_from("127.0.0.1") as browser,
    ):
        assert await status_of(browser, "POST", f"{held.url}/login", data={"token": TOKEN}) == 303
        [cookie] = [c.value for c in browser.cookie_jar if c.key == "agentwake_session"]
        with closing(sqlite3.connect(held.store.path)) as conn:
            stored = conn.execute("SELECT * FROM operator_sessions").fetchall()
        assert len(stored) == 1 and not any(cookie in str(v) for v in stored[0])  # a hash, never the cookie
        for env, lives in ((TOKENS_ENV, True), ({"AW_APPROVALS_TOKEN": "tok-rotated-0123456789"}, False)):
            again = endpoint_on(held, tmp_path, env)
            async with anyio.create_task_group() as tg:
                await tg.start(again.serve)
                page = f"{again.url}/"
                headers = {"Cookie": f"agentwake_session={cookie}"}
                async with aiohttp.ClientSession() as fresh:
                    expected = 200 if lives else 401
                    assert await status_of(fresh, "GET", page, headers=headers) == expected
                    if lives:  # the session's CSRF token is the same after the restart
                        async with fresh.get(page, headers=headers) as response:
                            csrf = csrf_of(await response.text())
                        deny = f"{again.url}/approvals/{held.rows[0]}/deny"
                        assert (
                            await status_of(fresh, "POST", deny, headers=headers, data={"csrf": csrf}) == 303
                        )
                        # Past its lifetime, it ends.
                        again.sessions.clock = lambda: 10**10
                        assert await status_of(fresh, "GET", page, headers=headers) == 401
                tg.cancel_scope.cancel()
        assert (await held.detail(held.rows[0]))["state"] == "denied"
        with closing(sqlite3.connect(held.store.path)) as conn:
            assert conn.execute("SELECT count(*) FROM operator_sessions").fetchone()[0] == 0


# ---- the same store calls on PostgreSQL -----------------------------------------------------------


async def test_the_lists_and_sessions_answer_on_postgresql_as_on_sqlite(
    postgres_url: str, tmp_path: Path
) -> None:
    from test_approvals_api import HOLD_DECISION, KEY

    from agentwake.clock import now_iso
    from agentwake.store import IncomingEvent, Settlement
    from agentwake.store.browse import EventFilter, RunFilter
    from agentwake.store.postgres import PostgresStore
    from agentwake.store.sessions import StoredSession
    from agentwake.store.sqlite import SqliteStore

    async def answers(store: Any) -> list[Any]:
        await store.register(KEY)
        await store.ingest(
            KEY, [IncomingEvent(f"T-{n}", "ticket.created", now_iso(), {"n": n}) for n in (1, 2, 3)], "c1"
        )
        claimed = await store.claim(3)
        await store.settle(
            [
                Settlement(claimed[0].id, HOLD_DECISION, "held"),
                Settlement(claimed[1].id, {"rule": "log"}, "ignored"),
            ]
        )
        run_id = await store.start_run(
            claimed[2].id,
            kind="agent",
            attempt=1,
            model="m",
            decision={},
            system_prompt=None,
            user_prompt=None,
        )
        seen: list[Any] = []
        for filters in (
            EventFilter(),
            EventFilter(rule="hold-suspicious"),
            EventFilter(state="held", server="demo"),
        ):
            rows, total = await store.event_page(filters, 0, 2)
            seen.append(([r["event_id"] for r in rows], total))
        rows, total = await store.run_page(RunFilter(status="running"), 0, 10)
        seen.append(([r["event_id"] for r in rows], total, await store.run_event(run_id) == claimed[2].id))
        session = StoredSession(
            "h1",
            "operator",
            ("approve", "read"),
            "check",
            T_EPOCH,
            "2999-01-01T00:00:00.000Z",
            "2999-01-01T00:00:00.000Z",
        )
        expired = StoredSession("h0", None, ("read",), "", T_EPOCH, T_EPOCH, T_EPOCH)
        await store.session_save(expired, T_EPOCH)
        await store.session_save(session, "2100-01-01T00:00:00.000Z")  # the expired one goes
        await store.session_touch("h1", "2998-01-01T00:00:00.000Z")
        seen.append((await store.session_get("h0"), await store.session_get("h1")))
        await store.session_end("h1")
        seen.append(await store.session_get("h1"))
        return seen

    pg = await PostgresStore.open(postgres_url)
    try:
        on_postgres = await answers(pg)
    finally:
        await pg.close()
    lite = await SqliteStore.open(tmp_path / "aw.db")
    try:
        on_sqlite = await answers(lite)
    finally:
        await lite.close()
    assert on_postgres == on_sqlite
    assert (
        on_sqlite[0] == (["T-3", "T-2"], 3) and on_sqlite[1] == (["T-1"], 1) and on_sqlite[2] == (["T-1"], 1)
    )
    assert on_sqlite[3] == (["T-3"], 1, True)
    assert on_sqlite[4][0] is None and on_sqlite[4][1].idle_until == "2998-01-01T00:00:00.000Z"
    assert on_sqlite[5] is None
