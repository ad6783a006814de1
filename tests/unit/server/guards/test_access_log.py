"""The access log never shows a query string (the dashboard's ``?api_key=``)."""

from __future__ import annotations

import logging

from tests.unit.server.guards.conftest import LIMITS

from infer.server.guards.access_log import RedactQueries, redacted
from infer.server.guards.connections import ServerConfig


def test_query_strings_are_redacted() -> None:
    assert redacted("/dashboard?api_key=sk-secret&x=1") == "/dashboard?***"
    assert redacted("/v1/models") == "/v1/models"


def test_uvicorns_access_records_are_rewritten() -> None:
    record = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                               ("1.2.3.4:5", "GET", "/docs?api_key=sk-secret", "1.1", 200),
                               None)  # fmt: skip
    assert RedactQueries().filter(record)
    assert record.getMessage() == '1.2.3.4:5 - "GET /docs?*** HTTP/1.1" 200'


def test_the_server_installs_the_filter() -> None:
    logger = logging.getLogger("uvicorn.access")
    for existing in [f for f in logger.filters if isinstance(f, RedactQueries)]:
        logger.removeFilter(existing)
    ServerConfig(None, LIMITS, log_level="warning")
    assert any(isinstance(f, RedactQueries) for f in logger.filters)
