"""Grammars in the engine: the sampler's bitmask, admission while a grammar compiles, and
matchers that follow a request's tokens (SmolLM2's tokenizer, no model)."""

from __future__ import annotations

import json
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import llguidance
import llguidance.hf
import pytest
import torch

from infer.contract.constraints import grammar_for
from infer.contract.sampling_params import SamplingParams, StructuredOutputsParams
from infer.engine.core.request import Request
from infer.engine.core.sampler import SamplingBatch, greedy, sample
from infer.engine.core.scheduler import next_admissible
from infer.engine.structured.bitmask import start_bitmask
from infer.engine.structured.grammar import language_error, ll_tokenizer
from infer.engine.structured.grammar_cache import (
    LEXERS_PER_THREAD,
    MAX_GRAMMARS_WITH_LEXERS,
    RequestGrammar,
    StructuredOutputs,
)
from infer.loader import resolve_model
from infer.tokenizer import Tokenizer

CASES = json.loads((Path(__file__).parents[2] / "data" / "json_schemas.json").read_text())


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    path = resolve_model("smollm2-135m").tokenizer_path
    assert path is not None
    loaded = Tokenizer.load(Path(path))
    assert loaded is not None
    return loaded


def _request(params: SamplingParams, name: str = "r") -> Request:
    return Request(name, [1, 2, 3], 3, params, seed=0)


def _ready(matcher: Any = None) -> RequestGrammar:
    future: Future[Any] = Future()
    future.set_result(matcher)
    return RequestGrammar(future, deque())


def _caught_up(request: Request, output: list[int]) -> Any:
    """The request's matcher after ``output`` (its output tokens made exactly these)."""
    del request.token_ids[request.num_prompt_tokens :]
    request.token_ids += output
    assert request.grammar is not None
    catch_up = request.grammar.catch_up(request)
    catch_up.apply()
    return catch_up.matcher


def _free_and_yes_or_no(tokenizer: Tokenizer) -> tuple[Request, Request]:
    """A free greedy request and one that must answer "yes" or "no", its grammar compiled."""
    grammars = StructuredOutputs(tokenizer, 49152)
    choice = StructuredOutputsParams(choice=["yes", "no"])
    constrained = _request(SamplingParams(temperature=0.0, structured_outputs=choice), "c")
    grammars.attach(constrained)
    assert constrained.grammar is not None
    while not constrained.grammar.ready:
        time.sleep(0.01)
    return _request(SamplingParams(temperature=0.0), "f"), constrained


def test_the_bitmask_bans_what_the_grammar_forbids(tokenizer: Tokenizer) -> None:
    free, constrained = _free_and_yes_or_no(tokenizer)
    logits = torch.randn(2, 49152)
    batch = SamplingBatch.from_requests([free, constrained], 49152, torch.device("cpu"))
    tokens = sample(logits.clone(), batch).token_ids.tolist()
    assert tokens[0] == int(logits[0].argmax())  # the free row is untouched
    assert tokenizer.decode([tokens[1]]) in ("y", "ye", "yes", "n", "no")


def test_end_ids_beyond_the_tokenizer_do_not_stop_a_grammar_compiling(
    tokenizer: Tokenizer,
) -> None:
    """A model's config may list end ids past a smaller tokenizer's vocabulary (a checkpoint
    pairing llama-3.2-3b's shapes with SmolLM2's tokenizer lists 128001)."""
    wide = Tokenizer(tokenizer.hf, [*tokenizer.eos_token_ids, 128001])
    grammars = StructuredOutputs(wide, 128256)
    request = _request(SamplingParams(structured_outputs=StructuredOutputsParams(json={})))
    grammars.attach(request)
    assert request.grammar is not None
    while not request.grammar.ready:
        time.sleep(0.01)
    assert request.grammar.error is None


def test_matchers_follow_tokens_and_take_them_back(tokenizer: Tokenizer) -> None:
    grammars = StructuredOutputs(tokenizer, 49152)
    for case in CASES:
        request = _request(
            SamplingParams(structured_outputs=StructuredOutputsParams(json=case["schema"]))
        )
        grammars.attach(request)
        assert request.grammar is not None
        text = json.dumps(case["example"])
        output = tokenizer.hf.encode(text, add_special_tokens=False)
        matcher = _caught_up(request, output)
        assert not matcher.is_error(), (case["name"], matcher.get_error())
        assert matcher.is_accepting(), case["name"]
        assert not _caught_up(request, output[:1]).is_accepting()  # rolled back


