"""Real clients, unchanged, against a real server on the embedded model: the official
``openai`` client (sync, async, streams, ``parse``, tools, ``responses.create``,
``models.retrieve``), LangChain's ``ChatOpenAI`` (invoke, stream, batch, ``bind_tools``,
``with_structured_output``), litellm (chat and tool loops that append the message it
returned), instructor (TOOLS, JSON_SCHEMA, Partial) and the OpenAI Agents SDK (a tool round
trip through its Chat Completions and Responses models, streamed and not). What each client
sees is checked, not only that it ran.

The client libraries are the dev extras: without them the module is skipped. litellm and the
Agents SDK take seconds to import, so only the tests that use them do."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import json
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

import openai
import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_openai")
instructor = pytest.importorskip("instructor")
for _library in ("litellm", "agents"):  # found here, imported by the tests that use them
    if importlib.util.find_spec(_library) is None:
        pytest.skip(f"{_library} is not installed (the dev extras)", allow_module_level=True)

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from pydantic import BaseModel, ConfigDict  # noqa: E402

T = TypeVar("T")
MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


class City(BaseModel):
    # Strings: greedy SmolLM2 writes an integer's digits until max_tokens.
    name: str
    country: str


def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@pytest.fixture(scope="module")
def chat_model(url: str) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{url}/v1", api_key="unused", model=MODEL, temperature=0, max_tokens=24,
        max_retries=0, timeout=300,
    )  # fmt: skip


def roomier(chat_model: ChatOpenAI) -> ChatOpenAI:
    """The model with room for a tool call's or a JSON object's tokens."""
    return chat_model.model_copy(update={"max_tokens": 48})


def after_first_use(call: Callable[[], T]) -> T:
    """``call()``, run a second time: its first run compiles the grammar of its schema, and
    a grammar's first use can still sample a token outside it (issue 40, fixed apart from
    this suite), so only the second run is checked."""
    with contextlib.suppress(Exception):
        call()
    return call()


# --- openai --------------------------------------------------------------------------------
def test_openai_models_list_and_retrieve(client: openai.OpenAI) -> None:
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.object == "model"
    assert [m.id for m in client.models.list().data] == [MODEL]
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o")
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_openai_sync_and_streamed_chat_agree(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=8,
        temperature=0,  # type: ignore[arg-type]
    )
    text = whole.choices[0].message.content
    assert text and "Paris" in text
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=8, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage is not None and whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_openai_async_client_runs_requests_at_once(url: str) -> None:
    async def ask_all() -> list[str]:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused") as client:
            replies = await asyncio.gather(*(
                client.completions.create(model=MODEL, prompt=prompt, max_tokens=4,
                                          temperature=0)
                for prompt in ("The capital of France is", "One, two,", "Hello")
            ))  # fmt: skip
            stream = await client.completions.create(
                model=MODEL, prompt="One, two,", max_tokens=4, temperature=0, stream=True
            )
            streamed = "".join([c.choices[0].text async for c in stream])
        return [r.choices[0].text for r in replies] + [streamed]

    texts = asyncio.run(ask_all())
    assert all(texts) and texts[1] == texts[3]


def test_openai_parse_returns_the_pydantic_model(client: openai.OpenAI) -> None:
    completion = after_first_use(lambda: client.beta.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        max_tokens=40, response_format=City, temperature=0,
    ))  # fmt: skip
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, City) and parsed.name


def test_openai_forced_and_named_tool_calls(client: openai.OpenAI) -> None:
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        response = after_first_use(lambda choice=choice: client.chat.completions.create(  # type: ignore[misc]
            model=MODEL, messages=question, tools=[WEATHER], tool_choice=choice,  # type: ignore[arg-type]
            max_tokens=40, temperature=0,
        ))  # fmt: skip
        message = response.choices[0].message
        assert message.tool_calls, choice
        call = message.tool_calls[0]
        assert call.function.name == "get_weather"  # type: ignore[union-attr]
        assert set(json.loads(call.function.arguments)) == {"city"}  # type: ignore[union-attr]
        assert response.choices[0].finish_reason == "tool_calls"


def _streamed_message(client: openai.OpenAI, **request: Any) -> dict[str, Any]:
    """The assistant message an agent framework builds from a stream: deltas joined, each
    tool call's ``index`` kept (as ``ChoiceDeltaToolCall.model_dump()`` gives it). A forced
    call streams as OpenAI's do: no content, not even empty (the Agents SDK would record an
    empty message), then each call's id and name, then its arguments in pieces."""
    message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": []}
    pieces = 0
    for chunk in client.chat.completions.create(**request, stream=True):
        delta = chunk.choices[0].delta
        assert delta.content is None or request.get("tool_choice") != "required"
        if delta.content:
            message["content"] = (message["content"] or "") + delta.content
        for piece in delta.tool_calls or []:
            calls = message["tool_calls"]
            if piece.index == len(calls):
                assert piece.id and piece.function and piece.function.name
                calls.append(piece.model_dump())
            else:
                assert piece.id is None
                function = calls[piece.index]["function"]
                function["arguments"] += piece.function.arguments or ""  # type: ignore[union-attr]
                pieces += 1
    if message["tool_calls"] and chunk.choices[0].finish_reason == "tool_calls":
        assert pieces > len(message["tool_calls"])  # the arguments came in several pieces
    return message


