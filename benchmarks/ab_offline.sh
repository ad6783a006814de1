#!/usr/bin/env bash
# Does a change move the offline figures? `infer bench offline` with two source trees,
# A (before) and B (after), in alternating rounds on the same GPU, so both see the same
# machine; the table of every run comes last. Run from the repository root:
#   benchmarks/ab_offline.sh A_SRC B_SRC OUT_DIR [ROUNDS [BENCH OFFLINE FLAGS...]]
# A_SRC / B_SRC are `src` folders (e.g. a `git archive` of the commit before, and `src`).
set -euo pipefail
a=$1 b=$2 out=$3 rounds=${4:-2}
shift $(($# < 4 ? $# : 4))
flags=("$@")
if [ ${#flags[@]} -eq 0 ]; then
  flags=(--model llama-3.2-3b --load-format dummy --workload burst256,single
         --sampling greedy,t1 --no-progress)
fi
mkdir -p "$out"
for round in $(seq "$rounds"); do
  for side in A B; do
    src=$a
    [ "$side" = B ] && src=$b
    echo "== round $round, $side ($src)"
    PYTHONPATH="$src${PYTHONPATH:+:$PYTHONPATH}" python3 -m infer.cli bench offline \
      "${flags[@]}" --output "$out/$side-round$round"
  done
done
# Per workload and sampling: each side's runs, and B / A of their medians.
python3 - "$out" <<'PY' | tee "$out/ab.md"
import json, statistics, sys
from collections import defaultdict
from pathlib import Path

runs = defaultdict(lambda: defaultdict(list))  # "burst256-t1" -> side -> [(tok/s, ITL p50)]
for path in sorted(Path(sys.argv[1]).glob("*-infer.json")):
    side, _, *run, _ = path.stem.split("-")  # A-round1-burst256-t1-infer
    result = json.loads(path.read_text())
    runs["-".join(run)][side].append((result["output_tok_s"], result["itl_ms"]["p50"]))
print("| run | A tok/s | B tok/s | B / A (medians) | A ITL p50 ms | B ITL p50 ms |")
print("|---|---|---|---:|---|---|")
for run, sides in sorted(runs.items()):
    a, b = sides["A"], sides["B"]
    if not a or not b:
        continue
    ratio = statistics.median(t for t, _ in b) / statistics.median(t for t, _ in a)
    tok = [", ".join(f"{t:,.1f}" for t, _ in side) for side in (a, b)]
    itl = [", ".join(f"{i:.2f}" for _, i in side) for side in (a, b)]
    print(f"| {run} | {tok[0]} | {tok[1]} | {ratio:.3f} | {itl[0]} | {itl[1]} |")
PY
