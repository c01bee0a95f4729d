"""``agentwake/offline``: a deterministic stand-in for a real model, so the whole loop runs with no API key.

It is not an LLM. It reads the event data from its fence and, if an allowed
tool's required parameters can all be filled from that data (``ticket_id`` from
``ticketId`` and the like, free-text parameters such as ``body`` or ``note``
with a fixed note), calls that tool once, preferring tools that write a note.
After the tool result comes back it answers with a one-line summary. Registered
with litellm through ``custom_provider_map``; this module imports litellm, so
only ``agentwake.agent.llm`` imports it.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from typing import Any, Final

# litellm fetches its model price map from the internet on import unless this is set.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import litellm
from litellm.llms.custom_llm import CustomLLM
from litellm.types.utils import ModelResponse

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
        for param in properties:
            if param in data:
                arguments[param] = data[param]
            elif _snake(param) in by_snake:
                arguments[param] = by_snake[_snake(param)]
            elif param in TEXT_PARAMETERS:
                arguments[param] = _note(data)
                writes = True
        if required <= arguments.keys():
            fillable.append((writes, function.get("name", ""), arguments))
    if not fillable:
        return None
    writers = [entry for entry in fillable if entry[0]]
    _, name, arguments = (writers or fillable)[0]
    return name, arguments


def _tokens(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content") or "")) for m in messages) // 4 + 1


def respond(model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelResponse:
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
    prompt_tokens = _tokens(messages)
    completion_tokens = _tokens([message])
    return ModelResponse(
        id=f"offline-{uuid.uuid4().hex[:12]}",
        created=int(time.time()),
        model=model,
        object="chat.completion",
        choices=[{"index": 0, "message": message, "finish_reason": finish}],
        usage={
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    )


class OfflineModel(CustomLLM):
    async def acompletion(self, *args: Any, **kwargs: Any) -> ModelResponse:
        return self.completion(*args, **kwargs)

    def completion(self, *args: Any, **kwargs: Any) -> ModelResponse:
        model = str(kwargs.get("model") or "offline")
        messages = list(kwargs.get("messages") or [])
        optional = kwargs.get("optional_params") or {}
        return respond(
            f"agentwake/{model.removeprefix('agentwake/')}", messages, list(optional.get("tools") or [])
        )


__all__ = ["OfflineModel", "litellm", "plan_call", "respond"]