def test_openai_agent_loop_sends_back_what_it_received(client: openai.OpenAI) -> None:
    """Three tool rounds, each answer appended as the client returned it (``model_dump()``
    with ``refusal``, ``annotations``, ``audio``, ``function_call``; ``index`` in the
    streamed round's calls), then a final answer over the whole conversation."""
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced: dict[str, Any] = dict(
        model=MODEL, tools=[WEATHER], tool_choice="required", max_tokens=40, temperature=0
    )
    after_first_use(lambda: client.chat.completions.create(messages=messages, **forced))
    for turn in range(3):
        if turn == 1:
            message = _streamed_message(client, messages=messages, **forced)
            assert message["tool_calls"] and message["tool_calls"][0]["index"] == 0
        else:
            received = client.chat.completions.create(messages=messages, **forced).choices[0]
            message = received.message.model_dump()
            assert {"refusal", "annotations", "audio", "function_call"} <= set(message)
        messages.append(message)
        for call in message["tool_calls"]:
            city = json.loads(call["function"]["arguments"])["city"]
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": get_weather(city)}
            )
    answer = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0
    )
    assert answer.choices[0].message.content
    assert sum(m["role"] == "tool" for m in messages) >= 3


def test_openai_responses_create_text_streamed_and_not(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL, input="What is the capital of France?", instructions="Answer briefly.",
        max_output_tokens=12, temperature=0,
    )  # fmt: skip
    assert response.object == "response" and response.status in ("completed", "incomplete")
    same_as_chat = client.chat.completions.create(
        model=MODEL, max_tokens=12, temperature=0,
        messages=[{"role": "system", "content": "Answer briefly."}, *QUESTION],  # type: ignore[list-item]
    )  # fmt: skip
    assert response.output_text == same_as_chat.choices[0].message.content
    assert response.usage is not None and response.usage.output_tokens <= 12
    events = list(
        client.responses.create(
            model=MODEL, input="What is the capital of France?", instructions="Answer briefly.",
            max_output_tokens=12, temperature=0, stream=True,
        )
    )  # fmt: skip
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == response.output_text
    assert events[-1].response.output_text == response.output_text  # type: ignore[union-attr]


def test_openai_responses_with_tools_and_a_json_schema(client: openai.OpenAI) -> None:
    tool = {"type": "function", **WEATHER["function"]}
    called = after_first_use(lambda: client.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=[tool],  # type: ignore[list-item]
        tool_choice="required", max_output_tokens=40, temperature=0,
    ))  # fmt: skip
    calls = [item for item in called.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    answered = client.responses.create(
        model=MODEL, temperature=0, max_output_tokens=24, tools=[tool],  # type: ignore[list-item]
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
             "arguments": calls[0].arguments},
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"},
        ],
    )  # fmt: skip
    assert answered.output_text
    schema = {**City.model_json_schema(), "additionalProperties": False}
    structured = after_first_use(lambda: client.responses.create(
        model=MODEL, input="Describe Paris as JSON.", max_output_tokens=40, temperature=0,
        text={"format": {"type": "json_schema", "name": "City", "schema": schema, "strict": True}},
    ))  # fmt: skip
    City.model_validate_json(structured.output_text)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model=MODEL, input="hi", previous_response_id=called.id)


# --- LangChain -----------------------------------------------------------------------------
def test_langchain_invoke_stream_and_batch(chat_model: ChatOpenAI) -> None:
    question = "What is the capital of France?"
    answer = chat_model.invoke(question)
    assert isinstance(answer, AIMessage) and "Paris" in str(answer.content)
    streamed = "".join(str(chunk.content) for chunk in chat_model.stream(question))
    assert streamed == answer.content
    batch = chat_model.batch([question, "Name a colour."])
    assert batch[0].content == answer.content and batch[1].content


