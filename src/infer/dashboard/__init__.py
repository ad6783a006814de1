"""The dashboard: one static page (``static/``, no build step) that draws the engine's KV
pool block by block, its queues and its steps, live from ``infer serve``'s ``/dashboard``
or replayed from ``infer kvsim --html``."""
