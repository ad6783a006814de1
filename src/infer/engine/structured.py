"""Structured outputs: grammars (JSON schemas, regexes, choices, Lark/EBNF) that constrain
what a request may generate, as a token bitmask the batched sampler applies on the device.

Built on llguidance, chosen by measurement (``benchmarks/bench_grammar.py``; on SmolLM2's
49,152-token vocabulary it compiled 20 schemas in 0.24 ms each against xgrammar's 30 ms,
and filled a mask in 45 µs against 168 µs), and shipped as one abi3 wheel with no
dependencies.

- ``grammar_for`` checks a constraint and turns it into llguidance's grammar text, when
  ``StructuredOutputsParams`` is made (in the API process for the server).
- ``StructuredOutputs`` (the engine's) compiles each distinct grammar once, in a worker
  thread, and caches it (``CompiledGrammar``); every constrained request gets its own copy
  of a compiled matcher (``RequestGrammar``). The scheduler admits a request once its
  grammar is ready (``next_admissible``); nobody else waits for it.
- ``start_bitmask`` starts filling a step's masks in llguidance's threads (the GIL
  released) after its forward pass was queued: for a step scheduled ahead, as soon as the
  previous step's tokens reach the host, and the engine records those tokens and schedules
  the next step meanwhile (``Engine.step``); the sampler waits for the masks. Each matcher
  first consumes the request's output tokens it has not seen; a preempted request keeps its
  output tokens, so its matcher stays valid. Requests without a constraint cost nothing: no
  mask is built when no row has one.
- A matcher that fails (a sampled token it cannot consume, a mask beyond llguidance's
  limits) gives only the end of sequence as its mask; the fill finds it in its error state
  and the engine ends the request with the error (``StructuredOutputs.take_failed``), so a
  broken output never passes for a stop.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.hf
import torch
from llguidance import LLExecutor, LLMatcher, LLTokenizer
from torch import Tensor

from infer.gil import hand_over_gil_often
from infer.tokenizer import Tokenizer

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

    from infer.engine.request import Request

logger = logging.getLogger(__name__)

# JSON as ``json.dumps`` writes it (", " and ": ", no other whitespace): a small model may
# otherwise spend its tokens on newlines and indentation, and never close the object.
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
ANY_JSON_OBJECT = {"type": "object"}
MAX_CACHED_GRAMMARS = 256
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
# llguidance's copies of a matcher share its lexer behind one lock, so the masks of copies
# of one compiled matcher are filled one at a time however many threads fill them. A
# grammar that several requests use is compiled this many times per mask-filling thread,
# and its requests' copies are spread over the compiled matchers (H100 host, 256 rows in
# random strings, 8 threads, 50 steps: 703 ms of fills with one lexer, 227 with 8, 201
# with 16, 189 with 32: ``benchmarks/bench_mask_fill.py``).
LEXERS_PER_THREAD = 2
# Grammars that keep their extra lexers (the most recently used; the others go back to
# one): a lexer grows by ~0.17 MB of states over 60 steps of random strings.
MAX_GRAMMARS_WITH_LEXERS = 16
# The field a grammar's errors name, in the engine as in the API.
GRAMMAR_FIELD = "structured_outputs"


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
        raise GrammarError(field, _one_line(str(exc))) from None
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise GrammarError(field, _one_line(error))
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


def _one_line(message: str) -> str:
    return " ".join(message.split())[:_MAX_DETAIL]


class CompiledGrammar:
    """A grammar compiled for llguidance: the matchers requests copy theirs from. A copy
    shares its source's lexer (and the lexer states it has built) behind a lock; sources
    compiled apart share nothing, so copies of different sources fill masks in parallel."""

    def __init__(self, tokenizer: LLTokenizer, grammar: str) -> None:
        self._tokenizer = tokenizer
        self._grammar = grammar
        self._sources = [self._compiled()]
        self._next = 0

    def _compiled(self) -> LLMatcher:
        matcher = LLMatcher(self._tokenizer, self._grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(_one_line(matcher.get_error()))
        return matcher

    @property
    def num_lexers(self) -> int:
        return len(self._sources)

    def add_lexers(self, total: int) -> None:
        """Compile more sources until there are ``total`` (in the worker thread: the
        engine's thread may copy from those that exist meanwhile)."""
        while len(self._sources) < total:
            self._sources.append(self._compiled())

    def drop_lexers(self) -> None:
        """Back to the first source (matchers copied from the others keep theirs)."""
        self._sources = self._sources[:1]

    def copy(self) -> tuple[LLMatcher, int]:
        """A new request's matcher and its lexer's index, the sources taken in turn."""
        sources = self._sources  # one list, whatever the worker thread does meanwhile
        lexer = self._next % len(sources)
        self._next += 1
        return sources[lexer].deep_copy(), lexer


class RequestGrammar:
    """One request's matcher: a copy of its grammar's compiled matcher, advanced over the
    request's output tokens as they become known. A matcher that fails (a token it cannot
    consume, a mask it cannot compute) puts its request in ``failed`` once, for the engine
    to end it with ``failure``."""

    def __init__(self, compiled: Future[CompiledGrammar], failed: deque[Request]) -> None:
        self._compiled = compiled
        self._matcher: LLMatcher | None = None
        self._lexer = 0  # which of its grammar's lexers the matcher shares
        self._consumed = 0  # output tokens the matcher has seen
        self._failed = failed
        self.failure: str | None = None  # why the matcher failed, once it has

    @property
    def ready(self) -> bool:
        """Whether compiling ended (in success or failure)."""
        return self._compiled.done()

    def when_ready(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (in the compiling thread, or now) once compiling ended."""
        self._compiled.add_done_callback(lambda _: callback())

    @property
    def error(self) -> str | None:
        """Why the grammar failed to compile (None while compiling or when it compiled)."""
        if not self._compiled.done():
            return None
        exc = self._compiled.exception()
        return None if exc is None else str(exc)

    def catch_up(self, request: Request, pending: int | None = None) -> CatchUp:
        """What the matcher must do to reach the state after the request's output tokens and
        ``pending`` (a token sampled for it that the host has not recorded yet); counted as
        done (``CatchUp.apply`` does it, before the matcher is next used)."""
        if self._matcher is None:  # copied at first use: a grammar's lexers are added meanwhile
            self._matcher, self._lexer = self._compiled.result().copy()
        count = request.num_output_tokens + (pending is not None)
        if pending is not None and count == self._consumed + 1:  # a step's usual: one token
            self._consumed = count
            return CatchUp(self._matcher, self._lexer, 0, [pending])
        catch_up = CatchUp(self._matcher, self._lexer, max(self._consumed - count, 0), [])
        if count > self._consumed:  # only the new tokens: the output is not copied
            catch_up.tokens = request.token_ids[request.num_prompt_tokens + self._consumed :]
            if pending is not None:
                catch_up.tokens.append(pending)
        self._consumed = count
        return catch_up

    def fail(self, request: Request, matcher: LLMatcher) -> None:
        """Record that the request's matcher is in llguidance's error state (found after a
        fill, in its thread): its mask gave only the end of sequence, and the request must
        end with the error, not as if it had stopped."""
        if self.failure is not None:  # reported already; a later fill finds it again
            return
        error = matcher.get_error()
        logger.warning("request %s: its grammar's matcher failed: %s", request.request_id, error)
        detail = _one_line(error.split("<state>")[0])  # the state and grammar follow
        self.failure = f"{GRAMMAR_FIELD}: the grammar's matcher failed: {detail}"
        self._failed.append(request)


@dataclass(slots=True)
class CatchUp:
    """A matcher's way to a request's latest tokens: take back ``rollback`` tokens (taken
    back from the request), then consume ``tokens``. ``lexer``: which of its grammar's
    lexers the matcher shares."""

    matcher: LLMatcher
    lexer: int
    rollback: int
    tokens: list[int]

    def apply(self) -> None:
        """A token the matcher cannot consume leaves it in its error state
        (``RequestGrammar.fail``)."""
        if self.rollback:
            self.matcher.rollback(self.rollback)
        if self.tokens:
            self.matcher.consume_tokens(self.tokens)


class StructuredOutputs:
    """The engine's grammars: each distinct grammar is compiled once, off the step loop,
    and kept (least recently used first out) for the requests that ask for it again. A
    grammar asked for again gets lexers for the mask-filling threads
    (``LEXERS_PER_THREAD``): one-off grammars do not pay for them."""

    def __init__(self, tokenizer: Tokenizer | None, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._compiled: OrderedDict[str, Future[CompiledGrammar]] = OrderedDict()
        # grammars whose lexers were added, least recently used first
        self._reused: OrderedDict[str, Future[CompiledGrammar]] = OrderedDict()
        self._lltokenizer: LLTokenizer | None = None
        self._lock = threading.Lock()  # the tokenizer is made in the first compile
        self._executor: ThreadPoolExecutor | None = None
        # Requests whose matcher failed, put there by the mask-filling thread.
        self._failed: deque[Request] = deque()

    def attach(self, request: Request) -> None:
        """Give a constrained request its grammar (compiling, or from the cache); requests
        without a constraint are left as they are."""
        constraint = request.params.structured_outputs
        if constraint is None:
            return
        if self.tokenizer is None:
            raise ValueError(f"{GRAMMAR_FIELD}: this model has no tokenizer")
        request.grammar = RequestGrammar(self._compile(constraint.compiled_grammar), self._failed)

    def take_failed(self) -> list[Request]:
        """The requests whose matcher failed since the last call (``RequestGrammar.fail``)."""
        failed = []
        while self._failed:  # popped one by one: the filling thread may append meanwhile
            failed.append(self._failed.popleft())
        return failed

    def _compile(self, grammar: str) -> Future[CompiledGrammar]:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="infer-grammar")
        future = self._compiled.get(grammar)
        if future is not None:
            self._compiled.move_to_end(grammar)
            self._reuse(grammar, future)
            return future
        future = self._executor.submit(self._build, grammar)
        self._compiled[grammar] = future
        if len(self._compiled) > MAX_CACHED_GRAMMARS:
            evicted, _ = self._compiled.popitem(last=False)
            self._reused.pop(evicted, None)
        return future

    def _reuse(self, grammar: str, future: Future[CompiledGrammar]) -> None:
        """A grammar asked for again keeps (or gets) lexers for the mask-filling threads;
        beyond ``MAX_GRAMMARS_WITH_LEXERS``, the least recently used one gives its back."""
        assert self._executor is not None
        if grammar in self._reused:
            self._reused.move_to_end(grammar)
            return
        self._reused[grammar] = future
        self._executor.submit(_add_lexers, future)
        if len(self._reused) > MAX_GRAMMARS_WITH_LEXERS:
            _, oldest = self._reused.popitem(last=False)
            self._executor.submit(_drop_lexers, oldest)

    def _build(self, grammar: str) -> CompiledGrammar:
        """Compile a grammar (in the worker thread; llguidance releases the GIL meanwhile)."""
        return CompiledGrammar(self._tokenizer(), grammar)

    def _tokenizer(self) -> LLTokenizer:
        """llguidance's view of the vocabulary (~0.6 s to make, so made once, when the first
        grammar is compiled); the end of sequence is every end token of the model that the
        tokenizer has (a model's config may name ids beyond a smaller tokenizer's)."""
        with self._lock:
            if self._lltokenizer is None:
                assert self.tokenizer is not None
                known = len(self.tokenizer.hf)
                eos = sorted(i for i in self.tokenizer.eos_token_ids if i < known)
                self._lltokenizer = llguidance.hf.from_tokenizer(
                    self.tokenizer.hf,  # type: ignore[arg-type]
                    n_vocab=self.vocab_size,
                    eos_token=eos or None,
                    slices=SLICES,
                )
            return self._lltokenizer


def _add_lexers(compiled: Future[CompiledGrammar]) -> None:
    """Give a grammar that compiled its lexers for the mask-filling threads."""
    if compiled.exception() is None:
        compiled.result().add_lexers(LEXERS_PER_THREAD * _grammar_threads())


def _drop_lexers(compiled: Future[CompiledGrammar]) -> None:
    """Take a grammar that compiled back to one lexer (its states no longer kept)."""
    if compiled.exception() is None:
        compiled.result().drop_lexers()


def next_admissible(waiting: deque[Request], failed: list[Request]) -> Request | None:
    """The first waiting request that can start: one without a grammar, or whose grammar
    has compiled. Those behind a grammar still compiling do not wait for it; one whose
    grammar failed to compile is finished with the error and moved to ``failed``."""
    if not waiting or waiting[0].grammar is None:
        return waiting[0] if waiting else None
    for request in list(waiting):
        grammar = request.grammar
        if grammar is None:
            return request
        if not grammar.ready:
            continue
        error = grammar.error
        if error is None:
            return request
        waiting.remove(request)
        request.finish("error", f"{GRAMMAR_FIELD}: the grammar failed to compile: {error}")
        failed.append(request)
    return None


def _grammar_threads() -> int:
    """llguidance's mask-filling threads: ``INFER_GRAMMAR_THREADS``, or half the CPUs the
    process may use (the engine's own thread keeps a core of its own while masks fill)."""
    configured = os.environ.get("INFER_GRAMMAR_THREADS")
    if configured:
        return max(1, int(configured))
    return max(1, len(os.sched_getaffinity(0)) // 2)


@functools.cache
def _executor() -> LLExecutor:
    """llguidance's threads, filling several masks at once (made on first use)."""
    return LLExecutor(_grammar_threads())


@functools.cache
def _filler() -> ThreadPoolExecutor:
    """The thread that waits on llguidance's (the GIL released) while the step goes on; it
    runs Python between them, so the engine's thread hands it the GIL often (``infer.gil``)."""
    hand_over_gil_often()
    return ThreadPoolExecutor(1, thread_name_prefix="infer-bitmask")


class Bitmask:
    """A step's token bitmasks, filled in the background: the constrained rows' indices and
    ``[R, ceil(vocab_size / 32)]`` int32 words on the host (bit ``t % 32`` of word ``t //
    32`` set: token ``t`` allowed), pinned for a CUDA device so their copy does not wait."""

    def __init__(self, rows: list[int], bits: Tensor, filled: Future[float]) -> None:
        self.rows = rows
        self._bits = bits
        self._filled = filled

    def result(self) -> tuple[list[int], Tensor]:
        """The rows and their masks, once filled."""
        self._filled.result()
        return self.rows, self._bits

    @property
    def fill_s(self) -> float:
        """How long llguidance took to fill them (seconds; once filled)."""
        return self._filled.result()


def _catch_up(catch_ups: list[CatchUp]) -> None:
    """Bring the matchers to their requests' tokens (given in lexer order): the usual one
    new token each in parallel (llguidance's threads), anything else one matcher at a time.
    A token a matcher cannot consume leaves it in its error state (``RequestGrammar.fail``)."""
    singles = [c for c in catch_ups if len(c.tokens) == 1 and not c.rollback]
    for c in catch_ups:
        if len(c.tokens) != 1 or c.rollback:
            c.apply()
    if singles:
        _executor().consume_token_par([(c.matcher, c.tokens[0]) for c in singles])


def start_bitmask(
    requests: list[Request],
    vocab_size: int,
    device: torch.device,
    pending: Mapping[str, int] | None = None,
) -> Bitmask | None:
    """Start filling the masks of a step's constrained rows (None when no row is): in the
    background, each matcher first consumes the request's output tokens it has not seen,
    and ``pending`` (request id → a token sampled for it that the host has not recorded
    yet), then llguidance's threads fill the masks, while the caller goes on. A row whose
    request has finished (its sampling was deferred, ``Engine.step``) gets no mask: its
    token will be dropped."""
    rows = [i for i, r in enumerate(requests) if r.grammar is not None and not r.is_finished]
    if not rows:
        return None
    pending = pending or {}
    words = (vocab_size + 31) // 32
    bits = torch.empty((len(rows), words), dtype=torch.int32, pin_memory=device.type == "cuda")
    catch_ups = []
    for i in rows:
        request = requests[i]
        assert request.grammar is not None
        catch_ups.append(request.grammar.catch_up(request, pending.get(request.request_id)))

    # Matchers of one lexer side by side: llguidance's threads split the list into runs,
    # so a thread mostly takes the lock of a lexer no other thread is using.
    by_lexer = sorted(range(len(catch_ups)), key=lambda k: catch_ups[k].lexer)

    def fill() -> float:
        start = time.perf_counter()
        _catch_up([catch_ups[k] for k in by_lexer])
        if len(catch_ups) == 1:
            catch_ups[0].matcher.unsafe_compute_mask_ptr(bits.data_ptr(), words * 4)
        else:
            matchers = [(catch_ups[k].matcher, k) for k in by_lexer]
            _executor().unsafe_compute_mask_ptr(matchers, bits.data_ptr(), words * 4, len(rows))
        for k in [k for k, c in enumerate(catch_ups) if c.matcher.is_error()]:
            request = requests[rows[k]]
            assert request.grammar is not None
            request.grammar.fail(request, catch_ups[k].matcher)
        return time.perf_counter() - start

    return Bitmask(rows, bits, _filler().submit(fill))
