"""Prometheus metrics: counters the delivery loops, the receiver and the agent runner bump as things
happen, and gauges read from the store when someone scrapes.

Everything lives on this module's own ``REGISTRY`` (not prometheus_client's global one), so an
embedding program or a test that imports agentwake twice over never collides with it.
``exposition(store)`` is the whole text a ``/metrics`` endpoint answers, ``CONTENT_TYPE`` its type.

The metrics (labels stay bounded: subscriptions and servers come from the config, tools from the
configured servers, never an event id):

- ``agentwake_events_received_total{subscription,mode}``: new events stored (mode poll|push|webhook)
- ``agentwake_events_duplicate_total{subscription,mode}``: deliveries dropped as already stored
- ``agentwake_gaps_total{subscription}``: gaps recorded (a truncated batch, an expired cursor)
- ``agentwake_stream_errors_total{subscription}``: errors a push stream reported or broke on
- ``agentwake_reconnects_total{server}``: reconnects to a server (each retry after a connection
  failed, or ended, or could not be opened)
- ``agentwake_webhook_deliveries_total{status}``: webhook requests, by the HTTP status answered
- ``agentwake_webhook_delivery_active{subscription}``: 1 while the server's last ``deliveryStatus``
  said it delivers, 0 when it said suspended (no series until a refresh reported one)
- ``agentwake_webhook_delivery_error{subscription,category}``: 1 for the ``lastError`` category the
  server's last ``deliveryStatus`` reported (connection_refused, timeout, ... or unknown)
- ``agentwake_webhook_throttled{subscription}``: 1 while the server said it throttles deliveries
- ``agentwake_webhook_retry_after_seconds{subscription}``: its ``retryAfterMs`` hint, 0 if none
- ``agentwake_agent_runs_total{outcome}``: agent runs ended, by their status (completed, failed, ...)
- ``agentwake_agent_run_duration_seconds``: histogram of how long agent runs took
- ``agentwake_llm_tokens_total{kind}``: LLM tokens used by runs (kind prompt|completion)
- ``agentwake_llm_cost_usd_total``: what the runs' LLM calls cost, as litellm priced them
- ``agentwake_tool_calls_total{tool,outcome}``: MCP tool calls the agent made, by outcome
- ``agentwake_model_circuit_open{model}``: 1 while the worker's circuit breaker holds events back
  because the model keeps failing (agent.circuit_breaker_failures), else 0
- ``agentwake_paused{scope,name}``: 1 while that is paused (``agentwake pause``; scope all, server,
  subscription or rule; name empty for all), 0 once resumed
- ``agentwake_inbox_events{state}``: stored events in each state, read at scrape
- ``agentwake_oldest_pending_age_seconds``: age of the oldest pending event (0 if none), read at scrape
- ``agentwake_build_info{version}``: always 1
- ``process_*``, ``python_info``, ``python_gc_*``: prometheus_client's process and runtime collectors

On a store several processes share (PostgreSQL), every series also has ``process="<owner id>"``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from agentwake.clock import parse_iso, utc_now

if TYPE_CHECKING:
    pass

CONTENT_TYPE: Final[str] = CONTENT_TYPE_LATEST
REGISTRY: Final = CollectorRegistry()

ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

EVENTS_RECEIVED: Final = Counter(
    "agentwake_events_received",
    "New events stored, by subscription and delivery mode",
    ["subscription", "mode"],
    registry=REGISTRY,
)
EVENTS_DUPLICATE: Final = Counter(
    "agentwake_events_duplicate",
    "Deliveries dropped as already stored, by subscription and delivery mode",
    ["subscription", "mode"],
    registry=REGISTRY,
)
GAPS: Final = Counter(
    "agentwake_gaps", "Gaps recorded (truncated batch, expired cursor)", ["subscription"], registry=REGISTRY
)
STREAM_ERRORS: Final = Counter(
    "agentwake_stream_errors", "Errors of push streams", ["subscription"], registry=REGISTRY
)
RECONNECTS: Final = Counter(
    "agentwake_reconnects",
    "Reconnects to a server after a failed or ended connection",
    ["server"],
    registry=REGISTRY,
)
WEBHOOK_DELIVERIES: Final = Counter(
    "agentwake_webhook_deliveries",
    "Webhook requests received, by the HTTP status answered",
    ["status"],
    registry=REGISTRY,
)
WEBHOOK_IDENTITY_KEYS: Final = Gauge(
    "agentwake_webhook_identity_keys",
    "Identity keys (ed25519) known for a server whose deliveries are checked for v1a; 0 until fetched",
    ["server", "mode"],
    registry=REGISTRY,
)
WEBHOOK_IDENTITY_VERIFIED: Final = Counter(
    "agentwake_webhook_identity_verified",
    "Webhook requests whose v1a signature verified under the server's published key",
    ["server"],
    registry=REGISTRY,
)
WEBHOOK_IDENTITY_REFUSED: Final = Counter(
    "agentwake_webhook_identity_refused",
    "Webhook requests refused (401) for their server identity: invalid (a v1a that does not verify),"
    " missing (no v1a, under require), no_keys (the server's JWKS could not be had)",
    ["server", "reason"],
    registry=REGISTRY,
)
WEBHOOK_DELIVERY_ACTIVE: Final = Gauge(
    "agentwake_webhook_delivery_active",
    "1 while the server's last deliveryStatus said it delivers, 0 when suspended",
    ["subscription"],
    registry=REGISTRY,
)
WEBHOOK_DELIVERY_ERROR: Final = Gauge(
    "agentwake_webhook_delivery_error",
    "1 for the lastError category of the server's last deliveryStatus",
    ["subscription", "category"],
    registry=REGISTRY,
)
WEBHOOK_THROTTLED: Final = Gauge(
    "agentwake_webhook_throttled",
    "1 while the server's last deliveryStatus said it throttles deliveries",
    ["subscription"],
    registry=REGISTRY,
)
WEBHOOK_RETRY_AFTER: Final = Gauge(
    "agentwake_webhook_retry_after_seconds",
    "The retryAfterMs hint of the server's last deliveryStatus, in seconds (0 if none)",
    ["subscription"],
    registry=REGISTRY,
)
AGENT_RUNS: Final = Counter(
    "agentwake_agent_runs", "Agent runs ended, by status", ["outcome"], registry=REGISTRY
)
AGENT_RUN_DURATION: Final = Histogram(
    "agentwake_agent_run_duration_seconds",
    "How long agent runs took",
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
    registry=REGISTRY,
)
# kind: prompt, completion, and cached (the prompt tokens read from the provider's prompt cache).
LLM_TOKENS: Final = Counter("agentwake_llm_tokens", "LLM tokens used by runs", ["kind"], registry=REGISTRY)
LLM_COST: Final = Counter("agentwake_llm_cost_usd", "Cost of the runs' LLM calls in USD", registry=REGISTRY)
TOOL_CALLS: Final = Counter(
    "agentwake_tool_calls", "MCP tool calls made by the agent", ["tool", "outcome"], registry=REGISTRY
)
SUBSCRIPTION_HELD_BACK: Final = Gauge(
    "agentwake_subscription_held_back",
    "1 while a subscription's delivery is held back (limits.max_undecided_events undecided events), else 0",
    ["subscription"],
    registry=REGISTRY,
)
PAUSED: Final = Gauge(
    "agentwake_paused",
    "1 while runs are paused for this scope and name (agentwake pause), else 0",
    ["scope", "name"],
    registry=REGISTRY,
)
MODEL_CIRCUIT_OPEN: Final = Gauge(
    "agentwake_model_circuit_open",
    "1 while the agent waits because the model keeps failing (circuit breaker open), else 0",
    ["model"],
    registry=REGISTRY,
)
INBOX_EVENTS: Final = Gauge(
    "agentwake_inbox_events", "Stored events in each state (read at scrape)", ["state"], registry=REGISTRY
)
OLDEST_PENDING_AGE: Final = Gauge(
    "agentwake_oldest_pending_age_seconds",
    "Age of the oldest pending event, 0 if none (read at scrape)",
    registry=REGISTRY,
)
BUILD_INFO: Final = Gauge(
    "agentwake_build_info", "agentwake's version; always 1", ["version"], registry=REGISTRY
)

# A model can ask for a tool no server offers; past this many names the rest share one label.
MAX_TOOL_LABELS: Final = 500
OTHER_TOOL: Final = "_other"
# Every call to a tool the event does not allow counts under this one label, whatever name the model chose.
REFUSED_TOOL: Final = "_not_allowed"
_tool_labels: set[str] = set()
_webhook_children: dict[int, Any] = {}
_error_labels: set[tuple[str, str]] = set()
_build_info_set = False


class InboxView(Protocol):
    """What ``exposition`` reads from the store (agentwake.store.Store has it)."""

    async def state_counts(self) -> dict[str, int]: ...

    async def oldest_pending_at(self) -> str | None: ...


# ---- hooks: one call where the thing happens -------------------------------------------------


def observe_ingest(
    subscription: str, mode: str, inserted: int, duplicates: int, *, gap: bool = False
) -> None:
    """An ingest's result: ``inserted`` new events stored, ``duplicates`` dropped, whether it made a gap."""
    if inserted:
        EVENTS_RECEIVED.labels(subscription, mode).inc(inserted)
    if duplicates:
        EVENTS_DUPLICATE.labels(subscription, mode).inc(duplicates)
    if gap:
        GAPS.labels(subscription).inc()


