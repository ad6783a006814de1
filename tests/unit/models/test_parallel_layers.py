"""How the tensor-parallel layers split checkpoint tensors: each rank's rows or columns,
replicated KV heads, the padded vocabulary, lazy safetensors slices; and the checks that
name ``tensor_parallel_size``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tests.conftest import TINY_CONFIGS

from infer.cli import build_parser
from infer.config import EngineConfig, ModelConfig
from infer.distributed.group import ParallelGroup
from infer.models.common import check_tensor_parallel, kv_heads_per_rank
from infer.models.fp8 import FP8, quantize_rows
from infer.models.parallel_layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    Split,
    VocabParallelEmbedding,
)


def ranks(world: int) -> list[ParallelGroup]:
    """Groups for each rank; loading needs no communication, so none is set up."""
    return [ParallelGroup(rank, world) for rank in range(world)]


def test_split_rows_divide_or_replicate() -> None:
    assert [Split(64, 2).rows(r, 2) for r in range(2)] == [slice(0, 32), slice(32, 64)]
    assert [Split(16, 1).rows(r, 2) for r in range(2)] == [slice(0, 16)] * 2  # 1 KV head
    four = [Split(32, 2).rows(r, 4) for r in range(4)]
    assert four == [slice(0, 16), slice(0, 16), slice(16, 32), slice(16, 32)]
    assert [kv_heads_per_rank(kv, 4) for kv in (1, 2, 4, 8)] == [1, 1, 1, 2]


def test_column_parallel_ranks_together_hold_the_checkpoint(tmp_path: Path) -> None:
    """q and k/v of a GQA projection, loaded by two ranks from lazy safetensors slices."""
    q, kv = torch.randn(8, 6), torch.randn(4, 6)
    save_file({"q": q, "k": kv}, str(tmp_path / "w.safetensors"))
    loaded = []
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        for group in ranks(2):
            layer = ColumnParallelLinear(
                6, {"q": Split(8, 2), "k": Split(4, 1)}, bias=False, group=group
            )
            layer.load("weight", f.get_slice("q"), "q", "q")
            layer.load("weight", f.get_slice("k"), "k", "k")
            loaded.append(layer.weight.data)
    assert torch.equal(loaded[0], torch.cat([q[:4], kv]))
    assert torch.equal(loaded[1], torch.cat([q[4:], kv]))


def test_row_parallel_takes_columns_and_checks_the_whole_shape() -> None:
    weight = torch.randn(3, 8)
    halves = []
    for group in ranks(2):
        layer = RowParallelLinear(8, 3, bias=False, group=group)
        layer.load("weight", weight, "o_proj.weight", None)
        halves.append(layer.weight.data)
    assert torch.equal(torch.cat(halves, dim=1), weight)
    with pytest.raises(ValueError, match=r"o_proj.weight: checkpoint shape \(3, 6\)"):
        RowParallelLinear(8, 3, bias=False, group=ranks(2)[0]).load(
            "weight", torch.randn(3, 6), "o_proj.weight", None
        )


def fp8_column(group: ParallelGroup) -> ColumnParallelLinear:
    layer = ColumnParallelLinear(6, {"q": Split(8, 2), "k": Split(4, 1)}, bias=False, group=group)
    layer.use_fp8()
    return layer


def test_fp8_column_ranks_quantise_their_own_rows() -> None:
    q, kv = torch.randn(8, 6), torch.randn(4, 6)
    for rank, group in enumerate(ranks(2)):
        layer = fp8_column(group)
        layer.load("weight", q, "q", "q")
        layer.load("weight", kv, "k", "k")
        expected_q, expected_scale = quantize_rows(torch.cat([q[rank * 4 : rank * 4 + 4], kv]))
        assert layer.weight.dtype == FP8 and layer.weight_scale is not None
        assert torch.equal(layer.weight.float(), expected_q.float())
        assert torch.equal(layer.weight_scale, expected_scale)


def test_fp8_column_takes_checkpoint_rows_and_per_tensor_or_channel_scales() -> None:
    q_fp8, k_fp8 = torch.randn(8, 6).to(FP8), torch.randn(4, 6).to(FP8)
    q_scales = torch.arange(1.0, 9.0).unsqueeze(1)  # per channel, [8, 1] as stored
    layer = fp8_column(ranks(2)[1])
    layer.load("weight", q_fp8, "q", "q")
    layer.load("weight", k_fp8, "k", "k")
    layer.load("weight_scale", q_scales, "q_scale", "q")
    layer.load("weight_scale", torch.tensor(0.5), "k_scale", "k")  # per tensor
    assert torch.equal(layer.weight.float(), torch.cat([q_fp8[4:], k_fp8]).float())
    assert layer.weight_scale is not None
    assert layer.weight_scale.tolist() == [5.0, 6.0, 7.0, 8.0, 0.5, 0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match=r"q_scale: 3 scales, expected 1 .* or 8"):
        layer.load("weight_scale", torch.ones(3), "q_scale", "q")


def test_fp8_row_ranks_quantise_their_columns_and_sum_to_the_product() -> None:
    """Each rank's row scales come from its own columns (quantised after slicing); the
    partial products still add up to the whole product within FP8 rounding."""
    torch.manual_seed(0)
    weight, x = torch.randn(3, 8), torch.randn(2, 8)
    partial = []
    for rank, group in enumerate(ranks(2)):
        layer = RowParallelLinear(8, 3, bias=False, group=group)
        layer.use_fp8()
        layer.load("weight", weight, "o_proj.weight", None)
        columns = weight[:, rank * 4 : rank * 4 + 4]
        assert layer.weight_scale is not None
        assert torch.equal(layer.weight_scale, quantize_rows(columns)[1])
        partial.append(layer.matmul(x[:, rank * 4 : rank * 4 + 4]))
    # Weights and activations each round within 1/16 of their value (FP8's half-ulp): the
    # sum is within 1/8 of its terms' magnitudes, whatever cancels (a fixed tolerance
    # failed on an output near zero).
    error = (partial[0] + partial[1] - x @ weight.T).abs()
    assert (error <= 0.15 * (x.abs() @ weight.abs().T) + 1e-3).all(), error


def test_fp8_tensors_need_an_fp8_layer() -> None:
    layer = RowParallelLinear(8, 3, bias=False, group=ranks(1)[0])
    with pytest.raises(ValueError, match=r"o_proj\.weight: FP8 weights, but"):
        layer.load("weight", torch.randn(3, 8).to(FP8), "o_proj.weight", None)
    with pytest.raises(ValueError, match=r"o_proj\.weight_scale: a weight scale for a layer"):
        layer.load("weight_scale", torch.ones(3), "o_proj.weight_scale", None)


def test_vocabulary_is_padded_to_a_multiple_of_the_ranks() -> None:
    table = torch.randn(5, 4)
    shards = []
    for group in ranks(2):
        embedding = VocabParallelEmbedding(5, 4, group)
        embedding.load("weight", table, "embed_tokens.weight", None)
        shards.append(embedding.weight.data)
    assert torch.equal(shards[0], table[:3])
    assert torch.equal(shards[1][:2], table[3:]) and not shards[1][2].any()


def test_unsplittable_shapes_name_the_flag() -> None:
    config = ModelConfig.from_hf_dict(TINY_CONFIGS["llama"])  # 4 heads, 2 KV heads
    check_tensor_parallel(config, 2)
    check_tensor_parallel(config, 4)  # 2 KV heads, each on 2 ranks
    with pytest.raises(ValueError, match=r"tensor_parallel_size: 3 ranks .* 4 attention heads"):
        check_tensor_parallel(config, 3)


def test_flag_and_validation() -> None:
    args = build_parser().parse_args(["serve", "-tp", "2"])
    assert args.tensor_parallel_size == 2
    with pytest.raises(ValueError, match="tensor_parallel_size: must be >= 1"):
        EngineConfig(tensor_parallel_size=0)
