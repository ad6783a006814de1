"""How a sequence the engine ended with an error reaches the client: its own grammar's
failure as a 400 that says what failed, anything else as a generic 500; and what the usage
says the prefix cache saved."""

from __future__ import annotations

from infer.contract.outputs import RequestOutput
from infer.server.http.serving import Context, _as_api_error, _SequenceFailed
from infer.server.http.sse import ChunkTemplate


def test_a_sequence_ended_by_its_grammar_is_a_400_naming_structured_outputs() -> None:
    message = "structured_outputs: the grammar's matcher failed: lexer error: too many expressions"
    error = _as_api_error(_SequenceFailed(message))
    assert error.status == 400
    assert error.info.param == "structured_outputs"
    assert error.info.message == message


def test_a_sequence_failed_by_the_engine_is_a_generic_500() -> None:
    error = _as_api_error(_SequenceFailed("RuntimeError: CUDA error: an illegal memory access"))
    assert error.status == 500
    assert "CUDA" not in error.info.message


def _context(prompt_lengths: list[int], n: int) -> Context:
    ctx = Context(
        request_id="cmpl-1", model="m", created=0, prompt_lengths=prompt_lengths, n=n,
        num_logprobs=None, include_usage=True, continuous_usage=False, return_token_ids=False,
        template=ChunkTemplate.of("cmpl-1", "text_completion", 0, "m"),
    )  # fmt: skip
    ctx.cached_tokens = [None] * ctx.num_choices
    return ctx


def _final(cached: int) -> RequestOutput:
    return RequestOutput("r", [], [], "", [], "", finished=True, num_cached_tokens=cached)


def test_usage_counts_each_prompts_cached_tokens_once_for_its_n_samples() -> None:
    ctx = _context([40, 50], n=2)
    assert ctx.usage().prompt_tokens_details.cached_tokens == 0
    for index, cached in enumerate([0, 32, 48, 48]):  # prompt 0's first sample filled it
        ctx.finished(index, _final(cached))
    usage = ctx.usage()
    assert usage.prompt_tokens == 90
    assert usage.prompt_tokens_details.cached_tokens == 0 + 48
