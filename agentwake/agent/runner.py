"""One agent run: render the prompts, call the LLM with the allowed tools until it answers, record it all.

Exactly-once: a run is completed in the same store transaction that marks its
event done, so a crash before that leaves the event 'processing' (and the run
'running'); on restart the run is marked interrupted and the event runs again.
An event marked done is never run again by the service.

Its 700-odd lines are one run, kept in one place so that what happens before a tool call is sent
(the name check, the rule's argument constraints, the journal) reads top to bottom; what the run
starts from (model, tools, prompts) is planned in agentwake.agent.plan.
"""

from __future__ import annotations

import gc
import json
import logging
import time
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

import anyio

from agentwake import metrics
from agentwake.agent.fence import Fence, as_text, cap
from agentwake.agent.journal import (
    SETTLED,
    CallDone,
    RunScope,
    journaled_for,
    pending_calls,
    resumable,
    unknown_reason,
)
from agentwake.agent.llm import LLMError, LLMSettings, complete, load_litellm_async, settings_for
from agentwake.agent.plan import RunPlan, plan_run
from agentwake.agent.prompts import PromptRenderer
from agentwake.agent.stopping import stop_reason
from agentwake.agent.tools import ToolHost, ToolSpec, elapsed_ms
from agentwake.authority import Authority
from agentwake.backoff import backoff_s
from agentwake.clock import iso, utc_now
from agentwake.config import OFFLINE_MODEL, AgentConfig, AgentwakeConfig
from agentwake.decide import Outcome
from agentwake.errors import LeaseLost
from agentwake.logs import event_fields
from agentwake.store import (
    EventVerdict,
    InboxEvent,
    JournaledCall,
    RunKind,
    RunProgress,
    RunStatus,
    Store,
    ToolCallRecord,
    summary_line,
)

logger = logging.getLogger(__name__)

RETRY_CAP_S: Final = 300.0

# The eventId of the run in progress in this task (and its tool-call tasks): its warnings name it.
_current_event: ContextVar[str | None] = ContextVar("agentwake_run_event", default=None)


class _NameTheEvent(logging.Filter):
    """Puts ``event <id>:`` before a line the LLM stage logs during a run (its retry warnings),
    which does not know the event; the id is also the record's ``event_id`` attribute."""

    def filter(self, record: logging.LogRecord) -> bool:
        event_id = _current_event.get()
        if event_id is not None and not hasattr(record, "event_id"):
            record.event_id = event_id
            record.msg = f"event {event_id}: {record.getMessage()}"
            record.args = None
        return True


logging.getLogger("agentwake.agent.llm").addFilter(_NameTheEvent())


@dataclass(frozen=True, slots=True)
class RunResult:
    run_id: int
    status: RunStatus
    reason: str | None
    event_state: str | None
    steps: int
    tool_calls: list[ToolCallRecord]
    messages: list[dict[str, Any]]
    final_text: str | None


@dataclass
class _Transcript:
    messages: list[dict[str, Any]]
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    calls: list[ToolCallRecord] = field(default_factory=list)
    cached_tokens: int = 0

    def progress(self) -> RunProgress:
        return RunProgress(
            list(self.messages),
            self.steps,
            self.prompt_tokens,
            self.completion_tokens,
            self.cost_usd,
            self.cached_tokens,
        )


