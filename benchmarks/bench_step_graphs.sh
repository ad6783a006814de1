#!/usr/bin/env bash
# Step graphs (issue 15), offline on dummy llama-3.2-3b: each figure beside the setting it is
# measured against, each engine setting in its own process, the table last.
#   chunked_prefill   default (chunked, graphs)  vs  --no-chunked-prefill   (P99 ITL, TTFT)
#   prefix_caching    default                    vs  --no-prefix-caching    (TTFT)
#   burst256, single  default                                               (throughput)
#   chunked_prefill   --prefill-chunk-size 256 / 512 / 1024 (default 384)  (the chunk sweep)
# Default-setting runs update the scoreboard; the others write to a scratch scoreboard and
# their JSON (results/<dir>/<label>-<workload>-infer.json) is what results-by-topic/ quotes.
#
# Usage: benchmarks/bench_step_graphs.sh [RESULTS_DIR]   (about 4 minutes on an H100)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" TQDM_DISABLE=1
out=${1:-benchmarks/results/step-graphs-$(date -u +%Y-%m-%dT%H%M%SZ)}
mkdir -p "$out"
scratch=$(mktemp -d)/scoreboard.json  # the settings that are not the defaults
run() { # label scoreboard flags...
  local label=$1 board=$2 start=$SECONDS
  shift 2
  INFER_SCOREBOARD=$board timeout 200 python3 -c \
    'import sys; from infer.cli import main; sys.exit(main(sys.argv[1:]))' \
    bench offline --model llama-3.2-3b --load-format dummy --no-progress \
    --output "$out/$label.json" "$@" > "$out/$label.log" 2>&1
  echo "=== $label: exit $?, $((SECONDS - start)) s"
}
board=${INFER_SCOREBOARD:-benchmarks/results/scoreboard.json}
run default "$board" --workload chunked_prefill,prefix_caching
# In an engine of their own, as the headline suite runs them: after the other workloads, on
# a machine's first run (cold Triton cache), burst256 lost 0.9 s to a stall
# (results-by-topic/05-step-loop.md, 5.5).
run default-burst "$board" --workload burst256,single
run unchunked "$scratch" --workload chunked_prefill --no-chunked-prefill
run no-prefix-caching "$scratch" --workload prefix_caching --no-prefix-caching
for size in 256 512 1024; do
  run "chunk-$size" "$scratch" --workload chunked_prefill --prefill-chunk-size "$size"
done
rm -rf "$(dirname "$scratch")"
python3 - "$out" <<'TABLE' | tee "$out/table.md"
import json, sys
from pathlib import Path

print("| run | workload | output tok/s | TTFT p50 ms | ITL p50 / p90 / p99 ms |")
print("|---|---|---:|---:|---|")
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    r = json.loads(path.read_text())
    label = path.stem.rsplit(f"-{r['workload']}-", 1)[0]
    itl = r["itl_ms"]
    print(f"| {label} | {r['workload']} | {r['output_tok_s']:,.1f} | {r['ttft_ms']['p50']:.1f} "
          f"| {itl['p50']:.2f} / {itl['p90']:.2f} / {itl['p99']:.2f} |")
TABLE
