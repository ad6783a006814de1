"""Per-request generation settings, named and validated like vLLM's ``SamplingParams``."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

MAX_LOGIT_BIAS = 100.0  # OpenAI's bound on each ``logit_bias`` value


@dataclass(frozen=True)
class StructuredOutputsParams:
    """A constraint on the output, as vLLM names it: exactly one of a JSON schema (``json``,
    a dict or its text), any JSON object (``json_object``), a regular expression (``regex``),
    one of some strings (``choice``), or a Lark/EBNF grammar (``grammar``).

    It is checked (and turned into the grammar the engine compiles) when it is made, so an
    invalid one raises ``ValueError`` naming the field here, never in the engine."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # Lark rules of what may come before the constrained output, which they reference as
    # ``@answer`` (a reasoning model's thoughts: ``infer.server.openai.reasoning``); None: the
    # constraint applies from the first token.
    preamble: str | None = None
    # The checked grammar in the library's format; what the engine compiles and caches by.
    compiled_grammar: str = field(init=False, repr=False, compare=False, default="")

    def __post_init__(self) -> None:
        given = {
            name: value
            for name in ("json", "regex", "choice", "grammar", "json_object")
            if (value := getattr(self, name)) is not None and value is not False
        }
        if len(given) != 1:
            raise ValueError(
                "structured_outputs: exactly one of json, regex, choice, grammar or "
                f"json_object must be given, got {sorted(given) or 'none'}"
            )
        ((kind, value),) = given.items()
        # llguidance is loaded by the first constraint, not by importing ``SamplingParams``.
        from infer.contract.constraints import grammar_for

        compiled = grammar_for(kind, value)
        if self.preamble is not None:
            compiled = _behind(self.preamble, compiled)
        object.__setattr__(self, "compiled_grammar", compiled)

    def behind(self, preamble: str) -> StructuredOutputsParams:
        """This constraint behind ``preamble`` (``preamble`` above), its grammar not
        compiled again."""
        assert self.preamble is None, "one preamble"
        behind = copy.copy(self)
        object.__setattr__(behind, "preamble", preamble)
        object.__setattr__(behind, "compiled_grammar", _behind(preamble, self.compiled_grammar))
        return behind


def _behind(preamble: str, compiled: str) -> str:
    """llguidance's grammar of ``preamble`` (Lark) then ``compiled`` as its sub-grammar
    ``answer`` (llguidance's JSON, one grammar or several, or Lark)."""
    if compiled.lstrip().startswith("{"):
        grammars = [dict(g) for g in json.loads(compiled)["grammars"]]
    else:
        grammars = [{"lark_grammar": compiled}]
    grammars[0]["name"] = "answer"
    return json.dumps({"grammars": [{"lark_grammar": preamble}, *grammars]})


