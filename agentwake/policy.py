"""Policy files: which events wake the agent, with which prompt, model and tools.

Rules live in ``policies/*.toml`` (``[policy] dir`` points elsewhere), read in
file-name order; within a file, in order. The packaged files
(``agentwake/defaults/policies``: a commented starter without rules) are read too,
unless the folder has a file of the same name, which replaces it. The first rule
that matches decides; when none does, ``[policy] default`` does ("agent" unless set).
Every decision says which rule matched and why, and is stored with the run.

A file holds ``[[rules]]`` tables::

    [[rules]]
    name = "page-on-p1"
    action = "agent"                      # ignore | log | agent | approve
    tools = ["demo__acknowledge_alert"]
    prompt = "alert.fired.md.j2"
    match.event = "alert.*"               # glob; also server, subscription
    match.data = { severity = "P1" }      # shorthand for equals
    match.when = [{ field = "data.service", op = "in", value = ["api", "db"] }]
    match.injection_score = { lt = 0.5 }

Conditions: ``eq``, ``ne``, ``in``, ``glob``, ``regex``, ``gt``, ``ge``, ``lt``,
``le``, ``exists``. Fields are dotted paths into the event (``data.x.y``,
``name``, ``server``, ``subscription``, ``injection_score``).
"""

from __future__ import annotations

import fnmatch
import importlib.util
import logging
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentwake.authority import ABSENT as MISSING
from agentwake.authority import lookup
from agentwake.errors import ConfigError, PolicyError

logger = logging.getLogger(__name__)

# Shipped in the wheel and read before the policies folder, which overrides it file by file.
PACKAGED_POLICIES: Final = Path(__file__).resolve().parent / "defaults" / "policies"

