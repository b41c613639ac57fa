"""Output layer + next-token cross entropy: native (full fp32 logits), fused (token-chunked), or TE's kernel."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.grad_accum import linear

# Budget of one fp32 logits chunk in the fused loss.
FUSED_CHUNK_BYTES = 1 << 30


def cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, kind: str = "native"
                  ) -> torch.Tensor:
    """Mean cross entropy of softmax(hidden · weightᵀ) against targets. hidden [B, S, h], weight [V, h]."""
    h = hidden.reshape(-1, hidden.shape[-1])
    t = targets.reshape(-1)
    if kind == "native":
        logits = linear(h, weight)  # compute dtype under autocast; dW into main_grad when fused
        return F.cross_entropy(logits.float(), t)  # fp32 softmax over the full [N, V] logits
    if kind == "fused":
        return FusedLinearCrossEntropy.apply(h, weight, t)
    if kind == "te":
        from trainer.te_support import te_cross_entropy

        # TE's Triton kernel reads the compute-dtype logits [B, S, V] and does the softmax in fp32 itself
        # (no fp32 copy of the logits); per-token losses back, averaged here.
        logits = linear(hidden, weight)
        return te_cross_entropy()(logits, targets, 0.0, False, None).float().mean()
    raise ValueError(f"cross_entropy: unknown {kind!r} (native, fused or te)")


class FusedLinearCrossEntropy(torch.autograd.Function):
    """Logits GEMM + softmax CE one token chunk at a time; the gradients are computed in the forward.

    The loss is the graph's last op, so d loss/d logits = (softmax − onehot)/N is known during the
    forward: each chunk's logits live only while its gradient GEMMs run, and the backward just scales
    the stored gradients by the incoming grad. Peak memory: one fp32 chunk of logits (≤ 1 GiB) plus
    grad(hidden) [N, h] and an fp32 grad(weight) [V, h], instead of [N, V] logits in two dtypes.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        n, vocab = hidden.shape[0], weight.shape[0]
        dtype = hidden.dtype
        if torch.is_autocast_enabled(hidden.device.type):
            dtype = torch.get_autocast_dtype(hidden.device.type)
        with torch.autocast(hidden.device.type, enabled=False):
            x, w = hidden.to(dtype), weight.to(dtype)
            chunk = max(1, FUSED_CHUNK_BYTES // (4 * vocab))
            loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
            grad_x = torch.empty_like(x)
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            for start in range(0, n, chunk):
                xs, ts = x[start:start + chunk], targets[start:start + chunk]
                logits = (xs @ w.t()).float()
                lse = torch.logsumexp(logits, dim=-1)
                loss += (lse - logits.gather(1, ts[:, None]).squeeze(1)).sum()
                grad = torch.softmax(logits, dim=-1)
                grad[torch.arange(ts.shape[0], device=ts.device), ts] -= 1.0
                grad = (grad / n).to(dtype)
                grad_x[start:start + chunk] = grad @ w
                grad_w += (grad.t() @ xs).float()
        ctx.save_for_backward(grad_x, grad_w.to(weight.dtype))
        ctx.hidden_dtype = hidden.dtype
        return loss / n

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        grad_x, grad_w = ctx.saved_tensors
        return (grad_x * grad_output).to(ctx.hidden_dtype), grad_w * grad_output, None
