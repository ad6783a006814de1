"""``vllm bench serve`` as the one load generator for both servers: its workloads, its command
line, and its result JSON (vLLM 0.26's field names) read into one comparison table.

One client process (vLLM's, asyncio + aiohttp) sends text prompts from its ``random`` dataset
(the same seed, so the same prompts, for both servers), streams every response and times it.
Its JSON holds summary fields (``output_throughput``, ``median_ttft_ms``, ``p99_itl_ms``, ...)
and, with ``--save-detailed``, every request's ``ttfts`` and ``itls`` (seconds).

The chat client starts the clock at the first SSE chunk with ``choices``. vLLM sends the
assistant-role chunk together with the first token; ``infer serve`` sends it at once, before
the prompt is even prefilled, so vLLM's own TTFT for infer would be the time to that empty
chunk. The table therefore reads the detailed lists and, for chat, counts TTFT to the chunk
after the role chunk (the first token on both servers) and leaves that first gap out of ITL.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infer.bench.metrics import percentiles

SERVERS = ("infer", "vllm")


@dataclass(frozen=True)
class ServingWorkload:
    """One ``vllm bench serve`` run: endpoint, random-dataset lengths and arrival rate."""

    name: str
    description: str
    backend: str  # --backend: vllm = /v1/completions, openai-chat = /v1/chat/completions
    endpoint: str
    num_prompts: int
    input_len: int
    output_len: int
    range_ratio: str  # --random-range-ratio: lengths uniform in [len * (1 - r), len * (1 + r)]
    request_rate: str  # --request-rate: inf = all at once, else Poisson at this rate

    @property
    def skips_role_chunk(self) -> bool:
        """Chat streams open with a chunk that carries the role and no token."""
        return self.backend == "openai-chat"


SERVING_WORKLOADS = {
    w.name: w
    for w in (
        ServingWorkload(
            "completions",
            "256 prompts at once, input 128-384 and output 128-384 tokens, /v1/completions",
            "vllm",
            "/v1/completions",
            256,
            256,
            256,
            "0.5",
            "inf",
        ),
        ServingWorkload(
            "chat",
            "256 prompts at once, input 128-384 (+ chat template) and output 128-384 tokens, "
            "/v1/chat/completions",
            "openai-chat",
            "/v1/chat/completions",
            256,
            256,
            256,
            "0.5",
            "inf",
        ),
        ServingWorkload(
            "burst256",
            "256 prompts at once, input 128-384 and output 256 tokens (offline burst256's "
            "shape), /v1/completions",
            "vllm",
            "/v1/completions",
            256,
            256,
            256,
            json.dumps({"input": 0.5, "output": 0.0}),
            "inf",
        ),
        ServingWorkload(
            "poisson",
            "64 prompts, Poisson arrivals at 6 req/s, input 1024-2048 and output 64-256 tokens, "
            "/v1/completions",
            "vllm",
            "/v1/completions",
            64,
            1536,
            160,
            json.dumps({"input": 1 / 3, "output": 0.6}),
            "6",
        ),
    )
}


# What each run sends about sampling: the client's defaults (vLLM's client sends no
# ``temperature``, so each server samples at its default, 1.0: what users of the client get)
# or greedy.
SAMPLINGS = {"defaults": [], "greedy": ["--temperature", "0"]}
SAMPLING_DESCRIPTIONS = {
    "defaults": "vllm bench serve's defaults: no temperature sent (each server's 1.0)",
    "greedy": "greedy (temperature 0)",
}


def parse_samplings(value: str) -> list[str]:
    """``"defaults,greedy"`` → the names, each checked."""
    return _checked_names(value, SAMPLINGS, "samplings")


def parse_serving_workloads(value: str) -> list[ServingWorkload]:
    """``"completions,chat"`` → the workloads, each checked."""
    return [SERVING_WORKLOADS[n] for n in _checked_names(value, SERVING_WORKLOADS, "workloads")]


def _checked_names(value: str, known: Mapping[str, object], field: str) -> list[str]:
    """A comma-separated list of names of ``known``; ``ValueError`` naming ``field``."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"{field}: unknown {unknown or value!r}; choose from {', '.join(known)}")
    return names