def test_waiting_requests_pass_one_whose_grammar_compiles() -> None:
    compiling = _request(SamplingParams(), "compiling")
    compiling.grammar = RequestGrammar(Future(), deque())
    failed_future: Future[Any] = Future()
    failed_future.set_exception(ValueError("too complex"))
    broken = _request(SamplingParams(), "broken")
    broken.grammar = RequestGrammar(failed_future, deque())
    free = _request(SamplingParams(), "free")
    waiting, failed = deque([compiling, broken, free]), []
    assert next_admissible(waiting, failed) is free
    assert failed == [broken] and broken.finish_reason == "error"
    assert "too complex" in (broken.error or "")
    assert list(waiting) == [compiling, free]
    waiting.remove(free)
    assert next_admissible(waiting, failed) is None
    compiling.grammar = _ready()
    assert next_admissible(waiting, failed) is compiling


def test_constrained_greedy_requests_take_the_argmax_and_sample_after_the_host() -> None:
    params = SamplingParams(temperature=0.0, structured_outputs=StructuredOutputsParams(regex="a"))
    assert params.needs_output_tokens
    assert _request(params).greedy_argmax  # within their mask
    assert not SamplingParams().needs_output_tokens


def test_greedy_rows_of_a_step_take_the_argmax_within_their_grammars_mask(
    tokenizer: Tokenizer,
) -> None:
    """The sampler's greedy path (no settings gathered) gives the tokens of the full one:
    the free row its argmax, the constrained row the best token its grammar allows."""
    requests, cpu = [*_free_and_yes_or_no(tokenizer)], torch.device("cpu")
    logits = torch.randn(2, 49152)
    full = sample(logits.clone(), SamplingBatch.from_requests(requests, 49152, cpu))
    fast = greedy(logits.clone(), requests, 49152, cpu)
    assert fast.token_ids.tolist() == full.token_ids.tolist()
    assert fast.token_ids[0] == logits[0].argmax()


def test_one_parallel_fill_gives_each_row_its_own_mask(tokenizer: Tokenizer) -> None:
    """Rows in different grammar states (and a free row, and a finished one) filled in one
    call get the masks their matchers give one at a time."""
    grammars = StructuredOutputs(tokenizer, 49152)
    texts = [json.dumps(case["example"]) for case in CASES[:4]]
    requests = [_request(SamplingParams(), "free")]
    for k, case in enumerate(CASES[:4]):
        request = _request(
            SamplingParams(structured_outputs=StructuredOutputsParams(json=case["schema"])),
            f"c{k}",
        )
        grammars.attach(request)
        output = tokenizer.hf.encode(texts[k], add_special_tokens=False)
        request.token_ids += output[: 1 + 3 * k]  # each row mid-way, at its own place
        requests.append(request)
    done = _request(SamplingParams(structured_outputs=StructuredOutputsParams(regex="a+")), "d")
    grammars.attach(done)
    done.finish("stop")
    requests.append(done)
    started = start_bitmask(requests, 49152, torch.device("cpu"))
    assert started is not None
    rows, bits = started.result()
    assert rows == [1, 2, 3, 4]
    for k, i in enumerate(rows):
        grammar = requests[i].grammar
        assert grammar is not None
        alone = _caught_up(requests[i], requests[i].output_token_ids).deep_copy()
        expected = torch.zeros(bits.shape[1], dtype=torch.int32)
        alone.unsafe_compute_mask_ptr(expected.data_ptr(), expected.numel() * 4)
        assert torch.equal(bits[k], expected), requests[i].request_id
        assert bool((expected != -1).any())  # a real constraint


