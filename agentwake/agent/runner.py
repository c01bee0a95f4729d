"""One agent run: render the prompts, call the LLM with the allowed tools until it answers, record it all.

Exactly-once: a run is completed in the same store transaction that marks its
event done, so a crash before that leaves the event 'processing' (and the run
'running'); on restart the run is marked interrupted and the event runs again.
An event marked done is never run again by the service.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

import anyio

from agentwake.agent.fence import Fence, as_text, cap
from agentwake.agent.llm import LLMError, LLMSettings, complete
from agentwake.agent.prompts import PromptError, PromptRenderer, RenderedPrompt
from agentwake.agent.tools import Allowlist, ToolHost, ToolSpec, elapsed_ms
from agentwake.backoff import backoff_s
from agentwake.clock import iso, utc_now
from agentwake.config import AgentConfig, AgentwakeConfig, SubscriptionConfig
from agentwake.decide import Outcome
from agentwake.sanitize import Sanitized
from agentwake.store import (
    EventVerdict,
    InboxEvent,
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


@dataclass(frozen=True, slots=True)
class RunPlan:
    model: str
    allowlist: Allowlist
    allowed: list[ToolSpec]
    catalog: list[ToolSpec]
    fence: Fence
    cleaned: Sanitized
    decision: dict[str, Any]
    prompt: RenderedPrompt | None
    prompt_error: str | None


@dataclass
class _Transcript:
    messages: list[dict[str, Any]]
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    calls: list[ToolCallRecord] = field(default_factory=list)

    def progress(self) -> RunProgress:
        return RunProgress(
            list(self.messages), self.steps, self.prompt_tokens, self.completion_tokens, self.cost_usd
        )


class _RunFailed(Exception):
    def __init__(self, reason: str, *, transient: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.transient = transient


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
        """litellm takes seconds to import: import it in a worker thread now, not on the first event."""
        from agentwake.agent.llm import load_litellm_async

        await load_litellm_async()

    def _subscription(self, name: str) -> SubscriptionConfig | None:
        return next((s for s in self.config.subscriptions if s.name == name), None)

    def _settings(self, model: str) -> LLMSettings:
        agent = self.agent
        return LLMSettings(
            model=model,
            api_base=agent.api_base,
            api_key=os.environ.get(agent.api_key_env) if agent.api_key_env else None,
            max_tokens=agent.max_tokens,
            temperature=agent.temperature,
            request_timeout_s=agent.request_timeout_s,
            retries=agent.llm_retries,
            retry_initial_s=agent.retry_initial_s,
            retry_max_s=agent.retry_max_s,
            api_key_env=agent.api_key_env,
        )

    def prepare(self, outcome: Outcome, *, batch: Sequence[InboxEvent] = ()) -> RunPlan:
        """Everything a run starts from: model, allowed tools, fence, decision record and prompts.

        ``agentwake policy test`` and ``replay --dry-run`` show exactly this, so what they
        print is what a run would send.
        """
        event, decision, spec, cleaned = outcome.event, outcome.decision, outcome.run, outcome.cleaned
        sub = self._subscription(event.subscription)
        model = spec.model or self.agent.model
        allowlist = Allowlist(spec.tools)
        catalog = list(self.tools.catalog())
        allowed = allowlist.select(catalog)
        fence = Fence(datamark=self.config.sanitize.datamark)
        if sub is None:
            why = f"subscription {event.subscription!r} is no longer configured; rule {decision.rule!r}: {decision.why}"
        else:
            where = f" ({decision.where})" if decision.where else ""
            why = f"rule {decision.rule!r}{where}: {decision.why}"
        record: dict[str, Any] = {
            "action": "agent",
            "rule": decision.rule,
            "why": why,
            "model": model,
            "allowlist": list(allowlist.globs),
            "tools": [spec_.exposed for spec_ in allowed],
            "injection_score": cleaned.injection_score,
            "injection_signals": cleaned.injection_signals,
        }
        if outcome.hook:
            record["hook"] = outcome.hook
        if batch:
            record["batch"] = [other.event_id for other in batch]
        prompt: RenderedPrompt | None = None
        prompt_error: str | None = None
        try:
            prompt = self.renderer.render(
                fence=fence,
                event={
                    "event_id": event.event_id,
                    "name": event.name,
                    "timestamp": event.timestamp,
                    "subscription": event.subscription,
                    "data": cleaned.value,
                },
                subscription=sub,
                server=event.server,
                tools=[spec_.exposed for spec_ in allowed],
                rule=decision.to_record(),
                template=spec.prompt,
                batch=[
                    {
                        "event_id": other.event_id,
                        "name": other.name,
                        "timestamp": other.timestamp,
                        "data": self.renderer.clean(other.data, pii=spec.redact_pii).value,
                    }
                    for other in batch
                ],
            )
        except PromptError as exc:
            prompt_error = str(exc)
        return RunPlan(model, allowlist, allowed, catalog, fence, cleaned, record, prompt, prompt_error)

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
        catalog = plan.catalog
        failure = _RunFailed(plan.prompt_error, transient=False) if plan.prompt_error else None
        run_id = await self.store.start_run(
            event.id,
            kind=kind,
            attempt=event.attempts,
            model=model,
            decision=decision,
            system_prompt=prompt.system if prompt else None,
            user_prompt=prompt.user if prompt else None,
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
        )
        transcript = _Transcript(
            [{"role": "system", "content": prompt.system}, {"role": "user", "content": prompt.user}]
            if prompt
            else []
        )
        final_text: str | None = None
        status: RunStatus = "failed"
        try:
            if failure is None:
                try:
                    with anyio.fail_after(self.agent.timeout_s):
                        final_text = await self._loop(
                            run_id, transcript, model, allowed, catalog, fence, kind
                        )
                    status = "completed"
                except TimeoutError:
                    failure = _RunFailed(f"timed out after {self.agent.timeout_s:g}s", transient=False)
                except _RunFailed as exc:
                    failure = exc
                except Exception as exc:  # a bug or an unexpected library error: count it as a failed attempt
                    logger.exception("agent run %d on event %s failed unexpectedly", run_id, event.event_id)
                    failure = _RunFailed(f"unexpected error: {type(exc).__name__}: {exc}", transient=True)
        except BaseException:
            # Stopping the service: record what happened, the event goes again on the next start.
            with anyio.CancelScope(shield=True):
                await self.store.finish_run(
                    run_id,
                    status="interrupted",
                    reason="the service stopped during the run",
                    progress=transcript.progress(),
                    duration_ms=elapsed_ms(start),
                    verdict=EventVerdict("pending") if kind == "agent" else None,
                )
            raise
        reason = failure.reason if failure else None
        verdict = self._verdict(event, failure) if kind == "agent" else None
        await self.store.finish_run(
            run_id,
            status=status,
            reason=reason,
            progress=transcript.progress(),
            duration_ms=elapsed_ms(start),
            verdict=verdict,
        )
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

    def _verdict(self, event: InboxEvent, failure: _RunFailed | None) -> EventVerdict:
        if failure is None:
            return EventVerdict("done")
        if not failure.transient:
            return EventVerdict("failed", failure.reason)
        if event.attempts >= self.agent.max_attempts:
            return EventVerdict("failed", f"gave up after {event.attempts} attempt(s): {failure.reason}")
        return EventVerdict("pending", failure.reason, retry_at(event.attempts, self.agent.attempt_backoff_s))

    async def _loop(
        self,
        run_id: int,
        transcript: _Transcript,
        model: str,
        allowed: list[ToolSpec],
        catalog: list[ToolSpec],
        fence: Fence,
        kind: RunKind,
    ) -> str | None:
        settings = self._settings(model)
        declarations = [spec.to_llm() for spec in allowed]
        allowed_names = {spec.exposed: spec for spec in allowed}
        known = {spec.exposed: spec for spec in catalog}
        for step in range(1, self.agent.max_steps + 1):
            try:
                completion = await complete(settings, transcript.messages, declarations)
            except LLMError as exc:
                raise _RunFailed(f"LLM call failed: {exc}", transient=exc.transient) from None
            transcript.steps = step
            transcript.prompt_tokens += completion.prompt_tokens
            transcript.completion_tokens += completion.completion_tokens
            if completion.cost_usd is not None:
                transcript.cost_usd = (transcript.cost_usd or 0.0) + completion.cost_usd
            transcript.messages.append(completion.message)
            calls = completion.message.get("tool_calls") or []
            if not calls:
                await self.store.record_progress(run_id, transcript.progress(), [])
                content = completion.message.get("content")
                return content if isinstance(content, str) else None
            pairs = await self._tool_calls(
                step, calls, allowed_names, known, fence, dry_run=kind == "dry_run"
            )
            done = [record for record, _ in pairs]
            transcript.calls.extend(done)
            transcript.messages.extend(reply for _, reply in pairs)
            await self.store.record_progress(run_id, transcript.progress(), done)
        raise _RunFailed(
            f"stopped after max_steps={self.agent.max_steps} LLM calls without a final answer",
            transient=False,
        )

    async def _tool_calls(
        self,
        step: int,
        calls: list[dict[str, Any]],
        allowed: dict[str, ToolSpec],
        known: dict[str, ToolSpec],
        fence: Fence,
        *,
        dry_run: bool,
    ) -> list[tuple[ToolCallRecord, dict[str, Any]]]:
        """Parallel tool calls from one answer run side by side; the replies keep the LLM's order."""
        results: dict[int, tuple[ToolCallRecord, dict[str, Any]]] = {}

        async def one(index: int, call: dict[str, Any]) -> None:
            results[index] = await self._tool_call(step, call, allowed, known, fence, dry_run=dry_run)

        async with anyio.create_task_group() as tg:
            for index, call in enumerate(calls):
                tg.start_soon(one, index, call)
        return [results[index] for index in range(len(calls))]

    async def _tool_call(
        self,
        step: int,
        call: dict[str, Any],
        allowed: dict[str, ToolSpec],
        known: dict[str, ToolSpec],
        fence: Fence,
        *,
        dry_run: bool,
    ) -> tuple[ToolCallRecord, dict[str, Any]]:
        call_id = str(call.get("id") or f"call_{step}")
        function = call.get("function") or {}
        name = str(function.get("name") or "")
        raw_arguments = function.get("arguments") or "{}"
        spec = known.get(name)
        limit = self.agent.tool_result_max_chars
        start = time.perf_counter()

        def done(status: str, result: Any, arguments: Any) -> tuple[ToolCallRecord, dict[str, Any]]:
            cleaned = self.renderer.clean(result)
            if cleaned.injection_score >= 0.5:
                logger.warning(
                    "event %s: tool %s returned text that reads like a prompt injection (%s)",
                    _current_event.get(),
                    name,
                    ", ".join(cleaned.injection_signals),
                )
            text = cap(as_text(cleaned.value), limit)
            record = ToolCallRecord(
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
            body = text if status == "refused" else fence.wrap(text, kind="tool-result", limit=limit)
            return record, {"role": "tool", "tool_call_id": call_id, "content": body}

        try:
            arguments = json.loads(raw_arguments) if isinstance(raw_arguments, str) else raw_arguments
        except ValueError:
            return done("error", "error: the arguments are not valid JSON; nothing was called", raw_arguments)
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
                arguments,
            )
        if not isinstance(arguments, dict):
            return done("error", "error: the arguments must be a JSON object; nothing was called", arguments)
        spec = allowed[name]
        if dry_run:
            return done(
                "planned", "dry run: this call was planned, not sent; assume it would succeed", arguments
            )
        outcome = await self.tools.call(spec, arguments)
        if outcome.is_error:
            return done("error", f"error: {as_text(outcome.content)}", arguments)
        return done("ok", outcome.content, arguments)

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
        )


__all__ = ["AgentRunner", "RunPlan", "RunResult", "retry_at"]
