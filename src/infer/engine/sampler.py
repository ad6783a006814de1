"""Batched sampling on the device: logit bias, penalties, grammar masks, temperature, min-p,
top-k, top-p, seeds.

Each row draws its randomness from a counter-based hash of (its seed, how many tokens it has
generated, the vocabulary index), so a seeded request samples the same tokens whatever else
is in the batch, with no per-request generator and no per-row loop. The sample itself is the
Gumbel-max trick: ``argmax(logits / T + Gumbel noise)`` over the tokens the filters keep.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from infer.engine.request import Request
from infer.engine.structured import Bitmask, start_bitmask

_MASK32 = 0xFFFFFFFF
_HASH_MULTIPLIER = 0x45D9F3B  # < 2**31, so products of 32-bit values fit in int64


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer hash with good avalanche (values kept in int64, below 2**32)."""
    x = (((x >> 16) ^ x) * _HASH_MULTIPLIER) & _MASK32
    x = (((x >> 16) ^ x) * _HASH_MULTIPLIER) & _MASK32
    return (x >> 16) ^ x


def uniform_noise(seeds: Tensor, steps: Tensor, vocab_size: int) -> Tensor:
    """``[B, V]`` uniform (0, 1) values determined by each row's ``(seed, step)``."""
    low, high = seeds & _MASK32, (seeds >> 32) & _MASK32
    row = _mix32(_mix32(low ^ _mix32(high)) ^ (steps & _MASK32))
    index = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    bits = _mix32(_mix32(row[:, None] ^ index[None, :]))
    return ((bits >> 8).float() + 0.5) * (1.0 / (1 << 24))


@dataclass
class SamplingBatch:
    """The settings of every row of a step, as device tensors (built once per step)."""

    greedy: Tensor  # [B] bool
    temperature: Tensor  # [B]
    top_k: Tensor  # [B] int64, vocabulary size where unlimited
    top_p: Tensor  # [B]
    min_p: Tensor  # [B]
    seeds: Tensor  # [B] int64
    steps: Tensor  # [B] int64
    all_greedy: bool
    use_top_k: bool
    use_top_p: bool
    use_min_p: bool
    penalties: _Penalties | None
    bias: _LogitBias | None
    banned: tuple[Tensor, Tensor] | None  # (rows, token ids) that must not be sampled yet
    allowed: _TokenBitmask | None  # the grammars' masks of the constrained rows
    num_logprobs: int | None  # top alternatives to report (None: no logprobs this step)

    @classmethod
    def from_requests(
        cls,
        requests: list[Request],
        vocab_size: int,
        device: torch.device,
        bitmask: Bitmask | None = None,
        output_indices: list[int] | None = None,
    ) -> SamplingBatch:
        """``bitmask``: the constrained rows' masks, when their filling was started earlier
        (``structured.start_bitmask``); otherwise they are filled now. ``output_indices``:
        which output each row samples (a seeded row's noise and ``min_tokens`` follow it;
        default: the one after its known outputs)."""
        params = [r.params for r in requests]
        if output_indices is None:
            output_indices = [r.num_output_tokens for r in requests]
        floats = torch.tensor(
            [[p.temperature, p.top_p, p.min_p] for p in params], dtype=torch.float32
        ).to(device, non_blocking=True)
        top_k = [p.top_k if p.top_k > 0 else vocab_size for p in params]
        ints = torch.tensor(
            [
                [k, r.seed & (2**63 - 1), index]
                for k, r, index in zip(top_k, requests, output_indices)
            ],
            dtype=torch.int64,
        ).to(device, non_blocking=True)
        temperature = floats[:, 0]
        requested = [p.logprobs for p in params if p.logprobs is not None]
        return cls(
            greedy=temperature == 0.0,
            temperature=temperature,
            top_k=ints[:, 0],
            top_p=floats[:, 1],
            min_p=floats[:, 2],
            seeds=ints[:, 1],
            steps=ints[:, 2],
            all_greedy=all(p.greedy for p in params),
            use_top_k=any(k < vocab_size for k in top_k),
            use_top_p=any(p.top_p < 1.0 for p in params),
            use_min_p=any(p.min_p > 0.0 for p in params),
            penalties=_Penalties.build(requests, vocab_size, device),
            bias=_LogitBias.build(requests, device),
            banned=_banned_tokens(requests, output_indices, device),
            allowed=_TokenBitmask.build(requests, vocab_size, device, bitmask),
            num_logprobs=max(requested) if requested else None,
        )


