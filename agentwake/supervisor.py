"""Wiring: one task per server (connect, discover, run its subscriptions' delivery loops), and the worker.

Everything runs in one anyio task group; cancelling it is the only way anything
stops (``stop_delivery`` first ends the delivery loops on their open connections, so
that a stop cancels open push streams on their servers). A server that cannot be
reached, or whose connection breaks, is retried with exponential backoff and
jitter, capped at RECONNECT_MAX_S (5 s) so that a long outage costs at most a few seconds
after the server is back; it never takes the others down. A subscription the server refuses
(unknown event, Forbidden) ends alone. What happens to a stored event is the
worker's business (``agentwake.worker``), not this module's: the loops only wake it.
Each loop runs only while this process holds its subscription (``agentwake.ownership``: several
processes may share a PostgreSQL store).

Connecting, planning and reloading share the task group and the scopes, so they stay here. The
webhook bookkeeping (retiring webhook subscriptions, unsubscribing them) is a mixin of its own
(``agentwake.webhook_bookkeeping``), and what a connected server says about itself changing, with
the watch over its tools, is ``agentwake.server_signals``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_never

from agentwake import metrics, protocol
from agentwake.backoff import backoff_s
from agentwake.config import AgentwakeConfig, ServerConfig, SubscriptionConfig
from agentwake.delivery.backlog import Backlog
from agentwake.delivery.common import KnownEvents, QuietFlusher, Sleep, subscription_key
from agentwake.delivery.identity import IdentityChecks
from agentwake.delivery.poll import PollLoop
from agentwake.delivery.push import PushLoop
from agentwake.delivery.receiver import Receiver
from agentwake.delivery.routes import WebhookRoutes
from agentwake.delivery.select import SubscriptionPlan, plan_subscription
from agentwake.delivery.ticks import PollTicks
from agentwake.delivery.webhook import WebhookLoop, load_routes, reload_routes
from agentwake.errors import (
    ConfigError,
    ConnectionLost,
    DeliveryError,
    EventsCallError,
    FencedOut,
    SubscriptionEnded,
    TransientEventsError,
)
from agentwake.logs import event_fields
from agentwake.mcp import ServerConnection
from agentwake.ownership import Ownership, ownership_for
from agentwake.server_signals import ServerSignals, watch_tools
from agentwake.store import Store
from agentwake.text import peer
from agentwake.webhook_bookkeeping import WebhookBookkeeping

if TYPE_CHECKING:
    from agentwake.agent.tools import ConnectionPool
    from agentwake.worker import Worker

logger = logging.getLogger(__name__)

RECONNECT_INITIAL_S: Final = 1.0
# Low on purpose: a server down for an hour is still tried every few seconds, so delivery resumes
# within about RECONNECT_MAX_S (plus up to a second of jitter) of its return, not a minute later.
# A refused connect or a failed spawn is cheap; the warning each failure logs is the cost.
RECONNECT_MAX_S: Final = 5.0
# A subscription that fails with an unexpected error (a bug, not an outage) is restarted less eagerly.
RESTART_MAX_S: Final = 60.0
# A connection that stayed up this long was healthy: the failure that ends it starts a new series.
HEALTHY_AFTER_S: Final = 10.0
# What ``status`` shows for a subscription no longer in the config (see Supervisor._note_removed).
REMOVED_STATUSES: Final = ("removed", "unsubscribed", "lingering")


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


@dataclass
class Supervisor(WebhookBookkeeping):
    """The service's task group. ``worker`` handles what the loops store (None: store only)."""

    config: AgentwakeConfig
    store: Store
    worker: Worker | None = None
    pool: ConnectionPool | None = None
    sleep: Sleep = anyio.sleep
    reconnect_initial_s: float = RECONNECT_INITIAL_S
    reconnect_max_s: float = RECONNECT_MAX_S
    restart_max_s: float = RESTART_MAX_S
    routes: WebhookRoutes = field(default_factory=WebhookRoutes)
    # Which subscriptions this process drives (None: as the store allows, see agentwake.ownership).
    ownership: Ownership | None = None
    owners: Ownership = field(init=False)
    receiver: Receiver | None = field(default=None, init=False)
    # What the loops have seen stored, so overlapping subscriptions do not each write an event.
    known_events: KnownEvents = field(default_factory=KnownEvents, init=False)
    # Writes what quiet loops held back, all together (see DeferredWrites).
    quiet_flusher: QuietFlusher = field(init=False)
    # The poll loops' waits between polls, woken together on a coarse grid (see PollTicks).
    poll_ticks: PollTicks = field(default_factory=PollTicks, init=False)
    # What each subscription holds undecided, and which are held back for it ([limits] max_undecided_events).
    backlog: Backlog = field(init=False)
    _ended: set[str] = field(default_factory=set, init=False)
    _ends: anyio.Event = field(default_factory=anyio.Event, init=False)
    _stored: anyio.Event = field(default_factory=anyio.Event, init=False)
    # Per server: when its current connection was made, and reconnect failures in a row.
    _connected_at: dict[str, float] = field(default_factory=dict, init=False)
    _failures: dict[str, int] = field(default_factory=dict, init=False)
    _unsupported: set[str] = field(default_factory=set, init=False)
    _invalid_reasons: dict[str, str] = field(default_factory=dict, init=False)
    # A graceful stop: the scopes of the delivery running on open connections, and how many are open.
    _stopping: bool = field(default=False, init=False)
    _delivery: set[anyio.CancelScope] = field(default_factory=set, init=False)
    _open: int = field(default=0, init=False)
    _closed: anyio.Event = field(default_factory=anyio.Event, init=False)
    # Per server, what /readyz shows: "connected", "connecting", "ended" or "error: <why>".
    _readiness: dict[str, str] = field(default_factory=dict, init=False)
    # For a reload: the task group the server tasks run in, each one's scope, its live signals.
    _servers_tg: anyio.abc.TaskGroup | None = field(default=None, init=False)
    _server_scopes: dict[str, anyio.CancelScope] = field(default_factory=dict, init=False)
    _live_signals: dict[str, ServerSignals] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.quiet_flusher = QuietFlusher(self.store)
        self.backlog = Backlog(self.store, self.config.limits.max_undecided_events)
        self.owners = self.ownership or ownership_for(
            self.store,
            lambda: [s.name for s in self.config.subscriptions],
            self.config.store.lease_s,
            servers=lambda: {s.name: s.server for s in self.config.subscriptions},
            # [store] drive: pin this process to those subscriptions (None: its share of them all).
            pinned=self.config.store.drive,
        )

    def readiness(self) -> dict[str, str]:
        """Each configured server's state: "connected", "connecting", "ended" (nothing left to run
        there, or stopped) or "error: <the last failure>" while it is retried."""
        return {server: self._readiness.get(server, "connecting") for server in self.config.servers}

    def subscriptions_of(self, server: str) -> list[SubscriptionConfig]:
        return [s for s in self.config.subscriptions if s.server == server and s.name not in self._ended]

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            await self._run(task_status=task_status)
        finally:
            # Every loop has ended: another process may take their subscriptions over at once.
            await self.owners.release()

    async def _run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        for sub in self.config.subscriptions:
            await self.store.register(subscription_key(sub))
        await self._note_removed()
        await self._retire_unconfigured_webhooks()
        cleanup = {retired.server for retired in await self.store.to_unsubscribe()}
        for server in sorted(cleanup - set(self.config.servers)):
            logger.warning(
                "server %s is no longer configured: its webhook subscriptions cannot be unsubscribed and"
                " lapse at their TTL; their deliveries are refused (410)",
                server,
            )
        async with anyio.create_task_group() as tg:
            self.quiet_flusher.spawn_in(tg)
            if self.owners.shared:
                await tg.start(self.owners.run, name="ownership")
            if self.config.webhook is not None:
                await load_routes(self.store, self.routes)
                if self.owners.shared:  # any process may receive any delivery: each routes them all
                    interval_s = self.config.store.lease_s / 3
                    tg.start_soon(reload_routes, self.store, self.routes, interval_s, name="webhook-routes")
                self.receiver = Receiver(
                    self.config.webhook,
                    self.store,
                    self.routes,
                    on_new_events=self._notify_new,
                    on_terminated=self._on_terminated,
                    limits=self.config.limits,
                    backlog=self.backlog,
                    identities=IdentityChecks.from_config(self.config.servers),
                )
                # Listening before any subscribe: the server verifies the endpoint during it.
                await tg.start(self.receiver.serve)
                # The servers' identity keys, fetched while their subscribes begin (each refreshes later).
                tg.start_soon(self.receiver.identities.prefetch, name="identity-keys")
            self._servers_tg = tg
            for server in self.config.servers:
                # With an agent, a server without subscriptions is still connected, for its tools.
                if self.subscriptions_of(server) or server in cleanup or self.pool is not None:
                    self._start_server(server)
                else:
                    self._readiness[server] = "ended"
            if self.worker is not None:
                await tg.start(self.worker.run, name="worker")
            task_status.started()

    def _start_server(self, server: str) -> None:
        assert self._servers_tg is not None
        scope = anyio.CancelScope()
        self._server_scopes[server] = scope

        async def serve() -> None:
            with scope:
                await self._server_forever(server)
            if self._server_scopes.get(server) is scope:
                del self._server_scopes[server]

        self._servers_tg.start_soon(serve, name=f"server:{server}")

    # ---- reload -------------------------------------------------------------------

    async def reload(self, new: AgentwakeConfig) -> list[str]:
        """Apply a changed config's servers and subscriptions; what changed, one line each.

        Added servers connect, removed ones disconnect, changed ones reconnect. A server whose
        subscriptions changed (added, removed, or with other settings) plans them again on its
        open connection: its loops restart from their stored cursors (a subscription whose
        server, event or arguments changed starts afresh); removed webhook subscriptions are
        unsubscribed there. Every other server is left alone. Other sections need a restart.
        """
        old = self.config
        changes: list[str] = []
        for name in ("store", "webhook", "limits", "service"):
            if getattr(old, name) != getattr(new, name):
                changes.append(f"[{name}] changed: not applied until a restart")
        for sub in new.subscriptions:
            await self.store.register(subscription_key(sub))
        old_subs = {s.name: s for s in old.subscriptions}
        new_subs = {s.name: s for s in new.subscriptions}
        self.config = new
        if self.worker is not None:
            self.worker.config = new
        if self.receiver is not None:
            self.receiver.identities = self.receiver.identities.reloaded(new.servers)
        await self._retire_unconfigured_webhooks()
        for name in sorted(set(old_subs) - set(new_subs)):
            self._ended.discard(name)
            changes.append(f"subscription {name}: removed")
        await self._note_removed()
        for name in sorted(set(new_subs) - set(old_subs)):
            changes.append(f"subscription {name}: added")
        for name in sorted(set(old_subs) & set(new_subs)):
            if old_subs[name] != new_subs[name]:
                self._ended.discard(name)
                changes.append(f"subscription {name}: changed; it restarts from its stored cursor")
        for server in sorted(set(old.servers) | set(new.servers)):
            before, after = old.servers.get(server), new.servers.get(server)
            subs_before = [s for s in old.subscriptions if s.server == server]
            subs_after = [s for s in new.subscriptions if s.server == server]
            scope = self._server_scopes.get(server)
            if after is None:
                changes.append(f"server {server}: removed; disconnecting")
                if scope is not None:
                    scope.cancel()
                self._readiness.pop(server, None)
            elif before is not None and before != after and _same_but_cap(before, after):
                # The claim counts under the new cap at once: nothing to reconnect.
                changes.append(f"server {server}: max_concurrent_runs = {after.max_concurrent_runs}: applied")
            elif before is None or before != after:
                changes.append(f"server {server}: {'added' if before is None else 'changed; reconnecting'}")
                if scope is not None:
                    scope.cancel()
                self._server_scopes.pop(server, None)
                self._readiness.pop(server, None)
                if subs_after or self.pool is not None:
                    self._start_server(server)
                else:
                    self._readiness[server] = "ended"
            elif subs_before != subs_after:
                signals = self._live_signals.get(server)
                if scope is None or bool(subs_before) != bool(subs_after) or signals is None:
                    if scope is not None:
                        scope.cancel()
                    self._server_scopes.pop(server, None)
                    if subs_after or self.pool is not None:
                        self._start_server(server)
                    else:
                        self._readiness[server] = "ended"
                else:
                    signals.on_config_changed()  # its loops are planned again, from the new config
        return changes

    async def _note_removed(self) -> None:
        """Subscriptions stored but no longer configured show ``removed`` in ``status``, not the
        state their loop last had; ``unsubscribed`` and ``lingering`` (set once their webhook
        subscription is dealt with) stay."""
        configured = {s.name for s in self.config.subscriptions}
        for row in await self.store.subscriptions():
            name = row["subscription"]
            if name not in configured and row["status"] not in REMOVED_STATUSES:
                await self.store.set_state(name, status="removed")

    # ---- delivery --------------------------------------------------------------

    async def _server_forever(self, server: str) -> None:
        async def note(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            delay = state.next_action.sleep if state.next_action else 0.0
            if exc is not None and not isinstance(exc, DeliveryError):
                logger.error(
                    "server %s: unexpected failure; reconnecting in %.1fs", server, delay, exc_info=exc
                )
            else:
                logger.warning("%s; reconnecting in %.1fs", peer(str(exc)), delay)
            metrics.observe_reconnect(server)
            self._readiness[server] = f"error: {peer(str(exc))}"
            self.owners.server_unreachable(server)  # another process may drive its subscriptions
            for sub in self.subscriptions_of(server):
                if self.owners.drives(sub.name):  # not another process's subscription
                    await self.store.record_error(sub.name, str(exc))

        retrying = AsyncRetrying(
            # Any failure of a connection, expected (DeliveryError) or not, reconnects with backoff.
            retry=retry_if_exception_type(Exception),
            wait=lambda _state: self._reconnect_delay(server),
            stop=stop_never,
            sleep=self.sleep,
            before_sleep=note,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self._serve_connection(server)
                if self._stopping:
                    self._readiness[server] = "ended"
                    return
                if not self.subscriptions_of(server) and self.pool is None:
                    logger.warning("server %s: no subscription left running", server)
                    self._readiness[server] = "ended"
                    return
                # The connection ended without an error (the server closed its side): reconnect.
                raise ConnectionLost(f"server {server!r}: connection ended", server=server)

    def _reconnect_delay(self, server: str) -> float:
        """How long to wait before connecting to ``server`` again, after a failure.

        The first failure after a connection that stayed up for HEALTHY_AFTER_S waits only
        a short jitter: a crashed stdio server is back within a couple of seconds. Failures
        in a row, and connections that die as soon as they are made, back off exponentially.
        """
        connected_at = self._connected_at.pop(server, None)
        if connected_at is not None and anyio.current_time() - connected_at >= HEALTHY_AFTER_S:
            self._failures[server] = 0
        failures = self._failures.get(server, 0) + 1
        self._failures[server] = failures
        if failures == 1:
            return backoff_s(
                0, initial_s=self.reconnect_initial_s, max_s=0, jitter_s=self.reconnect_initial_s / 2
            )
        return backoff_s(failures - 1, initial_s=self.reconnect_initial_s, max_s=self.reconnect_max_s)

    async def stop_delivery(self) -> None:
        """The graceful half of a stop: end every delivery loop while its connection is still open
        (an open push stream is cancelled on its server, notifications/cancelled), then close the
        connections as usual. Returns once every open connection has closed; nothing reconnects
        after this. Bound it with a timeout, then cancel ``run`` as always.
        """
        self._stopping = True
        for scope in self._delivery:
            scope.cancel()
        while self._open:
            await self._closed.wait()

    async def _serve_connection(self, server: str) -> None:
        if self._stopping:
            return
        signals = ServerSignals()
        self._live_signals[server] = signals
        opened = False
        try:
            async with ServerConnection(
                server,
                self.config.servers[server],
                on_list_changed=signals.on_events_changed,
                on_tools_changed=signals.on_tools_changed,
                limits=self.config.limits,
            ) as conn:
                opened = True
                self._readiness[server] = "connected"
                self.owners.server_reached(server)
                self._open += 1
                self._connected_at[server] = anyio.current_time()
                if self.pool is not None:
                    await self.pool.attach(conn)
                delivery = anyio.CancelScope()
                self._delivery.add(delivery)
                try:
                    with delivery:
                        if self._stopping:
                            delivery.cancel()
                        await self._serve_subscriptions(server, conn, signals)
                finally:
                    self._delivery.discard(delivery)
                    if self.pool is not None:
                        self.pool.detach(server)
        finally:
            if opened:
                self._open -= 1
                closed, self._closed = self._closed, anyio.Event()
                closed.set()

    async def _serve_subscriptions(self, server: str, conn: ServerConnection, signals: ServerSignals) -> None:
        try:
            async with anyio.create_task_group() as tg:
                # Nothing else may talk on this connection for a long while (webhook delivery, a
                # server without events): the watch notices it die within one ping interval.
                tg.start_soon(conn.watch, self.config.servers[server].ping_interval_s, name=f"watch:{server}")
                await self._serve_listing(server, conn, signals)
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # A loop's ConnectionLost comes out of the task group wrapped; unwrapped, the reconnect
            # retry (which matches DeliveryError) sees it. Anything else propagates as it is.
            delivery = group.subgroup(DeliveryError)
            if delivery is None:
                raise
            raise _first_leaf(delivery) from None

    async def _without_events(self, server: str, conn: ServerConnection, signals: ServerSignals) -> None:
        """A server that declares no MCP Events: no events/* request goes to it, its tools stay usable.

        Its subscriptions show ``unsupported``. Capabilities are read again on the next
        connection; this one is given up for that when the server announces event types
        (list_changed) or, on 2026-era connections, the liveness probe sees it declare them.
        """
        reason = f"server {server!r} does not implement MCP Events (no events extension in its capabilities)"
        first = server not in self._unsupported
        self._unsupported.add(server)
        (logger.error if first else logger.debug)(
            "%s; its subscriptions cannot run (%s)",
            reason,
            ", ".join(s.name for s in self.subscriptions_of(server)),
        )
        for sub in self.subscriptions_of(server):
            await self.store.set_state(sub.name, status="unsupported", error=reason)
        async with anyio.create_task_group() as tg:
            if self.pool is not None:
                tg.start_soon(watch_tools, self.pool, conn, signals, name=f"tools:{server}")
            while True:
                await signals.next_events_change()
                if signals.take_server_change():
                    break
                # A reload changed its subscriptions: the new ones cannot run either.
                for sub in self.subscriptions_of(server):
                    await self.store.set_state(sub.name, status="unsupported", error=reason)
            tg.cancel_scope.cancel()
        raise ConnectionLost(
            f"server {server!r} announced event types; reconnecting to read its capabilities again",
            server=server,
        )

    async def _serve_listing(self, server: str, conn: ServerConnection, signals: ServerSignals) -> None:
        if not self.subscriptions_of(server) and self.pool is not None:
            logger.info("server %s: connected for its tools only (no subscription on it)", server)
            await watch_tools(self.pool, conn, signals)
            return
        if not conn.advertises_events:
            await self._without_events(server, conn, signals)
            return
        self._unsupported.discard(server)
        descriptors: dict[str, protocol.EventDescriptor] | None = None
        while True:
            if descriptors is None:
                signals.take_server_change()  # this listing answers what was said before it
                descriptors = {d.name: d for d in await conn.list_events()}
            async with anyio.create_task_group() as tg:
                if self.pool is not None:
                    tg.start_soon(watch_tools, self.pool, conn, signals, name=f"tools:{server}")
                plans: list[SubscriptionPlan] = []
                invalid = 0
                for sub in self.subscriptions_of(server):
                    try:
                        plans.append(
                            plan_subscription(sub, descriptors, receiver=self.config.webhook is not None)
                        )
                    except ConfigError as exc:
                        # Checked again when the server's event types change, and at the next connection.
                        await self._invalid(sub, str(exc))
                        invalid += 1
                await self._unsubscribe_stale(server, conn, plans)
                running = 0
                for plan in plans:
                    sub = plan.subscription
                    if self._invalid_reasons.pop(sub.name, None) is not None:
                        logger.info(
                            "subscription %s: the server's event types now let it run",
                            sub.name,
                            extra=event_fields(subscription=sub.name, server=sub.server),
                        )
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
                            sub,
                            conn,
                            self.store,
                            on_new_events=self._notify_new,
                            sleep=self.sleep,
                            limits=self.config.limits,
                            known=self.known_events,
                            flusher=self.quiet_flusher,
                            backlog=self.backlog,
                        )
                    else:
                        loop = PollLoop(
                            sub,
                            conn,
                            self.store,
                            on_new_events=self._notify_new,
                            sleep=self.sleep,
                            # With the real clock, quiet loops wake together (a test's own sleep: as is).
                            idle_sleep=self.poll_ticks.sleep if self.sleep is anyio.sleep else None,
                            limits=self.config.limits,
                            known=self.known_events,
                            flusher=self.quiet_flusher,
                            backlog=self.backlog,
                        )
                    tg.start_soon(self._run_loop, loop, plan.mode, name=f"{plan.mode}:{sub.name}")
                    running += 1
                if not running and not invalid:
                    tg.cancel_scope.cancel()
                    return
                await signals.next_events_change()
                # A burst of list_changed is one relist: what comes meanwhile is taken with it.
                await anyio.sleep(self.config.limits.relist_debounce_s)
                signals.events_changed = anyio.Event()
                if signals.take_server_change():
                    logger.info("server %s: event types changed; listing them again", server)
                    descriptors = None
                else:
                    logger.info("server %s: its subscriptions changed; planning them again", server)
                tg.cancel_scope.cancel()

    async def _run_loop(self, loop: PollLoop | PushLoop | WebhookLoop, mode: protocol.DeliveryMode) -> None:
        """Run one subscription's loop while this process holds it (``agentwake.ownership``), its
        cursor writes fenced. A lost lease cancels it, a write fenced out stops it: it waits to
        hold the subscription again. With one process per store it is always held."""
        sub = loop.subscription
        if not self.owners.shared:
            # Always held and never fenced: no context to keep open for each of ten thousand loops.
            await self._drive(loop)
            return
        while True:
            async with self.owners.driving(sub.name) as fence:
                loop.fence = fence
                try:
                    await self._drive(loop)
                    return
                except FencedOut as exc:
                    logger.info("%s", exc)  # another process took it over: not an error
                    self.owners.fenced_out(sub.name, exc.given)

    async def _drive(self, loop: PollLoop | PushLoop | WebhookLoop) -> None:
        """Run the loop; whatever its peer makes it raise costs this subscription only.

        A broken connection (DeliveryError) goes up to the server's task, which reconnects.
        Anything else, a bug a peer found included, is logged with its traceback (once, then
        summarised), shown as ``failed`` in ``status``, and the loop starts again with backoff
        from the stored cursor. FencedOut goes up to ``_run_loop``.
        """
        sub = loop.subscription
        failures = 0
        while True:
            try:
                await loop.run()
                return
            except SubscriptionEnded as exc:
                await self._end(sub, str(exc))
                return
            except TransientEventsError:
                raise
            except EventsCallError as exc:
                # InvalidParams, Unsupported and the like: retrying cannot help this subscription.
                await self._end(sub, str(exc))
                return
            except (DeliveryError, FencedOut):
                raise
            except Exception as exc:  # contained: one peer's misbehaviour must not end the process
                failures += 1
                delay = backoff_s(failures, initial_s=self.reconnect_initial_s, max_s=self.restart_max_s)
                reason = f"{type(exc).__name__}: {exc}"
                if failures == 1:
                    logger.exception(
                        "subscription %s failed; restarting it in %.1fs",
                        sub.name,
                        delay,
                        extra=event_fields(subscription=sub.name, server=sub.server),
                    )
                else:
                    logger.error(
                        "subscription %s failed again (%d times): %s; restarting it in %.1fs",
                        sub.name,
                        failures,
                        peer(reason),
                        delay,
                        extra=event_fields(subscription=sub.name, server=sub.server),
                    )
                await self.store.set_state(sub.name, status="failed", error=reason)
                self.owners.loop_failed(sub.name)  # failing too long: another process may try it
                await self.sleep(delay)

    async def _end(self, sub: SubscriptionConfig, reason: str) -> None:
        if sub.name in self._ended:
            return
        logger.error(
            "subscription %s stopped: %s",
            sub.name,
            reason,
            extra=event_fields(subscription=sub.name, server=sub.server),
        )
        self._ended.add(sub.name)
        await self.store.set_state(sub.name, status="ended", error=reason)
        ended, self._ends = self._ends, anyio.Event()
        ended.set()

    async def _invalid(self, sub: SubscriptionConfig, reason: str) -> None:
        """The server's event list does not let ``sub`` run (no such event, no common mode, bad arguments)."""
        if self._invalid_reasons.get(sub.name) != reason:
            logger.error(
                "subscription %s cannot run: %s",
                sub.name,
                reason,
                extra=event_fields(subscription=sub.name, server=sub.server),
            )
        self._invalid_reasons[sub.name] = reason
        await self.store.set_state(sub.name, status="invalid", error=reason)
        ends, self._ends = self._ends, anyio.Event()
        ends.set()

    async def wait_ended(self, name: str) -> None:
        """Return once subscription ``name`` has stopped: for good (refused, terminated), or until the
        server's event list changes (invalid against it)."""
        while name not in self._ended and name not in self._invalid_reasons:
            await self._ends.wait()

    def _notify_new(self, count: int) -> None:
        if self.worker is not None:
            self.worker.wake(count)
        stored, self._stored = self._stored, anyio.Event()
        stored.set()

    async def next_stored(self) -> None:
        """Return after the next commit that stored new events (from any delivery loop or the receiver)."""
        await self._stored.wait()


def _same_but_cap(before: ServerConfig, after: ServerConfig) -> bool:
    """Whether two settings of a server differ only in max_concurrent_runs (a limit, applied live)."""
    return before.model_copy(update={"max_concurrent_runs": None}) == after.model_copy(
        update={"max_concurrent_runs": None}
    )


__all__ = ["Supervisor"]
