"""agentwake.schemas against hostile inputSchemas: each case ends with a clear message, promptly,
and nothing is ever fetched or read.

The elapsed-time assertions are only a safety net (CI machines are slow); what each test
checks is the message, and that no fetch was attempted.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from agentwake import schemas
from agentwake.schemas import (
    INVALID_PREFIX,
    MAX_ARGUMENTS_DEPTH,
    MAX_SCHEMA_DEPTH,
    PATTERN_TIMEOUT,
    TIME_BUDGET,
    ArgumentError,
    InvalidSchema,
    argument_errors,
    compile_schema,
)
from agentwake.server import EventsExtension

SAFETY_NET_S = 5.0
RECURSES = f"{INVALID_PREFIX}the inputSchema recurses too deeply"
NEVER_FETCHED = "(agentwake never fetches schemas)"
SLOW_PATTERN = "^(a|a)*$"  # backtracks on every 'a' before the '!'; the regex module too
SLOW_TEXT = "a" * 40 + "!"
# regex unrolls {n}: this compiles to gigabytes (re compiles it at once, but cannot time out a match).
UNROLLING_PATTERN = "(?:(?:(?:a{100}){100}){100}){100}"

TICKETS = {
    "type": "object",
    "properties": {
        "queue": {"type": "string"},
        "priority": {"type": "string", "enum": ["P1", "P2"]},
        "labels": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}},
    },
    "required": ["queue"],
    "additionalProperties": False,
}


@pytest.fixture(autouse=True)
def fetches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every fetch attempted (an http or file URL through urllib, or any socket connection); each fails."""
    attempts: list[str] = []

    def urlopen(url: Any, *args: Any, **kwargs: Any) -> Any:
        attempts.append(str(getattr(url, "full_url", url)))
        raise AssertionError(f"agentwake tried to fetch {url}")

    def connect(sock: socket.socket, address: Any) -> None:
        attempts.append(repr(address))
        raise AssertionError(f"agentwake tried to connect to {address}")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(socket.socket, "connect", connect)
    yield attempts
    assert attempts == [], "something was fetched"


def promptly(call: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = call()
    elapsed = time.perf_counter() - start
    assert elapsed < SAFETY_NET_S, f"took {elapsed:.1f} s"
    return result, elapsed


def errors_of(schema: Any, arguments: dict[str, Any]) -> list[str]:
    result: list[str] = promptly(lambda: argument_errors(schema, arguments))[0]
    return result


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


# ---- ordinary schemas read as before -----------------------------------------------------------


def test_arguments_that_match_have_no_errors() -> None:
    assert errors_of(TICKETS, {"queue": "support", "priority": "P1", "labels": ["vip"]}) == []


def test_ordinary_errors_read_path_colon_message_sorted_by_path() -> None:
    errors = errors_of(TICKETS, {"priority": "P9", "labels": ["ok", "Not-Ok"], "colour": "red"})

    assert errors == [
        "(root): 'queue' is a required property",
        "(root): Additional properties are not allowed ('colour' was unexpected)",
        "labels/1: 'Not-Ok' does not match '^[a-z]+$'",
        "priority: 'P9' is not one of ['P1', 'P2']",
    ]


def test_a_schema_its_metaschema_refuses_is_itself_invalid() -> None:
    assert errors_of({"minLength": "x"}, {}) == [f"{INVALID_PREFIX}'x' is not of type 'integer'"]


def test_an_invalid_pattern_is_itself_invalid_as_jsonschema_words_it() -> None:
    assert errors_of({"properties": {"q": {"pattern": "("}}}, {"q": "x"}) == [
        f"{INVALID_PREFIX}'(' is not a 'regex'"
    ]


def test_an_unknown_dialect_falls_back_to_the_latest_draft() -> None:
    schema = {"$schema": "https://example.com/my-dialect", "required": ["q"]}

    assert errors_of(schema, {}) == ["(root): 'q' is a required property"]


def test_a_recursive_schema_still_validates_a_tree() -> None:
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
            }
        },
        "properties": {"tree": {"$ref": "#/$defs/node"}},
    }
    tree = {"v": 1, "kids": [{"v": 2, "kids": [{"v": "three"}]}]}

    assert errors_of(schema, {"tree": tree}) == ["tree/kids/0/kids/0/v: 'three' is not of type 'integer'"]