@dataclass
class _Penalties:
    repetition: Tensor  # [B, 1]
    presence: Tensor  # [B, 1]
    frequency: Tensor  # [B, 1]
    output_counts: Tensor  # [B, V] occurrences in the output so far
    seen: Tensor  # [B, V] bool, in prompt or output

    @classmethod
    def build(
        cls, requests: list[Request], vocab_size: int, device: torch.device
    ) -> _Penalties | None:
        if not any(r.params.needs_penalties for r in requests):
            return None
        values = torch.tensor(
            [
                [r.params.repetition_penalty, r.params.presence_penalty, r.params.frequency_penalty]
                for r in requests
            ],
            dtype=torch.float32,
        ).to(device)
        outputs = _padded([r.output_token_ids for r in requests], vocab_size, device)
        prompts = _padded([r.prompt_token_ids for r in requests], vocab_size, device)
        counts = torch.zeros(len(requests), vocab_size + 1, device=device)
        counts.scatter_add_(1, outputs, torch.ones_like(outputs, dtype=counts.dtype))
        seen = counts > 0
        seen.scatter_(1, prompts, True)
        return cls(
            values[:, :1],
            values[:, 1:2],
            values[:, 2:3],
            counts[:, :vocab_size],
            seen[:, :vocab_size],
        )

    def apply(self, logits: Tensor) -> Tensor:
        penalised = torch.where(logits > 0, logits / self.repetition, logits * self.repetition)
        logits = torch.where(self.seen, penalised, logits)
        logits = logits - self.presence * (self.output_counts > 0)
        return logits - self.frequency * self.output_counts


@dataclass
class _LogitBias:
    """Each request's ``logit_bias`` as (row, token id, bias) triples, added to the logits
    before anything else (as OpenAI defines it): -100 all but bans a token, +100 all but
    forces it."""

    rows: Tensor  # [E] int64
    token_ids: Tensor  # [E] int64
    values: Tensor  # [E] float32

    @classmethod
    def build(cls, requests: list[Request], device: torch.device) -> _LogitBias | None:
        rows: list[int] = []
        token_ids: list[int] = []
        values: list[float] = []
        for i, r in enumerate(requests):
            bias = r.params.logit_bias
            if bias:
                rows += [i] * len(bias)
                token_ids += bias.keys()
                values += bias.values()
        if not rows:
            return None
        return cls(
            torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True),
            torch.tensor(token_ids, dtype=torch.int64).to(device, non_blocking=True),
            torch.tensor(values, dtype=torch.float32).to(device, non_blocking=True),
        )

    def apply(self, logits: Tensor) -> Tensor:
        return logits.index_put((self.rows, self.token_ids), self.values, accumulate=True)


@dataclass
class _TokenBitmask:
    """The tokens each constrained row's grammar allows next, one bit per token (filled on
    the host by ``structured.start_bitmask``); the others are set to -inf."""

    rows: Tensor | None  # [R] int64; None: every row of the batch, in order
    bits: Tensor  # [R, ceil(V / 32)] int32

    @classmethod
    def build(
        cls,
        requests: list[Request],
        vocab_size: int,
        device: torch.device,
        started: Bitmask | None = None,
    ) -> _TokenBitmask | None:
        started = started or start_bitmask(requests, vocab_size, device)
        if started is None:
            return None
        rows, bits = started.result()
        index = None
        if len(rows) < len(requests):
            index = torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)
        return cls(index, bits.to(device, non_blocking=True))

    def apply(self, logits: Tensor) -> Tensor:
        # Unpacked a byte at a time (the words are little-endian: byte j of word w holds
        # tokens 32w + 8j ..), so the [R, V] intermediate is one byte per token.
        octets = self.bits.view(torch.uint8)
        shifts = torch.arange(8, dtype=torch.uint8, device=logits.device)
        allowed = ((octets[:, :, None] >> shifts) & 1).flatten(1)[:, : logits.shape[-1]]
        if self.rows is None:
            return logits.masked_fill(allowed == 0, float("-inf"))
        masked = logits[self.rows].masked_fill(allowed == 0, float("-inf"))
        return logits.index_copy(0, self.rows, masked)


def _padded(rows: list[list[int]], pad: int, device: torch.device) -> Tensor:
    width = max((len(r) for r in rows), default=0) or 1
    table = torch.full((len(rows), width), pad, dtype=torch.int64)
    for i, row in enumerate(rows):
        table[i, : len(row)] = torch.tensor(row, dtype=torch.int64)
    return table.to(device)


