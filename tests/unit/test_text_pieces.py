"""``TextPieces``: long texts cut at spaces between letters encode to exactly the ids of the
whole text (SmolLM2's byte-level tokenizer, a Llama 3-style regex split of it, special tokens
added once); tokenizers that look across such spaces, and texts holding added tokens, are
not cut."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from tests.conftest import MIXED_SCRIPT_TEXTS
from tokenizers import Regex, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as RustTokenizer

from infer.loader.presets import embedded_model_path
from infer.text_pieces import MIN_PIECE_CHARS, TextPieces
from infer.tokenizer import Tokenizer

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@pytest.fixture(scope="module")
def smollm2() -> RustTokenizer:
    tokenizer = Tokenizer.load(embedded_model_path())
    assert tokenizer is not None
    return RustTokenizer.from_str(tokenizer.rust.to_str())  # a copy the tests may change


def long_texts(rust: RustTokenizer, count: int) -> list[str]:
    """Random ids decoded (as benchmark clients make prompts) and mixed-script prose."""
    rng = random.Random(0)
    vocab = rust.get_vocab_size()
    texts = [rust.decode([rng.randrange(vocab) for _ in range(2500)]) for _ in range(count)]
    prose = " ".join(MIXED_SCRIPT_TEXTS)
    return [*texts, (prose + "\n\n") * (4 * MIN_PIECE_CHARS // len(prose) + 1)]


def with_bos(rust: RustTokenizer) -> RustTokenizer:
    copy = RustTokenizer.from_str(rust.to_str())
    bos = "<|endoftext|>"
    copy.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, copy.token_to_id(bos))]
    )
    return copy


def llama3_style(rust: RustTokenizer) -> RustTokenizer:
    copy = RustTokenizer.from_str(rust.to_str())
    copy.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    return copy


def as_is(rust: RustTokenizer) -> RustTokenizer:
    return rust


@pytest.mark.parametrize("variant", [as_is, with_bos, llama3_style])
def test_pieces_encode_to_the_ids_of_the_whole_text(
    smollm2: RustTokenizer, variant: Callable[[RustTokenizer], RustTokenizer]
) -> None:
    rust = variant(smollm2)
    pieces = TextPieces.for_tokenizer(rust, cores=4)
    assert pieces is not None
    texts = long_texts(rust, 6)
    assert all(len(pieces.cut(text)) == 4 for text in texts)
    assert all("".join(pieces.cut(text)) == text for text in texts)
    for special in (True, False):
        whole = [encoding.ids for encoding in rust.encode_batch(texts, add_special_tokens=special)]
        assert pieces.encode_batch(texts, special) == whole


def test_short_texts_and_texts_with_added_tokens_stay_whole(smollm2: RustTokenizer) -> None:
    pieces = TextPieces.for_tokenizer(smollm2, cores=4)
    assert pieces is not None
    text = long_texts(smollm2, 1)[0]
    assert pieces.cut(text[: MIN_PIECE_CHARS + 10]) == [text[: MIN_PIECE_CHARS + 10]]
    special = text[:5000] + "<|im_start|>" + text[5000:]
    assert pieces.cut(special) == [special]
    assert pieces.encode_batch([special], True) == [smollm2.encode(special).ids]


def test_tokenizers_that_look_across_spaces_are_not_cut(smollm2: RustTokenizer) -> None:
    assert TextPieces.for_tokenizer(smollm2, cores=1) is None  # nothing to spread over
    prefixed = RustTokenizer.from_str(smollm2.to_str())
    prefixed.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    lowercased = RustTokenizer.from_str(smollm2.to_str())
    lowercased.normalizer = normalizers.Lowercase()
    metaspace = RustTokenizer.from_str(smollm2.to_str())
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    for rust in (prefixed, lowercased, metaspace):
        assert TextPieces.for_tokenizer(rust, cores=4) is None
