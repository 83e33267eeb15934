"""bfloat16 products for a frozen model's Linears, on CPUs that multiply bfloat16 natively.

A frozen Linear's weight is stored in bfloat16 and its product runs in oneDNN's bfloat16 kernels
with float32 sums; what goes in and comes out stays float32, so everything around it (norms,
attention, a LoRA beside it, the loss) is unchanged. Gradients still flow to the input (a LoRA
trained above a frozen layer needs them), through the same bfloat16 weight; the weight itself gets
none. Used by the probe judge's reading (judge/probe.py) and by consolidation's KTO steps
(learn/kto_cpu.py). Only worth it where `models.bf16_supported()`: emulated bfloat16 is slower
than float32.
"""
from __future__ import annotations

from collections.abc import Container

import torch


class _Product(torch.autograd.Function):
    """x @ w.T in w's dtype, float32 out; the gradient goes to x only."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return torch.nn.functional.linear(x.to(weight.dtype), weight).float()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (weight,) = ctx.saved_tensors
        return torch.matmul(grad.to(weight.dtype), weight).float(), None


class Products(torch.nn.Module):
    """A frozen Linear whose product runs in `dtype` (float32 in, float32 out). Its weight is a
    plain attribute, not a parameter: it is in no state dict and no optimizer."""

    def __init__(self, linear: torch.nn.Linear, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight.detach().to(dtype).contiguous()
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _Product.apply(x, self.weight)
        return y if self.bias is None else y + self.bias


def products_in(root: torch.nn.Module, dtype: torch.dtype = torch.bfloat16,
                skip: Container[str] = ()) -> int:
    """Every frozen Linear under `root` (its weight needs no gradient) replaced by Products, except
    children named in `skip`; trainable Linears (a LoRA's A and B) are kept. Returns how many."""
    swapped = 0
    for module in list(root.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear) and not child.weight.requires_grad and name not in skip:
                setattr(module, name, Products(child, dtype))
                swapped += 1
    return swapped
