"""Prometheus metrics: the hooks change the exposition, and the real delivery paths bump them.

The exposition is parsed with prometheus_client's own parser. Counters live for the whole
pytest process, so each test reads them before and after and asserts the difference (or uses
subscription and server names no other test uses).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from _support import SteppedSleep, demo_server_toml, set_cursor
from _webhook_support import TLS, Hook, event, make_tls, running_hook
from prometheus_client.parser import text_string_to_metric_families

from agentwake import metrics, signing
from agentwake.clock import iso, utc_now
from agentwake.config import AgentwakeConfig, ServerConfig, load_config
from agentwake.delivery.common import subscription_key
from agentwake.service import run_service
from agentwake.store import EVENT_STATES, IncomingEvent, Store, SubscriptionKey
from agentwake.store.sqlite import SqliteStore
from agentwake.supervisor import Supervisor

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: bytes) -> Samples:
    found: Samples = {}
    for family in text_string_to_metric_families(text.decode("utf-8")):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


class NoInbox:
    """A store view with an empty inbox: for scrapes that test only the counters."""

    async def state_counts(self) -> dict[str, int]:
        return dict.fromkeys(EVENT_STATES, 0)

    async def oldest_pending_at(self) -> str | None:
        return None


async def scrape(store: Any = None) -> Samples:
    return parse(await metrics.exposition(store or NoInbox()))


# ---- the hooks, at unit level --------------------------------------------------------------


async def test_observe_run_counts_the_outcome_duration_tokens_and_cost() -> None:
    before = await scrape()
    metrics.observe_run("completed", 2_500, 1_000, 200, 0.25)
    metrics.observe_run("failed", 100, 0, 0, None)
    after = await scrape()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("agentwake_agent_runs_total", outcome="completed") == 1
    assert delta("agentwake_agent_runs_total", outcome="failed") == 1
    assert delta("agentwake_agent_run_duration_seconds_count") == 2
    assert delta("agentwake_agent_run_duration_seconds_sum") == pytest.approx(2.6)
    assert delta("agentwake_agent_run_duration_seconds_bucket", le="0.5") == 1
    assert delta("agentwake_agent_run_duration_seconds_bucket", le="2.0") == 1
    assert delta("agentwake_agent_run_duration_seconds_bucket", le="5.0") == 2
    assert delta("agentwake_llm_tokens_total", kind="prompt") == 1_000
    assert delta("agentwake_llm_tokens_total", kind="completion") == 200
    assert delta("agentwake_llm_cost_usd_total") == pytest.approx(0.25)


async def test_observe_tool_call_counts_by_tool_and_outcome() -> None:
    before = await scrape()
    metrics.observe_tool_call("metrics_test_close_ticket", "ok")
    metrics.observe_tool_call("metrics_test_close_ticket", "ok")
    metrics.observe_tool_call("metrics_test_close_ticket", "refused")
    after = await scrape()
    ok = {"tool": "metrics_test_close_ticket", "outcome": "ok"}
    refused = {"tool": "metrics_test_close_ticket", "outcome": "refused"}
    assert (
        value(after, "agentwake_tool_calls_total", **ok) - value(before, "agentwake_tool_calls_total", **ok)
        == 2
    )
    assert (
        value(after, "agentwake_tool_calls_total", **refused)
        == value(before, "agentwake_tool_calls_total", **refused) + 1
    )


async def test_tool_names_past_the_cap_share_one_label(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics.observe_tool_call("metrics_test_known_tool", "ok")
    monkeypatch.setattr(metrics, "MAX_TOOL_LABELS", len(metrics._tool_labels))
    before = await scrape()
    metrics.observe_tool_call("metrics_test_hallucinated_tool", "refused")
    metrics.observe_tool_call("metrics_test_known_tool", "ok")
    after = await scrape()
    other = {"tool": metrics.OTHER_TOOL, "outcome": "refused"}
    known = {"tool": "metrics_test_known_tool", "outcome": "ok"}
    assert (
        value(after, "agentwake_tool_calls_total", **other)
        - value(before, "agentwake_tool_calls_total", **other)
        == 1
    )
    assert (
        value(after, "agentwake_tool_calls_total", **known)
        - value(before, "agentwake_tool_calls_total", **known)
        == 1
    )
    assert (
        "agentwake_tool_calls_total",
        frozenset({"tool": "metrics_test_hallucinated_tool", "outcome": "refused"}.items()),
    ) not in after


async def test_the_delivery_hooks_count_by_their_labels() -> None:
    before = await scrape()
    metrics.observe_ingest("metrics-unit", "poll", 3, 1, gap=True)
    metrics.observe_ingest("metrics-unit", "poll", 0, 0)
    metrics.observe_stream_error("metrics-unit")
    metrics.observe_reconnect("metrics-unit-server")
    metrics.observe_webhook_delivery(418)
    after = await scrape()
    assert value(after, "agentwake_events_received_total", subscription="metrics-unit", mode="poll") == 3
    assert value(after, "agentwake_events_duplicate_total", subscription="metrics-unit", mode="poll") == 1
    assert value(after, "agentwake_gaps_total", subscription="metrics-unit") == 1
    assert value(after, "agentwake_stream_errors_total", subscription="metrics-unit") == 1
    assert value(after, "agentwake_reconnects_total", server="metrics-unit-server") == 1
    assert (
        value(after, "agentwake_webhook_deliveries_total", status="418")
        - value(before, "agentwake_webhook_deliveries_total", status="418")
        == 1
    )


async def test_the_exposition_has_build_info_and_the_process_collectors() -> None:
    samples = await scrape()
    [(name, labels)] = [key for key in samples if key[0] == "agentwake_build_info"]
    assert samples[(name, labels)] == 1
    assert dict(labels)["version"]
    assert value(samples, "process_resident_memory_bytes") > 0
    assert any(name == "python_info" for name, _ in samples)
    assert any(name.startswith("python_gc_") for name, _ in samples)
    assert metrics.CONTENT_TYPE.startswith("text/plain")


# ---- the store's gauges, read at scrape -----------------------------------------------------

KEY = SubscriptionKey("tickets", "demo", "ticket.created", {})


def incoming(event_id: str) -> IncomingEvent:
    return IncomingEvent(event_id, "ticket.created", "2026-02-19T16:00:00Z", {"ticket": event_id})


async def test_inbox_gauges_and_the_oldest_pending_age_are_read_from_the_store(store: SqliteStore) -> None:
    await store.register(KEY)
    await store.ingest(KEY, [incoming("e1"), incoming("e2"), incoming("e3")], "c3")
    # e1 has waited an hour, e2 and e3 only now: the gauge shows the oldest.
    store.core.conn.execute(
        "UPDATE events SET received_at = '2000-01-01T00:00:00.000Z' WHERE event_id = 'e2'"
    )
    hour_ago = iso(utc_now() - timedelta(hours=1))
    store.core.conn.execute("UPDATE events SET received_at = ? WHERE event_id = 'e1'", [hour_ago])
    store.core.conn.commit()
    # e2 (the oldest of all) is no longer pending: it does not count.
    [e2] = [row for row in store.core.inbox(10) if row["event_id"] == "e2"]
    await store.finish([e2["id"]], "done")

    samples = await scrape(store)
    assert value(samples, "agentwake_inbox_events", state="pending") == 2
    assert value(samples, "agentwake_inbox_events", state="done") == 1
    assert value(samples, "agentwake_inbox_events", state="held") == 0
    assert 3600 <= value(samples, "agentwake_oldest_pending_age_seconds") < 3660

    pending = [row["id"] for row in store.core.inbox(10, state="pending")]
    await store.finish(pending, "done")
    samples = await scrape(store)
    assert value(samples, "agentwake_inbox_events", state="pending") == 0
    assert value(samples, "agentwake_oldest_pending_age_seconds") == 0


# ---- webhook: the real receiver over TLS on loopback ----------------------------------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLS:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
async def hook(tls: TLS, store: Store) -> AsyncIterator[Hook]:
    async with running_hook(tls, store) as running:
        yield running


async def test_webhook_deliveries_are_counted_by_status_and_their_events_by_mode(hook: Hook) -> None:
    name = KEY.name
    before = await scrape()
    assert (await hook.deliver(event("evt_1", cursor="c1"))).status == 204
    assert (await hook.deliver(event("evt_1", cursor="c1"))).status == 204  # a retry: a duplicate
    assert (await hook.deliver(event("evt_2"), secret=signing.generate_secret())).status == 401
    assert (await hook.deliver({"type": "gap", "cursor": "c9"})).status == 204
    assert (await hook.post(b"{}", {}, method="GET")).status == 405
    after = await scrape()

    def delta(metric: str, **labels: str) -> float:
        return value(after, metric, **labels) - value(before, metric, **labels)

    assert delta("agentwake_webhook_deliveries_total", status="204") == 3
    assert delta("agentwake_webhook_deliveries_total", status="401") == 1
    assert delta("agentwake_webhook_deliveries_total", status="405") == 1
    assert delta("agentwake_events_received_total", subscription=name, mode="webhook") == 1
    assert delta("agentwake_events_duplicate_total", subscription=name, mode="webhook") == 1
    assert delta("agentwake_gaps_total", subscription=name) == 1
    assert hook.store.core.event_ids(name) == ["evt_1"]


# ---- poll and push: the whole service in this process, the demo server over stdio ---------------

BACKLOG = 5


def service_config(tmp_path: Path) -> Path:
    """Two demo servers, one polled and one streamed, each with a backlog of BACKLOG tickets."""
    path = tmp_path / "agentwake.toml"
    polled = demo_server_toml(tmp_path / "poll-demo.db", name="metrics-poll-demo", DEMO_BACKLOG=str(BACKLOG))
    streamed = demo_server_toml(
        tmp_path / "push-demo.db",
        name="metrics-push-demo",
        DEMO_BACKLOG=str(BACKLOG),
        DEMO_HEARTBEAT_MS="200",
    )
    path.write_text(
        f"""