@dataclass
class SamplingParams:
    """How to generate. ``temperature=0`` is greedy; ``seed`` makes a sampled output
    reproducible whatever else shares the batch. Invalid values raise ``ValueError``
    naming the field."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no limit
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: until the context is full
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False  # the stop string that ended the text stays in it
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # also return this many top alternatives per token
    # Score the prompt too: each prompt token's logprob (the first has none) and this many
    # top alternatives, from the prefill's own forward pass (vLLM's ``prompt_logprobs``).
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id → added to its logit
    skip_special_tokens: bool = True
    detokenize: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    # Only requests with the same salt share prefix-cache blocks (vLLM's: one per tenant,
    # so that none learns from the cache what another's prompts hold).
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        self.logit_bias = dict(self.logit_bias)
        self.validate()

    def validate(self) -> None:
        for name in ("temperature", "top_p", "min_p", "repetition_penalty",
                     "presence_penalty", "frequency_penalty"):  # fmt: skip
            value = getattr(self, name)
            _require(math.isfinite(value), name, f"must be a finite number, got {value}")
        _require(self.n >= 1, "n", f"must be >= 1, got {self.n}")
        _require(self.temperature >= 0.0, "temperature", f"must be >= 0, got {self.temperature}")
        _require(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        _require(self.top_k >= -1, "top_k", f"must be -1, 0 or positive, got {self.top_k}")
        _require(0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}")
        _require(
            self.repetition_penalty > 0.0,
            "repetition_penalty",
            f"must be > 0, got {self.repetition_penalty}",
        )
        _require(
            -2.0 <= self.presence_penalty <= 2.0,
            "presence_penalty",
            f"must be in [-2, 2], got {self.presence_penalty}",
        )
        _require(
            -2.0 <= self.frequency_penalty <= 2.0,
            "frequency_penalty",
            f"must be in [-2, 2], got {self.frequency_penalty}",
        )
        _require(
            self.seed is None or 0 <= self.seed < 2**63,
            "seed",
            f"must be a non-negative 64-bit integer, got {self.seed}",
        )
        _require(
            self.max_tokens is None or self.max_tokens >= 1,
            "max_tokens",
            f"must be >= 1, got {self.max_tokens}",
        )
        _require(self.min_tokens >= 0, "min_tokens", f"must be >= 0, got {self.min_tokens}")
        _require(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}",
        )
        _require(
            all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings"
        )
        _require(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "must be non-negative token ids",
        )
        _require(
            self.logprobs is None or 0 <= self.logprobs <= 20,
            "logprobs",
            f"must be in [0, 20], got {self.logprobs}",
        )
        _require(
            self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20,
            "prompt_logprobs",
            f"must be in [0, 20], got {self.prompt_logprobs}",
        )
        _require(
            all(isinstance(t, int) and t >= 0 for t in self.logit_bias),
            "logit_bias",
            "keys must be non-negative token ids",
        )
        _require(
            all(math.isfinite(b) and abs(b) <= MAX_LOGIT_BIAS for b in self.logit_bias.values()),
            "logit_bias",
            f"values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]",
        )
        _require(
            self.cache_salt is None or (isinstance(self.cache_salt, str) and self.cache_salt != ""),
            "cache_salt",
            "must be a non-empty string",
        )

    def check_for_model(self, vocab_size: int, max_seq_len: int) -> None:
        """The limits that depend on the model: token ids inside its vocabulary, ``top_k``
        no larger than it, ``min_tokens`` inside its context (``ValueError`` naming the
        field). Out-of-range ids would otherwise fail the whole batched step they sample in.
        (``max_tokens`` against the prompt's length is the server's check.)"""
        _require(
            self.top_k <= vocab_size,
            "top_k",
            f"must be at most the vocabulary size ({vocab_size}), got {self.top_k}",
        )
        _require(
            all(t < vocab_size for t in self.stop_token_ids),
            "stop_token_ids",
            f"token ids must be in [0, {vocab_size})",
        )
        _require(
            all(t < vocab_size for t in self.logit_bias),
            "logit_bias",
            f"keys must be token ids in [0, {vocab_size})",
        )
        _require(
            self.min_tokens < max_seq_len,
            "min_tokens",
            f"must be below max_seq_len ({max_seq_len}), got {self.min_tokens}",
        )

    def nth_sample(self, index: int) -> SamplingParams:
        """The ``index``-th of ``n`` samples: one sequence, with its own seed stream when a
        seed is given (seed + index). With ``n == 1`` the one sample is these parameters
        themselves, already validated (again, it cost a server ~9 us a request)."""
        if self.n == 1:
            assert index == 0, "one sample"
            return self
        seed = None if self.seed is None else self.seed + index
        return replace(self, n=1, seed=seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    @property
    def needs_output_tokens(self) -> bool:
        """Whether sampling reads the output so far on the host (penalties count it, a
        grammar's mask follows it), so a step's sampling cannot be queued before the
        previous one's tokens are known (its forward pass can: ``RunAhead``)."""
        return self.needs_penalties or self.structured_outputs is not None


def _require(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{name}: {message}")
