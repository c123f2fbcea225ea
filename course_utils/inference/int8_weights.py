"""Notebook 10: int8 weight-only quantization, by hand — what torchao's ``quantize_(model, Int8WeightOnlyConfig())``
does, in a few lines, so that you can see it.

Decoding at batch 1 reads every weight once per token, and does little arithmetic with it: the time per token
is about the bytes of the weights divided by the memory bandwidth. Store the weights in one byte instead of two
(bf16) and there is half as much to read. Activations stay in bf16/float: only the *weights* are quantized.

Per output channel (a row of ``weight``, shape ``(out, in)``) one scale, so that the row's largest magnitude
maps to 127::

    scale[o] = max_i |W[o, i]| / 127          W_int8[o, i] = round(W[o, i] / scale[o])  in [-127, 127]

and the product dequantises inside the matrix multiplication — convert the int8 weight to the activation's dtype,
multiply, then scale each output column (a scale per output channel commutes with the sum over ``in``)::

    y = (x @ W_int8ᵀ) · scale + bias

The rounding error of one weight is at most scale/2: a row with one large outlier gets a coarse grid for all its
other weights. `quantization_error` measures what it costs on a layer's outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Int8WeightOnlyLinear", "quantization_error", "quantize_linears"]


class Int8WeightOnlyLinear(nn.Module):
    """A linear layer whose weight is stored in int8 with one float scale per output channel."""

    weight: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, weight_int8: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        if weight_int8.dtype != torch.int8 or weight_int8.dim() != 2 or scales.shape != weight_int8.shape[:1]:
            raise ValueError("Int8WeightOnlyLinear: an int8 (out, in) weight and one scale per output channel, got "
                             f"{weight_int8.dtype} {tuple(weight_int8.shape)} and scales {tuple(scales.shape)}")
        self.register_buffer("weight", weight_int8)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8WeightOnlyLinear:
        """The int8 version of ``linear`` (its scales and bias keep ``linear``'s dtype)."""
        w = linear.weight.detach()
        scales = w.abs().amax(dim=1).clamp(min=torch.finfo(w.dtype).tiny) / 127
        weight_int8 = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(weight_int8, scales, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight.to(x.dtype)) * self.scales.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        out_features, in_features = self.weight.shape
        return f"in_features={in_features}, out_features={out_features}, int8 weight, {self.scales.dtype} scales"


def quantize_linears(model: nn.Module, skip: tuple[str, ...] = ()) -> int:
    """Replace every `nn.Linear` of ``model`` (in place) by its `Int8WeightOnlyLinear`, except those whose
    qualified name is in ``skip`` (e.g. ``("head",)``); returns how many were replaced."""
    replaced = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and full not in skip:
                setattr(module, child_name, Int8WeightOnlyLinear.from_linear(child))
                replaced += 1
    return replaced


@torch.no_grad()
def quantization_error(linear: nn.Linear, x: torch.Tensor) -> float:
    """Relative error of the int8 layer's outputs on ``x``: ‖y_int8 − y‖ / ‖y‖ (Frobenius norms)."""
    exact = linear(x)
    return float((Int8WeightOnlyLinear.from_linear(linear)(x) - exact).norm() / exact.norm())
