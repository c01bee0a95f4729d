"""Bridges: MCP Events servers for upstreams that have no MCP events of their own."""
