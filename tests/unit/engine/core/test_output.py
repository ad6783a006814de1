"""What a step reports of a request: the prompt tokens its admission found in the prefix
cache travel with every output, never more than its prompt."""

from __future__ import annotations

from infer.contract.sampling_params import SamplingParams
from infer.engine.core.output import request_output
from infer.engine.core.request import Request


def _request(prompt: int, cached: int) -> Request:
    request = Request("r", list(range(prompt)), prompt, SamplingParams(max_tokens=4), seed=0)
    request.num_cached_tokens = cached
    return request


def test_the_prompt_tokens_found_cached_are_reported() -> None:
    out = request_output(_request(prompt=40, cached=32), [7], [], "")
    assert out.num_cached_tokens == 32


def test_a_readmission_that_found_its_own_output_cached_reports_at_most_the_prompt() -> None:
    request = _request(prompt=20, cached=32)  # preempted after 12 outputs, then readmitted
    request.token_ids += list(range(12))
    assert request_output(request, [], [], "").num_cached_tokens == 20
