"""course_utils.memory.leaks: graph_memory measures the bytes that autograd graphs kept alive hold (kept,
freed by backward or del, none under no_grad, the parameters left out), and graph_nodes counts a graph's
nodes (a chain that grows with each step)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.memory.leaks import graph_memory, graph_nodes


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def test_graph_memory_sees_graphs_kept_and_freed():
    net = _net()
    x = torch.randn(4, 8)
    with graph_memory(exclude=net) as meter:
        kept = [net(x).sum() for _ in range(3)]  # three graphs, never backwarded
        held = meter.alive_bytes()
        kept[0].backward()  # frees the first graph's saved tensors
        after_backward = meter.alive_bytes()
        del kept
        after_del = meter.alive_bytes()
    # each graph saves the ReLU's output (4 × 16 floats) and the input of the second linear (the same
    # storage) plus the input x, counted once overall since all three graphs share it
    assert held == 3 * 4 * 16 * 4 + 4 * 8 * 4
    assert after_backward == 2 * 4 * 16 * 4 + 4 * 8 * 4
    assert after_del == 0
    assert meter.packed > 0


def test_graph_memory_leaves_parameters_out_and_no_grad_saves_nothing():
    net = _net()
    with graph_memory(exclude=net) as meter, torch.no_grad():
        net(torch.randn(4, 8))
    assert meter.packed == 0 and meter.alive_bytes() == 0


def test_graph_nodes_counts_a_growing_chain():
    net = _net()
    total: torch.Tensor | float = 0.0
    counts = []
    for _ in range(3):
        loss = F.cross_entropy(net(torch.randn(3, 8)), torch.tensor([0, 1, 1]))
        loss.backward()
        total = total + loss
        assert isinstance(total, torch.Tensor)
        counts.append(graph_nodes(total))
    assert counts[1] - counts[0] == counts[2] - counts[1] > 0
    assert graph_nodes(torch.ones(2)) == 0
