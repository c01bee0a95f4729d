"""agentwake: wake an LLM agent when something happens upstream, through MCP Events."""

import os

# litellm fetches its model price map from the internet on import unless this is set;
# agentwake never reaches beyond loopback, so it is forced for every import path.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