def test_langchain_bind_tools_and_a_tool_round_trip(chat_model: ChatOpenAI) -> None:
    for choice in ("any", "get_weather"):
        with_tools = roomier(chat_model).bind_tools([get_weather], tool_choice=choice, strict=True)
        message = after_first_use(
            lambda tools=with_tools: tools.invoke("What is the weather in Paris?")
        )
        assert isinstance(message, AIMessage) and message.tool_calls, choice
        call = message.tool_calls[0]
        assert call["name"] == "get_weather" and set(call["args"]) == {"city"}
    reply = chat_model.bind_tools([get_weather]).invoke([
        HumanMessage("What is the weather in Paris?"),
        message,
        ToolMessage(get_weather(**call["args"]), tool_call_id=call["id"]),
    ])  # fmt: skip
    assert isinstance(reply, AIMessage)


@pytest.mark.parametrize(
    "options",
    [{}, {"method": "json_schema", "strict": True}, {"method": "function_calling", "strict": True}],
    ids=["default", "json_schema_strict", "function_calling_strict"],
)
def test_langchain_structured_output(chat_model: ChatOpenAI, options: dict[str, Any]) -> None:
    structured = roomier(chat_model).with_structured_output(City, **options)
    city = after_first_use(lambda: structured.invoke("Describe Paris as a city."))
    assert isinstance(city, City) and city.name


# --- what the clients of issue 55 found: tool calls as they stream, parameters, routes -----
def test_openai_a_forced_call_cut_off_by_max_tokens_is_a_partial_call(
    client: openai.OpenAI,
) -> None:
    forced: dict[str, Any] = dict(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER], tool_choice="required", max_tokens=14, temperature=0,
    )  # fmt: skip
    whole = client.chat.completions.create(**forced).choices[0]
    assert whole.finish_reason == "length" and whole.message.content is None
    assert whole.message.tool_calls and whole.message.tool_calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    cut = whole.message.tool_calls[0].function.arguments  # type: ignore[union-attr]
    assert cut.startswith("{") and not cut.endswith("}")  # the arguments, as far as written
    streamed = _streamed_message(client, **forced)
    assert streamed["content"] is None
    assert streamed["tool_calls"][0]["function"]["arguments"] == cut


def test_openai_current_parameters_are_accepted(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_completion_tokens=4, temperature=0,
        prompt_cache_key="geo", safety_identifier="user-1", verbosity=None, metadata={},
        service_tier="auto", store=False, reasoning_effort="low",
    )  # fmt: skip
    assert chat.choices[0].message.content
    response = client.responses.create(
        model=MODEL, input="What is the capital of France?", max_output_tokens=4,
        temperature=0, top_logprobs=2, include=["message.output_text.logprobs"],
        truncation="auto", max_tool_calls=1, background=False, metadata={"run": "1"},
        prompt_cache_key="geo", text={"verbosity": "medium"}, conversation=None, prompt=None,
    )  # fmt: skip
    text = response.output[0].content[0]  # type: ignore[union-attr]
    assert text.logprobs and len(text.logprobs[0].top_logprobs) == 2  # type: ignore[union-attr]
    assert response.metadata == {"run": "1"} and response.prompt_cache_key == "geo"
    assert response.truncation == "auto" and response.top_logprobs == 2


def test_openai_embeddings_say_this_model_does_not_serve_them(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="embeddings are not served by this model"):
        client.embeddings.create(model=MODEL, input="hi")


# --- litellm ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def litellm() -> ModuleType:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import
    module = importlib.import_module("litellm")
    module.telemetry = False
    module.suppress_debug_info = True
    return module


def test_litellm_multi_turn_chat_appends_the_returned_message(
    litellm: ModuleType, url: str
) -> None:
    """Each answer appended as litellm returned it; the second as litellm before 1.8x sent
    it back, with ``provider_specific_fields`` (which a strict server refused)."""
    ask = dict(model=f"openai/{MODEL}", api_base=f"{url}/v1", api_key="unused",
               max_tokens=8, temperature=0)  # fmt: skip
    messages: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
    first = litellm.completion(messages=messages, **ask).choices[0].message
    assert "Paris" in first.content
    messages += [first, {"role": "user", "content": "And of Italy?"}]
    second = litellm.completion(messages=messages, **ask).choices[0].message
    assert second.content
    sent_back = {**second.model_dump(), "provider_specific_fields": {"refusal": None}}
    messages += [sent_back, {"role": "user", "content": "And of Spain?"}]
    chunks = list(litellm.completion(messages=messages, stream=True, **ask))
    streamed = litellm.stream_chunk_builder(chunks, messages=messages).choices[0].message
    assert streamed.content


