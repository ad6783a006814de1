"""The pool's K/V storage: block copies (a shared prefix's last block, copied on write)."""

from __future__ import annotations

import pytest
import torch
from tests.conftest import CUDA_PARAM

from infer.cache.kv_tensors import KVTensors


@pytest.mark.parametrize("device", ["cpu", CUDA_PARAM])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e4m3fn])
def test_copy_blocks_copies_every_layer_of_each_pair(dtype: torch.dtype, device: str) -> None:
    shape = (2, 4, 1, 2, 4)  # layers, blocks, KV heads, block size, head dim
    k, v = (torch.randn(shape).to(dtype).to(device) for _ in range(2))
    kv = KVTensors(k, v)
    before_k, before_v = kv.k.float().clone(), kv.v.float().clone()
    kv.copy_blocks([(0, 3), (1, 2)])
    assert kv.k.dtype == dtype
    for source, destination in ((0, 3), (1, 2)):
        assert torch.equal(kv.k[:, destination].float(), before_k[:, source])
        assert torch.equal(kv.v[:, destination].float(), before_v[:, source])
    assert torch.equal(kv.k[:, :2].float(), before_k[:, :2])  # sources untouched
