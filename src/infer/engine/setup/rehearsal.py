"""The first traffic, rehearsed before the engine says it is ready.

Without it the first requests meet what nothing has built yet: Triton kernel variants of
step shapes and sampling kinds that the start-up's warm-up forwards and graph captures never
ran (each a compile of seconds), cuBLAS's choices for new matrix shapes, CUDA modules loaded
at their first launch, the caching allocator's growth, the grammar library's tokenizer. So
the engine first serves itself a burst of synthetic requests and a few small waves, one per
kind of request (``PARTS``), through the step it serves with; then it starts serving on an
emptied pool with its counters at zero (``Engine._start_serving``): nothing of the
rehearsal stays but what it built.

A small wave holds requests of 1 to ``WAVE`` output tokens and of varied prompt lengths,
so its steps sample every batch size up to ``WAVE`` (which covers each alignment of the
per-row settings that Triton specialises on) and pack odd and even token counts.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infer.cache.paged import PagedKVCachePool
from infer.cache.protocol import CachePoolProtocol
from infer.cache.slotted import SlottedKVCache
from infer.contract.sampling_params import SamplingParams, StructuredOutputsParams
from infer.engine.loop import drain
from infer.engine.setup.start_up_log import StartUpPart, start_up_part

if TYPE_CHECKING:
    from infer.engine.core.engine import Engine

logger = logging.getLogger(__name__)

WARM_UP = "warm-up (the first traffic, rehearsed)"  # the start-up log's name of it
WAVE = 8  # requests of a small wave: batch sizes 1..WAVE, every residue mod 4
LONG_PROMPT = 3000  # past the prefill kernels' short-context tile (or the context, if less)
SHARED_PREFIX = 200  # a cached prefix's tokens (a chat's system prompt)
REPEAT = 3  # the pattern a repeating prompt repeats

# The sampling settings of a part's request ``i`` (its lengths are added).
Kind = Callable[[int], dict[str, Any]]


def _sampled(i: int) -> dict[str, Any]:
    return {"temperature": 1.0}


def _greedy(i: int) -> dict[str, Any]:
    return {"temperature": 0.0}


def _mixed(i: int) -> dict[str, Any]:
    return {"temperature": 0.0 if i % 2 else 0.7, "seed": i if i % 3 == 0 else None}


def _filtered(i: int) -> dict[str, Any]:
    """top-p on every row (its kernel variant), top-k and min-p beside it on some."""
    return {"top_p": 0.9, "top_k": (0, 40)[i % 2], "min_p": (0.0, 0.05)[i % 3 > 1]}


def _changed_logits(i: int) -> dict[str, Any]:
    """Penalties, a logit bias and ``min_tokens`` bans: the logits are widened to float32."""
    return {
        "temperature": (1.0, 0.0)[i % 4 == 3],
        "repetition_penalty": 1.1,
        "presence_penalty": 0.5 * (i % 2),
        "frequency_penalty": 0.3,
        "logit_bias": {i: 1.0},
        "min_tokens": 2,
        "top_p": (1.0, 0.9)[i % 2],
    }


def _logprobs(i: int) -> dict[str, Any]:
    return {"temperature": (1.0, 0.0)[i % 3 == 2], "logprobs": (0, 1, 5)[i % 3]}


def _logprobs_of_changed_logits(i: int) -> dict[str, Any]:
    return {"repetition_penalty": 1.2, "logit_bias": {i: -1.0}, "logprobs": (0, 5)[i % 2]}


def _prompt_logprobs(i: int) -> dict[str, Any]:
    return {"temperature": (1.0, 0.0)[i % 2], "prompt_logprobs": (0, 1, 5)[i % 3]}


def _json(i: int) -> dict[str, Any]:
    return {
        "temperature": (1.0, 0.0)[i % 2],
        "top_p": (1.0, 0.9)[i % 4 > 1],
        "structured_outputs": StructuredOutputsParams(json_object=True),
    }


@dataclass(frozen=True)
class Request:
    """One synthetic request: ``shared`` prompts start with the part's shared prefix;
    ``repeating`` ones repeat a few tokens (n-gram speculation finds proposals in them)."""

    prompt_len: int
    params: SamplingParams
    shared: bool = False
    repeating: bool = False


@dataclass(frozen=True)
class Part:
    """One kind of first traffic: ``waves`` of requests, each wave served to the end before
    the next (a later wave finds the earlier one's prompt blocks cached)."""

    label: str
    kind: Kind
    needs_tokenizer: bool = False
    burst: bool = False  # ``max_batch_size`` requests instead of a small wave
    long_prompt: bool = False  # one long prompt (chunked, past the short-context tile)
    shared_prefix: bool = False  # a wave after one request with the same prefix
    repeating: bool = False  # prompts of a repeated pattern: speculation proposes (if on)


PARTS = (
    Part("a burst of sampled requests (temperature 1)", _sampled, burst=True),
    Part("greedy rows", _greedy),
    Part("greedy and sampled rows together, some seeded", _mixed),
    Part("top-p, top-k and min-p", _filtered),
    Part("penalties, logit bias, min_tokens", _changed_logits),
    Part("logprobs", _logprobs),
    Part("logprobs of changed logits", _logprobs_of_changed_logits),
    Part("prompt logprobs", _prompt_logprobs),
    Part("a cached prefix", _sampled, shared_prefix=True),
    Part("repeating prompts (speculative proposals, when on)", _mixed, repeating=True),
    Part("a long prompt", _sampled, long_prompt=True),
    Part("grammar masks (JSON)", _json, needs_tokenizer=True),
)


@dataclass(frozen=True)
class RehearsedPart:
    """What the start-up log says of one part: its requests, time and kernel variants."""

    label: str
    requests: int
    log: StartUpPart


def rehearse(engine: Engine) -> list[RehearsedPart]:
    """Serve every part of ``PARTS`` the engine can (grammars need a tokenizer) to the end;
    each is timed in the start-up log with the kernel variants it built."""
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    prefix = [rng.randrange(vocab) for _ in range(SHARED_PREFIX)]
    config = engine.config
    chunk = config.prefill_chunk_size if config.use_chunked_prefill else 384
    done = []
    for part in PARTS:
        if part.needs_tokenizer and engine.tokenizer is None:
            continue
        waves = _waves(part, config.max_batch_size, chunk, engine.max_seq_len)
        with start_up_part(f"{WARM_UP}: {part.label}") as log:
            for wave in waves:
                for request in wave:
                    head = prefix if request.shared else []
                    tail = [rng.randrange(vocab) for _ in range(request.prompt_len - len(head))]
                    if request.repeating:
                        tail = [tail[i % REPEAT] for i in range(len(tail))]
                    engine.add_request(head + tail, request.params)
                drain(engine)
        done.append(RehearsedPart(part.label, sum(len(w) for w in waves), log))
    return done


def _waves(part: Part, burst: int, chunk: int, max_seq_len: int) -> list[list[Request]]:
    """The requests of ``part``: prompt lengths spread over two chunks (odd and even, some
    chunked), ``max_tokens`` from 1 to ``WAVE``, all inside the context."""

    def request(i: int, prompt_len: int, shared: bool = False) -> Request:
        max_tokens = 1 + i % WAVE
        prompt_len = max(1, min(prompt_len, max_seq_len - max_tokens))
        settings = part.kind(i)
        settings["min_tokens"] = min(settings.get("min_tokens", 0), max_tokens)
        params = SamplingParams(**settings, max_tokens=max_tokens, ignore_eos=True)
        return Request(prompt_len, params, shared and prompt_len > SHARED_PREFIX, part.repeating)

    if part.long_prompt:
        return [[request(WAVE - 1, LONG_PROMPT)]]
    if part.shared_prefix:
        first = request(0, SHARED_PREFIX + 1, shared=True)
        return [[first], [request(i, SHARED_PREFIX + 2 + i * 7, shared=True) for i in range(WAVE)]]
    count = burst if part.burst else WAVE
    return [[request(i, 1 + (i * 97 + 13) % (2 * chunk + 1)) for i in range(count)]]


def emptied(pool: CachePoolProtocol) -> CachePoolProtocol:
    """A pool of ``pool``'s shape holding nothing: no sequences, no cached prefixes, its
    counters at zero."""
    if isinstance(pool, SlottedKVCache):
        return SlottedKVCache(pool.num_blocks, pool.block_size, pool.max_seq_len)
    if isinstance(pool, PagedKVCachePool):
        return PagedKVCachePool(pool.num_blocks, pool.block_size, pool.prefix is not None)
    raise TypeError(f"no empty copy of a {type(pool).__name__}")
