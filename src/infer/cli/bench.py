"""``infer bench``: the benchmark harness.

- ``infer bench offline --model M --workload W [--engine E] [engine flags]``: runs
  workloads in-process through the ``infer`` engine and/or its peers on the same model and
  device (``hf``: Hugging Face transformers; ``vllm``: vLLM, imported only when asked for),
  writes one JSON result per (run, engine) and prints a table; a run is a workload with one
  of the ``--sampling`` settings (``infer.bench.sampling.run_names``). ``--engine
  infer,vllm`` (``both`` = ``infer,hf``) runs each engine in its own fresh process, one
  after the other, and shows the ratios.
- ``infer bench serve --url http://127.0.0.1:8000 --workload W``: streams the workload to a
  running server over HTTP and times it from the client.
- ``infer bench table FILE...``: the markdown table of saved results.

Workloads (``--workload a,b`` runs several): see ``infer.workloads``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import multiprocessing
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from infer.bench.metrics import RunResult
from infer.bench.sampling import BenchSampling, add_sampling_args, run_names, samplings_from_args
from infer.cli.engine_args import add_engine_args, engine_config_from_args
from infer.config import EngineConfig
from infer.workloads import WORKLOADS, Workload, make_workload, parse_workload_names

logger = logging.getLogger(__name__)

WARMUP_MAX_TOKENS = 16  # warm-up exercises every code path; its length does not matter
ENGINES = ("infer", "hf", "vllm")
ENGINE_ALIASES = {"both": ["infer", "hf"]}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks: offline, HTTP serving, tables")
    commands = parser.add_subparsers(dest="bench_command", required=True)

    offline = commands.add_parser(
        "offline", help="run workloads in-process: infer, transformers, or both side by side"
    )
    offline.add_argument(
        "--engine",
        default="infer",
        help="one or more (comma-separated) of: infer; hf = Hugging Face transformers on "
        "the same model and device (it uses only --model, --load-format, --device, --dtype); "
        "vllm = vLLM (it uses --model, --load-format, --dtype, --max-seq-len, "
        "--gpu-memory-utilization); both = infer,hf. Several: each in its own process, "
        "then the ratios (default: infer)",
    )
    _add_workload_args(offline)
    add_sampling_args(offline)
    add_engine_args(offline, exclude=frozenset({"seed"}))
    offline.set_defaults(handler=run_offline)

    serve = commands.add_parser("serve", help="stream workloads to a running server over HTTP")
    serve.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    serve.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="spread concurrent requests over this many client processes (a single Python "
        "client tops out at a few tens of thousands of streamed tokens a second)",
    )
    serve.add_argument(
        "--model", default=None, help="model name to request (default: the first of /v1/models)"
    )
    serve.add_argument(
        "--vocab-size",
        type=int,
        default=32000,
        help="prompt token ids are drawn below min(20000, this) (default: 32000)",
    )
    serve.add_argument(
        "--timeout", type=float, default=600.0, help="seconds one request may take (default: 600)"
    )
    serve.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="of every request (default: 0, greedy; 1.0 samples as vllm bench serve's "
        "requests do at a server's defaults)",
    )
    _add_workload_args(serve)
    serve.set_defaults(handler=run_serve)

    table = commands.add_parser("table", help="markdown table of saved result JSON files")
    table.add_argument("files", nargs="+", type=Path)
    table.add_argument("--output", type=Path, help="also write the table to this file")
    table.set_defaults(handler=run_table)


def _add_workload_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload",
        required=True,
        help="one or more (comma-separated) of: " + ", ".join(WORKLOADS),
    )
    parser.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="scale the workload to this many requests (default: its own)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="cap every request's output (quick runs; default: the workload's)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=2,
        help=f"unmeasured warm-up requests ({WARMUP_MAX_TOKENS} output tokens "
        "each) before the measured run (default: 2)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="workload seed (also the engine's weight/sampling seed; default: 0)",
    )
    parser.add_argument(
        "--output",
        default=None,
        help="result JSON path (default: benchmarks/results/<model>-<workload>-"
        "<date>-<engine>.json); with several results, the start of their names (less a "
        "trailing .json)",
    )
    parser.add_argument(
        "--plot", action="store_true", help="also draw latency CDFs and throughput over time (PNG)"
    )
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress bars"
    )


def _workloads(args: argparse.Namespace, vocab_size: int) -> list[tuple[Workload, Workload | None]]:
    """The measured workloads and their warm-ups (another seed, so they share no prompt or
    prefix with the measured requests; short outputs)."""
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ValueError(f"max_tokens: must be >= 1, got {args.max_tokens}")
    if args.warmup < 0:
        raise ValueError(f"warmup: must be >= 0, got {args.warmup}")
    pairs = []
    for name in parse_workload_names(args.workload):
        workload = make_workload(name, vocab_size, args.num_requests, args.seed)
        if args.max_tokens is not None:
            workload = workload.capped(args.max_tokens)
        warmup = None
        if args.warmup:
            warmup = make_workload(name, vocab_size, args.warmup, args.seed + 1)
            warmup = warmup.capped(WARMUP_MAX_TOKENS)
        pairs.append((workload, warmup))
    return pairs


# --- offline -------------------------------------------------------------------------------
def parse_engines(value: str) -> list[str]:
    """``"infer,vllm"`` → the engines, each checked (``both`` = infer and transformers)."""
    engines: list[str] = []
    for name in (v.strip() for v in value.split(",") if v.strip()):
        if name not in ENGINES and name not in ENGINE_ALIASES:
            choices = ", ".join([*ENGINES, *ENGINE_ALIASES])
            raise ValueError(f"engine: unknown {name!r}; choose from {choices}")
        engines += [e for e in ENGINE_ALIASES.get(name, [name]) if e not in engines]
    if not engines:
        raise ValueError("engine: give at least one name")
    return engines


def run_offline(args: argparse.Namespace) -> int:
    from infer.bench.results import output_paths, timestamp

    config = engine_config_from_args(args)  # validates the flags before anything runs
    samplings = samplings_from_args(args)
    names = run_names(parse_workload_names(args.workload), samplings)
    engines = parse_engines(args.engine)
    if "hf" in engines and not all(s.greedy for s in samplings):
        raise ValueError("engine: the hf peer decodes greedily; drop the sampling or hf")
    if "vllm" in engines:
        from infer.bench.vllm_peer import check_available

        check_available()
    json_paths, plot_paths = output_paths(args.output, config.model, names, engines, timestamp())
    values = {k: v for k, v in vars(args).items() if k != "handler"}
    failed = False
    if len(engines) > 1:
        context = multiprocessing.get_context("spawn")  # a fresh process (and GPU) per engine
        for engine in engines:
            child = context.Process(target=_engine_process, args=(values, engine, json_paths))
            child.start()
            child.join()
            if child.exitcode != 0:
                logger.error("the %s run failed (exit code %s)", engine, child.exitcode)
                failed = True
    else:
        failed = not _run_engine(values, engines[0], json_paths)
    _report(names, engines, json_paths, plot_paths if args.plot else None)
    return 1 if failed else 0


def _engine_process(values: dict[str, Any], engine: str, paths: dict[Any, Path]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(0 if _run_engine(values, engine, paths) else 1)


def _run_engine(values: dict[str, Any], engine: str, paths: dict[Any, Path]) -> bool:
    """Run every workload on one engine, writing each result; False if any run failed."""
    from infer.bench.metrics import summarize
    from infer.bench.offline import check_fits
    from infer.bench.results import environment, write_json
    from infer.bench.roofline import measure_ceilings, workload_roofline
    from infer.config import ModelConfig
    from infer.loader import resolve_model

    args = argparse.Namespace(**values)
    config = engine_config_from_args(args)
    model_config = ModelConfig.from_hf_dict(resolve_model(config.model).hf_config)
    pairs = _workloads(args, model_config.vocab_size)
    max_seq_len = config.resolved_max_seq_len(model_config)
    for workload, _ in pairs:
        check_fits(workload, max_seq_len)
    device = config.resolved_device
    ceilings = measure_ceilings(device) if engine == "infer" and device.type == "cuda" else None
    samplings = samplings_from_args(args)
    run, details, close = _engine_runner(engine, config, max_seq_len, args.progress)
    try:
        ok = True
        names = run_names([workload.name for workload, _ in pairs], samplings)
        runs = itertools.product(pairs, samplings)
        for name, ((workload, warmup), sampling) in zip(names, runs, strict=True):
            head: dict[str, Any] = {
                "engine": engine,
                "model": config.model,
                "workload": workload.name,
                "run": name,  # what the table pairs the engines' records by
                "description": workload.description,
                "sampling": sampling.as_dict(),
            }
            try:
                summary = summarize(run(workload, warmup, sampling), workload.groups)
            except Exception as exc:  # keep going: one failed run is itself a result
                logger.exception("%s %s failed", engine, name)
                summary = {
                    "num_requests": len(workload.requests),
                    "num_failed": len(workload.requests),
                    "errors": [f"{type(exc).__name__}: {exc}"[:300]],
                    "output_tok_s": 0.0,
                }
                ok = False
            record = {
                **head,
                **summary,
                **environment(),
                "seed": args.seed,
                "max_tokens_cap": args.max_tokens,
                "warmup_requests": args.warmup,
                "engine_config": details,
            }
            if engine == "infer":
                record["roofline"] = workload_roofline(
                    model_config, workload, ceilings, config.torch_dtype.itemsize
                )
            path = write_json(record, paths[name, engine])
            _print_done(engine, name, summary, path)
            if summary["num_failed"] == 0 and _is_headline(args, device.type):
                ranks = (
                    f"-tp{config.tensor_parallel_size}" if config.tensor_parallel_size > 1 else ""
                ) + _precision_suffix(config)
                # Keyed by the label, not the run's name: of a label given twice, the later
                # run is kept (like every run after a workload's first, it finds the prefix
                # cache warm, so it compares with the other labels' runs).
                label = "" if sampling.greedy else f"/{sampling.label}"
                model = _model_name(config.model)
                prefix = f"offline/{model}/{workload.name}{label}/{engine}{ranks}"
                _record_score(prefix, summary, sampling)
    finally:
        close()
    return ok


def _is_headline(args: argparse.Namespace, device_type: str) -> bool:
    """Only GPU runs of workloads as defined (not scaled, capped or reseeded) are headline
    figures (``infer.bench.scoreboard``)."""
    defined = args.num_requests is None and args.max_tokens is None and args.seed == 0
    return defined and device_type == "cuda"


def _precision_suffix(config: EngineConfig) -> str:
    """``-fp8`` for FP8 weights, ``-kvfp8`` for an FP8 cache: their figures go under names
    of their own, beside (not over) the model dtype's."""
    weights = f"-{config.quantization}" if config.quantization else ""
    cache = f"-kv{config.kv_cache_dtype}" if config.kv_cache_dtype != "auto" else ""
    return weights + cache


