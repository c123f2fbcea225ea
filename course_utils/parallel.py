"""Notebook 04 (DataParallel): a CPU-runnable model of `torch.nn.DataParallel`, its four steps in plain
PyTorch.

`nn.DataParallel` needs CUDA GPUs; without them it just calls the module. This module does the same four
steps on whatever device the tensors are on (the CPU in class), with one *thread* per simulated GPU, so a
student can watch each step and check it against the plain module:

1. `scatter` splits every tensor argument into chunks along ``dim``, as ``torch.chunk`` does (and as
   DataParallel's scatter does): chunk size ``ceil(batch / n)``, so 9 samples on 4 GPUs give chunks of
   3, 3, 3 and only three replicas run; a batch of 10 on 8 GPUs gives five chunks of 2. Everything that
   is not a tensor is handed to every replica as it is.
2. `replicate` makes one replica of the module per chunk. A replica is a shallow copy of the module tree
   (the same code, hooks and attributes) that holds *differentiable copies* of the parameters, so the
   gradient of every replica flows back into the original parameters' ``.grad``, summed, exactly as
   DataParallel's ``Broadcast`` / ``ReduceAddCoalesced`` do it across GPUs.
3. `parallel_apply` runs replica *i* on chunk *i*, each in its own thread (grad mode is per thread, so it
   is handed to each), and re-raises a replica's exception in the caller, naming the replica.
4. `gather` concatenates the replicas' outputs along ``dim``, recursing into tuples, lists, dicts and
   named tuples; 0-dim outputs (a scalar loss) become a vector with one entry per replica, with the same
   warning DataParallel gives.

`SimulatedDataParallel` is an `nn.Module` that does the four steps in its ``forward``.

Buffers, as in DataParallel (``torch/nn/parallel/replicate.py`` and ``comm.broadcast_coalesced``, whose
copy for ``device_ids[0]`` *is* the source tensor): replica 0 uses the original buffers themselves; the
other replicas get copies that are thrown away after the forward. So an in-place buffer update made in
``forward`` is kept only from replica 0: a BatchNorm layer in training mode updates ``running_mean``,
``running_var`` and ``num_batches_tracked`` from the statistics of the *first chunk only*, once per
forward, and it normalises each chunk with that chunk's own batch statistics (so in training mode the
output differs from the unsplit module's; in eval mode it is the same). Anything else ``forward`` changes
on a replica (``self.calls += 1``) is lost, as DataParallel's documentation warns.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

import torch
from torch import nn

__all__ = [
    "ReplicaError",
    "SimulatedDataParallel",
    "chunk_sizes",
    "gather",
    "parallel_apply",
    "plot_batch_split",
    "plot_mechanism",
    "replicate",
    "scatter",
    "scatter_kwargs",
]

SCALAR_GATHER_WARNING = ("Was asked to gather along dimension 0, but all input tensors were scalars; "
                         "will instead unsqueeze and return a vector.")


def chunk_sizes(batch_size: int, n_devices: int) -> list[int]:
    """Sizes of the chunks DataParallel makes of a batch of ``batch_size`` on ``n_devices`` GPUs.

    Same rule as ``torch.chunk``: every chunk has ``ceil(batch / n)`` samples except perhaps the last, so
    there may be fewer chunks (and replicas) than devices: ``chunk_sizes(9, 4) == [3, 3, 3]``,
    ``chunk_sizes(10, 8) == [2, 2, 2, 2, 2]``.
    """
    if not isinstance(batch_size, int) or not isinstance(n_devices, int):
        raise TypeError(f"chunk_sizes(batch_size, n_devices) takes two ints, got {batch_size!r}, {n_devices!r}")
    if n_devices < 1:
        raise ValueError(f"chunk_sizes(): n_devices must be at least 1, got {n_devices}")
    if batch_size < 0:
        raise ValueError(f"chunk_sizes(): batch_size must be >= 0, got {batch_size}")
    if batch_size == 0:
        return [0] * n_devices  # torch.chunk of an empty dimension: n empty chunks
    size = math.ceil(batch_size / n_devices)
    return [min(size, batch_size - start) for start in range(0, batch_size, size)]


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields") and hasattr(obj, "_asdict")


def scatter(inputs: Any, n_chunks: int, dim: int = 0) -> list[Any]:
    """Split ``inputs`` into at most ``n_chunks`` pieces along ``dim``, one per replica.

    Tensors are split with ``torch.chunk`` (views: gradients flow back to the input). Tuples, lists, named
    tuples and dicts are split element by element and rebuilt per chunk; anything else is passed to every
    chunk unchanged. The result is a list with one entry per chunk; its length is the smallest number of
    chunks any tensor gave (fewer than ``n_chunks`` when the batch is small), as in DataParallel.

    >>> [t.shape[0] for t in scatter(torch.zeros(9, 2), 4)]
    [3, 3, 3]
    """
    if not isinstance(n_chunks, int) or n_chunks < 1:
        raise ValueError(f"scatter(): n_chunks must be a positive int, got {n_chunks!r}")

    def split(obj: Any) -> list[Any]:
        if isinstance(obj, torch.Tensor):
            if obj.dim() == 0:
                raise ValueError("scatter(): cannot split a 0-dim tensor (a scalar); pass it inside a "
                                 "1-element tensor, or as a Python number, which every replica receives")
            if not -obj.dim() <= dim < obj.dim():
                raise ValueError(f"scatter(): dim={dim} is out of range for a tensor of shape "
                                 f"{tuple(obj.shape)}")
            return list(obj.chunk(n_chunks, dim))
        if _is_namedtuple(obj):
            return [type(obj)(*parts) for parts in zip(*map(split, obj), strict=False)]
        if isinstance(obj, tuple) and obj:
            return [tuple(parts) for parts in zip(*map(split, obj), strict=False)]
        if isinstance(obj, list) and obj:
            return [list(parts) for parts in zip(*map(split, obj), strict=False)]
        if isinstance(obj, dict) and obj:
            keys = list(obj)
            return [type(obj)(zip(keys, parts, strict=True))
                    for parts in zip(*(split(obj[k]) for k in keys), strict=False)]
        return [obj for _ in range(n_chunks)]

    return split(inputs)


def scatter_kwargs(inputs: tuple[Any, ...], kwargs: dict[str, Any] | None, n_chunks: int,
                   dim: int = 0) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
    """Scatter positional and keyword arguments together: ``(args per chunk, kwargs per chunk)``.

    Both lists have the same length, the number of replicas to run (the fewest chunks any tensor
    gave). With no arguments at all, one replica runs with none.
    """
    args = scatter(tuple(inputs), n_chunks, dim) if inputs else []
    kws = scatter(dict(kwargs), n_chunks, dim) if kwargs else []
    if not args and not kws:
        return [()], [{}]
    n = min(len(args), len(kws)) if args and kws else max(len(args), len(kws))
    args = args[:n] if args else [() for _ in range(n)]
    kws = kws[:n] if kws else [{} for _ in range(n)]
    return args, kws


def _shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object of the same class sharing code, hooks and attributes, with its own tensor slots."""
    replica = module.__new__(type(module))
    replica.__dict__ = module.__dict__.copy()
    replica._parameters = {}  # the replica holds copies as plain attributes, not as Parameters
    replica._buffers = replica._buffers.copy()
    replica._modules = replica._modules.copy()
    return replica


