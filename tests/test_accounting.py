"""course_utils.memory.accounting: the bytes autograd saves for the backward (saved_tensor_bytes: each
activation once, the weights left out; linear in the batch for the GPT), and the allocation timeline of a
memory snapshot with its plot."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_utils.memory.accounting import allocation_timeline, plot_memory_timeline, saved_tensor_bytes
from course_utils.models import GPT, GPTConfig, token_batch


def test_saved_tensor_bytes_counts_activations_once_and_not_weights() -> None:
    linear = nn.Linear(100, 100, bias=False)
    x = torch.randn(32, 100, requires_grad=True)
    _, saved = saved_tensor_bytes(lambda: torch.relu(linear(x)), exclude=linear)
    # linear saves its input x (the weight is excluded); relu saves its output
    assert saved == 2 * 32 * 100 * 4
    _, with_weight = saved_tensor_bytes(lambda: linear(x))
    assert with_weight == (32 * 100 + 100 * 100) * 4
    with pytest.raises(TypeError, match="no arguments"):
        saved_tensor_bytes(linear(x))  # type: ignore[arg-type]


def test_activation_bytes_grow_with_the_batch() -> None:
    model = GPT(GPTConfig())
    sizes = [saved_tensor_bytes(lambda b=b: model.loss(token_batch(GPTConfig(batch=b))), exclude=model)[1]
             for b in (2, 4, 6)]
    assert sizes[2] - sizes[1] == sizes[1] - sizes[0] > 0.9 * sizes[0]  # linear; a tiny constant part


def test_allocation_timeline() -> None:
    snapshot = {"device_traces": [[
        {"action": "segment_alloc", "size": 1000}, {"action": "alloc", "size": 100},
        {"action": "alloc", "size": 50}, {"action": "free_requested", "size": 100},
        {"action": "free_completed", "size": 100},
    ]]}
    assert allocation_timeline(snapshot, start_bytes=10) == [10, 110, 160, 160, 60]
    with pytest.raises(ValueError, match="device 1"):
        allocation_timeline(snapshot, device=1)
    with pytest.raises(ValueError, match="not a memory snapshot"):
        allocation_timeline({"segments": []})
    fig = plot_memory_timeline([0, 2**30, 2**29], [("forward", 0, 2)])
    assert fig.axes[0].get_ylabel() == "allocated (GiB)"
