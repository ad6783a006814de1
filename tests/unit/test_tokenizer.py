"""Tokenizer: SmolLM2's tokenizer converted from its GGUF once and cached, the chat
template, the incremental detokeniser (streamed = full decode, UTF-8 never split), and stop
strings applied by the engine (cut before the stop, held back while one may be forming)."""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import MIXED_SCRIPT_TEXTS
from transformers import AutoTokenizer

from infer import LLM, SamplingParams
from infer.config import cache_dir
from infer.contract.outputs import RequestOutput
from infer.loader.presets import embedded_model_path
from infer.tokenizer import Tokenizer

TEXTS = [
    *MIXED_SCRIPT_TEXTS,
    "math ∑ ∫ √ ≤ ≥ and arrows → ⇒ mixed with ASCII",
]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    loaded = Tokenizer.load(embedded_model_path())
    assert loaded is not None
    return loaded


def stream(tokenizer: Tokenizer, ids: list[int], skip_special_tokens: bool = True) -> list[str]:
    detokenizer = tokenizer.detokenizer(skip_special_tokens)
    return [detokenizer.add(token_id) for token_id in ids]


# --- loading and the on-disk cache ----------------------------------------------------------


def load_recording(monkeypatch: pytest.MonkeyPatch) -> tuple[Tokenizer, list[tuple[str, Any]]]:
    """Load SmolLM2's tokenizer, recording every ``AutoTokenizer.from_pretrained`` call."""
    calls: list[tuple[str, Any]] = []
    from_pretrained = AutoTokenizer.from_pretrained

    def spy(path: str, **kwargs: Any) -> Any:
        calls.append((path, kwargs))
        return from_pretrained(path, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", spy)
    loaded = Tokenizer.load(embedded_model_path())
    monkeypatch.undo()
    assert loaded is not None
    return loaded, calls


def test_conversion_is_cached_and_reused(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once converted, loading reads the saved copy under the cache dir: no GGUF parse."""
    again, calls = load_recording(monkeypatch)
    ((path, kwargs),) = calls
    copy = Path(path)
    assert kwargs == {}  # no gguf_file: not a conversion
    assert copy.parent == cache_dir() / "tokenizers"
    assert copy.name.startswith(embedded_model_path().stem + "-")
    assert (copy / "tokenizer.json").is_file() and (copy / "tokenizer_config.json").is_file()
    assert again.encode(TEXTS[1]) == tokenizer.encode(TEXTS[1])


def test_cache_dir_follows_infer_cache_dir(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A copy placed under ``INFER_CACHE_DIR`` is the one used (no 30 s conversion)."""
    _, ((path, _),) = load_recording(monkeypatch)
    monkeypatch.setenv("INFER_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path
    moved = tmp_path / "tokenizers" / Path(path).name
    shutil.copytree(path, moved)
    (moved / "chat_template.jinja").write_text("moved {{ 1 }}")
    loaded = Tokenizer.load(embedded_model_path())
    assert loaded is not None and loaded.hf.chat_template == "moved {{ 1 }}"


def test_checkpoint_without_tokenizer_files(tiny_checkpoint: Callable[[str], Path]) -> None:
    assert Tokenizer.load(tiny_checkpoint("llama")) is None


def test_checkpoint_directory_tokenizer(tokenizer: Tokenizer, tmp_path: Path) -> None:
    """From an HF directory (``tokenizer.json``); without a chat template, chat is refused."""
    tokenizer.hf.save_pretrained(str(tmp_path))
    for template in tmp_path.glob("chat_template.*"):
        template.unlink()
    loaded = Tokenizer.load(tmp_path, eos_token_ids=[7])
    assert loaded is not None
    assert loaded.encode(TEXTS[2]) == tokenizer.encode(TEXTS[2])
    assert loaded.eos_token_ids == {7, 2}
    with pytest.raises(ValueError, match=r"^messages: "):
        loaded.apply_chat_template(QUESTION)


# --- encoding and the chat template ---------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_round_trip(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert ids and tokenizer.decode(ids) == text


def test_a_batch_encodes_each_text_as_encode_does(tokenizer: Tokenizer) -> None:
    """``encode_batch`` (offsets skipped) gives the ids ``encode`` gives, text by text."""
    assert tokenizer.encode_batch(TEXTS) == [tokenizer.encode(text) for text in TEXTS]


def test_chat_template(tokenizer: Tokenizer) -> None:
    """SmolLM2's ChatML, its default system prompt, and the assistant turn opened."""
    ids = tokenizer.apply_chat_template(QUESTION)
    assert tokenizer.decode(ids, skip_special_tokens=False) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    start, end = tokenizer.hf.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert ids.count(start) == 3 and ids.count(end) == 2  # special tokens, not text
    with_system = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, *QUESTION]
    )
    assert tokenizer.decode(with_system).startswith("system\nBe brief.\nuser\n")


# --- incremental detokenisation -------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_is_the_full_decode(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    deltas = stream(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in delta for delta in deltas)
    streamed = ""
    for delta in deltas:  # every prefix is whole characters of the final text
        streamed += delta
        assert text.startswith(streamed)


def test_multibyte_characters_are_held_until_complete(tokenizer: Tokenizer) -> None:
    """🎉 is three byte-level tokens: nothing comes out until its last byte has arrived."""
    ids = tokenizer.encode("🎉")
    assert len(ids) == 3
    assert stream(tokenizer, ids) == ["", "", "🎉"]


def test_special_tokens_in_the_stream(tokenizer: Tokenizer) -> None:
    ids = tokenizer.apply_chat_template(QUESTION)
    assert "".join(stream(tokenizer, ids)) == tokenizer.decode(ids)
    assert "".join(stream(tokenizer, ids, skip_special_tokens=False)) == tokenizer.decode(
        ids, skip_special_tokens=False
    )


def test_random_token_sequences(tokenizer: Tokenizer) -> None:
    """Sampled tokens need not form valid UTF-8; the stream still agrees with the decode."""
    rng = random.Random(0)
    for _ in range(100):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(40)]
        assert "".join(stream(tokenizer, ids)) == tokenizer.decode(ids)


