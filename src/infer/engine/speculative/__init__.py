"""Speculative decoding: proposals (n-grams of the request's own tokens, or a draft model)
and the verify steps that score them in one forward pass."""
