"""Lab 0.3, chapter 1: why cache K and V at all — counting their computations.

Without a cache every generation step recomputes K and V for the whole sequence so far:
the prompt's ``p`` once, then ``p + 1``, ``p + 2``, …, ``p + g`` for ``g`` generated
tokens — ``p + Σ(p + step)``, quadratic in length. With a cache each token's K/V is
computed once: ``p + g``. (For p=128, g=100 that is 17,978 vs 228; the lab prints 16,576,
which its own code does not give.)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class CacheExplanation:
    prompt_tokens: int
    generated_tokens: int
    without_cache: int
    with_cache: int

    @property
    def ratio(self) -> float:
        return self.without_cache / self.with_cache


def kv_computations_without_cache(prompt: int, generated: int) -> int:
    """``prompt + Σ_{step=1..generated} (prompt + step)``."""
    return prompt + generated * prompt + generated * (generated + 1) // 2


def kv_computations_with_cache(prompt: int, generated: int) -> int:
    return prompt + generated


def explain_cache(prompt: int, generated: int) -> CacheExplanation:
    if prompt < 1:
        raise ValueError(f"prompt: must be >= 1 token, got {prompt}")
    if generated < 0:
        raise ValueError(f"generate: must be >= 0 tokens, got {generated}")
    return CacheExplanation(
        prompt,
        generated,
        kv_computations_without_cache(prompt, generated),
        kv_computations_with_cache(prompt, generated),
    )


def format_explanation(e: CacheExplanation) -> str:
    width = len(f"{e.without_cache:,}")
    p, g = e.prompt_tokens, e.generated_tokens
    return "\n".join(
        [
            f"K/V computations for a {p}-token prompt and {g} generated tokens (Lab 0.3, ch. 1):",
            f"  without a cache: {e.without_cache:>{width},}   prompt + sum over steps of "
            f"(prompt + step) = {p} + sum(({p} + s) for s in 1..{g})",
            f"  with a cache:    {e.with_cache:>{width},}   prompt + generated = {p} + {g}",
            f"  the cache saves {e.ratio:.1f}x the K/V projections (the attention dot products "
            "still grow with the context)",
        ]
    )


def explanation_to_json(e: CacheExplanation) -> str:
    return json.dumps({**asdict(e), "ratio": e.ratio}, indent=2)
