"""OpenAI request and response bodies (pydantic), as the official ``openai`` client sends
and parses them, plus vLLM's extra parameters (``top_k``, ``min_p``, ``chat_template_kwargs``,
``truncate_prompt_tokens``, the legacy ``guided_*`` constraints, ...).

Requests are strict (``"0.5"`` is not a number, ``1`` is not ``true``, ``Infinity`` is not a
number) and carry their ranges, so the OpenAPI document states them. ``null`` means "not
given" for every optional field, as in OpenAI's API (clients that serialise unset fields send
it). A request field the server does not honour is never ignored: ``UNSUPPORTED_FIELDS`` says
why it is refused and what to use instead, and any other unknown field is refused too (a 400
naming it). Messages are the exception: client libraries add fields of their own to the
messages they send back (litellm's ``provider_specific_fields``), so a message, a content part
or an earlier tool call ignores fields it does not know (logged at debug). Limits that depend
on the model (vocabulary, context) are checked by ``SamplingParams.check_for_model``.
"""

from __future__ import annotations

import logging
import time
import types
from dataclasses import dataclass, replace
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    model_validator,
)
from pydantic_core import PydanticCustomError

from infer.contract.errors import GrammarError
from infer.contract.sampling_params import MAX_LOGIT_BIAS, SamplingParams, StructuredOutputsParams
from infer.server.guards.request_limits import applied_limits
from infer.server.openai.strict_schema import strict_schema
from infer.tokenizer import ChatTemplateArgs

logger = logging.getLogger(__name__)

MAX_LOGPROBS = 20
MAX_STOP_TOKEN_IDS = 1024
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class Unsupported:
    """Why the server refuses a field, and the values it takes anyway because they ask for
    what it does regardless (``"store": false``)."""

    reason: str
    harmless: tuple[Any, ...] = ()


_LEGACY = "the legacy function-calling fields are not supported (use tools and tool_choice)"
_PROMPT_ONLY_ON_COMPLETIONS = (
    "not on chat completions (/v1/completions returns the prompt and its logprobs)"
)
# The one list of OpenAI and vLLM fields this server does not honour: why, and what to use
# instead. Remove an entry when its field is implemented (declared on a request model).
UNSUPPORTED_FIELDS: dict[str, Unsupported] = {
    "functions": Unsupported(_LEGACY, ([],)),
    "function_call": Unsupported(_LEGACY, ("none",)),
    "best_of": Unsupported("not supported (use n)", (1,)),
    "use_beam_search": Unsupported("beam search is not supported (use n)", (False,)),
    "length_penalty": Unsupported(
        "only beam search uses it, which this server does not do (omit it, or send 1)", (1, 1.0)
    ),
    "echo": Unsupported(_PROMPT_ONLY_ON_COMPLETIONS, (False,)),
    "prompt_logprobs": Unsupported(_PROMPT_ONLY_ON_COMPLETIONS),
    "suffix": Unsupported(
        "fill-in-the-middle is not supported (send the text before the gap as the prompt)", ("",)
    ),
    "bad_words": Unsupported(
        "not supported: it needs a logits processor this server does not have (ban single "
        'tokens with logit_bias, e.g. {"1234": -100}, or constrain the output with '
        "structured_outputs)",
        ([],),
    ),
    "priority": Unsupported(
        "this server schedules first come, first served (omit it, or send 0)", (0,)
    ),
    # vLLM's fast-tokenizer detokenizer (every model here has a fast tokenizer) ignores it
    # too: either value gives the same text.
    "spaces_between_special_tokens": Unsupported("must be a boolean", (True, False)),
    "modalities": Unsupported("only text output is supported", (["text"],)),
    "audio": Unsupported("audio output is not supported"),
    "store": Unsupported("stored completions are not supported", (False,)),
    # Taken by chat completions and the Responses API (declared there), not by completions:
    "service_tier": Unsupported("a chat completions field", ("auto", "default")),
    "metadata": Unsupported("a chat completions field"),
    "prediction": Unsupported("a chat completions field"),
    "web_search_options": Unsupported("web search is not supported"),
    "moderation": Unsupported("this server runs no moderation model (moderate apart)"),
    # the Responses API's
    "context_management": Unsupported(
        "this server does not compact conversations (send what fits, or truncation: auto)", ([],)
    ),
    "background_options": Unsupported(
        "only for background responses, which this server does not keep (send background false)"
    ),
    "verbosity": Unsupported(  # also the Responses API's text.verbosity
        "the model has no verbosity setting (ask for shorter or longer answers in the "
        'prompt, or omit it; "medium", the default, is accepted)',
        ("medium",),
    ),
}


