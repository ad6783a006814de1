"""Each row's argmax in two passes over a vocabulary-sized row.

torch reduces a row that is its whole output in one pass of one thread block, so at one row
(a lone greedy decode) the argmax over a 128k vocabulary takes several times what reading it
takes. Cut into pieces first, the row's pieces reduce in parallel: each piece's maximum and
where it is, then the first piece holding the largest, whose position is the answer. Both
passes return the first of equal values (and treat NaN as largest), as ``torch.argmax``
does, so the result is the same index.
"""

from __future__ import annotations

import torch
from torch import Tensor

_LARGEST_PIECE = 1024
_SMALLEST_PIECE = 64


def _piece(vocab: int) -> int | None:
    """The largest power of two from 64 to 1024 that divides ``vocab`` into several pieces."""
    piece = _LARGEST_PIECE
    while piece >= _SMALLEST_PIECE:
        if vocab % piece == 0 and vocab > piece:
            return piece
        piece //= 2
    return None


def argmax_rows(x: Tensor, out: Tensor | None = None) -> Tensor:
    """``torch.argmax(x, dim=-1)`` for ``x [B, V]`` (into ``out`` when given)."""
    rows, vocab = x.shape
    piece = _piece(vocab)
    if piece is None or not x.is_contiguous():
        return torch.argmax(x, dim=-1, out=out)
    largest, where = x.view(rows, vocab // piece, piece).max(dim=-1)
    first = largest.argmax(dim=-1, keepdim=True)
    index = first * piece + where.gather(-1, first)
    if out is None:
        return index.squeeze(-1)
    return out.copy_(index.squeeze(-1))
