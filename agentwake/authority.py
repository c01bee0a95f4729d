"""What a rule lets the agent do with each tool: its arguments, pinned or bounded by the policy.

A rule's ``args`` table constrains the arguments of the tools it allows, per exposed tool name::

    tools = ["github__get_issue", "github__comment", "github__add_labels"]
    args."github__comment" = { repository = "{{ data.repository }}", number = "{{ data.number }}" }
    args."github__add_labels" = { repository = "{{ data.repository }}", number = "{{ data.number }}",
                                  labels = { subset_of = ["bug", "question"] } }
    args."slack__post_message" = { channel = "C0123ABCD", text = { max_length = 3000 } }

Each argument takes one of:

- a value: the argument is *pinned* to it. A string may be a template over the stored event
  (``"{{ data.repository }}"``, ``"{{ server }}"``; one template alone keeps the field's JSON type,
  templates inside text are joined as text). A pinned value comes from the event the inbox stored,
  never from the model. The model sees it as a ``const`` in the tool's schema; a call that leaves
  the argument out gets it filled in, a call that gives another value is refused.
- a table of checks, all of which must hold: ``in`` (a list, or a template naming a list in the
  event), ``glob`` (templates in it match the event's values literally), ``regex`` (the whole
  value must match), ``max_length`` (text or list), ``subset_of`` (a list whose items are all in
  this list), ``range`` (``{ min = .., max = .. }``), or ``value`` (the same as pinning, for a
  table or list value). A checked argument must be given.

``allow_mentions = true`` on the rule lets tools that take an ``allow_mentions`` argument (the
bridges' Slack and GitHub posting tools) post mentions and link markup as written; otherwise that
argument is pinned to false, whatever the rule's ``args`` say, and those tools escape them.

The runtime checks every call after its name and before it is journaled or sent
(``Authority.check``); a call that breaks a constraint is refused like a tool outside the
allowlist. The rule of thumb: an event's data may fill a tool's *content*, never choose its
*target*, unless the rule says so.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

MENTIONS_ARGUMENT: Final = "allow_mentions"
CHECK_KEYS: Final = ("value", "in", "glob", "regex", "max_length", "subset_of", "range")
# The parts of the stored event a template may name.
TEMPLATE_ROOTS: Final = ("data", "server", "subscription", "name", "event_id", "timestamp")
_TEMPLATE: Final = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_FIELD: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_-]+)*$")


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


ABSENT: Final = _Absent()


def lookup(view: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path (``data.items.0.id``), or ABSENT."""
    node: Any = view
    for part in path.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return ABSENT
    return node


