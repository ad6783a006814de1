"""Request limits: counts refused before their entries are validated, under the limits
applied to the request (a server's, else the defaults)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from infer.server.guards.request_limits import DEFAULT_LIMITS, RequestLimits, applied_limits
from infer.server.openai.protocol import ChatCompletionRequest, CompletionRequest

HI = {"role": "user", "content": "hi"}


def test_a_conversation_longer_than_the_applied_limit_is_refused_by_its_count() -> None:
    body = {"messages": [HI] * 3}
    with RequestLimits(max_messages=2).applied(), pytest.raises(ValidationError) as refused:
        ChatCompletionRequest.model_validate(body)
    assert "messages: 3 messages exceed this server's limit of 2 (--max-messages)" in str(
        refused.value
    )
    assert len(ChatCompletionRequest.model_validate(body).messages) == 3  # the defaults: 2048


def test_the_count_comes_before_the_entries_are_validated() -> None:
    """100,000 messages no model accepts: the count is what refuses them."""
    body = {"messages": [{"role": "nobody"}] * 100_000}
    with pytest.raises(ValidationError, match=r"messages: 100000 messages exceed"):
        ChatCompletionRequest.model_validate(body)


def test_every_counted_field_of_a_completion_before_validation() -> None:
    limits = RequestLimits(max_n=2, max_stop_strings=2, max_logit_bias=2)
    too_many = [{"n": 3}, {"stop": ["a", "b", "c"]}, {"logit_bias": {"1": 1, "2": 1, "3": 1}}]
    with limits.applied():
        for fields in too_many:
            with pytest.raises(ValidationError, match=rf"{next(iter(fields))}: 3 "):
                CompletionRequest.model_validate({"prompt": "hi", **fields})


def test_what_is_not_a_count_is_left_to_validation() -> None:
    for junk in ({"n": "many"}, {"n": True}, {"stop": "one string"}, {"logit_bias": [1, 2]}):
        RequestLimits(max_n=1).check_counts(junk)  # no count to refuse


def test_the_applied_limits_end_with_their_block() -> None:
    limits = RequestLimits(max_messages=5)
    with limits.applied():
        assert applied_limits() is limits
    assert applied_limits() is DEFAULT_LIMITS
