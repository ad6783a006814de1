"""Batched sampling on the device: logit bias, ``min_tokens`` bans and penalties change the
logits in place, then one filtered draw per row (``kernels.sampling``: temperature, min-p,
top-k, top-p, grammar masks, seeds; a Triton kernel on a GPU) and the logprobs asked for.

A seeded row draws its randomness from a hash of (its seed, how many tokens it has generated,
the vocabulary index), so it samples the same tokens whatever else is in the batch, with no
per-request generator and no per-row loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from infer.engine.core.request import Request
from infer.engine.structured.bitmask import Bitmask, start_bitmask
from infer.kernels.argmax import argmax_rows
from infer.kernels.sampling import RowSettings, TokenMask, sample_filtered


@dataclass
class SamplingBatch:
    """The settings of every row of a step, as device tensors (built once per step)."""

    rows: RowSettings
    penalties: _Penalties | None
    bias: _LogitBias | None
    banned: tuple[Tensor, Tensor] | None  # (rows, token ids) that must not be sampled yet
    mask: TokenMask | None  # the grammars' masks of the constrained rows
    num_logprobs: int | None  # top alternatives to report (None: no logprobs this step)

    @classmethod
    def from_requests(
        cls,
        requests: list[Request],
        vocab_size: int,
        device: torch.device,
        bitmask: Bitmask | None = None,
        output_indices: list[int] | None = None,
        proposed: list[list[int]] | None = None,
    ) -> SamplingBatch:
        """``bitmask``: the constrained rows' masks, when their filling was started earlier
        (``bitmask.start_bitmask``); otherwise they are filled now. ``output_indices``:
        which output each row samples (a seeded row's noise and ``min_tokens`` follow it;
        default: the one after its known outputs). ``proposed``: each row's proposed tokens
        before it (speculation), which its penalties count as outputs."""
        params = [r.params for r in requests]
        if output_indices is None:
            output_indices = [r.num_output_tokens for r in requests]
        # One copy each for the float and the integer settings, a setting a row of the
        # table: every setting is a contiguous [B] tensor, as the kernel reads them. Rows are
        # padded to 16 bytes: Triton specialises the kernel on its pointers' alignment, and
        # unaligned rows (batches of 1 to 3 rows mod 4) each compiled a variant mid-serving.
        batch = len(requests)
        pad = [0] * (-batch % 4)
        floats = torch.tensor(
            [
                [p.temperature for p in params] + pad,
                [p.top_p for p in params] + pad,
                [p.min_p for p in params] + pad,
            ],
            dtype=torch.float32,
        ).to(device, non_blocking=True)
        top_k = [p.top_k if p.top_k > 0 else vocab_size for p in params]
        ints = torch.tensor(
            [top_k + pad, [r.seed & (2**63 - 1) for r in requests] + pad, output_indices + pad],
            dtype=torch.int64,
        ).to(device, non_blocking=True)
        requested = [p.logprobs for p in params if p.logprobs is not None]
        rows = RowSettings(
            temperature=floats[0, :batch],
            top_k=ints[0, :batch],
            top_p=floats[1, :batch],
            min_p=floats[2, :batch],
            seeds=ints[1, :batch],
            steps=ints[2, :batch],
            use_top_k=any(k < vocab_size for k in top_k),
            use_top_p=any(p.top_p < 1.0 for p in params),
        )
        return cls(
            rows=rows,
            penalties=_Penalties.build(requests, device, proposed),
            bias=_LogitBias.build(requests, device),
            banned=_banned_tokens(requests, output_indices, device),
            mask=token_mask(requests, vocab_size, device, bitmask, proposed),
            num_logprobs=max(requested) if requested else None,
        )

    @property
    def changes_logits(self) -> bool:
        return self.penalties is not None or self.bias is not None or self.banned is not None


@dataclass
class _Penalties:
    """Repetition, presence and frequency penalties, applied by gathering and scattering the
    tokens each row has seen (no ``[B, V]`` tables): duplicates of a token write the same
    value, so a token seen twice is penalised once, except by its frequency."""

    repetition: Tensor  # [B, 1]
    presence: Tensor  # [B, 1], zero for rows without outputs
    frequency: Tensor  # [B, 1]
    seen: Tensor  # [B, S] token ids in prompt or output, padded with a repeat
    outputs: Tensor  # [B, O] output token ids, padded with a repeat (or 0)
    counted: Tensor  # [B, O] 1 for an output token, 0 for padding

    @classmethod
    def build(
        cls, requests: list[Request], device: torch.device, proposed: list[list[int]] | None
    ) -> _Penalties | None:
        if not any(r.params.needs_penalties for r in requests):
            return None
        p = [r.params for r in requests]
        proposed = proposed or [[] for _ in requests]
        outputs = [r.output_token_ids + extra for r, extra in zip(requests, proposed)]
        values = torch.tensor(
            [
                [q.repetition_penalty, q.presence_penalty * bool(o), q.frequency_penalty]
                for q, o in zip(p, outputs)
            ],
            dtype=torch.float32,
        ).to(device)
        width = max(len(o) for o in outputs) or 1
        counted = torch.tensor([[1.0] * len(o) + [0.0] * (width - len(o)) for o in outputs])
        return cls(
            values[:, :1],
            values[:, 1:2],
            values[:, 2:3],
            _repeat_padded([r.token_ids + extra for r, extra in zip(requests, proposed)], device),
            _repeat_padded(outputs, device),
            counted.to(device),
        )

    def apply_(self, logits: Tensor) -> None:
        seen = logits.gather(1, self.seen)
        penalised = torch.where(seen > 0, seen / self.repetition, seen * self.repetition)
        logits.scatter_(1, self.seen, penalised)
        logits.scatter_(1, self.outputs, logits.gather(1, self.outputs) - self.presence)
        logits.scatter_add_(1, self.outputs, -self.frequency * self.counted)


def _repeat_padded(rows: list[list[int]], device: torch.device) -> Tensor:
    """``[B, longest]`` token ids, each row padded with its first id (0 for an empty row)."""
    width = max((len(r) for r in rows), default=0) or 1
    return torch.tensor([r + [r[0] if r else 0] * (width - len(r)) for r in rows]).to(device)


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

    def apply_(self, logits: Tensor) -> None:
        logits.index_put_((self.rows, self.token_ids), self.values, accumulate=True)


def token_mask(
    requests: list[Request],
    vocab_size: int,
    device: torch.device,
    started: Bitmask | None = None,
    proposed: list[list[int]] | None = None,
) -> TokenMask | None:
    """The tokens each constrained row's grammar allows next, one bit per token (filled on
    the host by ``bitmask.start_bitmask``); None when no row is constrained."""
    started = started or start_bitmask(requests, vocab_size, device, proposed=proposed)
    if started is None:
        return None
    constrained, bits = started.result()
    index = [-1] * len(requests)
    for n, row in enumerate(constrained):
        index[row] = n
    rows = torch.tensor(index, dtype=torch.int32).to(device, non_blocking=True)
    return TokenMask(bits.to(device, non_blocking=True), rows)


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
    proposed: list[list[int]] | None = None,
) -> SamplerOutput:
    """Each row's argmax, within its grammar's mask if it has one: the whole of sampling
    when every row is ``Request.greedy_argmax``, without a ``SamplingBatch`` (gathering
    every row's settings costs the host a noticeable share of a wide step). ``bitmask`` and
    ``proposed`` as for ``SamplingBatch.from_requests``."""
    mask = token_mask(requests, vocab_size, device, bitmask, proposed)
    if mask is None:
        return SamplerOutput(argmax_rows(logits))
    return SamplerOutput(sample_filtered(logits, RowSettings.greedy(len(requests), device), mask))


def sample(logits: Tensor, batch: SamplingBatch) -> SamplerOutput:
    """Pick one token per row of ``logits [B, V]`` (float32 logits are changed in place
    unless logprobs are asked for, which are those of the logits as given)."""
    raw = logits
    if batch.changes_logits:
        logits = logits.to(torch.float32, copy=batch.num_logprobs is not None)
    if batch.bias is not None:
        batch.bias.apply_(logits)
    if batch.banned is not None:
        logits.index_put_(batch.banned, torch.tensor(float("-inf"), device=logits.device))
    if batch.penalties is not None:
        batch.penalties.apply_(logits)
    tokens = sample_filtered(logits, batch.rows, batch.mask)
    return _with_logprobs(raw, tokens, batch.num_logprobs)


def _with_logprobs(raw: Tensor, tokens: Tensor, num_logprobs: int | None) -> SamplerOutput:
    if num_logprobs is None:
        return SamplerOutput(tokens)
    raw = raw.float()
    normaliser = raw.logsumexp(dim=-1, keepdim=True)
    chosen = (raw.gather(1, tokens[:, None]) - normaliser)[:, 0]
    if num_logprobs == 0:
        return SamplerOutput(tokens, chosen)
    top_values, top_ids = raw.topk(num_logprobs, dim=-1)
    return SamplerOutput(tokens, chosen, top_ids, top_values - normaliser)
