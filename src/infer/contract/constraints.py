"""A request's constraint as a grammar: JSON schemas, regexes, choices and Lark/EBNF turned
into llguidance's grammar text and checked when ``StructuredOutputsParams`` is made (in the
API process for the server), with errors that name the field.

llguidance was chosen by measurement (``benchmarks/bench_grammar.py``,
``benchmarks/results-by-topic/04-structured.md``, 4.6): it compiles and fills masks faster
than xgrammar, and ships as one abi3 wheel with no dependencies. It is imported by the
first constraint, not with this module, so the API process loads it only when a request
asks for one.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from infer.contract.errors import GrammarError

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
_MAX_DETAIL = 500
# The field a grammar's errors name, in the engine as in the API.
GRAMMAR_FIELD = "structured_outputs"
# llguidance's compiler recurses on a grammar's structure: ~5,000 chained Lark rules
# overflowed an 8 MiB stack (SIGSEGV). The server checks each grammar first on a stack of
# CHECK_STACK_BYTES in a worker process that may crash (``infer.server.http.grammar_check``);
# the engine compiles on one eight times as large, so what passed cannot crash it.
CHECK_STACK_BYTES = 8 * 1024 * 1024
COMPILE_STACK_BYTES = 8 * CHECK_STACK_BYTES


def grammar_for(kind: str, value: Any) -> str:
    """llguidance's grammar text for a constraint of ``kind`` (a field of
    ``StructuredOutputsParams``); ``GrammarError`` naming the field when it is invalid."""
    import llguidance  # here, not above: see the module's docstring

    field = f"structured_outputs.{kind}"
    try:
        grammar = _grammar(kind, value)
    except (ValueError, TypeError) as exc:
        raise GrammarError(field, one_line(str(exc))) from None
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise GrammarError(field, one_line(error))
    return grammar


def _grammar(kind: str, value: Any) -> str:
    import llguidance

    if kind == "json":
        schema = json.loads(value) if isinstance(value, str) else value
        if not isinstance(schema, dict):
            raise ValueError("must be a JSON schema (a JSON object)")
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    if kind == "json_object":
        if value is not True:
            raise ValueError("must be true or absent")
        return llguidance.LLMatcher.grammar_from_json_schema(ANY_JSON_OBJECT, defaults=JSON_OPTIONS)
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


def one_line(message: str) -> str:
    """A message on one line, at most ``_MAX_DETAIL`` characters."""
    return " ".join(message.split())[:_MAX_DETAIL]
