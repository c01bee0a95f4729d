"""The config file before validation: what the CLI's quick readers take from it agrees with load_config."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from agentwake.config import load_config
from agentwake.configfile import locate_store
from agentwake.errors import ConfigError

CONFIG = """
[store]
path = "${STATE_DIR:-state}/aw.db"

[servers.demo]
command = "true"

[[subscriptions]]
server = "demo"
event = "ticket.created"

[[subscriptions]]
name = "alerts-${TEAM}"
server = "demo"
event = "alert.fired"
"""


@pytest.mark.parametrize("team", ["ops", "web"])
def test_the_store_and_subscriptions_found_are_the_ones_the_validated_config_has(
    tmp_path: Path, team: str
) -> None:
    path = tmp_path / "agentwake.toml"
    path.write_text(CONFIG)
    env = {"TEAM": team}
    located = locate_store(path, env=env)
    config = load_config(path, env=env)
    assert located.path == config.store.path == tmp_path.resolve() / "state" / "aw.db"
    assert located.subscriptions == tuple(s.name for s in config.subscriptions)
    assert located.subscriptions == ("demo.ticket.created", f"alerts-{team}")


def test_the_bundled_config_is_located_as_it_loads() -> None:
    located = locate_store(REPO / "agentwake.toml")
    config = load_config(REPO / "agentwake.toml")
    assert (located.path, located.subscriptions) == (
        config.store.path,
        tuple(s.name for s in config.subscriptions),
    )


def test_a_missing_file_bad_toml_or_an_unset_variable_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        locate_store(tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[store\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        locate_store(broken)
    unset = tmp_path / "unset.toml"
    unset.write_text('[store]\npath = "${NOPE}/aw.db"\n')
    with pytest.raises(ConfigError, match=r"store\.path uses \$\{NOPE\}, but NOPE is not set"):
        locate_store(unset, env={})
