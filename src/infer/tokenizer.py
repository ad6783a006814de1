"""Tokenizer, chat template and incremental detokeniser.

Tokenizers come from the checkpoint directory or are converted from GGUF metadata by
transformers; the conversion is slow, so its result is cached on disk and reused.
transformers (which loads torch) and gguf are imported when a tokenizer is loaded, not
with this module: the server's API process imports it, and loads one at start-up.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tokenizers import Tokenizer as RustTokenizer
from tokenizers.decoders import DecodeStream

from infer.config import cache_dir
from infer.text_pieces import TextPieces

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Message = dict[str, Any]
# How chat templates spell the end of a turn (Gemma, Llama 3, ChatML: Qwen, SmolLM2). A
# checkpoint's metadata may omit it (GGUFs without ``eot_token_id``); the vocabulary has it.
END_OF_TURN_TOKENS = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>")


# Arguments of ``apply_chat_template`` that ``ChatTemplateArgs`` sets itself; its ``kwargs``
# (a request's ``chat_template_kwargs``) may not.
RESERVED_TEMPLATE_ARGS = frozenset(
    {"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
     "continue_final_message", "tokenize", "return_dict", "return_tensors"}
)  # fmt: skip


@dataclass(frozen=True)
class ChatTemplateArgs:
    """How a conversation is rendered (vLLM's chat parameters): end with the assistant's
    turn opener (``add_generation_prompt``) or leave the last (assistant) message open to be
    continued; another template than the tokenizer's; documents for RAG templates; and
    variables the template reads (``kwargs``: ``{"enable_thinking": False}`` for Qwen3)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    documents: list[dict[str, str]] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        reserved = sorted(RESERVED_TEMPLATE_ARGS.intersection(self.kwargs))
        if reserved:
            raise ValueError(
                f"chat_template_kwargs: {', '.join(reserved)} cannot be set here (use the "
                "request's own fields)"
            )


DEFAULT_TEMPLATE_ARGS = ChatTemplateArgs()


# How many times shorter a normalizer may make a text, at most: NFC joins a letter and its
# accents, and a Hangul syllable's three parts, into one character.
_SHORTENING_MARGIN = 4


class Tokenizer:
    """A Hugging Face fast tokenizer plus the model's stop tokens: the checkpoint's, the
    tokenizer's EOS, and the end-of-turn token whatever the metadata said."""

    def __init__(self, hf: PreTrainedTokenizerBase, eos_token_ids: Sequence[int] = ()) -> None:
        self.hf = hf
        ids = set(eos_token_ids)
        if hf.eos_token_id is not None:
            ids.add(int(hf.eos_token_id))
        ids.update(_end_of_turn_ids(hf))
        self.eos_token_ids: frozenset[int] = frozenset(ids)
        self._pieces = TextPieces.for_tokenizer(self.rust)

    @classmethod
    def load(cls, path: Path, eos_token_ids: Sequence[int] = ()) -> Tokenizer | None:
        """From a checkpoint directory or ``.gguf`` file; None when it ships no tokenizer."""
        from transformers import AutoTokenizer

        if path.suffix == ".gguf":
            hf = _load_gguf_tokenizer(path)
            return None if hf is None else cls(hf, eos_token_ids)
        if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
            return None
        return cls(AutoTokenizer.from_pretrained(str(path)), eos_token_ids)

    @property
    def rust(self) -> RustTokenizer:
        return self.hf.backend_tokenizer

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @cached_property
    def max_token_chars(self) -> int:
        """The most characters of a text one token can stand for: the longest vocabulary
        string (a byte-level vocabulary writes one character per byte of text, a
        SentencePiece one a character per character, added tokens as they are), times
        ``_SHORTENING_MARGIN`` where a normalizer may shorten the text first."""
        longest = max(map(len, self.rust.get_vocab(with_added_tokens=True)), default=1) or 1
        return longest if self.rust.normalizer is None else longest * _SHORTENING_MARGIN

    def encode(self, text: str) -> list[int]:
        """Token ids of a plain prompt (with the BOS token when the model expects one)."""
        return list(self.hf.encode(text, add_special_tokens=True))

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """``encode`` of many texts in one call: the Rust tokenizer releases the GIL for it
        and spreads the texts over its threads (a server's event loop keeps running); long
        texts are cut into pieces for that where the tokenizer allows (``TextPieces``). The
        ``_fast`` call skips the character offsets, which nothing here reads."""
        if self._pieces is not None and self._pieces.cuts_any(texts):
            return self._pieces.encode_batch(texts, add_special_tokens)
        encodings = self.rust.encode_batch_fast(texts, add_special_tokens=add_special_tokens)
        return [encoding.ids for encoding in encodings]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.rust.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        args: ChatTemplateArgs = DEFAULT_TEMPLATE_ARGS,
    ) -> list[int]:
        """Token ids of a conversation, ending with the assistant's turn opener."""
        text = self.render_chat(messages, tools, args)
        return list(self.hf.encode(text, add_special_tokens=False))

    def render_chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        args: ChatTemplateArgs = DEFAULT_TEMPLATE_ARGS,
    ) -> str:
        """A conversation as the chat template writes it (encode without special tokens:
        the template has put them in); ``tools`` (OpenAI's function definitions) go to
        templates that render them."""
        if not (args.chat_template or self.hf.chat_template):
            raise ValueError("messages: this model's tokenizer has no chat template")
        text = self.hf.apply_chat_template(
            messages,
            tools=cast(Any, tools),
            documents=cast(Any, args.documents),
            chat_template=args.chat_template,
            tokenize=False,
            add_generation_prompt=args.add_generation_prompt,
            continue_final_message=args.continue_final_message,
            **args.kwargs,
        )
        assert isinstance(text, str)
        return text

    def detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.rust, skip_special_tokens)


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas whose concatenation is the full decode.

    Bytes of a multi-byte character split across tokens are held back until complete
    (``tokenizers.DecodeStream`` keeps the prefix/read offsets on the Rust side, one call
    per token, so the cost does not grow with the output length).
    """

    def __init__(self, tokenizer: RustTokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def add(self, token_id: int) -> str:
        """Append one token; returns the newly completed text (may be empty)."""
        return self._stream.step(self._tokenizer, token_id) or ""


def _end_of_turn_ids(hf: PreTrainedTokenizerBase) -> list[int]:
    """Ids of the end-of-turn tokens the vocabulary has (whole tokens, looked up by their
    exact spelling; a converted GGUF vocabulary may not mark them as special)."""
    ids = (hf.backend_tokenizer.token_to_id(token) for token in END_OF_TURN_TOKENS)
    return [token_id for token_id in ids if token_id is not None]


def _load_gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase | None:
    """Convert once (transformers reads the GGUF vocabulary, ~30 s), then reuse the copy;
    None when the file has no vocabulary."""
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    target = cache_dir() / "tokenizers" / f"{path.stem}-{key.hexdigest()[:16]}"
    if not (target / "tokenizer_config.json").is_file():
        try:
            hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception:
            # transformers fails obscurely (KeyError) without a vocabulary; only then look.
            if "tokenizer.ggml.tokens" not in GGUFReader(path).fields:
                return None
            raise
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent))
        hf.save_pretrained(str(staging))
        try:
            staging.rename(target)
        except OSError:  # another process finished first; keep its copy
            shutil.rmtree(staging, ignore_errors=True)
    return AutoTokenizer.from_pretrained(str(target))
