"""The operator's HTTP endpoint (`[service] listen`): probes, metrics, the token, sessions and CSRF.

A real `agentwake run` subprocess serves it on a loopback port (port 0; the log line says which)
with the quiet demo server and, to keep /readyz waiting, a server whose command does not exist.
"While stopping" is caught in this process instead: the service runs here with the real signal
path, delivery made to never finish stopping (as tests/test_shutdown.py does), so the grace lasts
until the test ends it; a subprocess's grace is over too soon to be seen reliably. The store
check is driven by a real SQLite file that another connection keeps locked.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from _support import RunningService, agentwake_run, demo_server_toml
from conftest import REPO

from agentwake import service as service_module
from agentwake.config import ServiceConfig, load_config, parse_config
from agentwake.errors import ConfigError
from agentwake.service import _heartbeat, run_service
from agentwake.store.sqlite import SqliteStore
from agentwake.supervisor import Supervisor
from agentwake.web import Health, endpoint_settings, is_loopback
from agentwake.web.access import LoginThrottle, Sessions, loopback_host_header, same_origin
from agentwake.web.app import Endpoint

pytestmark = pytest.mark.anyio

TOKEN = "tok-3f9c1e2a7b6d4058a1c2"
LISTENING = re.compile(r"service endpoint listening on (http://\S+)")
WAIT_S = 30.0


def write_config(tmp_path: Path, *, service: str, broken: bool = False) -> Path:
    broken_toml = (
        '[servers.broken]\ncommand = "/nonexistent/agentwake-test-server"\n\n'
        '[[subscriptions]]\nname = "broken-tickets"\nserver = "broken"\nevent = "ticket.created"\n'
        if broken
        else ""
    )
    path = tmp_path / "agentwake.toml"
    path.write_text(
        f"""
[store]
path = "aw.db"

[service]
{service}

{demo_server_toml(tmp_path / "demo.db")}
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
delivery = "poll"

