"""Turning sampled tokens into text, stop decisions and the outputs callers see."""

from __future__ import annotations

from infer.contract.outputs import RequestOutput, TokenLogprob
from infer.engine.core.request import Request


def record_token(request: Request, token_id: int, now: float, max_seq_len: int) -> str:
    """Append a sampled token, detokenise it and apply the stop rules (stop tokens, stop
    strings, ``max_tokens``, ``max_seq_len``); returns the new text that may be streamed."""
    request.token_ids.append(token_id)
    if request.first_token_time is None:
        request.first_token_time = now
    request.token_times.append(now)
    params = request.params
    if request.detokenizer is not None:
        request.text += request.detokenizer.add(token_id)
    stopped = token_id in request.stop_token_ids and request.num_output_tokens >= params.min_tokens
    if stopped or (params.stop and _cut_at_stop_string(request)):
        request.finish("stop")
    elif request.reaches_length(request.num_tokens, max_seq_len):
        request.finish("length")
    return _releasable_text(request)


def _cut_at_stop_string(request: Request) -> bool:
    """Truncate the text at the first stop string in it: before it, or after it with
    ``include_stop_str_in_output``."""
    start = request.emitted_text_len
    found = [
        (index, len(stop))
        for stop in request.params.stop
        if (index := request.text.find(stop, max(0, start - len(stop)))) >= 0
    ]
    if not found:
        return False
    cut, length = min(found)
    if request.params.include_stop_str_in_output:
        cut += length
    request.text = request.text[:cut]
    return True


def _releasable_text(request: Request) -> str:
    """New text safe to stream: while running, hold back what could start a stop string."""
    end = len(request.text)
    if not request.is_finished and request.params.stop:
        end -= max(len(s) for s in request.params.stop) - 1
    if end <= request.emitted_text_len:
        return ""
    new_text = request.text[request.emitted_text_len : end]
    request.emitted_text_len = end
    return new_text


def request_output(
    request: Request, new_ids: list[int], new_logprobs: list[TokenLogprob], new_text: str
) -> RequestOutput:
    """What a step reports for a request; totals and timings once it has finished (a
    running request's would cost a copy of its whole output every step)."""
    done = request.is_finished
    start = request.arrival_time
    return RequestOutput(
        request_id=request.request_id,
        prompt_token_ids=request.prompt_token_ids if done else [],
        new_token_ids=new_ids,
        new_text=new_text,
        token_ids=request.output_token_ids if done else [],
        text=request.text[: request.emitted_text_len] if done else "",
        finished=done,
        finish_reason=request.finish_reason,
        error=request.error,
        new_logprobs=new_logprobs,
        logprobs=request.logprobs if done else [],
        prompt_logprobs=request.prompt_logprobs if done else None,
        ttft_s=None if request.first_token_time is None else request.first_token_time - start,
        token_times_s=[t - start for t in request.token_times] if done else [],
        num_cached_tokens=min(request.num_cached_tokens, request.num_prompt_tokens),
    )
