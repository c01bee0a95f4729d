"""agentwake.toml: validation, interpolation, defaults and path resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentwake.config import interpolate, load_config
from agentwake.errors import ConfigError

GOOD = """
[store]
path = "data/aw.db"

[servers.demo]
command = "python"
args = ["-m", "examples.demo_server"]
env = { DEMO_RATE = "${RATE:-2}" }

[servers.remote]
url = "http://127.0.0.1:8765/mcp"
headers = { Authorization = "Bearer ${TOKEN}" }

[[subscriptions]]
server = "demo"
event = "ticket.created"
arguments = { queue = "support" }
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agentwake.toml"
    path.write_text(text)
    return path


def test_a_good_config_loads_with_defaults_and_resolved_paths(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD), env={"TOKEN": "abc"})
    assert config.store.path == tmp_path.resolve() / "data" / "aw.db"
    assert config.servers["demo"].cwd == tmp_path.resolve()
    assert config.servers["demo"].env == {"DEMO_RATE": "2"}
    assert config.servers["remote"].headers == {"Authorization": "Bearer abc"}
    [sub] = config.subscriptions
    assert sub.name == "demo.ticket.created"
    assert (sub.delivery, sub.max_events, sub.poll_floor_ms, sub.max_age_ms) == ("auto", 100, 1000, None)


def test_the_bundled_config_is_valid() -> None:
    config = load_config(Path(__file__).resolve().parent.parent / "agentwake.toml", env={})
    assert {s.name for s in config.subscriptions} >= {"tickets", "alerts"}


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("${A}", {"A": "1"}, "1"),
        ("${A:-x}", {}, "x"),
        ("${A:-x}", {"A": ""}, "x"),
        ("pre-${A}-post", {"A": "mid"}, "pre-mid-post"),
        ("$${A}", {"A": "1"}, "${A}"),
        ("${A:-}", {}, ""),
    ],
)
def test_interpolation_replaces_variables_and_defaults(text: str, env: dict[str, str], expected: str) -> None:
    assert interpolate({"k": [text]}, env) == {"k": [expected]}


def test_an_unset_variable_without_default_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"servers\.remote\.headers\.Authorization uses \$\{TOKEN\}"):
        load_config(write(tmp_path, GOOD), env={})


@pytest.mark.parametrize(
    ("snippet", "message"),
    [
        ('[servers.a]\ncommand = "x"\nurl = "http://h/mcp"', "set exactly one of 'command'"),
        ("[servers.a]\n", "set exactly one of 'command'"),
        ('[servers.a]\nurl = "ftp://h"', "must be an http:// or https:// URL"),
        ('[servers.a]\ncommand = "x"\nheaders = { A = "b" }', "'headers' only apply"),
        (
            '[servers.a]\ncommand = "x"\n[[subscriptions]]\nserver = "b"\nevent = "e"',
            "names server 'b', which is not in",
        ),
        (
            '[servers.a]\ncommand = "x"\n[[subscriptions]]\nserver = "a"\nevent = "e"\n[[subscriptions]]\nserver = "a"\nevent = "e"',
            "is used twice",
        ),
        (
            '[servers.a]\ncommand = "x"\n[[subscriptions]]\nserver = "a"\nevent = "e"\nmax_events = 0',
            "subscriptions[0].max_events",
        ),
        (
            '[servers.a]\ncommand = "x"\n[[subscriptions]]\nserver = "a"\nevent = "e"\ndelivery = "carrier-pigeon"',
            "subscriptions[0].delivery",
        ),
        ('[servers.a]\ncommand = "x"\ncomand = "y"', "servers.a.comand: unknown key"),
        ("[store]\npath = ", "is not valid TOML"),
    ],
)
def test_bad_config_gives_one_clear_error(tmp_path: Path, snippet: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, snippet), env={})
    assert message in str(caught.value)


def test_a_missing_config_file_says_how_to_fix_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file not found.*pass -c FILE"):
        load_config(tmp_path / "nope.toml")
