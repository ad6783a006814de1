"""A fake OpenAI-style streaming server (plain asyncio, in a thread) for the HTTP client tests."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


@dataclass
class FakeServer:
    """Streams ``max_tokens`` tokens per completion, ``token_delay_s`` apart, as SSE chunks
    of ``tokens_per_chunk`` tokens (with ``token_ids`` in them when ``send_token_ids``; only
    the finishing chunk, without text, when ``text_only_at_end``), then a usage chunk and
    ``[DONE]``. ``status`` other than 200 answers every completion with that status and an
    OpenAI-style error body."""

    token_delay_s: float = 0.02
    tokens_per_chunk: int = 1
    send_token_ids: bool = False
    text_only_at_end: bool = False
    status: int = 200
    received: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    url: str = ""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        method, path, _ = (await reader.readline()).decode().split()
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, value = line.decode().split(":", 1)
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        if method == "GET" and path == "/v1/models":
            self._write(
                writer,
                200,
                "application/json",
                json.dumps({"object": "list", "data": [{"id": "fake-model"}]}),
            )
        elif method == "POST" and path == "/v1/completions":
            request = json.loads(body)
            self.received.append((time.perf_counter(), request))
            if self.status != 200:
                error = {"error": {"message": "max_tokens: too large", "type": "invalid_request"}}
                self._write(writer, self.status, "application/json", json.dumps(error))
            else:
                await self._stream(writer, request)
        else:
            self._write(writer, 404, "application/json", "{}")
        await writer.drain()
        writer.close()

    @staticmethod
    def _write(writer: asyncio.StreamWriter, status: int, kind: str, text: str) -> None:
        data = text.encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: {kind}\r\nContent-Length: "
            f"{len(data)}\r\nConnection: close\r\n\r\n".encode()
            + data
        )

    async def _stream(self, writer: asyncio.StreamWriter, request: dict[str, Any]) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )

        def event(payload: Any) -> None:
            data = f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"
            raw = data.encode()
            writer.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")

        total = request["max_tokens"]
        sent = 0
        while sent < total:
            await asyncio.sleep(self.token_delay_s)
            count = min(self.tokens_per_chunk, total - sent)
            sent += count
            if self.text_only_at_end and sent < total:
                continue
            choice: dict[str, Any] = {
                "index": 0,
                "text": "" if self.text_only_at_end else "x" * count,
                "finish_reason": "length" if sent == total else None,
            }
            if self.send_token_ids:
                choice["token_ids"] = list(range(count))
            event({"object": "text_completion", "choices": [choice]})
            await writer.drain()
        event(
            {
                "object": "text_completion",
                "choices": [],
                "usage": {"prompt_tokens": len(request["prompt"]), "completion_tokens": total},
            }
        )
        event("[DONE]")
        writer.write(b"0\r\n\r\n")


@pytest.fixture(autouse=True)
def scoreboard_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test writes its scoreboard entries to a file of its own, never the checkout's."""
    path = tmp_path / "scoreboard.json"
    monkeypatch.setenv("INFER_SCOREBOARD", str(path))
    return path


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    """A ``FakeServer`` listening on 127.0.0.1 (its ``url`` set), in its own thread's loop."""
    server = FakeServer()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    ready = threading.Event()

    async def serve() -> None:
        listener = await asyncio.start_server(server._handle, "127.0.0.1", 0)
        server.url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
        ready.set()
        async with listener:
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield server
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)
    loop.close()
