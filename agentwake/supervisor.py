"""Wiring: one task per server (connect, discover, run its subscriptions' loops), and the processing stage.

Everything runs in one anyio task group; cancelling it is the only way anything
stops. A server that cannot be reached, or whose connection breaks, is retried
with exponential backoff and jitter; it never takes the others down. A
subscription the server refuses (unknown event, Forbidden) ends alone.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

import anyio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_never,
    wait_exponential_jitter,
)

from agentwake import protocol
from agentwake.agent.runner import retry_at
from agentwake.config import OFFLINE_MODEL, OFFLINE_NOTICE, AgentwakeConfig, SubscriptionConfig
from agentwake.delivery.poll import PollLoop, Sleep, subscription_key
from agentwake.delivery.push import PushLoop
from agentwake.delivery.receiver import Receiver, WebhookRoutes
from agentwake.delivery.select import SubscriptionPlan, plan_subscription
from agentwake.delivery.webhook import WebhookLoop, bind_route
from agentwake.errors import (
    AgentwakeError,
    ConfigError,
    ConnectError,
    ConnectionLost,
    DeliveryError,
    EventsCallError,
    SubscriptionEnded,
    TransientEventsError,
)
from agentwake.mcp import ServerConnection
from agentwake.policy import MISSING, Decision, Policy, Rule, lookup
from agentwake.store import FlowGate, InboxEvent, Store, SubscriptionKey

if TYPE_CHECKING:
    from agentwake.agent.runner import AgentRunner
    from agentwake.agent.tools import ConnectionPool

logger = logging.getLogger(__name__)

RECONNECT_INITIAL_S: Final = 1.0
RECONNECT_MAX_S: Final = 60.0
CLAIM_BATCH: Final = 100
IDLE_RECHECK_S: Final = 5.0
SERVER_WAIT_S: Final = 5.0
RULE_BUSY_S: Final = 1.0

Processor = Callable[[InboxEvent], None]


def log_event(event: InboxEvent) -> None:
    """The processing stage of this release: record that the event arrived. The agent replaces it."""
    logger.info(
        "event %s %s from %s (subscription %s): %s",
        event.name,
        event.event_id,
        event.server,
        event.subscription,
        _preview(event.data),
    )


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def iso_at(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def flow_key(view: dict[str, object], path: str | None) -> str:
    """The value a rule counts by, as text; one shared key when the rule names none."""
    if path is None:
        return "*"
    value = lookup(view, path)
    if value is MISSING:
        return "(missing)"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def gate_window(rule: Rule) -> float:
    return rule.debounce.window_s if rule.debounce else 0.0


def apply_hook_answer(decision: Decision, answer: object) -> Decision:
    """A hook returns None (keep the rule's decision), an action name, or a dict of action/why/tools."""
    if answer is None:
        return decision
    if isinstance(answer, str):
        answer = {"action": answer}
    if not isinstance(answer, dict):
        raise TypeError(f"a hook returns None, an action name or a dict, not {type(answer).__name__}")
    action = answer.get("action", decision.action)
    if action not in ("ignore", "log", "agent", "approve"):
        raise ValueError(f"a hook returned the unknown action {action!r}")
    tools = answer.get("tools", decision.tools)
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, str) for t in tools)):
        raise TypeError("a hook's 'tools' must be a list of globs")
    why = str(answer.get("why") or f"hook chose {action}")
    return replace(decision, action=action, why=f"{decision.why}; {why}", tools=tools)


def policy_view(event: InboxEvent, injection_score: float) -> dict[str, object]:
    """What policy conditions can look at: the event's envelope, its (raw) data, and the injection score."""
    return {
        "server": event.server,
        "subscription": event.subscription,
        "name": event.name,
        "event_id": event.event_id,
        "timestamp": event.timestamp,
        "data": event.data,
        "injection_score": injection_score,
    }


