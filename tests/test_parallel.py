"""Notebook 04's four steps of DataParallel must give what the plain module gives; course_utils.distributed.data_parallel's
chunk sizes and pictures.

The four steps (scatter, replicate, parallel_apply, gather) and data_parallel live in the notebook's own
cells, the lesson's only copy; these tests take them from there, so that a change to a cell is tested here
as well as by nbval.
"""

from __future__ import annotations

import copy
import threading
import warnings
from typing import Any

import matplotlib
import pytest
import torch
from conftest import notebook_functions
from torch import nn

from course_utils.devices import cuda_device_count
from course_utils.distributed.data_parallel import chunk_sizes, plot_batch_split, plot_mechanism

matplotlib.use("Agg")

# what the notebook's steps use from elsewhere
NAMESPACE = {"copy": copy, "threading": threading, "warnings": warnings, "torch": torch, "nn": nn}
STEPS = ("scatter", "replicate", "parallel_apply", "gather", "data_parallel")


@pytest.fixture(scope="module")
def nb() -> Any:
    """The notebook's functions, as attributes: nb.scatter, nb.replicate, ..."""
    return type("NotebookSteps", (), {k: staticmethod(v) for k, v in notebook_functions("04_data_parallel", STEPS, NAMESPACE).items()})


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))


def _grads(module: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters()]


def _loss(out: torch.Tensor) -> torch.Tensor:
    """A scalar that depends on every element of ``out``, each weighted differently."""
    return (out * torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)).sum()


def _compare(nb: Any, module: nn.Module, n: int, x: torch.Tensor, dim: int = 0) -> None:
    """Forward and backward through the module and through the notebook's data_parallel: same outputs,
    parameter gradients and input gradients."""
    ref_module = copy.deepcopy(module)
    ref_x = x.detach().clone().requires_grad_()
    ref_out = ref_module(ref_x)
    _loss(ref_out).backward()

    dp_x = x.detach().clone().requires_grad_()
    out = nb.data_parallel(module, (dp_x,), n, dim)
    _loss(out).backward()

    torch.testing.assert_close(out, ref_out)
    for g, g_ref in zip(_grads(module), _grads(ref_module), strict=True):
        torch.testing.assert_close(g, g_ref)
    torch.testing.assert_close(dp_x.grad, ref_x.grad)


# ---------------------------------------------------------------------------------------- chunk_sizes
@pytest.mark.parametrize("batch", [0, 1, 3, 7, 9, 10, 16, 17, 33])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_chunk_sizes_is_torch_chunk(batch: int, n: int) -> None:
    assert chunk_sizes(batch, n) == [len(c) for c in torch.arange(batch).chunk(n)]


def test_chunk_sizes_examples_and_errors() -> None:
    assert chunk_sizes(9, 4) == [3, 3, 3]
    assert chunk_sizes(10, 8) == [2, 2, 2, 2, 2]
    with pytest.raises(ValueError, match="n_devices must be at least 1"):
        chunk_sizes(4, 0)
    with pytest.raises(TypeError):
        chunk_sizes(4.0, 2)  # type: ignore[arg-type]


def test_notebook_scatter_agrees_with_chunk_sizes(nb: Any) -> None:
    for batch, n in [(9, 4), (10, 8), (16, 2), (3, 4), (17, 3)]:
        assert [len(c[0]) for c in nb.scatter((torch.zeros(batch, 2),), n)] == chunk_sizes(batch, n)


# ---------------------------------------------------------------------------------------- scatter
def test_scatter_tensors_and_other_arguments(nb: Any) -> None:
    x = torch.arange(10).reshape(5, 2)
    parts = nb.scatter((x, "flag", 3.0), 2)
    assert len(parts) == 2 and all(len(p) == 3 for p in parts)
    assert torch.equal(parts[0][0], x[:3]) and torch.equal(parts[1][0], x[3:])
    assert parts[1][1:] == ("flag", 3.0)
    # 3 samples of one tensor and 8 of another on 4 devices: only 3 replicas get both
    assert len(nb.scatter((torch.zeros(3, 1), torch.zeros(8, 1)), 4)) == 3
    seq = torch.zeros(5, 6, 4)  # (time, batch, features), cut along dim 1
    assert [c[0].shape for c in nb.scatter((seq,), 4, dim=1)] == [(5, 2, 4)] * 3