def observe_gap(subscription: str) -> None:
    GAPS.labels(subscription).inc()


def observe_stream_error(subscription: str) -> None:
    STREAM_ERRORS.labels(subscription).inc()


def observe_reconnect(server: str) -> None:
    RECONNECTS.labels(server).inc()


def observe_webhook_delivery(status: int) -> None:
    """A webhook request answered with ``status``; on the receiver's hot path, so the child is cached."""
    child = _webhook_children.get(status)
    if child is None:
        child = _webhook_children[status] = WEBHOOK_DELIVERIES.labels(str(status))
    child.inc()


def observe_identity_keys(server: str, mode: str, count: int) -> None:
    WEBHOOK_IDENTITY_KEYS.labels(server, mode).set(count)


def observe_identity(server: str, refused: str | None) -> None:
    """A webhook request's identity check: verified (``refused`` None), or refused for that reason."""
    if refused is None:
        WEBHOOK_IDENTITY_VERIFIED.labels(server).inc()
    else:
        WEBHOOK_IDENTITY_REFUSED.labels(server, refused).inc()


def observe_delivery_status(subscription: str, status: dict[str, Any] | None) -> None:
    """A webhook refresh's deliveryStatus (active, lastError as a category, throttled, retryAfterMs);
    None: the server sent none, so nothing is known and the series are removed."""
    for gauge in (WEBHOOK_DELIVERY_ACTIVE, WEBHOOK_THROTTLED, WEBHOOK_RETRY_AFTER):
        with contextlib.suppress(KeyError):  # no series yet
            gauge.remove(subscription)
    stale = [labels for labels in _error_labels if labels[0] == subscription]
    for labels in stale:
        _error_labels.discard(labels)
        WEBHOOK_DELIVERY_ERROR.remove(*labels)
    if status is None:
        return
    WEBHOOK_DELIVERY_ACTIVE.labels(subscription).set(1 if status.get("active", True) else 0)
    WEBHOOK_THROTTLED.labels(subscription).set(1 if status.get("throttled") else 0)
    retry_after_ms = status.get("retryAfterMs")
    WEBHOOK_RETRY_AFTER.labels(subscription).set(max(retry_after_ms or 0, 0) / 1000)
    category = status.get("lastError")
    if category:
        _error_labels.add((subscription, category))
        WEBHOOK_DELIVERY_ERROR.labels(subscription, category).set(1)


