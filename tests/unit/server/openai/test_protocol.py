"""Request bodies: explicit nulls, vLLM's extra parameters, and what is refused and why."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from openai.types.chat.completion_create_params import CompletionCreateParamsBase
from pydantic import BaseModel, ValidationError

from infer.server.http.errors import _validation_error
from infer.server.http.responses import ResponsesRequest
from infer.server.openai.protocol import (
    UNSUPPORTED_FIELDS,
    ChatCompletionRequest,
    CompletionRequest,
    StreamOptions,
    TokenizeChatRequest,
    _Request,
)

QUESTION = [{"role": "user", "content": "hi"}]
REQUIRED: dict[type[BaseModel], dict[str, Any]] = {
    CompletionRequest: {"prompt": "hi"},
    ChatCompletionRequest: {"messages": QUESTION},
    TokenizeChatRequest: {"messages": QUESTION},
    ResponsesRequest: {"input": "hi"},
}
# Where null has a meaning of its own: a completion's max_tokens (no limit, as in vLLM).
NULL_IS_A_VALUE = {(CompletionRequest, "max_tokens")}


@pytest.mark.parametrize("model", list(REQUIRED))
def test_null_is_the_default_for_every_optional_field(model: type[BaseModel]) -> None:
    default = model.model_validate(REQUIRED[model])
    optional = [
        (name, info.alias or name)
        for name, info in model.model_fields.items()
        if not info.is_required() and (model, name) not in NULL_IS_A_VALUE
    ]
    assert len(optional) > 5
    for name, key in optional:
        given = model.model_validate({**REQUIRED[model], key: None})
        assert getattr(given, name) == getattr(default, name), name


def test_null_is_the_default_in_nested_objects_too() -> None:
    request = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "hi", "name": None, "tool_calls": None}],
        "stream": True,
        "stream_options": {"include_usage": None, "continuous_usage_stats": None},
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "x", "schema": {}, "strict": None}},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": None}}],
    })  # fmt: skip
    assert request.stream_options == StreamOptions()
    assert request.tools is not None and request.tools[0].function.parameters is None


def test_a_required_field_stays_required_when_null() -> None:
    with pytest.raises(ValidationError, match="prompt"):
        CompletionRequest.model_validate({"prompt": None})


def test_null_max_tokens_of_a_completion_means_no_limit_as_in_vllm() -> None:
    assert CompletionRequest.model_validate({"prompt": "hi"}).max_tokens == 16
    assert CompletionRequest.model_validate({"prompt": "hi", "max_tokens": None}).max_tokens is None


HARMLESS = [("echo", False), ("priority", 0), ("length_penalty", 1.0), ("length_penalty", 1),
            ("spaces_between_special_tokens", False), ("spaces_between_special_tokens", True),
            ("bad_words", []), ("use_beam_search", False), ("prompt_logprobs", None),
            ("best_of", 1), ("suffix", "")]  # fmt: skip
REFUSED = [("priority", 1), ("priority", False), ("length_penalty", 0.5),
           ("bad_words", ["darn"]), ("best_of", True), ("use_beam_search", True),
           ("suffix", "!"), ("spaces_between_special_tokens", "no")]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), HARMLESS)
def test_unsupported_fields_asking_for_what_the_server_does_pass(field: str, value: Any) -> None:
    CompletionRequest.model_validate({"prompt": "hi", field: value})


@pytest.mark.parametrize(("field", "value"), REFUSED)
def test_other_values_are_refused_as_unsupported(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        CompletionRequest.model_validate({"prompt": "hi", field: value})
    assert caught.value.errors()[0]["loc"] == (field,)
    assert field in UNSUPPORTED_FIELDS  # the 400 says why (errors.py reads the reason)


@pytest.mark.parametrize(("field", "value"), [("echo", True), ("prompt_logprobs", 1)])
def test_the_prompts_scores_are_refused_on_chat(field: str, value: Any) -> None:
    CompletionRequest.model_validate({"prompt": "hi", field: value})
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate({"messages": QUESTION, field: value})
    assert caught.value.errors()[0]["loc"] == (field,)


def test_every_unsupported_field_says_what_to_do_instead() -> None:
    for field in ("echo", "prompt_logprobs", "bad_words", "priority", "length_penalty",
                  "suffix", "verbosity", "moderation"):  # fmt: skip
        reason = UNSUPPORTED_FIELDS[field].reason
        assert reason != "unknown field" and ("(" in reason or ":" in reason), field


@pytest.mark.parametrize(
    ("field", "value", "grammar"),
    [
        ("guided_choice", ["yes", "no"], 'start: "yes" | "no"'),
        ("guided_regex", "[0-9]+", "[0-9]+"),
        ("guided_json", {"type": "object"}, "json_schema"),
        ("guided_grammar", 'start: "x"', 'start: "x"'),
        ("allowed_token_ids", [7, 3, 7], "start: <[3,7]>*"),
    ],
)
def test_legacy_guided_fields_and_allowed_token_ids_constrain_the_output(
    field: str, value: Any, grammar: str
) -> None:
    request = ChatCompletionRequest.model_validate({"messages": QUESTION, field: value})
    constraint = request.constraint()
    assert constraint is not None and grammar in constraint.compiled_grammar


def test_one_constraint_per_request() -> None:
    request = ChatCompletionRequest.model_validate(
        {"messages": QUESTION, "guided_regex": "a", "structured_outputs": {"choice": ["b"]}}
    )
    with pytest.raises(ValueError, match=r"^guided_regex: cannot be combined with structured"):
        request.constraint()
    bad = ChatCompletionRequest.model_validate({"messages": QUESTION, "guided_json": "{"})
    with pytest.raises(ValueError, match=r"^guided_json: "):
        bad.constraint()


def test_chat_template_parameters_reach_the_template_arguments() -> None:
    request = ChatCompletionRequest.model_validate({
        "messages": [*QUESTION, {"role": "assistant", "content": "The answer is"}],
        "chat_template_kwargs": {"enable_thinking": False},
        "add_generation_prompt": False, "continue_final_message": True,
        "documents": [{"title": "a", "text": "b"}],
    })  # fmt: skip
    args = request.template_args()
    assert args.kwargs == {"enable_thinking": False} and args.continue_final_message
    assert not args.add_generation_prompt and args.documents == [{"title": "a", "text": "b"}]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"continue_final_message": True}, "continue_final_message: cannot be combined"),
        ({"continue_final_message": True, "add_generation_prompt": False},
         "continue_final_message: the last message must be the assistant's"),
        ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs: tools cannot be set"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens: must be -1 or at least 1"),
    ],
)  # fmt: skip
def test_inconsistent_chat_parameters_are_refused_by_name(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        ChatCompletionRequest.model_validate({"messages": QUESTION, **fields})


def test_truncation_keeps_the_last_tokens_that_fit() -> None:
    request = CompletionRequest.model_validate({"prompt": "hi", "truncate_prompt_tokens": -1})
    assert request.keep_last_tokens(max_seq_len=100, max_tokens=30) == 70
    assert request.keep_last_tokens(max_seq_len=100, max_tokens=None) == 99
    five = CompletionRequest.model_validate({"prompt": "hi", "truncate_prompt_tokens": 5})
    assert five.keep_last_tokens(max_seq_len=100, max_tokens=30) == 5


def test_continuous_usage_needs_include_usage() -> None:
    def request(**options: bool) -> CompletionRequest:
        return CompletionRequest.model_validate(
            {"prompt": "hi", "stream": True, "stream_options": options}
        )

    assert request(include_usage=True, continuous_usage_stats=True).continuous_usage
    assert not request(continuous_usage_stats=True).continuous_usage


def test_a_responses_request_becomes_a_chat_request() -> None:
    request = ResponsesRequest.model_validate({
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "c1", "name": "weather",
             "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "And "}, {"type": "input_text",
                                                                  "text": "Lyon?"}]},
        ],
        "instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0,
        "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "weather"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
    })  # fmt: skip
    chat = request.as_chat()
    assert [m.for_template() for m in chat.messages] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        {"role": "user", "content": "And Lyon?"},
    ]  # fmt: skip
    assert chat.requested_max_tokens == 9 and chat.temperature == 0
    assert chat.forces_tool_call and chat.tools is not None
    assert chat.response_format is not None and chat.response_format.json_schema is not None


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"store": True}, "store"), ({"previous_response_id": "resp_1"}, "previous_response_id")],
)
def test_a_stateless_server_refuses_what_needs_stored_responses(
    fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(ValidationError, match=f"{param}: this server keeps no responses"):
        ResponsesRequest.model_validate({"input": "hi", **fields})
    ResponsesRequest.model_validate({"input": "hi", "store": False})


def _bad_request(body: dict[str, Any]) -> dict[str, Any]:
    """The 400 body a client gets for a chat request (``errors.py`` names the field)."""
    with pytest.raises(ValidationError) as refused:
        ChatCompletionRequest.model_validate(body)
    return json.loads(_validation_error(RequestValidationError(refused.value.errors())).json())


def test_an_assistant_turn_sent_back_as_received_renders_what_it_said() -> None:
    received = {  # openai's ChatCompletionMessage.model_dump(), tool calls joined from deltas
        "role": "assistant", "content": None, "refusal": None, "annotations": [],
        "audio": None, "function_call": None, "reasoning_content": "Weather needs a tool.",
        "tool_calls": [{"index": 0, "id": "c1", "type": "function",
                        "function": {"name": "weather", "arguments": "{}"}}],
    }  # fmt: skip
    refused = {"role": "assistant", "content": None, "refusal": "I cannot help with that."}
    request = ChatCompletionRequest.model_validate({"messages": [*QUESTION, received, refused]})
    assert [m.for_template() for m in request.messages[1:]] == [
        {"role": "assistant", "content": "", "reasoning_content": "Weather needs a tool.",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "weather", "arguments": "{}"}}]},
        {"role": "assistant", "content": "I cannot help with that."},
    ]  # fmt: skip


def test_text_and_refusal_parts_are_joined_and_caching_hints_ignored() -> None:
    parts = [
        {"type": "text", "text": "Sure: ", "cache_control": {"type": "ephemeral"}},
        {"type": "refusal", "refusal": "no."},
    ]
    request = ChatCompletionRequest.model_validate(
        {"messages": [*QUESTION, {"role": "assistant", "content": parts}]}
    )
    assert request.messages[1].for_template() == {"role": "assistant", "content": "Sure: no."}


@pytest.mark.parametrize("kind", ["image_url", "input_audio", "file"])
def test_a_part_this_server_cannot_read_is_refused_by_its_type(kind: str) -> None:
    parts = [{"type": "text", "text": "What is this?"}, {"type": kind, kind: {"url": "x"}}]
    error = _bad_request({"messages": [{"role": "user", "content": parts}]})["error"]
    assert error["param"] == "messages.0.content.1"
    assert error["message"].startswith(f"messages.0.content.1: {kind} content parts are not")


def test_audio_this_server_never_returned_is_refused() -> None:
    turn = {"role": "assistant", "content": "hi", "audio": {"id": "audio_1"}}
    error = _bad_request({"messages": [*QUESTION, turn]})["error"]
    assert error["param"] == "messages.1.audio"


# --- what clients add, what OpenAI's reference takes ---------------------------------------
def test_fields_a_client_library_adds_to_messages_are_ignored_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent_back = {  # litellm's message, as its loops append it (a tool call's fields too)
        "role": "assistant", "content": "Paris.", "function_call": None,
        "provider_specific_fields": {"refusal": None}, "thinking_blocks": None,
        "tool_calls": [{"id": "c1", "type": "function", "provider_specific_fields": {},
                        "function": {"name": "f", "arguments": "{}", "extra": 1}}],
    }  # fmt: skip
    user = {"role": "user", "content": [{"type": "text", "text": "hi", "annotations": []}]}
    with caplog.at_level(logging.DEBUG, logger="infer.server.openai.protocol"):
        request = ChatCompletionRequest.model_validate({"messages": [user, sent_back]})
    assert request.messages[1].for_template()["content"] == "Paris."
    assert "provider_specific_fields" in caplog.text and "thinking_blocks" in caplog.text
    assert "annotations" in caplog.text and "extra" in caplog.text
    with pytest.raises(ValidationError, match="provider_specific_fields"):  # not at the top
        ChatCompletionRequest.model_validate({"messages": [user], "provider_specific_fields": {}})
    with pytest.raises(ValidationError, match="function_call"):  # a legacy call is no extra
        ChatCompletionRequest.model_validate(
            {"messages": [{**sent_back, "function_call": {"name": "f", "arguments": "{}"}}]}
        )


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CHAT_BASE: dict[str, Any] = {
    "messages": QUESTION, "model": "m", "tools": [TOOL], "logprobs": True, "stream": True,
}  # fmt: skip
# One value of every parameter of OpenAI's chat completions reference, accepted...
CHAT_ACCEPTED: dict[str, Any] = {
    "audio": None, "frequency_penalty": 0.5, "function_call": "none", "functions": [],
    "logit_bias": {"1": 1}, "max_completion_tokens": 5, "max_tokens": 5,
    "metadata": {"k": "v"}, "modalities": ["text"], "moderation": None, "n": 1,
    "parallel_tool_calls": False, "prediction": {"type": "content", "content": "Paris"},
    "presence_penalty": 0.1, "prompt_cache_key": "k",
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
    "prompt_cache_retention": "24h", "reasoning_effort": "low",
    "response_format": {"type": "json_object"}, "safety_identifier": "u1", "seed": 1,
    "service_tier": "priority", "stop": ["x"], "store": False,
    "stream_options": {"include_usage": True, "include_obfuscation": False},
    "temperature": 0, "tool_choice": "required", "top_logprobs": 2, "top_p": 0.5,
    "user": "u", "verbosity": "medium", "web_search_options": None,
}  # fmt: skip
# ... and the values refused, with why (the README's table says the same)
CHAT_REFUSED: dict[str, tuple[Any, str]] = {
    "audio": ({"voice": "alloy", "format": "mp3"}, "audio output is not supported"),
    "functions": ([{"name": "f"}], "use tools and tool_choice"),
    "function_call": ({"name": "f"}, "use tools and tool_choice"),
    "modalities": (["text", "audio"], "only text output"),
    "moderation": ({"model": "omni-moderation-latest"}, "no moderation model"),
    "prompt_cache_options": ({"prewarm": True}, "prompt_cache_options.prewarm"),
    "store": (True, "stored completions are not supported"),
    "verbosity": ("low", "no verbosity setting"),
    "web_search_options": ({}, "web search is not supported"),
    "tools": ([{"type": "custom", "custom": {"name": "f"}}], "custom tools are not supported"),
}


@pytest.mark.parametrize(("field", "value"), list(CHAT_ACCEPTED.items()))
def test_every_chat_parameter_of_openai_is_accepted(field: str, value: Any) -> None:
    ChatCompletionRequest.model_validate({**CHAT_BASE, field: value})


@pytest.mark.parametrize(("field", "refused"), list(CHAT_REFUSED.items()))
def test_chat_parameters_that_cannot_be_honoured_are_refused_saying_why(
    field: str, refused: tuple[Any, str]
) -> None:
    value, why = refused
    error = _bad_request({**CHAT_BASE, field: value})["error"]
    assert error["param"].startswith(field) and why in error["message"]


def test_the_openai_clients_chat_parameters_are_all_listed_here() -> None:
    """A new parameter in the installed ``openai`` client fails here until it is handled."""
    keys = (
        CompletionCreateParamsBase.__required_keys__ | CompletionCreateParamsBase.__optional_keys__
    )
    assert keys - CHAT_BASE.keys() <= CHAT_ACCEPTED.keys()


def test_instructors_response_format_schema_constrains_the_output() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    request = ChatCompletionRequest.model_validate(
        {"messages": QUESTION, "response_format": {"type": "json_object", "schema": schema}}
    )
    constraint = request.constraint()
    assert constraint is not None and constraint.json == schema
    assert request.constraint_field == "response_format.schema"
    with pytest.raises(
        ValidationError, match=r"response_format\.schema: only with type json_object"
    ):
        ChatCompletionRequest.model_validate(
            {"messages": QUESTION, "response_format": {"type": "text", "schema": schema}}
        )


def test_reasoning_effort_reaches_the_template_and_none_switches_thinking_off() -> None:
    low = ChatCompletionRequest.model_validate({"messages": QUESTION, "reasoning_effort": "low"})
    assert low.template_args().kwargs == {"reasoning_effort": "low"}
    none = ChatCompletionRequest.model_validate({"messages": QUESTION, "reasoning_effort": "none"})
    assert none.template_args().kwargs == {"reasoning_effort": "none", "enable_thinking": False}
    kept = ChatCompletionRequest.model_validate({
        "messages": QUESTION, "reasoning_effort": "none",
        "chat_template_kwargs": {"enable_thinking": True},
    })  # fmt: skip
    assert kept.template_args().kwargs["enable_thinking"] is True


def test_metadata_keeps_openais_bounds() -> None:
    ChatCompletionRequest.model_validate({"messages": QUESTION, "metadata": {}})
    error = _bad_request({"messages": QUESTION, "metadata": {str(i): "v" for i in range(17)}})
    assert error["error"]["param"] == "metadata"


def test_cache_salt_reaches_the_engine_from_every_generation_endpoint() -> None:
    """vLLM's ``cache_salt`` (one per tenant: ``cache/prefix.py``)."""
    salt = {"cache_salt": "tenant-a"}
    completion = CompletionRequest.model_validate({"prompt": "hi", **salt})
    chat = ChatCompletionRequest.model_validate({"messages": QUESTION, **salt})
    response = ResponsesRequest.model_validate({"input": "hi", **salt}).as_chat()
    for request in (completion, chat, response):
        assert request.sampling_params(4, None, None).cache_salt == "tenant-a"
    with pytest.raises(ValidationError, match="cache_salt"):
        CompletionRequest.model_validate({"prompt": "hi", "cache_salt": ""})


