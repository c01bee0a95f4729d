"""A SIGTERM while litellm is still being imported (seconds, at the first start on a cold disk) stops
`agentwake run` at once: the stop does not wait for the import's worker thread.

The litellm here is a stand-in put first on PYTHONPATH whose import never ends (it marks that it
started, then blocks), so the test knows the import is under way when it sends the signal.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from _support import agentwake_run, demo_server_toml
from conftest import REPO

pytestmark = pytest.mark.anyio

BLOCKING_LITELLM = """
import pathlib, threading
pathlib.Path({marker!r}).write_text("importing")
threading.Event().wait()
"""


async def test_sigterm_during_the_first_litellm_import_stops_the_service(tmp_path: Path) -> None:
    fake = tmp_path / "fake_site" / "litellm"
    fake.mkdir(parents=True)
    marker = tmp_path / "importing"
    (fake / "__init__.py").write_text(BLOCKING_LITELLM.format(marker=str(marker)))
    config = tmp_path / "agentwake.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path / "aw.db"}"\n\n'
        '[agent]\nmodel = "openai/fake"\napi_base = "http://127.0.0.1:9/v1"\napi_key_env = ""\n\n'
        + demo_server_toml(tmp_path / "demo.db")
        + '\n[[subscriptions]]\nserver = "demo"\nevent = "ticket.created"\n'
    )
    async with agentwake_run(config, PYTHONPATH=f"{fake.parent}{os.pathsep}{REPO}") as service:
        await service.wait_for("subscription", "ticket.created")
        with anyio.fail_after(60):
            while True:  # the import starts beside the delivery loops; it marks the moment it begins
                if marker.exists():
                    break
                assert service.process.returncode is None, service.log()
                await anyio.sleep(0.02)
        code = await service.stop(timeout=30)
    assert code == 0, service.log()
    assert "Traceback" not in service.log(200)