Action = Literal["ignore", "log", "agent", "approve"]
ACTIONS: Final[tuple[Action, ...]] = ("ignore", "log", "agent", "approve")
Op = Literal["eq", "ne", "in", "glob", "regex", "gt", "ge", "lt", "le", "exists"]
_NUMERIC: Final = frozenset({"gt", "ge", "lt", "le"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Condition(_Model):
    field: str = Field(min_length=1)
    op: Op = "eq"
    value: Any = None

    @model_validator(mode="after")
    def _value_fits_op(self) -> Condition:
        if self.op == "in" and not isinstance(self.value, list):
            raise ValueError(f"condition on {self.field!r}: 'in' needs a list value")
        if self.op in _NUMERIC and (isinstance(self.value, bool) or not isinstance(self.value, int | float)):
            raise ValueError(f"condition on {self.field!r}: {self.op!r} needs a number")
        if self.op in ("glob", "regex") and not isinstance(self.value, str):
            raise ValueError(f"condition on {self.field!r}: {self.op!r} needs a string pattern")
        if self.op == "regex":
            try:
                re.compile(self.value)
            except re.error as exc:
                raise ValueError(f"condition on {self.field!r}: bad regex {self.value!r}: {exc}") from None
        if self.op == "exists" and not isinstance(self.value, bool | None):
            raise ValueError(f"condition on {self.field!r}: 'exists' takes true or false")
        return self


class ScoreBounds(_Model):
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None


class Match(_Model):
    server: str | None = None
    event: str | None = None
    subscription: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    when: list[Condition] = Field(default_factory=list)
    injection_score: ScoreBounds | None = None

    def conditions(self) -> list[Condition]:
        found: list[Condition] = []
        for key, glob in (("server", self.server), ("name", self.event), ("subscription", self.subscription)):
            if glob is not None:
                found.append(Condition(field=key, op="glob", value=glob))
        found.extend(Condition(field=f"data.{key}", op="eq", value=value) for key, value in self.data.items())
        found.extend(self.when)
        if self.injection_score is not None:
            for op in ("gt", "ge", "lt", "le"):
                bound = getattr(self.injection_score, op)
                if bound is not None:
                    found.append(Condition(field="injection_score", op=op, value=bound))
        return found


class RateLimit(_Model):
    """At most ``max`` agent runs per ``window_s`` (per value of ``key``); the rest get ``over_limit``."""

    max: int = Field(ge=1)
    window_s: float = Field(gt=0)
    key: str | None = None
    over_limit: Literal["log", "ignore", "delay"] = "log"


class Dedup(_Model):
    """An event whose ``key`` value was seen by this rule within ``window_s`` is a duplicate (ignored)."""

    key: str = Field(min_length=1)
    window_s: float = Field(gt=0)


class Debounce(_Model):
    """Events within ``window_s`` of the first (per value of ``key``) become one agent run that sees them all."""

    window_s: float = Field(gt=0)
    key: str | None = None
    max_events: int = Field(default=50, ge=2, le=1000)


class Rule(_Model):
    name: str = Field(min_length=1)
    action: Action
    match: Match = Field(default_factory=Match)
    tools: list[str] | None = None
    prompt: str | None = None
    model: str | None = None
    priority: int = 0
    description: str | None = None
    rate_limit: RateLimit | None = None
    dedup: Dedup | None = None
    debounce: Debounce | None = None
    max_concurrent: int | None = Field(default=None, ge=1)
    redact_pii: bool = Field(
        default=False, description="also redact emails and phone numbers for these events"
    )
    hook: str | None = Field(
        default=None, description='"path/to/file.py:function", path relative to the config'
    )
    hook_timeout_s: float = Field(default=2.0, gt=0)
    fallback: Action = Field(default="log", description="the action when the hook fails or times out")
    args: dict[str, dict[str, Any]] | None = Field(
        default=None,
        description="per tool, its arguments pinned to a value or template, or checked (agentwake.authority)",
    )
    allow_mentions: bool = Field(
        default=False, description="let posting tools send mentions and link markup as written"
    )

    @field_validator("args", mode="before")
    @classmethod
    def _args_form(cls, value: Any) -> Any:
        from agentwake.authority import parse_args

        if value is not None:
            if not isinstance(value, dict):
                raise ValueError(
                    '\'args\' is a table of tools, like args."slack__post_message" = { channel = "C0123" }'
                )
            parse_args(value)
        return value

    @field_validator("hook")
    @classmethod
    def _hook_form(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[^:]+\.py:[A-Za-z_][A-Za-z0-9_]*$", value):
            raise ValueError(f"hook {value!r} must look like 'policies/custom.py:decide'")
        return value

    @field_validator("tools")
    @classmethod
    def _tool_globs(cls, value: list[str] | None) -> list[str] | None:
        for glob in value or []:
            if "__" not in glob and glob != "*":
                raise ValueError(f"tool glob {glob!r} has no server part; tools are named '<server>__<tool>'")
        return value

    @model_validator(mode="after")
    def _agent_only_keys(self) -> Rule:
        # A hook may turn any rule into an agent run, so its rule may carry what that run uses.
        runs = self.action in ("agent", "approve") or self.hook is not None
        if not runs and (self.tools or self.prompt or self.model):
            raise ValueError(
                f"'tools', 'prompt' and 'model' only apply to action 'agent' or 'approve', not {self.action!r}"
            )
        if not runs and (self.args or self.allow_mentions):
            raise ValueError(
                f"'args' and 'allow_mentions' only apply to action 'agent' or 'approve', not {self.action!r}"
            )
        if self.args and self.tools is not None:
            stray = [tool for tool in self.args if not any(fnmatch.fnmatchcase(tool, g) for g in self.tools)]
            if stray:
                raise ValueError(
                    f"args names {', '.join(map(repr, stray))}, which 'tools' does not allow"
                    f" ({', '.join(self.tools) or 'none'})"
                )
        flow = [key for key in ("rate_limit", "dedup", "debounce", "max_concurrent") if getattr(self, key)]
        if flow and self.action != "agent":
            # They pace agent runs; on other actions (approve included) they would silently do nothing.
            raise ValueError(
                f"{', '.join(map(repr, flow))} only apply to action 'agent', not {self.action!r}"
            )
        return self


class _PolicyFile(_Model):
    rules: list[Rule] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LoadedRule:
    rule: Rule
    file: Path
    line: int

    @property
    def where(self) -> str:
        return f"{self.file.name}:{self.line}"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    rule: str
    why: str
    where: str | None = None
    tools: list[str] | None = None
    prompt: str | None = None
    model: str | None = None
    priority: int = 0
    source: Rule | None = None
    args: dict[str, dict[str, Any]] | None = None
    allow_mentions: bool = False

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "action": self.action,
            "rule": self.rule,
            "why": self.why,
            "where": self.where,
            "rule_tools": self.tools,
            "prompt": self.prompt,
            "model": self.model,
            "priority": self.priority,
        }
        # Kept with the event, so an approval later grants what the person saw, whatever the policy says then.
        if self.args:
            record["rule_args"] = self.args
        if self.allow_mentions:
            record["allow_mentions"] = True
        return record


Hook = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class Policy:
    rules: list[LoadedRule] = field(default_factory=list)
    default: Action = "agent"
    files: list[Path] = field(default_factory=list)
    hooks: dict[str, Hook] = field(default_factory=dict)  # by rule name

    def rule(self, name: str) -> Rule | None:
        return next((loaded.rule for loaded in self.rules if loaded.rule.name == name), None)

    def fingerprint(self) -> tuple[tuple[str, int, int], ...]:
        """Names, sizes and modification times of the files it came from: a changed file changes it."""
        return policy_fingerprint(self.files)

    def files_summary(self) -> str:
        """Like "3 file(s) (1 packaged)": the packaged files are read too unless the folder overrides them."""
        packaged = sum(1 for f in self.files if f.parent == PACKAGED_POLICIES)
        return f"{len(self.files)} file(s)" + (f" ({packaged} packaged)" if packaged else "")

    def who_decides_the_rest(self) -> str:
        """In words, what decides an event no earlier rule matches: a catch-all rule, or ``default``."""
        for loaded in self.rules:
            if not loaded.rule.match.conditions():
                return f"catch-all rule {loaded.rule.name!r} ({loaded.where}) decides the rest: {loaded.rule.action}"
        return f"no catch-all rule: the rest get the default action {self.default!r} ([policy] default)"

    def decide(self, event: Mapping[str, Any]) -> Decision:
        """First matching rule, in file then rule order; else the default rule."""
        for loaded in self.rules:
            rule = loaded.rule
            reasons = _reasons(rule.match.conditions(), event)
            if reasons is not None:
                return Decision(
                    action=rule.action,
                    rule=rule.name,
                    why="; ".join(reasons) if reasons else "the rule matches every event",
                    where=loaded.where,
                    tools=rule.tools,
                    prompt=rule.prompt,
                    model=rule.model,
                    priority=rule.priority,
                    source=rule,
                    args=rule.args,
                    allow_mentions=rule.allow_mentions,
                )
        checked = f"none of the {len(self.rules)} rule(s) matched" if self.rules else "no policy rules"
        return Decision(action=self.default, rule="default", why=checked)


def _same(actual: Any, expected: Any) -> bool:
    """JSON equality: true is not 1 and false is not 0, unlike in Python."""
    if isinstance(actual, bool) != isinstance(expected, bool):
        return False
    return bool(actual == expected)


def _holds(condition: Condition, actual: Any) -> bool:
    op, expected = condition.op, condition.value
    if op == "exists":
        return (actual is not MISSING) == (expected is not False)
    if actual is MISSING:
        return op == "ne"
    if op == "eq":
        return _same(actual, expected)
    if op == "ne":
        return not _same(actual, expected)
    if op == "in":
        return any(_same(actual, option) for option in expected)
    if op == "glob":
        return isinstance(actual, str) and fnmatch.fnmatchcase(actual, expected)
    if op == "regex":
        return isinstance(actual, str) and re.search(expected, actual) is not None
    if isinstance(actual, bool) or not isinstance(actual, int | float):
        return False
    number = float(actual)
    limit = float(expected)
    return {"gt": number > limit, "ge": number >= limit, "lt": number < limit, "le": number <= limit}[op]


def _reasons(conditions: Sequence[Condition], event: Mapping[str, Any]) -> list[str] | None:
    """Why each condition holds, or None at the first that does not."""
    reasons: list[str] = []
    for condition in conditions:
        actual = lookup(event, condition.field)
        if not _holds(condition, actual):
            return None
        shown = "present" if condition.op == "exists" and condition.value is not False else repr(actual)
        if condition.op == "exists" and condition.value is False:
            shown = "absent"
        reasons.append(f"{condition.field} {condition.op} {condition.value!r} ({shown})")
    return reasons


def _rule_lines(text: str) -> list[int]:
    """Line numbers of each ``[[rules]]`` header, in order."""
    return [
        n for n, line in enumerate(text.splitlines(), start=1) if re.match(r"^\s*\[\[\s*rules\s*\]\]", line)
    ]


def load_file(path: Path) -> list[LoadedRule]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{path}: not valid TOML: {exc}") from None
    lines = _rule_lines(text)
    try:
        parsed = _PolicyFile.model_validate(data)
    except ValidationError as exc:
        messages = []
        for error in exc.errors():
            loc = error["loc"]
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                message = f"unknown key {loc[-1]!r}"
            if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
                index = loc[1]
                raw = data.get("rules", [])
                name = (
                    raw[index].get("name", f"#{index + 1}")
                    if index < len(raw) and isinstance(raw[index], dict)
                    else f"#{index + 1}"
                )
                line = lines[index] if index < len(lines) else 0
                key = ".".join(str(p) for p in loc[2:]) or "(rule)"
                messages.append(f"{path}:{line}: rule {name!r}: {key}: {message}")
            else:
                messages.append(f"{path}: {'.'.join(map(str, loc)) or '(top level)'}: {message}")
        raise PolicyError("\n".join(messages)) from None
    return [LoadedRule(rule, path, lines[i] if i < len(lines) else 0) for i, rule in enumerate(parsed.rules)]


def policy_fingerprint(files: Sequence[Path]) -> tuple[tuple[str, int, int], ...]:
    found = []
    for path in files:
        try:
            info = path.stat()
        except OSError:
            continue
        found.append((str(path), info.st_size, info.st_mtime_ns))
    return tuple(found)


def load_hook(spec: str, base: Path) -> Hook:
    """``path/to/file.py:function``; the path is relative to ``base`` (the config's folder)."""
    file_part, _, function = spec.rpartition(":")
    path = Path(file_part)
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise PolicyError(f"hook file {path} does not exist")
    module_name = f"agentwake_policy_hook_{abs(hash(str(path)))}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise PolicyError(f"hook file {path} cannot be imported")
    module = importlib.util.module_from_spec(loader_spec)
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:  # user code: report it as a policy error, never crash the service
        raise PolicyError(f"hook file {path} failed to import: {type(exc).__name__}: {exc}") from None
    hook = getattr(module, function, None)
    if not callable(hook):
        raise PolicyError(f"hook file {path} has no function {function!r}")
    return cast(Hook, hook)


def policy_files(folder: Path | None, packaged: Path | None = PACKAGED_POLICIES) -> list[Path]:
    """The packaged files overlaid by ``folder``'s, file by file (same name: the folder's wins), in name order."""
    by_name = {p.name: p for p in sorted(packaged.glob("*.toml"))} if packaged is not None else {}
    if folder is not None and folder.exists():
        if not folder.is_dir():
            raise PolicyError(f"policy dir {folder} is not a folder")
        by_name.update({p.name: p for p in folder.glob("*.toml")})
    return [by_name[name] for name in sorted(by_name)]


def load_policy(
    folder: Path | None,
    default: Action = "agent",
    *,
    base: Path | None = None,
    packaged: Path | None = PACKAGED_POLICIES,
) -> Policy:
    """Every policy file (see ``policy_files``); all errors of all files at once; names must be unique."""
    files = policy_files(folder, packaged)
    rules: list[LoadedRule] = []
    problems: list[str] = []
    for path in files:
        try:
            rules.extend(load_file(path))
        except PolicyError as exc:
            problems.append(str(exc))
    seen: dict[str, LoadedRule] = {}
    for loaded in rules:
        first = seen.setdefault(loaded.rule.name, loaded)
        if first is not loaded:
            problems.append(
                f"{loaded.file}:{loaded.line}: rule name {loaded.rule.name!r} is already used at {first.where}"
            )
    hooks: dict[str, Hook] = {}
    for loaded in rules:
        if loaded.rule.hook:
            try:
                hooks[loaded.rule.name] = load_hook(loaded.rule.hook, base or loaded.file.parent.parent)
            except PolicyError as exc:
                problems.append(f"{loaded.file}:{loaded.line}: rule {loaded.rule.name!r}: {exc}")
    if problems:
        raise PolicyError("\n".join(problems))
    return Policy(rules=rules, default=default, files=files, hooks=hooks)


@dataclass
class PolicyReloader:
    """Loads the policy again when asked (SIGHUP) or when a file in its folder changed.

    A bad edit keeps the last good policy and says why, once per distinct bad state.
    Work in flight is not touched: decisions already taken stand; the new policy
    decides the events that come after.
    """

    folder: Path
    load: Callable[[], Policy]
    apply: Callable[[Policy], None]
    current: Policy
    base: Path | None = None
    _seen: tuple[tuple[str, int, int], ...] = ()
    _failed: tuple[tuple[str, int, int], ...] | None = None

    def __post_init__(self) -> None:
        self._seen = self._state()

    def _state(self) -> tuple[tuple[str, int, int], ...]:
        files = sorted(self.folder.glob("*.toml")) if self.folder.is_dir() else []
        hooks = [Path(r.rule.hook.rpartition(":")[0]) for r in self.current.rules if r.rule.hook]
        return policy_fingerprint([*files, *hooks])

    def changed(self) -> bool:
        return self._state() != self._seen

    def reload(self, *, reason: str) -> bool:
        """Try to load; True when a new policy is in force."""
        state = self._state()
        try:
            policy = self.load()
        except ConfigError as exc:
            if state != self._failed:
                logger.error("policy reload (%s) failed; keeping the last good policy:\n%s", reason, exc)
            self._failed = state
            self._seen = state
            return False
        self.current = policy
        self._seen = self._state()
        self._failed = None
        self.apply(policy)
        logger.info(
            "policy reloaded (%s): %d rule(s) from %s", reason, len(policy.rules), policy.files_summary()
        )
        return True
