"""The decision stage: one inbox event in, one ``Outcome`` out.

    sanitize      bounds, invisible characters, secrets; the injection score
      -> policy   the first matching rule (``policies/*.toml``), else the default
      -> hook     the rule's Python hook, if any (user code: in a thread, with a timeout;
                  on failure the rule's fallback action)
      -> limits   what this service can do: no ``[agent]`` section, or a subscription with
                  ``agent = false``, turns a run into "log"
      -> flow     max_concurrent (a slot taken now), then dedup, debounce and rate limit,
                  checked and marked atomically by the store
      => Outcome  run now | batched | hold for approval | ignore | log | delay until T,
                  with the sanitized payload and what the run must use (tools, prompt, model)

``decide`` is the one function that decides: the service's worker, ``agentwake policy
test`` and ``agentwake replay`` all call it, so they cannot disagree. Everything here but
the hook call and the store's flow step is a pure function, tested without I/O. An
event is sanitized here, once, before anything looks at its data.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

import anyio

from agentwake.authority import ABSENT as MISSING
from agentwake.authority import Authority, lookup
from agentwake.clock import iso, parse_iso
from agentwake.config import AgentwakeConfig, SubscriptionConfig
from agentwake.policy import ACTIONS, Decision, Policy, Rule
from agentwake.sanitize import Sanitized, sanitize_with
from agentwake.store.records import FlowGate, FlowOutcome, InboxEvent

if TYPE_CHECKING:
    from agentwake.store import Store

logger = logging.getLogger(__name__)

# An event whose rule is at its max_concurrent goes back to the inbox for this long.
RULE_BUSY_S: Final = 1.0

Verdict = Literal["run", "batched", "hold", "ignore", "log", "delay"]


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What an agent run on the event must use: the rule's tools, prompt and model, else the subscription's."""

    tools: tuple[str, ...]
    prompt: str | None
    model: str | None
    redact_pii: bool = False
    args: Mapping[str, Any] | None = None
    allow_mentions: bool = False
    rule: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happens to one event, and everything the run needs if it runs.

    ``record`` is the decision as stored with the event. ``until`` is when a delayed
    event may be claimed again, or when an opened batch runs. ``holds_slot`` says a
    max_concurrent slot was taken for this run; whoever runs it gives it back.
    """

    event: InboxEvent
    verdict: Verdict
    why: str
    cleaned: Sanitized
    decision: Decision
    run: RunSpec
    record: dict[str, Any]
    hook: str | None = None
    until: datetime | None = None
    batch_leader: int | None = None
    resumed: bool = False
    holds_slot: bool = False

    @property
    def rule(self) -> str:
        return self.decision.rule


class FlowLedger(Protocol):
    """Where flow control is checked and marked, atomically: the store (``Store.flow_gate``)."""

    async def flow_gate(
        self, event_row: int, rule: str, record: dict[str, Any], gate: FlowGate
    ) -> FlowOutcome: ...


class NoHistory:
    """A ledger with no earlier events and no writes: what a sample event would face first.

    For ``agentwake policy test``: a dedup or rate limit lets it through; debounce opens a batch.
    """

    async def flow_gate(
        self, event_row: int, rule: str, record: dict[str, Any], gate: FlowGate
    ) -> FlowOutcome:
        return FlowOutcome("leader" if gate.batch_key is not None else "run")


class Slots(Protocol):
    """Where a rule's ``max_concurrent`` run slots are taken and given back, per claimed event."""

    async def take(self, event_row: int, rule: str, limit: int) -> bool: ...

    async def give_back(self, event_row: int, rule: str) -> None: ...


@dataclass
class RuleSlots:
    """Runs in progress per rule, counted in this process's memory (a decision with no store)."""

    running: dict[str, int] = field(default_factory=dict)

    async def take(self, event_row: int, rule: str, limit: int) -> bool:
        current = self.running.get(rule, 0)
        if current >= limit:
            return False
        self.running[rule] = current + 1
        return True

    async def give_back(self, event_row: int, rule: str) -> None:
        self.running[rule] = max(0, self.running.get(rule, 0) - 1)


@dataclass
class StoreSlots:
    """Runs in progress per rule, counted by the store over every process that shares it."""

    store: Store
    clock: Callable[[], datetime]

    async def take(self, event_row: int, rule: str, limit: int) -> bool:
        return await self.store.take_rule_slot(event_row, rule, limit, iso(self.clock()))

    async def give_back(self, event_row: int, rule: str) -> None:
        await self.store.give_rule_slot(event_row)


# ---- the pure core ----------------------------------------------------------------------------


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


def apply_hook_answer(decision: Decision, answer: object) -> Decision:
    """A hook returns None (keep the rule's decision), an action name, or a dict of action/why/tools."""
    if answer is None:
        return decision
    if isinstance(answer, str):
        answer = {"action": answer}
    if not isinstance(answer, dict):
        raise TypeError(f"a hook returns None, an action name or a dict, not {type(answer).__name__}")
    action = answer.get("action", decision.action)
    if action not in ACTIONS:
        raise ValueError(f"a hook returned the unknown action {action!r}")
    tools = answer.get("tools", decision.tools)
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, str) for t in tools)):
        raise TypeError("a hook's 'tools' must be a list of globs")
    why = str(answer.get("why") or f"hook chose {action}")
    return replace(decision, action=action, why=f"{decision.why}; {why}", tools=tools)


