"""agentwake: wake an LLM agent when something happens upstream, through MCP Events.

Importing agentwake changes nothing in the process (no environment variable, no
logging set-up) and loads no heavy dependency; each module imports what it uses.
"""
