"""agentwake against the least an MCP server may do (tests/minimal_server.py), over real stdio.

The server is hand-written JSON-RPC (no SDK) and logs every request it gets, with the
error code it answered, so each test asserts on what agentwake actually sent: nothing of
MCP Events to a server that does not declare them; polls to a server that declares them
in any of the three spellings; webhook subscribes and unsubscribes that carry every field
a strict server may require; a refused unsubscribe shown as such; and, after a SIGKILL of
the server, a new process subscribed again from the cursor stored before the kill.

Every test runs real subprocesses and a real SQLite store file. Waits look at a condition
(the server's request log, the store) every 20 ms under a deadline; nothing sleeps fixed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import trustme
from conftest import REPO, free_port

from agentwake.config import AgentwakeConfig, parse_config
from agentwake.store.sqlite import SqliteStore
from agentwake.supervisor import Supervisor

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MINIMAL = REPO / "tests" / "minimal_server.py"
EVENT = "m.tick"
NOT_EVENTS = "does not implement MCP Events"


# ---- configuration ----------------------------------------------------------------------------------


def server_entry(tmp_path: Path, **env: str) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": [str(MINIMAL)],
        "cwd": str(tmp_path),
        "env": {"MINIMAL_LOG": str(tmp_path / "requests.log"), **env},
    }


def raw_config(
    tmp_path: Path,
    subscriptions: list[dict[str, Any]],
    *,
    server: dict[str, Any],
    webhook: dict[str, Any] | None = None,
) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "store": {"path": str(tmp_path / "aw.db")},
        "servers": {"m": server},
        "subscriptions": subscriptions,
    }
    if webhook is not None:
        raw["webhook"] = webhook
    return raw


def toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def write_toml(path: Path, raw: dict[str, Any]) -> Path:
    """``raw`` (a config as parse_config takes it) as an agentwake.toml the CLI reads."""
    lines: list[str] = []
    for table in ("store", "webhook"):
        if table in raw:
            lines.append(f"[{table}]")
            lines.extend(f"{k} = {toml_value(v)}" for k, v in raw[table].items())
            lines.append("")
    for name, server in raw["servers"].items():
        lines.append(f"[servers.{name}]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in server.items())
        lines.append("")
    for sub in raw["subscriptions"]:
        lines.append("[[subscriptions]]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in sub.items())
        lines.append("")
    path.write_text("\n".join(lines))
    return path


# ---- what happened ------------------------------------------------------------------------------------


def requests(tmp_path: Path, method: str | None = None) -> list[dict[str, Any]]:
    """The server's request log (complete lines only), every process's."""
    log = tmp_path / "requests.log"
    if not log.exists():
        return []
    lines = log.read_text().split("\n")[:-1]
    return [r for r in map(json.loads, lines) if method is None or r["method"] == method]


def events_requests(tmp_path: Path) -> list[str]:
    return [r["method"] for r in requests(tmp_path) if r["method"].startswith("events/")]


def row(store: SqliteStore, name: str) -> dict[str, Any]:
    return next(r for r in store.core.subscriptions() if r["subscription"] == name)


async def until(predicate: Callable[[], bool], what: str, within: float = 8.0) -> None:
    try:
        with anyio.fail_after(within):
            while not predicate():  # noqa: ASYNC110 - the store and the server's log signal nothing
                await anyio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {within:g}s: {what}") from None


@asynccontextmanager
async def supervising(config: AgentwakeConfig, **options: Any) -> AsyncIterator[SqliteStore]:
    """The service's delivery side (no worker) running on ``config``, its store open."""
    store = await SqliteStore.open(config.store.path)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(Supervisor(config, store, **options).run)
            yield store
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await store.close()


