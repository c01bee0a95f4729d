"""The worker: claims pending events, has ``agentwake.decide`` decide each, and carries the outcome out.

Carrying out is all it does with a decision: an event that ends here (ignored, logged,
held for approval) is settled in the store, a delayed one is given back (not an
attempt) until its time, a batched one was stored by the decision's flow step, and
one to run goes to the agent, ``concurrency`` runs at a time. Without an ``[agent]``
section events are still sanitized and decided (nothing runs), a batch at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final, Protocol

import anyio

from agentwake.agent.stopping import STOP_REASON
from agentwake.backoff import backoff_s
from agentwake.clock import iso, utc_now
from agentwake.config import OFFLINE_MODEL, OFFLINE_NOTICE, AgentConfig, AgentwakeConfig
from agentwake.decide import Outcome, Slots, StoreSlots, decide
from agentwake.errors import AgentwakeError, StoreError
from agentwake.logs import event_fields
from agentwake.pausing import RULE_PAUSE_RECHECK_S, PauseWatch
from agentwake.policy import Policy
from agentwake.store import InboxEvent, RunKind, Settlement, Store
from agentwake.store.pauses import Pause
from agentwake.store.quotas import ClaimLimits

if TYPE_CHECKING:
    from agentwake.agent.tools import ConnectionPool

logger = logging.getLogger(__name__)

# Events claimed at once when no agent runs (deciding them is quick).
CLAIM_BATCH: Final = 100
# A worker with nothing to do looks at the inbox this often even if nobody wakes it (delayed events).
IDLE_RECHECK_S: Final = 5.0
# An event whose server is not connected (its tools missing) goes back for this long.
SERVER_WAIT_S: Final = 5.0
# A held event's lease is renewed this many times per lease_s, so only an abandoned claim lapses.
LEASE_RENEWALS: Final = 3


# The circuit breaker's probes of a failing model: backoff from PROBE_INITIAL_S, doubling, at most PROBE_MAX_S.
PROBE_INITIAL_S: Final = 5.0
PROBE_MAX_S: Final = 300.0


@dataclass
class ModelBreaker:
    """Counts LLM calls in a row that failed transiently (after their retries); at ``threshold`` it opens:
    the worker claims nothing until a probe of the model (or a run still in flight) gets an answer.

    ``threshold`` 0 never opens. Told of each call by ``agentwake.agent.llm.observed_by``.
    """

    threshold: int
    clock: Callable[[], datetime] = utc_now
    probe_initial_s: float = PROBE_INITIAL_S
    probe_max_s: float = PROBE_MAX_S
    failures: int = 0
    model: str | None = None
    since: datetime | None = None
    error: str | None = None
    is_open: bool = False
    answered: bool = False  # a call succeeded while open

    def observe(self, model: str, error: Exception | None) -> None:
        if error is None or not getattr(error, "transient", False):
            # An answer, or a refusal (a bad request, a key): the endpoint is up.
            self.failures = 0
            self.answered = self.answered or self.is_open
            return
        if self.failures == 0 or model != self.model:
            self.model, self.since, self.failures = model, self.clock(), 0
        self.failures += 1
        self.error = str(error).partition(":")[0].strip() or type(error).__name__
        if self.threshold and self.failures >= self.threshold:
            self.is_open = True

    def reason(self) -> str:
        """What ``status`` shows while open: the model, since when, the error's class."""
        since = iso(self.since) if self.since else "?"
        return f"model {self.model} failing since {since} ({self.error})"


@dataclass
class _Handling:
    """One event being handled in this process: the cancel scope its handling runs in, and a newer
    claim of it (this process claimed it again) to handle once that handling has stopped."""

    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    then: InboxEvent | None = None
    # Its lease was lost: its handling is being stopped; not renewed, not reported again.
    lost: bool = False
    # The event (as last claimed), the rule that decided it, and why its handling was stopped if
    # not for a stop of the service.
    event: InboxEvent | None = None
    rule: str | None = None
    stopped_because: list[str] = field(default_factory=list)

    def stop(self, then: InboxEvent | None = None) -> None:
        self.then = then
        self.scope.cancel()


