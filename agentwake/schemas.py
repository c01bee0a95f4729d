"""Validate subscription arguments against an ``inputSchema`` written by an untrusted peer.

The client checks its arguments against the server's schema; the server checks a
client's arguments against its own. Either side of that can be hostile, so this module
never fetches or reads anything (a ``$ref`` resolves only inside the schema), turns every
exception jsonschema can raise into a message, and bounds the work: the size of the
schema and of the arguments, the time regular expressions may take, and the time of the
whole check. Pure: no I/O, no network.

    compiled = compile_schema(schema)       # raises InvalidSchema
    errors = compiled.errors(arguments)     # never raises
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import jsonschema
import jsonschema.validators
import referencing
import referencing.exceptions
import referencing.jsonschema
import regex  # type: ignore[import-untyped]  # ships no type information

from agentwake._compat import schema_resolver, with_resolver

# The schema arrives on the wire; real inputSchemas are a few kilobytes.
MAX_SCHEMA_BYTES: Final = 256 * 1024
# Every JSON value counts; checking a schema against its metaschema costs ~0.1 ms per value.
MAX_SCHEMA_NODES: Final = 5_000
# Nesting levels of the JSON document (a property's schema is two levels below its parent's).
MAX_SCHEMA_DEPTH: Final = 64
MAX_ARGUMENTS_BYTES: Final = 64 * 1024
MAX_ARGUMENTS_DEPTH: Final = 32
# The regex module measures this in CPU seconds of the process.
PATTERN_TIMEOUT: Final = 0.1
# The regex module unrolls counted repeats when compiling: (?:(?:(?:a{100}){100}){100}){100}
# takes gigabytes. This bounds the nodes all patterns of one schema may unroll to (~300 bytes each).
MAX_PATTERN_UNROLL: Final = 50_000
# Wall-clock seconds for checking a schema, and again for checking arguments against it.
TIME_BUDGET: Final = 1.0
# Every error repeats parts of the schema and the arguments; a few are enough to fix them.
MAX_ERRORS: Final = 50
MAX_MESSAGE_CHARS: Final = 1_000

LATEST: Final[Any] = jsonschema.Draft202012Validator
INVALID_PREFIX: Final = "the server's inputSchema is itself invalid: "
NEVER_FETCHED: Final = "(agentwake never fetches schemas)"

Keyword = Callable[[Any, Any, Any, Any], Any]


class InvalidSchema(ValueError):
    """The schema cannot be used to validate anything; ``str()`` says why."""


@dataclass(frozen=True, slots=True)
class ArgumentError:
    path: str  # "(root)" or "filters/0/queue"
    message: str
    # The schema rather than the arguments is at fault (a $ref cycle, say).
    in_schema: bool = False

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def argument_errors(schema: object, arguments: Mapping[str, Any]) -> list[str]:
    """Why ``arguments`` do not match the server's ``schema``, one message each; [] if they do."""
    try:
        compiled = compile_schema(schema)
    except InvalidSchema as exc:
        return [f"{INVALID_PREFIX}{exc}"]
    return [
        f"{INVALID_PREFIX}{error.message}" if error.in_schema else str(error)
        for error in compiled.errors(arguments)
    ]


def compile_schema(schema: object, *, check_references: bool = False) -> CompiledSchema:
    """Check ``schema`` against its metaschema and the limits; raise InvalidSchema if it fails.

    ``check_references`` also requires every ``$ref`` to resolve now, rather than when a
    validation reaches it (the server's own schemas: better refused at declaration).
    """
    if not isinstance(schema, dict | bool):
        raise InvalidSchema(f"an inputSchema is a JSON object or a boolean, not {type(schema).__name__}")
    too_big = _too_big(
        schema, max_bytes=MAX_SCHEMA_BYTES, max_nodes=MAX_SCHEMA_NODES, max_depth=MAX_SCHEMA_DEPTH
    )
    if too_big:
        raise InvalidSchema(f"the inputSchema is {too_big}")
    base = _validator_class(schema)
    patterns = _Patterns()
    with _running(patterns, "checking the inputSchema", blame_schema=True) as run:
        try:
            _check_against_metaschema(base, schema)
            validator = _safe(base)(schema, registry=_REGISTRY)
            if check_references:
                _check_references(base, validator)
        except InvalidSchema:
            raise
        except Exception as exc:  # a hostile schema must not take the caller's task down
            raise InvalidSchema(_fault(exc, run).message) from None
    return CompiledSchema(schema, validator, patterns)


