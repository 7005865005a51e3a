"""Adapters of environments defined outside horizonrl (``docs/hubs.md``).

- :mod:`.gym_text`: ``gym``, any gymnasium-style text environment (``reset``/``step``);
- :mod:`.openenv_client`: ``openenv``, an OpenEnv environment server;
- :mod:`.episodic`: the turn protocol these two share (action, observation, reward, tasks);
- :mod:`.mcp`: ``mcp``, the tools of a local MCP server as the policy's tools;
- :mod:`.verifiers_env`: ``verifiers``, an environment of Prime Intellect's ``verifiers`` hub.

Each registers its name when imported and loads its third-party library on first use.
"""