def client_command(
    python: str,
    workload: ServingWorkload,
    base_url: str,
    model_dir: str,
    served_model_name: str,
    result_path: Path,
    warmups: int = 2,
    seed: int = 0,
    sampling: str = "defaults",
) -> list[str]:
    """``vllm bench serve`` for ``workload`` against ``base_url``: ``sampling`` (a name of
    ``SAMPLINGS``), EOS ignored, TTFT / TPOT / ITL / E2E at the 50th, 90th and 99th
    percentiles, detailed JSON to ``result_path``."""
    return [
        python,
        "-m",
        "vllm.entrypoints.cli.main",
        "bench",
        "serve",
        "--backend",
        workload.backend,
        "--endpoint",
        workload.endpoint,
        "--base-url",
        base_url,
        "--model",
        model_dir,
        "--served-model-name",
        served_model_name,
        "--tokenizer",
        model_dir,
        "--dataset-name",
        "random",
        "--num-prompts",
        str(workload.num_prompts),
        "--random-input-len",
        str(workload.input_len),
        "--random-output-len",
        str(workload.output_len),
        "--random-range-ratio",
        workload.range_ratio,
        "--request-rate",
        workload.request_rate,
        "--ignore-eos",
        *SAMPLINGS[sampling],
        "--seed",
        str(seed),
        "--num-warmups",
        str(warmups),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result_path.parent),
        "--result-filename",
        result_path.name,
    ]


def summarize_bench(
    result: dict[str, Any], workload: ServingWorkload, server: str, sampling: str
) -> dict[str, Any]:
    """One table row from a ``vllm bench serve`` result: output tok/s (the client's
    ``output_throughput``), TTFT, ITL and TPOT percentiles in ms (``{p50, p90, p99, mean}``)."""
    errors = result.get("errors") or []  # tracebacks: their last line says what happened
    row: dict[str, Any] = {
        "server": server,
        "workload": workload.name,
        "sampling": sampling,
        "model": result.get("model_id"),
        "num_prompts": result.get("num_prompts"),
        "completed": result.get("completed", 0),
        "failed": result.get("failed", 0),
        "duration_s": result.get("duration"),
        "output_tok_s": float(result.get("output_throughput") or 0.0),
        "total_output_tokens": result.get("total_output_tokens"),
        "errors": sorted({e.strip().splitlines()[-1] for e in errors if e.strip()})[:3],
    }
    if "ttfts" in result:
        row.update(_from_detail(result, workload.skips_role_chunk))
        row["ttft_to"] = "first token" if workload.skips_role_chunk else "first chunk"
    else:  # saved without --save-detailed: vLLM's own figures
        for metric in ("ttft", "tpot", "itl"):
            row[f"{metric}_ms"] = {
                key: result.get(f"{prefix}_{metric}_ms")
                for key, prefix in (("p50", "median"), ("p90", "p90"), ("p99", "p99"))
            } | {"mean": result.get(f"mean_{metric}_ms")}
        row["ttft_to"] = "role chunk" if workload.skips_role_chunk else "first chunk"
    return row


def _from_detail(result: dict[str, Any], skip_role_chunk: bool) -> dict[str, Any]:
    """TTFT, ITL and TPOT recomputed from the per-request lists, as vLLM computes them (TPOT
    = (last chunk - first token) / (output tokens - 1), per request), of requests that
    produced tokens."""
    ttfts, itls, tpots = [], [], []
    errors = result.get("errors") or [""] * len(result["ttfts"])
    for ttft, gaps, tokens, error in zip(
        result["ttfts"], result["itls"], result["output_lens"], errors, strict=True
    ):
        if error or not tokens:
            continue
        gaps = list(gaps)
        e2e = ttft + sum(gaps)
        if skip_role_chunk and gaps:
            ttft += gaps.pop(0)
        ttfts.append(ttft)
        itls.extend(gaps)
        if tokens > 1:
            tpots.append((e2e - ttft) / (tokens - 1))
    return {
        "ttft_ms": percentiles(ttfts, 1e3),
        "itl_ms": percentiles(itls, 1e3),
        "tpot_ms": percentiles(tpots, 1e3),
    }


