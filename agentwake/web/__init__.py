"""The operator's HTTP endpoint of ``agentwake run``: /healthz, /readyz, /metrics and the approvals page.

``health`` (what /healthz reports, fed by the service) and ``access`` (where it listens, who
may use it) are light; ``app`` (aiohttp and the page) is imported by the service only when
``[service] listen`` is set.
"""

from agentwake.web.access import EndpointSettings, endpoint_settings, is_loopback
from agentwake.web.health import Health

__all__ = ["EndpointSettings", "Health", "endpoint_settings", "is_loopback"]
