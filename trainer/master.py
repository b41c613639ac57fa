"""bf16 model weights with fp32 master weights in the optimizer, as Megatron-LM's --bf16 keeps them.

The model's parameters live in bf16, so no fp32→bf16 weight cast runs per micro-batch, and the expert
grouped GEMMs read their weights as they are. The optimizer (fused AdamW) updates fp32 master copies and
writes them back to the bf16 weights once per step. Gradients are accumulated over micro-batches either
in fp32 "main grads" (Megatron's default for bf16: a post-accumulate hook adds each micro-batch's bf16
gradient into an fp32 buffer) or in bf16 on the parameters (a precision-aware optimizer's "bf16
gradients", which `trainer.adamw_pa` reads in place), chosen by `optimizer.main_grads`.
"""

from __future__ import annotations

import torch
from torch import nn

from trainer.adamw_pa import PrecisionAwareAdamW
from trainer.optim import build_optimizer
from trainer.recipe import OptimizerConfig


class MasterWeights:
    """fp32 master copies of a model's parameters; call `to_bf16()` on the model after constructing this."""

    def __init__(self, model: nn.Module, cfg: OptimizerConfig, fp32_main_grads: bool):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = [nn.Parameter(p.detach().float().clone()) for p in self.params]
        self.fp32_main_grads = fp32_main_grads
        if fp32_main_grads and cfg.moments == "fp32":
            holder = nn.Module()
            holder.params = nn.ParameterList(self.master)
            self.optimizer = build_optimizer(holder, cfg)
        else:  # bf16 gradients read where they are, or bf16 moments: the precision-aware optimizer
            sources = self.master if fp32_main_grads else self.params
            moments = torch.bfloat16 if cfg.moments == "bf16" else torch.float32
            self.optimizer = PrecisionAwareAdamW(self.master, sources, cfg, moments)
        if fp32_main_grads:
            for param, master in zip(self.params, self.master, strict=True):
                master.grad = torch.zeros_like(master)
                param.register_post_accumulate_grad_hook(self._hook(master))

    @staticmethod
    def _hook(master: nn.Parameter):
        def accumulate(param: torch.Tensor) -> None:
            master.grad.add_(param.grad)  # fp32 += bf16 (upcast in the kernel)
            param.grad = None  # the bf16 gradient is not kept between micro-batches

        return accumulate

    def to_bf16(self, model: nn.Module) -> None:
        model.to(torch.bfloat16)

    def grads_by_param(self) -> list[tuple[nn.Parameter, torch.Tensor | None]]:
        """(model parameter, its gradient: the fp32 main grad, or the bf16 gradient itself) in parameter order."""
        if not self.fp32_main_grads:
            return [(p, p.grad) for p in self.params]
        return [(p, m.grad) for p, m in zip(self.params, self.master, strict=True)]

    def finish_step(self) -> None:
        """After optimizer.step(): master → bf16 weights, and clear this step's gradients."""
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.master)
        if self.fp32_main_grads:
            torch._foreach_zero_([m.grad for m in self.master])
        else:
            for param in self.params:
                param.grad = None
