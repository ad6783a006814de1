#!/usr/bin/env bash
# The end-to-end GPU suite: `burst256` and `single` for llama-3.2-3b, qwen3-4b and gemma-3-1b
# (dummy weights at the real shapes), infer vs Hugging Face transformers (or vLLM), each engine
# in its own fresh process on the same GPU. Writes one JSON per (model, workload, engine), latency
# plots and a combined markdown table (with the roofline) to benchmarks/results/suite-<date>/,
# prints progress as it goes and the table last.
#
# Usage, from anywhere in the checkout (the package need not be pip-installed):
#   benchmarks/run_gpu_suite.sh                 # all three models (about 8 minutes on an H100)
#   benchmarks/run_gpu_suite.sh qwen3-4b        # some of them (e.g. one model per call)
# Where the checkout has no .git, give the commit the numbers belong to:
#   INFER_GIT_COMMIT=$(git rev-parse --short=12 HEAD) benchmarks/run_gpu_suite.sh
# SUITE_FLAGS adds flags to every run (a smoke test: SUITE_FLAGS="--num-requests 4 --max-tokens 8").
# SUITE_ENGINES picks the engines (default: both = infer,hf; vLLM beside infer: infer,vllm, with
# the carried vLLM on PYTHONPATH, see shared/tools/vllm-peer).
# When $OUT is set (the device machine's folder that comes back), the results are copied there.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export TQDM_MININTERVAL=5  # progress bars, without flooding a captured log

models=("$@")
[ ${#models[@]} -gt 0 ] || models=(llama-3.2-3b qwen3-4b gemma-3-1b)
out="benchmarks/results/suite-$(date -u +%Y-%m-%dT%H%M%SZ)"
mkdir -p "$out"
infer() { python3 -c 'import sys; from infer.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }

start=$SECONDS
status=0
for model in "${models[@]}"; do
  echo "=== $model: ${SUITE_ENGINES:-both}, burst256 + single (t=$((SECONDS - start)) s)"
  if ! infer bench offline --engine "${SUITE_ENGINES:-both}" --load-format dummy --model "$model" \
      --workload burst256,single --output "$out/$(basename "$model").json" --plot \
      ${SUITE_FLAGS:-}; then
    echo "!!! $model: a run failed (see above); its table rows say which"
    status=1
  fi
done

echo "=== done in $((SECONDS - start)) s; results in $out/"
shopt -s nullglob
results=("$out"/*.json)
if [ ${#results[@]} -gt 0 ]; then
  infer bench table "${results[@]}" --output "$out/table.md"
fi
if [ -n "${OUT:-}" ]; then
  cp -r "$out" "$OUT/"
fi
exit $status
