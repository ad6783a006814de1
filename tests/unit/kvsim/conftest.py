"""Shared setup of the simulator tests: the scheduler settings of a pure memory question."""

from __future__ import annotations

import pytest

from infer.config import EngineConfig

UNLIMITED = 2**62


@pytest.fixture
def memory_only() -> EngineConfig:
    """No batch, token or queue limits; the engine's admission reserve and chunking (in
    chunks of 512: the lab's prompts, up to 512 tokens, are stored whole after one step)."""
    return EngineConfig(
        model="lab",
        max_seq_len=2048,
        prefill_chunk_size=512,
        max_batch_size=UNLIMITED,
        max_num_batched_tokens=UNLIMITED,
        max_waiting_requests=UNLIMITED,
        use_prefix_caching=False,
    )
