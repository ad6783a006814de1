"""``infer kvsim``: the KV-cache simulator and capacity planner (Lab 0.3's experiments).

``infer kvsim --model M --memory 16GiB --workload W`` replays a request trace against every
allocation strategy side by side, on the engine's own scheduler and allocator;
``infer kvsim --explain-cache --prompt 128 --generate 100`` counts K/V computations with and
without a cache; ``infer kvsim plan --model M --gpu-memory 40GiB --avg-tokens 300 ...``
answers "how many users fit" by arithmetic.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from infer.config import EngineConfig
from infer.kvsim.footprint import KVFootprint, load_footprint
from infer.kvsim.html import Replay, write_html
from infer.kvsim.lab import explain_cache, explanation_to_json, format_explanation
from infer.kvsim.planner import format_plan, format_sweep, plan_capacity, plans_to_json
from infer.kvsim.report import format_table, plot, to_json
from infer.kvsim.simulator import DEFAULT_STEP_S, simulate
from infer.kvsim.strategies import STRATEGIES, parse_strategies
from infer.kvsim.trace import describe_workloads, make_trace
from infer.kvsim.units import format_bytes, parse_memory

# Compute limits are off unless asked for: the simulator answers memory questions.
UNLIMITED = 2**62
DEFAULT_MAX_SEQ_LEN = 2048

_EPILOG = f"""\
strategies (--strategies, all by default):
{chr(10).join(f"  {name:<13} {text}" for name, text in STRATEGIES.items())}

workloads (--workload; [default number of requests]):
{chr(10).join(f"  {name:<20} {text}" for name, text in describe_workloads().items())}
  or a JSONL trace file with one {{"arrival_s", "prompt_tokens", "output_tokens"
  [, "prefix_id"[, "prefix_tokens"]]}} object per line.
  --model lab is Lab 0.3's model: 32 KV heads x 128 dim, one layer, no weights (16 KiB/token).

measurements: utilisation = allocated / pool blocks after each engine step (mean over
  steps, peak); internal fragmentation = empty token slots inside allocated blocks
  (memory-weighted over steps); external fragmentation = share of the pool free while an
  allocation needing no more than that was refused (mean over steps); refused = never
  served (prompt >= max_seq_len, queue full, larger than the cache); delayed = not admitted
  on arrival, or preempted and recomputed. The engine's scheduler decides every step
  (admission reserve, preemption of the newest request, chunked prefill).

capacity planner: infer kvsim plan --help
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "kvsim",
        help="KV-cache simulator and capacity planner",
        description=__doc__,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        help="lab, a built-in name (llama-3.2-3b, gemma-3-1b, ...), "
        ".gguf file, HF directory or Hub id; only its config is read",
    )
    parser.add_argument("--memory", help="KV cache memory, e.g. 16GiB, 40GB, 512MiB")
    parser.add_argument("--workload", help="built-in workload name or JSONL trace path")
    parser.add_argument(
        "--block-size",
        type=int,
        default=EngineConfig.block_size,
        help="tokens per block (default: %(default)s)",
    )
    parser.add_argument(
        "--max-seq-len",
        type=int,
        default=DEFAULT_MAX_SEQ_LEN,
        help="longest sequence; the naive slot size (default: %(default)s)",
    )
    parser.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help="comma-separated subset of the strategies below",
    )
    parser.add_argument(
        "--num-requests",
        type=int,
        help="requests of a built-in workload "
        "(default: the workload's own count); first N of a trace file",
    )
    parser.add_argument("--seed", type=int, default=0, help="workload generator seed")
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        help="K/V (and weight) dtype: float32 | float16 | bfloat16 (default: %(default)s)",
    )
    parser.add_argument(
        "--window",
        type=int,
        help="paged+window's window in tokens (default: "
        "the model's sliding window, else the lab's 4 blocks on every layer)",
    )
    parser.add_argument(
        "--step-ms",
        type=float,
        default=DEFAULT_STEP_S * 1000,
        help="simulated duration of one engine step (default: %(default)s)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print a JSON array, one object per strategy"
    )
    parser.add_argument(
        "--plot",
        nargs="?",
        const=".",
        metavar="DIR",
        help="write kvsim_memory.png and kvsim_concurrency.png to DIR "
        "(default: the current directory)",
    )
    parser.add_argument(
        "--html",
        metavar="FILE",
        help="write the dashboard's view of the run to FILE: every strategy's KV pool block "
        "by block, its requests and steps, replayable side by side",
    )
    limits = parser.add_argument_group("scheduler limits (the engine's flags; off by default)")
    limits.add_argument("--max-batch-size", type=int, help="running sequences at most")
    limits.add_argument("--max-num-batched-tokens", type=int, help="tokens per step at most")
    limits.add_argument("--max-waiting-requests", type=int, help="queue length at most")
    limits.add_argument(
        "--admission-reserve",
        type=float,
        default=EngineConfig.admission_reserve,
        help="free cache kept for running requests' growth (default: %(default)s, the engine's)",
    )
    limits.add_argument(
        "--chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=EngineConfig.use_chunked_prefill,
    )
    limits.add_argument("--prefill-chunk-size", type=int, default=EngineConfig.prefill_chunk_size)
    lab = parser.add_argument_group("Lab 0.3, chapter 1")
    lab.add_argument(
        "--explain-cache",
        action="store_true",
        help="count K/V computations with and without a cache, then exit",
    )
    lab.add_argument("--prompt", type=int, default=128, help="prompt tokens (default: 128)")
    lab.add_argument("--generate", type=int, default=100, help="generated tokens (default: 100)")
    parser.set_defaults(handler=run)
    _add_plan_parser(parser.add_subparsers(dest="kvsim_command", metavar="{plan}"))