class Agent(Protocol):
    """What the worker needs of the agent stage (``agentwake.agent.runner.AgentRunner``)."""

    agent: AgentConfig

    async def warm_up(self) -> None:
        """Load what the first run would otherwise wait for (litellm), while events are still arriving."""
        ...

    async def run(
        self, outcome: Outcome, *, kind: RunKind = "agent", batch: Sequence[InboxEvent] = ()
    ) -> object: ...


def log_event(event: InboxEvent, rule: str | None) -> None:
    """What "log" does with an event: one line in the service's log, naming the rule that chose it."""
    logger.info(
        "event %s %s from %s (subscription %s) logged by %s: %s",
        event.name,
        event.event_id,
        event.server,
        event.subscription,
        f"rule {rule}" if rule else "the policy's default",
        _preview(event.data),
        extra={**_fields(event), **event_fields(rule=rule)},
    )


def _fields(event: InboxEvent) -> dict[str, object]:
    """The structured fields of a log line about one event ([log] format = "json")."""
    return event_fields(subscription=event.subscription, server=event.server, event_id=event.event_id)


def _preview(data: dict[str, object], limit: int = 160) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in data.items())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Worker:
    """Claims and handles events until cancelled. ``wake()`` after new events were stored.

    ``policy`` may be replaced at any time (a reload): events decided after that use the new one.
    """

    config: AgentwakeConfig
    store: Store
    policy: Policy = field(default_factory=Policy)
    agent: Agent | None = None
    pool: ConnectionPool | None = None
    clock: Callable[[], datetime] = utc_now
    on_log: Callable[[InboxEvent, str | None], None] = log_event
    # Rules' max_concurrent slots, counted by the store over every process that shares it.
    slots: Slots = field(init=False)
    active: int = field(default=0, init=False)
    # Events being handled: row -> (server, attempts at the claim: the lease's fencing token).
    held: dict[int, tuple[str, int]] = field(default_factory=dict, init=False)
    # The same events: how each one's handling is stopped (a lost lease, a newer claim of it).
    _handling: dict[int, _Handling] = field(default_factory=dict, init=False)
    # A claim failed on the store and none has worked since (said once, not at every retry).
    _claims_failing: bool = field(default=False, init=False)
    paused: str | None = field(default=None, init=False)
    breaker: ModelBreaker = field(init=False)
    _claiming: bool = field(default=True, init=False)
    _wake: anyio.Event = field(default_factory=anyio.Event, init=False)
    _slot_freed: anyio.Event = field(default_factory=anyio.Event, init=False)
    _idle_now: anyio.Event = field(default_factory=anyio.Event, init=False)
    _stopping: anyio.Event = field(default_factory=anyio.Event, init=False)
    pauses: PauseWatch = field(init=False)

    def __post_init__(self) -> None:
        self.slots = StoreSlots(self.store, lambda: self.clock())
        self.pauses = PauseWatch(self.store)
        threshold = self.agent.agent.circuit_breaker_failures if self.agent is not None else 0
        self.breaker = ModelBreaker(threshold, clock=lambda: self.clock())

    def stop_claiming(self) -> None:
        """The first half of a graceful stop: claim nothing more; events being handled go on."""
        self._claiming = False
        self._stopping.set()
        self._wake.set()
        self._slot_freed.set()

    async def drained(self) -> None:
        """Return once no event is being handled (after ``stop_claiming``)."""
        while self.held:
            await self._idle_now.wait()
            self._idle_now = anyio.Event()

    @property
    def lease_s(self) -> float:
        return (
            self.agent.agent.lease_s
            if self.agent is not None
            else AgentConfig.model_fields["lease_s"].default
        )

    def _lease_until(self) -> str:
        return iso(self.clock() + timedelta(seconds=self.lease_s))

    def _claim_limits(self) -> ClaimLimits:
        """[servers.X] max_concurrent_runs and [agent] max_runs_per_hour / max_cost_per_day_usd, for
        the store to count over every process sharing it, inside the claim."""
        caps = {
            name: server.max_concurrent_runs
            for name, server in self.config.servers.items()
            if server.max_concurrent_runs is not None
        }
        agent = self.agent.agent if self.agent is not None else None
        if agent is None:
            return ClaimLimits(caps)
        now = self.clock()
        return ClaimLimits(
            caps,
            max_runs_per_hour=agent.max_runs_per_hour,
            hour_ago=iso(now - timedelta(hours=1)),
            max_cost_per_day_usd=agent.max_cost_per_day_usd,
            day_ago=iso(now - timedelta(days=1)),
        )

    async def _claim(self, limit: int) -> list[InboxEvent]:
        """Claim up to ``limit`` events under a lease, honouring the limits above and max_attempts."""
        batch = await self.store.claim(
            limit, iso(self.clock()), lease_until=self._lease_until(), limits=self._claim_limits()
        )
        max_attempts = self.agent.agent.max_attempts if self.agent is not None else None
        kept: list[InboxEvent] = []
        for event in batch:
            handling = self._handling.get(event.id)
            if handling is not None:
                # Claimed again by this process while it handles it: its lease lapsed (the process
                # was paused, say) and the claim took it back, marking the run abandoned. The fence is
                # the newest claim now; the handling under the old one stops and the one task handling
                # the event goes on under the new claim, never two at once.
                self.held[event.id] = (event.server, event.attempts)
                handling.lost = False
                logger.warning(
                    "event %s: claimed again (claim %d) while its earlier claim was being handled here"
                    " (its lease lapsed); that handling stops and the event is handled under the new claim",
                    event.event_id,
                    event.attempts,
                    extra=_fields(event),
                )
            if max_attempts is not None and event.attempts > max_attempts:
                # Only an abandoned claim (a lapsed lease) gets here: runs stop at max_attempts.
                reason = f"claimed {event.attempts} times without finishing (its lease lapsed each time)"
                logger.error("event %s is dead: %s", event.event_id, reason)
                await self.store.finish([event.id], "dead", reason)
                if handling is not None:
                    handling.lost = True  # its end is logged above, not again by a renewal
                    handling.stop()
                continue
            if handling is not None:
                handling.stop(then=event)
                continue
            self.held[event.id] = (event.server, event.attempts)
            self._handling[event.id] = _Handling()
            kept.append(event)
        return kept

    def _let_go(self, event: InboxEvent) -> None:
        self.held.pop(event.id, None)
        self._handling.pop(event.id, None)
        if not self.held:
            self._idle_now.set()

    async def _renew_leases(self) -> None:
        """Keep the leases of the events being handled, so that only an abandoned claim lapses.

        A lease found lost (the event was claimed again, or moved on, meanwhile) stops its event's
        handling here at once: its run calls the LLM no more and never reaches a tool call.
        """
        while True:
            await anyio.sleep(self.lease_s / LEASE_RENEWALS)
            leases = [
                (row, attempts)
                for row, (_, attempts) in self.held.items()
                if not (row in self._handling and self._handling[row].lost)
            ]
            if not leases:
                continue
            try:
                lost = await self.store.renew_leases(leases, self._lease_until())
            except StoreError as exc:  # the next renewal tries again, well within the lease
                logger.warning("could not renew the leases of %d event(s): %s", len(leases), exc)
                continue
            for row in lost:
                held = self.held.get(row)
                # Not one whose run ended, nor one this process claimed again, while the renewal was under way.
                if held is None or (row, held[1]) not in leases:
                    continue
                logger.warning(
                    "event row %d: its lease was lost; another claim handles it, and its handling here stops",
                    row,
                )
                handling = self._handling.get(row)
                if handling is not None:
                    handling.lost = True
                    handling.stop()

    async def _usage_allowance(self, wanted: int) -> tuple[int, str | None]:
        """How many of ``wanted`` runs may start now under [agent] max_runs_per_hour and
        max_cost_per_day_usd, and why none may (None when some may).

        Events being handled count against the hourly allowance (their runs may not have started
        yet); spend is known only after a run, so runs in flight may go past the daily cost limit.
        """
        agent = self.agent.agent if self.agent is not None else None
        if agent is None or (agent.max_runs_per_hour is None and agent.max_cost_per_day_usd is None):
            return wanted, None
        now = self.clock()
        runs, cost = await self.store.agent_usage(iso(now - timedelta(hours=1)), iso(now - timedelta(days=1)))
        if agent.max_cost_per_day_usd is not None and cost >= agent.max_cost_per_day_usd:
            return 0, (
                f"max_cost_per_day_usd={agent.max_cost_per_day_usd:g} reached"
                f" (${cost:.4f} spent in the last 24 hours)"
            )
        if agent.max_runs_per_hour is not None:
            left = agent.max_runs_per_hour - runs - len(self.held)
            if left <= 0:
                if runs >= agent.max_runs_per_hour:
                    return (
                        0,
                        f"max_runs_per_hour={agent.max_runs_per_hour} reached ({runs} runs in the last hour)",
                    )
                return 0, None  # the allowance is taken by the events in hand; wait for them
            wanted = min(wanted, left)
        return wanted, None

    async def _set_paused(self, reason: str | None) -> None:
        if reason == self.paused:
            return
        if reason is not None:
            logger.warning("agent paused: %s; events wait in pending", reason)
        else:
            logger.info("agent resumed: back under its limits")
        await self.store.service_paused(reason)
        self.paused = reason  # after the write: one that failed is tried again next time

    def limits_changed(self) -> None:
        """A reload changed the agent's limits: count under them now, not once a run ends."""
        self._slot_freed.set()
        self._wake.set()

    def wake(self, count: int = 0) -> None:
        """New events are in the inbox (``count`` of them): claim now rather than at the next recheck."""
        self._wake.set()

    async def decide(self, event: InboxEvent) -> Outcome:
        """The decision stage, as the service runs it: the store's flow control, this worker's slots."""
        return await decide(
            event,
            config=self.config,
            policy=self.policy,
            now=self.clock(),
            flow=self.store,
            slots=self.slots,
        )

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        max_attempts = self.agent.agent.max_attempts if self.agent is not None else None
        requeued = await self.store.requeue_interrupted(max_attempts)
        if requeued:
            logger.info("%d event(s) interrupted by a previous stop go again", requeued)
        await self.pauses.refresh()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._renew_leases, name="lease-renewal")
            tg.start_soon(
                self.pauses.follow, lambda: list(self._handling.values()), self._wake.set, name="pause-watch"
            )
            if self.agent is None:
                task_status.started()
                await self._decide_batches()
            else:
                await self._run_agent(self.agent, task_status)
            tg.cancel_scope.cancel()

    async def _claim_or_none(self, limit: int) -> list[InboxEvent]:
        """``_claim``, but a store that fails for now (a PostgreSQL lock timeout behind a frozen peer, a
        database restarting, a locked SQLite file) costs a wait and a retry, not the service; said once
        while it keeps failing, and once when it works again."""
        try:
            batch = await self._claim(limit)
        except StoreError as exc:
            self._claim_failed(exc)
            return []
        if self._claims_failing:
            logger.info("claiming events works again")
            self._claims_failing = False
        return batch

    def _claim_failed(self, exc: StoreError) -> None:
        if not self._claims_failing:
            logger.warning("could not claim events (tried again shortly): %s", exc)
        else:
            logger.debug("could not claim events: %s", exc)
        self._claims_failing = True

    async def _idle(self) -> None:
        with anyio.move_on_after(IDLE_RECHECK_S):
            await self._wake.wait()
        self._wake = anyio.Event()

    async def _decide_batches(self) -> None:
        """No agent: claim a batch, decide each, settle them together."""
        while self._claiming:
            batch = await self._claim_or_none(CLAIM_BATCH)
            if not batch:
                await self._idle()
                continue
            outcomes: list[Outcome] = []
            try:
                for event in batch:
                    try:
                        outcomes.append(await self.decide(event))
                    except Exception as exc:  # one bad event costs itself, not the batch
                        await self._failed(event, exc)
                await self.carry_out(outcomes)
            finally:
                for event in batch:
                    self._let_go(event)
        await anyio.sleep_forever()

    async def _run_agent(self, agent: Agent, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Claim pending events as run slots free up, and handle each, ``concurrency`` at a time."""
        models = {agent.agent.model, *(s.model for s in self.config.subscriptions if s.model)}
        if OFFLINE_MODEL in models:
            logger.warning("agent: %s", OFFLINE_NOTICE)
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.warm_up, name="agent-warm-up")
            task_status.started()
            while self._claiming:
                if self.breaker.is_open:
                    await self._wait_for_model(agent)
                    continue
                free = agent.agent.concurrency - self.active  # read each time: a reload may change it
                if free <= 0:
                    await self._slot_freed.wait()
                    self._slot_freed = anyio.Event()
                    continue
                try:
                    allowed, why = await self._usage_allowance(free)
                    await self._set_paused(why)
                except StoreError as exc:
                    self._claim_failed(exc)
                    await self._idle()
                    continue
                if allowed <= 0:
                    await self._idle()
                    continue
                batch = await self._claim_or_none(allowed)
                if not batch:
                    await self._idle()
                    continue
                for event in batch:
                    self.active += 1
                    tg.start_soon(self._handle_counted, event, name=f"event:{event.event_id}")
            await anyio.sleep_forever()  # runs in flight go on; the service cancels when it is time

    async def _wait_for_model(self, agent: Agent) -> None:
        """The breaker is open: claim nothing, probe the model with backoff until it answers."""
        from agentwake import metrics
        from agentwake.agent.llm import probe, settings_for

        breaker = self.breaker
        model = breaker.model or agent.agent.model
        reason = breaker.reason()
        logger.warning(
            "agent waits: %s, %d LLM calls in a row failed (circuit_breaker_failures=%d); events stay"
            " pending while the model is probed",
            reason,
            breaker.failures,
            breaker.threshold,
        )
        metrics.observe_model_circuit(model, True)
        await self._show_paused(reason)
        probes = 0
        while self._claiming and not breaker.answered:
            probes += 1
            delay = backoff_s(probes, initial_s=breaker.probe_initial_s, max_s=breaker.probe_max_s)
            with anyio.move_on_after(delay):
                await self._stopping.wait()
            if not self._claiming or breaker.answered:
                break
            failed = await probe(settings_for(agent.agent, model))
            if failed is None:
                break
            logger.debug("agent: probe of model %s failed: %s", model, failed)
        if not self._claiming:
            return
        logger.info("agent resumes: model %s answers again; events are claimed again", model)
        breaker.is_open = breaker.answered = False
        breaker.failures = 0
        metrics.observe_model_circuit(model, False)
        await self._show_paused(None)

    async def _show_paused(self, reason: str | None) -> None:
        """What ``status`` says the agent waits for; a store error is logged, not raised."""
        try:
            await self.store.service_paused(reason)
        except Exception as exc:
            logger.warning("could not record in the store why the agent waits: %s", exc)
        else:
            self.paused = reason

    async def _handle_counted(self, event: InboxEvent) -> None:
        try:
            current: InboxEvent | None = event
            while current is not None:
                handling = self._handling.setdefault(current.id, _Handling())
                handling.event = current
                said = STOP_REASON.set(handling.stopped_because)
                try:
                    with handling.scope:
                        await self.handle(current)
                finally:
                    STOP_REASON.reset(said)
                if handling.stopped_because and not handling.lost:
                    # Cut short by a pause before its run began (a run gives its event back itself).
                    with anyio.CancelScope(shield=True):
                        await self.store.release(current.id, iso(self.clock()))
                # A newer claim of the event by this process (see _claim) is handled by this task.
                current = handling.then
                if current is not None:
                    self._handling[current.id] = _Handling()
        finally:
            self.active -= 1
            self._let_go(event)
            self._slot_freed.set()
            server = self.config.servers.get(event.server)
            if server is not None and server.max_concurrent_runs is not None:
                self._wake.set()  # its server's waiting events may be claimed now

    async def handle(self, event: InboxEvent) -> None:
        """Decide one claimed event and carry the outcome out; a failure costs this event only."""
        try:
            outcome = await self.decide(event)
            handling = self._handling.get(event.id)
            if handling is not None:
                handling.rule = outcome.rule
            if outcome.verdict == "run":
                pause = self.pauses.covering(
                    server=event.server, subscription=event.subscription, rule=outcome.rule
                )
                if pause is not None:
                    await self._wait_paused(outcome, pause)
                    return
                await self._run(outcome)
            else:
                await self.carry_out([outcome])
        except Exception as exc:  # a bug or a store error must cost this event, not the service
            await self._failed(event, exc)

    async def _wait_paused(self, outcome: Outcome, pause: Pause) -> None:
        """An event decided to run under a pause: given back untouched, to be decided again later."""
        event = outcome.event
        if outcome.holds_slot:
            await self.slots.give_back(event.id, outcome.rule)
        logger.debug("event %s waits: %s", event.event_id, pause.describe(), extra=_fields(event))
        await self.store.release(event.id, iso(self.clock() + timedelta(seconds=RULE_PAUSE_RECHECK_S)))

    async def _failed(self, event: InboxEvent, exc: Exception) -> None:
        if isinstance(exc, AgentwakeError):
            logger.error("event %s failed: %s", event.event_id, exc, extra=_fields(event))
            reason = str(exc)
        else:
            logger.exception("event %s failed unexpectedly", event.event_id, extra=_fields(event))
            reason = f"unexpected error: {type(exc).__name__}: {exc}"
        await self.store.finish([event.id], "failed", reason)

    async def carry_out(self, outcomes: Sequence[Outcome]) -> None:
        """Outcomes that do not run the agent: settled together, delayed ones given back."""
        settled: list[Settlement] = []
        for outcome in outcomes:
            event = outcome.event
            if outcome.verdict == "ignore":
                logger.info(
                    "event %s ignored by rule %s: %s",
                    event.event_id,
                    outcome.rule,
                    outcome.why,
                    extra={**_fields(event), **event_fields(rule=outcome.rule)},
                )
                settled.append(Settlement(event.id, outcome.record, "ignored"))
            elif outcome.verdict == "log":
                self.on_log(event, outcome.rule)
                settled.append(Settlement(event.id, outcome.record, "done"))
            elif outcome.verdict == "hold":
                logger.warning(
                    "event %s held for approval by rule %s (%s): agentwake approve %s, or deny it",
                    event.event_id,
                    outcome.rule,
                    outcome.why,
                    event.event_id,
                    extra={**_fields(event), **event_fields(rule=outcome.rule)},
                )
                settled.append(Settlement(event.id, outcome.record, "held"))
            elif outcome.verdict == "delay":
                assert outcome.until is not None
                logger.info(
                    "event %s waits until %s: %s",
                    event.event_id,
                    iso(outcome.until),
                    outcome.why,
                    extra=_fields(event),
                )
                await self.store.release(event.id, iso(outcome.until))
            elif outcome.verdict == "batched":
                logger.info("event %s %s", event.event_id, outcome.why, extra=_fields(event))
            else:
                raise ValueError(f"carry_out does not run the agent (event {event.event_id})")
        if settled:
            await self.store.settle(settled)

    def _servers_needed(self, outcome: Outcome) -> list[str]:
        """The servers its run's tool globs can name, in config order: a run that may use no tool
        of its event's server (or none at all) does not wait for that server."""
        from agentwake.agent.tools import servers_of

        wanted = servers_of(outcome.run.tools, self.config.servers)
        return [name for name in self.config.servers if name in wanted]

    async def _server_ready(self, name: str, timeout_s: float) -> bool:
        """Wait for ``name`` to be attached to the pool; False after ``timeout_s``, or at once when
        a stop begins (``stop_claiming``): a stop does not wait for a server that is not there."""
        assert self.pool is not None
        pool = self.pool
        ready = False

        async def wait() -> None:
            nonlocal ready
            ready = await pool.wait_for(name, timeout_s)
            tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await self._stopping.wait()
            tg.cancel_scope.cancel()
        return ready

    async def _run(self, outcome: Outcome) -> None:
        """Run the agent on an event decided "run"; give its rule's slot back after."""
        from agentwake.agent.runner import retry_at

        agent = self.agent
        event = outcome.event
        try:
            if agent is None:  # decide never says "run" without an agent; this guards the invariant
                raise AgentwakeError("no agent to run")
            # Tools come with their server's connection; without them the run could not act as
            # allowed: every server its allowed tools are on must be there.
            for name in self._servers_needed(outcome):
                server = self.config.servers[name]
                if self.pool is None or self.pool.attached(name):
                    continue
                logger.info(
                    "event %s: waiting up to %gs for server %s to connect (its tools are allowed)",
                    event.event_id,
                    server.connect_timeout_s,
                    name,
                    extra=_fields(event),
                )
                if not await self._server_ready(name, server.connect_timeout_s):
                    logger.warning(
                        "event %s waits: server %s is not connected, so its tools are not available",
                        event.event_id,
                        name,
                        extra=_fields(event),
                    )
                    await self.store.release(event.id, retry_at(1, SERVER_WAIT_S))
                    return
            leads = bool((event.decision or {}).get("batch_leader"))
            batch = await self.store.batch_members(event.id) if leads else []
            from agentwake.agent.llm import observed_by

            with observed_by(self.breaker.observe):
                await agent.run(outcome, batch=batch)
        finally:
            if outcome.holds_slot:
                with anyio.CancelScope(shield=True):
                    await self.slots.give_back(outcome.event.id, outcome.rule)
