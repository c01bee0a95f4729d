"""The benchmarks still run end to end (tiny sizes); their figures are for `make bench`, not for tests."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("script", "args", "keys"),
    [
        (
            "bench/poll_drain.py",
            ["--events", "3000"],
            {"events_per_s", "ratio", "baseline_store_events_per_s"},
        ),
        ("bench/cli_startup.py", ["--repeat", "1"], {"commands", "slowest_median_s", "within_target"}),
        (
            "bench/push_latency.py",
            ["--events", "2000", "--seconds", "1", "--repeat", "1", "--no-poll-latency", "--load", "1"],
            {
                "load",
                "loadavg_before",
                "push_vs_sqlite",
                "poll_vs_sqlite",
                "push_events_per_s",
                "poll_events_per_s",
                "ratio",
                "latency_p50_ms",
                "latency_p99_ms",
                "duplicates",
                "missing",
            },
        ),
        (
            "bench/pipeline_overhead.py",
            ["--events", "20", "--warmup", "2"],
            {"overhead_p50_ms", "litellm_p50_ms"},
        ),
        (
            "bench/webhook_ingest.py",
            ["--seconds", "1"],
            {
                "accepted_per_s",
                "bare_per_s",
                "bare_lowlevel_per_s",
                "ratio",
                "ratio_vs_lowlevel",
                "p99_ms",
                "rows",
            },
        ),
        (
            "bench/authority_check.py",
            ["--rounds", "50", "--repeat", "1"],
            {"baseline_parse_us", "bind_us", "check_us", "schema_us", "check_over_parse"},
        ),
        (
            "bench/scale_out.py",
            [
                *("--events", "2", "--processes", "2", "--concurrency", "1", "--llm-ms", "10"),
                *("--deliveries", "20", "--senders", "2", "--subscriptions", "4", "--items", "5"),
            ],
            {"one", "many", "throughput_ratio", "sqlite", "postgresql", "spread_one", "spread_many"},
        ),
        (
            "bench/store_growth.py",
            ["--quick"],
            {"claim_p99_ratio", "status_ratio", "soak_sizes", "soak_levels_off"},
        ),
        (
            "bench/prompt_cost.py",
            ["--quick"],
            {"series", "saving_anthropic", "saving_openai", "within_target", "per_event_tools", "split"},
        ),
        (
            "bench/soak.py",
            ["--subscriptions", "20", "--seconds", "2", "--rate", "0", "--no-agent"],
            {"soak", "baseline", "rss_ratio", "pass_rss", "pass_cpu"},
        ),
    ],
)
def test_the_benchmark_runs_and_prints_its_figures(script: str, args: list[str], keys: set[str]) -> None:
    done = subprocess.run(
        [sys.executable, script, *args, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert keys <= figures.keys()