class _RunFailed(Exception):
    """``dead``: the event needs a person (a tool call's outcome is unknown); no automatic retry."""

    def __init__(self, reason: str, *, transient: bool, dead: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.transient = transient
        self.dead = dead


def _as_recorded(raw: Any) -> Any:
    """A refused call's arguments for the action log: as JSON where they parse, else as sent."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def retry_at(attempt: int, base_s: float) -> str:
    """When a transiently failed event may be claimed again: the shared backoff, capped at RETRY_CAP_S."""
    return iso(utc_now() + timedelta(seconds=backoff_s(attempt, initial_s=base_s, max_s=RETRY_CAP_S)))


@dataclass
class AgentRunner:
    config: AgentwakeConfig
    agent: AgentConfig
    store: Store
    tools: ToolHost
    renderer: PromptRenderer

    @classmethod
    def build(cls, config: AgentwakeConfig, store: Store, tools: ToolHost) -> AgentRunner:
        if config.agent is None:
            raise ValueError("no [agent] section")
        return cls(config, config.agent, store, tools, PromptRenderer(config.agent, config.sanitize))

    async def warm_up(self) -> None:
        """litellm takes seconds to import: import it in a worker thread now, not on the first event.

        Not at all when every configured model is ``agentwake/offline`` (a rule's model loads it on
        first use). Its hundreds of thousands of long-lived objects are then frozen, so the garbage
        collector does not scan them again and again.
        """
        from agentwake.agent.llm import litellm_loaded, load_litellm_async

        models = {self.agent.model, *(s.model for s in self.config.subscriptions if s.model)}
        if models <= {OFFLINE_MODEL} or litellm_loaded():
            return
        await load_litellm_async()
        gc.collect()
        gc.freeze()

    def _settings(self, model: str) -> LLMSettings:
        return settings_for(self.agent, model)

    def prepare(self, outcome: Outcome, *, batch: Sequence[InboxEvent] = ()) -> RunPlan:
        """Everything a run starts from (agentwake.agent.plan): ``agentwake policy test`` and
        ``replay --dry-run`` show exactly this, so what they print is what a run would send."""
        return plan_run(self.config, self.renderer, self.tools, outcome, batch=batch)

    async def run(
        self, outcome: Outcome, *, kind: RunKind = "agent", batch: Sequence[InboxEvent] = ()
    ) -> RunResult:
        """Run the agent on the outcome's event. ``kind`` agent moves the event's state; replay and
        dry_run do not. The outcome's run spec (the rule's tools, prompt and model) is what the run uses.
        """
        event = outcome.event
        start = time.perf_counter()
        token = _current_event.set(event.event_id)
        try:
            return await self._run(outcome, kind, batch, start)
        finally:
            _current_event.reset(token)

    async def _run(
        self, outcome: Outcome, kind: RunKind, batch: Sequence[InboxEvent], start: float
    ) -> RunResult:
        event = outcome.event
        plan = self.prepare(outcome, batch=batch)
        model, allowed, fence, cleaned, decision, prompt = (
            plan.model,
            plan.allowed,
            plan.fence,
            plan.cleaned,
            plan.decision,
            plan.prompt,
        )
        failure = _RunFailed(plan.prompt_error, transient=False) if plan.prompt_error else None
        resumed = (
            resumable(await self.store.resume_point(event.id), fence.datamark)
            if kind == "agent" and failure is None
            else None
        )
        if resumed is not None:
            fence = resumed[1]
        first = resumed[0].messages if resumed else None
        run_id = await self.store.start_run(
            event.id,
            kind=kind,
            attempt=event.attempts,
            model=model,
            decision=decision,
            system_prompt=str(first[0].get("content")) if first else (prompt.system if prompt else None),
            user_prompt=str(first[1].get("content")) if first else (prompt.user if prompt else None),
            sanitize_report=cleaned.report(),
        )
        logger.info(
            "agent: event %s (%s) run %d started%s: rule %s, model %s, attempt %d, %d tool(s) allowed",
            event.event_id,
            event.subscription,
            run_id,
            "" if kind == "agent" else f" ({kind})",
            decision.get("rule"),
            model,
            event.attempts,
            len(allowed),
            extra=event_fields(
                subscription=event.subscription, server=event.server, event_id=event.event_id, run_id=run_id
            ),
        )
        transcript = _Transcript(
            [{"role": "system", "content": prompt.system}, {"role": "user", "content": prompt.user}]
            if prompt
            else []
        )
        journal: dict[str, JournaledCall] = {}
        if resumed is not None:
            point = resumed[0]
            transcript = _Transcript(
                list(point.messages),
                point.steps,
                point.prompt_tokens,
                point.completion_tokens,
                point.cost_usd,
                cached_tokens=point.cached_tokens,
            )
            journal = journaled_for(pending_calls(point.messages), point.calls)
            await self.store.adopt_run(run_id, point.run_id, list(journal), transcript.progress())
            reused = sum(1 for c in journal.values() if c.status in SETTLED)
            logger.info(
                "agent: event %s run %d goes on from run %d after %d step(s); %d tool call(s) of its last step"
                " were made and are not made again",
                event.event_id,
                run_id,
                point.run_id,
                point.steps,
                reused,
                extra=event_fields(
                    subscription=event.subscription,
                    server=event.server,
                    event_id=event.event_id,
                    run_id=run_id,
                ),
            )
        scope = RunScope(run_id, event, kind)
        final_text: str | None = None
        status: RunStatus = "failed"
        lost: LeaseLost | None = None
        try:
            if failure is None:
                try:
                    # litellm's first import (seconds, many more on a busy machine) is not the
                    # model's time: a run that starts while warm_up is still importing waits for it
                    # outside its deadline.
                    await load_litellm_async()
                    with anyio.fail_after(self.agent.timeout_s):
                        final_text = await self._loop(scope, transcript, model, plan, fence, journal)
                    status = "completed"
                except TimeoutError:
                    # A slow provider is as transient as one that fails: the event goes again.
                    failure = _RunFailed(f"timed out after {self.agent.timeout_s:g}s", transient=True)
                except _RunFailed as exc:
                    failure = exc
                except LeaseLost as exc:
                    lost = exc
                except Exception as exc:  # a bug or an unexpected library error: count it as a failed attempt
                    logger.exception("agent run %d on event %s failed unexpectedly", run_id, event.event_id)
                    failure = _RunFailed(f"unexpected error: {type(exc).__name__}: {exc}", transient=True)
        except BaseException:
            # Stopping the service: record what happened, the event goes again on the next start.
            with anyio.CancelScope(shield=True):
                await self.store.finish_run(
                    run_id,
                    status="interrupted",
                    reason=stop_reason(),
                    progress=transcript.progress(),
                    duration_ms=elapsed_ms(start),
                    # The stop is not the event's fault: the attempt is not counted.
                    verdict=EventVerdict("pending", refund_attempt=True) if kind == "agent" else None,
                )
                self._observe(transcript, "interrupted", start)
            raise
        if lost is not None:
            return await self._lease_lost(event, run_id, lost, transcript, kind, start)
        reason = failure.reason if failure else None
        verdict = self._verdict(event, failure) if kind == "agent" else None
        held = await self.store.finish_run(
            run_id,
            status=status,
            reason=reason,
            progress=transcript.progress(),
            duration_ms=elapsed_ms(start),
            verdict=verdict,
        )
        self._observe(transcript, status if held else "interrupted", start)
        if not held:
            logger.warning(
                "agent: event %s run %d ended after its lease lapsed and the event was claimed again;"
                " its outcome is not applied",
                event.event_id,
                run_id,
            )
            status, verdict = "interrupted", None
        self._log(event, run_id, status, reason, transcript, verdict, elapsed_ms(start), final_text)
        return RunResult(
            run_id,
            status,
            reason,
            verdict.state if verdict else None,
            transcript.steps,
            transcript.calls,
            transcript.messages,
            final_text,
        )

    async def _lease_lost(
        self,
        event: InboxEvent,
        run_id: int,
        lost: LeaseLost,
        transcript: _Transcript,
        kind: RunKind,
        start: float,
    ) -> RunResult:
        """A tool call was refused by the journal's fence: the run ends here, having sent nothing
        more, and leaves its event alone (not a failure of the event: its current claim handles it)."""
        reason = f"lease lost: {lost.why}; its tool call was not sent"
        await self.store.finish_run(
            run_id,
            status="interrupted",
            reason=reason,
            progress=transcript.progress(),
            duration_ms=elapsed_ms(start),
            verdict=None,
        )
        self._observe(transcript, "interrupted", start)
        logger.warning(
            "agent: event %s run %d stopped: %s",
            event.event_id,
            run_id,
            reason,
            extra=event_fields(
                subscription=event.subscription, server=event.server, event_id=event.event_id, run_id=run_id
            ),
        )
        return RunResult(
            run_id,
            "interrupted",
            reason,
            None,
            transcript.steps,
            transcript.calls,
            transcript.messages,
            None,
        )

    @staticmethod
    def _observe(transcript: _Transcript, status: str, start: float) -> None:
        metrics.observe_run(
            status,
            elapsed_ms(start),
            transcript.prompt_tokens,
            transcript.completion_tokens,
            transcript.cost_usd,
            transcript.cached_tokens,
        )

    def _verdict(self, event: InboxEvent, failure: _RunFailed | None) -> EventVerdict:
        if failure is None:
            return EventVerdict("done")
        if failure.dead:
            return EventVerdict("dead", failure.reason)
        if not failure.transient:
            return EventVerdict("failed", failure.reason)
        if event.attempts >= self.agent.max_attempts:
            return EventVerdict("dead", f"gave up after {event.attempts} attempt(s): {failure.reason}")
        return EventVerdict("pending", failure.reason, retry_at(event.attempts, self.agent.attempt_backoff_s))

    async def _loop(
        self,
        scope: RunScope,
        transcript: _Transcript,
        model: str,
        plan: RunPlan,
        fence: Fence,
        journal: dict[str, JournaledCall],
    ) -> str | None:
        settings = self._settings(model)
        declarations = [spec.to_llm() for spec in plan.offered()]
        allowed_names = {spec.exposed: spec for spec in plan.allowed}
        known = {spec.exposed: spec for spec in plan.catalog}
        authority = plan.authority
        shared = plan.prompt.shared if plan.prompt else ""
        # A resumed run first answers the calls its predecessor was making when it stopped.
        pending = pending_calls(transcript.messages)
        if pending:
            unknown = [
                journal[c["id"]]
                for c in pending
                if c.get("id") in journal and journal[c["id"]].status == "sent"
            ]
            if unknown:
                raise _RunFailed(unknown_reason(scope.event, unknown), transient=False, dead=True)
            await self._step_calls(
                scope, transcript, transcript.steps, pending, allowed_names, known, authority, fence, journal
            )
        for _ in range(self.agent.max_steps):
            try:
                completion = await complete(settings, transcript.messages, declarations, shared=shared)
            except LLMError as exc:
                # Answers that came back unusable still cost tokens: the run's usage counts them.
                transcript.prompt_tokens += exc.prompt_tokens
                transcript.completion_tokens += exc.completion_tokens
                transcript.cached_tokens += exc.cached_tokens
                if exc.cost_usd is not None:
                    transcript.cost_usd = (transcript.cost_usd or 0.0) + exc.cost_usd
                raise _RunFailed(f"LLM call failed: {exc}", transient=exc.transient) from None
            transcript.steps += 1
            transcript.prompt_tokens += completion.prompt_tokens
            transcript.completion_tokens += completion.completion_tokens
            transcript.cached_tokens += completion.cached_tokens
            if completion.cost_usd is not None:
                transcript.cost_usd = (transcript.cost_usd or 0.0) + completion.cost_usd
            transcript.messages.append(completion.message)
            # Stored before any call goes out: a rerun knows which calls this answer asked for.
            await self.store.record_progress(scope.run_id, transcript.progress(), [])
            calls = completion.message.get("tool_calls") or []
            if not calls:
                content = completion.message.get("content")
                return content if isinstance(content, str) else None
            await self._step_calls(
                scope, transcript, transcript.steps, calls, allowed_names, known, authority, fence, {}
            )
        raise _RunFailed(
            f"stopped after max_steps={self.agent.max_steps} LLM calls without a final answer",
            transient=False,
        )

    async def _step_calls(
        self,
        scope: RunScope,
        transcript: _Transcript,
        step: int,
        calls: list[dict[str, Any]],
        allowed: dict[str, ToolSpec],
        known: dict[str, ToolSpec],
        authority: Authority,
        fence: Fence,
        journal: dict[str, JournaledCall],
    ) -> None:
        """One answer's tool calls, side by side; the replies keep the LLM's order.

        A call the journal's fence refuses (``LeaseLost``) is not sent; the others of the answer end
        as they would (each is fenced on its own), then the run ends with the refusal.
        """
        results: dict[int, CallDone] = {}
        lost: list[LeaseLost] = []

        async def one(index: int, call: dict[str, Any]) -> None:
            journaled = journal.get(str(call.get("id")))
            try:
                results[index] = await self._tool_call(
                    scope, step, call, allowed, known, authority, fence, journaled
                )
            except LeaseLost as exc:
                lost.append(exc)

        async with anyio.create_task_group() as tg:
            for index, call in enumerate(calls):
                tg.start_soon(one, index, call)
        if lost:
            finished = [results[index] for index in sorted(results)]
            transcript.calls.extend(d.record for d in finished)
            await self.store.record_progress(
                scope.run_id, transcript.progress(), [d.record for d in finished if not d.journaled]
            )
            raise lost[0]
        done = [results[index] for index in range(len(calls))]
        transcript.calls.extend(d.record for d in done)
        unknown = [d for d in done if d.unknown]
        if not unknown:
            transcript.messages.extend(d.reply for d in done)
        await self.store.record_progress(
            scope.run_id, transcript.progress(), [d.record for d in done if not d.journaled]
        )
        if unknown:
            raise _RunFailed(
                unknown_reason(scope.event, [d.record for d in unknown]), transient=False, dead=True
            )

    async def _tool_call(
        self,
        scope: RunScope,
        step: int,
        call: dict[str, Any],
        allowed: dict[str, ToolSpec],
        known: dict[str, ToolSpec],
        authority: Authority,
        fence: Fence,
        journaled: JournaledCall | None = None,
    ) -> CallDone:
        call_id = str(call.get("id") or f"call_{step}")
        function = call.get("function") or {}
        name = str(function.get("name") or "")
        raw_arguments = function.get("arguments") or "{}"
        spec = known.get(name)
        limit = self.agent.tool_result_max_chars
        start = time.perf_counter()

        def record(status: str, text: str | None, arguments: Any, *, observe: bool = True) -> ToolCallRecord:
            if observe:
                # A name the model made up is no label: /metrics would grow with whatever it invents.
                metrics.observe_tool_call(name if name in allowed else metrics.REFUSED_TOOL, status)
            return ToolCallRecord(
                step=step,
                call_id=call_id,
                tool=name,
                server=spec.server if spec else None,
                name=spec.name if spec else None,
                arguments=arguments,
                status=status,  # type: ignore[arg-type]
                result=text,
                duration_ms=elapsed_ms(start),
            )

        def reply(body: str) -> dict[str, Any]:
            return {"role": "tool", "tool_call_id": call_id, "content": body}

        def done(status: str, result: Any, arguments: Any) -> CallDone:
            text = self._result_text(name, result)
            body = text if status == "refused" else fence.wrap(text, kind="tool-result", limit=limit)
            return CallDone(record(status, text, arguments), reply(body))

        if journaled is not None and journaled.status in SETTLED and journaled.reply is not None:
            # Made by an earlier run of this event: the model gets the same reply; nothing is sent.
            return CallDone(
                record("reused", journaled.result, journaled.arguments),
                reply(journaled.reply),
                journaled=True,
            )
        # An unknown tool is refused before its arguments are even parsed.
        if name not in allowed:
            logger.warning(
                "event %s: agent asked for tool %s, which is not allowed for this event: refused",
                _current_event.get(),
                name,
            )
            return done(
                "refused",
                f"refused: the tool {name!r} is not allowed for this event, and the call was not sent."
                f" Allowed tools: {', '.join(allowed) or 'none'}.",
                _as_recorded(raw_arguments),
            )
        try:
            arguments = json.loads(raw_arguments) if isinstance(raw_arguments, str) else raw_arguments
        except ValueError:
            return done("error", "error: the arguments are not valid JSON; nothing was called", raw_arguments)
        if not isinstance(arguments, dict):
            return done("error", "error: the arguments must be a JSON object; nothing was called", arguments)
        spec = allowed[name]
        arguments, broken = authority.check(name, spec.input_schema, arguments)
        if broken is not None:
            logger.warning(
                "event %s: agent called %s with arguments the rule %s does not allow (%s): refused",
                _current_event.get(),
                name,
                authority.rule,
                broken,
            )
            return done(
                "refused",
                f"refused: {broken} (rule {authority.rule!r} constrains {name}), and the call was not sent.",
                arguments,
            )
        if scope.kind == "dry_run":
            return done(
                "planned", "dry run: this call was planned, not sent; assume it would succeed", arguments
            )
        # A resend (agentwake retry --resend-unknown) carries the first send's key.
        key = (journaled.idempotency_key if journaled else None) or scope.idempotency_key(step, call_id)
        sent = record("sent", None, arguments, observe=False)
        # Fenced on the run's claim: a run whose lease lapsed (or whose event was claimed again)
        # gets LeaseLost here and sends nothing.
        row = await self.store.journal_tool_call(scope.run_id, sent, key, now=iso(utc_now()))
        outcome = await self.tools.call(spec, arguments, idempotency_key=key)
        if outcome.unknown:
            metrics.observe_tool_call(name, "unknown")
            return CallDone(sent, reply(""), journaled=True, unknown=True)
        status = "error" if outcome.is_error else "ok"
        finished = done(
            status, f"error: {as_text(outcome.content)}" if outcome.is_error else outcome.content, arguments
        )
        await self.store.settle_tool_call(
            row,
            status=finished.record.status,
            result=finished.record.result,
            reply=str(finished.reply["content"]),
            duration_ms=elapsed_ms(start),
        )
        return CallDone(finished.record, finished.reply, journaled=True)

    def _result_text(self, name: str, result: Any) -> str:
        """A tool's result, sanitized and capped as the model will see it."""
        cleaned = self.renderer.clean(result)
        if cleaned.injection_score >= 0.5:
            logger.warning(
                "event %s: tool %s returned text that reads like a prompt injection (%s)",
                _current_event.get(),
                name,
                ", ".join(cleaned.injection_signals),
            )
        return cap(as_text(cleaned.value), self.agent.tool_result_max_chars)

    def _log(
        self,
        event: InboxEvent,
        run_id: int,
        status: RunStatus,
        reason: str | None,
        transcript: _Transcript,
        verdict: EventVerdict | None,
        duration_ms: int,
        final_text: str | None = None,
    ) -> None:
        """The line that ends a run: outcome, steps, tool calls, duration and the model's summary."""
        calls = (
            f"{len(transcript.calls)} tool call(s): "
            + ", ".join(f"{c.tool} {c.status}" for c in transcript.calls)
            if transcript.calls
            else "no tool calls"
        )
        if status == "completed":
            logger.info(
                "agent: event %s (%s) run %d completed in %d ms, %d step(s), %s; summary: %s",
                event.event_id,
                event.subscription,
                run_id,
                duration_ms,
                transcript.steps,
                calls,
                summary_line(final_text) or "(no final message)",
                extra=event_fields(
                    subscription=event.subscription,
                    server=event.server,
                    event_id=event.event_id,
                    run_id=run_id,
                ),
            )
            return
        then = f"; event {verdict.state}" if verdict else ""
        if verdict and verdict.retry_at:
            then += f", next attempt after {verdict.retry_at}"
        logger.error(
            "agent: event %s (%s) run %d failed after %d ms, %d step(s): %s (%s)%s",
            event.event_id,
            event.subscription,
            run_id,
            duration_ms,
            transcript.steps,
            reason,
            calls,
            then,
            extra=event_fields(
                subscription=event.subscription, server=event.server, event_id=event.event_id, run_id=run_id
            ),
        )


__all__ = ["AgentRunner", "RunPlan", "RunResult", "retry_at"]
