"""Code the tests share, imported as ``helpers.<module>`` (``tests/`` is on ``sys.path``: tests/conftest.py).

- ``shaped_env``: the dense-reward ``arith_shaped`` environment and the small runs (overrides and configs)
  on it and on ``arithmetic``;
- ``dist_run``: the torchrun worker script (run by path, not imported);
- ``family_tokenizers``: real tokenizers and random-weight models of model families, offline;
- ``grammars``: a tool schema, tools and a conversation for constrained decoding, and a grammar's acceptance
  of a token sequence;
- ``echo_rollouts``: hand-built ECHO rollouts (labelled spans, memory-record sources);
- ``mosaic_loops``: scripted policies driving Mosaic's compaction and fork loops on ``lookup``;
- ``shelf_env``: a small tool environment and a scripted react loop (a step's separate messages);
- ``gym_games``: small text games for the ``gym`` adapter;
- ``hub_training``: two training steps on an environment hub, and GRPO checked by hand on what they saved;
- ``sandbox_probes``: fixtures and /proc probes of the python sandbox's tests;
- ``script_loader``: a script or benchmark file imported as a module;
- ``tiny_decoders``: tiny random-weight decoders (Llama, Qwen2, Qwen3, Mistral) and shared-prefix prompts;
- ``ports``: a free port on 127.0.0.1.

Fixtures every folder uses (``tiny_model_dir``, ``model_tok``, ``one_thread``, ``vllm_tiny_dir``) are in
tests/conftest.py.
"""