def _compiled_schema(request: ChatCompletionRequest) -> dict[str, Any]:
    constraint = request.constraint()
    assert constraint is not None
    schema: dict[str, Any] = json.loads(constraint.compiled_grammar)["grammars"][0]["json_schema"]
    return schema


@pytest.mark.parametrize("strict", [True, False, None])
def test_strict_schemas_name_every_property_an_object_may_have(strict: bool | None) -> None:
    """OpenAI's strict mode (``strict_schema.py``), on a response format and on a forced
    call of a function tool."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    formatted = ChatCompletionRequest.model_validate({"messages": QUESTION, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict},
    }})  # fmt: skip
    function = {"name": "f", "parameters": schema, "strict": strict}
    called = ChatCompletionRequest.model_validate({
        "messages": QUESTION, "tools": [{"type": "function", "function": function}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    })  # fmt: skip
    for request in (formatted, called):
        closed = _compiled_schema(request).get("additionalProperties") is False
        assert closed == bool(strict)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "tool", "content": "sunny", "tool_call_id": "c1"}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
         {"role": "tool", "content": "sunny", "tool_call_id": "c1"}],
        [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
         {"role": "user", "content": "and?"}, {"role": "tool", "content": "late"}],
    ],
)  # fmt: skip
def test_a_tool_message_without_a_call_before_it_is_refused(
    messages: list[dict[str, Any]],
) -> None:
    with pytest.raises(ValidationError) as refused:
        ChatCompletionRequest.model_validate({"messages": messages})
    error = _validation_error(RequestValidationError(refused.value.errors()))
    assert error.info.param == f"messages.{len(messages) - 1}.role"


def test_tool_messages_answering_calls_pass() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ChatCompletionRequest.model_validate({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call, {**call, "id": "c2"}]},
        {"role": "tool", "content": "one", "tool_call_id": "c1"},
        {"role": "tool", "content": "two", "tool_call_id": "c2"},
    ]})  # fmt: skip


def test_a_completions_prompt_scores_are_in_its_parameters_as_made() -> None:
    """``prompt_logprobs`` (or ``logprobs`` for an echo) is given when the parameters are
    made, so they are validated once, as they would be if set afterwards."""
    for fields, expected in [({}, None), ({"prompt_logprobs": 2}, 2),
                             ({"echo": True, "logprobs": 3, "prompt_logprobs": 1}, 3)]:  # fmt: skip
        request = CompletionRequest.model_validate({"prompt": "hi", **fields})
        made = request.sampling_params(4, request.logprobs, None, request.num_prompt_logprobs)
        assert made.prompt_logprobs == expected
        plain = request.sampling_params(4, request.logprobs, None)
        assert made == replace(plain, prompt_logprobs=expected)


def test_every_request_models_field_names_are_kept_as_pydantic_has_them() -> None:
    """``_Request._names``, read instead of ``model_fields`` for each key validated."""
    models, seen = [_Request], []
    while models:
        model = models.pop()
        seen.append(model)
        assert model._names == frozenset(model.model_fields), model
        models.extend(model.__subclasses__())
    assert {CompletionRequest, ChatCompletionRequest, ResponsesRequest} <= set(seen)
