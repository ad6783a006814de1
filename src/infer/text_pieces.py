"""Long texts cut where the tokenizer cuts them anyway, so that several cores encode one.

A Rust tokenizer's ``encode_batch`` spreads texts over its threads, but one text runs on
one core, a noticeable share of a long prompt's time to first token
(``benchmarks/results-by-topic/10-host-overheads.md``, 10.1). Byte-level BPE tokenizers
(GPT-2's, Llama 3's,
Qwen's, SmolLM2's) first split text into words by a regular expression and encode each word
alone, and a space between two letters always starts a new word ("tail head" is "tail" and
" head"). Cutting a text at such spaces and joining the pieces' ids is therefore exactly
encoding it whole, as long as nothing else looks across the cut: no normalizer beyond NFC,
no prefix space added to each piece, and no added token (``<|im_start|>``...) in the text.
Tokenizers that do not have this shape (SentencePiece-style ones such as Gemma's) are left
whole.
"""

from __future__ import annotations

import itertools
import json
import os
import re

from tokenizers import Encoding
from tokenizers import Tokenizer as RustTokenizer

# Shorter texts are not cut: below about this many characters (some 400 tokens), spreading
# them over threads costs about what it saves.
MIN_PIECE_CHARS = 2048
PROBE = "tail head tail"  # a byte-level word split puts words at 0, 4 and 9


class TextPieces:
    """Where a tokenizer's texts may be cut (``cut``), and their encoding from the pieces
    (``encode_batch``); ``for_tokenizer`` says whether this tokenizer allows it at all."""

    def __init__(self, rust: RustTokenizer, max_pieces: int) -> None:
        self.rust = rust
        self.max_pieces = max_pieces
        added = [token.content for token in rust.get_added_tokens_decoder().values()]
        self._added = re.compile("|".join(map(re.escape, added))) if added else None

    @classmethod
    def for_tokenizer(cls, rust: RustTokenizer, cores: int | None = None) -> TextPieces | None:
        """None unless the tokenizer encodes words independently (see the module's
        docstring) and there is more than one core (this machine's by default) to encode
        pieces on."""
        cores = len(os.sched_getaffinity(0)) if cores is None else cores
        if cores < 2 or not _words_encode_alone(rust):
            return None
        return cls(rust, cores)

    def cuts_any(self, texts: list[str]) -> bool:
        """Whether ``cut`` would cut any of ``texts`` by length (the plain ``encode_batch``
        is cheaper for the others)."""
        return any(len(text) >= 2 * MIN_PIECE_CHARS for text in texts)

    def cut(self, text: str) -> list[str]:
        """``text`` in pieces of at least ``MIN_PIECE_CHARS`` characters, each cut at a
        space between two letters; the whole text when it is short or holds added tokens."""
        count = min(self.max_pieces, len(text) // MIN_PIECE_CHARS)
        if count < 2 or (self._added is not None and self._added.search(text)):
            return [text]
        cuts = [0]
        for k in range(1, count):
            at = _space_between_letters(text, max(k * len(text) // count, cuts[-1] + 1))
            if at is None:
                break
            cuts.append(at)
        cuts.append(len(text))
        return [text[a:b] for a, b in itertools.pairwise(cuts)]

    def encode_batch(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        """The ids ``encode_batch`` gives for ``texts``: all their pieces in one call, each
        text's pieces joined, then its special tokens added as for the whole text."""
        pieces = [self.cut(text) for text in texts]
        flat = [piece for text_pieces in pieces for piece in text_pieces]
        encoded = iter(self.rust.encode_batch_fast(flat, add_special_tokens=False))
        ids = []
        for text_pieces in pieces:
            merged = Encoding.merge([next(encoded) for _ in text_pieces], growing_offsets=True)
            ids.append(self.rust.post_process(merged, None, add_special_tokens).ids)
        return ids


def _space_between_letters(text: str, start: int) -> int | None:
    """The first index at or after ``start`` of a space between two letters."""
    at = text.find(" ", max(start, 1))
    while at != -1 and at + 1 < len(text):
        if text[at - 1].isalpha() and text[at + 1].isalpha():
            return at
        at = text.find(" ", at + 1)
    return None


def _words_encode_alone(rust: RustTokenizer) -> bool:
    """Whether the tokenizer is a byte-level BPE that encodes regex-split words alone."""
    normalizer = rust.normalizer
    if normalizer is not None and json.loads(normalizer.__getstate__())["type"] != "NFC":
        return False
    pre = rust.pre_tokenizer
    if pre is None:
        return False
    spec = json.loads(pre.__getstate__())
    parts = spec["pretokenizers"] if spec["type"] == "Sequence" else [spec]
    byte_level = [p for p in parts if p["type"] == "ByteLevel"]
    if parts[-1]["type"] != "ByteLevel" or any(p["add_prefix_space"] for p in byte_level):
        return False
    if any(p["type"] not in ("ByteLevel", "Split") for p in parts):
        return False
    starts = [start for _, (start, _) in pre.pre_tokenize_str(PROBE)]
    return starts == [0, 4, 9]