def _add_plan_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="capacity planner: sequences that fit, naive vs paged",
        description="How many sequences fit in a GPU, naive (max_seq_len reserved per "
        "sequence) versus paged (tokens rounded up to blocks), after the weights. Several "
        "--avg-tokens values print Phase 6's capacity table instead.",
    )
    parser.add_argument("--model", required=True, help="as for infer kvsim (lab: no weights)")
    parser.add_argument("--gpu-memory", required=True, help="GPU memory, e.g. 40GiB, 80GB")
    parser.add_argument(
        "--avg-tokens",
        required=True,
        help="average tokens per sequence (prompt + output); comma-separated values print a table",
    )
    parser.add_argument("--peak-tokens", type=int, help="longest sequence (default: max_seq_len)")
    parser.add_argument("--users", type=int, default=1, help="concurrent users to serve")
    parser.add_argument("--block-size", type=int, default=EngineConfig.block_size)
    parser.add_argument(
        "--max-seq-len",
        type=int,
        default=DEFAULT_MAX_SEQ_LEN,
        help="naive reservation per sequence (default: %(default)s)",
    )
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="auto (--dtype) | fp8 (one byte per cached element)",
    )
    parser.add_argument(
        "--quantization",
        default=None,
        help="fp8: decoder projections' weights at one byte each (default: --dtype)",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=1.0,
        help="share of GPU memory usable (default: all of it, as the lab)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=run_plan)


def run(args: argparse.Namespace) -> int:
    if args.explain_cache:
        explanation = explain_cache(args.prompt, args.generate)
        print(explanation_to_json(explanation) if args.json else format_explanation(explanation))
        return 0
    for flag in ("model", "memory", "workload"):
        if getattr(args, flag) is None:
            raise ValueError(f"{flag}: --{flag} is required (or use --explain-cache, or plan)")
    footprint = load_footprint(args.model, args.dtype)
    memory = parse_memory(args.memory, "memory")
    strategies = parse_strategies(args.strategies)
    trace = make_trace(args.workload, args.num_requests, args.seed)
    config = EngineConfig(
        model=args.model,
        block_size=args.block_size,
        max_seq_len=args.max_seq_len,
        max_batch_size=args.max_batch_size or UNLIMITED,
        max_num_batched_tokens=args.max_num_batched_tokens or UNLIMITED,
        max_waiting_requests=args.max_waiting_requests or UNLIMITED,
        admission_reserve=args.admission_reserve,
        use_chunked_prefill=args.chunked_prefill,
        prefill_chunk_size=args.prefill_chunk_size,
        use_prefix_caching=False,
    )
    replays = {name: Replay(name) for name in strategies} if args.html else {}
    results = [
        simulate(
            trace,
            name,
            footprint,
            memory,
            config,
            window=args.window,
            step_s=args.step_ms / 1000,
            progress=True,
            replay=replays.get(name),
        )
        for name in strategies
    ]
    title = f"{args.workload} on {footprint.name}, {format_bytes(memory)} of KV cache"
    if args.json:
        print(to_json(results))
    else:
        print(_header(footprint, memory, args, len(trace.requests), strategies))
        print(format_table(results))
    written = plot(results, Path(args.plot), title) if args.plot is not None else []
    if args.html:
        write_html(Path(args.html), f"kvsim: {title}", list(replays.values()))
        written.append(Path(args.html))
    for path in written:
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _header(
    f: KVFootprint, memory: int, args: argparse.Namespace, requests: int, strategies: list[str]
) -> str:
    lines = [
        f"KV-cache simulation: workload {args.workload} ({requests} request"
        f"{'' if requests == 1 else 's'}), model {f.name}",
        f"  {format_bytes(f.bytes_per_token)} of K/V per token = {f.num_layers} layers x "
        f"{f.num_kv_heads} KV heads x {f.head_dim} dim x 2 (K, V) x {f.dtype_bytes} bytes"
        + (f" ({f.window_layers} layers with a {f.window}-token window)" if f.window else ""),
        f"  {format_bytes(memory)} of KV cache, blocks of {args.block_size} tokens "
        f"({format_bytes(f.block_bytes(args.block_size))}), max_seq_len {args.max_seq_len}",
    ]
    if "paged+window" in strategies:
        windowed = f.with_window(args.window, args.block_size)
        what_if = "" if f.window_layers else " (what-if: the model has no sliding window)"
        lines.append(
            f"  paged+window: {windowed.window_layers} of {f.num_layers} layers keep only "
            f"the last {windowed.window} tokens{what_if}"
        )
    return "\n".join(lines) + "\n"


def run_plan(args: argparse.Namespace) -> int:
    footprint = load_footprint(args.model, args.dtype, args.kv_cache_dtype, args.quantization)
    gpu_memory = parse_memory(args.gpu_memory, "gpu_memory")
    try:
        averages = [int(value) for value in args.avg_tokens.split(",")]
    except ValueError:
        raise ValueError(
            f"avg_tokens: expected integers separated by commas, got {args.avg_tokens!r}"
        ) from None
    plans = [
        plan_capacity(
            footprint,
            gpu_memory,
            avg,
            args.users,
            peak_tokens=args.peak_tokens,
            block_size=args.block_size,
            max_seq_len=args.max_seq_len,
            gpu_memory_utilization=args.gpu_memory_utilization,
        )
        for avg in averages
    ]
    if args.json:
        print(plans_to_json(plans))
    else:
        print(format_plan(plans[0]) if len(plans) == 1 else format_sweep(plans))
    return 0
