"""The config file before validation: reading it, ``${ENV}`` interpolation, paths, and where the store is.

No pydantic here. ``agentwake.config`` validates the whole file with these; the CLI's
quick readers (``status``, ``inbox``, ...) need only ``locate_store``: where the store is
and which subscriptions are configured, found by the same rules without validating the
rest (a typo in ``[agent]`` does not stop ``status``; ``agentwake check`` reports it). A
PostgreSQL store's ``[store] url`` and ``password_env`` are checked by ``StoreConfig`` itself, so
pydantic is loaded for them only.

Interpolation runs on string values after TOML parsing (so a variable can never
inject TOML): ``${NAME}`` must be set, ``${NAME:-default}`` falls back, and
``$${`` writes a literal ``${``. Relative paths resolve against the folder that
holds the config file.

tomllib gives no line numbers, so ``key_lines`` finds them with a small scanner over
the text (table headers, ``[[array]]`` entries counted, dotted and inline keys): a
config error can then say "unknown key 'tool' in [[subscriptions]] #1 at line 31".
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from agentwake.errors import ConfigError

DEFAULT_CONFIG_PATH: Final = Path("agentwake.toml")
# The default of every command's -c/--config, when set.
CONFIG_ENV: Final = "AGENTWAKE_CONFIG"
DEFAULT_STORE_PATH: Final = "agentwake.db"
_ENV_PATTERN: Final = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

# A location in the parsed data: keys and array indexes, as pydantic reports them.
Location = tuple[str | int, ...]


def read_config_source(path: Path) -> tuple[str, dict[str, Any]]:
    """The file's text and its TOML as data. Every failure is a ConfigError that names the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"config file not found: {path} (pass -c FILE, set {CONFIG_ENV}, or create agentwake.toml)"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"cannot read config file {path}: it is a folder") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None


def read_config_file(path: Path) -> dict[str, Any]:
    """The file's TOML as data. Every failure is a ConfigError that names the file."""
    return read_config_source(path)[1]


