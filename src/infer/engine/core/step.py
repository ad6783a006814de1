"""One step of the engine, from the scheduler's decision to the tokens ``update`` records.

The scheduler creates a ``Step`` (``Scheduler.schedule``, ``schedule_ahead``): which tokens of
which requests run. The runner fills it as it goes: ``launch`` queues its forward pass and
leaves the logits of the rows that sample; ``sample`` queues their sampling and the copy of
the samples to the host, behind ``done``; ``collect`` waits for that copy and puts the
tokens on the step. ``Scheduler.update`` consumes it. A step holds only what is its own: the
device tensors of its logits and samples, their host copies, and nothing after it is dropped.

The runner's lower-level types stay its own: ``StepInputs`` (what a tensor-parallel rank
receives), the attention's ``ScheduledSequence``/``HostBatch``/``AttentionMetadata``, the
sampler's ``SamplingBatch``/``SamplerOutput``, the grammars' ``Bitmask``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infer.contract.outputs import TokenLogprob
from infer.engine.core.request import Request

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from infer.engine.speculative.verify_step import VerifyOutputs


@dataclass
class ScheduledChunk:
    """``num_tokens`` tokens of ``request`` from position ``start`` computed in this step;
    ``samples``: they reach the end of the sequence, so a token is sampled. The last
    ``len(proposals)`` of them are proposed tokens, each sampled after too."""

    request: Request
    start: int
    num_tokens: int
    samples: bool
    proposals: list[int] = field(default_factory=list)
    # The most proposals the row may take (host's, or a verify row's made on the device).
    proposal_limit: int = 0
    verify: bool = False  # a verify row: its tokens (and where they start) are the device's

    @property
    def output_index(self) -> int:
        """Which output a chunk that samples samples first (0: the first), fixed when it is
        scheduled: a seed draws the same noise for the same output whether or not the step
        was scheduled ahead or speculated, and however many samples are on the device."""
        end = self.start + self.num_tokens - len(self.proposals)
        return end - self.request.num_prompt_tokens

    @property
    def num_samples(self) -> int:
        if self.verify:
            return self.num_tokens
        return 1 + len(self.proposals) if self.samples else 0


@dataclass(eq=False)
class Step:
    """One step: what the scheduler decided, what the runner queued for it on the device, and
    the samples collected from there (see the module's docstring)."""

    # --- the scheduler's decision (``Scheduler.schedule``, ``schedule_ahead``) -------------
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    failed: list[Request] = field(default_factory=list)  # finished at admission
    # Scheduled ahead: (row, sample) pairs; the row's one input token is that sample of the
    # step in flight (still on the device).
    fed_rows: list[tuple[int, int]] = field(default_factory=list)
    # Scheduled ahead but short of blocks: the next step runs synchronously (and preempts).
    needs_host: bool = False
    # Decoding rows may carry proposals (``speculative_config``): ``update`` counts how the
    # step paid off.
    speculative: bool = False
    # A chunk's request scores its prompt (``prompt_logprobs``): the runner plans which
    # positions to project; other steps skip the planning.
    scores_prompts: bool = False
    # A verify step (every chunk a verify row of this many tokens); 0 for any other.
    verify_queries: int = 0

    # --- launched (``ModelRunner.launch``): the rows that sample and their logits ----------
    rows: list[Request] = field(default_factory=list)  # in order (proposals: several a request)
    output_indices: list[int] = field(default_factory=list)  # which output each row samples
    proposed: list[list[int]] | None = None  # the proposed tokens before each row
    logits: Tensor | None = None  # [rows, vocab]; dropped once sampled
    verify: VerifyOutputs | None = None  # a verify step's (``verify_step``); dropped likewise

    # --- sampled (``ModelRunner.sample``): the samples, on the device and copied to the host
    samples: Tensor | None = None  # [rows]: a step queued behind reads its fed rows here
    # A verify step: per row, the sample the next step continues from and the proposals
    # accepted, on the device (a plain step continues from ``samples``, accepting none).
    continues_from: Tensor | None = None
    accepted_on_device: Tensor | None = None
    # Host copies: the samples (a verify step's: then each row's accepted and proposed
    # counts), their logprobs, top ids, top logprobs.
    host: list[Tensor | None] = field(default_factory=list)
    done: torch.cuda.Event | None = None  # None on the CPU, where the copies are done

    # --- collected (``ModelRunner.collect``): the samples on the host, for ``update`` -------
    token_ids: list[int] = field(default_factory=list)  # ``num_samples`` per sampling chunk
    logprobs: list[TokenLogprob | None] = field(default_factory=list)
    accepted: list[int] | None = None  # a verify step's: per chunk, proposals that stood
    num_proposals: list[int] | None = None  # and proposals it ran

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def num_samples(self) -> int:
        return sum(c.num_samples for c in self.chunks)

    def requests(self) -> list[Request]:
        return [c.request for c in self.chunks]

    def chunks_that_sample(self) -> list[ScheduledChunk]:
        return [c for c in self.chunks if c.samples]

    def reads_outputs(self) -> bool:
        """Whether its sampling reads its requests' outputs so far on the host (a grammar's
        mask, penalties), so it cannot be sampled before the step in flight is collected."""
        return any(c.request.params.needs_output_tokens for c in self.chunks)
