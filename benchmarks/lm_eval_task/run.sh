#!/usr/bin/env bash
# lm-eval's log-likelihood task infer_facts (40 items, this folder) against `infer serve` on the
# embedded SmolLM2 (local-completions: echo, logprobs 1, max_tokens 1) and against Hugging Face
# transformers on the same GGUF (lm-eval's hf model, float32, CPU), then item by item.
#
#   LM_EVAL=/path/to/venv/bin/lm_eval benchmarks/lm_eval_task/run.sh [OUT_DIR]
#
# lm-eval is not a dependency of infer: install it where it does not disturb infer's own
# packages (here a venv that sees infer's venv through a .pth file: pip install lm-eval).
set -euo pipefail
cd "$(dirname "$0")/../.."
LM_EVAL=${LM_EVAL:-lm_eval}
OUT=${1:-benchmarks/results/lm-eval-infer-facts-cpu-$(date -u +%F)-$(git rev-parse --short HEAD)}
PORT=${PORT:-8765}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
GGUF=$(PYTHONPATH=src $PY -c 'from infer.loader.presets import embedded_model_path as p; print(p())')
# local-completions tokenizes with a Hugging Face tokenizer: the GGUF's own, saved once.
TOKENIZER="$OUT/tokenizer"
PYTHONPATH=src $PY -c "
import sys; from pathlib import Path; from transformers import AutoTokenizer
gguf = Path(sys.argv[1]); AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(sys.argv[2])
" "$GGUF" "$TOKENIZER"

PYTHONPATH=src $PY -m infer.cli serve --model smollm2-135m --port "$PORT" > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do sleep 1; done

"$LM_EVAL" --model local-completions \
  --model_args "model=smollm2-135m,base_url=http://127.0.0.1:$PORT/v1/completions,tokenizer_backend=huggingface,tokenizer=$TOKENIZER,num_concurrent=1,max_retries=1" \
  --include_path benchmarks/lm_eval_task --tasks infer_facts --log_samples \
  --output_path "$OUT/served" 2>&1 | tee "$OUT/served.log"
kill $SERVER

"$LM_EVAL" --model hf \
  --model_args "pretrained=$(dirname "$GGUF"),gguf_file=$(basename "$GGUF"),tokenizer=$TOKENIZER,dtype=float32" \
  --device cpu --batch_size 8 --include_path benchmarks/lm_eval_task --tasks infer_facts --log_samples \
  --output_path "$OUT/transformers" 2>&1 | tee "$OUT/transformers.log"

rm -r "$TOKENIZER"
$PY benchmarks/lm_eval_task/compare.py "$OUT/served" "$OUT/transformers" --out "$OUT/comparison.json"