def resumed_decision(event: InboxEvent) -> Decision | None:
    """The stored decision of an event decided before: approved by a person, or a batch due now."""
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
        args=stored.get("rule_args"),
        allow_mentions=bool(stored.get("allow_mentions")),
    )


def run_spec(decision: Decision, subscription: SubscriptionConfig | None, rule: Rule | None) -> RunSpec:
    """The rule's tools, prompt and model win over the subscription's; no tools unless one names them.
    The subscription's ``args`` constrain its own tools (a rule's args for the same tool win)."""
    own = decision.tools is not None
    tools = decision.tools if own else (subscription.tools if subscription else [])
    return RunSpec(
        tools=tuple(tools or ()),
        prompt=decision.prompt,
        model=decision.model or (subscription.model if subscription else None),
        redact_pii=bool(rule and rule.redact_pii),
        # The subscription's args go with its tools, when the rule names none.
        args=decision.args if own or subscription is None else {**subscription.args, **(decision.args or {})},
        allow_mentions=decision.allow_mentions,
        rule=decision.rule,
    )


def authority_for(spec: RunSpec, view: Mapping[str, object]) -> Authority:
    """The run's authority: the rule's argument constraints bound to this event."""
    return Authority.bind(spec.args, view, allow_mentions=spec.allow_mentions, rule=spec.rule)


def flow_key(view: Mapping[str, object], path: str | None) -> str:
    """The value a rule counts by, as text; one shared key when the rule names none."""
    if path is None:
        return "*"
    value = lookup(view, path)
    if value is MISSING:
        return "(missing)"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def flow_gate_for(rule: Rule, view: Mapping[str, object], now: datetime) -> FlowGate:
    """The checks a rule's flow control makes on one event at ``now``, windows computed."""
    gate = FlowGate(now=iso(now))
    if rule.dedup:
        gate = replace(
            gate,
            dedup_key=flow_key(view, rule.dedup.key),
            dedup_since=iso(now - timedelta(seconds=rule.dedup.window_s)),
        )
    if rule.rate_limit:
        gate = replace(
            gate,
            rate_key=flow_key(view, rule.rate_limit.key),
            rate_since=iso(now - timedelta(seconds=rule.rate_limit.window_s)),
            rate_max=rule.rate_limit.max,
        )
    if rule.debounce:
        gate = replace(
            gate,
            batch_key=flow_key(view, rule.debounce.key),
            batch_since=iso(now - timedelta(seconds=rule.debounce.window_s)),
            batch_due=iso(now + timedelta(seconds=rule.debounce.window_s)),
            batch_max=rule.debounce.max_events,
        )
    return gate


def flow_verdict(rule: Rule, found: FlowOutcome, now: datetime) -> tuple[Verdict, str, datetime | None]:
    """What the store's flow check means for the event: (verdict, why, until)."""
    if found.verdict == "run":
        return "run", "", None
    if found.verdict == "duplicate":
        assert rule.dedup is not None
        return (
            "ignore",
            f"duplicate: {rule.dedup.key} was seen in event {found.other_event_id} (row {found.other})"
            f" within {rule.dedup.window_s:g}s",
            None,
        )
    if found.verdict == "over_limit":
        assert rule.rate_limit is not None
        limit = rule.rate_limit
        why = f"over the rate limit of {limit.max} per {limit.window_s:g}s" + (
            f" for {limit.key}" if limit.key else ""
        )
        if limit.over_limit == "delay" and found.oldest:
            start = parse_iso(found.oldest) or now
            return "delay", why, start + timedelta(seconds=limit.window_s)
        return ("ignore" if limit.over_limit == "ignore" else "log"), why, None
    window = rule.debounce.window_s if rule.debounce else 0.0
    if found.verdict == "batched":
        return "batched", f"joins the batch of event row {found.other} (rule {rule.name})", None
    return (
        "batched",
        f"opens a batch (rule {rule.name}); it runs in {window:g}s",
        now + timedelta(seconds=window),
    )


def agent_unavailable(config: AgentwakeConfig, subscription: SubscriptionConfig | None) -> str | None:
    """Why no agent can run for this event, or None when one can."""
    if config.agent is None:
        return "no [agent] section in the config"
    if subscription is not None and not subscription.agent:
        return f"subscription {subscription.name!r} sets agent = false"
    return None


# ---- the stage ----------------------------------------------------------------------------------


