"""The FastAPI app and its endpoints: a request's way in (validation, tokenization, the
engine client) and out (JSON or server-sent events)."""