def _model_name(model: str) -> str:
    """A preset's name, or a checkpoint's folder / file name (not the machine's path)."""
    return Path(model).name if "/" in model and Path(model).exists() else model


def _record_score(prefix: str, summary: dict[str, Any], sampling: BenchSampling) -> None:
    from infer.bench.scoreboard import summary_values, update_many

    values = summary_values(prefix, summary)
    update_many(values, sampling=sampling.label)
    print(f"scoreboard: {len(values)} figures under {prefix}/", flush=True)


def _engine_runner(
    engine: str, config: EngineConfig, max_seq_len: int, progress: bool
) -> tuple[
    Callable[[Workload, Workload | None, BenchSampling], RunResult],
    dict[str, Any],
    Callable[[], None],
]:
    """``run(workload, warmup)`` for one engine (loaded once), its settings to record, and
    what stops it (infer's tensor-parallel workers, before the interpreter exits)."""
    if engine == "infer":
        from infer.bench.offline import run_infer
        from infer.engine.llm import LLM

        options = {name: getattr(config, name) for name in EngineConfig.field_names()}
        del options["model"]
        llm = LLM(config.model, **options)
        spec = config.speculative_config
        details = {
            **options,
            "speculative_config": None if spec is None else asdict(spec),
            "device": str(llm.engine.device),
            "dtype": str(llm.engine.dtype),
            "num_blocks": llm.engine.pool.num_blocks,
            "max_seq_len": llm.engine.max_seq_len,
            "cuda_graphs": config.cuda_graphs_enabled,
        }
        return (
            (lambda w, warm, sampling: run_infer(llm.engine, w, warm, progress, sampling)),
            details,
            llm.engine.close,
        )

    if engine == "vllm":
        from infer.bench.vllm_peer import build_vllm, run_vllm

        llm, details = build_vllm(config, max_seq_len)
        return (
            (lambda w, warm, sampling: run_vllm(llm, w, warm, progress, sampling)),
            details,
            _nothing,
        )

    from infer.bench.hf_peer import build_hf_model, run_hf

    model = build_hf_model(
        config.model, config.load_format, config.resolved_device, config.torch_dtype, config.seed
    )
    details = {
        "device": str(model.device),
        "dtype": str(model.dtype),
        "load_format": config.load_format,
    }
    return (lambda w, warm, _sampling: run_hf(model, w, warm, progress)), details, _nothing


