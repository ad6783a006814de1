"""Constraints checked in worker processes, never on the event loop: a request's grammar,
regex, JSON schema, choices or forced tool call is turned into llguidance's grammar,
compiled for the model's vocabulary and asked for its first mask in a process of a small
pool, with a deadline.

The compiler runs in C-like code on the request's own structure: a grammar of ~5,000
chained rules crashed it (SIGSEGV, the whole server with it), 100,000 choices took 26 s
(``/health`` stalled meanwhile). Here a crash costs a worker, which is started again, and
an overrun is cut off (the worker killed); either is the request's 400 naming the field.
A grammar that compiles but whose language is empty is a 400 too, before generation
(``engine/structured/grammar.py``). Requests without a constraint never come here.

``pebble``'s process pool does the bookkeeping: deadlines that kill the worker, crashes
reported as ``ProcessExpired``, workers started again.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from pebble import ProcessExpired, ProcessPool

from infer.contract.constraints import CHECK_STACK_BYTES
from infer.contract.sampling_params import StructuredOutputsParams
from infer.server.guards.request_limits import DEFAULT_GRAMMAR_TIMEOUT_S, DEFAULT_GRAMMAR_WORKERS
from infer.server.openai.protocol import SamplingRequest
from infer.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


class GrammarCheckError(RuntimeError):
    """The pool itself failed (not the request's fault): a 503."""


class GrammarChecker:
    """A pool of ``workers`` processes checking constraints with the model's tokenizer
    (``tokenizer_path``; None: no emptiness check, the engine refuses constraints), each
    check cut off after ``timeout_s`` seconds."""

    def __init__(
        self,
        tokenizer_path: str | None,
        eos_token_ids: tuple[int, ...],
        vocab_size: int,
        workers: int = DEFAULT_GRAMMAR_WORKERS,
        timeout_s: float = DEFAULT_GRAMMAR_TIMEOUT_S,
    ) -> None:
        if workers < 1:
            raise ValueError(f"grammar_workers: must be >= 1, got {workers}")
        if timeout_s <= 0:
            raise ValueError(f"grammar_timeout: must be > 0 seconds, got {timeout_s}")
        self.timeout_s = timeout_s
        self._pool = ProcessPool(
            max_workers=workers,
            initializer=_load_tokenizer,
            initargs=(tokenizer_path, eos_token_ids, vocab_size),
            context=multiprocessing.get_context("spawn"),
        )

    async def constraint(self, request: SamplingRequest) -> StructuredOutputsParams | None:
        """The request's constraint, checked (None: it has none): ``ValueError`` naming the
        field when it is invalid, empty, crashes the compiler or overruns the deadline."""
        field = request.constraint_field
        if field is None:
            return None
        try:  # a broken pool fails ``schedule`` itself
            future = self._pool.schedule(_checked, args=(request,), timeout=self.timeout_s)
            return await asyncio.wrap_future(future)
        except FutureTimeout:
            raise ValueError(
                f"{field}: compiling it took longer than this server's limit of "
                f"{self.timeout_s:g} s (--grammar-timeout); simplify it"
            ) from None
        except ProcessExpired as exc:
            logger.warning("the grammar compiler crashed on %s (exit code %s)", field,
                           exc.exitcode)  # fmt: skip
            raise ValueError(
                f"{field}: the grammar compiler crashed on it (exit code {exc.exitcode}): it "
                "is too large or too deeply nested"
            ) from None
        except (ValueError, TypeError):
            raise
        except Exception as exc:  # the pool's own failure, not the request's
            logger.exception("checking a constraint failed")
            raise GrammarCheckError(f"the grammar checker failed: {exc}") from exc

    def close(self) -> None:
        """Stop the workers, a check in progress included."""
        self._pool.stop()
        self._pool.join()


# The worker process's llguidance tokenizer (made by ``_load_tokenizer`` at its start).
_tokenizer = None


def _load_tokenizer(path: str | None, eos_token_ids: tuple[int, ...], vocab_size: int) -> None:
    # The engine's grammar code is imported here, in the worker: the API process that
    # starts the pool imports nothing of the engine.
    from infer.engine.structured.grammar import ll_tokenizer

    global _tokenizer
    if path is not None:
        tokenizer = Tokenizer.load(Path(path), eos_token_ids)
        if tokenizer is not None:
            _tokenizer = ll_tokenizer(tokenizer, vocab_size)


def _checked(request: SamplingRequest) -> StructuredOutputsParams | None:
    """In a worker: the request's constraint, compiled on a stack of ``CHECK_STACK_BYTES``
    (the engine compiles on a larger one), and its language checked."""
    from infer.engine.structured.grammar import language_error

    outcome: list[StructuredOutputsParams | BaseException | None] = []

    def check() -> None:
        try:
            constraint = request.constraint()
            if constraint is not None and _tokenizer is not None:
                error = language_error(constraint.compiled_grammar, _tokenizer)
                if error is not None:
                    raise ValueError(
                        f"{request.constraint_field}: no output can satisfy it ({error})"
                    )
            outcome.append(constraint)
        except ValueError as exc:  # as a plain ValueError: a subclass may not unpickle
            outcome.append(ValueError(str(exc)))
        except BaseException as exc:
            outcome.append(exc)

    threading.stack_size(CHECK_STACK_BYTES)
    thread = threading.Thread(target=check, name="infer-grammar-check")
    thread.start()
    thread.join()
    (result,) = outcome
    if isinstance(result, BaseException):
        raise result
    return result
