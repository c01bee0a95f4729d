"""The agent: wakes an LLM (through litellm) for an inbox event, with the MCP servers' own tools.

Nothing here imports litellm at module level: it takes seconds to import and is
only loaded when the first agent run starts (see ``agentwake.agent.llm``).
"""