def test_litellm_tool_loop_appends_the_returned_message(litellm: ModuleType, url: str) -> None:
    ask = dict(model=f"openai/{MODEL}", api_base=f"{url}/v1", api_key="unused",
               tools=[WEATHER], temperature=0)  # fmt: skip
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    for stream in (False, True):
        if stream:
            chunks = list(litellm.completion(messages=messages, tool_choice="required",
                                             max_tokens=40, stream=True, **ask))  # fmt: skip
            message = litellm.stream_chunk_builder(chunks, messages=messages).choices[0].message
        else:
            message = (
                litellm.completion(messages=messages, tool_choice="required", max_tokens=40, **ask)
                .choices[0]
                .message
            )
        assert message.tool_calls and message.tool_calls[0].function.name == "get_weather"
        messages.append(message)
        for call in message.tool_calls:
            city = json.loads(call.function.arguments)["city"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": get_weather(city)})
    answer = litellm.completion(messages=messages, max_tokens=2, **ask).choices[0].message
    assert answer.content or answer.tool_calls  # the history it sent back was taken


# --- instructor ------------------------------------------------------------------------------
class Place(BaseModel):
    """A city as instructor asks for it: no other keys (SmolLM2 adds some where it may)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    country: str


def test_instructor_tools_and_json_schema_modes(client: openai.OpenAI) -> None:
    ask: dict[str, Any] = dict(
        model=MODEL, response_model=Place, max_tokens=40, temperature=0, max_retries=0,
        messages=[{"role": "user", "content": "Describe Paris."}],
    )  # fmt: skip
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        place = instructor.from_openai(client, mode=mode).chat.completions.create(**ask)
        assert isinstance(place, Place) and place.name, mode
    # instructor up to 1.3 sent JSON_SCHEMA mode's schema as response_format.schema
    schema = Place.model_json_schema()
    old = client.chat.completions.create(
        model=MODEL, messages=ask["messages"], max_tokens=40, temperature=0,
        response_format={"type": "json_object", "schema": schema},  # type: ignore[typeddict-unknown-key]
    )  # fmt: skip
    Place.model_validate_json(old.choices[0].message.content or "")


def test_instructor_partial_streams_a_growing_object(client: openai.OpenAI) -> None:
    structured = instructor.from_openai(client, mode=instructor.Mode.TOOLS)
    ask: dict[str, Any] = dict(
        model=MODEL, response_model=Place, max_tokens=40, temperature=0, max_retries=0,
        messages=[{"role": "user", "content": "Describe Paris."}],
    )  # fmt: skip
    partials = list(structured.chat.completions.create_partial(**ask))
    assert partials[-1].name and partials[-1].country
    assert any(p.name and not p.country for p in partials)  # the name came before the rest


# --- the OpenAI Agents SDK -------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["run", "streamed"])
@pytest.mark.parametrize("api", ["chat_completions", "responses"])
def test_agents_sdk_tool_round_trip(url: str, api: str, stream: bool) -> None:
    """The agent calls the tool (forced), gets its result, and answers (its tool choice
    reset to auto). Its first model response holds the call alone: no empty message."""
    agents = importlib.import_module("agents")
    agents.set_tracing_disabled(True)

    @agents.function_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return get_weather(city)

    async def run() -> Any:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        model_class = (
            agents.OpenAIChatCompletionsModel if api == "chat_completions"
            else agents.OpenAIResponsesModel
        )  # fmt: skip
        agent = agents.Agent(
            name="weather", instructions="Answer briefly.", tools=[weather],
            model=model_class(MODEL, client),
            model_settings=agents.ModelSettings(temperature=0, max_tokens=40,
                                                tool_choice="required"),
        )  # fmt: skip
        question = "What is the weather in Paris?"
        if not stream:
            return await agents.Runner.run(agent, question, max_turns=3)
        result = agents.Runner.run_streamed(agent, question, max_turns=3)
        async for _ in result.stream_events():
            pass
        return result

    result = asyncio.run(run())
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"]
    assert [item.type for item in result.raw_responses[0].output] == ["function_call"]
    assert "sunny in Paris" in str(result.new_items[1].output)
    assert result.final_output
