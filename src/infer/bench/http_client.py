"""Serving benchmark client: streams ``/v1/completions`` over HTTP with a workload's arrivals.

Each request sends its prompt as token ids (``"prompt": [ids]``), ``max_tokens``,
``ignore_eos``, the temperature asked for (default 0: greedy) and ``stream: true``, and is
timed on the client: TTFT from just before the request is sent to the first streamed token,
ITL between tokens.

Token events: a chunk carries ``token_ids`` (vLLM's ``return_token_ids``, asked for), else
one token when it has text or no finish reason yet (vLLM streams a chunk per token, text or
not); a chunk that only says ``finish_reason`` carries none. ``usage`` in the last chunk
(``stream_options.include_usage``) has the true count: tokens the stream did not show one by
one (a server that skips chunks without new text, e.g. for a model without a tokenizer) are
counted as arriving with the last chunk, spread over the gap before it.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.synchronize import Barrier as BarrierType
from typing import Any

import httpx
from tqdm import tqdm

from infer.bench.metrics import RequestMetrics, RunResult, append_token_times
from infer.workloads import RequestSpec, Workload

WORKER_START_TIMEOUT_S = 300.0


async def served_model(client: httpx.AsyncClient, url: str) -> str:
    """The first model ``GET /v1/models`` lists (what ``--model`` defaults to)."""
    try:
        response = await client.get(f"{url}/v1/models")
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise ValueError(f"url: {url}/v1/models did not answer ({exc})") from exc
    models = response.json().get("data") or []
    if not models:
        raise ValueError(f"url: {url}/v1/models lists no model")
    return str(models[0]["id"])


def _chunk_tokens(chunk: dict[str, Any]) -> int:
    """Tokens one SSE chunk delivers."""
    choices = chunk.get("choices") or []
    if not choices:
        return 0
    choice = choices[0]
    if choice.get("token_ids") is not None:
        return len(choice["token_ids"])
    if choice.get("text") or choice.get("finish_reason") is None:
        return 1
    return 0


async def stream_completion(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    spec: RequestSpec,
    start: float,
    temperature: float = 0.0,
) -> RequestMetrics:
    """Send one streaming completion; time every token from the client's side."""
    body = {
        "model": model,
        "prompt": spec.prompt_token_ids,
        "max_tokens": spec.max_tokens,
        "temperature": temperature,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    sent = time.perf_counter()
    metrics = RequestMetrics(len(spec.prompt_token_ids), sent - start)
    times = metrics.token_times_s
    usage_tokens: int | None = None
    last_chunk: float | None = None
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                metrics.error = f"HTTP {response.status_code}: {response.text[:200]}"
                return metrics
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                now = time.perf_counter() - sent
                payload = line[len("data:") :].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    metrics.error = str(chunk["error"])[:200]
                    return metrics
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
                if chunk.get("choices"):
                    last_chunk = now
                    append_token_times(times, now, _chunk_tokens(chunk))
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        metrics.error = f"{type(exc).__name__}: {exc}"[:200]
        return metrics
    if usage_tokens is not None and last_chunk is not None and usage_tokens > len(times):
        missing = usage_tokens - len(times)
        if times and times[-1] == last_chunk:  # re-spread the last chunk's tokens with them
            times.pop()
            missing += 1
        append_token_times(times, last_chunk, missing)
    return metrics


async def run_serving(
    url: str,
    workload: Workload,
    model: str | None = None,
    warmup: Workload | None = None,
    progress: bool = True,
    timeout_s: float = 600.0,
    processes: int = 1,
    temperature: float = 0.0,
) -> tuple[str, RunResult]:
    """Send ``warmup`` (one at a time, unmeasured), then ``workload`` with its arrival pattern;
    returns the served model name and the client-side timings.

    ``processes > 1`` spreads a concurrent workload's requests over that many client
    processes (round robin, same arrival schedule): one Python event loop parses a few tens
    of thousands of SSE events a second, less than a fast server streams. ``temperature``:
    of every request (1.0: what ``vllm bench serve`` gets from a server's defaults).
    """
    url = url.rstrip("/")
    async with _client(timeout_s) as client:
        model = model or await served_model(client, url)
        for spec in warmup.requests if warmup else []:
            await stream_completion(client, url, model, spec, time.perf_counter(), temperature)
    if processes > 1 and not workload.sequential:
        return model, RunResult(
            await _send_in_processes(url, model, workload, timeout_s, processes, temperature)
        )
    with tqdm(
        total=len(workload.requests),
        desc=f"serve {workload.name}",
        unit="req",
        disable=not progress,
    ) as bar:
        if workload.sequential:
            async with _client(timeout_s) as client:
                start = time.perf_counter()
                requests = []
                for spec in workload.requests:
                    sent = stream_completion(client, url, model, spec, start, temperature)
                    requests.append(await sent)
                    bar.update(1)
        else:
            requests = await _send_all(
                url, model, workload.requests, None, timeout_s, temperature, bar.update
            )
    return model, RunResult(requests)


def _client(timeout_s: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s, connect=10.0))


async def _send_all(
    url: str,
    model: str,
    specs: list[RequestSpec],
    start: float | None,
    timeout_s: float,
    temperature: float,
    done: Callable[[int], object] | None = None,
) -> list[RequestMetrics]:
    """Send every request at ``start + arrival_s``, concurrently. ``start`` is on the
    system's monotonic clock, shared by all processes; None: now, once the client exists."""
    async with _client(timeout_s) as client:
        begin = time.perf_counter() if start is None else start

        async def send(spec: RequestSpec) -> RequestMetrics:
            await asyncio.sleep(max(0.0, begin + spec.arrival_s - time.perf_counter()))
            result = await stream_completion(client, url, model, spec, begin, temperature)
            if done is not None:
                done(1)
            return result

        return list(await asyncio.gather(*(send(s) for s in specs)))


def _worker_ready(ready: BarrierType) -> None:
    """A client process's initializer (unpickling it imported this module): wait for the
    others (``BrokenBarrierError`` fails the run if one never comes)."""
    ready.wait(timeout=WORKER_START_TIMEOUT_S)


def _send_part(
    url: str,
    model: str,
    specs: list[RequestSpec],
    start: float,
    timeout_s: float,
    temperature: float,
) -> list[RequestMetrics]:
    return asyncio.run(_send_all(url, model, specs, start, timeout_s, temperature))


async def _send_in_processes(
    url: str, model: str, workload: Workload, timeout_s: float, processes: int, temperature: float
) -> list[RequestMetrics]:
    parts = [workload.requests[i::processes] for i in range(processes)]
    loop = asyncio.get_running_loop()
    context = multiprocessing.get_context("spawn")
    # Every worker starts and imports this module before the clock starts: a worker still
    # importing would send its share of a burst late. The pool starts one worker per task
    # submitted while none is idle, and each waits in its initializer until all have come.
    ready = context.Barrier(processes)
    with ProcessPoolExecutor(
        processes, mp_context=context, initializer=_worker_ready, initargs=(ready,)
    ) as pool:
        await asyncio.gather(*(loop.run_in_executor(pool, time.sleep, 0) for _ in range(processes)))
        start = time.perf_counter() + 0.5
        results = await asyncio.gather(
            *(
                loop.run_in_executor(
                    pool, _send_part, url, model, part, start, timeout_s, temperature
                )
                for part in parts
            )
        )
    merged: list[RequestMetrics] = [None] * len(workload.requests)  # type: ignore[list-item]
    for i, part_results in enumerate(results):
        merged[i::processes] = part_results
    return merged
