"""Reasoning parsers: thoughts apart from the answer, streamed and whole alike."""

from __future__ import annotations

import json

import pytest

from infer.contract.sampling_params import StructuredOutputsParams
from infer.server.openai.reasoning import PARSERS, Reasoning, reasoning_parser

QWEN3 = PARSERS["qwen3"]
DEEPSEEK_R1 = PARSERS["deepseek_r1"]

# (output, thinking on?, expected (reasoning_content, content))
SPLITS = [
    ("<think>\nLet me see.\n</think>\n\nParis.", True, ("\nLet me see.\n", "Paris.")),
    ("<think>a</think> \n", True, ("a", None)),  # only the separator after the thoughts
    ("  <think>a</think>b", True, ("a", "b")),
    ("Let me see.</think>Paris.", True, ("Let me see.", "Paris.")),  # opened by the prompt
    ("<think>cut off by max_tokens", True, ("cut off by max_tokens", None)),
    ("<think>done</think>", True, ("done", None)),
    ("<thi", True, ("<thi", None)),  # a truncated opener is unfinished thinking
    ("a </think> b </think> c", True, ("a ", "b </think> c")),  # the first end ends it
    ("a < b and </thinking> too</think>x", True, ("a < b and </thinking> too", "x")),
    ("Paris.", False, (None, "Paris.")),
    ("\n\nParis.", False, (None, "\n\nParis.")),  # thinking off: the output as it is
    ("<think>x</think>y", False, (None, "<think>x</think>y")),  # thinking off: all answer
    ("", True, (None, None)),
]


@pytest.mark.parametrize(("text", "thinking", "expected"), SPLITS)
def test_whole_outputs_split_at_the_end_of_thinking(
    text: str, thinking: bool, expected: tuple[str | None, str | None]
) -> None:
    assert Reasoning(thinking).split(text) == expected


@pytest.mark.parametrize(("text", "thinking", "expected"), SPLITS)
def test_every_way_of_streaming_an_output_splits_it_as_the_whole(
    text: str, thinking: bool, expected: tuple[str | None, str | None]
) -> None:
    """Cut into two pieces at every point and into single characters: the deltas add up to
    the whole split (a tag given out in part would stay in the reasoning)."""
    cuts = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for pieces in cuts:
        reasoning = Reasoning(thinking)
        deltas = [
            reasoning.delta(0, piece, finished=i == len(pieces) - 1)
            for i, piece in enumerate(pieces)
        ]
        joined = tuple("".join(part[k] for part in deltas) or None for k in (0, 1))
        assert joined == expected, pieces


def test_choices_stream_apart() -> None:
    reasoning = Reasoning(thinking=True)
    assert reasoning.delta(0, "<think>a", finished=False) == ("a", "")
    assert reasoning.delta(1, "b</think>", finished=False) == ("b", "")
    assert reasoning.delta(0, "</think>c", finished=True) == ("", "c")


def test_qwen3_thinks_unless_the_template_switch_is_false() -> None:
    assert QWEN3.thinks({}) and QWEN3.thinks({"enable_thinking": True})
    assert not QWEN3.thinks({"enable_thinking": False})
    assert DEEPSEEK_R1.thinks({"enable_thinking": False})  # no switch: always thinks


def test_a_constraint_after_thinking_keeps_the_answer_grammar_behind_free_thoughts() -> None:
    answer = StructuredOutputsParams(json={"type": "object"})
    for tokens in (True, False):
        wrapped = QWEN3.after_thinking(answer, tags_are_tokens=tokens)
        grammars = json.loads(wrapped.compiled_grammar)["grammars"]
        top, inner = grammars
        assert top["lark_grammar"].startswith("start: ") and "@answer" in top["lark_grammar"]
        assert ("<think>?" in top["lark_grammar"]) == tokens  # a token, or "<think>" text
        assert inner["name"] == "answer"
        assert (
            inner["json_schema"]
            == json.loads(answer.compiled_grammar)["grammars"][0]["json_schema"]
        )
    lark = QWEN3.after_thinking(StructuredOutputsParams(choice=["yes"]), tags_are_tokens=True)
    assert json.loads(lark.compiled_grammar)["grammars"][1]["lark_grammar"] == 'start: "yes"'


def test_the_flag_names_a_parser() -> None:
    assert reasoning_parser("qwen3") is QWEN3 and reasoning_parser(None) is None
    with pytest.raises(SystemExit, match="deepseek_r1, qwen3"):
        reasoning_parser("r1")