def test_a_mask_started_before_its_token_is_recorded_is_the_mask_after_it(
    tokenizer: Tokenizer,
) -> None:
    """The engine starts a step's masks with the tokens it has just collected, before
    ``update`` records them: the matcher consumes the pending token, and when the token is
    recorded it is not consumed twice."""
    grammars = StructuredOutputs(tokenizer, 49152)
    schema = CASES[0]["schema"]
    output = tokenizer.hf.encode(json.dumps(CASES[0]["example"]), add_special_tokens=False)
    early, late = (
        _request(SamplingParams(structured_outputs=StructuredOutputsParams(json=schema)), name)
        for name in ("early", "late")
    )
    for request in (early, late):
        grammars.attach(request)
        request.token_ids += output[:3]
    device = torch.device("cpu")
    started = start_bitmask([early], 49152, device, pending={"early": output[3]})
    late.token_ids.append(output[3])
    recorded = start_bitmask([late], 49152, device)
    assert started is not None and recorded is not None
    assert torch.equal(started.result()[1], recorded.result()[1])
    early.token_ids.append(output[3])  # update records it: the next mask follows on
    early.token_ids.append(output[4])
    late.token_ids.append(output[4])
    nxt, expected = start_bitmask([early], 49152, device), start_bitmask([late], 49152, device)
    assert nxt is not None and expected is not None
    assert torch.equal(nxt.result()[1], expected.result()[1])


def test_a_token_its_grammar_forbids_fails_the_request_once(tokenizer: Tokenizer) -> None:
    """A sampled token the matcher cannot consume leaves it in its error state: the fill
    gives the row only the end of sequence and reports the request, once, for the engine to
    end it with the matcher's error."""
    grammars = StructuredOutputs(tokenizer, 49152)
    request = _request(SamplingParams(structured_outputs=StructuredOutputsParams(choice=["yes"])))
    grammars.attach(request)
    forbidden = tokenizer.hf.encode("maybe", add_special_tokens=False)[0]
    device = torch.device("cpu")
    started = start_bitmask([request], 49152, device, pending={request.request_id: forbidden})
    assert started is not None
    _, bits = started.result()
    allowed = bits[0].view(torch.uint8)[:, None] >> torch.arange(8, dtype=torch.uint8) & 1
    assert set(allowed.flatten().nonzero().flatten().tolist()) == set(tokenizer.eos_token_ids)
    assert grammars.take_failed() == [request]
    assert request.grammar is not None and request.grammar.failure is not None
    assert request.grammar.failure.startswith("structured_outputs: the grammar's matcher failed: ")
    assert f'token "{tokenizer.decode([forbidden])}"' in request.grammar.failure
    request.token_ids.append(forbidden)  # recorded meanwhile: the next fill finds it again
    again = start_bitmask([request], 49152, device)
    assert again is not None
    again.result()
    assert grammars.take_failed() == []


