"""course_utils.parallel: the CPU model of DataParallel must give what the plain module gives."""

from __future__ import annotations

import copy
import threading
import warnings
from typing import NamedTuple

import matplotlib
import pytest
import torch
from torch import nn

from course_utils.devices import cuda_device_count
from course_utils.parallel import (
    SCALAR_GATHER_WARNING,
    ReplicaError,
    SimulatedDataParallel,
    chunk_sizes,
    gather,
    parallel_apply,
    plot_batch_split,
    plot_mechanism,
    replicate,
    scatter,
    scatter_kwargs,
)

matplotlib.use("Agg")


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))


def _grads(module: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters()]


def _loss(out: object) -> torch.Tensor:
    """A scalar that depends on every tensor in a (nested) output, each element weighted differently."""
    if isinstance(out, torch.Tensor):
        w = torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)
        return (out * w).sum()
    if isinstance(out, dict):
        return sum(_loss(v) for v in out.values())
    return sum(_loss(v) for v in out)


def _compare(module: nn.Module, n: int, *args: torch.Tensor, dim: int = 0, **kwargs: object) -> None:
    """Forward and backward through the module and through SimulatedDataParallel: same outputs, grads."""
    ref_module = copy.deepcopy(module)
    ref_args = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    ref_out = ref_module(*ref_args, **kwargs)
    _loss(ref_out).backward()

    sim_args = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    sim_out = SimulatedDataParallel(module, n_devices=n, dim=dim)(*sim_args, **kwargs)
    _loss(sim_out).backward()

    _assert_same(sim_out, ref_out)
    for g_sim, g_ref in zip(_grads(module), _grads(ref_module), strict=True):
        torch.testing.assert_close(g_sim, g_ref)
    for a_sim, a_ref in zip(sim_args, ref_args, strict=True):
        if a_ref.grad is not None:
            torch.testing.assert_close(a_sim.grad, a_ref.grad)


def _assert_same(got: object, want: object) -> None:
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            _assert_same(got[k], want[k])
    else:
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _assert_same(g, w)


# ---------------------------------------------------------------------------------------- chunk sizes
@pytest.mark.parametrize(("batch", "n", "want"), [
    (16, 2, [8, 8]), (16, 4, [4, 4, 4, 4]), (9, 4, [3, 3, 3]), (10, 8, [2, 2, 2, 2, 2]),
    (3, 4, [1, 1, 1]), (17, 3, [6, 6, 5]), (1, 8, [1]), (5, 1, [5]), (0, 4, [0, 0, 0, 0]),
])
def test_chunk_sizes_match_torch_chunk(batch: int, n: int, want: list[int]) -> None:
    assert chunk_sizes(batch, n) == want
    assert [c.shape[0] for c in torch.zeros(batch, 2).chunk(n)] == want
    assert [c.shape[0] for c in scatter(torch.zeros(batch, 2), n)] == want


def test_chunk_sizes_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="n_devices must be at least 1"):
        chunk_sizes(4, 0)
    with pytest.raises(TypeError):
        chunk_sizes(4.0, 2)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- scatter
def test_scatter_structures_and_non_tensors() -> None:
    x, y = torch.arange(10).reshape(5, 2), torch.arange(5)
    parts = scatter((x, {"y": y, "flag": True}, "text"), 2)
    assert len(parts) == 2
    assert torch.equal(parts[0][0], x[:3]) and torch.equal(parts[1][0], x[3:])
    assert torch.equal(parts[1][1]["y"], y[3:]) and parts[1][1]["flag"] is True and parts[1][2] == "text"
    assert scatter(7, 3) == [7, 7, 7]


def test_scatter_fewest_chunks_win_and_bad_dim() -> None:
    # 3 samples of one tensor and 8 of another on 4 devices: only 3 replicas get both
    assert len(scatter((torch.zeros(3, 1), torch.zeros(8, 1)), 4)) == 3
    with pytest.raises(ValueError, match="out of range"):
        scatter(torch.zeros(4), 2, dim=1)
    with pytest.raises(ValueError, match="0-dim"):
        scatter(torch.tensor(1.0), 2)


def test_scatter_kwargs_same_length() -> None:
    args, kws = scatter_kwargs((torch.zeros(3, 1),), {"scale": 2.0}, 4)
    assert len(args) == len(kws) == 3 and all(k == {"scale": 2.0} for k in kws)
    args, kws = scatter_kwargs((), {"x": torch.zeros(5, 1)}, 2)
    assert args == [(), ()] and [k["x"].shape[0] for k in kws] == [3, 2]
    assert scatter_kwargs((), {}, 4) == ([()], [{}])


