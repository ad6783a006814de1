"""Markdown tables of benchmark results: engines side by side, with the ratio and roofline."""

from __future__ import annotations

from typing import Any

from infer.bench.sampling import BenchSampling, run_name

ENGINE_NAMES = {
    "infer": "infer",
    "hf": "transformers",
    "vllm": "vLLM",
    "server": "infer server (HTTP)",
}
PEERS = ("vllm", "hf")  # the ratio columns, in this order


def _ms(stats: dict[str, Any], key: str) -> str:
    value = stats.get(key)
    return "-" if value is None else f"{value:,.1f}"


def _sampling(record: dict[str, Any]) -> BenchSampling:
    """A record's sampling settings (records from before they were recorded: greedy)."""
    return BenchSampling(**record.get("sampling", {}))


def _run(record: dict[str, Any]) -> str:
    """The run a record belongs to (records from before runs were named: the ``run_name`` of
    its workload and sampling)."""
    return record.get("run") or run_name(record["workload"], _sampling(record))


def _row(record: dict[str, Any], peers: dict[str, dict[str, Any]]) -> str:
    head = [
        record["model"],
        record["workload"],
        _sampling(record).label,
        ENGINE_NAMES.get(record["engine"], record["engine"]),
    ]
    if record.get("num_requests", 0) == record.get("num_failed", 0):
        error = "; ".join(record.get("errors") or ["no request finished"])
        return "| " + " | ".join([*head, f"failed: {error}"]) + " |"
    tok_s = record["output_tok_s"]
    roofline = record.get("roofline", {}).get("output_tok_s")
    bound = f"{roofline:,.0f} ({tok_s / roofline:.0%})" if roofline else "-"
    ratios = [
        f"{tok_s / peers[p]['output_tok_s']:.1f}x" if peers.get(p, {}).get("output_tok_s") else "-"
        for p in PEERS
    ]
    kv = record.get("peak_kv_utilization")
    cells = [
        *head,
        f"{tok_s:,.1f}",
        f"{record['requests_per_s']:,.2f}",
        f"{_ms(record['ttft_ms'], 'p50')} / {_ms(record['ttft_ms'], 'p99')}",
        f"{_ms(record['itl_ms'], 'p50')} / {_ms(record['itl_ms'], 'p99')}",
        f"{_ms(record['e2e_ms'], 'p50')} / {_ms(record['e2e_ms'], 'p99')}",
        "-" if kv is None else f"{kv:.0%}",
        str(record.get("preemptions", "-")),
        bound,
        *ratios,
        f"{record['num_requests'] - record['num_failed']}/{record['num_requests']}",
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| model | workload | sampling | engine | output tok/s | req/s | TTFT p50 / p99 ms "
    "| ITL p50 / p99 ms | E2E p50 / p99 ms | peak KV | preempt. | roofline tok/s (achieved) "
    "| vs vLLM | vs transformers | ok |\n"
    "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def format_table(records: list[dict[str, Any]]) -> str:
    """One row per record, grouped by (model, run); infer rows carry the ratio of their
    output tok/s to the vLLM and transformers records of the same model and run (the same
    workload and sampling, and of a label given twice, the same one of its runs)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["model"], _run(record)), []).append(record)
    rows = [HEADER]
    for group in groups.values():
        peers = {r["engine"]: r for r in group if r["engine"] in PEERS}
        for record in sorted(group, key=lambda r: _order(r["engine"])):
            rows.append(_row(record, {} if record["engine"] in PEERS else peers))
    return "\n".join(rows)


def _order(engine: str) -> int:
    """infer (and its server) first, then the peers in column order."""
    return PEERS.index(engine) + 1 if engine in PEERS else 0


def format_ceilings(records: list[dict[str, Any]]) -> str:
    """The measured ceilings behind the roofline column, one line per GPU."""
    lines = {
        f"- {r['gpu']}: copy {r['roofline']['copy_tb_s']} TB/s (read + write), "
        f"bf16 matmul {r['roofline']['matmul_tflops']} TFLOP/s"
        for r in records
        if "copy_tb_s" in r.get("roofline", {})
    }
    return "\n".join(sorted(lines))


def format_roofline(records: list[dict[str, Any]]) -> str:
    """Bytes, FLOPs and time bounds behind each infer record's roofline column."""
    rows = [
        "| model | workload | sampling | mode | weights / step GB | decode steps | decode reads GB "
        "| prefill TFLOP | bound s (prefill + decode) | bound output tok/s | achieved |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        roof = r.get("roofline")
        if not roof or r["engine"] != "infer":
            continue
        bound = roof.get("output_tok_s")
        seconds = f"{roof['prefill_s']} + {roof['decode_s']}" if bound else "-"
        achieved = f"{r['output_tok_s'] / bound:.0%}" if bound else "-"
        rows.append(
            f"| {r['model']} | {r['workload']} | {_sampling(r).label} | {roof['mode']} "
            f"| {roof['weight_bytes_per_step'] / 1e9:.2f} | {roof['decode_steps']} "
            f"| {roof['decode_bytes'] / 1e9:,.1f} | {roof['prefill_flops'] / 1e12:,.2f} "
            f"| {seconds} | {'-' if not bound else f'{bound:,.0f}'} | {achieved} |"
        )
    return "\n".join(rows) if len(rows) > 2 else ""