def observe_run(
    status: str,
    duration_ms: int,
    prompt_tokens: int,
    completion_tokens: int,
    cost_usd: float | None,
    cached_tokens: int = 0,
) -> None:
    """An agent run that ended with ``status`` (a RunStatus); a cost of None is one litellm could not price.

    ``cached_tokens``: of the prompt tokens, those read from the provider's prompt cache (kind "cached";
    they are counted in "prompt" too)."""
    AGENT_RUNS.labels(status).inc()
    AGENT_RUN_DURATION.observe(max(duration_ms, 0) / 1000)
    if prompt_tokens > 0:
        LLM_TOKENS.labels("prompt").inc(prompt_tokens)
    if completion_tokens > 0:
        LLM_TOKENS.labels("completion").inc(completion_tokens)
    if cached_tokens > 0:
        LLM_TOKENS.labels("cached").inc(cached_tokens)
    if cost_usd is not None and cost_usd > 0:
        LLM_COST.inc(cost_usd)


def observe_held_back(subscription: str, held: bool) -> None:
    """A subscription's delivery was held back (too many of its events wait undecided) or let go."""
    SUBSCRIPTION_HELD_BACK.labels(subscription).set(1 if held else 0)


def observe_paused(scope: str, name: str, paused: bool) -> None:
    """Something was paused (no run starts for it) or resumed."""
    PAUSED.labels(scope, name).set(1 if paused else 0)