# ---------------------------------------------------------------------------------------- replicate
def test_replicas_copy_parameters_differentiably_and_sum_gradients(nb: Any) -> None:
    net = _mlp()
    replicas = nb.replicate(net, 3)
    assert len(replicas) == 3 and all(type(r) is nn.Sequential for r in replicas)
    for r in replicas:
        w = r[0].weight
        assert w is not net[0].weight and torch.equal(w, net[0].weight)
        assert w.grad_fn.next_functions[0][0].variable is net[0].weight
        assert list(r.parameters()) == []  # the copies are plain attributes, not Parameters
    x = torch.randn(6, 5)
    sum(r(x).sum() for r in replicas).backward()
    single = _mlp()
    (3 * single(x).sum()).backward()
    torch.testing.assert_close(net[0].weight.grad, single[0].weight.grad)


def test_replicas_share_attributes_and_replica_0_the_buffers(nb: Any) -> None:
    class Noted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[int] = []
            self.bn = nn.BatchNorm1d(2)

    net = Noted()
    r0, r1 = nb.replicate(net, 2)
    assert r0.seen is net.seen and r1.seen is net.seen  # a shallow copy: the same list
    assert r0.bn.running_mean is net.bn.running_mean
    assert r1.bn.running_mean is not net.bn.running_mean
    assert torch.equal(r1.bn.running_mean, net.bn.running_mean)


def test_replicate_under_no_grad_detaches(nb: Any) -> None:
    with torch.no_grad():
        replicas = nb.replicate(_mlp(), 2)
    assert not any(r[0].weight.requires_grad for r in replicas)


