"""Structured outputs: each constrained request's grammar, compiled for the vocabulary,
and the token masks that keep its sampling inside it."""
