#!/usr/bin/env bash
# Issue 54 on two GPUs of one host (nvidia-h100-x2): `infer serve -dp 2` against one replica,
# llama-3.2-3b with dummy weights (no checkpoint). Each server in turn: started, waited for,
# sent `infer bench serve` (burst256, then prefix_caching), stopped. Owed: the burst at
# >= 1.8x one replica's output tok/s, and prefix_caching's TTFT with -dp 2 near one
# replica's and below -dp 2's without prefix caching (its advantage kept). The client sends
# from CLIENT_PROCESSES processes (default 8): one Python client parses a few tens of
# thousands of streamed tokens a second, about what one replica serves (16.3). Each server
# gets `burst256` BURSTS times (default 2: one burst of a fresh server moved 18 % between two
# machines, 16.5), pooled in the summary, and the GPUs' clocks are logged before each server.
# Results (JSON, logs, a table) go to $OUT/dp (or benchmarks/results/data-parallel-<date>).
# Run from the repository root:
#   benchmarks/data_parallel.sh          # about 4 minutes on 2 x H200, the start included
# A dry run on the CPU (the script's own check, not a measurement):
#   MODEL=smollm2-135m SERVE_FLAGS="--device cpu" BENCH_FLAGS="--num-requests 4 --max-tokens 4" \
#     benchmarks/data_parallel.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:+$OUT/dp}"
out="${out:-benchmarks/results/data-parallel-$(date -u +%Y-%m-%dT%H%M%SZ)}"
mkdir -p "$out"
model="${MODEL:-llama-3.2-3b --load-format dummy}"
port=8123
url="http://127.0.0.1:$port"
start=$SECONDS
run() {  # NAME WORKLOADS SERVE_FLAGS...: one server, its workloads, one JSON each
  local name=$1 workloads=$2
  shift 2
  echo "=== $name (t=$((SECONDS - start)) s): serve $*; $workloads"
  # shellcheck disable=SC2086  # the model's and the dry run's flags are words
  python3 -m infer.cli serve --model $model --port "$port" --log-level warning \
    ${SERVE_FLAGS:-} "$@" > "$out/$name-server.log" 2>&1 &
  local pid=$! waited=0
  until curl -sf "$url/health" > /dev/null; do
    if ! kill -0 "$pid" 2> /dev/null || ((waited >= 300)); then
      echo "the server did not start"; tail -n 20 "$out/$name-server.log"
      kill -TERM "$pid" 2> /dev/null; wait "$pid"; return
    fi
    sleep 2; waited=$((waited + 2))
  done
  curl -s "$url/health"; echo
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=index,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv \
      > "$out/$name-clocks.csv" 2>&1
  fi
  local workload repeat label
  for workload in ${workloads//,/ }; do
    repeat=1
    [ "$workload" = burst256 ] && repeat=${BURSTS:-2}
    for ((i = 1; i <= repeat; i++)); do
      label=$workload
      ((repeat > 1)) && label=$workload-$i
      # shellcheck disable=SC2086
      timeout 300 python3 -m infer.cli bench serve --url "$url" --workload "$workload" \
        --client-processes "${CLIENT_PROCESSES:-8}" --no-progress \
        --output "$out/$name-$label.json" ${BENCH_FLAGS:-} 2>&1 \
        | grep -v 'httpx: HTTP Request' | tail -n 5 | tee -a "$out/$name.log"
    done
  done
  curl -s "$url/metrics" | grep '^infer_replica_' > "$out/$name-replicas.prom"
  kill -TERM "$pid"; wait "$pid"
}
run dp1 burst256,prefix_caching
run dp2 burst256,prefix_caching -dp 2
run dp2-no-prefix-caching prefix_caching -dp 2 --no-prefix-caching
echo "=== summary (t=$((SECONDS - start)) s)"
python3 - "$out" << 'PY' | tee "$out/summary.md"
import json, re, sys
from pathlib import Path

out = Path(sys.argv[1])
rows = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
print("| run | output tok/s | TTFT p50 / p99 ms | failed |\n|---|---:|---:|---:|")
for name, r in rows.items():
    ttft = r.get("ttft_ms") or {}
    print(f"| {name} | {r['output_tok_s']:,.1f} | {ttft.get('p50', 0):,.1f} / "
          f"{ttft.get('p99', 0):,.1f} | {r.get('num_failed')} |")
def burst_tok_s(server):
    runs = [r for name, r in rows.items() if re.fullmatch(rf"{server}-burst256(-\d+)?", name)]
    return sum(r["output_tok_s"] for r in runs) / len(runs) if runs else None

one, two = burst_tok_s("dp1"), burst_tok_s("dp2")
if one and two:
    print(f"\nburst256 (each server's bursts pooled): -dp 2 at {two / one:.2f}x one replica "
          "(owed: >= 1.8x)")
PY