def test_a_ref_to_a_bundled_metaschema_resolves_without_fetching() -> None:
    schema = {"properties": {"s": {"$ref": "https://json-schema.org/draft/2020-12/schema"}}}

    assert errors_of(schema, {"s": {"type": "string"}}) == []
    assert errors_of(schema, {"s": {"type": 5}}) == ["s/type: 5 is not valid under any of the given schemas"]


def test_unique_items_still_tells_equal_items_apart_as_json_schema_does() -> None:
    schema = {"properties": {"l": {"type": "array", "uniqueItems": True}}}

    assert errors_of(schema, {"l": [1, True, {"a": [1]}, {"a": [True]}, "1"]}) == []
    assert len(errors_of(schema, {"l": [{"a": 1, "b": [2]}, {"b": [2.0], "a": 1}]})) == 1


def test_unique_items_over_thousands_of_objects_is_linear() -> None:
    # jsonschema compares such items pairwise: 4,000 of them take 25 s.
    schema = {"properties": {"l": {"type": "array", "uniqueItems": True}}}
    items = [{"a": n} for n in range(4_000)]

    assert errors_of(schema, {"l": items}) == []
    (error,) = errors_of(schema, {"l": [*items, {"a": 7}]})
    assert error.startswith("l: [{'a': 0}") and len(error) < 1_100


# ---- unknown types -------------------------------------------------------------------------------


def test_an_unknown_type_is_an_invalid_schema_not_an_exception() -> None:
    assert errors_of({"type": "objekt"}, {}) == [
        f"{INVALID_PREFIX}'objekt' is not valid under any of the given schemas"
    ]


def test_an_unknown_type_the_metaschema_allows_is_named() -> None:
    # Draft 3's metaschema accepts any type name; jsonschema raises UnknownType when validating.
    schema = {"$schema": "http://json-schema.org/draft-03/schema#", "type": "objekt"}

    assert errors_of(schema, {}) == [f"{INVALID_PREFIX}the inputSchema uses an unknown type 'objekt'"]


# ---- recursion -----------------------------------------------------------------------------------


def test_a_ref_to_the_whole_schema_recurses_too_deeply() -> None:
    schema = {"$ref": "#", "type": "object", "properties": {"q": {"type": "string"}}}

    assert errors_of(schema, {"q": "x"}) == [f"{RECURSES}: $ref '#' leads back to itself"]


def test_a_two_step_ref_cycle_recurses_too_deeply() -> None:
    schema = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}

    (error,) = errors_of(schema, {})
    assert error.startswith(f"{RECURSES}: $ref '#/$defs/")


def test_a_cycle_through_unevaluated_properties_recurses_too_deeply() -> None:
    (error,) = errors_of({"unevaluatedProperties": False, "$ref": "#"}, {"q": 1})

    assert error.startswith(RECURSES)


def test_a_cycle_through_dynamic_refs_recurses_too_deeply() -> None:
    # Not caught as a cycle: the RecursionError it ends in is.
    schema = {"$dynamicAnchor": "x", "allOf": [{"$dynamicRef": "#x"}]}

    assert errors_of(schema, {}) == [f"{RECURSES} (a $ref cycle?)"]


def test_refs_that_fan_out_exponentially_give_up_after_the_time_budget() -> None:
    defs: dict[str, Any] = {f"d{n}": {"anyOf": [{"$ref": f"#/$defs/d{n + 1}"}] * 2} for n in range(40)}
    schema = {"$defs": {**defs, "d40": {"type": "string"}}, "properties": {"q": {"$ref": "#/$defs/d0"}}}

    errors, elapsed = promptly(lambda: argument_errors(schema, {"q": 1}))

    assert errors == [f"(root): checking the arguments took longer than {TIME_BUDGET:g} s; agentwake gave up"]
    assert elapsed >= TIME_BUDGET


# ---- references ----------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["root", "property"])
def test_a_remote_ref_is_unresolvable_and_never_fetched(where: str, fetches: list[str]) -> None:
    ref = {"$ref": "https://example.com/x.json"}
    schema = ref if where == "root" else {"properties": {"q": ref}}

    assert errors_of(schema, {"q": 1}) == [
        f"{INVALID_PREFIX}unresolvable $ref https://example.com/x.json {NEVER_FETCHED}"
    ]
    assert fetches == []


