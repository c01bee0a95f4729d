"""The operator endpoint against an attacker on loopback: throttling, sessions, malformed credentials,
TLS and a trusted proxy, scoped tokens, and the approvals' audit trail.

In process: the real ``Endpoint`` on a loopback port over a real SQLite store holding held events
(tests/test_approvals_api.py), real aiohttp clients (bound to other loopback addresses where the
client's address matters), raw sockets for bytes aiohttp would not send, and real TLS with
certificates made here by trustme.
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
import trustme
from test_approvals_api import METRICS_TOKEN, SLACK_TOKEN, TOKEN, Held, held_endpoint
from typer.testing import CliRunner

from agentwake.cli import app
from agentwake.web.access import LOGIN_FAILURES_ALLOWED

pytestmark = pytest.mark.anyio

OPERATOR = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"}
SLACK = {"Authorization": f"Bearer {SLACK_TOKEN}", "Accept": "application/json"}
PROMETHEUS = {"Authorization": f"Bearer {METRICS_TOKEN}"}
OPEN = {"token_env": None, "tokens": {}}
AUTHORITY = ["close_ticket: ticket = 'T-1' (pinned)", "close_ticket: reason = any text"]


def client_from(address: str, **kwargs: Any) -> aiohttp.ClientSession:
    """A client whose connections come from ``address`` (another loopback address: another client)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(local_addr=(address, 0), **kwargs),
        cookie_jar=aiohttp.CookieJar(unsafe=True),
    )


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, page
    return found.group(1)


