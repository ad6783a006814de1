#!/usr/bin/env bash
# Issue 54 on two GPUs of one host (nvidia-h100-x2): `infer serve -dp 2` against one replica,
# llama-3.2-3b with dummy weights (no checkpoint). Each server in turn: started, waited for,
# sent `infer bench serve` (burst256, then prefix_caching), stopped. Owed: the burst at
# >= 1.8x one replica's output tok/s, and prefix_caching's TTFT with -dp 2 near one
# replica's and below -dp 2's without prefix caching (its advantage kept). The client sends
# from CLIENT_PROCESSES processes (default 8): one Python client parses a few tens of
# thousands of streamed tokens a second, about what one replica serves (16.3). Results
# (JSON, logs, a table) go to $OUT/dp (or benchmarks/results/data-parallel-<date>). Run from
# the repository root:
#   benchmarks/data_parallel.sh          # about 6 minutes on 2 x H100, the start included
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
  local workload
  for workload in ${workloads//,/ }; do
    # shellcheck disable=SC2086
    timeout 300 python3 -m infer.cli bench serve --url "$url" --workload "$workload" \
      --client-processes "${CLIENT_PROCESSES:-8}" --no-progress \
      --output "$out/$name-$workload.json" ${BENCH_FLAGS:-} 2>&1 \
      | grep -v 'httpx: HTTP Request' | tail -n 5 | tee -a "$out/$name.log"
  done
  curl -s "$url/metrics" | grep '^infer_replica_' > "$out/$name-replicas.prom"
  kill -TERM "$pid"; wait "$pid"
}
run dp1 burst256,prefix_caching
run dp2 burst256,prefix_caching -dp 2
run dp2-no-prefix-caching prefix_caching -dp 2 --no-prefix-caching
echo "=== summary (t=$((SECONDS - start)) s)"
python3 - "$out" << 'PY' | tee "$out/summary.md"
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
rows = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
print("| run | output tok/s | TTFT p50 / p99 ms | failed |\n|---|---:|---:|---:|")
for name, r in rows.items():
    ttft = r.get("ttft_ms") or {}
    print(f"| {name} | {r['output_tok_s']:,.1f} | {ttft.get('p50', 0):,.1f} / "
          f"{ttft.get('p99', 0):,.1f} | {r.get('num_failed')} |")
one, two = rows.get("dp1-burst256"), rows.get("dp2-burst256")
if one and two:
    print(f"\nburst256: -dp 2 at {two['output_tok_s'] / one['output_tok_s']:.2f}x one replica "
          "(owed: >= 1.8x)")
PY