def test_a_file_ref_is_unresolvable_and_the_file_is_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"const": "treasure-7f3a", "description": "treasure-7f3a"}))

    (error,) = errors_of({"$ref": secret.as_uri()}, {})

    assert error == f"{INVALID_PREFIX}unresolvable $ref {secret.as_uri()} {NEVER_FETCHED}"
    assert "treasure" not in error


def test_a_ref_to_a_missing_location_says_so_without_echoing_the_schema() -> None:
    schema = {"$ref": "#/$defs/nowhere", "description": "a long description " * 20}

    (error,) = errors_of(schema, {})

    assert error == f"{INVALID_PREFIX}unresolvable $ref #/$defs/nowhere (no such location in the inputSchema)"


def test_the_server_refuses_at_declaration_an_invalid_schema_as_before() -> None:
    events = EventsExtension()

    with pytest.raises(ValueError) as caught:
        events.event(name="x", input_schema={"type": "objekt"}, emit_only=True)(type("X", (), {}))

    assert str(caught.value) == (
        "event 'x': inputSchema is not a valid JSON Schema: 'objekt' is not valid under any of the given schemas"
    )


def test_the_server_refuses_at_declaration_a_schema_whose_refs_do_not_resolve() -> None:
    events = EventsExtension()
    schema = {"properties": {"q": {"$ref": "https://example.com/x.json"}}}

    with pytest.raises(
        ValueError, match=r"inputSchema is not a valid JSON Schema: unresolvable \$ref https://"
    ):
        events.event(name="x", input_schema=schema, emit_only=True)(type("X", (), {}))


def test_compiling_with_check_references_finds_refs_no_argument_reaches() -> None:
    schema = {"properties": {"unused": {"$ref": "#/$defs/missing"}}}

    assert compile_schema(schema).errors({}) == []
    with pytest.raises(InvalidSchema, match="no such location"):
        compile_schema(schema, check_references=True)


# ---- patterns ------------------------------------------------------------------------------------


def test_a_catastrophic_pattern_gives_up_after_the_pattern_timeout() -> None:
    schema = {"properties": {"q": {"type": "string", "pattern": SLOW_PATTERN}}}

    assert errors_of(schema, {"q": SLOW_TEXT}) == [
        f"q: {SLOW_TEXT!r} took longer than {PATTERN_TIMEOUT:g} s to match {SLOW_PATTERN!r};"
        " agentwake gives up on patterns that slow"
    ]


def test_a_pattern_that_freezes_re_for_minutes_is_settled_at_once_by_regex() -> None:
    schema = {"properties": {"q": {"type": "string", "pattern": "^(.*.*)*X$"}}}

    assert errors_of(schema, {"q": "a" * 40}) == [f"q: {'a' * 40!r} does not match '^(.*.*)*X$'"]


@pytest.mark.parametrize(
    "keywords",
    [
        {"patternProperties": {SLOW_PATTERN: {"type": "string"}}},
        {"patternProperties": {SLOW_PATTERN: {}}, "additionalProperties": False},
        {"patternProperties": {SLOW_PATTERN: {}}, "unevaluatedProperties": False},
        {
            "$schema": "https://json-schema.org/draft/2019-09/schema",
            "patternProperties": {SLOW_PATTERN: {}},
            "unevaluatedProperties": False,
        },
    ],
    ids=[
        "patternProperties",
        "additionalProperties",
        "unevaluatedProperties",
        "unevaluatedProperties-2019-09",
    ],
)
def test_a_catastrophic_pattern_on_property_names_gives_up_after_the_pattern_timeout(
    keywords: dict[str, Any],
) -> None:
    assert errors_of({"type": "object", **keywords}, {SLOW_TEXT: 1}) == [
        f"(root): matching the property name {SLOW_TEXT!r} against the pattern {SLOW_PATTERN!r}"
        f" took longer than {PATTERN_TIMEOUT:g} s; agentwake gives up on patterns that slow"
    ]


def test_pattern_properties_still_match_property_names() -> None:
    schema = {"patternProperties": {"^x_": {"type": "integer"}}, "additionalProperties": False}

    assert errors_of(schema, {"x_a": "one", "y": 1}) == [
        "(root): 'y' does not match any of the regexes: '^x_'",
        "x_a: 'one' is not of type 'integer'",
    ]


