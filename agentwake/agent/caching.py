"""Prompt-cache markers, for the providers whose caching is explicit.

Anthropic (and Bedrock's Claude and Nova models) cache a prompt's prefix only up to a block marked
``cache_control``; litellm passes such marks on (as Bedrock Converse's ``cachePoint`` there). OpenAI,
Gemini, DeepSeek and xAI cache a repeated prefix by themselves, and every other provider is sent
nothing extra: litellm would pass a marker through to an OpenAI-compatible endpoint as it is.

Three marks at most (Anthropic allows four):

- the end of the system prompt (through litellm's ``cache_control_injection_points``): the tools
  and the system prompt, the same for every run of a rule;
- the end of the rule's shared instructions (``RenderedPrompt.shared``, what its template writes
  before ``{{ cache_point }}``), when it has any: the prefix then reaches the event;
- the end of the last message, when tools are offered: the model may call one, and the run's next
  call then reads this whole request from the cache instead of paying for it again.
"""

from __future__ import annotations

import re
from typing import Any, Final

_EXPLICIT_CACHE_PROVIDERS: Final = frozenset({"anthropic"})
_BEDROCK_CACHING_MODELS: Final = re.compile(r"claude|anthropic\.|nova", re.IGNORECASE)
SYSTEM_CACHE_POINT: Final = ({"location": "message", "role": "system"},)
EPHEMERAL: Final = {"type": "ephemeral"}


def explicit_caching(model: str, mode: str) -> bool:
    """Whether calls to ``model`` under ``[agent] prompt_cache = mode`` carry cache markers."""
    if mode != "auto" or "/" not in model:
        return False
    provider, name = model.split("/", 1)
    return provider in _EXPLICIT_CACHE_PROVIDERS or (
        provider == "bedrock" and _BEDROCK_CACHING_MODELS.search(name) is not None
    )


def cache_points(model: str, mode: str) -> list[dict[str, str]] | None:
    """litellm's ``cache_control_injection_points`` for a call to ``model``, or None to send none."""
    return [dict(point) for point in SYSTEM_CACHE_POINT] if explicit_caching(model, mode) else None


def _text(text: str, *, marked: bool) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": text}
    if marked:
        block["cache_control"] = dict(EPHEMERAL)
    return block


def marked_messages(
    messages: list[dict[str, Any]], shared: str, *, tools_offered: bool
) -> list[dict[str, Any]]:
    """``messages`` (not changed) with the shared instructions' end and, if tools are offered, the
    last message's end marked; a marked string content becomes text blocks with the same text."""
    out = [dict(message) for message in messages]
    first_user = next((i for i, m in enumerate(out) if m.get("role") == "user"), None)
    if first_user is not None and shared:
        content = out[first_user].get("content")
        if isinstance(content, str) and content.startswith(shared) and len(content) > len(shared):
            out[first_user]["content"] = [
                _text(shared, marked=True),
                _text(content[len(shared) :], marked=False),
            ]
    if tools_offered and out and out[-1].get("role") in ("user", "tool"):
        last = out[-1]
        content = last.get("content")
        if last.get("role") == "tool":
            # litellm carries a tool message's own mark into its tool_result block.
            last["cache_control"] = dict(EPHEMERAL)
        elif isinstance(content, str) and content:
            last["content"] = [_text(content, marked=True)]
        elif isinstance(content, list) and content and isinstance(content[-1], dict):
            last["content"] = [*content[:-1], {**content[-1], "cache_control": dict(EPHEMERAL)}]
    return out
