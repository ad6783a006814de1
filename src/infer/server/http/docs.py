"""``GET /docs`` (and ``/redoc``): the API reference, drawn from ``/openapi.json`` by a
page that loads nothing from elsewhere. FastAPI's own pages load Swagger UI and ReDoc from
a CDN, so they were blank on the offline machines this server is made for, and no installed
package ships those scripts."""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

PATHS = ("/docs", "/redoc")
# The page's own script and style only: a page that tried to load more would show it.
_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'"
)


@cache
def page() -> str:
    return (resources.files("infer.server.http") / "static" / "docs.html").read_text()


def install_docs(app: FastAPI) -> None:
    """Serve the page (behind ``--api-key`` like the rest, taking ``?api_key=``:
    ``guards/auth.py``); the app must be made with ``docs_url=None, redoc_url=None``."""

    async def docs() -> HTMLResponse:
        return HTMLResponse(page(), headers={"Content-Security-Policy": _POLICY})

    for path in PATHS:
        app.add_api_route(path, docs, methods=["GET"], include_in_schema=False)