def interpolate(value: Any, env: Mapping[str, str], where: str = "", *, keep_unset: bool = False) -> Any:
    """Replace ``${NAME}`` / ``${NAME:-default}`` in every string inside ``value``.

    ``keep_unset`` leaves ``${NAME}`` as written when NAME is not set (instead of a
    ConfigError): for commands that never use the value (see ``agentwake.config``).
    """
    if isinstance(value, str):

        def replace(match: re.Match[str]) -> str:
            if match.group(0) == "$${":
                return "${"
            name, default = match.group(1), match.group(2)
            if name in env and env[name] != "":
                return env[name]
            if default is not None:
                return default
            if keep_unset:
                return match.group(0)
            raise ConfigError(
                f"{where or 'a value'} uses ${{{name}}}, but {name} is not set; "
                f"export it or write ${{{name}:-default}}"
            )

        return _ENV_PATTERN.sub(replace, value)
    if isinstance(value, dict):
        return {
            key: interpolate(item, env, f"{where}.{key}" if where else key, keep_unset=keep_unset)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [
            interpolate(item, env, f"{where}[{index}]", keep_unset=keep_unset)
            for index, item in enumerate(value)
        ]
    return value


def unset_variables(value: Any, env: Mapping[str, str]) -> list[str]:
    """The names of the variables ``interpolate`` would refuse in ``value``: used, unset, no default."""
    if isinstance(value, str):
        return [
            m.group(1)
            for m in _ENV_PATTERN.finditer(value)
            if m.group(0) != "$${" and m.group(2) is None and not env.get(m.group(1))
        ]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [name for item in items for name in unset_variables(item, env)]


# ---- where a key is in the text ------------------------------------------------------------------

_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_DOTTED = rf"{_KEY_PART}(?:\s*\.\s*{_KEY_PART})*"
_HEADER_LINE: Final = re.compile(rf"^\s*(\[\[?)\s*({_DOTTED})\s*\]\]?\s*(?:#.*)?$")
_KEY_LINE: Final = re.compile(rf"^\s*({_DOTTED})\s*=")
_INLINE_KEY: Final = re.compile(rf"[{{,]\s*({_DOTTED})\s*=")
_PART: Final = re.compile(_KEY_PART)


def _parts(dotted: str) -> tuple[str, ...]:
    return tuple(p[1:-1] if p[:1] in "\"'" and len(p) >= 2 else p for p in _PART.findall(dotted))


def key_lines(text: str) -> dict[Location, int]:
    """Where each table and key starts (1-based line), by location: ``("subscriptions", 0, "tools")``.

    A simple scanner, not a parser: it follows ``[table]`` and ``[[array]]`` headers (counting
    the entries of each array), dotted keys, and the keys of a one-line inline table. The
    first occurrence of a location wins. Good enough to point at a line; never trusted for data.
    """
    lines: dict[Location, int] = {}
    arrays: dict[Location, int] = {}
    prefix: Location = ()
    in_string: str | None = None

    def resolve(parts: tuple[str, ...]) -> Location:
        resolved: Location = ()
        for part in parts:
            resolved += (part,)
            if resolved in arrays:
                resolved += (arrays[resolved] - 1,)
        return resolved

    for number, line in enumerate(text.splitlines(), start=1):
        if in_string is not None:
            if line.count(in_string) % 2 == 1:
                in_string = None
            continue
        header = _HEADER_LINE.match(line)
        if header:
            parts = _parts(header.group(2))
            if header.group(1) == "[[":
                table = (*resolve(parts[:-1]), parts[-1])
                arrays[table] = arrays.get(table, 0) + 1
                lines.setdefault(table, number)
                prefix = (*table, arrays[table] - 1)
            else:
                prefix = resolve(parts)
            lines.setdefault(prefix, number)
            continue
        key = _KEY_LINE.match(line)
        if key is None:
            continue
        parts = _parts(key.group(1))
        for depth in range(1, len(parts) + 1):
            lines.setdefault(prefix + parts[:depth], number)
        rest = line[key.end() :]
        if rest.lstrip().startswith("{"):
            for inner in _INLINE_KEY.finditer(rest):
                lines.setdefault(prefix + parts + _parts(inner.group(1)), number)
        for quote in ('"""', "'''"):
            if rest.count(quote) % 2 == 1:
                in_string = quote
                break
    return lines


def line_of(lines: Mapping[Location, int], loc: Location) -> int | None:
    """The line of ``loc``, or of the nearest table or key that holds it."""
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def table_label(loc: Location) -> str:
    """How the file writes the table at ``loc``: ``[agent]``, ``[servers.x]``, ``[[subscriptions]] #2``."""
    segments: list[str] = []
    name: list[str] = []
    for part in loc:
        if isinstance(part, int):
            segments.append(f"[[{'.'.join(name)}]] #{part + 1}")
            name = []
        else:
            name.append(part)
    if name:
        segments.append(f"[{'.'.join(name)}]" if not segments else ".".join(name))
    return " ".join(segments) if segments else "the top level"


def under(base: Path, path: Path) -> Path:
    """``path`` resolved against ``base`` unless it is absolute; ``~`` expanded."""
    path = path.expanduser()
    return path if path.is_absolute() else base / path


def config_base(source: Path | None) -> Path:
    """The folder relative paths in a config resolve against: the file's, else the current one."""
    return source.parent.resolve() if source else Path.cwd()


def with_default_name(subscription: Any) -> Any:
    """A ``[[subscriptions]]`` table with its name filled in: ``<server>.<event>`` when it has none."""
    if (
        isinstance(subscription, dict)
        and not subscription.get("name")
        and subscription.get("server")
        and subscription.get("event")
    ):
        return {**subscription, "name": f"{subscription['server']}.{subscription['event']}"}
    return subscription


@dataclass(frozen=True, slots=True)
class StoreLocation:
    """Where a config keeps its store, and the names of its subscriptions.

    ``url`` (and ``password_env``, the variable holding its password) when the store is in
    PostgreSQL (``[store] url``); then ``path`` is unused.
    """

    path: Path
    subscriptions: tuple[str, ...]
    url: str | None = None
    password_env: str | None = None
    # Server name -> its webhook_identity, for the servers that check it ("verify" or "require").
    identities: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The store as output names it: the SQLite file, or the PostgreSQL database by host, port
        and name (never a password: the url holds none)."""
        return str(self.path) if self.url is None else postgres_name(self.url)


def postgres_name(url: str) -> str:
    """``PostgreSQL database "aw" on db.example:5432``: a ``postgresql://`` url named by host, port
    and database, without user or password (parsed without psycopg)."""
    from urllib.parse import parse_qs, unquote, urlsplit

    try:
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        host = parts.hostname or (query.get("host") or [""])[0] or "the local socket"
        port = parts.port or (query.get("port") or [""])[0]
    except ValueError:
        return "a PostgreSQL database (its url cannot be parsed)"
    dbname = unquote(parts.path.lstrip("/")) or (query.get("dbname") or [""])[0] or "(default)"
    where = f"{host}:{port}" if port else host
    return f'PostgreSQL database "{dbname}" on {where}'


def locate_store(path: Path, *, env: Mapping[str, str] | None = None) -> StoreLocation:
    """The store and subscriptions of the config at ``path``, by the rules ``load_config`` uses,
    without validating the rest of the file.

    A PostgreSQL store (``[store] url``) has its url and password_env validated as ``load_config``
    does (by ``agentwake.config.StoreConfig``, so pydantic is loaded then only).
    """
    text, data = read_config_source(path)
    environ = os.environ if env is None else env
    store = data.get("store", {})
    if not isinstance(store, dict):
        raise ConfigError(f"{path} is invalid: store must be a table")
    subscriptions = data.get("subscriptions", [])
    names = []
    for index, subscription in enumerate(subscriptions if isinstance(subscriptions, list) else []):
        named = with_default_name(subscription)
        if isinstance(named, dict) and isinstance(named.get("name"), str):
            names.append(str(interpolate(named["name"], environ, f"subscriptions[{index}].name")))
    servers = data.get("servers", {})
    identities = {
        str(name): str(server["webhook_identity"])
        for name, server in (servers.items() if isinstance(servers, dict) else ())
        if isinstance(server, dict) and server.get("webhook_identity") in ("verify", "require")
    }
    if store.get("url") is not None or store.get("password_env") is not None:
        return replace(_postgres_location(path, text, store, environ, tuple(names)), identities=identities)
    raw_path = interpolate(store.get("path", DEFAULT_STORE_PATH), environ, "store.path")
    if not isinstance(raw_path, str) or not raw_path:
        raise ConfigError(f"{path} is invalid: store.path must be a file name")
    return StoreLocation(under(config_base(path), Path(raw_path)), tuple(names), identities=identities)


def _postgres_location(
    path: Path, text: str, store: dict[str, Any], env: Mapping[str, str], names: tuple[str, ...]
) -> StoreLocation:
    """The location of a ``[store] url`` store, its keys checked by ``StoreConfig`` (as ``load_config``
    checks them: the same messages, and the url never quoted)."""
    from pydantic import ValidationError

    from agentwake.config import StoreConfig, describe_error

    keys = {key: store[key] for key in ("url", "password_env", "path") if key in store}
    try:
        checked = StoreConfig.model_validate(interpolate(keys, env, "store"))
    except ValidationError as exc:
        lines = key_lines(text)
        problems = [f"  {describe_error({**e, 'loc': ('store', *e['loc'])}, lines)}" for e in exc.errors()]
        raise ConfigError(f"{path} is invalid:\n" + "\n".join(problems)) from None
    return StoreLocation(
        under(config_base(path), checked.path), names, url=checked.url, password_env=checked.password_env
    )
