"""Notebook 07: a CPU stand-in for CUDA graphs, so that a student without a GPU can check a graph capture.

A CUDA graph records the kernels a piece of code launches, each with the memory addresses it reads and
writes, and a replay runs the same kernels on the same memory. `cpu_cuda_graphs()` gives the CPU that
behaviour at the level of PyTorch's operators: while it is active, ``torch.cuda.CUDAGraph``,
``torch.cuda.graph``, ``torch.cuda.Stream``, ``torch.cuda.stream``, ``torch.cuda.current_stream`` and
``torch.cuda.synchronize`` are replaced, and

- inside ``with torch.cuda.graph(g):`` every operator runs as usual and is recorded with the very tensors
  it read and wrote (a `TorchDispatchMode`);
- ``g.replay()`` runs the recorded operators again on those tensors: an operator that writes in place
  writes again, one that makes a new tensor writes its new result into the tensor made at capture.

So a replay has the properties the course teaches: it reads the captured inputs (a rebound Python name is
not seen), it keeps what was allocated during capture, and it repeats whatever the capture did, lazy
initialisation included. Reading a value on the host during capture (``.item()``) raises, as CUDA does.
Python code does not run again at replay, which is also true of a real graph. Optimizers made with
``capturable=True`` accept CPU tensors while it is active (PyTorch allows that option only on devices that can
capture graphs). What it does not model: streams, timing, random numbers (a replay draws new ones, as a real
graph's does, but not the same), and the line between host and device memory: every tensor here is memory a
replay reads, where on a GPU only GPU memory is.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.optim  # noqa: F401  (its modules are patched below)

# PyTorch documents __torch_dispatch__ modes with this class ("Extending PyTorch"); it lives in a module whose
# name starts with an underscore, which `import torch` has already loaded.
TorchDispatchMode: Any = torch.utils._python_dispatch.TorchDispatchMode

__all__ = ["CpuGraph", "cpu_cuda_graphs"]

_HOST_READS = {"_local_scalar_dense", "item"}
CAPTURE_ERROR = ("operation not permitted when stream is capturing (the CPU stand-in of CUDA's error: "
                 "{op} reads a value on the host during capture)")


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in an operator's result or argument: a tensor, or a list or tuple of them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _writes(func: Any) -> bool:
    """Whether ``func`` writes into one of its arguments (in-place or ``out=``)."""
    return any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)


def _aliases(func: Any) -> bool:
    """Whether ``func``'s outputs are views of (or the same as) its inputs."""
    return any(r.alias_info is not None for r in func._schema.returns)


class CpuGraph:
    """The stand-in of ``torch.cuda.CUDAGraph``: the operators recorded during capture, replayed in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.ops: list[tuple[Any, tuple[Any, ...], dict[str, Any], list[torch.Tensor]]] = []
        self.captured = False

    def replay(self) -> None:
        if not self.captured:
            raise RuntimeError("replay() of a graph that was never captured: use `with torch.cuda.graph(g):` first")
        with torch.no_grad():
            for func, args, kwargs, outputs in self.ops:
                result = func(*args, **kwargs)
                if _writes(func) or _aliases(func):
                    continue  # wrote into the captured tensors, or is a view of them
                new = _tensors(result)
                for old, value in zip(outputs, new, strict=True):
                    old.copy_(value)

    def pool(self) -> None:
        return None

    def reset(self) -> None:
        self.ops.clear()
        self.captured = False


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Record(TorchDispatchMode):
    """Records each operator with its tensors. A capture does not run the work on a GPU, so what the
    operators write into tensors that existed before the capture (weights, optimizer state) is undone when
    the capture ends; tensors made during the capture keep their values (on a GPU: whatever was there)."""

    def __init__(self, graph: CpuGraph) -> None:
        super().__init__()
        self.graph = graph
        self.made: set[int] = set()  # storages allocated during the capture
        self.before: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # older tensors written: their values

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func._schema.name.split("::")[-1] in _HOST_READS:
            raise RuntimeError(CAPTURE_ERROR.format(op=func._schema.name))
        if _writes(func):
            schema = func._schema.arguments
            values = [*zip(schema, args, strict=False)]
            values += [(a, kwargs[a.name]) for a in schema if a.name in kwargs]
            for arg, value in values:
                if arg.alias_info is None or not arg.alias_info.is_write:
                    continue
                for t in _tensors(value):
                    if _storage(t) not in self.made and id(t) not in self.before:
                        self.before[id(t)] = (t, t.detach().clone())
        result = func(*args, **kwargs)
        outputs = _tensors(result)
        if not (_writes(func) or _aliases(func)):
            self.made.update(_storage(t) for t in outputs)
        self.graph.ops.append((func, args, kwargs, outputs))
        return result

    def undo(self) -> None:
        with torch.no_grad():
            for t, value in reversed(self.before.values()):
                t.copy_(value)


@contextmanager
def _capture(graph: CpuGraph, *args: Any, **kwargs: Any) -> Iterator[None]:
    if not isinstance(graph, CpuGraph):
        raise TypeError(f"torch.cuda.graph() needs a torch.cuda.CUDAGraph(), got {type(graph).__name__}")
    graph.reset()
    recorder = _Record(graph)
    with recorder:
        yield
    recorder.undo()
    graph.captured = True


class _Stream:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


@contextmanager
def cpu_cuda_graphs() -> Iterator[None]:
    """Within the block, ``torch.cuda``'s graph and stream API is the CPU stand-in (see the module's text)."""
    stand_ins: dict[str, Callable[..., Any] | type] = {
        "CUDAGraph": CpuGraph, "graph": _capture, "Stream": _Stream,
        "stream": lambda *a, **k: nullcontext(), "current_stream": lambda *a, **k: _Stream(),
        "synchronize": lambda *a, **k: None,
    }
    saved = {name: getattr(torch.cuda, name) for name in stand_ins}
    # each optimizer module imported PyTorch's list of devices that allow capturable=True: add the CPU to it
    optimizers = {m: m._get_capturable_supported_devices for name, m in list(sys.modules.items())
                  if name.startswith("torch.optim.") and hasattr(m, "_get_capturable_supported_devices")}
    try:
        for name, value in stand_ins.items():
            setattr(torch.cuda, name, value)
        for module, devices in optimizers.items():
            module._get_capturable_supported_devices = _with_cpu(devices)  # type: ignore[attr-defined]
        yield
    finally:
        for name, value in saved.items():
            setattr(torch.cuda, name, value)
        for module, devices in optimizers.items():
            module._get_capturable_supported_devices = devices  # type: ignore[attr-defined]


def _with_cpu(devices: Callable[..., list[str]]) -> Callable[..., list[str]]:
    def with_cpu(*args: Any, **kwargs: Any) -> list[str]:
        return [*devices(*args, **kwargs), "cpu"]
    return with_cpu
