"""Expert capacity: the one formula the MoE layer, the recipe's layout check and the memory estimate share.

Torch-free (the standard library only), so the login side's `trainer.recipe` and `trainer.memory` use it too.
"""

from __future__ import annotations

import math


def expert_capacity(num_tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Megatron's `get_capacity`: ceil(T·k / E · factor) rows per expert, for a chunk of T tokens."""
    return math.ceil(num_tokens * top_k / num_experts * capacity_factor)


def chunk_sizes(num_tokens: int, chunk_tokens: int | None) -> list[int]:
    """Tokens in each dispatch chunk of `chunk_tokens` (None: one chunk of all), in order; the last may be shorter."""
    chunk = min(chunk_tokens or num_tokens, num_tokens)
    return [chunk] * (num_tokens // chunk) + ([num_tokens % chunk] if num_tokens % chunk else [])
