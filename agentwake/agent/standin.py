"""``agentwake/offline`` without litellm: the deterministic stand-in's answers, as plain messages.

It is not an LLM, so no LLM library is loaded for it: a config that uses only this
model runs without importing litellm at all (about 190 MB less, and no seconds of import).
It reads the event data from its fence and, if an allowed tool's required parameters can all
be filled (a value the rule pins, shown in the schema as ``const``; then ``ticket_id`` from the
data's ``ticketId`` and the like; free-text parameters such as ``body`` or ``note`` with a fixed
note, never with the event's own text), calls that tool once, preferring tools that write a note.
After the tool result comes back it answers with a one-line summary.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Final

TEXT_PARAMETERS: Final = ("body", "note", "comment", "text", "message", "reason", "summary")
_FENCE: Final = re.compile(
    r'<event-data boundary="([0-9a-f]+)">\n(.*?)\n</event-data boundary="\1">', re.DOTALL
)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _event_data(messages: list[dict[str, Any]]) -> dict[str, Any]:
    for message in messages:
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, str):
            continue
        match = _FENCE.search(content)
        if match:
            try:
                data = json.loads(match.group(2))
            except ValueError:
                return {}
            return data if isinstance(data, dict) else {}
    return {}


def _note(data: dict[str, Any]) -> str:
    subject = (
        data.get("title")
        or data.get("summary")
        or data.get("ticketId")
        or data.get("alertId")
        or "this event"
    )
    return f"Seen by agentwake's offline stand-in model (not a real LLM): {str(subject)[:120]}"


def _free_text(spec: dict[str, Any]) -> bool:
    """A parameter that takes any text (not one of a set, not a pattern)."""
    kinds = spec.get("type")
    return (kinds is None or kinds == "string" or (isinstance(kinds, list) and "string" in kinds)) and not (
        "enum" in spec or "pattern" in spec
    )


def plan_call(tools: list[dict[str, Any]], data: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The one call the stand-in makes: the first tool it can fill, writers (with a text parameter) first."""
    by_snake = {_snake(key): value for key, value in data.items()}
    fillable: list[tuple[bool, str, dict[str, Any]]] = []
    for tool in tools:
        function = tool.get("function", {})
        schema = function.get("parameters") or {}
        properties: dict[str, Any] = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        arguments: dict[str, Any] = {}
        writes = False
        for param, spec in properties.items():
            spec = spec if isinstance(spec, dict) else {}
            if "const" in spec:  # pinned by the rule: the runtime would fill it in anyway
                arguments[param] = spec["const"]
            elif param in TEXT_PARAMETERS and _free_text(spec):
                arguments[param] = _note(data)
                writes = True
            elif data.get(param) is not None:
                arguments[param] = data[param]
            elif by_snake.get(_snake(param)) is not None:
                arguments[param] = by_snake[_snake(param)]
        if required <= arguments.keys():
            fillable.append((writes, function.get("name", ""), arguments))
    if not fillable:
        return None
    writers = [entry for entry in fillable if entry[0]]
    _, name, arguments = (writers or fillable)[0]
    return name, arguments


def _tokens(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content") or "")) for m in messages) // 4 + 1


@dataclass(frozen=True, slots=True)
class Answer:
    message: dict[str, Any]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


def answer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Answer:
    """What the stand-in says next: one tool call for a new event, a summary once a tool answered."""
    called = [m for m in messages if m.get("role") == "tool"]
    message: dict[str, Any]
    if called:
        outcome = str(called[-1].get("content") or "")
        body = outcome.split(">\n", 1)[-1]  # inside the tool-result fence, if there is one
        if outcome.startswith("refused"):
            verdict = "was refused"
        elif body.startswith("error:"):
            verdict = "returned an error"
        else:
            verdict = "returned a result"
        message = {
            "role": "assistant",
            "content": f"Offline stand-in: the tool call {verdict}; done.",
        }
        finish = "stop"
    else:
        plan = plan_call(tools, _event_data(messages))
        if plan is None:
            message = {
                "role": "assistant",
                "content": "Offline stand-in: no allowed tool fits this event; nothing to do.",
            }
            finish = "stop"
        else:
            name, arguments = plan
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{uuid.uuid4().hex[:12]}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
                    }
                ],
            }
            finish = "tool_calls"
    return Answer(message, finish, _tokens(messages), _tokens([message]))


__all__ = ["TEXT_PARAMETERS", "Answer", "answer", "plan_call"]