def unsupported_reason(field: str) -> str:
    """Why an unknown field is refused (the message of its 400)."""
    known = UNSUPPORTED_FIELDS.get(field)
    return known.reason if known is not None else "unknown field"


def _harmless(field: str, value: Any) -> bool:
    """Whether an unsupported field's value asks for what the server does anyway (``null``
    or a listed value of the same type: ``true`` is not ``1``)."""
    return value is None or any(
        type(value) is type(allowed) and value == allowed
        for allowed in UNSUPPORTED_FIELDS[field].harmless
    )


def _admits_none(annotation: Any) -> bool:
    if annotation is None or annotation is type(None):
        return True
    union = get_origin(annotation) in (Union, types.UnionType)
    return union and any(_admits_none(arg) for arg in get_args(annotation))


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
    # Keys (as clients spell them) of optional fields whose type has no ``null``: a
    # ``null`` there means "not given", so it is dropped and the default applies.
    _null_means_default: ClassVar[frozenset[str]] = frozenset()
    _keys: ClassVar[frozenset[str]] = frozenset()  # of every field, as clients spell them
    # ``model_fields``' names, read for each key of each body and message validated: the
    # class property costs a descriptor call at each reading (~0.3 us against ~0.08).
    _names: ClassVar[frozenset[str]] = frozenset()
    # Unknown fields are dropped (logged at debug) rather than refused: messages and their
    # parts, which clients send back with fields of their own.
    _ignores_unknown_fields: ClassVar[bool] = False

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._null_means_default = frozenset(
            info.alias or name
            for name, info in cls.model_fields.items()
            if not info.is_required() and not _admits_none(info.annotation)
        )
        cls._keys = frozenset(info.alias or name for name, info in cls.model_fields.items())
        cls._names = frozenset(cls.model_fields)

    @model_validator(mode="before")
    @classmethod
    def _drop_defaults(cls, data: Any) -> Any:
        """``null`` for an optional field is its default. Unsupported fields that ask for the
        default (``null`` or a harmless value) pass; any other value of them is refused
        (``UNSUPPORTED_FIELDS`` says why)."""
        if not isinstance(data, dict):
            return data
        kept = {
            name: value
            for name, value in data.items()
            if not (value is None and name in cls._null_means_default)
            and (name in cls._names or name not in UNSUPPORTED_FIELDS or not _harmless(name, value))
        }
        if cls._ignores_unknown_fields:
            kept = cls._without_unknown_fields(kept)
        return kept

    @classmethod
    def _without_unknown_fields(cls, data: dict[str, Any]) -> dict[str, Any]:
        ignored = sorted(
            name for name in data if name not in cls._keys and name not in _SAID_OF_A_MESSAGE
        )
        if not ignored:
            return data
        logger.debug("%s: ignored fields %s", cls.__name__, ", ".join(ignored))
        return {name: value for name, value in data.items() if name not in ignored}


# Unsupported fields that say something of a message (a legacy function call, an earlier
# audio answer): refused there when set, as at the top of a request (``UNSUPPORTED_FIELDS``).
_SAID_OF_A_MESSAGE = frozenset({"function_call", "audio"})


class _Lenient(_Request):
    """A message or a part of one: fields a client added are ignored (``_Request``)."""

    _ignores_unknown_fields = True


Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(max_length=16),
]  # OpenAI's: up to 16 string pairs


class PromptCacheOptions(_Request):
    """OpenAI's prompt-cache settings. Prefix caching here is automatic, for every request,
    kept while the cache has room: these change nothing, except a prewarm, which is refused
    (it asks for no output)."""

    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m", "12h"] | None = None
    prewarm: Literal[False] | None = None
    comparison_response_id: str | None = None  # the Responses API's cache diagnostics


