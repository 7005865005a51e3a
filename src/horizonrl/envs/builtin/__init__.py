"""The environments horizonrl ships, each registered under its name when imported.

Synthetic (generated tasks, scripted experts; the tiny model's benchmarks):

- :mod:`.lookup`: multi-hop question answering over a generated fact base (``search`` tool),
  its entities from :mod:`.names`;
- :mod:`.rooms`: an ALFWorld-like text game (``act`` tool);
- :mod:`.arithmetic`: multi-step arithmetic with a calculator (:mod:`.calculator`).

Real data (docs/envs/):

- :mod:`.airline`: τ²-bench airline customer service;
- :mod:`.household`: ALFWorld household games over the shipped PDDL domain;
- :mod:`.math_tool`: ``math_python``, reasoning-gym problems with a sandboxed ``python`` tool;
- :mod:`.search`: multi-hop QA by searching and reading a local corpus (BM25 / dense).
"""
