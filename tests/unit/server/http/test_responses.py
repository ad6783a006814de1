"""The Responses API's parameters: which are honoured and how they reach the chat request,
which change nothing here, and which are refused with why."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from openai.types.responses.response_create_params import ResponseCreateParamsBase
from pydantic import ValidationError

from infer.server.http.errors import _validation_error
from infer.server.http.responses import ResponsesRequest, _logprobs_of
from infer.server.openai.protocol import ChatLogprobs, ChatTokenLogprob

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}
BASE: dict[str, Any] = {"input": "hi", "model": "m", "tools": [TOOL], "stream": True}
# One value of every parameter of OpenAI's Responses reference, accepted...
ACCEPTED: dict[str, Any] = {
    "access_programs": {"cyber": "standard"}, "background": False,
    "background_options": None, "context_management": [], "conversation": None,
    "image": {"context_compression": "auto"},
    "include": ["message.output_text.logprobs", "reasoning.encrypted_content"],
    "instructions": "Be brief.", "max_output_tokens": 9, "max_tool_calls": 1,
    "metadata": {"k": "v"}, "moderation": None, "parallel_tool_calls": True,
    "previous_response_id": None, "prompt": None, "prompt_cache_key": "k",
    "prompt_cache_options": {"mode": "explicit", "ttl": "12h"},
    "prompt_cache_retention": "in_memory", "reasoning": {"effort": "low", "summary": "auto"},
    "safety_identifier": "u1", "service_tier": "flex", "store": False,
    "stream_options": {"include_obfuscation": False}, "temperature": 0,
    "text": {"format": {"type": "text"}, "verbosity": "medium"}, "tool_choice": "auto",
    "top_logprobs": 3, "top_p": 0.9, "truncation": "auto", "user": "u",
}  # fmt: skip
# ... and the values refused, with why
REFUSED: dict[str, tuple[Any, str]] = {
    "background": (True, "keeps no responses"),
    "background_options": ({"completion_window": "2h"}, "background responses"),
    "context_management": ([{"type": "compaction"}], "does not compact"),
    "conversation": ("conv_1", "keeps no responses"),
    "previous_response_id": ("resp_1", "keeps no responses"),
    "prompt": ({"id": "pmpt_1"}, "keeps no responses"),
    "moderation": ({"model": "omni-moderation-latest"}, "no moderation model"),
    "store": (True, "keeps no responses"),
    "text": ({"verbosity": "high"}, "no verbosity setting"),
    "tools": ([{"type": "web_search"}], "web_search tools are not supported"),
}


@pytest.mark.parametrize(("field", "value"), list(ACCEPTED.items()))
def test_every_responses_parameter_of_openai_is_accepted(field: str, value: Any) -> None:
    ResponsesRequest.model_validate({**BASE, field: value}).as_chat()


@pytest.mark.parametrize(("field", "refused"), list(REFUSED.items()))
def test_responses_parameters_that_cannot_be_honoured_are_refused_saying_why(
    field: str, refused: tuple[Any, str]
) -> None:
    value, why = refused
    with pytest.raises(ValidationError) as caught:
        ResponsesRequest.model_validate({**BASE, field: value})
    error = _validation_error(RequestValidationError(caught.value.errors())).info  # the 400's
    assert error.param is not None and error.param.startswith(field) and why in error.message


def test_the_openai_clients_responses_parameters_are_all_listed_here() -> None:
    keys = ResponseCreateParamsBase.__required_keys__ | ResponseCreateParamsBase.__optional_keys__
    assert keys - BASE.keys() <= ACCEPTED.keys()


def test_honoured_parameters_reach_the_chat_request() -> None:
    request = ResponsesRequest.model_validate({
        **BASE, "truncation": "auto", "include": ["message.output_text.logprobs"],
        "max_tool_calls": 2, "reasoning": {"effort": "none"}, "prompt_cache_key": "k",
        "tool_choice": "required",
    })  # fmt: skip
    chat = request.as_chat()
    assert chat.truncate_prompt_tokens == -1 and chat.num_logprobs == 0
    assert chat.tool_call_limit == 2 and chat.prompt_cache_key == "k"
    assert chat.template_args().kwargs["enable_thinking"] is False
    assert ResponsesRequest.model_validate({**BASE, "top_logprobs": 3}).as_chat().num_logprobs == 3
    assert ResponsesRequest.model_validate(BASE).as_chat().num_logprobs is None
    single = ResponsesRequest.model_validate({**BASE, "max_tool_calls": 3,
                                              "parallel_tool_calls": False})  # fmt: skip
    assert single.as_chat().tool_call_limit == 1
    none = ResponsesRequest.model_validate({**BASE, "max_tool_calls": 0}).as_chat()
    assert none.tool_choice == "none"
    with pytest.raises(ValidationError, match="max_tool_calls: 0 allows no call"):
        ResponsesRequest.model_validate({**BASE, "max_tool_calls": 0, "tool_choice": "required"})


def test_items_sent_back_ignore_the_fields_a_client_adds() -> None:
    request = ResponsesRequest.model_validate({**BASE, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hi", "cache_control": {}}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}",
         "provider_specific_fields": None},
        {"type": "function_call_output", "call_id": "c1", "output": "ok", "extra": 1},
    ]})  # fmt: skip
    assert [m.role for m in request.as_chat().messages] == ["user", "assistant", "tool"]


def test_the_texts_logprobs_are_those_of_its_tokens() -> None:
    def scored(token: str) -> ChatTokenLogprob:
        return ChatTokenLogprob(token=token, logprob=-1.0, bytes=[], top_logprobs=[])

    tokens = ChatLogprobs(content=[scored(t) for t in ("<think>", "hm", "</think>", "Hi", "!")])
    picked = _logprobs_of("Hi!", "<think>hm</think>Hi!", tokens)
    assert [entry.token for entry in picked] == ["Hi", "!"]
    assert _logprobs_of("Hi", "Hi", None) == []