class OpenAIHints(_Request):
    """Request fields of OpenAI's that ask how the request is served, not what the model
    says: accepted, and honoured as far as a single server can (the README's table)."""

    # A prefix-cache hint: every request here shares the one prefix cache, so requests of
    # the same key reuse each other's prefixes as OpenAI's routing by key aims to.
    prompt_cache_key: str | None = Field(None, max_length=1024)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    safety_identifier: str | None = Field(None, max_length=1024)  # OpenAI's abuse tracking
    # One tier here: any is served as "default" (OpenAI's reply may differ from the ask).
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: every chunk carries the usage so far
    # OpenAI pads events against length side channels; these streams are not padded.
    include_obfuscation: bool | None = None


Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
TokenId = Annotated[int, Field(ge=0)]
Bias = Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]
Text = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
PromptBatch = Annotated[list[TokenIds], Field(min_length=1)]
TokenIdKey = Annotated[str, Field(pattern=r"^[0-9]{1,10}$")]  # JSON object keys are strings


class JsonSchemaFormat(_Request):
    name: str | None = Field(None, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    """OpenAI's ``response_format``: free text, any JSON object, or JSON that validates
    against ``json_schema.schema`` (always enforced; with ``strict``, objects have only
    the properties named: ``strict_schema.py``). A JSON object may carry its ``schema`` too,
    as Together's and Anyscale's take it (instructor's JSON_SCHEMA mode sent it so up to
    1.3): enforced the same."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")

    @model_validator(mode="after")
    def _schema_for_json_schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError(
                "response_format.json_schema: required when type is json_schema, and only then"
            )
        if self.schema_ is not None and self.type != "json_object":
            raise ValueError(
                "response_format.schema: only with type json_object (json_schema takes it "
                "in json_schema.schema)"
            )
        return self


class StructuredOutputs(_Request):
    """vLLM's ``structured_outputs``: exactly one constraint (``StructuredOutputsParams``)."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class _Counted(_Request):
    """A request whose lists are counted against the applied limits before their entries
    are validated (``RequestLimits.check_counts``)."""

    @model_validator(mode="before")
    @classmethod
    def _counts_within_limits(cls, data: Any) -> Any:
        if isinstance(data, dict):
            applied_limits().check_counts(data)
        return data


class SamplingRequest(_Counted):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    n: int = Field(
        1, ge=1
    )  # at most --max-n (``infer.server.guards.request_limits``), as other bounds the server sets
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(
        None, ge=-1, description="0 or -1: no limit; at most the vocabulary size"
    )
    min_p: Probability | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: float | None = Field(None, gt=0.0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    logit_bias: dict[TokenIdKey, Bias] | None = Field(
        None, description="token id (as a string) → bias in [-100, 100] added to its logit"
    )
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False  # vLLM: choices (and chunks) carry the new token ids
    user: str | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    # vLLM's extra parameters
    include_stop_str_in_output: bool = False
    add_special_tokens: bool | None = None  # default: the endpoint's (``add_special_tokens``)
    truncate_prompt_tokens: int | None = Field(
        None, ge=-1, description="keep the prompt's last k tokens (-1: as many as fit)"
    )
    allowed_token_ids: Annotated[list[TokenId], Field(min_length=1)] | None = None
    request_id: str | None = Field(None, max_length=256, description="the response's id")
    cache_salt: str | None = Field(
        None, min_length=1, max_length=1024,
        description="vLLM's: only requests with the same salt share prefix-cache entries",
    )  # fmt: skip
    # vLLM's legacy names of ``structured_outputs``' constraints
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> SamplingRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        return self

    @model_validator(mode="after")
    def _truncation_keeps_tokens(self) -> SamplingRequest:
        if self.truncate_prompt_tokens == 0:
            raise ValueError("truncate_prompt_tokens: must be -1 or at least 1, got 0")
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Every streamed chunk carries the usage so far (vLLM's ``continuous_usage_stats``,
        with ``include_usage``)."""
        options = self.stream_options
        return options is not None and options.include_usage and options.continuous_usage_stats

    def keep_last_tokens(self, max_seq_len: int, max_tokens: int | None) -> int | None:
        """How many of the prompt's last tokens to keep (``truncate_prompt_tokens``; -1:
        as many as leave room for ``max_tokens``, or for one token), None: all."""
        if self.truncate_prompt_tokens != -1:
            return self.truncate_prompt_tokens
        return max(1, max_seq_len - (max_tokens or 1))

    def sampling_params(
        self,
        max_tokens: int | None,
        logprobs: int | None,
        constraint: StructuredOutputsParams | None,
        prompt_logprobs: int | None = None,
    ) -> SamplingParams:
        """The engine's parameters (``ValueError`` naming the field when out of range), with
        the request's ``constraint`` as checked apart (``http/grammar_check.py``)."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            n=self.n,
            temperature=_default(self.temperature, 1.0),
            top_p=_default(self.top_p, 1.0),
            top_k=_default(self.top_k, 0),
            min_p=_default(self.min_p, 0.0),
            presence_penalty=_default(self.presence_penalty, 0.0),
            frequency_penalty=_default(self.frequency_penalty, 0.0),
            repetition_penalty=_default(self.repetition_penalty, 1.0),
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            logit_bias=_token_keys(self.logit_bias or {}),
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            structured_outputs=constraint,
            cache_salt=self.cache_salt,
        )

    @property
    def constraint_field(self) -> str | None:
        """The field that constrains the output, if one does (nothing compiled)."""
        name = next((name for name in _CONSTRAINT_FIELDS if self._gives_constraint(name)), None)
        if name == "structured_outputs" and self.structured_outputs is not None:
            given = self.structured_outputs.model_dump(exclude_none=True, by_alias=True)
            return f"{name}.{next(iter(given))}" if len(given) == 1 else name
        fmt = self.response_format
        if name == "response_format" and fmt is not None and fmt.json_schema is not None:
            return f"{name}.json_schema.schema"
        if name == "response_format" and fmt is not None and fmt.schema_ is not None:
            return f"{name}.schema"
        return name

    def constraint(self) -> StructuredOutputsParams | None:
        """The output's constraint, from whichever field gives one: ``response_format``,
        ``structured_outputs``, a legacy ``guided_*`` field or ``allowed_token_ids``
        (``ValueError`` naming the field, e.g. ``response_format.json_schema.schema``, or
        the two fields when several give one)."""
        given = [name for name in _CONSTRAINT_FIELDS if self._gives_constraint(name)]
        if len(given) > 1:
            raise ValueError(f"{given[1]}: cannot be combined with {given[0]}")
        if not given:
            return None
        if given[0] == "response_format":
            fmt = self.response_format
            assert fmt is not None
            if fmt.schema_ is not None:
                return constraint("response_format.schema", json=fmt.schema_)
            if fmt.json_schema is None:
                return constraint("response_format", json_object=True)
            schema = fmt.json_schema.schema_
            if fmt.json_schema.strict:
                schema = strict_schema(schema)
            return constraint("response_format.json_schema.schema", json=schema)
        if given[0] == "structured_outputs":
            so = self.structured_outputs
            assert so is not None
            try:
                return StructuredOutputsParams(
                    json=so.json_,
                    regex=so.regex,
                    choice=so.choice,
                    grammar=so.grammar,
                    json_object=so.json_object,
                )
            except GrammarError as exc:
                raise ValueError(str(exc)) from None
        if given[0] == "allowed_token_ids":
            ids = ",".join(str(token) for token in sorted(set(self.allowed_token_ids or [])))
            return constraint("allowed_token_ids", grammar=f"start: <[{ids}]>*")
        kind = given[0].removeprefix("guided_")
        return constraint(given[0], **{kind: getattr(self, given[0])})

    def _gives_constraint(self, name: str) -> bool:
        value = getattr(self, name)
        if name == "response_format":
            return value is not None and value.type != "text"
        return value is not None


