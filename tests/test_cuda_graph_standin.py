"""course_utils.performance.cuda_graph_standin: the CPU stand-in of CUDA graphs (cpu_cuda_graphs), whose
replays run on the captured tensors, which refuses what a capture refuses, allows capturable optimizers only
while it is active, and puts torch.cuda back afterwards."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_utils.performance import cuda_graph_standin as graph_standin
from course_utils.performance.cuda_graph_standin import cpu_cuda_graphs


def test_graph_standin_replays_on_the_captured_tensors() -> None:
    with cpu_cuda_graphs():
        x = torch.ones(3)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = x * 2
            x.add_(1)  # an in-place write during capture: undone when the capture ends (nothing ran on a GPU)
        assert torch.equal(x, torch.ones(3))
        graph.replay()
        assert torch.equal(y, torch.full((3,), 2.0)) and torch.equal(x, torch.full((3,), 2.0))
        x.copy_(torch.full((3,), 5.0))
        graph.replay()
        assert torch.equal(y, torch.full((3,), 10.0)) and torch.equal(x, torch.full((3,), 6.0))
        with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                (x * 2).sum().item()
        with pytest.raises(RuntimeError, match="never captured"):
            torch.cuda.CUDAGraph().replay()
    assert torch.cuda.CUDAGraph is not graph_standin.CpuGraph  # restored


def test_the_standin_allows_capturable_optimizers_only_while_active() -> None:
    params = [nn.Parameter(torch.ones(3))]
    params[0].grad = torch.ones(3)
    with cpu_cuda_graphs():
        torch.optim.AdamW(params, lr=0.1, capturable=True).step()
    with pytest.raises(Exception, match="capturable=True"):
        torch.optim.AdamW(params, lr=0.1, capturable=True).step()
