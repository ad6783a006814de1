"""Runs one scheduled step: one flat batch, one forward pass, one batched sample.

The host builds the step's metadata with numpy and copies it once; the device returns the
sampled tokens (and logprobs when asked) with one synchronisation. Decode-only steps replay a
captured CUDA graph when one is available.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from infer.attention import ScheduledSequence, build_metadata
from infer.cache.protocol import CachePoolProtocol
from infer.engine.cuda_graphs import CUDAGraphRunner
from infer.engine.request import Request, TokenLogprob
from infer.engine.sampler import SamplerOutput, SamplingBatch, sample
from infer.engine.scheduler import ScheduledChunk
from infer.models import DecoderModel


@dataclass
class StepResult:
    """Sampled tokens of the chunks that reached the end of their sequence, in order."""

    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


class ModelRunner:
    def __init__(
        self,
        model: DecoderModel,
        pool: CachePoolProtocol,
        device: torch.device,
        max_seq_len: int,
        graphs: CUDAGraphRunner | None = None,
    ) -> None:
        self.model = model
        self.pool = pool
        self.device = device
        self.max_seq_len = max_seq_len
        self.vocab_size = model.config.vocab_size
        self.graphs = graphs
        model.bind_kv_cache(pool.k, pool.v)

    @torch.inference_mode()
    def execute(self, chunks: list[ScheduledChunk]) -> StepResult:
        sequences = []
        for chunk in chunks:
            request = chunk.request
            assert request.slot is not None
            start = request.num_computed
            tokens = request.token_ids[start : start + chunk.num_tokens]
            sequences.append(ScheduledSequence(self.pool.block_table(request.slot), start, tokens))
        sampling = [c.request for c in chunks if c.samples]
        logits = self._logits(sequences, [c.samples for c in chunks])
        if not sampling:
            return StepResult([], [])
        batch = SamplingBatch.from_requests(sampling, self.vocab_size, self.device)
        return _to_host(sample(logits, batch), sampling)

    def _logits(self, sequences: list[ScheduledSequence], samples: list[bool]) -> Tensor:
        if self.graphs is not None and all(len(s.token_ids) == 1 for s in sequences):
            logits = self.graphs.run(sequences)
            if logits is not None:
                return logits
        input_ids, meta = build_metadata(sequences, self.pool.block_size, self.device)
        hidden = self.model(input_ids, meta.positions, meta)
        if all(samples) and meta.max_query_len == 1:
            return self.model.compute_logits(hidden)
        last_rows = [end - 1 for end, keep in zip(_ends(sequences), samples) if keep]
        index = torch.tensor(last_rows, dtype=torch.int64).to(self.device, non_blocking=True)
        return self.model.compute_logits(hidden[index])


def _ends(sequences: list[ScheduledSequence]) -> list[int]:
    ends, total = [], 0
    for s in sequences:
        total += len(s.token_ids)
        ends.append(total)
    return ends


def _to_host(out: SamplerOutput, requests: list[Request]) -> StepResult:
    """Copy the sampler's results to the host with a single synchronisation."""
    tensors = [out.token_ids, out.logprobs, out.top_ids, out.top_logprobs]
    host = [None if t is None else t.to("cpu", non_blocking=True) for t in tensors]
    if out.token_ids.is_cuda:
        torch.cuda.current_stream().synchronize()
    token_ids: list[int] = host[0].tolist()
    if host[1] is None:
        return StepResult(token_ids, [None] * len(token_ids))
    chosen = host[1].tolist()
    top_ids = host[2].tolist() if host[2] is not None else [[] for _ in token_ids]
    top_values = host[3].tolist() if host[3] is not None else [[] for _ in token_ids]
    logprobs: list[TokenLogprob | None] = []
    for i, request in enumerate(requests):
        wanted = request.params.logprobs
        if wanted is None:
            logprobs.append(None)
            continue
        top = dict(zip(top_ids[i][:wanted], top_values[i][:wanted]))
        logprobs.append(TokenLogprob(token_ids[i], chosen[i], top))
    return StepResult(token_ids, logprobs)