# The fields that constrain the output, at most one per request (besides a forced tool call).
_CONSTRAINT_FIELDS = (
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "allowed_token_ids",
)


class CompletionRequest(SamplingRequest):
    prompt: Text | Annotated[list[Text], Field(min_length=1)] | TokenIds | PromptBatch
    max_tokens: int | None = Field(16, ge=0, description="0: only with echo (the prompt alone)")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = Field(
        False, description="the prompt before the completion (with logprobs, its tokens' too)"
    )
    prompt_logprobs: int | None = Field(
        None, ge=0, le=MAX_LOGPROBS, description="vLLM's: each prompt token's logprob and top k"
    )

    @model_validator(mode="after")
    def _prompt_echo_is_whole(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens: 0 only with echo (the answer is the prompt alone)")
        # The prompt's scores come with the finished sequence, not token by token.
        for name in ("echo", "prompt_logprobs"):
            if self.stream and getattr(self, name) not in (False, None):
                raise ValueError(f"{name}: not supported with stream (send stream false)")
        return self

    @property
    def num_prompt_logprobs(self) -> int | None:
        """How many top alternatives the prompt's tokens are scored with: ``prompt_logprobs``,
        or ``logprobs`` for an echo; None when it is not scored."""
        asked = [self.prompt_logprobs]
        if self.echo:
            asked.append(self.logprobs)
        given = [k for k in asked if k is not None]
        return max(given) if given else None

    def prompts(self) -> list[str] | list[list[int]]:
        """One entry per prompt: a string or a list of token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if isinstance(prompt[0], int):
            return [prompt]
        return prompt


class TextPart(_Lenient):
    type: Literal["text"]
    text: str
    # A prompt-caching hint (Anthropic's, sent through LiteLLM and others): prefix caching
    # here is automatic, so the part reads the same without it.
    cache_control: dict[str, Any] | None = None

    @property
    def content(self) -> str:
        return self.text


class RefusalPart(_Lenient):
    """An assistant's refusal, as OpenAI writes it in the content of earlier turns."""

    type: Literal["refusal"]
    refusal: str

    @property
    def content(self) -> str:
        return self.refusal


_PART_TAGS = {"text": "text-part", "refusal": "refusal-part"}


def _readable_part(part: Any) -> Any:
    """A part this server reads (text, refusal) passes; any other (``image_url``,
    ``input_audio``, ``file``, ...) is refused, naming its type."""
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    if not isinstance(kind, str):
        raise PydanticCustomError(
            "content_part_type", 'a content part is an object with a "type" (e.g. text)'
        )
    if kind not in _PART_TAGS:
        raise PydanticCustomError(
            "unsupported_content_part",
            "{kind} content parts are not supported (this server reads text only)",
            {"kind": kind},
        )
    return part


# Tagged unions, so that a bad part is reported once, by its own type, and not as a failure
# of every member ("Input should be a valid string"). The tags are left out of error
# locations (``errors._is_union_tag``): ``messages.0.content.1`` names the part.
ContentPart = Annotated[
    Annotated[TextPart, Tag("text-part")] | Annotated[RefusalPart, Tag("refusal-part")],
    Discriminator(lambda part: _PART_TAGS[part["type"] if isinstance(part, dict) else part.type]),
    BeforeValidator(_readable_part),
]
MessageContent = Annotated[
    Annotated[str, Tag("str")] | Annotated[list[ContentPart], Tag("list[part]")],
    Discriminator(lambda content: "list[part]" if isinstance(content, list) else "str"),
]


class FunctionCall(_Lenient):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCallIn(_Lenient):
    """A tool call of an earlier assistant turn, sent back with the conversation."""

    id: str
    type: Literal["function"]
    function: FunctionCall
    index: int | None = None  # kept by clients that joined streamed deltas; order is the list's


class ChatMessage(_Lenient):
    """A message of the conversation. Assistant turns take every field OpenAI returns on
    them, so clients can send back what they received (``message.model_dump()``): what does
    not change the prompt (``annotations``; ``audio`` and ``function_call``, null as this
    server returns them) is ignored, and so is any field a client library adds
    (``provider_specific_fields``)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: MessageContent | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant turns that called tools
    tool_call_id: str | None = None  # tool turns: the call they answer
    refusal: str | None = None  # assistant turns that refused: what the model said
    annotations: list[dict[str, Any]] | None = None  # url citations of a web search
    reasoning_content: str | None = None  # an earlier turn's thoughts (reasoning parser)

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates expect it (parts joined; a refusal is what the
        assistant said when it has no content; developer = system; ``name`` and earlier
        thoughts passed on for templates that use them; tool calls as OpenAI writes them)."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.content for part in content)
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": content or self.refusal or ""}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump(exclude={"index"}) for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        return message


FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class FunctionDefinition(_Request):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments
    strict: bool | None = None


def only_function_tools(tool: Any) -> Any:
    """A tool of another type (OpenAI's custom or built-in tools) is refused by its type."""
    kind = tool.get("type") if isinstance(tool, dict) else "function"
    if kind != "function":
        raise PydanticCustomError(
            "unsupported_tool",
            "{kind} tools are not supported (this server calls function tools only)",
            {"kind": kind},
        )
    return tool


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class Conversation(_Counted):
    """A conversation and how the chat template renders it (vLLM's chat parameters):
    chat completions and ``/tokenize`` take the same fields."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Annotated[Tool, BeforeValidator(only_function_tools)]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # e.g. {"enable_thinking": false}
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = Field(None, min_length=1)
    documents: list[dict[str, str]] | None = None  # for RAG templates

    @model_validator(mode="after")
    def _one_way_to_end_the_prompt(self) -> Conversation:
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError(
                "continue_final_message: cannot be combined with add_generation_prompt "
                "(set add_generation_prompt to false to continue the last message)"
            )
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise ValueError("continue_final_message: the last message must be the assistant's")
        self.template_args()  # refuses reserved chat_template_kwargs
        return self

    @model_validator(mode="after")
    def _tool_messages_answer_calls(self) -> Conversation:
        """As OpenAI: a tool message answers the tool calls of the assistant message before
        it (other tool messages between them)."""
        calling = False
        for i, message in enumerate(self.messages):
            if message.role == "tool" and not calling:
                raise ValueError(
                    f"messages.{i}.role: a tool message must answer a preceding assistant "
                    "message with tool_calls"
                )
            if message.role != "tool":
                calling = message.role == "assistant" and bool(message.tool_calls)
        return self

    def template_args(self) -> ChatTemplateArgs:
        """How the chat template renders this conversation."""
        return ChatTemplateArgs(
            add_generation_prompt=self.add_generation_prompt,
            continue_final_message=self.continue_final_message,
            chat_template=self.chat_template,
            documents=self.documents,
            kwargs=self.chat_template_kwargs or {},
        )


class Prediction(_Request):
    """OpenAI's predicted output: text the answer is expected to repeat, a hint for speed
    alone (the answer is the same without it), so accepted and left unused."""

    type: Literal["content"]
    content: str | list[TextPart]


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class ChatCompletionRequest(SamplingRequest, Conversation, OpenAIHints):
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    metadata: Metadata | None = None  # OpenAI keeps it with stored completions: unused here
    prediction: Prediction | None = None
    reasoning_effort: ReasoningEffort | None = None

    def template_args(self) -> ChatTemplateArgs:
        """The conversation's, with ``reasoning_effort`` as the template variable of that
        name (templates that read it honour it, as in vLLM); ``none`` also switches thinking
        off (``enable_thinking: false``, Qwen3's switch) unless the request set that."""
        args = super().template_args()
        if self.reasoning_effort is None:
            return args
        kwargs = {"reasoning_effort": self.reasoning_effort, **args.kwargs}
        if self.reasoning_effort == "none":
            kwargs.setdefault("enable_thinking", False)
        return replace(args, kwargs=kwargs)

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:  # 0 asks for none: OpenAI's schema allows it
            raise ValueError("top_logprobs: only allowed when logprobs is true")
        return self

    @model_validator(mode="after")
    def _tool_choice_needs_tools(self) -> ChatCompletionRequest:
        choice = self.tool_choice
        names = [tool.function.name for tool in self.tools or []]
        forcing = choice == "required" or isinstance(choice, NamedToolChoice)
        if (forcing or choice == "auto") and not names:
            raise ValueError("tool_choice: needs tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(
                f"tool_choice.function.name: {choice.function.name!r} is not one of the tools"
            )
        if len(set(names)) != len(names):
            raise ValueError("tools: function names must be unique")
        return self

    @property
    def constraint_field(self) -> str | None:
        return "tools" if self.forces_tool_call else super().constraint_field

    @property
    def forces_tool_call(self) -> bool:
        """``tool_choice`` is ``required`` or names a function: the output is constrained."""
        return self.tools is not None and (
            self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)
        )

    def constraint(self) -> StructuredOutputsParams | None:
        """A forced tool call's grammar (arguments that validate against the function's
        parameters), else the ``response_format``/``structured_outputs`` constraint."""
        if not self.forces_tool_call:
            return super().constraint()
        for name in _CONSTRAINT_FIELDS:
            if self._gives_constraint(name):
                raise ValueError(f"tool_choice: cannot force a tool call with {name}")
        try:
            return StructuredOutputsParams(json=self._forced_call_schema())
        except GrammarError as exc:
            for i, tool in enumerate(self.tools or []):  # name the tool whose schema is bad
                constraint(f"tools.{i}.function.parameters", json=_parameters(tool))
            raise ValueError(f"tools: {exc.detail}") from None

    def _forced_call_schema(self) -> dict[str, Any]:
        """What a forced call writes: the named function's arguments, or (``required``) a
        JSON array of ``{"name": ..., "arguments": ...}`` calls of the tools."""
        tools = self.tools or []
        if isinstance(self.tool_choice, NamedToolChoice):
            name = self.tool_choice.function.name
            return next(_parameters(t) for t in tools if t.function.name == name)
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": t.function.name}, "arguments": _parameters(t)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
        limit = self.tool_call_limit
        most = {} if limit is None else {"maxItems": limit}
        return {"type": "array", "minItems": 1, **most, "items": {"anyOf": calls}}

    @property
    def tool_call_limit(self) -> int | None:
        """The most tool calls a choice returns (None: any number)."""
        return 1 if self.parallel_tool_calls is False else None

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (the current name) wins over the legacy ``max_tokens``."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class TokenizeCompletionRequest(_Request):
    """vLLM's ``/tokenize`` of a plain prompt."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(Conversation):
    """vLLM's ``/tokenize`` of a conversation through the chat template."""

    model: str | None = None
    add_special_tokens: bool = False  # the template has put its own in
    return_token_strs: bool = False


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[TokenId]


# --- responses ---------------------------------------------------------------------------
class _Response(BaseModel):
    pass


class PromptTokensDetails(_Response):
    cached_tokens: int = 0  # prompt tokens served from the prefix cache


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class CompletionLogprobs(_Response):
    """Parallel lists, one entry per token; an echoed prompt's first token has no logprob
    (null), as OpenAI's."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(_Response):
    """vLLM's score of a prompt token or an alternative to it."""

    logprob: float
    rank: int | None  # 1: the most likely token
    decoded_token: str


def _token_ids_field() -> Any:
    """``token_ids``, in the JSON only when asked for (``return_token_ids``)."""
    return Field(None, exclude_if=lambda value: value is None)


def _omitted_when_none() -> Any:
    """A field in the JSON only when set (``tool_calls``: absent, as OpenAI writes it)."""
    return Field(None, exclude_if=lambda value: value is None)


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = _token_ids_field()
    # vLLM's, when asked for: per prompt token (the first: null), token id → its score
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = _omitted_when_none()


class CompletionResponse(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Response):
    content: list[ChatTokenLogprob]
    refusal: list[ChatTokenLogprob] | None = None


class ToolCallFunction(_Response):
    name: str
    arguments: str


class ToolCall(_Response):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatResponseMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = _omitted_when_none()  # with a reasoning parser
    tool_calls: list[ToolCall] | None = _omitted_when_none()


class ChatChoice(_Response):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = _token_ids_field()


class ChatCompletionResponse(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class DeltaFunction(_Response):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_Response):
    """A streamed piece of a tool call: the first of each call has its id, type and name;
    the call's ``arguments`` are the concatenation of every piece's."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction


class ChatDelta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = _omitted_when_none()
    tool_calls: list[DeltaToolCall] | None = _omitted_when_none()


class ChatChunkChoice(_Response):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = _token_ids_field()


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class TokenizeResponse(_Response):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(_Response):
    prompt: str


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "infer"
    max_model_len: int


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(_Response):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(_Response):
    error: ErrorInfo


def constraint(field: str, **kind: Any) -> StructuredOutputsParams:
    """``StructuredOutputsParams(**kind)``, its errors naming ``field`` (where it came from)."""
    try:
        return StructuredOutputsParams(**kind)
    except GrammarError as exc:
        raise ValueError(f"{field}: {exc.detail}") from None


def _parameters(tool: Tool) -> dict[str, Any]:
    """A function's arguments schema (any JSON object when it declares none; with
    ``strict``, objects have only the properties named)."""
    schema = tool.function.parameters or {"type": "object"}
    return strict_schema(schema) if tool.function.strict else schema


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def _token_keys(bias: dict[str, float]) -> dict[int, float]:
    """``logit_bias`` keys are token ids written as JSON strings."""
    return {int(key): value for key, value in bias.items()}
