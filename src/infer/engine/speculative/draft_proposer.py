"""Proposals from a draft model (``{"model": DRAFT, "num_speculative_tokens": k}``): a
smaller model with the target's tokenizer, with its own weights, KV pool and runner, built
by the code that builds the target's (``build_rank``), run greedily for every proposing row
of a step (one pass over the tokens it has not seen, then one decode pass per proposal).

For each request the draft keeps the tokens whose K/V it holds. A call first rewinds its
cache to where they agree with the request's tokens (proposals the target rejected), then
computes the rest, so a rejected proposal costs the draft nothing more than a recompute of
that one position.
"""

from __future__ import annotations

import dataclasses

import torch

from infer.attention import ScheduledSequence
from infer.config import EngineConfig, ModelConfig
from infer.distributed.group import SINGLE
from infer.engine.core.request import Request
from infer.engine.core.runner import StepInputs
from infer.engine.setup.rank import RankState, build_rank
from infer.loader import resolve_model

# On a GPU the draft is built before the target, within this share of the engine's
# ``gpu_memory_utilization`` (weights and cache); the target then takes what is left.
DRAFT_MEMORY_SHARE = 0.1


class DraftModelProposer:
    def __init__(self, rank: RankState) -> None:
        self.rank = rank
        self._seqs: dict[str, int] = {}  # request id → the draft's sequence
        self._held: dict[str, list[int]] = {}  # request id → tokens whose K/V it holds

    @classmethod
    def build(
        cls, config: EngineConfig, max_seq_len: int, device: torch.device
    ) -> DraftModelProposer:
        """The draft of ``config.speculative_config`` on the target's device, for contexts
        up to ``max_seq_len``: eager (no graphs), no prefix cache, one rank."""
        spec = config.speculative_config
        assert spec is not None and spec.model is not None
        draft_config = dataclasses.replace(
            config,
            model=spec.model,
            speculative_config=None,
            tensor_parallel_size=1,
            nnodes=1,
            node_rank=0,
            use_cuda_graphs=False,
            use_prefix_caching=False,
            quantization=None,
            gpu_memory_utilization=config.gpu_memory_utilization * DRAFT_MEMORY_SHARE,
        )
        source = resolve_model(spec.model)
        model_config = ModelConfig.from_hf_dict(source.hf_config)
        context = min(max_seq_len, draft_config.resolved_max_seq_len(model_config))
        return cls(build_rank(draft_config, source, model_config, context, device, SINGLE))

    def propose(self, requests: list[Request], limits: list[int]) -> list[list[int]]:
        proposals: list[list[int]] = [[] for _ in requests]
        rows = [i for i, r in enumerate(requests) if limits[i] > 0 and self._catch_up(r, limits[i])]
        # First pass: each row's tokens the draft has not seen; then one token a pass.
        inputs = [requests[i].token_ids[self._computed(requests[i]) :] for i in rows]
        while rows:
            tokens = self._greedy([self._extend(requests[i], new) for i, new in zip(rows, inputs)])
            for i, token in zip(rows, tokens):
                proposals[i].append(token)
            rows = [i for i in rows if len(proposals[i]) < limits[i]]
            inputs = [[proposals[i][-1]] for i in rows]
        return proposals

    def forget(self, request: Request) -> None:
        seq = self._seqs.pop(request.request_id, None)
        if seq is not None:
            self.rank.pool.free_sequence(seq)
            del self._held[request.request_id]

    def _catch_up(self, request: Request, limit: int) -> bool:
        """Rewind the request's draft sequence to where it agrees with the request and make
        room for the rest and ``limit`` proposals; False when the draft cannot hold it."""
        pool = self.rank.pool
        if request.num_tokens + limit > self.rank.max_seq_len:
            return False
        seq = self._seqs.get(request.request_id)
        if seq is None:
            seq = pool.allocate_sequence(0)
            if seq is None:
                return False
            self._seqs[request.request_id], self._held[request.request_id] = seq, []
        held = self._held[request.request_id]
        agreed = 0
        for mine, theirs in zip(held, request.token_ids):
            if mine != theirs:
                break
            agreed += 1
        agreed = min(agreed, request.num_tokens - 1)  # the last known token is an input
        pool.rewind(seq, len(held) - agreed)
        del held[agreed:]
        # Its unseen tokens and every proposal but the last go through the draft.
        return pool.prepare_append(seq, request.num_tokens - agreed + limit - 1)

    def _computed(self, request: Request) -> int:
        return self.rank.pool.get_seq_len(self._seqs[request.request_id])

    def _extend(self, request: Request, tokens: list[int]) -> ScheduledSequence:
        """The request's draft sequence computing ``tokens`` next."""
        pool, seq = self.rank.pool, self._seqs[request.request_id]
        sequence = ScheduledSequence(pool.block_table(seq), pool.get_seq_len(seq), tokens)
        pool.advance(seq, len(tokens))
        self._held[request.request_id] += tokens
        return sequence

    @torch.inference_mode()
    def _greedy(self, sequences: list[ScheduledSequence]) -> list[int]:
        """The draft's argmax after each sequence (one forward pass)."""
        step = StepInputs(sequences, [1] * len(sequences), False, self.rank.pool.take_copies())
        logits, _ = self.rank.runner.run_model(step, None)
        return logits.argmax(dim=-1).tolist()