def _preview(data: dict[str, object], limit: int = 160) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in data.items())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Supervisor:
    config: AgentwakeConfig
    store: Store
    process: Processor = log_event
    sleep: Sleep = anyio.sleep
    reconnect_initial_s: float = RECONNECT_INITIAL_S
    reconnect_max_s: float = RECONNECT_MAX_S
    processing: bool = True
    agent: AgentRunner | None = None
    pool: ConnectionPool | None = None
    policy: Policy = field(default_factory=Policy)
    _wake: anyio.Event = field(default_factory=anyio.Event, init=False)
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    _slot_freed: anyio.Event = field(default_factory=anyio.Event, init=False)
    _active: int = field(default=0, init=False)
    _rule_active: dict[str, int] = field(default_factory=dict, init=False)
    _ended: set[str] = field(default_factory=set, init=False)
    _ends: anyio.Event = field(default_factory=anyio.Event, init=False)
    routes: WebhookRoutes = field(default_factory=WebhookRoutes)
    receiver: Receiver | None = field(default=None, init=False)

    def subscriptions_of(self, server: str) -> list[SubscriptionConfig]:
        return [s for s in self.config.subscriptions if s.server == server and s.name not in self._ended]

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        for sub in self.config.subscriptions:
            await self.store.register(subscription_key(sub))
        await self._retire_unconfigured_webhooks()
        cleanup = {retired.server for retired in await self.store.to_unsubscribe()}
        for server in sorted(cleanup - set(self.config.servers)):
            logger.warning(
                "server %s is no longer configured: its webhook subscriptions cannot be unsubscribed and"
                " lapse at their TTL; their deliveries are refused (410)",
                server,
            )
        async with anyio.create_task_group() as tg:
            if self.config.webhook is not None:
                await self._load_routes()
                self.receiver = Receiver(
                    self.config.webhook,
                    self.store,
                    self.routes,
                    on_new_events=self._notify_new,
                    on_terminated=self._on_terminated,
                )
                # Listening before any subscribe: the server verifies the endpoint during it.
                await tg.start(self.receiver.serve)
            for server in self.config.servers:
                if self.subscriptions_of(server) or server in cleanup:
                    tg.start_soon(self._server_forever, server, name=f"server:{server}")
            if self.processing and self.agent is not None:
                tg.start_soon(self._agent_forever, self.agent, name="agent")
            elif self.processing:
                tg.start_soon(self._process_forever, name="processing")
            task_status.started()

    # ---- webhook bookkeeping ----------------------------------------------------

    async def _retire_unconfigured_webhooks(self) -> None:
        """Webhook subscriptions whose subscription left the config (or moved) are retired, to be unsubscribed.

        A restart with the same config retires nothing: the refresh picks up where it was.
        """
        configured = {s.name: s for s in self.config.subscriptions}
        for record in await self.store.webhooks():
            sub = configured.get(record.subscription)
            if sub is None:
                reason = "removed from the config"
            elif self.config.webhook is None:
                reason = "the config has no [webhook] section any more"
            elif not record.same_key(subscription_key(sub), self.config.webhook.callback_url(sub.name)):
                reason = "its server, event, arguments or callback url changed"
            else:
                continue
            await self._retire(record.subscription, reason)

    async def _retire(self, name: str, reason: str, *, unsubscribed: bool = False) -> None:
        record = await self.store.retire_webhook(name, reason, unsubscribed=unsubscribed)
        self.routes.unbind(name)
        if record is not None and record.webhook_id is not None:
            self.routes.retire(record.webhook_id)
        if record is not None and not unsubscribed:
            logger.info("subscription %s: webhook subscription retired (%s); unsubscribing it", name, reason)

    async def _load_routes(self) -> None:
        for record in await self.store.webhooks():
            bind_route(
                self.routes,
                SubscriptionKey(record.subscription, record.server, record.event, record.arguments),
                record,
            )
        for webhook_id in await self.store.retired_webhook_ids():
            self.routes.retire(webhook_id)

    async def _on_terminated(self, name: str, error: dict[str, object]) -> None:
        """A ``terminated`` envelope: the server dropped the subscription; it ends here too."""
        data = error.get("data")
        detail = data.get("reason") if isinstance(data, dict) else None
        reason = f"{error.get('message') or 'terminated'} ({error.get('code')})" + (
            f": {detail}" if detail else ""
        )
        await self._retire(name, f"terminated by the server: {reason}", unsubscribed=True)
        sub = next((s for s in self.config.subscriptions if s.name == name), None)
        if sub is not None:
            await self._end(sub, f"the server ended the webhook subscription: {reason}")
        self.routes.end(name, reason)

    async def _unsubscribe_stale(
        self, server: str, conn: ServerConnection, plans: list[SubscriptionPlan]
    ) -> None:
        """Retire this server's webhook subscriptions that no planned subscription uses, then unsubscribe them."""
        webhook = self.config.webhook
        planned = {p.subscription.name: p.subscription for p in plans if p.mode == "webhook"}
        for record in await self.store.webhooks():
            if record.server != server:
                continue
            sub = planned.get(record.subscription)
            if sub is None:
                await self._retire(record.subscription, "the subscription no longer uses webhook delivery")
            elif webhook is not None and not record.same_key(
                subscription_key(sub), webhook.callback_url(sub.name)
            ):
                await self._retire(record.subscription, "its event, arguments or callback url changed")
        for retired in await self.store.to_unsubscribe(server):
            try:
                await conn.unsubscribe(
                    retired.event, retired.arguments, retired.url, subscription=retired.subscription
                )
            except TransientEventsError as exc:
                logger.warning(
                    "subscription %s: events/unsubscribe failed, retrying later: %s",
                    retired.subscription,
                    exc,
                )
                continue
            except EventsCallError as exc:
                if exc.code != protocol.NOT_FOUND:
                    logger.warning(
                        "subscription %s: events/unsubscribe refused (%s); it lapses at its TTL, or, if it"
                        " was granted no expiry, stays until it is removed on the server",
                        retired.subscription,
                        exc,
                    )
            else:
                logger.info(
                    "subscription %s: webhook unsubscribed on server %s (%s)",
                    retired.subscription,
                    server,
                    retired.url,
                )
            await self.store.mark_unsubscribed(retired.id)

    # ---- delivery --------------------------------------------------------------

    async def _server_forever(self, server: str) -> None:
        async def note(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            delay = state.next_action.sleep if state.next_action else 0.0
            logger.warning("%s; reconnecting in %.1fs", exc, delay)
            for sub in self.subscriptions_of(server):
                await self.store.record_error(sub.name, str(exc))

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(DeliveryError),
            wait=wait_exponential_jitter(
                multiplier=self.reconnect_initial_s, max=self.reconnect_max_s, jitter=self.reconnect_initial_s
            ),
            stop=stop_never,
            sleep=self.sleep,
            before_sleep=note,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self._serve_connection(server)
                if not self.subscriptions_of(server):
                    logger.warning("server %s: no subscription left running", server)
                    return
                # The connection ended without an error (the server closed its side): reconnect.
                raise ConnectionLost(f"server {server!r}: connection ended", server=server)

    async def _serve_connection(self, server: str) -> None:
        holder = {"relist": anyio.Event(), "tools": anyio.Event()}

        async def on_list_changed() -> None:
            holder["relist"].set()

        async def on_tools_changed() -> None:
            holder["tools"].set()

        async with ServerConnection(
            server,
            self.config.servers[server],
            on_list_changed=on_list_changed,
            on_tools_changed=on_tools_changed,
        ) as conn:
            if self.pool is not None:
                await self.pool.attach(conn)
            try:
                await self._serve_subscriptions(server, conn, holder)
            finally:
                if self.pool is not None:
                    self.pool.detach(server)

    async def _serve_subscriptions(
        self, server: str, conn: ServerConnection, holder: dict[str, anyio.Event]
    ) -> None:
        try:
            await self._serve_listing(server, conn, holder)
        except BaseExceptionGroup as group:
            # A loop's ConnectionLost comes out of the task group wrapped; unwrapped, the reconnect
            # retry (which matches DeliveryError) sees it. Anything else propagates as it is.
            delivery = group.subgroup(DeliveryError)
            if delivery is None:
                raise
            raise _first_leaf(delivery) from None

    async def _serve_listing(
        self, server: str, conn: ServerConnection, holder: dict[str, anyio.Event]
    ) -> None:
        while True:
            descriptors = {d.name: d for d in await conn.list_events()}
            async with anyio.create_task_group() as tg:
                if self.pool is not None:
                    tg.start_soon(self._watch_tools, conn, holder, name=f"tools:{server}")
                plans: list[SubscriptionPlan] = []
                for sub in self.subscriptions_of(server):
                    try:
                        plans.append(
                            plan_subscription(sub, descriptors, receiver=self.config.webhook is not None)
                        )
                    except ConfigError as exc:
                        await self._end(sub, str(exc))
                await self._unsubscribe_stale(server, conn, plans)
                running = 0
                for plan in plans:
                    sub = plan.subscription
                    loop: PollLoop | PushLoop | WebhookLoop
                    if plan.mode == "webhook":
                        assert self.config.webhook is not None
                        loop = WebhookLoop(
                            sub,
                            conn,
                            self.store,
                            self.routes,
                            self.config.webhook,
                            on_new_events=self._notify_new,
                        )
                    elif plan.mode == "push":
                        loop = PushLoop(
                            sub, conn, self.store, on_new_events=self._notify_new, sleep=self.sleep
                        )
                    else:
                        loop = PollLoop(
                            sub, conn, self.store, on_new_events=self._notify_new, sleep=self.sleep
                        )
                    tg.start_soon(self._run_loop, loop, plan.mode, name=f"{plan.mode}:{sub.name}")
                    running += 1
                if not running:
                    tg.cancel_scope.cancel()
                    return
                await holder["relist"].wait()
                logger.info("server %s: event types changed; listing them again", server)
                holder["relist"] = anyio.Event()
                tg.cancel_scope.cancel()

    async def _watch_tools(self, conn: ServerConnection, holder: dict[str, anyio.Event]) -> None:
        """Refresh the server's tools when it says they changed (either protocol generation)."""
        assert self.pool is not None
        pool = self.pool
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._listen_tools, conn, holder)
            while True:
                await holder["tools"].wait()
                holder["tools"] = anyio.Event()
                logger.info("server %s: tools changed; listing them again", conn.name)
                await pool.refresh(conn.name)

    async def _listen_tools(self, conn: ServerConnection, holder: dict[str, anyio.Event]) -> None:
        # 2026-07-28 servers announce changes on a subscriptions/listen stream, not a notification.
        try:
            async with conn.client.listen(tools_list_changed=True) as changes:
                # A change between the first listing and this stream's start would be missed: list once more.
                holder["tools"].set()
                async for _change in changes:
                    holder["tools"].set()
        except (
            Exception
        ) as exc:  # not offered (older protocol, or the server declines): the notification path stays
            logger.debug("server %s: no tools change stream: %s", conn.name, exc)

    async def _run_loop(self, loop: PollLoop | PushLoop | WebhookLoop, mode: protocol.DeliveryMode) -> None:
        try:
            await loop.run()
        except SubscriptionEnded as exc:
            await self._end(loop.subscription, str(exc))
        except EventsCallError as exc:
            if isinstance(exc, TransientEventsError):
                raise
            # InvalidParams, Unsupported and the like: retrying cannot help this subscription.
            await self._end(loop.subscription, str(exc))

    async def _end(self, sub: SubscriptionConfig, reason: str) -> None:
        if sub.name in self._ended:
            return
        logger.error("subscription %s stopped: %s", sub.name, reason)
        self._ended.add(sub.name)
        await self.store.set_state(sub.name, status="ended", error=reason)
        ended, self._ends = self._ends, anyio.Event()
        ended.set()

    async def wait_ended(self, name: str) -> None:
        """Return once subscription ``name`` has stopped for good (refused, terminated, invalid)."""
        while name not in self._ended:
            await self._ends.wait()

    # ---- processing --------------------------------------------------------------

    def _notify_new(self, count: int) -> None:
        self._wake.set()

    async def _agent_forever(self, agent: AgentRunner) -> None:
        """Claim pending events as run slots free up, and run the agent on each, ``concurrency`` at a time."""
        requeued = await self.store.requeue_interrupted()
        if requeued:
            logger.info("agent: %d event(s) interrupted by a previous stop run again", requeued)
        models = {agent.agent.model, *(s.model for s in self.config.subscriptions if s.model)}
        if OFFLINE_MODEL in models:
            logger.warning("agent: %s", OFFLINE_NOTICE)
        limit = agent.agent.concurrency
        async with anyio.create_task_group() as tg:
            # litellm takes seconds to import; load it in a worker thread now, not on the first event.
            from agentwake.agent.llm import load_litellm_async

            tg.start_soon(load_litellm_async, name="load-litellm")
            while True:
                free = limit - self._active
                if free <= 0:
                    await self._slot_freed.wait()
                    self._slot_freed = anyio.Event()
                    continue
                batch = await self.store.claim(free, iso_at(self.clock()))
                if not batch:
                    with anyio.move_on_after(IDLE_RECHECK_S):
                        await self._wake.wait()
                    self._wake = anyio.Event()
                    continue
                for event in batch:
                    self._active += 1
                    tg.start_soon(self._agent_one, agent, event, name=f"agent:{event.event_id}")

    async def _agent_one(self, agent: AgentRunner, event: InboxEvent) -> None:
        try:
            sub = next((s for s in self.config.subscriptions if s.name == event.subscription), None)
            if sub is not None and not sub.agent:
                self.process(event)
                await self.store.finish([event.id], "done")
                return
            cleaned = agent.renderer.clean(event.data)
            decision = self._resumed(event)
            fresh = decision is None
            if decision is None:
                view = policy_view(event, cleaned.injection_score)
                decision = await self._hook(self.policy.decide(view), view)
            rule = decision.source or self.policy.rule(decision.rule)
            if (
                decision.action == "agent"
                and rule is not None
                and rule.max_concurrent
                and self._rule_active.get(rule.name, 0) >= rule.max_concurrent
            ):
                # At the rule's limit: back to the inbox, not an attempt, before any flow-control mark
                # is taken; another rule's events go meanwhile.
                await self.store.release(event.id, iso_at(self.clock() + timedelta(seconds=RULE_BUSY_S)))
                return
            if fresh:
                record = {**decision.to_record(), "injection_score": cleaned.injection_score}
                if await self._ends_here(event, decision, record):
                    return
            if rule is not None and rule.redact_pii and not self.config.sanitize.redact_pii:
                cleaned = agent.renderer.clean(event.data, pii=True)
            server = self.config.servers.get(event.server)
            # Its tools come with its connection; without them the run could not act as allowed.
            if (
                self.pool is not None
                and server is not None
                and not await self.pool.wait_for(event.server, server.connect_timeout_s)
            ):
                logger.warning(
                    "event %s waits: server %s is not connected, so its tools are not available",
                    event.event_id,
                    event.server,
                )
                await self.store.release(event.id, retry_at(1, SERVER_WAIT_S))
                return
            batch = (
                await self.store.batch_members(event.id) if (event.decision or {}).get("batch_leader") else []
            )
            rule_name = rule.name if rule else decision.rule
            self._rule_active[rule_name] = self._rule_active.get(rule_name, 0) + 1
            try:
                await agent.run(event, rule=decision, cleaned=cleaned, batch=batch)
            finally:
                self._rule_active[rule_name] -= 1
        except AgentwakeError as exc:
            logger.error("event %s failed: %s", event.event_id, exc)
            await self.store.finish([event.id], "failed", str(exc))
        except Exception as exc:  # a bug must cost this event, not the service
            logger.exception("event %s failed unexpectedly", event.event_id)
            await self.store.finish([event.id], "failed", f"unexpected error: {type(exc).__name__}: {exc}")
        finally:
            self._active -= 1
            self._slot_freed.set()

    def _resumed(self, event: InboxEvent) -> Decision | None:
        """The stored decision of an event already decided: approved by a person, or a batch due now."""
        stored = event.decision
        if not stored or not (event.approved or stored.get("batch_leader")):
            return None
        why = str(stored.get("why"))
        if event.approved:
            why = f"approved by a person; held by: {why}"
        return Decision(
            action="agent",
            rule=str(stored.get("rule") or "default"),
            why=why,
            where=stored.get("where"),
            tools=stored.get("rule_tools"),
            prompt=stored.get("prompt"),
            model=stored.get("model"),
            priority=int(stored.get("priority") or 0),
        )

    async def _hook(self, decision: Decision, view: dict[str, object]) -> Decision:
        rule = decision.source
        if rule is None or rule.hook is None:
            return decision
        hook = self.policy.hooks.get(rule.name)
        try:
            if hook is None:
                raise RuntimeError(f"hook {rule.hook} is not loaded")
            with anyio.fail_after(rule.hook_timeout_s):
                answer = await anyio.to_thread.run_sync(hook, dict(view), abandon_on_cancel=True)
            return apply_hook_answer(decision, answer)
        except Exception as exc:  # the hook is user code: any failure means the rule's fallback
            reason = "timed out" if isinstance(exc, TimeoutError) else f"failed: {type(exc).__name__}: {exc}"
            logger.warning(
                "rule %s: hook %s %s; using the fallback action %s",
                rule.name,
                rule.hook,
                reason,
                rule.fallback,
            )
            return replace(
                decision, action=rule.fallback, why=f"{decision.why}; hook {reason}, fallback {rule.fallback}"
            )

    async def _ends_here(self, event: InboxEvent, decision: Decision, record: dict[str, object]) -> bool:
        """Apply ignore / log / approve and the rule's flow control; True when the agent does not run now."""
        if decision.action == "ignore":
            logger.info("event %s ignored by rule %s: %s", event.event_id, decision.rule, decision.why)
            await self.store.decide(event.id, record, "ignored")
            return True
        if decision.action == "log":
            self.process(event)
            await self.store.decide(event.id, record, "done")
            return True
        if decision.action == "approve":
            logger.warning(
                "event %s held for approval by rule %s (%s): agentwake approve %s, or deny it",
                event.event_id,
                decision.rule,
                decision.why,
                event.event_id,
            )
            await self.store.decide(event.id, record, "held")
            return True
        rule = decision.source
        if rule is None or not (rule.dedup or rule.rate_limit or rule.debounce):
            return False
        score = record.get("injection_score")
        view = policy_view(event, score if isinstance(score, float) else 0.0)
        now = self.clock()
        gate = FlowGate(now=iso_at(now))
        if rule.dedup:
            gate = replace(
                gate,
                dedup_key=flow_key(view, rule.dedup.key),
                dedup_since=iso_at(now - timedelta(seconds=rule.dedup.window_s)),
            )
        if rule.rate_limit:
            gate = replace(
                gate,
                rate_key=flow_key(view, rule.rate_limit.key),
                rate_since=iso_at(now - timedelta(seconds=rule.rate_limit.window_s)),
                rate_max=rule.rate_limit.max,
            )
        if rule.debounce:
            gate = replace(
                gate,
                batch_key=flow_key(view, rule.debounce.key),
                batch_since=iso_at(now - timedelta(seconds=rule.debounce.window_s)),
                batch_due=iso_at(now + timedelta(seconds=rule.debounce.window_s)),
                batch_max=rule.debounce.max_events,
            )
        outcome = await self.store.flow_gate(event.id, rule.name, record, gate)
        if outcome.verdict == "run":
            return False
        if outcome.verdict == "duplicate":
            assert rule.dedup is not None
            why = (
                f"duplicate: {rule.dedup.key} was seen in event {outcome.other_event_id} (row {outcome.other})"
                f" within {rule.dedup.window_s:g}s"
            )
            logger.info("event %s ignored by rule %s: %s", event.event_id, rule.name, why)
            await self.store.decide(event.id, {**record, "why": why}, "ignored")
        elif outcome.verdict == "over_limit":
            assert rule.rate_limit is not None
            limit = rule.rate_limit
            why = f"over the rate limit of {limit.max} per {limit.window_s:g}s" + (
                f" for {limit.key}" if limit.key else ""
            )
            if limit.over_limit == "delay" and outcome.oldest:
                start = parse_iso(outcome.oldest) or now
                when = iso_at(start + timedelta(seconds=limit.window_s))
                logger.info("event %s waits until %s: %s", event.event_id, when, why)
                await self.store.release(event.id, when)
            elif limit.over_limit == "ignore":
                logger.info("event %s ignored by rule %s: %s", event.event_id, rule.name, why)
                await self.store.decide(event.id, {**record, "why": why}, "ignored")
            else:
                self.process(event)
                await self.store.decide(event.id, {**record, "action": "log", "why": why}, "done")
        elif outcome.verdict == "batched":
            logger.info(
                "event %s joins the batch of event row %s (rule %s)", event.event_id, outcome.other, rule.name
            )
        else:
            logger.info(
                "event %s opens a batch (rule %s); it runs in %gs",
                event.event_id,
                rule.name,
                gate_window(rule),
            )
        return True

    async def _process_forever(self) -> None:
        requeued = await self.store.requeue_interrupted()
        if requeued:
            logger.info("processing: %d event(s) interrupted by a previous stop go again", requeued)
        while True:
            batch = await self.store.claim(CLAIM_BATCH)
            if not batch:
                with anyio.move_on_after(IDLE_RECHECK_S):
                    await self._wake.wait()
                self._wake = anyio.Event()
                continue
            done: list[int] = []
            for event in batch:
                try:
                    self.process(event)
                except AgentwakeError as exc:
                    logger.error("event %s failed: %s", event.event_id, exc)
                    await self.store.finish([event.id], "failed", str(exc))
                    continue
                done.append(event.id)
            await self.store.finish(done, "done")


__all__ = ["ConnectError", "Supervisor", "log_event"]