def replicate(module: nn.Module, n: int) -> list[nn.Module]:
    """``n`` replicas of ``module`` whose tensors come from the original module.

    Replica 0 uses the original parameters and buffers themselves (as DataParallel's replica on
    ``device_ids[0]`` does). Replicas 1..n-1 use ``clone()`` copies: a clone of a parameter is
    differentiable, so the gradient each replica computes flows back into the original parameter's
    ``.grad``, where autograd sums the contributions. Buffer copies are detached: updates to them are lost.
    Under ``torch.no_grad()`` the parameter copies are detached too.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"replicate() needs an nn.Module, got {type(module).__name__}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"replicate(): n must be a positive int, got {n!r}")
    grad = torch.is_grad_enabled()
    modules = list(module.modules())
    replicas: list[list[nn.Module]] = []
    for j in range(n):
        copies = {id(m): _shallow_copy(m) for m in modules}
        for m in modules:
            r = copies[id(m)]
            for key, child in m._modules.items():
                r._modules[key] = None if child is None else copies[id(child)]
            for key, p in m._parameters.items():
                value: torch.Tensor | None
                if p is None:
                    value = None
                elif j == 0:
                    value = p
                else:
                    value = p.clone() if grad else p.detach().clone()
                object.__setattr__(r, key, value)
            for key, b in m._buffers.items():
                r._buffers[key] = b if (b is None or j == 0) else b.detach().clone()
        replicas.append([copies[id(m)] for m in modules])
    return [r[0] for r in replicas]


class ReplicaError(RuntimeError):
    """An exception raised inside one replica, re-raised in the caller."""


def parallel_apply(replicas: Sequence[nn.Module], inputs: Sequence[Any],
                   kwargs: Sequence[dict[str, Any]] | None = None) -> list[Any]:
    """Run ``replicas[i](*inputs[i], **kwargs[i])`` for every i, each in its own thread; outputs in order.

    An input that is not a tuple or list is passed as the single argument. An exception in a replica is
    re-raised here, with the replica's number in the message (the original is its ``__cause__``).
    Grad mode is handed to the threads; autocast is not (DataParallel also enters each GPU's device,
    stream and autocast state, which a single device does not need).
    """
    if len(replicas) != len(inputs):
        raise ValueError(f"parallel_apply(): {len(replicas)} replicas but {len(inputs)} inputs; "
                         "give one input per replica")
    if kwargs is None:
        kwargs = [{} for _ in replicas]
    if len(kwargs) != len(replicas):
        raise ValueError(f"parallel_apply(): {len(replicas)} replicas but {len(kwargs)} kwargs dicts")
    grad_enabled = torch.is_grad_enabled()
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}
    lock = threading.Lock()

    def worker(i: int, replica: nn.Module, args: Any, kw: dict[str, Any]) -> None:
        torch.set_grad_enabled(grad_enabled)  # grad mode is thread-local
        try:
            if not isinstance(args, (list, tuple)):
                args = (args,)
            out = replica(*args, **kw)
            with lock:
                results[i] = out
        except Exception as exc:
            with lock:
                errors[i] = exc

    work = list(zip(replicas, inputs, kwargs, strict=True))
    if len(work) == 1:
        worker(0, *work[0])
    else:
        threads = [threading.Thread(target=worker, args=(i, *w), name=f"replica-{i}")
                   for i, w in enumerate(work)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        i = min(errors)
        exc = errors[i]
        raise ReplicaError(f"in replica {i}: {type(exc).__name__}: {exc}") from exc
    return [results[i] for i in range(len(work))]


def gather(outputs: Sequence[Any], dim: int = 0) -> Any:
    """Join the replicas' outputs: tensors concatenated along ``dim``, containers rebuilt element-wise.

    0-dim tensors (a loss computed inside ``forward``) cannot be concatenated: with ``dim=0`` they are
    stacked into a vector of one value per replica, with DataParallel's warning.
    """
    if not outputs:
        raise ValueError("gather(): no outputs to gather")
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        if all(t.dim() == 0 for t in outputs) and dim == 0:
            warnings.warn(SCALAR_GATHER_WARNING, UserWarning, stacklevel=2)
            return torch.stack(list(outputs))
        return torch.cat(list(outputs), dim=dim)
    if first is None:
        return None
    if isinstance(first, dict):
        if any(set(o) != set(first) for o in outputs):
            raise ValueError("gather(): the replicas returned dicts with different keys")
        return type(first)((k, gather([o[k] for o in outputs], dim)) for k in first)
    if _is_namedtuple(first):
        return type(first)._make(gather(list(parts), dim) for parts in zip(*outputs, strict=True))
    if isinstance(first, (tuple, list)):
        return type(first)(gather(list(parts), dim) for parts in zip(*outputs, strict=True))
    raise TypeError(f"gather(): cannot gather outputs of type {type(first).__name__}; a replica must "
                    "return tensors, or tuples, lists or dicts of tensors")


class SimulatedDataParallel(nn.Module):
    """DataParallel's four steps on one device, with a thread per simulated GPU.

    ``SimulatedDataParallel(module, n_devices=2, dim=0)(*args, **kwargs)`` scatters the arguments along
    ``dim`` into at most ``n_devices`` chunks, replicates ``module`` once per chunk, runs the replicas in
    threads and gathers their outputs along ``dim``. The wrapped module is ``self.module`` (so, as with
    DataParallel, its attributes are reached through ``.module`` and its ``state_dict`` keys start with
    ``module.``). Outputs and parameter gradients equal ``module(*args, **kwargs)``'s, up to float
    rounding, for any module that treats samples independently; see the module docstring for buffers.
    """

    def __init__(self, module: nn.Module, n_devices: int = 2, dim: int = 0) -> None:
        super().__init__()
        if not isinstance(n_devices, int) or n_devices < 1:
            raise ValueError(f"SimulatedDataParallel: n_devices must be a positive int, got {n_devices!r}")
        self.module = module
        self.n_devices = n_devices
        self.dim = dim

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if self.n_devices == 1:  # like DataParallel with one device: no scatter, no threads
            return self.module(*inputs, **kwargs)
        args, kws = scatter_kwargs(inputs, kwargs, self.n_devices, self.dim)
        replicas = replicate(self.module, len(args))
        outputs = parallel_apply(replicas, args, kws)
        return gather(outputs, self.dim)

    def extra_repr(self) -> str:
        return f"n_devices={self.n_devices}, dim={self.dim}"


# ---------------------------------------------------------------------------------------- pictures
_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def plot_batch_split(batch_size: int = 16, n_gpus: int = 4) -> Figure:
    """A matplotlib Figure: which samples of a batch each GPU gets (``chunk_sizes``), idle GPUs greyed."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    sizes = chunk_sizes(batch_size, n_gpus)
    used = len(sizes) if batch_size else 0
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.42 * n_gpus))
    width = max(batch_size, 1)
    start = 0
    for g in range(n_gpus):
        y = n_gpus - 1 - g
        if g < used:
            colour = _COLOURS[g % len(_COLOURS)]
            for s in range(start, start + sizes[g]):
                ax.add_patch(Rectangle((s, y + 0.1), 0.92, 0.8, color=colour))
            ax.text(width + 0.3, y + 0.5, f"{sizes[g]} samples", va="center", fontsize=9)
            start += sizes[g]
        else:
            ax.add_patch(Rectangle((0, y + 0.1), width, 0.8, facecolor="#eeeeee", edgecolor="#bbbbbb",
                                   hatch="//"))
            ax.text(width / 2, y + 0.5, "idle: no chunk, no replica", ha="center", va="center",
                    fontsize=9, color="#777777")
    ax.set_xlim(0, width + 3.5)
    step = max(1, math.ceil(width / 8))
    ax.set_xticks(range(0, width + 1, step))
    ax.set_ylim(0, n_gpus)
    ax.set_yticks([n_gpus - 1 - g + 0.5 for g in range(n_gpus)], [f"GPU {g}" for g in range(n_gpus)])
    ax.set_xlabel("sample index in the batch")
    ax.set_title(f"batch of {batch_size} on {n_gpus} GPUs: chunks {sizes}, {used} replica(s) run")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def plot_mechanism(n_gpus: int = 3) -> Figure:
    """A matplotlib Figure of DataParallel's forward (scatter, replicate, parallel apply, gather) and
    backward (gradients summed back onto GPU 0's parameters)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig, ax = plt.subplots(figsize=(10, 1.2 + 1.1 * n_gpus))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.9, n_gpus + 0.4)
    ax.axis("off")

    def box(x: float, y: float, text: str, colour: str, w: float = 1.6) -> None:
        ax.add_patch(FancyBboxPatch((x - w / 2, y - 0.3), w, 0.6, boxstyle="round,pad=0.05",
                                    facecolor=colour, edgecolor="#333333"))
        ax.text(x, y, text, ha="center", va="center", fontsize=8.5)

    def arrow(x0: float, y0: float, x1: float, y1: float, colour: str = "#333333", style: str = "-") -> None:
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops={"arrowstyle": "->", "color": colour, "linestyle": style, "lw": 1.3})

    mid = (n_gpus - 1) / 2
    ys = [n_gpus - 1 - g for g in range(n_gpus)]
    box(0.9, mid, "batch\n(on GPU 0\nor CPU)", "#dddddd", w=1.4)
    box(0.9, -0.55, "parameters\non GPU 0", "#f9e79f", w=1.4)
    for g, y in enumerate(ys):
        colour = _COLOURS[g % len(_COLOURS)]
        box(3.2, y, f"chunk {g}\n→ GPU {g}", colour + "55")
        box(5.5, y, f"replica {g}\nforward", colour + "99")
        box(7.5, y, f"output {g}", colour + "55", w=1.2)
        arrow(1.6, mid, 2.4, y)
        arrow(4.0, y, 4.7, y)
        arrow(6.3, y, 6.9, y)
        arrow(8.1, y, 8.75, mid)
        arrow(1.6, -0.55, 4.7, y - 0.25, colour="#b7950b", style=":")  # broadcast parameters
    box(9.3, mid, "gather\non output\ndevice", "#dddddd", w=1.1)
    for x, label in [(3.2, "1. scatter"), (5.5, "2. replicate +\n3. parallel apply"), (7.5, "4. gather")]:
        ax.text(x, n_gpus - 0.05, label, ha="center", va="bottom", fontsize=10, weight="bold")
    ax.text(1.8, -0.72, "backward: the replicas' parameter gradients flow back along the dotted lines\n"
            "and are summed into the .grad of GPU 0's parameters", ha="left", va="center", fontsize=9,
            color="#7d6608")
    fig.tight_layout()
    return fig