class CompiledSchema:
    """A checked schema, ready to validate arguments (the server keeps one per event type)."""

    def __init__(self, schema: dict[str, Any] | bool, validator: Any, patterns: _Patterns) -> None:
        self.schema = schema
        self._validator = validator
        self._patterns = patterns

    def errors(self, arguments: Mapping[str, Any]) -> list[ArgumentError]:
        """Every way ``arguments`` fail the schema (at most MAX_ERRORS), sorted by path; never raises."""
        too_big = _too_big(
            arguments, max_bytes=MAX_ARGUMENTS_BYTES, max_nodes=None, max_depth=MAX_ARGUMENTS_DEPTH
        )
        if too_big:
            return [ArgumentError("(root)", f"the arguments are {too_big}")]
        found: list[Any] = []
        with _running(self._patterns, "checking the arguments", blame_schema=False) as run:
            try:
                for error in self._validator.iter_errors(arguments):
                    found.append(error)
                    if len(found) == MAX_ERRORS:
                        break
            except Exception as exc:  # a hostile schema must not take the caller's task down
                return [_fault(exc, run)]
        found.sort(key=lambda error: _path_order(error.absolute_path))
        return [
            ArgumentError("/".join(str(p) for p in error.absolute_path) or "(root)", _clip(error.message))
            for error in found
        ]


# ---- limits -------------------------------------------------------------------------------------


class _Abort(Exception):
    """Stops a validation midway with a message (raised through jsonschema's generators)."""

    def __init__(self, message: str, *, in_schema: bool) -> None:
        super().__init__(message)
        self.message = message
        self.in_schema = in_schema


@dataclass(slots=True)
class _Run:
    what: str
    blame_schema: bool  # for running out of time
    deadline: float
    patterns: _Patterns
    # (keyword, id(schema), id(instance)) of every $ref being followed: seeing one again
    # means the schema loops without going deeper into the arguments.
    following: set[tuple[str, int, int]]


class _State(threading.local):
    run: _Run | None = None


_STATE: Final = _State()


@contextmanager
def _running(patterns: _Patterns, what: str, *, blame_schema: bool) -> Iterator[_Run]:
    previous = _STATE.run
    run = _Run(what, blame_schema, time.monotonic() + TIME_BUDGET, patterns, set())
    _STATE.run = run
    try:
        yield run
    finally:
        _STATE.run = previous


def _current() -> _Run:
    run = _STATE.run
    if run is None:
        raise _Abort("the validator was used outside agentwake.schemas", in_schema=False)
    return run


def _tick() -> _Run:
    run = _current()
    if time.monotonic() > run.deadline:
        raise _Abort(
            f"{run.what} took longer than {TIME_BUDGET:g} s; agentwake gave up", in_schema=run.blame_schema
        )
    return run


def _too_big(value: object, *, max_bytes: int, max_nodes: int | None, max_depth: int) -> str | None:
    """How ``value`` exceeds the limits (of its JSON encoding), or None. Iterative: depth cannot blow the stack."""
    stack: list[tuple[object, int]] = [(value, 1)]
    nodes = size = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if depth > max_depth:
            return f"nested too deeply for agentwake (more than {max_depth} levels)"
        # Containers are measured before their members are visited, so a huge one stops early.
        if isinstance(item, dict | list | tuple):
            size += 2 + 2 * len(item)
            if max_nodes is not None and nodes + len(stack) + len(item) > max_nodes:
                return f"too large for agentwake (more than {max_nodes:,} JSON values)"
        if isinstance(item, dict):
            if size <= max_bytes:
                size += sum(_text_size(key) for key in item)
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)
        else:
            size += _text_size(item)
        if size > max_bytes:
            return f"too large for agentwake (more than {max_bytes:,} bytes as JSON)"
    return None


