"""A stand-in for ``infer serve`` behind the router, in a process of its own (so that a test
can kill it): the OpenAI endpoints answer at once, or stream ``max_tokens`` events (one
every ``standin_delay_s`` seconds, each written in two pieces), and name the worker in the
``x-worker`` header. ``POST /standin/health {"ok": false}`` makes its ``/health`` fail.

``python standin_worker.py NAME`` prints ``READY <url>`` once it serves, and exits after
``LIFETIME_S`` whatever happens (a test that died leaves nothing running for long).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

LIFETIME_S = 300.0
MODEL = "standin"


def create_app(name: str) -> FastAPI:
    app = FastAPI()
    state = {"ok": True, "running": 0}
    headers = {"x-worker": name}

    @app.get("/health")
    async def health() -> Response:
        status = 200 if state["ok"] else 503
        return JSONResponse({"status": "ok" if state["ok"] else "sick"}, status_code=status)

    @app.post("/standin/health")
    async def set_health(raw: Request) -> dict[str, bool]:
        state["ok"] = bool((await raw.json())["ok"])
        return {"ok": state["ok"]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(
            f"infer_num_requests_running {state['running']}\n"
            "infer_num_requests_waiting 0\ninfer_kv_cache_usage_ratio 0.25\n"
        )

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = {"id": MODEL, "object": "model", "created": 0, "owned_by": "infer"}
        return JSONResponse({"object": "list", "data": [card]}, headers=headers)

    async def generate(raw: Request) -> Response:
        try:
            body: dict[str, Any] = json.loads(await raw.body())
        except (ValueError, RecursionError):
            return _error(400, "request body: malformed JSON")
        if not isinstance(body, dict):
            return _error(400, "request body: not an object")
        if body.get("model") != MODEL:
            return _error(404, f"The model `{body.get('model')}` does not exist")
        tokens = int(body.get("max_tokens", 3))
        delay = float(body.get("standin_delay_s", 0.0))
        kind = raw.url.path.rsplit("/", 1)[-1]
        if not body.get("stream"):
            state["running"] += 1
            try:  # as infer serve does, a client that leaves aborts its request
                await asyncio.wait_for(_client_left(raw), timeout=delay * tokens)
                return Response(status_code=499)
            except TimeoutError:
                pass
            finally:
                state["running"] -= 1
            answer = {"object": kind, "worker": name, "text": " tok" * tokens}
            return JSONResponse(answer, headers=headers)
        return StreamingResponse(
            _events(kind, tokens, delay, state),
            media_type="text/event-stream",
            headers=headers,
        )

    for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses"):
        app.add_api_route(path, generate, methods=["POST"])
    return app


async def _events(
    kind: str, tokens: int, delay: float, state: dict[str, Any]
) -> AsyncIterator[str]:
    state["running"] += 1
    try:
        for i in range(tokens):
            event = json.dumps({"object": kind, "index": i, "text": f" tök{i}"}, ensure_ascii=False)
            yield f"data: {event[:10]}"  # half an event: the router must pass on whole ones
            await asyncio.sleep(delay / 2)
            yield f"{event[10:]}\n\n"
            await asyncio.sleep(delay / 2)
        yield "data: [DONE]\n\n"
    finally:
        state["running"] -= 1


async def _client_left(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


def _error(status: int, message: str) -> JSONResponse:
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    }
    return JSONResponse(body, status_code=status)


def main() -> None:
    name = sys.argv[1]
    timer = threading.Timer(LIFETIME_S, lambda: os._exit(3))
    timer.daemon = True
    timer.start()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)  # connections wait until uvicorn accepts them
    config = uvicorn.Config(create_app(name), log_level="warning", timeout_keep_alive=30)
    server = uvicorn.Server(config)
    print(f"READY http://127.0.0.1:{listener.getsockname()[1]}", flush=True)
    server.run(sockets=[listener])


if __name__ == "__main__":
    main()
