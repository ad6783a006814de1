"""llguidance's view of the vocabulary that a request's grammar (``contract.constraints``)
compiles against, and the check that some output can satisfy a grammar at all.
"""

from __future__ import annotations

import llguidance
import llguidance.hf
from llguidance import LLMatcher, LLTokenizer

from infer.contract.constraints import one_line
from infer.engine.structured.grammar_productivity import (
    describe_empty_language,
    empty_language_rules,
)
from infer.tokenizer import Tokenizer

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
