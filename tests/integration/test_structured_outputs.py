"""Structured outputs with the real SmolLM2 on the CPU: every constrained output parses and
validates, and constraints change nothing for the requests that have none."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import llguidance
import pytest

from infer import LLM, SamplingParams
from infer.contract.sampling_params import StructuredOutputsParams
from infer.engine.structured.grammar_cache import CompiledGrammar

CASES = json.loads((Path(__file__).parents[1] / "unit" / "data" / "json_schemas.json").read_text())


def _ask(name: str) -> list[dict[str, str]]:
    """A short request (the grammar, not the prompt, makes the output valid)."""
    return [{"role": "user", "content": f"Reply in JSON: a {name.replace('_', ' ')}."}]


def test_twenty_json_schemas_all_parse_and_validate(smollm2_llm: Any) -> None:
    params = [
        SamplingParams(
            temperature=0.7 if i % 2 else 0.0,
            seed=i,
            max_tokens=100,
            structured_outputs=StructuredOutputsParams(json=case["schema"]),
        )
        for i, case in enumerate(CASES)
    ]
    results = smollm2_llm.chat([_ask(c["name"]) for c in CASES], params, use_tqdm=False)
    for case, result in zip(CASES, results):
        out = result.outputs[0]
        assert out.finish_reason == "stop", (case["name"], out.text)
        jsonschema.validate(json.loads(out.text), case["schema"])


def test_regex_and_choice(smollm2_llm: Any) -> None:
    pattern = r"[A-Z][a-z]{2,8} [0-9]{1,3}"
    params = [
        SamplingParams(
            n=2,
            temperature=1.0,
            seed=3,
            max_tokens=16,
            structured_outputs=StructuredOutputsParams(regex=pattern),
        ),
        SamplingParams(
            temperature=0.0,
            max_tokens=8,
            structured_outputs=StructuredOutputsParams(choice=["positive", "negative"]),
        ),
        SamplingParams(
            temperature=0.0,
            max_tokens=24,
            structured_outputs=StructuredOutputsParams(
                grammar='start: "(" NUM " " OP " " NUM ")"\nNUM: /[0-9]{1,2}/\nOP: "+" | "-"'
            ),
        ),
    ]
    prompts = ["A name and a number:", "Review: I loved it. Sentiment:", "An arithmetic sum:"]
    regex, choice, grammar = smollm2_llm.generate(prompts, params, use_tqdm=False)
    assert len(regex.outputs) == 2
    for out in regex.outputs:
        assert re.fullmatch(pattern, out.text), out.text
    assert choice.outputs[0].text in ("positive", "negative")
    assert re.fullmatch(r"\([0-9]{1,2} [+-] [0-9]{1,2}\)", grammar.outputs[0].text)


def test_free_requests_get_the_same_tokens_beside_constrained_ones(smollm2_llm: Any) -> None:
    free = [
        SamplingParams(temperature=0.0, max_tokens=12),
        SamplingParams(temperature=0.9, seed=11, max_tokens=12),
    ]
    prompts = ["The capital of France is", "Once upon a time"]
    alone = smollm2_llm.generate(prompts, free, use_tqdm=False)
    constrained = SamplingParams(
        temperature=0.0,
        max_tokens=12,
        structured_outputs=StructuredOutputsParams(json=CASES[0]["schema"]),
    )
    mixed = smollm2_llm.generate(
        [prompts[0], "Describe a person:", prompts[1]],
        [free[0], constrained, free[1]],
        use_tqdm=False,
    )
    assert [r.outputs[0].token_ids for r in alone] == [
        mixed[0].outputs[0].token_ids,
        mixed[2].outputs[0].token_ids,
    ]


def test_scheduled_ahead_constrained_steps_sample_what_synchronous_steps_do(
    smollm2_llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With async scheduling a constrained (or penalised) request's forward pass is queued
    ahead and its sampling waits for the previous token: the tokens are those of the
    synchronous loop, which launches nothing ahead."""
    schema = StructuredOutputsParams(json=CASES[0]["schema"])
    params = [
        SamplingParams(temperature=0.0, max_tokens=24, structured_outputs=schema),
        SamplingParams(temperature=0.8, seed=5, max_tokens=24, structured_outputs=schema),
        SamplingParams(temperature=0.0, max_tokens=12, frequency_penalty=1.0),
        SamplingParams(temperature=0.0, max_tokens=12),
    ]
    prompts = ["Describe a person:", "A person in JSON:", "Once upon a time", "The sky is"]
    engine = smollm2_llm.engine
    launched = []
    original = engine.runner.launch

    def counting(*args: Any) -> Any:
        launched.append(args[0])
        return original(*args)

    monkeypatch.setattr(engine.runner, "launch", counting)
    ahead = smollm2_llm.generate(prompts, params, use_tqdm=False)
    # Constrained rows ran ahead (fed from the device), their masks filled afterwards.
    assert any(s.fed_rows and any(c.request.grammar for c in s.chunks) for s in launched)
    monkeypatch.setattr(engine, "ahead", None)  # the synchronous step from here on
    synchronous = smollm2_llm.generate(prompts, params, use_tqdm=False)
    assert [r.outputs[0].token_ids for r in ahead] == [r.outputs[0].token_ids for r in synchronous]
    for r in ahead[:2]:
        if r.outputs[0].finish_reason == "stop":
            json.loads(r.outputs[0].text)


