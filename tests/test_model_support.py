"""`agentwake check` warns about a model litellm cannot price (a cost limit cannot hold) or cannot drive
with native tool calling; litellm's own offline price map decides (LITELLM_LOCAL_MODEL_COST_MAP)."""

from __future__ import annotations

import pytest

from agentwake.agent.llm import model_warnings


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("openai/gpt-4o-mini", []),
        ("anthropic/claude-haiku-4-5", []),
        ("agentwake/offline", []),
        ("anthropic/claude-3-5-haiku-latest", ["litellm has no price for it"]),
        ("ollama_chat/llama3.1", ["litellm has no price for it"]),
        ("ollama/llama3.1", ["/api/generate, with the tools pasted into the prompt"]),
        ("openai/my-local-model", ["max_cost_per_day_usd cannot hold"]),
    ],
)
def test_check_warns_of_a_model_without_a_price_or_native_tool_calling(
    model: str, expected: list[str]
) -> None:
    found = model_warnings([model])
    assert [m for m, _ in found] == [model] * len(expected)
    for (_, why), words in zip(found, expected, strict=True):
        assert words in why