{broken_toml}
"""
    )
    return path


async def endpoint_url(run: RunningService) -> str:
    line = run.lines[await run.wait_for("service endpoint listening on http://")]
    found = LISTENING.search(line)
    assert found is not None, line
    return found.group(1)


async def get_json(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    async with http.get(url, headers=headers) as response:
        return response.status, await response.json()


async def wait_json(
    http: aiohttp.ClientSession, url: str, holds: Callable[[int, dict[str, Any]], bool]
) -> dict[str, Any]:
    """GET ``url`` until its status and JSON body satisfy ``holds``; the last body."""
    status, body = await get_json(http, url)
    with anyio.fail_after(WAIT_S):
        while not holds(status, body):  # the endpoint is only asked: it tells nobody
            await anyio.sleep(0.05)
            status, body = await get_json(http, url)
    return body


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, page
    return found.group(1)


# ---- a real `agentwake run` ----------------------------------------------------------------------


@pytest.mark.slow
async def test_probes_are_open_and_everything_else_needs_the_token_as_bearer_or_session(
    tmp_path: Path,
) -> None:
    config = write_config(
        tmp_path, service='listen = "127.0.0.1:0"\ntoken_env = "AGENTWAKE_TEST_TOKEN"', broken=True
    )
    async with (
        agentwake_run(config, AGENTWAKE_TEST_TOKEN=TOKEN) as run,
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http,
    ):
        url = await endpoint_url(run)
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
        bearer = {"Authorization": f"Bearer {TOKEN}"}

        assert await get_json(http, f"{url}/healthz") == (200, {"status": "ok"})
        # Not ready while a server cannot connect: the body names it and why, the demo is connected.
        body = await wait_json(
            http,
            f"{url}/readyz",
            lambda status, body: status == 503 and body["servers"]["demo"] == "connected",
        )
        assert body["waiting"] == {"broken": "error"}  # why is for holders of the token
        _, body = await get_json(http, f"{url}/readyz", headers=bearer)
        assert list(body["waiting"]) == ["broken"]
        assert body["waiting"]["broken"].startswith("error: server 'broken'")
        assert "command not found" in body["waiting"]["broken"]
        async with http.get(f"{url}/readyz", headers={"Authorization": "Bearer nope"}) as response:
            assert response.status == 401  # a wrong token is no probe's business

        # Metrics, the page and the answers need the token: 401 without it, or with a wrong one.
        async with http.get(f"{url}/metrics") as response:
            assert response.status == 401
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
        async with http.get(f"{url}/", headers={"Authorization": "Bearer nope"}) as response:
            assert response.status == 401
        async with http.get(f"{url}/", headers={"Accept": "text/html"}) as response:
            assert response.status == 401  # a browser gets the login form with it
            assert 'name="token"' in await response.text()
        async with http.post(f"{url}/approvals/1/approve") as response:
            assert response.status == 401

        async with http.get(f"{url}/metrics", headers=bearer) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            metrics = await response.text()
        assert "# TYPE agentwake_" in metrics and "agentwake_inbox_events" in metrics
        async with http.get(f"{url}/", headers=bearer) as response:
            assert response.status == 200 and "Held for approval (0)" in await response.text()
        # A bearer client is no browser: its POST needs no form token.
        async with http.post(f"{url}/approvals/999/approve", headers=bearer) as response:
            assert response.status == 409
            assert "no stored event with row id 999" in (await response.json())["message"]

        # A browser logs in with the token and gets an HttpOnly, SameSite=Strict session cookie.
        async with http.post(f"{url}/login", data={"token": "wrong"}, allow_redirects=False) as response:
            assert response.status == 401 and "That is not the access token." in await response.text()
        async with http.post(f"{url}/login", data={"token": TOKEN}, allow_redirects=False) as response:
            assert response.status == 303
            cookie = response.headers["Set-Cookie"]
        assert (
            cookie.startswith("agentwake_session=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        )
        async with http.get(f"{url}/") as response:
            assert response.status == 200
            csrf = csrf_of(await response.text())

        # With the cookie only, a POST must carry the page's form token and must not come from elsewhere.
        deny = f"{url}/approvals/999/deny"
        for form, headers in [
            ({"reason": "no"}, {}),
            ({"reason": "no", "csrf": "forged"}, {}),
            ({"reason": "no", "csrf": csrf}, {"Origin": "http://evil.example"}),
            ({"reason": "no", "csrf": csrf}, {"Sec-Fetch-Site": "cross-site"}),
        ]:
            async with http.post(deny, data=form, headers=headers, allow_redirects=False) as response:
                assert response.status == 403, (form, headers)
        async with http.post(
            deny, data={"reason": "no", "csrf": csrf}, headers={"Origin": url}, allow_redirects=False
        ) as response:
            assert response.status == 303 and response.headers["Location"] == "/"
        async with http.get(f"{url}/") as response:
            assert "event row 999: no stored event with row id 999" in await response.text()

        # Logged out, the cookie no longer lets anything in.
        async with http.post(f"{url}/logout", data={"csrf": csrf}, allow_redirects=False) as response:
            assert response.status == 303
        async with http.get(f"{url}/metrics") as response:
            assert response.status == 401
        await run.stop(signal.SIGTERM)
    log = "\n".join(run.lines)
    assert "(the token in $AGENTWAKE_TEST_TOKEN is required, except for /healthz and /readyz)" in log
    assert "a wrong access token was presented" in log
    assert TOKEN not in log
    assert "Warning: " not in log  # a warning per request (say, from aiohttp) would flood the log


async def run_cli(config: Path, env: dict[str, str]) -> tuple[int, str]:
    done = await anyio.run_process(
        [sys.executable, "-m", "agentwake.cli", "run", "-c", str(config)],
        cwd=config.parent,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        check=False,
    )
    return done.returncode, done.stderr.decode()


@pytest.mark.slow
async def test_a_listen_address_beyond_loopback_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    config = write_config(tmp_path, service='listen = "0.0.0.0:0"')
    code, stderr = await run_cli(config, {})
    assert code == 1, stderr
    message = " ".join(stderr.split())
    assert "error: [service] listen = '0.0.0.0:0' is reachable beyond this machine" in message
    assert "set [service] token_env" in message
    assert not (tmp_path / "aw.db").exists()  # refused before anything started


def test_the_endpoint_settings_ask_for_a_token_beyond_loopback() -> None:
    for host in ("127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "example.com", ""):
        assert not is_loopback(host), host

    open_local = endpoint_settings(ServiceConfig(listen="127.0.0.1:8080"), env={})
    assert (open_local.host, open_local.port, open_local.token, open_local.loopback) == (
        "127.0.0.1",
        8080,
        None,
        True,
    )
    v6 = endpoint_settings(ServiceConfig(listen="[::1]:0"), env={})
    assert (v6.host, v6.port) == ("::1", 0)

    with pytest.raises(ConfigError, match=r"reachable beyond this machine.*token_env"):
        endpoint_settings(ServiceConfig(listen="0.0.0.0:8080"), env={})
    with pytest.raises(ConfigError, match="token_env names AW_TOKEN, which is not set"):
        endpoint_settings(ServiceConfig(listen="0.0.0.0:8080", token_env="AW_TOKEN"), env={})
    with pytest.raises(ConfigError, match="token_env names AW_TOKEN, which is not set"):
        endpoint_settings(ServiceConfig(listen="127.0.0.1:8080", token_env="AW_TOKEN"), env={"AW_TOKEN": ""})
    with pytest.raises(ConfigError, match="listen must be HOST:PORT"):
        endpoint_settings(ServiceConfig(listen="8080"), env={})

    with pytest.raises(ConfigError, match="shorter than 16 characters"):
        endpoint_settings(
            ServiceConfig(listen="127.0.0.1:8080", token_env="AW_TOKEN"), env={"AW_TOKEN": "s3"}
        )
    secret = "s3-" + "x" * 20
    # Beyond loopback a token is not enough: it would travel in clear without TLS or a TLS proxy.
    with pytest.raises(ConfigError, match=r"over plain http.*tls_cert.*trusted_proxy"):
        endpoint_settings(
            ServiceConfig(listen="0.0.0.0:8080", token_env="AW_TOKEN"), env={"AW_TOKEN": secret}
        )
    exposed = endpoint_settings(
        ServiceConfig(listen="0.0.0.0:8080", token_env="AW_TOKEN", trusted_proxy=["10.0.0.1"]),
        env={"AW_TOKEN": secret},
    )
    assert exposed.accepts(secret) and not exposed.accepts("s4") and not exposed.accepts("")
    assert secret not in repr(exposed) and secret.encode() not in repr(exposed).encode()


def test_browser_checks_tell_a_cross_site_request_and_a_rebound_host() -> None:
    assert same_origin(None, None, "127.0.0.1:8080")  # curl, a script
    assert same_origin("http://127.0.0.1:8080", "same-origin", "127.0.0.1:8080")
    assert not same_origin("http://evil.example", None, "127.0.0.1:8080")
    assert not same_origin("null", None, "127.0.0.1:8080")
    assert not same_origin(None, "cross-site", "127.0.0.1:8080")
    assert not same_origin(None, "same-site", "127.0.0.1:8080")
    assert loopback_host_header("127.0.0.1:8080") and loopback_host_header("localhost")
    assert loopback_host_header("[::1]:8080")
    assert not loopback_host_header("evil.example:8080") and not loopback_host_header(None)


def test_sessions_expire_and_wrong_tokens_are_throttled() -> None:
    now = [0.0]
    sessions = Sessions(ttl_s=10, idle_s=4, limit=2, clock=lambda: now[0])
    first, second = sessions.create("operator"), sessions.create("operator")
    assert sessions.get(first.id) is first and first.csrf_matches(first.csrf)
    assert not first.csrf_matches(second.csrf) and sessions.get("") is None
    assert not first.csrf_matches("\udcff")  # undecodable bytes are no token
    third = sessions.create("operator")  # over the limit: the least recently used goes
    assert sessions.get(second.id) is None and sessions.get(third.id) is third
    assert sessions.get(first.id) is first
    now[0] = 3.0
    assert sessions.get(first.id) is first  # used: idle again from now
    now[0] = 6.5
    assert sessions.get(third.id) is None  # unused for 4 s: idle timeout
    assert sessions.get(first.id) is first
    now[0] = 10.0
    assert sessions.get(first.id) is None  # the absolute limit, however busy

    throttle = LoginThrottle(allowed=2, window_s=60, clock=lambda: now[0])
    assert throttle.failed("127.0.0.5") is True  # the first of its window: worth a log line
    assert not throttle.blocked("127.0.0.5")
    assert throttle.failed("127.0.0.5") is False
    assert throttle.blocked("127.0.0.5")
    assert not throttle.blocked("127.0.0.6")  # per client address
    throttle.failed("2001:db8::1")
    throttle.failed("2001:db8::2")
    assert throttle.blocked("2001:db8::ffff")  # IPv6: per /64
    now[0] += 60
    assert not throttle.blocked("127.0.0.5")


# ---- in this process: the stop signal, and a store that cannot be written ----------------------


@asynccontextmanager
async def http_client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as http:
        yield http


async def test_healthz_and_readyz_answer_503_from_the_stop_signal_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def never_stops(self: Supervisor) -> None:
        await anyio.sleep_forever()

    monkeypatch.setattr(Supervisor, "stop_delivery", never_stops)
    monkeypatch.setattr(service_module, "STOP_GRACE_S", 60.0)
    monkeypatch.setattr(service_module.gc, "freeze", lambda: None)  # keep this process's heap collectable
    caplog.set_level("INFO", logger="agentwake")
    config = load_config(write_config(tmp_path, service='listen = "127.0.0.1:0"'))
    async with anyio.create_task_group() as tg, http_client() as http:
        # Started: the signal handlers are installed (a signal before that would end pytest itself).
        await tg.start(run_service, config)
        found = LISTENING.search(caplog.text)
        assert found is not None, caplog.text
        url = found.group(1)
        assert "open: no access token, loopback only" in caplog.text

        ready = await wait_json(http, f"{url}/readyz", lambda status, body: status == 200)
        assert ready == {"status": "ready", "servers": {"demo": "connected"}, "paused": []}
        assert await get_json(http, f"{url}/healthz") == (200, {"status": "ok"})

        os.kill(os.getpid(), signal.SIGTERM)
        stopping = await wait_json(http, f"{url}/healthz", lambda status, body: status == 503)
        assert stopping == {"status": "stopping", "reason": "stopping"}
        assert (await get_json(http, f"{url}/readyz"))[0] == 503
        assert "received SIGTERM: stopping" in caplog.text

        os.kill(os.getpid(), signal.SIGINT)  # the second signal: no more grace
        with anyio.fail_after(10):
            while "agentwake stopped" not in caplog.text:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()


async def test_healthz_is_503_while_the_store_cannot_be_written(tmp_path: Path) -> None:
    config = parse_config(
        {"store": {"path": str(tmp_path / "aw.db")}, "service": {"listen": "127.0.0.1:0"}}, env={}
    )
    store = await SqliteStore.open(config.store.path, busy_timeout_ms=50)
    health = Health(heartbeat_s=0.02)
    endpoint = Endpoint(endpoint_settings(config.service, env={}), store, Supervisor(config, store), health)
    try:
        service_id = await store.service_started(pid=os.getpid(), host="test", version=None, heartbeat_s=0.02)
        health.store_written()
        async with anyio.create_task_group() as tg, http_client() as http:
            await tg.start(endpoint.serve)
            tg.start_soon(_heartbeat, store, service_id, 0.02, health)
            assert await get_json(http, f"{endpoint.url}/healthz") == (200, {"status": "ok"})
            # Another process holds the write lock: the next beats fail, and /healthz says so.
            locker = sqlite3.connect(config.store.path, isolation_level=None)
            locker.execute("BEGIN EXCLUSIVE")
            try:
                # Under load the beats may first look late ("no store write succeeded for ..."):
                # wait for the failed write's own reason.
                body = await wait_json(
                    http,
                    f"{endpoint.url}/healthz",
                    lambda status, body: status == 503 and "cannot be written" in str(body.get("reason")),
                )
            finally:
                locker.execute("ROLLBACK")
                locker.close()
            assert body["status"] == "unhealthy"
            assert body["reason"].startswith("the store cannot be written:"), body
            assert "locked" in body["reason"]
            # The lock is gone: the next beat writes, and the endpoint is healthy again.
            await wait_json(http, f"{endpoint.url}/healthz", lambda status, body: status == 200)
            # Readiness comes from the supervisor: a server never started counts as connecting.
            assert await get_json(http, f"{endpoint.url}/readyz") == (
                200,
                {"status": "ready", "servers": {}, "paused": []},
            )
            tg.cancel_scope.cancel()
    finally:
        await store.close()


def test_a_heartbeat_that_stops_succeeding_makes_the_service_unhealthy() -> None:
    now = [100.0]
    health = Health(heartbeat_s=5, clock=lambda: now[0])
    assert health.problem() is None  # nothing written yet: starting up
    health.store_written()
    now[0] += 15
    assert health.problem() is None
    now[0] += 1
    assert health.problem() == "no store write succeeded for 16s"
    health.store_written()
    health.store_failed("database is locked")
    assert health.problem() == "the store cannot be written: database is locked"
    health.stopping = True
    assert health.problem() == "stopping"


async def test_readyz_is_503_while_the_models_circuit_breaker_is_open(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from agentwake.worker import Worker

    config = parse_config(
        {"store": {"path": str(tmp_path / "aw.db")}, "service": {"listen": "127.0.0.1:0"}}, env={}
    )
    store = await SqliteStore.open(config.store.path)
    supervisor = Supervisor(config, store)
    supervisor.worker = Worker(config, store)
    breaker = supervisor.worker.breaker
    breaker.threshold = 1
    endpoint = Endpoint(endpoint_settings(config.service, env={}), store, supervisor, Health(heartbeat_s=60))
    try:
        async with anyio.create_task_group() as tg, http_client() as http:
            await tg.start(endpoint.serve)
            assert (await get_json(http, f"{endpoint.url}/readyz"))[0] == 200
            breaker.clock = lambda: datetime(2026, 12, 4, 18, 0, tzinfo=UTC)
            breaker.observe("openai/gpt-4o-mini", _Transient("InternalServerError: the model is down"))
            assert breaker.is_open
            status, body = await get_json(http, f"{endpoint.url}/readyz")
            assert status == 503, body
            assert body["status"] == "not ready"
            assert body["model"].startswith("model openai/gpt-4o-mini failing since 2026-12-04T18:00:00")
            assert body["model"].endswith("(InternalServerError)")
            breaker.observe("openai/gpt-4o-mini", None)
            breaker.is_open = False  # what the worker does once a probe is answered
            assert (await get_json(http, f"{endpoint.url}/readyz"))[0] == 200
            tg.cancel_scope.cancel()
    finally:
        await store.close()


class _Transient(Exception):
    transient = True
