"""The small networks several places share: notebook 06 (loading across devices) and the tool that saved
its GPU checkpoints (tools/make_gpu_checkpoints.py), and the tests. One definition, so that a checkpoint
saved from one always fits the other.

- `FooNet`: the 2019 lecture's network, three 3×3 linear layers without bias, each followed by a ReLU.
- `TinyClassifier`: notebook 06's exercise network, 4 → 8 → 2.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["FooNet", "TinyClassifier"]


class FooNet(nn.Module):
    """The lecture's network: three 3×3 linear layers without bias, each followed by a ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.linears = nn.ModuleList([nn.Linear(3, 3, bias=False) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for linear in self.linears:
            x = torch.relu(linear(x))
        return x


class TinyClassifier(nn.Module):
    """Notebook 06's exercise network: 4 inputs, 8 hidden units with a ReLU, 2 outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(4, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))