# ---------------------------------------------------------------------------------------- replicate
def test_replicas_share_parameters_and_sum_gradients() -> None:
    net = _mlp()
    replicas = replicate(net, 3)
    assert len(replicas) == 3 and all(type(r) is nn.Sequential for r in replicas)
    assert replicas[0][0].weight is net[0].weight  # replica 0 uses the originals
    assert replicas[1][0].weight is not net[0].weight
    assert torch.equal(replicas[2][2].bias, net[2].bias)
    x = torch.randn(6, 5)
    sum(r(x).sum() for r in replicas).backward()
    single = _mlp()
    (3 * single(x).sum()).backward()
    torch.testing.assert_close(net[0].weight.grad, single[0].weight.grad)


def test_replicate_under_no_grad_detaches() -> None:
    with torch.no_grad():
        replicas = replicate(_mlp(), 2)
    assert not replicas[1][0].weight.requires_grad


# ---------------------------------------------------------------------------------------- parallel_apply
def test_parallel_apply_uses_one_thread_per_replica_and_keeps_order() -> None:
    seen: list[str] = []
    lock = threading.Lock()

    class Who(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with lock:
                seen.append(threading.current_thread().name)
            return x * 2

    replicas = replicate(Who(), 3)
    outs = parallel_apply(replicas, [torch.full((1,), float(i)) for i in range(3)])
    assert [o.item() for o in outs] == [0.0, 2.0, 4.0]
    assert sorted(seen) == ["replica-0", "replica-1", "replica-2"]


def test_parallel_apply_reports_the_failing_replica() -> None:
    net = nn.Linear(4, 2)
    with pytest.raises(ReplicaError, match=r"in replica 1: RuntimeError: .*mat1 and mat2"):
        parallel_apply(replicate(net, 2), [torch.zeros(2, 4), torch.zeros(2, 3)])
    with pytest.raises(ValueError, match="2 replicas but 1 inputs"):
        parallel_apply(replicate(net, 2), [torch.zeros(2, 4)])


def test_grad_mode_reaches_the_threads() -> None:
    net = _mlp()
    with torch.no_grad():
        out = SimulatedDataParallel(net, 3)(torch.randn(6, 5))
    assert out.grad_fn is None and not out.requires_grad


# ---------------------------------------------------------------------------------------- gather
def test_gather_scalar_warns_like_data_parallel() -> None:
    with pytest.warns(UserWarning, match="all input tensors were scalars"):
        v = gather([torch.tensor(1.0), torch.tensor(2.0)])
    assert v.tolist() == [1.0, 2.0]
    assert "unsqueeze and return a vector" in SCALAR_GATHER_WARNING
    with pytest.raises(TypeError, match="cannot gather outputs of type int"):
        gather([1, 2])
    with pytest.raises(ValueError, match="different keys"):
        gather([{"a": torch.zeros(1)}, {"b": torch.zeros(1)}])
    assert gather([None, None]) is None


# ---------------------------------------------------------------------------------------- SimulatedDataParallel
@pytest.mark.parametrize(("batch", "n"), [(16, 2), (9, 4), (10, 8), (7, 3), (17, 4), (3, 4), (1, 4), (5, 1)])
def test_outputs_and_gradients_match_plain_module(batch: int, n: int) -> None:
    """Uneven batches, batches smaller than n_devices (fewer replicas), and one device."""
    _compare(_mlp(), n, torch.randn(batch, 5))


def test_dim_1_with_tuple_output() -> None:
    """A sequence-first GRU: the batch is dim 1, and it returns (output, h_n), both batched on dim 1."""
    torch.manual_seed(1)
    gru = nn.GRU(input_size=4, hidden_size=3)
    _compare(gru, 3, torch.randn(6, 8, 4), dim=1)


class _Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        y = self.linear(x) * scale
        return y if mask is None else y * mask[:, None]


def test_keyword_arguments_tensor_and_plain() -> None:
    torch.manual_seed(2)
    x, mask = torch.randn(7, 4), (torch.arange(7) % 3 != 0).float()
    _compare(_Masked(), 3, x, mask=mask, scale=0.5)


def test_only_keyword_arguments() -> None:
    torch.manual_seed(3)
    net, x = _Masked(), torch.randn(5, 4)
    ref = copy.deepcopy(net)(x=x, scale=2.0)
    torch.testing.assert_close(SimulatedDataParallel(net, 2)(x=x, scale=2.0), ref)


class _Pair(NamedTuple):
    logits: torch.Tensor
    features: torch.Tensor


class _MultiOut(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.body = nn.Linear(4, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> object:
        f = torch.relu(self.body(x))
        logits = self.head(f)
        if self.kind == "tuple":
            return logits, f
        if self.kind == "list":
            return [logits, (f, None)]
        if self.kind == "namedtuple":
            return _Pair(logits, f)
        return {"logits": logits, "features": {"hidden": f}}


@pytest.mark.parametrize("kind", ["tuple", "list", "namedtuple", "dict"])
def test_structured_outputs(kind: str) -> None:
    torch.manual_seed(4)
    module = _MultiOut(kind)
    if kind == "list":  # None inside the output: gathered as None
        out = SimulatedDataParallel(module, 3)(torch.randn(7, 4))
        assert out[1][1] is None and out[0].shape == (7, 2)
        return
    _compare(module, 3, torch.randn(7, 4))


def test_dict_input() -> None:
    class DictIn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 1)

        def forward(self, batch: dict) -> torch.Tensor:
            return self.linear(batch["x"]) + batch["bias"]

    torch.manual_seed(5)
    net, x = DictIn(), torch.randn(9, 3)
    ref = copy.deepcopy(net)({"x": x, "bias": 1.0})
    torch.testing.assert_close(SimulatedDataParallel(net, 4)({"x": x, "bias": 1.0}), ref)


def test_scalar_output_becomes_one_value_per_replica() -> None:
    class LossInside(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x).pow(2).mean()

    torch.manual_seed(6)
    net, x = LossInside(), torch.randn(9, 3)
    with pytest.warns(UserWarning, match="scalars; will instead unsqueeze"):
        losses = SimulatedDataParallel(net, 4)(x)
    assert losses.shape == (3,)  # 9 samples on 4 devices: 3 replicas
    torch.testing.assert_close(losses, torch.stack([net(c) for c in x.chunk(4)]).detach())


def test_batchnorm_buffers_like_data_parallel() -> None:
    """Train mode: each chunk is normalised with its own statistics and the running stats come from
    the first chunk only (replica 0 owns the real buffers). Eval mode: same as the plain module."""
    torch.manual_seed(7)
    x = torch.randn(10, 4) * 3 + 1
    bn = nn.BatchNorm1d(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = SimulatedDataParallel(bn, 2)(x)
    first = nn.BatchNorm1d(4)
    want_first = first(x[:5])
    torch.testing.assert_close(bn.running_mean, first.running_mean)
    torch.testing.assert_close(bn.running_var, first.running_var)
    assert bn.num_batches_tracked.item() == 1
    torch.testing.assert_close(out[:5], want_first)
    torch.testing.assert_close(out[5:], nn.BatchNorm1d(4)(x[5:]))
    assert not torch.allclose(out, nn.BatchNorm1d(4)(x))  # not the whole-batch statistics

    bn.eval()
    _compare(bn, 3, x)


def test_attribute_updates_in_forward_are_lost() -> None:
    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0
            self.linear = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return self.linear(x)

    net = Counter()
    SimulatedDataParallel(net, 2)(torch.zeros(4, 2))
    assert net.calls == 0
    SimulatedDataParallel(net, 1)(torch.zeros(4, 2))  # one device: the module itself runs
    assert net.calls == 1


def test_wrapper_looks_like_data_parallel() -> None:
    net = _Masked()
    sim = SimulatedDataParallel(net, 2)
    assert sim.module is net
    assert all(k.startswith("module.") for k in sim.state_dict())
    with pytest.raises(AttributeError, match="'SimulatedDataParallel' object has no attribute 'linear'"):
        sim.linear  # noqa: B018
    with pytest.raises(ValueError, match="n_devices must be a positive int"):
        SimulatedDataParallel(net, 0)


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
def test_matches_real_data_parallel_on_two_gpus() -> None:
    torch.manual_seed(8)
    net = nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.ReLU(), nn.Linear(7, 3))
    sim_net = copy.deepcopy(net)
    x = torch.randn(9, 5)
    dp = nn.DataParallel(net.to("cuda:0"), device_ids=[0, 1])
    out = dp(x.to("cuda:0"))
    _loss(out).backward()
    sim_out = SimulatedDataParallel(sim_net, 2)(x)
    _loss(sim_out).backward()
    torch.testing.assert_close(out.cpu(), sim_out, atol=1e-4, rtol=1e-4)
    for p, q in zip(net.parameters(), sim_net.parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=1e-4, rtol=1e-4)
    for b, c in zip(net.buffers(), sim_net.buffers(), strict=True):
        torch.testing.assert_close(b.cpu(), c, atol=1e-5, rtol=1e-5)
