"""A request's constraint as a grammar: JSON schemas, regexes, choices and Lark/EBNF turned
into llguidance's grammar text and checked when ``StructuredOutputsParams`` is made (in the
API process for the server), with errors that name the field; and llguidance's view of the
vocabulary those grammars compile against.

llguidance was chosen by measurement (``benchmarks/bench_grammar.py``,
``benchmarks/results-by-topic/04-structured.md``, 4.6): it compiles and fills masks faster
than xgrammar, and ships as one abi3 wheel with no dependencies.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.hf
from llguidance import LLMatcher, LLTokenizer

from infer.engine.grammar_productivity import describe_empty_language, empty_language_rules
from infer.tokenizer import Tokenizer

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# JSON as ``json.dumps`` writes it (", " and ": ", no other whitespace): a small model may
# otherwise spend its tokens on newlines and indentation, and never close the object.
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
ANY_JSON_OBJECT = {"type": "object"}
# llguidance's slicer: tokens that are runs of string characters are grouped by the first
# of these patterns they match, and a mask takes a whole group without walking its tokens
# when the grammar allows every string of the pattern there. Its default groups are runs of
# up to 10, 30 and any number of characters; inside a string with a ``maxLength`` only the
# groups no longer than what is left apply, so shorter groups let more of the vocabulary be
# taken at once (the same masks, ~30% less time on bench_structured's schema:
# ``benchmarks/bench_mask_fill.py``). Making the tokenizer takes ~0.2 s more, once.
_STRING_CHARS = r'[^"\\\x00-\x1F\x7F]'
SLICES = [
    r"[\x20\x0A\x0D\x09]+",
    *(_STRING_CHARS + f"{{1,{n}}}" for n in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 30)),
    _STRING_CHARS + "+",
]
_MAX_DETAIL = 500
# The field a grammar's errors name, in the engine as in the API.
GRAMMAR_FIELD = "structured_outputs"
# llguidance's compiler recurses on a grammar's structure: ~5,000 chained Lark rules
# overflowed an 8 MiB stack (SIGSEGV). The server checks each grammar first on a stack of
# CHECK_STACK_BYTES in a worker process that may crash (``infer.server.grammar_check``);
# the engine compiles on one eight times as large, so what passed cannot crash it.
CHECK_STACK_BYTES = 8 * 1024 * 1024
COMPILE_STACK_BYTES = 8 * CHECK_STACK_BYTES


class GrammarError(ValueError):
    """An invalid constraint. ``detail`` says why without the field's name, for callers that
    took the constraint from a field of their own (``response_format.json_schema.schema``)."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.detail = detail


def grammar_for(kind: str, value: Any) -> str:
    """llguidance's grammar text for a constraint of ``kind`` (a field of
    ``StructuredOutputsParams``); ``GrammarError`` naming the field when it is invalid."""
    field = f"structured_outputs.{kind}"
    try:
        grammar = _grammar(kind, value)
    except (ValueError, TypeError) as exc:
        raise GrammarError(field, one_line(str(exc))) from None
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise GrammarError(field, one_line(error))
    return grammar


def _grammar(kind: str, value: Any) -> str:
    if kind == "json":
        schema = json.loads(value) if isinstance(value, str) else value
        if not isinstance(schema, dict):
            raise ValueError("must be a JSON schema (a JSON object)")
        return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    if kind == "json_object":
        if value is not True:
            raise ValueError("must be true or absent")
        return LLMatcher.grammar_from_json_schema(ANY_JSON_OBJECT, defaults=JSON_OPTIONS)
    if kind == "choice":
        if not (isinstance(value, list) and value and all(isinstance(c, str) for c in value)):
            raise ValueError("must be a non-empty list of strings")
        if not all(value):
            raise ValueError("must not contain an empty string")
        return llguidance.grammar_from("choice", value)  # type: ignore[arg-type]
    if not isinstance(value, str) or not value:
        raise ValueError("must be a non-empty string")
    # "grammar" takes Lark (llguidance's dialect) or GBNF/EBNF (converted to Lark).
    return llguidance.grammar_from("regex" if kind == "regex" else "grammar", value)


def language_error(grammar: str, tokenizer: LLTokenizer) -> str | None:
    """Why no output can satisfy ``grammar``, or None when one may.

    A grammar whose language is empty (``{"$ref": "#"}``, rules that only refer to each
    other, a regex matching nothing) leaves no token but the end of sequence possible, which
    llguidance reports as an error when it computes the first mask. One that forces every
    token and never ends (``a: "x" a``) passes that mask: following its forced output,
    llguidance gives up past its own limit (tens of thousands of bytes), so no reply ends it.
    One that offers a choice first (``start: a | b`` where neither ends) passes both, so its
    rules are checked for one that ends (``grammar_productivity``).
    """
    matcher = LLMatcher(tokenizer, grammar, log_level=0)
    if not matcher.is_error():
        matcher.compute_bitmask()
    if matcher.is_error():
        return "its language is empty: " + _llguidance_error(matcher)
    forced = matcher.compute_ff_tokens()
    if forced and not matcher.is_error():
        matcher.consume_tokens(forced)
    if matcher.is_error():
        return "its forced output never ends: " + _llguidance_error(matcher)
    endless = empty_language_rules(grammar)
    if endless:
        return "its language is empty: " + one_line(describe_empty_language(endless))
    return None


def _llguidance_error(matcher: LLMatcher) -> str:
    return one_line(matcher.get_error().split("<state>")[0])


def ll_tokenizer(tokenizer: Tokenizer, vocab_size: int) -> LLTokenizer:
    """llguidance's view of the vocabulary (~0.6 s to make): the end of sequence is every
    end token of the model that the tokenizer has (a model's config may name ids beyond a
    smaller tokenizer's)."""
    known = len(tokenizer.hf)
    eos = sorted(i for i in tokenizer.eos_token_ids if i < known)
    return llguidance.hf.from_tokenizer(
        tokenizer.hf,  # type: ignore[arg-type]
        n_vocab=vocab_size,
        eos_token=eos or None,
        slices=SLICES,
    )


def one_line(message: str) -> str:
    """A message on one line, at most ``_MAX_DETAIL`` characters."""
    return " ".join(message.split())[:_MAX_DETAIL]