async def cli(*args: str, cwd: Path) -> tuple[int, str, str]:
    done = await anyio.run_process(
        [sys.executable, "-m", "agentwake.cli", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "COLUMNS": "200"},
        check=False,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


# ---- the server itself ---------------------------------------------------------------------------------


async def exchange(env: dict[str, str], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send ``messages`` to a fresh minimal server; its answers, in order (one per message with an id)."""
    expected = sum(1 for m in messages if "id" in m)
    async with await anyio.open_process([sys.executable, str(MINIMAL)], env={**os.environ, **env}) as process:
        assert process.stdin is not None and process.stdout is not None
        data = "".join(json.dumps({"jsonrpc": "2.0", **m}) + "\n" for m in messages).encode()
        await process.stdin.send(data)
        buffered = b""
        with anyio.fail_after(5):
            async for chunk in process.stdout:
                buffered += chunk
                if buffered.count(b"\n") >= expected:
                    break
        await process.stdin.aclose()
        await process.wait()
    return [json.loads(line) for line in buffered.decode().splitlines()]


async def test_the_strict_server_refuses_an_unsubscribe_missing_a_field_it_requires() -> None:
    """The fixture is as strict as the unsubscribe test needs: delivery.mode or arguments missing is -32602."""
    url = "https://127.0.0.1:9/hooks/hook"
    base = {"name": EVENT, "arguments": {}}
    answers = await exchange(
        {"MINIMAL_STRICT": "1", "MINIMAL_DELIVERY": "webhook"},
        [
            {"id": 1, "method": "events/unsubscribe", "params": {**base, "delivery": {"url": url}}},
            {
                "id": 2,
                "method": "events/unsubscribe",
                "params": {"name": EVENT, "delivery": {"mode": "webhook", "url": url}},
            },
            {
                "id": 3,
                "method": "events/unsubscribe",
                "params": {**base, "delivery": {"mode": "webhook", "url": url}},
            },
        ],
    )
    assert [a["id"] for a in answers] == [1, 2, 3]
    assert answers[0]["error"]["code"] == -32602 and "delivery.mode" in answers[0]["error"]["message"]
    assert answers[1]["error"]["code"] == -32602 and "arguments" in answers[1]["error"]["message"]
    assert answers[2]["result"] == {}


# ---- 1. a server without MCP Events ----------------------------------------------------------------------


async def test_a_server_without_the_events_extension_gets_no_events_request_and_shows_unsupported(
    tmp_path: Path,
) -> None:
    raw = raw_config(
        tmp_path,
        [{"name": "ticks", "server": "m", "event": EVENT}],
        # Short pings: the connection is seen alive (and idle of events/*) several times.
        server={**server_entry(tmp_path, MINIMAL_CAPABILITY="none"), "ping_interval_s": 0.1},
    )
    config = parse_config(raw, env={})
    async with supervising(config) as store:
        await until(lambda: row(store, "ticks")["status"] == "unsupported", "the subscription is unsupported")
        await until(lambda: len(requests(tmp_path, "ping")) >= 3, "the kept connection is pinged 3 times")
        assert NOT_EVENTS in row(store, "ticks")["last_error"]
    assert events_requests(tmp_path) == [], "a server that declares no MCP Events got events/* requests"
    assert requests(tmp_path, "initialize"), "the server was never connected"

    config_file = write_toml(tmp_path / "agentwake.toml", raw)
    code, out, err = await cli("status", "--json", "-c", str(config_file), cwd=tmp_path)
    assert code == 0, err
    [shown] = [r for r in json.loads(out) if r["subscription"] == "ticks"]
    assert shown["status"] == "unsupported"
    assert NOT_EVENTS in shown["last_error"]
    assert any(NOT_EVENTS in e["error"] for e in shown["recent_errors"])

    code, out, err = await cli("check", "-c", str(config_file), cwd=tmp_path)
    assert code != 0, f"check passed a server without MCP Events:\n{out}\n{err}"
    assert "unsupported" in out, out
    assert NOT_EVENTS in err, err
    assert events_requests(tmp_path) == [], "agentwake check sent events/* requests"


# ---- 2. the three spellings of the capability ---------------------------------------------------------------


@pytest.mark.parametrize("capability", ["extensions", "events", "experimental"])
async def test_each_spelling_of_the_events_capability_is_accepted_and_polled(
    tmp_path: Path, capability: str
) -> None:
    raw = raw_config(
        tmp_path,
        [{"name": "ticks", "server": "m", "event": EVENT, "delivery": "poll", "poll_floor_ms": 20}],
        server=server_entry(tmp_path, MINIMAL_CAPABILITY=capability, MINIMAL_EVENTS="3"),
    )
    await assert_polled_to_the_end(tmp_path, raw, capability)


async def assert_polled_to_the_end(tmp_path: Path, raw: dict[str, Any], capability: str) -> None:
    async with supervising(parse_config(raw, env={})) as store:

        def all_stored() -> bool:
            shown = row(store, "ticks")
            if shown["status"] == "ended":
                raise AssertionError(f"the subscription ended: {shown['last_error']}")
            return store.core.event_ids("ticks") == ["m-1", "m-2", "m-3"]

        await until(
            all_stored,
            f"the three events stored (capability spelled as {capability})",
        )
        await until(lambda: row(store, "ticks")["cursor"] == "3", "the cursor reaches 3")
        shown = row(store, "ticks")
    assert shown["status"] == "active" and shown["mode"] == "poll", shown
    assert shown["duplicates"] == 0 and shown["gaps"] == 0, shown
    polls = requests(tmp_path, "events/poll")
    assert all(p["error"] is None for p in polls), [p for p in polls if p["error"] is not None]
    # Bootstrap with null ("now"), then each cursor the server gave, in order.
    assert [p["params"].get("cursor") for p in polls[:4]] == [None, "0", "1", "2"]
    assert all(p["params"]["name"] == EVENT for p in polls)


async def test_a_strict_server_gets_arguments_on_every_poll(tmp_path: Path) -> None:
    raw = raw_config(
        tmp_path,
        [{"name": "ticks", "server": "m", "event": EVENT, "delivery": "poll", "poll_floor_ms": 20}],
        server=server_entry(tmp_path, MINIMAL_EVENTS="3", MINIMAL_STRICT="1"),
    )
    await assert_polled_to_the_end(tmp_path, raw, "extensions")


# ---- 3 and 4. webhook unsubscribe -------------------------------------------------------------------------------


def webhook_section(port: int, **extra: Any) -> dict[str, Any]:
    return {"listen": f"127.0.0.1:{port}", "public_url": f"https://127.0.0.1:{port}/hooks", **extra}


HOOK = {"name": "hook", "server": "m", "event": EVENT, "delivery": "webhook"}


async def subscribe_then_remove(tmp_path: Path, **env: str) -> str:
    """Run with a webhook subscription until the server granted it, then with it removed from the config
    until agentwake has sent events/unsubscribe. Returns the callback URL."""
    port = free_port()
    server = server_entry(tmp_path, MINIMAL_DELIVERY="webhook", **env)
    with_hook = raw_config(tmp_path, [HOOK], server=server, webhook=webhook_section(port))
    async with supervising(parse_config(with_hook, env={})) as store:
        await until(
            lambda: (row(store, "hook")["webhook"] or {}).get("id") is not None, "the webhook subscribed"
        )
        url = row(store, "hook")["webhook"]["url"]
    without = raw_config(tmp_path, [], server=server, webhook=webhook_section(port))
    async with supervising(parse_config(without, env={})) as store:

        def handled() -> bool:
            """Sent, and its answer taken in: marked done (accepted or refused), or left for a retry."""
            if not requests(tmp_path, "events/unsubscribe"):
                return False
            retry = "retrying at the next connection" in (row(store, "hook")["last_error"] or "")
            return retry or not store.core.to_unsubscribe()

        await until(handled, "events/unsubscribe sent and its answer handled")
    return str(url)


async def test_unsubscribe_carries_every_field_a_strict_server_may_require(tmp_path: Path) -> None:
    url = await subscribe_then_remove(tmp_path, MINIMAL_STRICT="1")
    [subscribe, *_] = requests(tmp_path, "events/subscribe")
    assert subscribe["error"] is None, subscribe
    sent = subscribe["params"]
    assert sent["name"] == EVENT and sent["arguments"] == {}
    assert sent["delivery"]["mode"] == "webhook" and sent["delivery"]["url"] == url
    assert sent["delivery"]["secret"].startswith("whsec_")
    [unsubscribe] = requests(tmp_path, "events/unsubscribe")
    assert unsubscribe["params"] == {
        "name": EVENT,
        "arguments": {},
        "delivery": {"mode": "webhook", "url": url},
    }
    assert unsubscribe["error"] is None, f"the strict server refused the unsubscribe: {unsubscribe}"
    refused = [r for r in requests(tmp_path) if r["error"] is not None and r["method"] != "server/discover"]
    assert refused == [], refused
    # Done with: nothing left to unsubscribe, nothing recorded as lingering.
    store = await SqliteStore.open(tmp_path / "aw.db")
    try:
        assert await store.to_unsubscribe() == []
        assert row(store, "hook")["status"] != "lingering"
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("code", "lingering"),
    [
        (-32012, True),  # Forbidden: a refusal; the subscription lingers until its TTL
        (-32603, False),  # an internal error: transient, tried again at the next connection
    ],
)
async def test_a_refused_unsubscribe_is_shown_in_status(tmp_path: Path, code: int, lingering: bool) -> None:
    url = await subscribe_then_remove(tmp_path, MINIMAL_UNSUBSCRIBE_ERROR=str(code))
    [unsubscribe] = requests(tmp_path, "events/unsubscribe")
    assert unsubscribe["error"] == code
    assert unsubscribe["params"]["delivery"] == {"mode": "webhook", "url": url}
    store = await SqliteStore.open(tmp_path / "aw.db")
    try:
        shown = row(store, "hook")
        assert "events/unsubscribe" in shown["last_error"], shown
        assert any("events/unsubscribe" in e["error"] for e in shown["recent_errors"]), shown
        left = await store.to_unsubscribe()
        if lingering:
            assert shown["status"] == "lingering", shown
            assert "refused" in shown["last_error"], shown
            assert left == [], "a refused unsubscribe is not sent again and again"
        else:
            assert shown["status"] != "lingering", shown
            assert "retrying" in shown["last_error"], shown
            assert [r.subscription for r in left] == ["hook"], "a transient failure is tried again"
    finally:
        await store.close()


# ---- 5. SIGKILL of the server in the middle of webhook delivery ---------------------------------------------------


async def test_after_a_sigkill_a_new_server_process_is_subscribed_from_the_stored_cursor_within_2s(
    tmp_path: Path,
) -> None:
    ca = trustme.CA()
    pem = tmp_path / "receiver.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    trigger = tmp_path / "post-now"
    pids = tmp_path / "pids"
    port = free_port()
    raw = raw_config(
        tmp_path,
        [HOOK],
        server=server_entry(
            tmp_path,
            MINIMAL_DELIVERY="webhook",
            MINIMAL_STRICT="1",
            MINIMAL_PID_FILE=str(pids),
            MINIMAL_POST_TRIGGER=str(trigger),
            MINIMAL_POST_CA=str(ca_file),
        ),
        webhook=webhook_section(port, tls_cert=str(pem), tls_key=str(pem)),
    )

    def pid_list() -> list[int]:
        return [int(p) for p in pids.read_text().split()] if pids.exists() else []

    # Default reconnect settings: a crash after a healthy connection is retried at once (plus jitter).
    async with supervising(parse_config(raw, env={})) as store:
        await until(lambda: len(pid_list()) == 1, "the server started")
        [first] = pid_list()
        await until(lambda: row(store, "hook")["cursor"] == f"w-{first}-1", "the subscribe's cursor stored")
        # A delivery in flight: the server POSTs m-1, whose cursor the receiver stores.
        trigger.touch()
        await until(lambda: store.core.event_ids("hook") == ["m-1"], "the webhook delivery stored")
        await until(lambda: row(store, "hook")["cursor"] == f"w-{first}-2", "the delivery's cursor stored")
        # The server logs its POST once the answer is in, which comes after the commit.
        await until(lambda: bool(requests(tmp_path, "post")), "the server logged its POST")
        [post] = requests(tmp_path, "post")
        assert post["status"] in (200, 202, 204), post
        stored = row(store, "hook")["cursor"]

        killed_at = time.time()
        os.kill(first, signal.SIGKILL)

        def resubscribed() -> list[dict[str, Any]]:
            return [r for r in requests(tmp_path, "events/subscribe") if r["pid"] != first]

        await until(lambda: bool(resubscribed()), "a new server process got events/subscribe", within=6)
        [second] = [pid for pid in pid_list() if pid != first]
        again = resubscribed()[0]
        assert again["pid"] == second
        assert again["t"] - killed_at < 2.0, f"subscribed again {again['t'] - killed_at:.2f}s after the kill"
        assert again["params"]["cursor"] == stored, again["params"]
        assert again["error"] is None, again
        await until(lambda: row(store, "hook")["cursor"] == f"w-{second}-1", "the new grant's cursor stored")
        assert row(store, "hook")["status"] == "active"