def same_json(left: Any, right: Any) -> bool:
    """JSON equality: true is not 1, 42 is 42.0, and lists and objects compare item by item."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return float(left) == float(right)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(same_json(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same_json(left[k], right[k]) for k in left)
    return type(left) is type(right) and bool(left == right)


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if not isinstance(value, _Absent) else "(absent)"


# ---- templates ------------------------------------------------------------------------------------


def template_fields(value: Any) -> list[str]:
    """The event fields a template string names (none for anything else)."""
    return [m.group(1) for m in _TEMPLATE.finditer(value)] if isinstance(value, str) else []


def _check_template(value: Any) -> None:
    for name in template_fields(value):
        if not _FIELD.match(name) or name.split(".", 1)[0] not in TEMPLATE_ROOTS:
            roots = ", ".join(TEMPLATE_ROOTS)
            raise ValueError(
                f"template {{{{ {name} }}}} must name a field of the event ({roots}), like data.id"
            )


def render(
    value: Any, view: Mapping[str, Any], *, quote: Callable[[str], str] | None = None
) -> tuple[Any, str | None]:
    """A pinned value for this event, or why it cannot be had (a field the event lacks).

    ``quote`` is applied to each value filled into text (a glob's, so that it matches literally).
    """
    if not isinstance(value, str) or not _TEMPLATE.search(value):
        return value, None
    whole = _TEMPLATE.fullmatch(value)
    if whole and quote is None:
        found = lookup(view, whole.group(1))
        if found is ABSENT or found is None:
            return ABSENT, f"the event has no {whole.group(1)}"
        return found, None
    missing: list[str] = []

    def fill(match: re.Match[str]) -> str:
        found = lookup(view, match.group(1))
        if isinstance(found, bool) or not isinstance(found, str | int | float):
            missing.append(match.group(1))
            return ""
        return quote(str(found)) if quote is not None else str(found)

    text = _TEMPLATE.sub(fill, value)
    if missing:
        return ABSENT, f"the event has no text or number at {', '.join(missing)}"
    return text, None


# ---- one argument's constraint ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Constraint:
    """What a rule says of one argument of one tool, as written (templates not yet filled in)."""

    argument: str
    pin: Any = ABSENT
    one_of: Any = None  # a list, or a template naming a list
    glob: str | None = None
    regex: str | None = None
    max_length: int | None = None
    subset_of: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None

    @classmethod
    def parse(cls, argument: str, raw: Any) -> Constraint:
        if not isinstance(raw, dict):
            _check_template(raw)
            return cls(argument, pin=raw)
        unknown = [key for key in raw if key not in CHECK_KEYS]
        if unknown:
            raise ValueError(
                f"argument {argument!r}: unknown check {unknown[0]!r} (known: {', '.join(CHECK_KEYS)})"
            )
        if not raw:
            raise ValueError(f"argument {argument!r}: an empty table checks nothing; give a value or checks")
        if "value" in raw:
            if len(raw) > 1:
                raise ValueError(f"argument {argument!r}: 'value' pins it, so it takes no other check")
            _check_template(raw["value"])
            return cls(argument, pin=raw["value"])
        one_of = raw.get("in")
        if one_of is not None:
            if isinstance(one_of, str):
                fields = template_fields(one_of)
                if len(fields) != 1 or not _TEMPLATE.fullmatch(one_of):
                    raise ValueError(
                        f"argument {argument!r}: 'in' takes a list, or one template naming a list in the event"
                    )
                _check_template(one_of)
            elif not isinstance(one_of, list) or not one_of:
                raise ValueError(f"argument {argument!r}: 'in' takes a non-empty list")
        glob = raw.get("glob")
        if glob is not None and not isinstance(glob, str):
            raise ValueError(f"argument {argument!r}: 'glob' takes a string pattern")
        _check_template(glob)
        regex = raw.get("regex")
        if regex is not None:
            if not isinstance(regex, str):
                raise ValueError(f"argument {argument!r}: 'regex' takes a string pattern")
            try:
                re.compile(regex)
            except re.error as exc:
                raise ValueError(f"argument {argument!r}: bad regex {regex!r}: {exc}") from None
        max_length = raw.get("max_length")
        if max_length is not None and (
            isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 0
        ):
            raise ValueError(f"argument {argument!r}: 'max_length' takes a whole number, 0 or more")
        subset_of = raw.get("subset_of")
        if subset_of is not None and not isinstance(subset_of, list):
            raise ValueError(f"argument {argument!r}: 'subset_of' takes a list")
        bounds = raw.get("range")
        minimum = maximum = None
        if bounds is not None:
            if not isinstance(bounds, dict) or not bounds or set(bounds) - {"min", "max"}:
                raise ValueError(f"argument {argument!r}: 'range' takes {{ min = .., max = .. }}")
            for key, bound in bounds.items():
                if isinstance(bound, bool) or not isinstance(bound, int | float):
                    raise ValueError(f"argument {argument!r}: range {key} must be a number")
            minimum, maximum = bounds.get("min"), bounds.get("max")
            if minimum is not None and maximum is not None and minimum > maximum:
                raise ValueError(f"argument {argument!r}: range min {minimum} is above max {maximum}")
        return cls(
            argument,
            one_of=one_of,
            glob=glob,
            regex=regex,
            max_length=max_length,
            subset_of=tuple(subset_of) if subset_of is not None else None,
            minimum=minimum,
            maximum=maximum,
        )

    @property
    def pinned(self) -> bool:
        return self.pin is not ABSENT

    def templates(self) -> list[str]:
        return template_fields(self.pin) + template_fields(self.one_of) + template_fields(self.glob)

    def bind(self, view: Mapping[str, Any]) -> BoundConstraint:
        problem: str | None = None
        glob = self.glob
        if glob is not None and template_fields(glob):
            # The event's values are matched literally: a '*' in them is no wildcard.
            glob, problem = render(glob, view, quote=_glob_literal)
        pin: Any = ABSENT
        if self.pinned:
            pin, problem = render(self.pin, view)
        one_of: tuple[Any, ...] | None = None
        if isinstance(self.one_of, str):
            found, problem = render(self.one_of, view)
            if problem is None and not isinstance(found, list):
                problem = f"{template_fields(self.one_of)[0]} is not a list in this event"
            one_of = tuple(found) if isinstance(found, list) else ()
        elif self.one_of is not None:
            one_of = tuple(self.one_of)
        return BoundConstraint(self, pin, one_of, problem, glob if problem is None else None)


def _glob_literal(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


@dataclass(frozen=True, slots=True)
class BoundConstraint:
    """A constraint with its templates filled in from one event."""

    source: Constraint
    pin: Any
    one_of: tuple[Any, ...] | None
    problem: str | None  # set when the event lacks what a template names: every call is refused
    glob: str | None = None  # the source's glob with its templates filled in

    @property
    def argument(self) -> str:
        return self.source.argument

    def violation(self, given: Any) -> str | None:
        """Why ``given`` (ABSENT: not given) breaks this constraint, or None."""
        c, name = self.source, self.argument
        if self.problem is not None:
            return f"argument {name!r} is bound to the event by the rule, but {self.problem}"
        if c.pinned:
            if given is ABSENT or same_json(given, self.pin):
                return None
            return f"argument {name!r} must be {_shown(self.pin)}, not {_shown(given)}"
        if given is ABSENT:
            return f"argument {name!r} must be given: the rule checks it ({self.describe()})"
        if self.one_of is not None and not any(same_json(given, option) for option in self.one_of):
            return f"argument {name!r} must be one of {_shown(list(self.one_of))}, not {_shown(given)}"
        if self.glob is not None and not (isinstance(given, str) and fnmatch.fnmatchcase(given, self.glob)):
            return f"argument {name!r} must match the glob {self.glob!r}, not {_shown(given)}"
        if c.regex is not None and not (isinstance(given, str) and re.fullmatch(c.regex, given)):
            return f"argument {name!r} must match the regex {c.regex!r}, not {_shown(given)}"
        if c.max_length is not None:
            if not isinstance(given, str | list):
                return f"argument {name!r} must be text or a list of at most {c.max_length}"
            if len(given) > c.max_length:
                return f"argument {name!r} is {len(given)} long; the rule allows at most {c.max_length}"
        if c.subset_of is not None:
            if not isinstance(given, list):
                return f"argument {name!r} must be a list drawn from {_shown(list(c.subset_of))}"
            extra = [item for item in given if not any(same_json(item, ok) for ok in c.subset_of)]
            if extra:
                return f"argument {name!r} has {_shown(extra)}, outside {_shown(list(c.subset_of))}"
        if c.minimum is not None or c.maximum is not None:
            if isinstance(given, bool) or not isinstance(given, int | float):
                return f"argument {name!r} must be a number ({self.describe()})"
            if (c.minimum is not None and given < c.minimum) or (c.maximum is not None and given > c.maximum):
                return f"argument {name!r} is {given}, outside {self.describe()}"
        return None

    def describe(self) -> str:
        c = self.source
        if self.problem is not None:
            return f"{self.argument} cannot be bound ({self.problem}): every call is refused"
        if c.pinned:
            origin = f" (from {c.pin})" if template_fields(c.pin) else ""
            return f"{self.argument} = {_shown(self.pin)}{origin}"
        parts: list[str] = []
        if self.one_of is not None:
            parts.append(f"one of {_shown(list(self.one_of))}")
        if self.glob is not None:
            parts.append(f"matching glob {self.glob!r}")
        if c.regex is not None:
            parts.append(f"matching regex {c.regex!r}")
        if c.max_length is not None:
            parts.append(f"at most {c.max_length} long")
        if c.subset_of is not None:
            parts.append(f"drawn from {_shown(list(c.subset_of))}")
        if c.minimum is not None or c.maximum is not None:
            low = "" if c.minimum is None else f"{c.minimum:g} <= "
            high = "" if c.maximum is None else f" <= {c.maximum:g}"
            parts.append(f"{low}value{high}")
        return f"{self.argument}: " + ", ".join(parts)

    def schema(self, original: Mapping[str, Any] | None) -> dict[str, Any]:
        """The argument's JSON Schema as the model is shown it: the tool's own, narrowed."""
        shown: dict[str, Any] = dict(original or {})
        c = self.source
        if c.pinned and self.problem is None:
            shown["const"] = self.pin
            shown["enum"] = [self.pin]
            note = "Fixed by the policy for this event."
        else:
            notes: list[str] = []
            if self.one_of is not None:
                shown["enum"] = list(self.one_of)
            if c.max_length is not None:
                shown["maxItems" if shown.get("type") == "array" else "maxLength"] = c.max_length
            if c.subset_of is not None:
                shown["items"] = {**dict(shown.get("items") or {}), "enum": list(c.subset_of)}
            if c.minimum is not None:
                shown["minimum"] = c.minimum
            if c.maximum is not None:
                shown["maximum"] = c.maximum
            if self.glob is not None:
                notes.append(f"must match the glob {self.glob!r}")
            if c.regex is not None:
                notes.append(f"must match the regular expression {c.regex!r}")
            note = ("Policy: " + "; ".join(notes) + ".") if notes else ""
        if note:
            described = str(shown.get("description") or "").strip()
            shown["description"] = f"{described} {note}".strip()
        return shown


# ---- a rule's arguments, and one event's authority -----------------------------------------------------


def parse_args(raw: Mapping[str, Any]) -> dict[str, tuple[Constraint, ...]]:
    """A rule's ``args`` table, checked; ValueError says which tool and argument is wrong."""
    parsed: dict[str, tuple[Constraint, ...]] = {}
    for tool, arguments in raw.items():
        if "__" not in tool:
            raise ValueError(f"args.{tool!r}: tools are named '<server>__<tool>'")
        if not isinstance(arguments, dict) or not arguments:
            raise ValueError(f'args.{tool!r} must be a table of its arguments, like {{ channel = "C0123" }}')
        constraints: list[Constraint] = []
        for argument, constraint in arguments.items():
            try:
                constraints.append(Constraint.parse(argument, constraint))
            except ValueError as exc:
                raise ValueError(f"args.{tool!r}: {exc}") from None
        parsed[tool] = tuple(constraints)
    return parsed


@dataclass(frozen=True, slots=True)
class Authority:
    """One event's authority: each tool's constraints bound to the stored event."""

    by_tool: Mapping[str, tuple[BoundConstraint, ...]] = field(default_factory=dict)
    allow_mentions: bool = False
    rule: str | None = None

    @classmethod
    def bind(
        cls,
        args: Mapping[str, Any] | None,
        view: Mapping[str, Any],
        *,
        allow_mentions: bool = False,
        rule: str | None = None,
    ) -> Authority:
        parsed = parse_args(args or {})
        bound = {tool: tuple(c.bind(view) for c in constraints) for tool, constraints in parsed.items()}
        return cls(bound, allow_mentions, rule)

    def constraints(self, tool: str, schema: Mapping[str, Any] | None = None) -> tuple[BoundConstraint, ...]:
        """The tool's constraints; with its schema, the mention switch too where the tool has one."""
        found = self.by_tool.get(tool, ())
        properties = (schema or {}).get("properties") or {}
        if not self.allow_mentions and MENTIONS_ARGUMENT in properties:
            found = tuple(c for c in found if c.argument != MENTIONS_ARGUMENT)
            found += (Constraint(MENTIONS_ARGUMENT, pin=False).bind({}),)
        return found

    def check(
        self, tool: str, schema: Mapping[str, Any] | None, arguments: Mapping[str, Any]
    ) -> tuple[dict[str, Any], str | None]:
        """The arguments to send (pinned ones filled in), or the first constraint they break."""
        sent = dict(arguments)
        for constraint in self.constraints(tool, schema):
            problem = constraint.violation(arguments.get(constraint.argument, ABSENT))
            if problem is not None:
                return dict(arguments), problem
            if constraint.source.pinned and constraint.argument not in sent:
                sent[constraint.argument] = constraint.pin
        return sent, None

    def schema(self, tool: str, schema: Mapping[str, Any] | None) -> dict[str, Any]:
        """The tool's input schema as the model sees it: pinned arguments ``const``, ``in`` an ``enum``."""
        constraints = self.constraints(tool, schema)
        shown = copy.deepcopy(dict(schema or {"type": "object", "properties": {}}))
        if not constraints:
            return shown
        properties = dict(shown.get("properties") or {})
        required = list(shown.get("required") or [])
        for constraint in constraints:
            properties[constraint.argument] = constraint.schema(properties.get(constraint.argument))
            if constraint.argument not in required:
                required.append(constraint.argument)
        shown["properties"] = properties
        shown["required"] = required
        return shown

    def describe(
        self, tools: Iterable[str], schemas: Mapping[str, Mapping[str, Any]] | None = None
    ) -> list[str]:
        """One line per tool: what it may be called with. The page, ``show`` and ``policy test`` print these."""
        lines: list[str] = []
        for tool in tools:
            constraints = self.constraints(tool, (schemas or {}).get(tool))
            if constraints:
                lines.append(f"{tool}: " + "; ".join(c.describe() for c in constraints))
            else:
                lines.append(f"{tool}: any arguments")
        for tool in self.by_tool:
            if tool not in tools:
                lines.append(
                    f"{tool}: " + "; ".join(c.describe() for c in self.by_tool[tool]) + " (if allowed)"
                )
        if not self.allow_mentions:
            lines.append(
                "mentions and link markup in posted text are escaped (the rule does not allow_mentions)"
            )
        return lines


# ---- checks against what servers declare -------------------------------------------------------------


def unknown_arguments(constraints: Sequence[Constraint], schema: Mapping[str, Any]) -> list[str]:
    """The constrained arguments the tool's inputSchema does not have (none when it allows any)."""
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return []
    if not properties and schema.get("additionalProperties", True) is not False:
        return []
    return [c.argument for c in constraints if c.argument not in properties]


def payload_can_have(schema: Mapping[str, Any] | None, path: Sequence[str]) -> bool:
    """Whether a payload under ``schema`` can have the field ``path`` (dotted, below ``data``).

    A schema that lists its properties rules out any other field, unless it says more may come
    (``additionalProperties`` true or a schema, ``patternProperties``); one that lists none may have any.
    """
    node: Any = schema
    for part in path:
        if not isinstance(node, Mapping):
            return True
        variants = [v for key in ("anyOf", "oneOf") for v in node.get(key) or [] if isinstance(v, Mapping)]
        if variants:
            return any(payload_can_have(v, path) for v in variants)
        if node.get("type") == "array" or "items" in node:
            if not part.isdigit():
                return False
            node = node.get("items")
            continue
        properties = node.get("properties")
        if isinstance(properties, Mapping) and part in properties:
            node = properties[part]
            continue
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping):
            node = extra
            continue
        # Listed properties name the payload's fields: a field beside them is taken for a typo
        # unless the schema says more may come (additionalProperties true, patternProperties).
        if extra is True or node.get("patternProperties") or not isinstance(properties, Mapping):
            return extra is not False
        return False
    return True


