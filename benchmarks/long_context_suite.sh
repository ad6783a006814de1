#!/usr/bin/env bash
# Issue 48 on one GPU, in parts that each stop at their own time limit: the fused-path GPU
# tests, the long-prompt kernel ceiling (prefill_ceiling_long.py, the engine's path among the
# candidates), then `infer bench offline` on llama-3.2-3b (dummy weights): the long-context
# workloads in one engine, the workloads whose speed must not move in another (and
# chunked_prefill unchunked, for its 2x), and A/B variants. Results (JSON, logs) go to
# $OUT/longctx (or benchmarks/results/long-context-<date>), with a summary table of every
# offline run last. Run from the repository root:
#   benchmarks/long_context_suite.sh [PARTS]   # PARTS: tests,ceiling,long,short,ab
#                                              # (default: tests,ceiling,long,short)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_MININTERVAL=30
out="${OUT:+$OUT/longctx}"
out="${out:-benchmarks/results/long-context-$(date -u +%Y-%m-%dT%H%M%SZ)}"
mkdir -p "$out"
parts=",${1:-tests,ceiling,long,short},"
start=$SECONDS
bench() {  # NAME LIMIT_S FLAGS...: one engine, its workloads, one JSON each
  local name=$1 limit=$2
  shift 2
  echo "=== offline $name (t=$((SECONDS - start)) s): $*"
  timeout "$limit" python3 -m infer.cli bench offline --model llama-3.2-3b --load-format dummy \
    --no-progress --output "$out/offline/$name" "$@" 2>&1 | tail -n 40 | tee "$out/offline-$name.log"
}
mkdir -p "$out/offline"
if [[ $parts == *,tests,* ]]; then
  echo "=== GPU tests (t=$((SECONDS - start)) s)"
  timeout 300 python3 -m pytest tests/gpu/test_long_prefill_gpu.py -q -x -p no:cacheprovider \
    2>&1 | tail -n 30 | tee "$out/tests.log"
fi
if [[ $parts == *,ceiling,* ]]; then
  echo "=== kernel ceiling (t=$((SECONDS - start)) s)"
  timeout 200 python3 benchmarks/prefill_ceiling_long.py --out "$out/ceiling" \
    --parts env,full,prefix,gemma --kinds engine,flash4,sdpa-cudnn,split-cudnn --budget-s 150 \
    > "$out/ceiling.log" 2>&1
  tail -n 20 "$out/ceiling.log"
fi
if [[ $parts == *,long,* ]]; then
  bench long 420 --workload long_mix,long_prompt,long_decode
fi
if [[ $parts == *,short,* ]]; then
  bench short 300 --workload chunked_prefill,burst256,single
  bench unchunked 200 --workload chunked_prefill --no-chunked-prefill
fi
if [[ $parts == *,ab,* ]]; then
  # 8,192 tokens for every step (before ca97d13), and the Triton kernel alone (attribution)
  bench budget8k 300 --workload long_mix,long_prompt --max-num-batched-tokens 8192
  bench triton-only 200 --workload long_prompt --no-sdpa-prefill
fi
echo "=== done in $((SECONDS - start)) s; results in $out/"
python3 - "$out/offline" <<'PY' | tee "$out/summary.md"
import json, sys
from pathlib import Path

print("| run | tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | groups (TTFT p99, ITL p99 ms) | per-request TTFT ms |")
print("|---|---:|---|---|---|---|")
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    r = json.loads(path.read_text())
    ttft, itl = r["ttft_ms"], r["itl_ms"]
    groups = ", ".join(
        f"{g}: {v['ttft_ms']['p99']}, {v['itl_ms']['p99']}" for g, v in r.get("groups", {}).items()
    )
    per = [q["ttft_ms"] for q in r["requests"]][:6] if "long_prompt" in path.name else ""
    print(f"| {path.stem} | {r['output_tok_s']} | {ttft['p50']} / {ttft['p99']} "
          f"| {itl['p50']} / {itl['p99']} | {groups} | {per} |")
PY