def test_constrained_requests_preempted_and_recomputed_keep_to_their_grammars(
    smollm2_llm: Any,
) -> None:
    """In a pool too small for all of them, constrained requests are preempted mid-output
    and recomputed (their matchers keep the tokens they had): each gives the output it gives
    in a roomy pool, and it validates."""
    cases = CASES[:6]
    params = [
        SamplingParams(
            temperature=0.0,
            max_tokens=60,
            structured_outputs=StructuredOutputsParams(json=c["schema"]),
        )
        for c in cases
    ]
    asks = [_ask(c["name"]) for c in cases]
    roomy = smollm2_llm.chat(asks, params, use_tqdm=False)
    tight = LLM(
        "smollm2-135m", num_gpu_blocks=40, block_size=4, max_seq_len=160, admission_reserve=0.0
    )
    cramped = tight.chat(asks, params, use_tqdm=False)
    assert tight.cache_stats()["preemptions"] >= 1
    assert [r.outputs[0].token_ids for r in cramped] == [r.outputs[0].token_ids for r in roomy]
    for case, result in zip(cases, cramped):
        if result.outputs[0].finish_reason == "stop":
            jsonschema.validate(json.loads(result.outputs[0].text), case["schema"])


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_matcher_that_fails_ends_its_request_with_the_error(
    smollm2_llm: Any, monkeypatch: pytest.MonkeyPatch, async_scheduling: bool
) -> None:
    """A mask beyond llguidance's limits gives only the end of sequence: the request ends
    with the matcher's error (counted), not as a stop, and the request beside it goes on."""
    tight = llguidance.LLParserLimits(step_lexer_fuel=1)  # enough until a string opens

    def compiled(self: CompiledGrammar) -> llguidance.LLMatcher:
        return llguidance.LLMatcher(self._tokenizer, self._grammar, log_level=0, limits=tight)

    monkeypatch.setattr(CompiledGrammar, "_compiled", compiled)
    engine = smollm2_llm.engine
    monkeypatch.setattr(engine.config, "use_async_scheduling", async_scheduling)
    key = f"name_{async_scheduling}"  # a grammar new to the engine's cache: compiled tight
    schema = {"type": "object", "properties": {key: {"type": "string"}}, "required": [key]}
    params = [
        SamplingParams(
            temperature=0.0, max_tokens=24, structured_outputs=StructuredOutputsParams(json=schema)
        ),
        SamplingParams(temperature=0.0, max_tokens=12),
    ]
    errors = engine.num_structured_output_errors
    failed, free = smollm2_llm.generate(["A person in JSON:", "The sky is"], params, use_tqdm=False)
    out = failed.outputs[0]
    assert out.finish_reason == "error", out
    assert (out.error or "").startswith("structured_outputs: the grammar's matcher failed: ")
    # What the grammar allowed until then; its last token may be missing: the request ends
    # before or after that token is recorded, as the failing fill ends first or not.
    opening = f'{{"{key}": "'
    assert out.text.startswith('{"')
    assert opening.startswith(out.text) or out.text.startswith(opening), out.text
    assert free.outputs[0].finish_reason == "length"
    assert engine.num_structured_output_errors == errors + 1


def test_cut_by_max_tokens_says_length(smollm2_llm: Any) -> None:
    params = SamplingParams(
        temperature=0.0,
        max_tokens=3,
        structured_outputs=StructuredOutputsParams(json=CASES[-1]["schema"]),
    )
    out = smollm2_llm.chat(_ask(CASES[-1]["name"]), params, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "length"
    assert len(out.token_ids) == 3


@pytest.mark.parametrize(
    ("kind", "value", "field"),
    [
        ("json", {"type": "nonsense"}, "structured_outputs.json"),
        ("json", "{not json", "structured_outputs.json"),
        ("regex", "a(b", "structured_outputs.regex"),
        ("choice", [], "structured_outputs.choice"),
        ("grammar", "start: undefined_rule", "structured_outputs.grammar"),
    ],
)
def test_bad_constraints_raise_naming_the_field(kind: str, value: Any, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{re.escape(field)}: "):
        StructuredOutputsParams(**{kind: value})


def test_exactly_one_constraint() -> None:
    with pytest.raises(ValueError, match=r"^structured_outputs: exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match=r"^structured_outputs: exactly one"):
        StructuredOutputsParams()
