"""FP8 weights under tensor parallelism on the CPU (gloo): each rank quantises its own slices
(a row-parallel rank scales weights and activations over its own columns), so TP=2 is not
bit-identical to TP=1, but close: the same first token, its logprob within FP8 rounding
(later tokens of the tiny random model, whose norms are random, part at near-ties)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from infer import LLM, SamplingParams
from infer.engine.llm import Completion

OPTIONS = {"device": "cpu", "dtype": "float32", "num_gpu_blocks": 64, "max_batch_size": 4}
GREEDY = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, logprobs=0)
PROMPTS = [[5, 17, 33, 2, 9], list(range(3, 40))]


def generate(model: str, tp: int) -> list[Completion]:
    llm = LLM(model, tensor_parallel_size=tp, quantization="fp8", max_seq_len=256, **OPTIONS)
    try:
        return [r.outputs[0] for r in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    finally:
        llm.engine.close()


def test_tp2_fp8_stays_close_to_tp1_fp8(tiny_checkpoint: Callable[[str], Path]) -> None:
    model = str(tiny_checkpoint("llama"))
    for one, two in zip(generate(model, 1), generate(model, 2), strict=True):
        assert one.token_ids[0] == two.token_ids[0]
        assert two.logprobs[0].logprob == pytest.approx(one.logprobs[0].logprob, abs=0.05)
