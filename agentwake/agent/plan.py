"""Planning a run: the model, the allowed tools as the model sees them, the fence and the prompts.

What a run starts from, before anything is sent; ``agentwake policy test`` and ``replay --dry-run``
print exactly this.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from agentwake.agent.fence import Fence
from agentwake.agent.prompts import PromptError, PromptRenderer, RenderedPrompt
from agentwake.agent.tools import Allowlist, ToolHost, ToolSpec
from agentwake.authority import Authority, BoundConstraint
from agentwake.config import AgentwakeConfig
from agentwake.decide import Outcome, authority_for, policy_view
from agentwake.sanitize import Sanitized
from agentwake.store import InboxEvent


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
    authority: Authority

    def offered(self) -> list[ToolSpec]:
        """The allowed tools as the model is shown them: schemas narrowed by the rule's ``args``.

        Only by what is the same for every event of the rule: a value bound to the event (a pin
        or list from ``{{ data.* }}``) would make the tools, the start of every request, differ
        from run to run, and no provider could cache them. Those bounds are stated in the user
        message instead (``bound_arguments``); every call is checked against them all the same.
        """
        return [
            replace(spec, input_schema=stable_schema(self.authority, spec.exposed, spec.input_schema))
            for spec in self.allowed
        ]

    def bound_arguments(self, limit: int) -> str:
        """What the user message says of the arguments the rule binds to this event ("" if none)."""
        lines = [
            f"- {spec.exposed}: " + "; ".join(c.describe() for c in found)
            for spec in self.allowed
            if (found := _event_bound(self.authority, spec.exposed, spec.input_schema))
        ]
        if not lines:
            return ""
        return (
            "\n\nThe policy binds these tool arguments to this event (a pinned one is filled in for you);"
            " a call with other values is refused:\n"
            + self.fence.wrap("\n".join(lines), kind="bound-arguments", limit=limit)
            + "\n"
        )


_BOUND_NOTE: Final = "Bound by the policy to this event: the user message gives the value."


def _event_bound(authority: Authority, tool: str, schema: dict[str, Any]) -> list[BoundConstraint]:
    """The tool's constraints whose bounds come from the event (templates over its data)."""
    return [c for c in authority.constraints(tool, schema) if c.source.templates() and c.problem is None]


def stable_schema(authority: Authority, tool: str, schema: dict[str, Any]) -> dict[str, Any]:
    """``Authority.schema`` without the event's values: the same for every event of a rule.

    An argument pinned to the event is taken out of the schema: the runtime fills it in (and refuses
    any other value the model sends). One bound otherwise (a list or glob over the event's data) stays,
    its bound stated in the user message."""
    bound = _event_bound(authority, tool, schema)
    shown = authority.schema(tool, schema)
    if not bound:
        return shown
    original = dict(schema.get("properties") or {})
    properties = dict(shown.get("properties") or {})
    required = [name for name in shown.get("required") or [] if isinstance(name, str)]
    for constraint in bound:
        argument = constraint.argument
        if constraint.source.pinned:
            properties.pop(argument, None)
            required = [name for name in required if name != argument]
            continue
        own = dict(original.get(argument) or {})
        described = str(own.get("description") or "").strip()
        own["description"] = f"{described} {_BOUND_NOTE}".strip()
        properties[argument] = own
    stable = {**shown, "properties": properties}
    if "required" in shown:
        stable["required"] = required
    return stable


def plan_run(
    config: AgentwakeConfig,
    renderer: PromptRenderer,
    tools: ToolHost,
    outcome: Outcome,
    *,
    batch: Sequence[InboxEvent] = (),
) -> RunPlan:
    """Everything a run starts from: model, allowed tools, fence, decision record and prompts."""
    assert config.agent is not None
    agent = config.agent
    event, decision, spec, cleaned = outcome.event, outcome.decision, outcome.run, outcome.cleaned
    sub = next((s for s in config.subscriptions if s.name == event.subscription), None)
    model = spec.model or agent.model
    allowlist = Allowlist(spec.tools)
    catalog = list(tools.catalog())
    # Sorted by name: the tools are part of the prefix every run of the rule shares.
    allowed = sorted(allowlist.select(catalog), key=lambda spec_: spec_.exposed)
    authority = authority_for(spec, policy_view(event, cleaned.injection_score))
    fence = Fence(datamark=config.sanitize.datamark)
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
        "authority": authority.describe(
            [spec_.exposed for spec_ in allowed], {spec_.exposed: spec_.input_schema for spec_ in allowed}
        ),
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
        prompt = renderer.render(
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
                    "data": renderer.clean(other.data, pii=spec.redact_pii).value,
                }
                for other in batch
            ],
            approval_note=event.approval_note if event.approved else None,
        )
    except PromptError as exc:
        prompt_error = str(exc)
    plan = RunPlan(
        model, allowlist, allowed, catalog, fence, cleaned, record, prompt, prompt_error, authority
    )
    bound = plan.bound_arguments(agent.event_data_max_chars)
    if prompt is not None and bound:
        # After the rule's prompt and the event: the tools before them stay the same for the rule.
        plan = replace(plan, prompt=replace(prompt, user=prompt.user.rstrip("\n") + bound))
    return plan