def args_problems(
    args: Mapping[str, Any] | None,
    *,
    tools: Mapping[str, Mapping[str, Mapping[str, Any]]],
    payloads: Mapping[str, Mapping[str, Mapping[str, Any] | None]],
    match_server: str | None,
    match_event: str | None,
) -> list[str]:
    """What is wrong with a rule's ``args`` against what the servers declare.

    ``tools``: by server, each tool's inputSchema by exposed name; ``payloads``: by server, each
    event type's payloadSchema. A server missing from either was not reached and is not judged.
    """
    problems: list[str] = []
    parsed = parse_args(args or {})
    for tool, constraints in parsed.items():
        server = tool.split("__", 1)[0]
        offered = tools.get(server)
        if offered is None:
            continue
        if tool not in offered:
            names = ", ".join(sorted(offered)[:8]) or "none"
            problems.append(
                f"args names {tool!r}, which server {server!r} does not offer (its tools: {names})"
            )
            continue
        for argument in unknown_arguments(constraints, offered[tool]):
            known = ", ".join(sorted(offered[tool].get("properties") or {})) or "none"
            problems.append(f"args.{tool!r}: {tool} has no argument {argument!r} (its arguments: {known})")
    fields = sorted({f for constraints in parsed.values() for c in constraints for f in c.templates()})
    types = {
        f"{server}/{name}": schema
        for server, events in payloads.items()
        if match_server is None or fnmatch.fnmatchcase(server, match_server)
        for name, schema in events.items()
        if match_event is None or fnmatch.fnmatchcase(name, match_event)
    }
    if not types:
        return problems
    for name in fields:
        root, _, rest = name.partition(".")
        if root != "data" or not rest:
            continue
        if not any(payload_can_have(schema, rest.split(".")) for schema in types.values()):
            which = ", ".join(sorted(types)[:6])
            problems.append(
                f"args: template {{{{ {name} }}}} names a field no matching event type can have ({which})"
            )
    return problems


__all__ = [
    "ABSENT",
    "MENTIONS_ARGUMENT",
    "TEMPLATE_ROOTS",
    "Authority",
    "BoundConstraint",
    "Constraint",
    "args_problems",
    "lookup",
    "parse_args",
    "payload_can_have",
    "render",
    "same_json",
    "template_fields",
    "unknown_arguments",
]
