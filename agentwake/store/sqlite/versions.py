"""The names of the schema's migrations, known without loading sqlite-utils.

A store whose ``_sqlite_migrations`` table lists all of them needs no migration, so
opening it (the CLI's quick readers) never imports sqlite-utils. ``schema.py`` defines
each migration under these names; a test checks the two agree.
"""

from __future__ import annotations

from typing import Final

MIGRATION_SET: Final = "agentwake"
MIGRATION_NAMES: Final = (
    "0001_initial",
    "0002_agent_runs",
    "0003_sanitize_and_policy",
    "0004_flow_control",
    "0005_stream_errors",
    "0006_webhooks",
    "0007_gap_deliveries",
    "0008_rejected_events",
    "0009_fair_claims",
    "0010_recent_errors",
    "0011_service",
    "0012_work_queue",
    "0013_subscription_owners",
    "0014_rule_slots",
    "0015_approval_answers",
    "0016_pauses",
    "0017_retention",
    "0018_operator_sessions",
    "0019_cached_tokens",
)