def test_format_regex_on_an_argument_is_an_annotation_and_compiles_nothing() -> None:
    schema = {"properties": {"q": {"type": "string", "format": "regex"}}}

    assert errors_of(schema, {"q": UNROLLING_PATTERN}) == []
    assert errors_of(schema, {"q": "("}) == []  # formats are not asserted, as before


def test_a_pattern_that_would_unroll_to_gigabytes_is_refused_before_compiling() -> None:
    # The metaschema's format "regex" compiles the schema's patterns: this is where it is refused.
    schema = {"properties": {"q": {"type": "string", "pattern": UNROLLING_PATTERN}}}

    (error,) = errors_of(schema, {"q": "a"})

    assert error.startswith(f"{INVALID_PREFIX}the pattern {UNROLLING_PATTERN!r} repeats too much")


# ---- size ----------------------------------------------------------------------------------------


def test_a_5_mb_schema_is_refused_by_size() -> None:
    schema = {"type": "object", "description": "x" * 5_000_000}

    assert errors_of(schema, {}) == [
        f"{INVALID_PREFIX}the inputSchema is too large for agentwake (more than 262,144 bytes as JSON)"
    ]


def test_a_schema_of_a_million_values_is_refused_by_count() -> None:
    assert errors_of({"enum": list(range(1_000_000))}, {}) == [
        f"{INVALID_PREFIX}the inputSchema is too large for agentwake (more than 5,000 JSON values)"
    ]


def test_a_schema_nested_1000_levels_is_refused_by_depth() -> None:
    assert errors_of(nested(1_000), {}) == [
        f"{INVALID_PREFIX}the inputSchema is nested too deeply for agentwake (more than {MAX_SCHEMA_DEPTH} levels)"
    ]


def test_a_schema_nested_as_deep_as_allowed_still_works() -> None:
    schema = nested(MAX_SCHEMA_DEPTH // 2 - 1)
    arguments: Any = 5
    for _ in range(MAX_SCHEMA_DEPTH // 2 - 1):
        arguments = {"a": arguments}

    (error,) = errors_of(schema, arguments)
    assert error.endswith(": 5 is not of type 'string'")


def test_arguments_nested_too_deeply_are_refused() -> None:
    arguments: Any = 1
    for _ in range(MAX_ARGUMENTS_DEPTH + 1):
        arguments = {"a": arguments}

    assert errors_of({"additionalProperties": {"$ref": "#"}}, arguments) == [
        f"(root): the arguments are nested too deeply for agentwake (more than {MAX_ARGUMENTS_DEPTH} levels)"
    ]


def test_arguments_too_large_are_refused() -> None:
    assert errors_of({"type": "object"}, {"q": "x" * 1_000_000}) == [
        "(root): the arguments are too large for agentwake (more than 65,536 bytes as JSON)"
    ]


def test_not_a_schema_at_all_is_invalid() -> None:
    assert errors_of("objekt", {}) == [
        f"{INVALID_PREFIX}an inputSchema is a JSON object or a boolean, not str"
    ]


# ---- anything else -------------------------------------------------------------------------------


def test_any_other_exception_while_validating_becomes_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(value: Any) -> Any:
        raise ValueError("boom")

    monkeypatch.setattr(schemas, "_canonical", broken)

    compiled = compile_schema({"properties": {"l": {"uniqueItems": True}}})
    assert compiled.errors({"l": [1]}) == [
        ArgumentError("(root)", "checking the arguments failed: ValueError: boom", in_schema=True)
    ]


def test_the_server_answers_invalid_params_for_a_catastrophic_pattern_without_stalling() -> None:
    events = EventsExtension()
    schema = {"type": "object", "properties": {"q": {"type": "string", "pattern": SLOW_PATTERN}}}
    events.event(name="x", input_schema=schema, emit_only=True)(type("X", (), {}))

    start = time.perf_counter()
    with pytest.raises(MCPError) as caught:
        events._resolve("x", {"q": SLOW_TEXT}, "poll")

    assert time.perf_counter() - start < SAFETY_NET_S
    assert caught.value.code == -32602
    assert caught.value.data == {
        "errors": [
            {
                "path": "q",
                "message": f"{SLOW_TEXT!r} took longer than {PATTERN_TIMEOUT:g} s to match {SLOW_PATTERN!r};"
                " agentwake gives up on patterns that slow",
            }
        ]
    }
