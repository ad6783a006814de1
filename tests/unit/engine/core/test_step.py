"""Step: the samples each chunk takes, and which steps must wait for the tokens before them."""

from __future__ import annotations

from infer.contract.sampling_params import SamplingParams
from infer.engine.core.request import Request
from infer.engine.core.step import ScheduledChunk, Step

PLAIN = SamplingParams(max_tokens=8)


def _request(params: SamplingParams = PLAIN) -> Request:
    return Request("r", [1, 2, 3, 4], 4, params, seed=0)


def test_a_chunk_samples_once_at_the_end_and_once_per_proposal() -> None:
    request = _request()
    prefill = ScheduledChunk(request, 0, 2, samples=False)
    last = ScheduledChunk(request, 2, 2, samples=True)
    proposed = ScheduledChunk(request, 4, 3, samples=True, proposals=[7, 8])
    verify = ScheduledChunk(request, 5, 4, samples=True, verify=True)
    assert [c.num_samples for c in (prefill, last, proposed, verify)] == [0, 1, 3, 4]
    # The first output a chunk samples: after the prompt, past the tokens already out.
    assert last.output_index == 0 and proposed.output_index == 1
    step = Step(chunks=[prefill, last, proposed])
    assert step.num_tokens == 7 and step.num_samples == 4
    assert step.chunks_that_sample() == [last, proposed]
    assert step.requests() == [request] * 3


def test_only_penalties_and_grammars_make_sampling_wait_for_the_step_before() -> None:
    def reads(params: SamplingParams) -> bool:
        return Step(chunks=[ScheduledChunk(_request(params), 4, 1, True)]).reads_outputs()

    assert not reads(PLAIN)
    assert not reads(SamplingParams(temperature=0.7, top_k=5, max_tokens=8))
    assert reads(SamplingParams(max_tokens=8, presence_penalty=0.5))
    assert reads(SamplingParams(max_tokens=8, structured_outputs={"regex": "[ab]+"}))
