"""The engine's grammars: each distinct grammar compiled once, off the step loop, in a
thread of its own, and cached (``CompiledGrammar``); every constrained request gets its own
copy of a compiled matcher (``RequestGrammar``), advanced over its output tokens as they
become known. A matcher that fails (a sampled token it cannot consume, a mask beyond
llguidance's limits) puts its request in the failed list, for the engine to end it with the
error (``StructuredOutputs.take_failed``), so a broken output never passes for a stop.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llguidance import LLMatcher, LLTokenizer

from infer.contract.constraints import COMPILE_STACK_BYTES, GRAMMAR_FIELD, one_line
from infer.engine.structured.grammar import ll_tokenizer
from infer.tokenizer import Tokenizer

if TYPE_CHECKING:
    from infer.engine.core.request import Request

logger = logging.getLogger(__name__)

MAX_CACHED_GRAMMARS = 256
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
            raise ValueError(one_line(matcher.get_error()))
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
        detail = one_line(error.split("<state>")[0])  # the state and grammar follow
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
            self._executor = _compiling_thread()
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
        """llguidance's view of the vocabulary (``ll_tokenizer``), made once, when the first
        grammar is compiled."""
        with self._lock:
            if self._lltokenizer is None:
                assert self.tokenizer is not None
                self._lltokenizer = ll_tokenizer(self.tokenizer, self.vocab_size)
            return self._lltokenizer


def _compiling_thread() -> ThreadPoolExecutor:
    """The engine's grammar thread, on a stack of ``COMPILE_STACK_BYTES`` (``threading``
    gives a thread the stack size set when it starts: it is started here)."""
    previous = threading.stack_size(COMPILE_STACK_BYTES)
    try:
        executor = ThreadPoolExecutor(1, thread_name_prefix="infer-grammar")
        executor.submit(lambda: None).result()
    finally:
        threading.stack_size(previous)
    return executor


def _add_lexers(compiled: Future[CompiledGrammar]) -> None:
    """Give a grammar that compiled its lexers for the mask-filling threads."""
    if compiled.exception() is None:
        compiled.result().add_lexers(LEXERS_PER_THREAD * grammar_threads())


def _drop_lexers(compiled: Future[CompiledGrammar]) -> None:
    """Take a grammar that compiled back to one lexer (its states no longer kept)."""
    if compiled.exception() is None:
        compiled.result().drop_lexers()


def grammar_threads() -> int:
    """llguidance's mask-filling threads: ``INFER_GRAMMAR_THREADS``, or half the CPUs the
    process may use (the engine's own thread keeps a core of its own while masks fill)."""
    configured = os.environ.get("INFER_GRAMMAR_THREADS")
    if configured:
        return max(1, int(configured))
    return max(1, len(os.sched_getaffinity(0)) // 2)