def observe_model_circuit(model: str, is_open: bool) -> None:
    """The worker's circuit breaker on ``model`` opened (events wait) or closed (the model answers)."""
    MODEL_CIRCUIT_OPEN.labels(model).set(1 if is_open else 0)


def observe_tool_call(tool: str, outcome: str) -> None:
    """A tool call the agent made; ``outcome`` is its ToolCallStatus (ok, error, refused, planned)."""
    if tool not in _tool_labels:
        if len(_tool_labels) >= MAX_TOOL_LABELS:
            tool = OTHER_TOOL
        else:
            _tool_labels.add(tool)
    TOOL_CALLS.labels(tool, outcome).inc()


# ---- the scrape ------------------------------------------------------------------------------


class _Labelled:
    """``registry``'s metrics with ``labels`` added to every sample (what generate_latest reads)."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        self.registry = registry
        self.labels = labels

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            # A copy: some collectors hand out the same family every time (python_info).
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [
                sample._replace(labels={**sample.labels, **self.labels}) for sample in family.samples
            ]
            yield labelled


async def exposition(store: InboxView, *, process: str | None = None) -> bytes:
    """The text exposition of every metric, with the store's gauges read now.

    With ``process`` (on a store several processes share), every series carries the label
    ``process`` with it (the owner id ``status`` shows as driven_by), so the processes' series
    stay apart however they are scraped. The inbox gauges are the whole store's, in each.
    A StoreError from reading the store propagates: the caller answers the scrape with an error.
    """
    counts = await store.state_counts()
    oldest = await store.oldest_pending_at()
    # No await from here on: concurrent scrapes each publish a consistent set.
    for state, count in counts.items():
        INBOX_EVENTS.labels(state).set(count)
    age = 0.0
    if oldest is not None and (received := parse_iso(oldest)) is not None:
        age = max((utc_now() - received).total_seconds(), 0.0)
    OLDEST_PENDING_AGE.set(age)
    _set_build_info()
    if process is not None:
        return generate_latest(_Labelled(REGISTRY, {"process": process}))
    return generate_latest(REGISTRY)


def _set_build_info() -> None:
    global _build_info_set
    if _build_info_set:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        current = version("agentwake")
    except PackageNotFoundError:
        current = "unknown"
    BUILD_INFO.labels(current).set(1)
    _build_info_set = True
