"""Errors as clients see them: an unexpected exception is a generic 500 (its text stays in
the log), and a 405 says which methods the route allows."""

from __future__ import annotations

import logging

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from infer.server.http.errors import install_error_handlers


def test_an_unexpected_exception_is_a_500_without_its_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/boom")
    async def boom() -> None:
        raise RuntimeError("index 1000000000 is out of bounds for dimension 1 with size 49152")

    with caplog.at_level(logging.ERROR), TestClient(app, raise_server_exceptions=False) as client:
        response = client.post("/boom")
        assert response.status_code == 500
        error = response.json()["error"]
        assert error["type"] == "server_error" and "49152" not in response.text
        assert "out of bounds" in caplog.text  # the details are in the log
        not_allowed = client.get("/boom")
        assert not_allowed.status_code == 405 and not_allowed.headers["Allow"] == "POST"


@pytest.mark.parametrize(
    ("method", "path", "says"),
    [
        ("POST", "/v1/embeddings", "embeddings are not served by this model"),
        ("GET", "/v1/nothing", "no such route"),
    ],
)
def test_an_unknown_route_is_an_openai_error_naming_it(method: str, path: str, says: str) -> None:
    app = FastAPI()
    install_error_handlers(app)
    with TestClient(app) as client:
        response = client.request(method, path, json={"input": "hi"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["message"].startswith(f"Invalid URL ({method} {path}): ")
    assert says in error["message"] and error["type"] == "not_found_error"