async def call_hook(
    policy: Policy, decision: Decision, view: Mapping[str, object]
) -> tuple[Decision, str | None]:
    """The matched rule's hook applied to its decision, and what it did (None without a hook).

    The hook is user code: it runs in a worker thread, bounded by the rule's
    ``hook_timeout_s``; any failure means the rule's ``fallback`` action.
    """
    rule = decision.source
    if rule is None or rule.hook is None:
        return decision, None
    hook = policy.hooks.get(rule.name)
    try:
        if hook is None:
            raise RuntimeError(f"hook {rule.hook} is not loaded")
        with anyio.fail_after(rule.hook_timeout_s):
            answer = await anyio.to_thread.run_sync(hook, dict(view), abandon_on_cancel=True)
        changed = apply_hook_answer(decision, answer)
        said = "kept the rule's decision" if answer is None else f"answered {changed.action}"
        return changed, f"hook {rule.hook} {said}"
    except Exception as exc:  # the hook is user code: any failure means the rule's fallback
        reason = "timed out" if isinstance(exc, TimeoutError) else f"failed: {type(exc).__name__}: {exc}"
        logger.warning(
            "rule %s: hook %s %s; using the fallback action %s", rule.name, rule.hook, reason, rule.fallback
        )
        fallback = replace(
            decision, action=rule.fallback, why=f"{decision.why}; hook {reason}, fallback {rule.fallback}"
        )
        return fallback, f"hook {rule.hook} {reason}; fallback {rule.fallback}"


async def decide(
    event: InboxEvent,
    *,
    config: AgentwakeConfig,
    policy: Policy,
    now: datetime,
    flow: FlowLedger | None,
    slots: Slots | None = None,
) -> Outcome:
    """Decide what happens to ``event`` at ``now``. See the module docstring for the steps.

    ``flow`` is where flow control is checked and marked (the store; ``NoHistory`` for a
    sample event); None skips flow control (a replay, on purpose). ``slots`` counts the
    runs in progress per rule for ``max_concurrent``; a "run" outcome with
    ``holds_slot`` keeps a slot, which the caller gives back after the run.
    """
    subscription = next((s for s in config.subscriptions if s.name == event.subscription), None)
    cleaned = sanitize_with(config.sanitize, event.data)
    view = policy_view(event, cleaned.injection_score)
    decision = resumed_decision(event)
    resumed = decision is not None
    hook: str | None = None
    if decision is None:
        decision, hook = await call_hook(policy, policy.decide(view), view)
    rule = decision.source or policy.rule(decision.rule)
    if rule is not None and rule.redact_pii and not config.sanitize.redact_pii:
        cleaned = sanitize_with(config.sanitize, event.data, pii=True)
    spec = run_spec(decision, subscription, rule)
    record: dict[str, Any] = {**decision.to_record(), "injection_score": cleaned.injection_score}

    def outcome(verdict: Verdict, why: str, **more: Any) -> Outcome:
        return Outcome(
            event, verdict, why, cleaned, decision, spec, record, hook=hook, resumed=resumed, **more
        )

    if decision.action == "ignore":
        return outcome("ignore", decision.why)
    if decision.action == "log":
        return outcome("log", decision.why)
    unavailable = agent_unavailable(config, subscription)
    if unavailable is not None:
        record = {**record, "action": "log", "why": f"{decision.why}; {unavailable}"}
        return outcome("log", f"{decision.action} wanted, but {unavailable}")
    if decision.action == "approve" and not resumed:
        # What a person approves, in words: shown with the held event, before anything runs.
        record = {**record, "authority": authority_for(spec, view).describe(spec.tools)}
        return outcome("hold", decision.why)
    # An agent run. max_concurrent first: an event at its rule's limit goes back before any flow mark.
    rule_name = rule.name if rule else decision.rule
    limit = rule.max_concurrent if rule else None
    holds_slot = slots is not None and limit is not None
    if slots is not None and limit is not None and not await slots.take(event.id, rule_name, limit):
        why = f"rule {rule_name} is at its max_concurrent of {limit}"
        return outcome("delay", why, until=now + timedelta(seconds=RULE_BUSY_S))
    try:
        if not resumed and flow is not None and rule is not None:
            gate = flow_gate_for(rule, view, now)
            if not gate.empty:
                found = await flow.flow_gate(event.id, rule.name, record, gate)
                verdict, why, until = flow_verdict(rule, found, now)
                if verdict != "run":
                    if verdict in ("ignore", "log"):
                        record = {**record, "why": why, **({"action": "log"} if verdict == "log" else {})}
                    if holds_slot and slots is not None:
                        await slots.give_back(event.id, rule_name)
                    return outcome(verdict, why, until=until, batch_leader=found.other)
    except BaseException:
        if holds_slot and slots is not None:
            with anyio.CancelScope(shield=True):
                await slots.give_back(event.id, rule_name)
        raise
    return outcome("run", decision.why, holds_slot=holds_slot)


__all__ = [
    "RULE_BUSY_S",
    "FlowLedger",
    "NoHistory",
    "Outcome",
    "RuleSlots",
    "RunSpec",
    "Slots",
    "StoreSlots",
    "Verdict",
    "agent_unavailable",
    "apply_hook_answer",
    "authority_for",
    "call_hook",
    "decide",
    "flow_gate_for",
    "flow_key",
    "flow_verdict",
    "policy_view",
    "resumed_decision",
    "run_spec",
]