def _banned_tokens(
    requests: list[Request], output_indices: list[int], device: torch.device
) -> tuple[Tensor, Tensor] | None:
    """Stop tokens of rows that have not reached ``min_tokens`` yet."""
    rows: list[int] = []
    tokens: list[int] = []
    for i, (r, index) in enumerate(zip(requests, output_indices)):
        if index < r.params.min_tokens:
            stops = set(r.params.stop_token_ids) | (
                set() if r.params.ignore_eos else set(r.eos_token_ids)
            )
            rows.extend([i] * len(stops))
            tokens.extend(stops)
    if not rows:
        return None
    return (torch.tensor(rows, device=device), torch.tensor(tokens, device=device))


@dataclass
class SamplerOutput:
    token_ids: Tensor  # [B] int64
    logprobs: Tensor | None = None  # [B] log-probability of each sampled token
    top_ids: Tensor | None = None  # [B, N]
    top_logprobs: Tensor | None = None  # [B, N]


def greedy(
    logits: Tensor,
    requests: list[Request],
    vocab_size: int,
    device: torch.device,
    bitmask: Bitmask | None = None,
) -> SamplerOutput:
    """Each row's argmax, within its grammar's mask if it has one: the whole of sampling
    when every row is ``Request.greedy_argmax``, without a ``SamplingBatch`` (256 rows'
    settings take ~0.7 ms of the host's step to gather). ``bitmask`` as for
    ``SamplingBatch.from_requests``."""
    allowed = _TokenBitmask.build(requests, vocab_size, device, bitmask)
    if allowed is not None:
        logits = allowed.apply(logits)
    return SamplerOutput(logits.argmax(dim=-1))


def sample(logits: Tensor, batch: SamplingBatch) -> SamplerOutput:
    """Pick one token per row of ``logits [B, V]`` (float32)."""
    raw = logits
    if batch.bias is not None:
        logits = batch.bias.apply(logits)
    if batch.banned is not None:
        logits = logits.index_put(batch.banned, torch.tensor(float("-inf"), device=logits.device))
    if batch.penalties is not None:
        logits = batch.penalties.apply(logits)
    if batch.allowed is not None:
        logits = batch.allowed.apply(logits)
    if batch.all_greedy:
        tokens = logits.argmax(dim=-1)
    else:
        tokens = torch.where(batch.greedy, logits.argmax(dim=-1), _sample_random(logits, batch))
    return _with_logprobs(raw, tokens, batch.num_logprobs)


def _sample_random(logits: Tensor, batch: SamplingBatch) -> Tensor:
    temperature = torch.where(batch.greedy, 1.0, batch.temperature)
    scaled = logits / temperature[:, None]
    if batch.use_min_p:
        probs = scaled.softmax(dim=-1)
        floor = batch.min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        scaled = scaled.masked_fill(probs < floor, float("-inf"))
    if batch.use_top_k or batch.use_top_p:
        scaled = _top_k_top_p(scaled, batch)
    gumbel = -torch.log(-torch.log(uniform_noise(batch.seeds, batch.steps, logits.shape[-1])))
    return (scaled + gumbel).argmax(dim=-1)


def _top_k_top_p(scaled: Tensor, batch: SamplingBatch) -> Tensor:
    ordered, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(scaled.shape[-1], device=scaled.device)[None, :]
    drop = rank >= batch.top_k[:, None]
    if batch.use_top_p:
        probs = ordered.masked_fill(drop, float("-inf")).softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of strictly more likely tokens
        drop |= before >= batch.top_p[:, None]
    drop[:, 0] = False  # always keep the most likely token
    return scaled.scatter(1, order, ordered.masked_fill(drop, float("-inf")))


def _with_logprobs(raw: Tensor, tokens: Tensor, num_logprobs: int | None) -> SamplerOutput:
    if num_logprobs is None:
        return SamplerOutput(tokens)
    logprobs = raw.log_softmax(dim=-1)
    chosen = logprobs.gather(1, tokens[:, None])[:, 0]
    if num_logprobs == 0:
        return SamplerOutput(tokens, chosen)
    top_logprobs, top_ids = logprobs.topk(num_logprobs, dim=-1)
    return SamplerOutput(tokens, chosen, top_ids, top_logprobs)
