"""Seeded mock token data: noisy arithmetic sequences, a distinct deterministic slice per data-parallel rank.

Sample i of a stream is a pure function of (seed, stream, i): token_j = (start + j·stride) mod V with
stride in 1..8, and each token replaced by a uniform one with probability 0.1. A model learns the
bigram structure quickly (loss falls well below ln V) and can do better by inferring the stride from
context; generating a sample costs a few tensor ops on the host.

Sample indices are global: step s (1-based), micro-batch m, DP rank r, row j reads sample
(s−1)·GB + m·(mb·DP) + r·mb + j, so the global batch of a step is the same whatever the DP layout.
Training and evaluation read different streams and neither holds RNG state, so evaluating never
changes the training data.
"""

from __future__ import annotations

import torch

TRAIN, EVAL = 0, 1
MAX_STRIDE = 8
NOISE = 0.1
_MASK64 = (1 << 64) - 1


def _mix(*values: int) -> int:
    """SplitMix64 over the values: a well-spread 63-bit seed for torch.Generator."""
    z = 0x9E3779B97F4A7C15
    for v in values:
        z = (z ^ (v & _MASK64)) & _MASK64
        z = (z + 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
    return z & ((1 << 63) - 1)


def sample(seed: int, stream: int, index: int, length: int, vocab_size: int) -> torch.Tensor:
    """One sequence of `length` int64 tokens."""
    g = torch.Generator().manual_seed(_mix(seed, stream, index))
    start = int(torch.randint(vocab_size, (1,), generator=g))
    stride = int(torch.randint(1, MAX_STRIDE + 1, (1,), generator=g))
    tokens = (start + stride * torch.arange(length)) % vocab_size
    noisy = torch.rand(length, generator=g) < NOISE
    return torch.where(noisy, torch.randint(vocab_size, (length,), generator=g), tokens)


class MockData:
    """Micro-batches (inputs, targets) of one DP rank; targets are the inputs shifted by one."""

    def __init__(self, seed: int, vocab_size: int, seq_length: int, micro_batch: int, dp_rank: int,
                 dp_size: int, accumulation: int, device: torch.device | str = "cpu"):
        self.seed, self.vocab, self.seq = seed, vocab_size, seq_length
        self.mb, self.rank, self.dp, self.accum = micro_batch, dp_rank, dp_size, accumulation
        self.device = torch.device(device)

    def _batch(self, stream: int, first: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.stack([sample(self.seed, stream, first + j, self.seq + 1, self.vocab) for j in range(self.mb)])
        if self.device.type == "cuda":
            rows = rows.pin_memory().to(self.device, non_blocking=True)  # async H2D copy, no sync
        return rows[:, :-1], rows[:, 1:]

    def train_batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Micro-batch `micro` (0-based) of optimizer step `step` (1-based)."""
        global_batch = self.accum * self.mb * self.dp
        return self._batch(TRAIN, (step - 1) * global_batch + micro * self.mb * self.dp + self.rank * self.mb)

    def eval_batch(self, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Micro-batch `micro` of the fixed held-out set (the same at every evaluation)."""
        return self._batch(EVAL, micro * self.mb * self.dp + self.rank * self.mb)
