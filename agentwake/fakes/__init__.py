"""Fake upstreams (GitHub's REST API, Slack's Web API and Socket Mode, PagerDuty's REST API) on
loopback: the tests drive them, and `agentwake fake NAME` serves one for an offline playground."""
