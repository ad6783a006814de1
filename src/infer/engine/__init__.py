"""The engine: ``core/`` runs a step (schedule, launch, sample, collect, update),
``structured/`` constrains sampling to a grammar, ``speculative/`` proposes and verifies
tokens, ``setup/`` builds a rank (model, KV cache, CUDA graphs, tensor-parallel workers).
The ways to drive one sit here: ``llm.py`` (offline), ``loop.py`` (the one loop)."""
