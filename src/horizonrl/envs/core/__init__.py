"""The environment protocol: what a newcomer learns to write or drive an environment.

- :mod:`.base`: ``Env`` (``reset``/``step``/``snapshot``/``restore``), ``Task``, ``StepResult``,
  ``EnvMessage``;
- :mod:`.tools`: ``Tool`` declarations and the parser of ``<tool_call>`` blocks and ``<answer>``;
- :mod:`.common`: ``ToolEnv`` (the turn protocol of tool environments, written once), task
  generation and splits, knob checks;
- :mod:`.custom`: ``CustomEnv`` and the ``@tool`` decorator for environments written outside
  horizonrl, and the ``qa`` environment;
- :mod:`.registry`: environments by name (``register_env``, ``get_env``, ``env.imports``);
- :mod:`.taskfile`: tasks from local files (``env.tasks``);
- :mod:`.remote`: environments in Ray actors (``distributed.num_env_workers``).

Nothing here imports the other wings (``builtin``, ``hubs``, ``sandbox``).
"""
