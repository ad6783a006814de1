"""``argmax_rows`` picks the index ``torch.argmax`` picks: the first of equal largest values
(NaN counting as largest), at vocabularies cut into pieces and at ones that cannot be."""

from __future__ import annotations

import pytest
import torch

from infer.kernels.argmax import argmax_rows


@pytest.mark.parametrize("vocab", [128256, 151936, 49152, 262208, 1000, 97])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_rows_is_torch_argmax(vocab: int, dtype: torch.dtype) -> None:
    torch.manual_seed(vocab)
    # Few distinct values: many ties, across pieces and within them.
    x = torch.randint(-3, 4, (5, vocab)).to(dtype)
    x[1, vocab // 3] = float("nan")
    x[2, :] = 7.0
    x[3, -1] = 9.0
    expected = torch.argmax(x, dim=-1)
    assert torch.equal(argmax_rows(x), expected)
    out = torch.full((5,), -1, dtype=torch.int64)
    assert argmax_rows(x, out=out) is out and torch.equal(out, expected)


def test_a_strided_view_takes_torch_argmax() -> None:
    x = torch.randn(4, 2048)[:, :1024]
    assert torch.equal(argmax_rows(x), torch.argmax(x, dim=-1))
