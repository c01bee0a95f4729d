"""/metrics of processes sharing a PostgreSQL store: each series carries the process's label.

A real `agentwake run` on PostgreSQL serves its endpoint on a loopback port; the label is the
owner id its leases carry, which `status` shows as driven_by.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from _postgres import postgres_server, postgres_url  # noqa: F401 - fixtures, found by pytest by name
from _support import agentwake_run, demo_server_toml
from prometheus_client.parser import text_string_to_metric_families
from test_web_endpoint import endpoint_url

from agentwake import metrics
from agentwake.store.postgres import PostgresStore

pytestmark = pytest.mark.anyio


class EmptyInbox:
    async def state_counts(self) -> dict[str, int]:
        return {}

    async def oldest_pending_at(self) -> str | None:
        return None


async def test_with_a_process_every_series_carries_its_label() -> None:
    text = (await metrics.exposition(EmptyInbox(), process="host:42:abc")).decode()
    samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    assert samples
    assert all(sample.labels.get("process") == "host:42:abc" for sample in samples)
    plain = (await metrics.exposition(EmptyInbox())).decode()
    assert "process=" not in plain  # one process per store (SQLite): no label


async def test_a_process_on_a_shared_store_labels_its_metrics_with_the_owner_that_status_shows(
    tmp_path: Path,
    postgres_url: str,  # noqa: F811
) -> None:
    config = tmp_path / "agentwake.toml"
    config.write_text(
        f'[store]\nurl = "{postgres_url}"\nlease_s = 3\n\n[service]\nlisten = "127.0.0.1:0"\n\n'
        + demo_server_toml(tmp_path / "demo.db", DEMO_NEXT_POLL_MS="100")
        + '\n[[subscriptions]]\nname = "tickets"\nserver = "demo"\nevent = "ticket.created"\ndelivery = "poll"\n'
    )
    async with agentwake_run(config) as run:
        url = await endpoint_url(run)
        await run.wait_for("subscription tickets: this process drives it now")
        async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
            assert response.status == 200
            text = await response.text()
        store = await PostgresStore.open(postgres_url)
        try:
            [lease] = await store.subscription_owners()
        finally:
            await store.close()
        assert await run.stop() == 0
    families = {family.name: family for family in text_string_to_metric_families(text)}
    processes = {sample.labels.get("process") for family in families.values() for sample in family.samples}
    assert processes == {lease["owner"]}
    assert families["agentwake_build_info"].samples[0].labels["process"] == lease["owner"]