def _nothing() -> None:
    """The peers hold no processes of their own to stop."""


def _report(
    names: list[str],
    engines: list[str],
    json_paths: dict[tuple[str, str], Path],
    plot_paths: dict[str, Path] | None,
) -> None:
    from infer.bench.results import read_json

    records = []
    for name in names:
        group = [read_json(json_paths[name, e]) for e in engines if json_paths[name, e].exists()]
        if plot_paths is not None and group:
            from infer.bench.plots import plot_results

            print(f"plot → {plot_results(group, plot_paths[name])}")
        records += group
    if records:
        print("\n" + _tables(records))


# --- serve ---------------------------------------------------------------------------------
def run_serve(args: argparse.Namespace) -> int:
    from infer.bench.http_client import run_serving
    from infer.bench.metrics import summarize
    from infer.bench.results import environment, output_paths, timestamp, write_json

    if args.temperature < 0:
        raise ValueError(f"temperature: must be >= 0, got {args.temperature}")
    pairs = _workloads(args, args.vocab_size)
    names = [w.name for w, _ in pairs]
    model = args.model
    json_paths: dict[tuple[str, str], Path] = {}
    plot_paths: dict[str, Path] = {}
    date = timestamp()
    failed = False
    for workload, warmup in pairs:
        model, result = asyncio.run(
            run_serving(
                args.url,
                workload,
                model,
                warmup,
                args.progress,
                args.timeout,
                args.client_processes,
                args.temperature,
            )
        )
        paths, plots = output_paths(args.output, model, names, ["server"], date)
        json_paths.update(paths)
        plot_paths.update(plots)
        summary = summarize(result, workload.groups)
        failed = failed or summary["num_failed"] > 0
        record = {
            "engine": "server",
            "model": model,
            "workload": workload.name,
            "description": workload.description,
            "url": args.url,
            **summary,
            **environment(),
            "seed": args.seed,
            "max_tokens_cap": args.max_tokens,
            "warmup_requests": args.warmup,
            "temperature": args.temperature,
        }
        path = write_json(record, json_paths[workload.name, "server"])
        _print_done("server", workload.name, summary, path)
    _report(names, ["server"], json_paths, plot_paths if args.plot else None)
    return 1 if failed else 0