[store]
path = "{tmp_path / "aw.db"}"

{polled}
{streamed}
[[subscriptions]]
name = "metrics-polled"
server = "metrics-poll-demo"
event = "ticket.created"
delivery = "poll"

[[subscriptions]]
name = "metrics-streamed"
server = "metrics-push-demo"
event = "ticket.created"
delivery = "push"
"""
    )
    return path


async def test_the_running_service_counts_events_by_subscription_and_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentwake import service as service_module

    monkeypatch.setattr(service_module.gc, "freeze", lambda: None)  # keep this process's heap collectable
    config = load_config(service_config(tmp_path))
    # From the start of the tickets: a first run would begin at the server's head and see none.
    seeded = await SqliteStore.open(config.store.path)
    try:
        for sub in config.subscriptions:
            await set_cursor(seeded, subscription_key(sub), "0")
    finally:
        await seeded.close()

    async with anyio.create_task_group() as tg:
        supervisor: Supervisor = await tg.start(partial(run_service, config, handle_signals=False))
        running = supervisor.store
        with anyio.fail_after(30):
            while sum((await running.state_counts()).values()) < 2 * BACKLOG:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        samples = parse(await metrics.exposition(running))
        counts = await running.state_counts()
        tg.cancel_scope.cancel()

    received = "agentwake_events_received_total"
    assert value(samples, received, subscription="metrics-polled", mode="poll") == BACKLOG
    assert value(samples, received, subscription="metrics-streamed", mode="push") == BACKLOG
    assert value(samples, received, subscription="metrics-polled", mode="push") == 0
    assert value(samples, received, subscription="metrics-streamed", mode="poll") == 0
    # The gauges are the store's counts as the scrape read them (the worker may move events meanwhile).
    assert sum(value(samples, "agentwake_inbox_events", state=s) for s in EVENT_STATES) == 2 * BACKLOG
    assert sum(counts.values()) == 2 * BACKLOG
    assert value(samples, "agentwake_oldest_pending_age_seconds") >= 0


# ---- reconnects: the supervisor's retry of a server that will not start --------------------------


async def test_each_reconnect_of_a_server_is_counted(store: Store) -> None:
    server = "metrics-gone"
    config = AgentwakeConfig.model_validate(
        {
            "servers": {server: ServerConfig(command="/nonexistent/server").model_dump()},
            "subscriptions": [{"name": "metrics-orphan", "server": server, "event": "x"}],
        }
    )
    sleep = SteppedSleep()
    supervisor = Supervisor(config, store, sleep=sleep)
    async with anyio.create_task_group() as tg:
        tg.start_soon(supervisor.run)
        await sleep.next()  # the wait before the first reconnect: counted as it is decided
        first = value(await scrape(), "agentwake_reconnects_total", server=server)
        sleep.release()
        await sleep.next()
        second = value(await scrape(), "agentwake_reconnects_total", server=server)
        tg.cancel_scope.cancel()
    assert (first, second) == (1, 2)
