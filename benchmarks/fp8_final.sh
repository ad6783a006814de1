#!/usr/bin/env bash
# Issue 49's measurement on one GPU, in three parts (one device call each, every part under
# 10 minutes on an H100), results under $OUT/fp8/ (or benchmarks/results/fp8-final/):
#
#   benchmarks/fp8_final.sh throughput [bf16,fp8,fp8-kvfp8]
#       single,burst256 with bf16, FP8 weights, FP8 weights + KV (~75 s an engine)
#   benchmarks/fp8_final.sh long        # long_decode 16 x 32k: bf16 KV, FP8 KV (~4 min)
#   benchmarks/fp8_final.sh checks      # FP8 GPU tests; decode-step profiles after (~4 min)
#
# Scoreboard entries go to $OUT/fp8/scoreboard.json (merged into the repository's by hand);
# FP8 runs are named .../infer-fp8, .../infer-fp8-kvfp8, .../infer-kvfp8.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_MININTERVAL=5
out="${OUT:-benchmarks/results}/fp8"
mkdir -p "$out"
export INFER_SCOREBOARD="$out/scoreboard.json"
infer() { python3 -c 'import sys; from infer.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }
offline() {  # label, workloads, engine flags...
  local label=$1 workloads=$2
  shift 2
  echo "=== $label: $workloads $* (t=$SECONDS s)"
  # FP8_FINAL_FLAGS: a smoke test's extra flags (e.g. "--model smollm2-135m --device cpu
  # --num-requests 1 --max-tokens 2"; later flags win)
  infer bench offline --model llama-3.2-3b --load-format dummy --workload "$workloads" \
    --no-progress --output "$out/$label" "$@" ${FP8_FINAL_FLAGS:-} 2>&1 | tail -25
}

status=0
case "${1:-}" in
  throughput)  # optional second argument: which of bf16,fp8,fp8-kvfp8 (default: all three)
    for label in $(echo "${2:-bf16,fp8,fp8-kvfp8}" | tr ',' ' '); do
      case "$label" in
        bf16) offline bf16 single,burst256 || status=1 ;;
        fp8) offline fp8 single,burst256 --quantization fp8 || status=1 ;;
        fp8-kvfp8)
          offline fp8-kvfp8 single,burst256 --quantization fp8 --kv-cache-dtype fp8 || status=1 ;;
        *) echo "unknown run $label" >&2; status=2 ;;
      esac
    done
    ;;
  long)
    offline long-bf16kv long_decode || status=1
    offline long-kvfp8 long_decode --kv-cache-dtype fp8 || status=1
    ;;
  checks)
    timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/unit/kernels/test_fp8_linear.py tests/unit/models/test_fp8.py \
      tests/unit/cache/test_kv_tensors.py tests/gpu/test_fp8_gpu.py 2>&1 \
      | tail -40 | tee "$out/gpu-tests.txt" || status=1
    profile() {  # label, engine flags...
      local label=$1
      shift
      timeout 90 python3 benchmarks/profile_decode_step.py "$out/profile-after-$label" "$@"
    }
    profile bf16 || status=1
    profile fp8 --quantization fp8 || status=1
    profile fp8-kvfp8 --quantization fp8 --kv-cache-dtype fp8 || status=1
    ;;
  *)
    echo "usage: $0 throughput|long|checks" >&2
    exit 2
    ;;
esac
echo "=== done in $SECONDS s (status $status)"
exit $status