def _print_done(engine: str, run: str, summary: dict[str, Any], path: Path) -> None:
    """One run's numbers as they come (the table at the end has the main ones)."""
    parts = [f"{summary['output_tok_s']:,.1f} output tok/s"]
    if "requests_per_s" in summary:
        parts.append(f"{summary['requests_per_s']:,.2f} req/s")
    for key, label in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
        stats = summary.get(key) or {}
        if stats.get("p50") is not None:
            values = "/".join(f"{stats[p]:,.1f}" for p in ("p50", "p90", "p99"))
            parts.append(f"{label} p50/p90/p99 {values} ms")
    for group, stats in summary.get("groups", {}).items():
        itl, ttft = stats["itl_ms"], stats["ttft_ms"]
        if itl.get("p99") is not None:
            parts.append(f"{group}: ITL p99 {itl['p99']:,.1f} ms, TTFT p50 {ttft['p50']:,.1f} ms")
    if "peak_kv_utilization" in summary:
        parts.append(f"peak KV {summary['peak_kv_utilization']:.0%}")
    if "preemptions" in summary:
        parts.append(f"{summary['preemptions']} preemptions")
    if "speculation" in summary:
        spec = summary["speculation"]
        parts.append(
            f"speculation: {spec['acceptance_rate']:.0%} of proposals accepted, "
            f"{spec['mean_accepted_length']:.2f} tokens a verification"
        )
    if "generate_output_tok_s" in summary:
        parts.append(
            f"same burst through LLM.generate {summary['generate_output_tok_s']:,.1f} tok/s"
        )
    if summary["num_failed"]:
        parts.append(f"{summary['num_failed']} failed: {summary['errors']}")
    print(f"{engine} {run}: {', '.join(parts)} → {path}", flush=True)


# --- table ---------------------------------------------------------------------------------
def _tables(records: list[dict[str, Any]]) -> str:
    """Results table, then the roofline behind it (when the records carry one)."""
    from infer.bench.table import format_ceilings, format_roofline, format_table

    parts = [format_table(records)]
    roofline = format_roofline(records)
    if roofline:
        parts.append("Roofline:\n\n" + roofline)
    ceilings = format_ceilings(records)
    if ceilings:
        parts.append("Measured ceilings:\n" + ceilings)
    return "\n\n".join(parts)


def run_table(args: argparse.Namespace) -> int:
    from infer.bench.results import read_json

    text = _tables([read_json(path) for path in args.files])
    print(text)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
    return 0