def test_the_finer_slices_give_the_default_slices_masks(tokenizer: Tokenizer) -> None:
    """``SLICES`` only makes masks cheaper: at every step of strings with and without a
    ``maxLength``, the mask is the one llguidance's default slices give."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}},
            "note": {"type": "string"},
        },
        "required": ["name", "tags", "note"],
    }
    text = json.dumps({"name": "Ada Lovelace", "tags": ["x", "math", "ab cd"], "note": "hi 2"})
    tokens = tokenizer.hf.encode(text, add_special_tokens=False)
    grammars = StructuredOutputs(tokenizer, 49152)
    default = llguidance.hf.from_tokenizer(tokenizer.hf, n_vocab=49152, eos_token=[2])  # type: ignore[arg-type]
    grammar = grammar_for("json", schema)
    ours, _ = grammars._build(grammar).copy()
    theirs = llguidance.LLMatcher(default, grammar)
    for token in [*tokens, None]:
        assert ours.compute_bitmask() == theirs.compute_bitmask()
        if token is not None:
            assert ours.consume_token(token) and theirs.consume_token(token)


def _compiled(grammars: StructuredOutputs, request: Request) -> Any:
    assert request.grammar is not None
    return request.grammar._compiled.result()


def _settled(grammars: StructuredOutputs) -> None:
    """Wait for what the grammar worker has queued (lexers added after a compile)."""
    assert grammars._executor is not None
    grammars._executor.submit(lambda: None).result()


def test_a_grammar_asked_for_again_gets_lexers_for_the_threads_and_spreads_its_copies(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFER_GRAMMAR_THREADS", "2")
    grammars = StructuredOutputs(tokenizer, 49152)
    once, first, again = (
        _request(SamplingParams(structured_outputs=StructuredOutputsParams(regex=regex)))
        for regex in ("a+", "b+", "b+")
    )
    for request in (once, first, again):
        grammars.attach(request)
    _settled(grammars)
    assert _compiled(grammars, once).num_lexers == 1  # a one-off grammar pays for no more
    shared = _compiled(grammars, first)
    assert shared is _compiled(grammars, again)
    assert shared.num_lexers == LEXERS_PER_THREAD * 2
    lexers = [shared.copy()[1] for _ in range(2 * shared.num_lexers)]
    assert lexers == [*range(shared.num_lexers)] * 2


def test_rows_copied_from_different_lexers_get_their_own_masks(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight requests of one schema, spread over four lexers, each at its own place in the
    example: one parallel fill gives every row the mask its matcher gives alone."""
    monkeypatch.setenv("INFER_GRAMMAR_THREADS", "2")
    grammars = StructuredOutputs(tokenizer, 49152)
    params = SamplingParams(structured_outputs=StructuredOutputsParams(json=CASES[1]["schema"]))
    output = tokenizer.hf.encode(json.dumps(CASES[1]["example"]), add_special_tokens=False)
    requests = [_request(params, f"r{k}") for k in range(8)]
    for request in requests:
        grammars.attach(request)
    _settled(grammars)
    for k, request in enumerate(requests):
        request.token_ids += output[: 2 * k]
    started = start_bitmask(requests, 49152, torch.device("cpu"))
    assert started is not None
    rows, bits = started.result()
    assert rows == list(range(8))
    assert {r.grammar._lexer for r in requests if r.grammar is not None} == {0, 1, 2, 3}
    for k, request in enumerate(requests):
        alone = _compiled(grammars, request).copy()[0]
        assert alone.consume_tokens(output[: 2 * k])
        expected = torch.zeros(bits.shape[1], dtype=torch.int32)
        alone.unsafe_compute_mask_ptr(expected.data_ptr(), expected.numel() * 4)
        assert torch.equal(bits[k], expected), request.request_id


def test_only_the_most_recently_reused_grammars_keep_their_lexers(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lexers grow with use, so beyond ``MAX_GRAMMARS_WITH_LEXERS`` grammars the least
    recently reused one goes back to one (its requests' matchers keep theirs)."""
    monkeypatch.setenv("INFER_GRAMMAR_THREADS", "1")
    grammars = StructuredOutputs(tokenizer, 49152)
    count = MAX_GRAMMARS_WITH_LEXERS + 1
    requests = [
        _request(SamplingParams(structured_outputs=StructuredOutputsParams(regex=f"a{{{k}}}")))
        for k in range(1, count + 1)
        for _ in range(2)  # asked for twice: reused
    ]
    for request in requests[:2]:
        grammars.attach(request)
    kept = _compiled(grammars, requests[0]).copy()[0]
    for request in requests[2:]:
        grammars.attach(request)
    _settled(grammars)
    lexers = [_compiled(grammars, r).num_lexers for r in requests[::2]]
    assert lexers == [1] + [LEXERS_PER_THREAD] * (count - 1)
    assert kept.consume_token(tokenizer.hf.encode("a", add_special_tokens=False)[0])


def test_empty_and_endless_languages_have_no_satisfying_reply(tokenizer: Tokenizer) -> None:
    vocabulary = ll_tokenizer(tokenizer, 49152)

    def error(lark: str) -> str | None:
        return language_error(llguidance.grammar_from("lark", lark), vocabulary)

    assert (error("start: a b\na: b\nb: a\n") or "").startswith("its language is empty")
    assert (error('start: a\na: "x" a\n') or "").startswith("its forced output never ends")
    choice = 'start: a | b\na: "x" a\nb: "y" b\n'  # the first mask offers "x" and "y"
    assert error(choice) == (
        "its language is empty: rules start, a, b never end "
        "(each of their alternatives needs one of them)"
    )
    assert error(choice.replace('"y" b', '"y" b | "z"')) is None
    assert error('start: "x"+') is None
    assert error(f'start: "{"y" * 300}"') is None  # forced all the way, and then it ends
    assert error('start: "a" /[0-9]+/') is None
