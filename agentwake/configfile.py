"""The config file before validation: reading it, ``${ENV}`` interpolation, paths, and where the store is.

No pydantic here. ``agentwake.config`` validates the whole file with these; the CLI's
quick readers (``status``, ``inbox``, ...) need only ``locate_store``: where the store is
and which subscriptions are configured, found by the same rules without validating the
rest (a typo in ``[agent]`` does not stop ``status``; ``agentwake check`` reports it).

Interpolation runs on string values after TOML parsing (so a variable can never
inject TOML): ``${NAME}`` must be set, ``${NAME:-default}`` falls back, and
``$${`` writes a literal ``${``. Relative paths resolve against the folder that
holds the config file.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from agentwake.errors import ConfigError

DEFAULT_CONFIG_PATH: Final = Path("agentwake.toml")
DEFAULT_STORE_PATH: Final = "agentwake.db"
_ENV_PATTERN: Final = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def read_config_file(path: Path) -> dict[str, Any]:
    """The file's TOML as data. Every failure is a ConfigError that names the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path} (pass -c FILE, or create agentwake.toml)") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None


def interpolate(value: Any, env: Mapping[str, str], where: str = "") -> Any:
    """Replace ``${NAME}`` / ``${NAME:-default}`` in every string inside ``value``."""
    if isinstance(value, str):

        def replace(match: re.Match[str]) -> str:
            if match.group(0) == "$${":
                return "${"
            name, default = match.group(1), match.group(2)
            if name in env and env[name] != "":
                return env[name]
            if default is not None:
                return default
            raise ConfigError(
                f"{where or 'a value'} uses ${{{name}}}, but {name} is not set; "
                f"export it or write ${{{name}:-default}}"
            )

        return _ENV_PATTERN.sub(replace, value)
    if isinstance(value, dict):
        return {
            key: interpolate(item, env, f"{where}.{key}" if where else key) for key, item in value.items()
        }
    if isinstance(value, list):
        return [interpolate(item, env, f"{where}[{index}]") for index, item in enumerate(value)]
    return value


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
    """Where a config keeps its store, and the names of its subscriptions."""

    path: Path
    subscriptions: tuple[str, ...]


def locate_store(path: Path, *, env: Mapping[str, str] | None = None) -> StoreLocation:
    """The store and subscriptions of the config at ``path``, by the rules ``load_config`` uses,
    without validating the rest of the file."""
    data = read_config_file(path)
    environ = os.environ if env is None else env
    store = data.get("store", {})
    if not isinstance(store, dict):
        raise ConfigError(f"{path} is invalid: store must be a table")
    raw_path = interpolate(store.get("path", DEFAULT_STORE_PATH), environ, "store.path")
    if not isinstance(raw_path, str) or not raw_path:
        raise ConfigError(f"{path} is invalid: store.path must be a file name")
    subscriptions = data.get("subscriptions", [])
    names = []
    for index, subscription in enumerate(subscriptions if isinstance(subscriptions, list) else []):
        named = with_default_name(subscription)
        if isinstance(named, dict) and isinstance(named.get("name"), str):
            names.append(str(interpolate(named["name"], environ, f"subscriptions[{index}].name")))
    return StoreLocation(under(config_base(path), Path(raw_path)), tuple(names))