def _text_size(value: object) -> int:
    if isinstance(value, str):
        return 2 + (len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass")))
    if isinstance(value, bool) or value is None:
        return 5
    if isinstance(value, int):
        return value.bit_length() // 3 + 2  # str() of a huge int is itself slow
    return 24


def _clip(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def _short(value: object) -> str:
    """repr(value), cut to 80 characters."""
    return _cut(repr(value[:100] if isinstance(value, str) else value))


def _cut(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _path_order(path: Iterable[object]) -> list[tuple[int, int, str]]:
    # Indices in numeric order, before names; never compares an int with a str.
    return [(0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in path]


def _fault(exc: Exception, run: _Run) -> ArgumentError:
    """The message for an exception that stopped a validation."""
    if isinstance(exc, _Abort):
        return ArgumentError("(root)", exc.message, in_schema=exc.in_schema)
    if isinstance(exc, RecursionError):
        message = "the inputSchema recurses too deeply (a $ref cycle?)"
    elif isinstance(exc, referencing.exceptions.Unresolvable):
        message = _unresolvable(exc)
    elif isinstance(exc, jsonschema.exceptions.UnknownType):
        message = f"the inputSchema uses an unknown type {_short(exc.type)}"
    else:
        message = f"{run.what} failed: {type(exc).__name__}: {_cut(str(exc), 200)}"
    return ArgumentError("(root)", message, in_schema=True)


# ---- references ---------------------------------------------------------------------------------


def _refuse(uri: str) -> referencing.Resource[Any]:
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]  # attrs, unseen by mypy


# Only the schema itself (and the bundled metaschemas jsonschema adds) resolve: no network, no files.
_REGISTRY: Final[referencing.Registry[Any]] = referencing.Registry(retrieve=_refuse)  # type: ignore[call-arg]


def _unresolvable(exc: referencing.exceptions.Unresolvable) -> str:
    # jsonschema wraps the error; its cause is referencing's own.
    cause = exc.__cause__ if isinstance(exc.__cause__, referencing.exceptions.Unresolvable) else exc
    ref = _cut(str(cause.ref), 200)
    if isinstance(cause, referencing.exceptions.PointerToNowhere):
        return f"unresolvable $ref #{ref} (no such location in the inputSchema)"
    if isinstance(cause, referencing.exceptions.NoSuchAnchor | referencing.exceptions.InvalidAnchor):
        return f"unresolvable $ref {ref} (no such anchor in the inputSchema)"
    return f"unresolvable $ref {ref} {NEVER_FETCHED}"


def _check_references(base: Any, validator: Any) -> None:
    """Resolve every $ref and $dynamicRef of the schema now (iterative: depth is already bounded)."""
    specification = referencing.jsonschema.specification_with(
        base.ID_OF(base.META_SCHEMA) or "urn:unknown-dialect", default=referencing.Specification.OPAQUE
    )
    root = specification.create_resource(validator.schema)
    resolver = schema_resolver(validator)  # the resolver validation uses, registry and base URI included
    stack = [(resolver, root)]
    while stack:
        _tick()
        resolver, resource = stack.pop()
        if isinstance(resource.contents, dict):
            for keyword in ("$ref", "$dynamicRef"):
                ref = resource.contents.get(keyword)
                if isinstance(ref, str):
                    try:
                        resolver.lookup(ref)
                    except referencing.exceptions.Unresolvable as exc:
                        raise InvalidSchema(_unresolvable(exc)) from None
        stack.extend((resolver.in_subresource(sub), sub) for sub in resource.subresources())


# ---- patterns -----------------------------------------------------------------------------------

_COUNT: Final = re.compile(r"\{(\d+)(?:,\d*)?\}")  # our own pattern, linear


class _Patterns:
    """One schema's compiled patterns, and how much of MAX_PATTERN_UNROLL they have used."""

    def __init__(self) -> None:
        self._compiled: dict[str, Any] = {}
        self._unrolled = 0

    def compile(self, pattern: object) -> Any:
        """The compiled pattern; regex.error if it is not one; _Abort past MAX_PATTERN_UNROLL."""
        if not isinstance(pattern, str):
            raise _Abort(
                f"the inputSchema has a pattern that is not a string: {_short(pattern)}", in_schema=True
            )
        compiled = self._compiled.get(pattern)
        if compiled is None:
            self._unrolled += _unrolled_size(pattern, MAX_PATTERN_UNROLL - self._unrolled)
            compiled = self._compiled[pattern] = regex.compile(pattern)
        return compiled


def _unrolled_size(pattern: str, limit: int) -> int:
    """About how many nodes the regex module compiles ``pattern`` to: nested {n} counts multiply.

    An overestimate is harmless; raises _Abort past ``limit``.
    """
    groups = [0]  # size of each open group so far
    last = 0  # size of the previous atom, the one a quantifier repeats
    i = 0
    while i < len(pattern):
        char = pattern[i]
        count = _COUNT.match(pattern, i) if char == "{" else None
        if count is not None:
            digits = count.group(1)
            times = int(digits) if len(digits) <= 9 else limit + 1
            groups[-1] += last * max(times - 1, 0)
            last *= max(times, 1)
            i = count.end()
        elif char == "(":
            groups.append(0)
            last = 0
            i += 1
        elif char == ")" and len(groups) > 1:
            last = groups.pop()
            groups[-1] += last
            i += 1
        else:
            i = _class_end(pattern, i) if char == "[" else i + (2 if char == "\\" else 1)
            last = 1
            groups[-1] += 1
        if groups[-1] > limit:
            break
    size = sum(groups)
    if size > limit:
        raise _Abort(
            f"the pattern {_short(pattern)} repeats too much: the regular expressions of an inputSchema"
            f" may unroll to {MAX_PATTERN_UNROLL:,} steps in all",
            in_schema=True,
        )
    return size


def _class_end(pattern: str, start: int) -> int:
    """The index after the character class opening at ``start`` (a leading ] is a member)."""
    i = start + 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


class _TooSlow(Exception):
    pass


def _search(pattern: object, text: str) -> bool:
    run = _tick()
    try:
        compiled = run.patterns.compile(pattern)
    except regex.error as exc:
        raise _Abort(
            f"the pattern {_short(pattern)} is not a valid regular expression: {exc}", in_schema=True
        ) from None
    timeout = max(0.001, min(PATTERN_TIMEOUT, run.deadline - time.monotonic()))
    try:
        return compiled.search(text, timeout=timeout) is not None
    except TimeoutError:
        raise _TooSlow from None


def _search_name(pattern: object, name: str) -> bool:
    """_search for a property name: a timeout stops the validation (the error would have no path)."""
    try:
        return _search(pattern, name)
    except _TooSlow:
        raise _Abort(
            f"matching the property name {_short(name)} against the pattern {_short(pattern)}"
            f" took longer than {PATTERN_TIMEOUT:g} s; agentwake gives up on patterns that slow",
            in_schema=False,
        ) from None


def _is_regex(instance: object) -> bool:
    """format: "regex", which the metaschemas apply to the schema's own patterns."""
    if isinstance(instance, str):
        _current().patterns.compile(instance)
    return True


# ---- the keywords -------------------------------------------------------------------------------
# Each overrides a jsonschema keyword that calls re (unbounded) or is quadratic; the bodies
# follow jsonschema 4.26's, so messages and results stay the same.


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "string"):
        return
    try:
        matched = _search(pattern, instance)
    except _TooSlow:
        yield jsonschema.ValidationError(
            f"{_short(instance)} took longer than {PATTERN_TIMEOUT:g} s to match {_short(pattern)};"
            " agentwake gives up on patterns that slow"
        )
        return
    if not matched:
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search_name(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_keys(instance: Any, schema: Any) -> Iterator[Any]:
    properties = schema.get("properties", {})
    patterns = "|".join(schema.get("patternProperties", {}))
    for key in instance:
        if key not in properties and not (patterns and _search_name(patterns, key)):
            yield key


def _additional_properties(validator: Any, additional: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    extras = set(_additional_keys(instance, schema))
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield jsonschema.ValidationError(f"{joined} {verb} not match any of the regexes: {patterns}")
        else:
            yield jsonschema.ValidationError(
                f"Additional properties are not allowed ({_extras(sorted(extras, key=str))} unexpected)"
            )


def _extras(extras: list[Any]) -> str:
    return ", ".join(repr(extra) for extra in extras) + (" was" if len(extras) == 1 else " were")


def _unevaluated_properties(legacy: bool) -> Keyword:
    def unevaluated_properties(validator: Any, unevaluated: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        evaluated = _evaluated_keys(validator, instance, schema, legacy)
        keys = [
            key
            for key in instance
            if key not in evaluated
            for _ in validator.descend(instance[key], unevaluated, path=key, schema_path=key)
        ]
        if keys and unevaluated is False:
            yield jsonschema.ValidationError(
                f"Unevaluated properties are not allowed ({_extras(sorted(keys, key=str))} unexpected)"
            )
        elif keys:
            yield jsonschema.ValidationError(
                "Unevaluated properties are not valid under the given schema"
                f" ({_extras(keys)} unevaluated and invalid)"
            )

    return unevaluated_properties


def _evaluated_keys(validator: Any, instance: Any, schema: Any, legacy: bool) -> list[Any]:
    """jsonschema's find_evaluated_property_keys_by_schema (2020-12, or 2019-09 if ``legacy``)."""
    run = _tick()
    if validator.is_type(schema, "boolean"):
        return []
    key = ("unevaluatedProperties", id(schema), id(instance))
    if key in run.following:
        raise _Abort(
            "the inputSchema recurses too deeply: unevaluatedProperties leads back to itself", in_schema=True
        )
    run.following.add(key)
    try:
        return _evaluated_keys_of(validator, instance, schema, legacy)
    finally:
        run.following.discard(key)


def _evaluated_keys_of(validator: Any, instance: Any, schema: Any, legacy: bool) -> list[Any]:
    evaluated: list[Any] = []
    references: list[Any] = []
    if (ref := schema.get("$ref")) is not None:
        references.append(schema_resolver(validator).lookup(ref))
    if legacy and "$recursiveRef" in schema:
        references.append(referencing.jsonschema.lookup_recursive_ref(schema_resolver(validator)))
    if not legacy and (dynamic := schema.get("$dynamicRef")) is not None:
        references.append(schema_resolver(validator).lookup(dynamic))
    for resolved in references:
        inner = with_resolver(validator, resolved.contents, resolved.resolver)
        evaluated += _evaluated_keys(inner, instance, resolved.contents, legacy)

    if legacy:
        for keyword in ("properties", "additionalProperties", "unevaluatedProperties"):
            if keyword in schema:
                value = schema[keyword]
                if validator.is_type(value, "boolean") and value:
                    evaluated += instance.keys()
                elif validator.is_type(value, "object"):
                    evaluated += [name for name in value if name in instance]
    else:
        properties = schema.get("properties")
        if validator.is_type(properties, "object"):
            evaluated += properties.keys() & instance.keys()
        for keyword in ("additionalProperties", "unevaluatedProperties"):
            if (subschema := schema.get(keyword)) is not None:
                evaluated += [
                    name
                    for name, value in instance.items()
                    if next(validator.descend(value, subschema), None) is None
                ]

    if "patternProperties" in schema:
        for name in instance:
            for pattern in schema["patternProperties"]:
                if _search_name(pattern, name):
                    evaluated.append(name)

    for name, subschema in schema.get("dependentSchemas", {}).items():
        if name in instance:
            evaluated += _evaluated_keys(validator, instance, subschema, legacy)

    for keyword in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(keyword, []):
            if next(validator.descend(instance, subschema), None) is None:
                evaluated += _evaluated_keys(validator, instance, subschema, legacy)

    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            evaluated += _evaluated_keys(validator, instance, schema["if"], legacy)
            if "then" in schema:
                evaluated += _evaluated_keys(validator, instance, schema["then"], legacy)
        elif "else" in schema:
            evaluated += _evaluated_keys(validator, instance, schema["else"], legacy)
    return evaluated


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    # jsonschema compares unsortable items pairwise: 4,000 small objects take 25 s.
    if unique and validator.is_type(instance, "array") and not _all_unique(instance):
        yield jsonschema.ValidationError(f"{instance!r} has non-unique elements")


def _all_unique(items: Iterable[Any]) -> bool:
    seen: set[Any] = set()
    for item in items:
        key = _canonical(item)
        if key in seen:
            return False
        seen.add(key)
    return True


def _canonical(value: Any) -> Any:
    """A hashable value equal for items JSON Schema calls equal (1 == 1.0, True != 1, key order ignored)."""
    if isinstance(value, bool):
        return ("boolean", value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, Mapping):
        return ("object", frozenset((key, _canonical(item)) for key, item in value.items()))
    if isinstance(value, list | tuple):
        return ("array", tuple(_canonical(item) for item in value))
    try:
        hash(value)
    except TypeError:
        return ("other", repr(value))
    return ("other", value)


def _following(ref_keyword: Keyword) -> Keyword:
    """$ref, refusing to follow one that is already being followed for the same instance."""

    def follow(validator: Any, ref: Any, instance: Any, schema: Any) -> Iterator[Any]:
        run = _current()
        key = ("$ref", id(schema), id(instance))
        if key in run.following:
            raise _Abort(
                f"the inputSchema recurses too deeply: $ref {_short(ref)} leads back to itself",
                in_schema=True,
            )
        run.following.add(key)
        try:
            yield from ref_keyword(validator, ref, instance, schema)
        finally:
            run.following.discard(key)

    return follow


def _budgeted(keyword: Keyword) -> Keyword:
    def budgeted(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _tick()
        return keyword(validator, value, instance, schema)

    return budgeted


@functools.cache
def _safe(base: Any) -> Any:
    """``base`` (a jsonschema validator class) with every keyword bounded in time and no re."""
    keywords: dict[str, Keyword] = dict(base.VALIDATORS)
    keywords.update(
        {
            "$ref": _following(base.VALIDATORS["$ref"]),
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
            "uniqueItems": _unique_items,
            "unevaluatedProperties": _unevaluated_properties(legacy=base is jsonschema.Draft201909Validator),
        }
    )
    return jsonschema.validators.extend(
        base, {name: _budgeted(keyword) for name, keyword in keywords.items() if name in base.VALIDATORS}
    )


@functools.cache
def _schema_format_checker(base: Any) -> Any:
    # The metaschemas check the schema's patterns with format "regex": compile them through _Patterns.
    checker = jsonschema.FormatChecker(formats=())
    checker.checkers = {**base.FORMAT_CHECKER.checkers, "regex": (_is_regex, (regex.error,))}
    return checker


def _validator_class(schema: dict[str, Any] | bool) -> Any:
    dialect = schema.get("$schema") if isinstance(schema, dict) else None
    if not isinstance(dialect, str):
        return LATEST  # the metaschema then reports a $schema that is not a string
    # An explicit default: an unknown $schema falls back to the latest draft without a warning.
    return jsonschema.validators.validator_for(schema, default=LATEST)


def _check_against_metaschema(base: Any, schema: dict[str, Any] | bool) -> None:
    """jsonschema's check_schema, bounded like any validation; the first error, as it reports."""
    meta = _safe(jsonschema.validators.validator_for(base.META_SCHEMA, default=base))
    checker = meta(base.META_SCHEMA, format_checker=_schema_format_checker(base), registry=_REGISTRY)
    for error in checker.iter_errors(schema):
        raise InvalidSchema(_clip(error.message))
