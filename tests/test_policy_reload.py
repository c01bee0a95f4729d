"""Policy reload: in process (PolicyReloader) and on a real `agentwake run` with SIGHUP and file edits."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from _support import agentwake_run, demo_server_toml
from conftest import REPO

from agentwake.errors import ConfigError
from agentwake.policy import Policy, PolicyReloader, load_policy

GOOD = """
[[rules]]
name = "first"
action = "log"
"""
OTHER = """
[[rules]]
name = "second"
action = "ignore"

[[rules]]
name = "third"
action = "log"
"""
BAD = """
[[rules]]
name = "broken"
action = "explode"
"""


def reloader_for(folder: Path) -> tuple[PolicyReloader, list[Policy]]:
    applied: list[Policy] = []
    current = load_policy(folder)
    return PolicyReloader(folder, lambda: load_policy(folder), applied.append, current), applied


def test_a_changed_file_is_noticed_and_loaded(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(GOOD)
    reloader, applied = reloader_for(tmp_path)
    assert not reloader.changed()
    (tmp_path / "a.toml").write_text(OTHER)
    assert reloader.changed()
    assert reloader.reload(reason="test")
    assert [r.rule.name for r in applied[-1].rules] == ["second", "third"]
    assert not reloader.changed()


def test_a_bad_edit_keeps_the_last_good_policy_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "a.toml").write_text(GOOD)
    reloader, applied = reloader_for(tmp_path)
    (tmp_path / "a.toml").write_text(BAD)
    assert not reloader.reload(reason="test")
    assert applied == []
    assert [r.rule.name for r in reloader.current.rules] == ["first"]
    assert "keeping the last good policy" in caplog.text and "a.toml:2" in caplog.text
    caplog.clear()
    assert not reloader.changed()  # the bad state is known: no reload loop, no repeated error
    assert not reloader.reload(reason="again")
    assert "keeping the last good policy" not in caplog.text  # said once per bad state
    (tmp_path / "a.toml").write_text(OTHER)
    assert reloader.changed() and reloader.reload(reason="fixed")
    assert [r.rule.name for r in applied[-1].rules] == ["second", "third"]


def test_a_new_file_counts_as_a_change(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(GOOD)
    reloader, _ = reloader_for(tmp_path)
    (tmp_path / "b.toml").write_text(OTHER)
    assert reloader.changed()


def test_load_errors_are_config_errors(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(BAD)
    with pytest.raises(ConfigError, match=r"a\.toml:2: rule 'broken'"):
        load_policy(tmp_path)


@pytest.mark.anyio
async def test_sighup_and_file_edits_reload_the_running_service(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "a.toml").write_text(GOOD)
    config = tmp_path / "agentwake.toml"
    config.write_text(
        f"""
[store]
path = "aw.db"

[agent]
model = "agentwake/offline"
prompts = "{REPO / "prompts"}"

[policy]
dir = "policies"

{demo_server_toml(tmp_path / "demo.db")}
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
"""
    )
    async with agentwake_run(config) as run:
        start = await run.wait_for("policy: 1 rule(s) from 2 file(s) (1 packaged)")
        (policies / "a.toml").write_text(OTHER)
        run.process.send_signal(signal.SIGHUP)
        at = await run.wait_for("policy reloaded (SIGHUP): 2 rule(s)", after=start)
        (policies / "a.toml").write_text(BAD)
        at = await run.wait_for("keeping the last good policy", after=at)
        await run.wait_for("a.toml:2: rule 'broken'", after=at)
        (policies / "b.toml").write_text(GOOD.replace("first", "fourth"))
        (policies / "a.toml").write_text(OTHER)
        await run.wait_for(
            "policy reloaded (a policy file changed): 3 rule(s) from 3 file(s) (1 packaged)", after=at
        )
        assert await run.stop(signal.SIGTERM) == 0
