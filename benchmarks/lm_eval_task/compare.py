"""The same lm-eval task scored by two backends, item by item: the log-likelihood of every
choice, each item's pick (argmax), and the task's acc/acc_norm.

    python benchmarks/lm_eval_task/compare.py SERVED_DIR TRANSFORMERS_DIR [--out FILE]

Each directory is an lm-eval ``--output_path`` run with ``--log_samples`` (the newest
results and samples files in it are read).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _newest(directory: Path, pattern: str) -> Path:
    return max(directory.rglob(pattern), key=lambda path: path.stat().st_mtime)


def _run(directory: Path, task: str) -> tuple[dict[str, Any], dict[int, list[float]]]:
    """The task's metrics, and each item's choice log-likelihoods."""
    results = json.loads(_newest(directory, "results_*.json").read_text())["results"][task]
    samples = _newest(directory, f"samples_{task}_*.jsonl").read_text().splitlines()
    scores = {}
    for line in samples:
        sample = json.loads(line)
        scores[sample["doc_id"]] = [float(resp[0]) for resp in sample["filtered_resps"]]
    return results, scores


def compare(served: Path, reference: Path, task: str) -> dict[str, Any]:
    ours, our_scores = _run(served, task)
    theirs, their_scores = _run(reference, task)
    assert our_scores.keys() == their_scores.keys(), "the runs scored different items"
    diffs = [
        abs(a - b)
        for doc in our_scores
        for a, b in zip(our_scores[doc], their_scores[doc], strict=True)
    ]
    picks_agree = sum(
        max(range(len(s)), key=s.__getitem__) == max(range(len(t)), key=t.__getitem__)
        for s, t in ((our_scores[d], their_scores[d]) for d in our_scores)
    )
    return {
        "task": task,
        "items": len(our_scores),
        "choices_scored": len(diffs),
        "max_abs_loglikelihood_diff": max(diffs),
        "mean_abs_loglikelihood_diff": sum(diffs) / len(diffs),
        "items_with_the_same_pick": picks_agree,
        "served": {k: v for k, v in ours.items() if k.startswith("acc")},
        "transformers": {k: v for k, v in theirs.items() if k.startswith("acc")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("served", type=Path, help="lm-eval output of local-completions")
    parser.add_argument("reference", type=Path, help="lm-eval output of the hf model")
    parser.add_argument("--task", default="infer_facts")
    parser.add_argument("--out", type=Path, help="also write the comparison here (JSON)")
    args = parser.parse_args()
    summary = compare(args.served, args.reference, args.task)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