async def status_of(http: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> int:
    async with http.request(method, url, allow_redirects=False, **kwargs) as response:
        await response.read()
        return response.status


async def raw_request(url: str, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` as is (bytes aiohttp would not send) and read the whole answer."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    async with await anyio.connect_tcp(host, int(port)) as stream:
        await stream.send(request)
        answer = b""
        with anyio.fail_after(10):
            while True:
                try:
                    answer += await stream.receive()
                except anyio.EndOfStream:
                    break
    status = int(answer.split(b" ", 2)[1])
    return status, answer


# ---- 1: wrong tokens are throttled per client, and never lock a right one out ----------------------


async def test_a_flood_of_wrong_tokens_never_locks_the_right_tokens_out(tmp_path: Path) -> None:
    async with held_endpoint(tmp_path) as held, client_from("127.0.0.1") as attacker:
        url = f"{held.url}/approvals"
        wrong = {"Authorization": "Bearer wrong-token-of-the-attacker", "Accept": "application/json"}
        statuses = [
            await status_of(attacker, "GET", url, headers=wrong) for _ in range(LOGIN_FAILURES_ALLOWED + 5)
        ]
        assert statuses == [401] * LOGIN_FAILURES_ALLOWED + [429] * 5
        assert await status_of(attacker, "POST", f"{held.url}/login", data={"token": "nope"}) == 429

        # From the same address, the right tokens still work: the operator, the Slack bridge, Prometheus.
        assert await status_of(attacker, "GET", url, headers=OPERATOR) == 200
        assert await status_of(attacker, "GET", url, headers=SLACK) == 200
        assert await status_of(attacker, "GET", f"{held.url}/metrics", headers=PROMETHEUS) == 200
        assert await status_of(attacker, "POST", f"{held.url}/login", data={"token": TOKEN}) == 303
        async with client_from("127.0.0.2") as other:
            # Another address's wrong token is counted apart from the attacker's.
            assert await status_of(other, "GET", url, headers=wrong) == 401


# ---- 2: no session per visit, and sessions end when unused -----------------------------------------


async def test_cookie_less_visits_make_no_session_and_cannot_push_the_operators_out(tmp_path: Path) -> None:
    async with held_endpoint(tmp_path) as held, client_from("127.0.0.1") as operator:
        assert await status_of(operator, "POST", f"{held.url}/login", data={"token": TOKEN}) == 303
        assert held.sessions() == 1
        async with aiohttp.ClientSession() as visitor:
            for n in range(600):
                path = ("/", "/approvals", "/login")[n % 3]
                assert await status_of(
                    visitor, "GET", f"{held.url}{path}", headers={"Accept": "text/html"}
                ) in (
                    200,
                    401,
                )
        assert held.sessions() == 1
        async with operator.get(f"{held.url}/", headers={"Accept": "text/html"}) as response:
            assert response.status == 200 and "Held for approval (1)" in await response.text()


async def test_an_open_endpoint_makes_a_session_only_to_carry_an_answers_message(tmp_path: Path) -> None:
    async with held_endpoint(tmp_path, 2, service=OPEN) as held, client_from("127.0.0.1") as operator:
        async with operator.get(f"{held.url}/") as response:
            csrf = csrf_of(await response.text())
        assert held.sessions() == 0  # the form token is signed, not stored
        deny = f"{held.url}/approvals/{held.rows[0]}/deny"
        assert await status_of(operator, "POST", deny, data={"reason": "spam", "csrf": "forged"}) == 403
        assert await status_of(operator, "POST", deny, data={"reason": "spam", "csrf": csrf}) == 303
        assert held.sessions() == 1  # made for the message on the next page
        async with aiohttp.ClientSession() as visitor:
            for _ in range(600):
                assert await status_of(visitor, "GET", f"{held.url}/") == 200
        assert held.sessions() == 1
        async with operator.get(f"{held.url}/") as response:
            page = await response.text()
        assert "denied T-1: spam" in page
        # The session's form token works from now on.
        approve = f"{held.url}/approvals/{held.rows[1]}/approve"
        assert await status_of(operator, "POST", approve, data={"csrf": csrf_of(page)}) == 303
        assert (await held.detail(held.rows[1]))["state"] == "pending"


async def test_a_session_ends_when_unused_for_session_idle_s(tmp_path: Path) -> None:
    async with (
        held_endpoint(tmp_path, service={"session_idle_s": 60, "session_ttl_s": 600}) as held,
        client_from("127.0.0.1") as browser,
    ):
        now = [anyio.current_time()]
        held.endpoint.sessions.clock = lambda: now[0]
        assert await status_of(browser, "POST", f"{held.url}/login", data={"token": TOKEN}) == 303
        page = f"{held.url}/"
        for _ in range(3):  # used every 50 s: alive past the idle time
            now[0] += 50
            assert await status_of(browser, "GET", page) == 200
        now[0] += 61
        assert await status_of(browser, "GET", page) == 401
        assert held.sessions() == 0


# ---- 3: malformed credentials are a 401 --------------------------------------------------------------


async def test_credentials_that_are_not_utf8_are_refused_with_401(tmp_path: Path) -> None:
    async with held_endpoint(tmp_path) as held:
        head = b"Host: 127.0.0.1\r\nConnection: close\r\nAccept: application/json\r\n"
        for path in (b"/approvals", b"/metrics", b"/readyz"):
            status, answer = await raw_request(
                held.url,
                b"GET " + path + b" HTTP/1.1\r\n" + head + b"Authorization: Bearer \xff\xfe\xc3(\r\n\r\n",
            )
            assert status == 401, answer
        status, answer = await raw_request(
            held.url,
            b"GET /approvals HTTP/1.1\r\n" + head + b"Cookie: agentwake_session=\xff\xfe\xc3(\r\n\r\n",
        )
        assert status == 401, answer
        for body in (b"token=\xff\xfe\xc3(", b"token=%FF%FE%C3%28"):
            status, answer = await raw_request(
                held.url,
                b"POST /login HTTP/1.1\r\n" + head + b"Content-Type: application/x-www-form-urlencoded\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body,
            )
            assert status == 401, answer

        # A logged-in browser's form that is not UTF-8: 401 too, and nothing answered.
        async with client_from("127.0.0.1") as browser:
            assert await status_of(browser, "POST", f"{held.url}/login", data={"token": TOKEN}) == 303
            [cookie] = [c for c in browser.cookie_jar if c.key == "agentwake_session"]
        body = b"csrf=\xff\xfe&note=\xc3("
        status, answer = await raw_request(
            held.url,
            f"POST /approvals/{held.rows[0]}/approve HTTP/1.1\r\n".encode()
            + head
            + f"Cookie: agentwake_session={cookie.value}\r\n".encode()
            + b"Content-Type: application/x-www-form-urlencoded\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body,
        )
        assert status == 401, answer
        assert (await held.detail(held.rows[0]))["state"] == "held"


# ---- 4: TLS, and a trusted reverse proxy -------------------------------------------------------------


@asynccontextmanager
async def tls_endpoint(tmp_path: Path) -> AsyncIterator[tuple[Held, ssl.SSLContext]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / "endpoint.pem", tmp_path / "endpoint.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(cert_path), append=True)
    cert.private_key_pem.write_to_path(str(key_path))
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(client)
    async with held_endpoint(
        tmp_path, service={"tls_cert": str(cert_path), "tls_key": str(key_path)}
    ) as held:
        yield held, client


async def test_with_tls_the_endpoint_serves_https_with_secure_cookies_and_hsts(tmp_path: Path) -> None:
    async with tls_endpoint(tmp_path) as (held, client), client_from("127.0.0.1", ssl=client) as browser:
        assert held.url.startswith("https://127.0.0.1:")
        async with browser.post(
            f"{held.url}/login", data={"token": TOKEN}, allow_redirects=False
        ) as response:
            assert response.status == 303
            cookie = response.headers["Set-Cookie"]
            assert response.headers["Strict-Transport-Security"].startswith("max-age=")
        assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        async with browser.get(f"{held.url}/approvals", headers={"Accept": "application/json"}) as response:
            assert response.status == 200 and (await response.json())["total"] == 1
            assert "Strict-Transport-Security" in response.headers
        # Plain http to the https port gets no answer from the app.
        async with aiohttp.ClientSession() as plain:
            with pytest.raises(aiohttp.ClientError):
                async with plain.get(held.url.replace("https://", "http://") + "/healthz") as response:
                    await response.read()


async def test_forwarded_headers_count_from_the_trusted_proxy_only(tmp_path: Path) -> None:
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.20, 203.0.113.9"}
    async with (
        held_endpoint(tmp_path, 2, service={"trusted_proxy": ["127.0.0.1", "10.0.0.0/8"]}) as held,
        client_from("127.0.0.1") as proxy,
    ):
        async with proxy.post(
            f"{held.url}/login", data={"token": TOKEN}, headers=forwarded, allow_redirects=False
        ) as response:
            assert "Secure" in response.headers["Set-Cookie"]
            assert "Strict-Transport-Security" in response.headers
        approve = f"{held.url}/approvals/{held.rows[0]}/approve"
        assert await status_of(proxy, "POST", approve, headers={**SLACK, **forwarded}) == 200
        [answer] = (await held.detail(held.rows[0]))["answers"]
        assert answer["address"] == "203.0.113.9"  # the client the proxy saw, not the proxy
        # Wrong tokens are counted per forwarded client: one client's flood is not another's.
        wrong = {"Authorization": "Bearer wrong-token-of-the-attacker", "X-Forwarded-For": "203.0.113.66"}
        for _ in range(LOGIN_FAILURES_ALLOWED):
            assert await status_of(proxy, "GET", f"{held.url}/metrics", headers=wrong) == 401
        assert await status_of(proxy, "GET", f"{held.url}/metrics", headers=wrong) == 429
        other = {**wrong, "X-Forwarded-For": "203.0.113.67"}
        assert await status_of(proxy, "GET", f"{held.url}/metrics", headers=other) == 401

    async with (
        held_endpoint(tmp_path / "untrusted", 1, service={"trusted_proxy": ["127.0.0.9"]}) as held,
        client_from("127.0.0.1") as someone,
    ):
        async with someone.post(
            f"{held.url}/login", data={"token": TOKEN}, headers=forwarded, allow_redirects=False
        ) as response:
            assert "Secure" not in response.headers["Set-Cookie"]
            assert "Strict-Transport-Security" not in response.headers
        approve = f"{held.url}/approvals/{held.rows[0]}/approve"
        assert await status_of(someone, "POST", approve, headers={**SLACK, **forwarded}) == 200
        [answer] = (await held.detail(held.rows[0]))["answers"]
        assert answer["address"] == "127.0.0.1"


# ---- 5: scopes ----------------------------------------------------------------------------------------


async def test_each_token_does_what_its_scopes_allow_and_gets_403_for_the_rest(tmp_path: Path) -> None:
    async with held_endpoint(tmp_path, 2) as held, aiohttp.ClientSession() as http:
        approve = f"{held.url}/approvals/{held.rows[0]}/approve"
        # Prometheus's token: /metrics, and nothing else.
        assert await status_of(http, "GET", f"{held.url}/metrics", headers=PROMETHEUS) == 200
        async with http.get(
            f"{held.url}/approvals", headers={**PROMETHEUS, "Accept": "application/json"}
        ) as r:
            assert r.status == 403
            assert "the token 'prometheus' does not have the 'read' scope" in (await r.json())["error"]
        assert await status_of(http, "POST", approve, headers=PROMETHEUS) == 403
        assert await status_of(http, "POST", f"{held.url}/login", data={"token": METRICS_TOKEN}) == 403
        assert (await held.detail(held.rows[0]))["state"] == "held"
        # The Slack bridge's token: list and answer, no metrics.
        async with http.get(f"{held.url}/metrics", headers=SLACK) as r:
            assert r.status == 403 and "'metrics' scope" in (await r.json())["error"]
        assert await status_of(http, "GET", f"{held.url}/approvals", headers=SLACK) == 200
        assert await status_of(http, "POST", approve, headers=SLACK) == 200
        # The probes stay open.
        assert await status_of(http, "GET", f"{held.url}/healthz") == 200


async def test_a_read_only_token_sees_the_page_without_answer_forms_and_cannot_answer(tmp_path: Path) -> None:
    service = {"tokens": {"viewer": {"env": "AW_SLACK_TOKEN", "scopes": ["read"]}}}
    async with held_endpoint(tmp_path, service=service) as held, client_from("127.0.0.1") as browser:
        assert await status_of(browser, "POST", f"{held.url}/login", data={"token": SLACK_TOKEN}) == 303
        async with browser.get(f"{held.url}/") as response:
            page = await response.text()
        assert "Held for approval (1)" in page and "cannot approve or deny" in page
        assert "/approve" not in page
        logout_csrf = csrf_of(page)
        approve = f"{held.url}/approvals/{held.rows[0]}/approve"
        assert await status_of(browser, "POST", approve, data={"csrf": logout_csrf}) == 403
        assert (await held.detail(held.rows[0]))["state"] == "held"


# ---- 6: the audit trail, and the authority lines --------------------------------------------------------


def cli(tmp_path: Path, *args: str) -> str:
    config = tmp_path / "cli.toml"
    config.write_text(f'[store]\npath = "{tmp_path / "aw.db"}"\n')
    result = CliRunner().invoke(app, [*args, "-c", str(config)])
    assert result.exit_code == 0, result.output
    return result.output


async def test_who_answered_comes_from_the_caller_not_the_request_body(tmp_path: Path) -> None:
    decision = {
        "rule": "hold-suspicious",
        "rule_tools": ["close_ticket"],
        "why": "odd",
        "authority": AUTHORITY,
    }
    async with (
        held_endpoint(tmp_path, 4, decision=decision) as held,
        client_from("127.0.0.1") as browser,
    ):
        first, second, third, fourth = held.rows
        url = held.url

        # Held: the lines of what approving allows, in the JSON listing, on the page, in the CLI.
        async with browser.get(f"{url}/approvals", headers=OPERATOR) as response:
            listed = (await response.json())["held"]
        assert listed[0]["authority"] == AUTHORITY
        assert json.loads(cli(tmp_path, "approvals", "--json"))[0]["authority"] == AUTHORITY
        shown = cli(tmp_path, "show", "T-1")
        assert "If approved, the agent may:" in shown and AUTHORITY[0] in shown

        # A bearer token: who is its name; the body cannot say otherwise.
        forged = {"note": "fine", "who": "mallory", "via": "nobody", "address": "10.9.9.9"}
        assert (
            await status_of(
                browser, "POST", f"{url}/approvals/{first}/approve", data=forged, headers=OPERATOR
            )
            == 200
        )
        # A relayed identity: only as SYSTEM:ID; a bad one is refused and nothing is answered.
        bad = {"on_behalf_of": "slack:<@U0BOSS>"}
        assert (
            await status_of(browser, "POST", f"{url}/approvals/{second}/deny", data=bad, headers=SLACK) == 400
        )
        assert (await held.detail(second))["state"] == "held" and await held.store.answers(10) != []
        relayed = {"reason": "spam", "on_behalf_of": "slack:U0123ABCD"}
        assert (
            await status_of(browser, "POST", f"{url}/approvals/{second}/deny", data=relayed, headers=SLACK)
            == 200
        )
        # A browser session: who is the token it logged in with; it may not claim to relay anyone.
        assert await status_of(browser, "POST", f"{url}/login", data={"token": TOKEN}) == 303
        async with browser.get(f"{url}/") as response:
            page = await response.text()
        assert "If approved, the agent may:" in page and "ticket = &#39;T-1&#39; (pinned)" in page
        csrf = csrf_of(page)
        claim = {"csrf": csrf, "on_behalf_of": "slack:U0123ABCD"}
        assert await status_of(browser, "POST", f"{url}/approvals/{third}/approve", data=claim) == 400
        assert (await held.detail(third))["state"] == "held"
        assert (
            await status_of(browser, "POST", f"{url}/approvals/{third}/approve", data={"csrf": csrf}) == 303
        )

        answers = {a["event_id"]: a for a in await held.store.answers(10)}
        assert set(answers) == {"T-1", "T-2", "T-3"}
        assert (answers["T-1"]["who"], answers["T-1"]["via"], answers["T-1"]["address"]) == (
            "operator",
            "bearer token operator",
            "127.0.0.1",
        )
        assert answers["T-1"]["note"] == "fine" and answers["T-1"]["tools"] == ["close_ticket"]
        assert answers["T-1"]["authority"] == AUTHORITY and answers["T-1"]["rule"] == "hold-suspicious"
        assert (answers["T-2"]["answer"], answers["T-2"]["who"], answers["T-2"]["via"]) == (
            "denied",
            "slack:U0123ABCD",
            "relayed by token slack",
        )
        assert (answers["T-3"]["who"], answers["T-3"]["via"]) == ("operator", "browser session operator")

        # Shown: on the page, in the JSON listing, by `approvals --answered` and `show`.
        async with browser.get(f"{url}/") as response:
            page = await response.text()
        assert "Recent answers" in page and "slack:U0123ABCD" in page and "relayed by token slack" in page
        async with browser.get(f"{url}/approvals", headers=OPERATOR) as response:
            body = await response.json()
        assert [a["who"] for a in body["answered"]] == ["operator", "slack:U0123ABCD", "operator"]
        assert [h["row"] for h in body["held"]] == [fourth]
        audit = json.loads(cli(tmp_path, "approvals", "--answered", "5", "--json"))
        assert [(a["event_id"], a["answer"], a["who"]) for a in audit] == [
            ("T-3", "approved", "operator"),
            ("T-2", "denied", "slack:U0123ABCD"),
            ("T-1", "approved", "operator"),
        ]
        assert "slack:U0123ABCD" in cli(tmp_path, "approvals", "--answered", "5")
        shown = " ".join(cli(tmp_path, "show", "T-2").split())
        assert "denied by slack:U0123ABCD (relayed by token slack, from 127.0.0.1)" in shown
        assert "rule hold-suspicious, tools granted: close_ticket" in shown

    # The CLI answers as the local user.
    cli(tmp_path, "deny", "T-4", "--reason", "no")
    [latest] = json.loads(cli(tmp_path, "approvals", "--answered", "1", "--json"))
    assert (
        latest["event_id"] == "T-4" and latest["who"].startswith("cli:") and latest["via"] == "agentwake CLI"
    )
