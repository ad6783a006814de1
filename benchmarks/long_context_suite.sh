#!/usr/bin/env bash
# Issue 48 on one GPU, in parts that each stop at their own time limit: the fused-path GPU
# tests, the long-prompt kernel ceiling (prefill_ceiling_long.py, the engine's path among the
# candidates), then `infer bench offline` on llama-3.2-3b (dummy weights): the long-context
# workloads and the two whose speed must not move, at the defaults and in A/B variants.
# Results (JSON, logs) go to $OUT/longctx (or benchmarks/results/long-context-<date>), with a
# summary table of every offline run last. Run from the repository root:
#   benchmarks/long_context_suite.sh [PARTS]     # PARTS: tests,ceiling,offline,ab (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_MININTERVAL=30
out="${OUT:+$OUT/longctx}"
out="${out:-benchmarks/results/long-context-$(date -u +%Y-%m-%dT%H%M%SZ)}"
mkdir -p "$out"
parts=",${1:-tests,ceiling,offline,ab},"
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
    --parts env,full,prefix,gemma --kinds engine,sdpa-cudnn,split-cudnn --budget-s 150 \
    > "$out/ceiling.log" 2>&1
  tail -n 20 "$out/ceiling.log"
fi
if [[ $parts == *,offline,* ]]; then
  bench defaults 420 --workload long_prompt,long_decode,long_mix,chunked_prefill,burst256,single
fi
if [[ $parts == *,ab,* ]]; then
  # A step budget of 16,384 tokens (a 16k prompt in one step beside decode rows)...
  bench budget16k 300 --workload long_mix,burst256,long_decode --max-num-batched-tokens 16384
  # ...chunked_prefill unchunked (its P99 ITL must stay 2x below)...
  bench unchunked 200 --workload chunked_prefill --no-chunked-prefill
  # ...and the new chunk policy with the Triton kernel alone (attribution).
  bench policy-only 200 --workload long_prompt --no-sdpa-prefill
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
