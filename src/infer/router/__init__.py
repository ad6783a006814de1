"""``infer router``: one OpenAI-compatible endpoint in front of several ``infer serve``
workers (on one host or many), each request sent to the worker that caches the longest
prefix of its prompt, balanced against load (``infer.routing``).

The router is a thin proxy: requests and answers pass through unchanged (streams chunk by
chunk), workers' health is polled, and workers are added or removed while it runs
(``/workers``). It tokenizes nothing: affinity is by the prompt's text.
"""
