"""``agentwake/offline`` as a litellm custom provider: the stand-in (``agentwake.agent.standin``)
answering through litellm's interface. The service calls the stand-in directly, without litellm;
this is for code that goes through litellm (``litellm.acompletion(model="agentwake/offline")``).
This module imports litellm, so only ``agentwake.agent.llm`` imports it.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

# litellm fetches its model price map from the internet on import unless this is set.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import litellm
from litellm.llms.custom_llm import CustomLLM
from litellm.types.utils import ModelResponse

from agentwake.agent.standin import answer, plan_call


def respond(model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelResponse:
    said = answer(messages, tools)
    return ModelResponse(
        id=f"offline-{uuid.uuid4().hex[:12]}",
        created=int(time.time()),
        model=model,
        object="chat.completion",
        choices=[{"index": 0, "message": said.message, "finish_reason": said.finish_reason}],
        usage={
            "prompt_tokens": said.prompt_tokens,
            "completion_tokens": said.completion_tokens,
            "total_tokens": said.prompt_tokens + said.completion_tokens,
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
