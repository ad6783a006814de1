"""What the API process and the engine process share, and nothing else: the sampling
parameters, the outputs and their logprobs, the pipe messages and their payloads, and the
errors both sides raise. It imports no torch, transformers or llguidance, so a server's API
process never loads the engine."""
