"""The access log without secrets: a request's query string is never written (a browser
page sends the API key as ``?api_key=``, ``auth.py``), only that there was one."""

from __future__ import annotations

import logging

ACCESS_LOGGER = "uvicorn.access"
REDACTED = "***"


def redacted(path: str) -> str:
    """``path`` with its query string replaced: ``/dashboard?***``."""
    path, mark, _ = path.partition("?")
    return f"{path}?{REDACTED}" if mark else path


class RedactQueries(logging.Filter):
    """Rewrites uvicorn's access records: ``(client, method, path, version, status)``."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            record.args = (*args[:2], redacted(args[2]), *args[3:])
        return True


def redact_access_log() -> None:
    """Install the filter on uvicorn's access logger (once)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, RedactQueries) for f in logger.filters):
        logger.addFilter(RedactQueries())