def read_bench(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or "output_throughput" not in data:
        raise ValueError(f"{path}: not a vllm bench serve result (no output_throughput)")
    return data


def _ms(stats: dict[str, Any], key: str) -> str:
    value = stats.get(key)
    return "-" if value is None else f"{value:,.1f}"


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The repeat with the median output throughput (the lower middle of an even count),
    carrying every repeat's throughput as ``repeats_output_tok_s``."""
    ordered = sorted(runs, key=lambda row: row["output_tok_s"])
    return {
        **ordered[(len(ordered) - 1) // 2],
        "repeats_output_tok_s": [row["output_tok_s"] for row in runs],
    }


def _throughput(row: dict[str, Any]) -> str:
    repeats = row.get("repeats_output_tok_s", [])
    if len(repeats) < 2:
        return f"{row['output_tok_s']:,.1f}"
    return f"{row['output_tok_s']:,.1f} ({min(repeats):,.0f}-{max(repeats):,.0f})"


def format_comparison(rows: list[dict[str, Any]]) -> str:
    """Markdown: per workload, each server's figures (of its median repeat, with the range
    of all repeats' throughput); infer's row carries infer ÷ vLLM for output tok/s (> 1:
    infer is faster) and vLLM ÷ infer for the latencies (> 1: infer's are lower)."""
    lines = [
        "| workload | sampling | server | output tok/s | TTFT p50 / p99 ms "
        "| ITL p50 / p90 / p99 ms | TPOT p50 ms | ok | tok/s infer ÷ vLLM "
        "| TTFT p50 / TPOT p50 vLLM ÷ infer |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_run: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_run.setdefault((row["workload"], row["sampling"]), {})[row["server"]] = row
    for (workload, sampling), servers in by_run.items():
        for server in sorted(servers, key=lambda s: SERVERS.index(s) if s in SERVERS else 9):
            row = servers[server]
            peer = servers.get("vllm") if server == "infer" else None
            ttft, itl, tpot = row["ttft_ms"], row["itl_ms"], row["tpot_ms"]
            cells = [
                workload,
                sampling,
                server,
                _throughput(row),
                f"{_ms(ttft, 'p50')} / {_ms(ttft, 'p99')}",
                f"{_ms(itl, 'p50')} / {_ms(itl, 'p90')} / {_ms(itl, 'p99')}",
                _ms(tpot, "p50"),
                f"{row['completed']}/{row['num_prompts']}",
                *_ratios(row, peer),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratios(row: dict[str, Any], peer: dict[str, Any] | None) -> list[str]:
    if peer is None:
        return ["-", "-"]
    speed = f"{row['output_tok_s'] / peer['output_tok_s']:.2f}x" if peer["output_tok_s"] else "-"
    latency = [
        f"{peer[key]['p50'] / row[key]['p50']:.2f}x"
        if row[key].get("p50") and peer[key].get("p50") is not None
        else "-"
        for key in ("ttft_ms", "tpot_ms")
    ]
    return [speed, " / ".join(latency)]


def format_startup(startups: list[dict[str, Any]]) -> str:
    """Markdown: each server's start-up to ready and what its log says about it."""
    from infer.bench.startup import describe_markers

    lines = ["| server | ready after s | from its log |", "|---|---:|---|"]
    for entry in startups:
        ready = "failed" if entry.get("ready_s") is None else f"{entry['ready_s']:.1f}"
        lines.append(f"| {entry['server']} | {ready} | {describe_markers(entry['markers'])} |")
    return "\n".join(lines)


def scoreboard_values(
    model: str, rows: list[dict[str, Any]], startups: list[dict[str, Any]], sampling: str
) -> dict[str, tuple[float, str]]:
    """The headline figures of a comparison, named
    ``serving/<model>/<workload>/<sampling>/<server>/...`` (and ``.../infer_vs_vllm`` for the
    throughput ratio, ``serving/<model>/<server>/startup_s``) of the rows of one ``sampling``."""
    values: dict[str, tuple[float, str]] = {}
    throughput: dict[tuple[str, str], float] = {}
    for row in rows:
        if row["failed"] or not row["completed"] or row["sampling"] != sampling:
            continue
        run = f"{row['workload']}/{row['sampling']}"
        prefix = f"serving/{model}/{run}/{row['server']}"
        values[f"{prefix}/output_tok_s"] = (row["output_tok_s"], "tok/s")
        throughput[run, row["server"]] = row["output_tok_s"]
        for metric, stats in (("ttft", ("p50", "p99")), ("itl", ("p50", "p90", "p99"))):
            for stat in stats:
                value = row[f"{metric}_ms"].get(stat)
                if value is not None:
                    values[f"{prefix}/{metric}_{stat}_ms"] = (float(value), "ms")
        if row["tpot_ms"].get("p50") is not None:
            values[f"{prefix}/tpot_p50_ms"] = (float(row["tpot_ms"]["p50"]), "ms")
    for run in {r for r, _ in throughput}:
        infer, vllm = throughput.get((run, "infer")), throughput.get((run, "vllm"))
        if infer and vllm:
            values[f"serving/{model}/{run}/infer_vs_vllm"] = (infer / vllm, "x")
    for entry in startups:
        if entry.get("ready_s") is not None:
            values[f"serving/{model}/{entry['server']}/startup_s"] = (entry["ready_s"], "s")
    return values