# ---------------------------------------------------------------------------------------- parallel_apply
def test_parallel_apply_uses_one_thread_per_replica_and_keeps_order(nb: Any) -> None:
    seen: list[str] = []
    lock = threading.Lock()

    class Who(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with lock:
                seen.append(threading.current_thread().name)
            return x * 2

    replicas = nb.replicate(Who(), 3)
    outs = nb.parallel_apply(replicas, [(torch.full((1,), float(i)),) for i in range(3)])
    assert [o.item() for o in outs] == [0.0, 2.0, 4.0]
    assert sorted(seen) == ["replica-0", "replica-1", "replica-2"]


def test_parallel_apply_reports_the_failing_replica(nb: Any) -> None:
    net = nn.Linear(4, 2)
    with pytest.raises(RuntimeError, match=r"Caught RuntimeError in replica 1: .*mat1 and mat2") as info:
        nb.parallel_apply(nb.replicate(net, 2), [(torch.zeros(2, 4),), (torch.zeros(2, 3),)])
    assert isinstance(info.value.__cause__, RuntimeError)


def test_grad_mode_reaches_the_threads(nb: Any) -> None:
    with torch.no_grad():
        out = nb.data_parallel(_mlp(), (torch.randn(6, 5),), 3)
    assert out.grad_fn is None and not out.requires_grad


# ---------------------------------------------------------------------------------------- gather
def test_gather_concatenates_in_order_and_warns_on_scalars(nb: Any) -> None:
    assert nb.gather([torch.zeros(2, 1), torch.ones(1, 1)]).flatten().tolist() == [0.0, 0.0, 1.0]
    assert nb.gather([torch.zeros(1, 2), torch.ones(1, 1)], dim=1).tolist() == [[0.0, 0.0, 1.0]]
    with pytest.warns(UserWarning, match="all input tensors were scalars; will instead unsqueeze"):
        v = nb.gather([torch.tensor(1.0), torch.tensor(2.0)])
    assert v.tolist() == [1.0, 2.0]


# ---------------------------------------------------------------------------------------- data_parallel
@pytest.mark.parametrize(("batch", "n"), [(16, 2), (9, 4), (10, 8), (7, 3), (17, 4), (3, 4), (1, 4), (5, 1)])
def test_outputs_and_gradients_match_plain_module(nb: Any, batch: int, n: int) -> None:
    """Uneven batches, batches smaller than n_devices (fewer replicas), and one device."""
    _compare(nb, _mlp(), n, torch.randn(batch, 5))


def test_dim_1(nb: Any) -> None:
    """A sequence-first batch (time, batch, features), cut along dim 1."""
    _compare(nb, _mlp(1), 3, torch.randn(4, 8, 5), dim=1)


def test_batchnorm_buffers_like_data_parallel(nb: Any) -> None:
    """Train mode: each chunk is normalised with its own statistics and the running stats come from
    the first chunk only (replica 0 owns the real buffers). Eval mode: same as the plain module."""
    torch.manual_seed(7)
    x = torch.randn(10, 4) * 3 + 1
    bn = nn.BatchNorm1d(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = nb.data_parallel(bn, (x,), 2)
    first = nn.BatchNorm1d(4)
    want_first = first(x[:5])
    torch.testing.assert_close(bn.running_mean, first.running_mean)
    torch.testing.assert_close(bn.running_var, first.running_var)
    assert bn.num_batches_tracked.item() == 1
    torch.testing.assert_close(out[:5], want_first)
    torch.testing.assert_close(out[5:], nn.BatchNorm1d(4)(x[5:]))
    assert not torch.allclose(out, nn.BatchNorm1d(4)(x))  # not the whole-batch statistics

    bn.eval()
    _compare(nb, bn, 3, x)


def test_attribute_updates_in_forward_are_lost(nb: Any) -> None:
    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0
            self.linear = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return self.linear(x)

    net = Counter()
    nb.data_parallel(net, (torch.zeros(4, 2),), 2)
    assert net.calls == 0


def test_scalar_output_becomes_one_value_per_replica(nb: Any) -> None:
    class LossInside(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x).pow(2).mean()

    torch.manual_seed(6)
    net, x = LossInside(), torch.randn(9, 3)
    with pytest.warns(UserWarning, match="scalars; will instead unsqueeze"):
        losses = nb.data_parallel(net, (x,), 4)
    assert losses.shape == (3,)  # 9 samples on 4 devices: 3 replicas
    torch.testing.assert_close(losses, torch.stack([net(c) for c in x.chunk(4)]).detach())


# ---------------------------------------------------------------------------------------- pictures
def test_pictures() -> None:
    import matplotlib.pyplot as plt

    fig = plot_batch_split(9, 4)
    assert "chunks [3, 3, 3], 3 replica(s) run" in fig.axes[0].get_title()
    plt.close(fig)
    fig = plot_batch_split(10, 8)
    assert "5 replica(s)" in fig.axes[0].get_title()
    plt.close(fig)
    plt.close(plot_mechanism(3))


# ---------------------------------------------------------------------------------------- real DataParallel
@pytest.mark.skipif(cuda_device_count() < 2, reason="needs 2 CUDA GPUs to run the real nn.DataParallel")
def test_matches_real_data_parallel_on_two_gpus(nb: Any) -> None:
    torch.manual_seed(8)
    net = nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.ReLU(), nn.Linear(7, 3))
    cpu_net = copy.deepcopy(net)
    x = torch.randn(9, 5)
    dp = nn.DataParallel(net.to("cuda:0"), device_ids=[0, 1])
    out = dp(x.to("cuda:0"))
    _loss(out).backward()
    cpu_out = nb.data_parallel(cpu_net, (x,), 2)
    _loss(cpu_out).backward()
    torch.testing.assert_close(out.cpu(), cpu_out, atol=1e-4, rtol=1e-4)
    for p, q in zip(net.parameters(), cpu_net.parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=1e-4, rtol=1e-4)
    for b, c in zip(net.buffers(), cpu_net.buffers(), strict=True):
        torch.testing.assert_close(b.cpu(), c, atol=1e-5, rtol=1e-5)