# --- stop strings through the engine --------------------------------------------------------

Streamed = tuple[list[str], RequestOutput]  # the new_text pieces, and the final output


def run(llm: LLM, params: list[SamplingParams]) -> list[Streamed]:
    """Drive the engine by hand, all requests in one batch, collecting each one's stream."""
    engine = llm.engine
    prompt = engine.encode_chat(QUESTION)
    request_ids = [engine.add_request(prompt, p) for p in params]
    pieces: dict[str, list[str]] = {request_id: [] for request_id in request_ids}
    final: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id in pieces:
                pieces[out.request_id].append(out.new_text)
                if out.finished:
                    final[out.request_id] = out
    return [(pieces[request_id], final[request_id]) for request_id in request_ids]


@pytest.fixture(scope="module")
def greedy(smollm2_llm: LLM) -> Streamed:
    """The unconstrained greedy answer; the stop strings below are chosen from it."""
    (result,) = run(smollm2_llm, [SamplingParams(temperature=0.0, max_tokens=40)])
    assert len(result[1].text) > 20
    return result


def stop_across_a_token_boundary(llm: LLM, text: str) -> str:
    """A 6-character piece of ``text`` near its middle that spans two tokens, found first
    where it is taken from."""
    ids = llm.tokenizer.encode(text)
    boundaries = [len(llm.tokenizer.decode(ids[:k])) for k in range(1, len(ids))]
    usable = [b for b in boundaries if 3 <= b <= len(text) - 3]
    for boundary in sorted(usable, key=lambda b: abs(b - len(text) // 2)):
        stop = text[boundary - 3 : boundary + 3]
        if text.find(stop) == boundary - 3:
            return stop
    raise AssertionError(f"no usable stop string in {text!r}")


@pytest.fixture(scope="module")
def stop_cases(smollm2_llm: LLM, greedy: Streamed) -> dict[str, tuple[list[str], Streamed]]:
    """Each case's stop strings and what the engine streamed for them (one batch)."""
    text = greedy[1].text
    cases = {
        "middle": [stop_across_a_token_boundary(smollm2_llm, text)],
        "earliest": [
            text[-5:],
            "never-seen",
            stop_across_a_token_boundary(smollm2_llm, text[: len(text) // 2]),
        ],
        "start": [text[:4]],
        "never": ["never-seen-at-all"],
    }
    params = [SamplingParams(temperature=0.0, max_tokens=40, stop=s) for s in cases.values()]
    return dict(zip(cases, zip(cases.values(), run(smollm2_llm, params))))


def test_streaming_without_stop_strings(smollm2_llm: LLM, greedy: Streamed) -> None:
    pieces, final = greedy
    assert "".join(pieces) == final.text
    assert final.text == smollm2_llm.tokenizer.decode(final.token_ids)
    assert all("\ufffd" not in piece for piece in pieces)


@pytest.mark.parametrize("case", ["middle", "earliest", "start"])
def test_stop_string_cuts_the_output(
    case: str, greedy: Streamed, stop_cases: dict[str, tuple[list[str], Streamed]]
) -> None:
    """The output ends right before the earliest stop string, the stop is not in it, and
    the streamed pieces never ran ahead of the final text."""
    text = greedy[1].text
    stops, (pieces, final) = stop_cases[case]
    cut = min(text.find(s) for s in stops if s in text)
    assert final.finish_reason == "stop"
    assert final.text == text[:cut]
    assert not any(s in final.text for s in stops)
    assert "".join(pieces) == final.text
    streamed = ""
    for piece in pieces:
        streamed += piece
        assert final.text.startswith(streamed)
    assert len(final.token_ids) < len(greedy[1].token_ids)


def test_held_back_text_is_released_at_the_end(
    greedy: Streamed, stop_cases: dict[str, tuple[list[str], Streamed]]
) -> None:
    """A stop string that never completes holds back the tail only until the request ends."""
    _, (pieces, final) = stop_cases["never"]
    assert final.text == greedy[1].text and "".join(pieces) == final.text
    assert final.finish_reason == greedy[1].finish_reason
    assert pieces[0] == ""  # the first token is shorter than the stop string


# --- stop tokens ------------------------------------------------------------------------------


def word_tokenizer(words: list[str], special: list[str], eos: str = "</s>") -> Any:
    """A fast tokenizer whose ids are the positions in ``words + special`` (``special`` added
    as special tokens, the way HF tokenizer.json files list them)."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate([eos, "<unk>", *words])}
    rust = RustTokenizer(WordLevel(vocab, unk_token="<unk>"))
    hf = PreTrainedTokenizerFast(tokenizer_object=rust, eos_token=eos, unk_token="<unk>")
    hf.add_special_tokens({"additional_special_tokens": special})
    return hf


@pytest.mark.parametrize("end_of_turn", ["<end_of_turn>", "<|eot_id|>", "<|im_end|>"])
@pytest.mark.parametrize("listed_as", ["special", "vocabulary"])
def test_end_of_turn_token_stops_whatever_the_metadata_says(
    end_of_turn: str, listed_as: str
) -> None:
    """A chat model stops at its end-of-turn token even when the checkpoint's EOS ids (here
    only ``</s>``) leave it out, whether the vocabulary marks it special or not (GGUF)."""
    words = ["hello", "world"]
    hf = (
        word_tokenizer(words, [end_of_turn])
        if listed_as == "special"
        else word_tokenizer([*words, end_of_turn], [])
    )
    end_id = hf.convert_tokens_to_ids(end_of_turn)
    assert end_id not in (None, hf.unk_token_id)
    assert Tokenizer(hf, eos_token_ids=[0]).eos_token_ids == {0, end_id}


def test_without_an_end_of_turn_token_only_eos_stops() -> None:
    hf = word_tokenizer(["hello", "<end_of_turn", "eot_id"], ["<|im_start|>"])
    assert Tokenizer(hf, eos_token_ids=[3]).eos_token_ids == {0, 3}


def test_generation_stops_at_the_end_of_turn_token(
    tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    """End to end: the tiny model's greedy continuation stops right after the token that the
    tokenizer spells ``<end_of_turn>``, though config.json's eos id is another."""
    for file in tiny_checkpoint("llama").iterdir():
        shutil.copy(file, tmp_path)
    prompt = list(range(10, 30))
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    options: dict[str, Any] = {"device": "cpu", "max_seq_len": 64, "num_gpu_blocks": 16}
    (free,) = LLM(str(tmp_path), **options).generate([prompt], greedy, use_tqdm=False)
    continuation = free.outputs[0].token_ids
    stop_at = next(
        i for i, t in enumerate(continuation) if i >= 2 and t > 2 and t not in continuation[:i]
    )
    assert not {0, 1, 2} & set(continuation[:stop_at])  # no other stop token comes first
    end_id = continuation[stop_at]
    words = [f"w{i}" for i in range(2, 320)]  # ids 0 and 1 are </s> and <unk>
    words[end_id - 2] = "<end_of_turn>"
    hf = word_tokenizer(words, [])
    assert hf.convert_tokens_to_ids("<end_of_turn>") == end_id
    hf.save_pretrained(str(tmp_path))
    llm = LLM(str(tmp_path), **options)
    params = SamplingParams(temperature=0.0, max_tokens=12)
    (stopped,) = llm.generate([prompt], params, use_tqdm=False)
    assert stopped.outputs[0].token_ids == continuation[: stop_at + 1]
    assert stopped.outputs[0].finish_reason == "stop"
