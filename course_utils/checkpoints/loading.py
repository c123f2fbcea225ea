"""Notebooks 06 (loading across devices) and 08 (a sharded checkpoint turned into one file): load
checkpoints saved anywhere (one GPU, several, a compiled model) on any device.

``torch.load`` does the work; this module adds what a student would otherwise meet as a bare traceback
from deep inside torch:

- `load_checkpoint(path)` loads safely (``weights_only=True``) onto the CPU by default, and turns every
  bad input (missing file, folder, empty, truncated or damaged file, not a PyTorch file, a pickle that
  refers to code the safe loader refuses, a whole model whose class is not importable) into a
  `CheckpointError` that names the file and says what to do. When ``torch.load`` fails, the file's
  structure (its zip archive, the instructions of its pickles) is read to say why; nothing is unpickled
  (`course_utils.checkpoints.diagnosis`).
- `strip_prefixes(state_dict)` removes the ``module.`` (DataParallel, DistributedDataParallel) and
  ``_orig_mod.`` (``torch.compile``) prefixes at the start of keys, never inside a key.
- `find_state_dict(obj)` finds the model weights in what a file held: a state_dict, a whole model, or a
  training-checkpoint dict of any trainer, by the names trainers use (``state_dict``, ``model``,
  ``module``...) and by shape (a dict of names to tensors, up to two levels down; never an optimizer's state).
- `read_state_dict(path)` reads the weights of a file or folder into one state_dict: a ``torch.save`` file,
  a safetensors file, the index of weights sharded over several files (``model.safetensors.index.json``,
  ``pytorch_model.bin.index.json``) with its shards, or a model folder in Hugging Face's layout.
- `load_weights(model, source)` finds the weights in a file (any that `read_state_dict` reads) or a loaded
  object, strips wrapper prefixes, maps the tensors to the model's device, and lists missing, unexpected and
  wrong-shape keys readably when the checkpoint does not fit.
- `load_optimizer_state(optimizer, source)` does the same for an optimizer, so training resumes on
  another device.
- `move_optimizer_state(optimizer)` puts every state tensor where its parameter is (the loop notebook 06
  writes by hand), e.g. after the model moved once its optimizer state was loaded.
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard, Union

import torch
from torch import nn

from ..devices import DeviceError, available_devices, find_device
from ..formatting import short_list
from .diagnosis import WeightFiles, problem_after_failed_load, problem_before_loading, weight_files

__all__ = [
    "CheckpointError",
    "find_optimizer_state",
    "find_state_dict",
    "load_checkpoint",
    "load_optimizer_state",
    "load_weights",
    "move_optimizer_state",
    "read_state_dict",
    "strip_prefixes",
]

PathLike = Union[str, "os.PathLike[str]"]  # noqa: UP007 (a string forward reference)
MapLocation = str | torch.device | dict[str, str] | Callable[..., Any] | None

WRAPPER_PREFIXES = ("module.", "_orig_mod.")
"""Added by nn.DataParallel / DistributedDataParallel (``module.``) and torch.compile (``_orig_mod.``)."""

STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "network", "model_state",
                   "params", "weights")
"""Where training checkpoints keep the model's weights, in the order they are preferred: ``state_dict``
(Lightning, timm, mmengine), ``model_state_dict`` (PyTorch's tutorials), ``model`` (torchvision's references,
fairseq, torchtune), ``module`` (DeepSpeed), ``net``, ``network``, ``model_state``, ``params`` (BasicSR),
``weights``. Other entries that hold weights (an EMA copy, a teacher model) are found by their shape."""

OPTIMIZER_KEYS = ("optimizer", "optimizer_state_dict", "optimizer_state", "optim", "opt")
"""Where training checkpoints usually keep the optimizer's state."""


class CheckpointError(RuntimeError):
    """A checkpoint could not be loaded, or does not fit: the message names the file and what to do."""


# --------------------------------------------------------------------------------------------- loading

def _check_map_location(map_location: MapLocation, name: str) -> MapLocation:
    """``map_location`` as ``torch.load`` gets it. A device named there must exist here (said now, not deep
    inside the unpickler) and is passed on as `course_utils.devices.find_device` resolves it (``'cuda'``
    becomes ``cuda:<current>``); dicts, functions and None pass unchanged."""
    if not isinstance(map_location, str | torch.device):
        return map_location
    try:
        dev = find_device(map_location)
    except DeviceError:
        raise CheckpointError(f"{name}: map_location={map_location!r} is not a device. Use 'cpu', 'cuda', "
                              f"'cuda:0', 'mps', a torch.device, a dict or a function.") from None
    if dev is None:
        raise CheckpointError(f"{name}: map_location={map_location!r} names a device this machine does not "
                              f"have (it has {', '.join(available_devices())}). Use map_location='cpu', or "
                              "course_utils.get_device() for the best device present.")
    return dev


def load_checkpoint(path: PathLike, map_location: MapLocation = "cpu", *, trusted: bool = False) -> Any:
    """Load a file written by ``torch.save`` and return what it holds.

    Safe by default (``weights_only=True``: tensors, numbers, strings and containers only, no code
    runs). ``map_location`` (default ``"cpu"``) says where the tensors go, whatever device they were
    saved on: a device name, a `torch.device`, a dict such as ``{"cuda:1": "cuda:0"}``, a function
    ``(storage, location) -> storage``, or None to keep the devices they were saved on.

    ``trusted=True`` uses ``weights_only=False``, which can load whole pickled models (their class must
    be importable here) and **runs whatever code the file contains**: only for files you trust.

    Raises `CheckpointError` naming the file and what to do for: a missing file, a folder, an empty,
    truncated or damaged file, a file that is not a PyTorch checkpoint, a pickle that refers to code the
    safe loader refuses (nothing of it runs), tensors saved on a device this machine lacks, a whole model
    whose class is not importable.
    """
    name = os.fspath(path)  # as the caller wrote it: messages show 'data/x.pt', not a machine path
    p = Path(path)
    problem = problem_before_loading(p, name, trusted=trusted)
    if problem is not None:
        raise CheckpointError(problem)
    where = _check_map_location(map_location, name)
    try:
        return torch.load(p, map_location=where, weights_only=not trusted)
    except Exception as exc:  # whatever torch raised, the file itself is diagnosed
        raise CheckpointError(problem_after_failed_load(p, name, exc, trusted)) from None


# ------------------------------------------------------------------------------------------ state dicts

def strip_prefixes(state_dict: Mapping[str, Any],
                   prefixes: Iterable[str] = WRAPPER_PREFIXES) -> OrderedDict[str, Any]:
    """A new state_dict whose keys lose these prefixes at their start, repeatedly; the input is unchanged.

    ``module._orig_mod.fc.weight`` (a compiled model inside DataParallel) becomes ``fc.weight``;
    ``features.module.weight`` stays as it is (a prefix is removed only at the start of a key, unlike
    ``k.replace("module.", "")``). The state_dict's ``_metadata`` (module versions) follows the keys.
    """
    prefixes = tuple(prefixes)
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"strip_prefixes: expected a state_dict (a mapping of names to tensors), got "
                        f"{type(state_dict).__name__}")

    def strip(key: str) -> str:
        changed = True
        while changed:
            changed = False
            for prefix in prefixes:
                if prefix and key.startswith(prefix):
                    key, changed = key[len(prefix):], True
        return key

    out: OrderedDict[str, Any] = OrderedDict()
    for key, value in state_dict.items():
        new = strip(key) if isinstance(key, str) else key
        if new in out:
            raise ValueError(f"strip_prefixes: two keys become {new!r} once prefixes are removed")
        out[new] = value
    metadata = getattr(state_dict, "_metadata", None)
    if isinstance(metadata, Mapping):
        new_meta: OrderedDict[str, Any] = OrderedDict()
        for key, value in metadata.items():
            new_meta[strip(key + ".")[:-1]] = value  # "module.linears" -> "linears", "module" -> ""
        out._metadata = new_meta  # type: ignore[attr-defined]
    return out


def _is_state_dict(obj: Any) -> TypeGuard[Mapping[str, Any]]:
    if not isinstance(obj, Mapping) or not obj:
        return False
    tensors = [v for v in obj.values() if isinstance(v, torch.Tensor)]
    others = [k for k, v in obj.items() if not isinstance(v, torch.Tensor) and not str(k).endswith("_extra_state")]
    return bool(tensors) and not others and all(isinstance(k, str) for k in obj)


def _entry(path: tuple[Any, ...]) -> str:
    return "checkpoint" + "".join(f"[{k!r}]" for k in path)


def _candidates(obj: Mapping[Any, Any], path: tuple[Any, ...] = (), depth: int = 2
                ) -> list[tuple[tuple[Any, ...], Any]]:
    """The entries of ``obj`` (and of the dicts in it, ``depth`` levels down) that hold model weights: a
    state_dict or a whole model. An optimizer's state and the entries named like one are left out."""
    found: list[tuple[tuple[Any, ...], Any]] = []
    for key, value in obj.items():
        if key in OPTIMIZER_KEYS or _is_optimizer_state(value):
            continue
        if isinstance(value, nn.Module) or _is_state_dict(value):
            found.append(((*path, key), value))
        elif isinstance(value, Mapping) and depth > 1:
            found += _candidates(value, (*path, key), depth - 1)
    return found


def _find_weights(obj: Any, name: str, path: str | None = None, *,
                  stacklevel: int = 3) -> tuple[Mapping[str, Any], str]:
    """The weights in ``obj`` (see `find_state_dict`) and the entry they were taken from ('' for ``obj``);
    ``path``: the file ``obj`` was loaded from, if it was; ``stacklevel``: the frame a warning names, counted
    from this function's (3: the caller of the public function that called this one)."""
    if isinstance(obj, nn.Module):
        return obj.state_dict(), ""
    if _is_state_dict(obj):
        return obj, ""
    if isinstance(obj, Mapping):
        if _is_optimizer_state(obj):
            raise CheckpointError(f"{name} is an optimizer's state (the keys 'state' and 'param_groups'), not model "
                                  "weights: load_optimizer_state(optimizer, ...) loads it into an optimizer.")
        found = _candidates(obj)
        known = sorted((c for c in found if c[0][-1] in STATE_DICT_KEYS),
                       key=lambda c: (STATE_DICT_KEYS.index(c[0][-1]), len(c[0])))
        if known and (len(known) == 1 or known[0][0][-1] != known[1][0][-1] or len(known[0][0]) < len(known[1][0])):
            chosen = known[0]
        elif len(found) == 1:
            chosen = found[0]
        elif found:
            listed = ", ".join(f"{_entry(p)} ({len(_weights_of(v))} tensors)" for p, v in found[:6])
            example = _entry(found[0][0])
            if path is not None:
                example = f"load_checkpoint({path!r})" + example.removeprefix("checkpoint")
            raise CheckpointError(f"{name} holds several sets of model weights: {listed}. Choose one and pass it, "
                                  f"e.g. load_weights(model, {example}).")
        else:
            keys = ", ".join(repr(k) for k in list(obj)[:12])
            raise CheckpointError(f"{name}: no model weights found. It is a dict with the keys {keys}; none is a "
                                  "state_dict (a dict of names to tensors) or a model, nor holds one (looked for "
                                  "them up to two levels down). Pass the entry that holds the weights, e.g. "
                                  "load_weights(model, checkpoint['...']).")
        others = [p for p, _ in found if p != chosen[0]]
        if others:
            warnings.warn(f"{name}: took the model weights from {_entry(chosen[0])}; it also holds weights under "
                          f"{', '.join(_entry(p) for p in others[:4])}: pass that entry instead to load those.",
                          stacklevel=stacklevel)
        return _weights_of(chosen[1]), _entry(chosen[0])
    raise CheckpointError(f"{name}: no model weights found in a {type(obj).__name__}; expected a state_dict "
                          "(a dict of names to tensors), a training-checkpoint dict or a model.")


def _weights_of(found: Any) -> Mapping[str, Any]:
    return found.state_dict() if isinstance(found, nn.Module) else found


def find_state_dict(obj: Any, name: str = "the checkpoint") -> Mapping[str, Any]:
    """The model weights in ``obj``: a state_dict itself, a whole model, or a training-checkpoint dict.

    In a dict, the weights are looked for under the names of `STATE_DICT_KEYS` (``state_dict``, ``model``,
    DeepSpeed's ``module``...) and by shape: an entry that is a dict of names to tensors, or a model, up to two
    levels down. An optimizer's state is never taken. When a dict holds several sets of weights, the one under
    the preferred name is taken with a warning that names the others; with no preferred name among them,
    `CheckpointError` lists them so that you choose.
    """
    return _find_weights(obj, name)[0]


def _read_weight_files(found: WeightFiles, name: str, device: str, trusted: bool) -> dict[str, Any]:
    """One state_dict from the files that hold the weights (safetensors files, or torch.save shards)."""
    from safetensors import SafetensorError, safe_open

    if found.missing:
        raise CheckpointError(f"{name}: its index {found.index_file} names {len(found.missing)} file(s) that are not in "
                              f"its folder: {short_list(found.missing, 4)}. Download or copy them there, then read "
                              "it again.")
    weights: dict[str, Any] = {}
    for file in found.files:
        if file.suffix == ".safetensors":
            try:
                with safe_open(file, framework="pt", device=device) as f:
                    part = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is no Mapping)
                    aliases = f.metadata() or {}
            except SafetensorError as exc:
                raise CheckpointError(f"{file} is not a valid safetensors file (safetensors says: {exc}): a damaged "
                                      "or partly downloaded file. Download or save it again.") from None
            # safetensors.torch.save_model keeps one of the names of a shared tensor and records the others
            # in the metadata: {removed name: kept name}
            part.update({k: part[v] for k, v in aliases.items() if v in part and k not in part})
        else:
            part = dict(find_state_dict(load_checkpoint(file, map_location=device, trusted=trusted), os.fspath(file)))
        weights.update(part)
    lost = [k for k in found.weight_map if k not in weights]
    if lost:
        raise CheckpointError(f"{name}: its index names {len(lost)} tensor(s) that its files do not hold: "
                              f"{short_list(lost, 4)}. The files come from different saves: download them again.")
    return weights


def _device_for(map_location: MapLocation, name: str) -> str:
    """Where tensors without a saved device (safetensors) go: the device map_location names (checked), else
    the CPU."""
    where = _check_map_location(map_location, name)
    return str(where) if isinstance(where, torch.device) else "cpu"


def read_state_dict(path: PathLike, map_location: MapLocation = "cpu", *, trusted: bool = False) -> dict[str, Any]:
    """The model weights at ``path``, as one state_dict.

    ``path`` is a ``torch.save`` file (read with `load_checkpoint`; the weights found with `find_state_dict`),
    a safetensors file, the index of weights sharded over several files (``model.safetensors.index.json`` or
    ``pytorch_model.bin.index.json``: every shard it names is read), or a folder that holds one of those (a
    model folder in Hugging Face's layout: ``config.json`` with ``model.safetensors``, the shards and their
    index, or ``pytorch_model.bin``). ``map_location`` and ``trusted`` are those of `load_checkpoint`;
    safetensors files record no device, so their tensors go to the device ``map_location`` names, else to the
    CPU. Raises `CheckpointError` for what cannot be read, e.g. shards that the index names and the folder
    lacks.
    """
    name = os.fspath(path)
    found = weight_files(Path(path))
    if found is None:
        return dict(find_state_dict(load_checkpoint(path, map_location, trusted=trusted), name))
    return _read_weight_files(found, name, _device_for(map_location, name), trusted)


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside DataParallel / DistributedDataParallel / torch.compile wrappers."""
    while True:
        wrapped = isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel)
        inner = getattr(model, "module" if wrapped else "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def _model_device(model: nn.Module) -> torch.device:
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    return torch.device("cpu") if first is None else first.device



def _prefix_hint(missing: list[str], unexpected: list[str]) -> str:
    """'the checkpoint's keys carry the prefix X.' when removing one first segment makes them fit."""
    if not missing or not unexpected:
        return ""
    firsts = {k.split(".", 1)[0] for k in unexpected if "." in k}
    if len(firsts) == 1 and all("." in k for k in unexpected):
        prefix = firsts.pop() + "."
        if {k[len(prefix):] for k in unexpected} & set(missing):
            return (f"\n  The checkpoint's keys carry the prefix {prefix!r}: "
                    f"strip_prefixes(state_dict, ({prefix!r},)) removes it.")
    return ""


def _tied_copies(own: Mapping[str, Any], weights: Mapping[str, Any]) -> dict[str, str]:
    """The model's keys that the checkpoint lacks because they name a tensor it holds under another name (a
    tied weight, such as an output layer sharing the embedding matrix, which Hugging Face and safetensors
    save once), each with that other name."""
    names: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for key, tensor in own.items():
        if key in weights and isinstance(tensor, torch.Tensor) and tensor.numel() and tensor.device.type != "meta":
            names.setdefault((tensor.data_ptr(), tensor.dtype.itemsize, tuple(tensor.shape)), key)
    return {key: names[found] for key, tensor in own.items()
            if key not in weights and isinstance(tensor, torch.Tensor) and tensor.numel()
            and tensor.device.type != "meta"
            and (found := (tensor.data_ptr(), tensor.dtype.itemsize, tuple(tensor.shape))) in names}


@dataclass(frozen=True)
class _KeyFit:
    """How the keys of a checkpoint's weights meet those of a model (part 2 of `load_weights`)."""

    missing: list[str]
    """The model's keys that the weights lack, in the model's order."""
    unexpected: list[str]
    """The weights' keys that the model lacks, in the weights' order."""
    wrong_shapes: list[tuple[str, tuple[int, ...], tuple[int, ...]]]
    """(key, shape in the checkpoint, shape in the model) where the two differ, in the model's order."""


def _source_weights(target: nn.Module, source: Any, map_location: MapLocation,
                    trusted: bool) -> tuple[Mapping[str, Any], str, str]:
    """Part 1 of `load_weights`, finding the weights: those in ``source`` (a path or a loaded object) for
    ``target``, the name that messages give ``source``, and the entry of the checkpoint that held them ('' for
    the whole of it)."""
    if not isinstance(source, str | os.PathLike):
        name = "the checkpoint"
        weights, entry = _find_weights(source, name, stacklevel=4)  # the warning names load_weights' caller
        return weights, name, entry
    name = os.fspath(source)
    where = _model_device(target) if map_location is None else map_location
    found = weight_files(Path(source))
    if found is not None:
        return _read_weight_files(found, name, _device_for(where, name), trusted), name, ""
    weights, entry = _find_weights(load_checkpoint(source, map_location=where, trusted=trusted), name, name,
                                   stacklevel=4)
    return weights, name, entry


def _fit_keys(own: Mapping[str, Any], weights: Mapping[str, Any]) -> tuple[Mapping[str, Any], _KeyFit]:
    """Part 2 of `load_weights`, which keys fit: the weights as ``own`` (a model's state_dict) takes them
    (wrapper prefixes removed unless the keys already match, tied weights filled in under their other
    names), and how their keys meet the model's."""
    if set(weights) != set(own):
        weights = strip_prefixes(weights)
    tied = _tied_copies(own, weights)
    if tied:
        filled = OrderedDict(weights)
        filled.update((k, weights[kept]) for k, kept in tied.items())
        if isinstance(metadata := getattr(weights, "_metadata", None), Mapping):
            filled._metadata = metadata  # type: ignore[attr-defined]
        weights = filled
    wrong = [(k, tuple(weights[k].shape), tuple(own[k].shape))
             for k in own if k in weights and isinstance(weights[k], torch.Tensor)
             and isinstance(own[k], torch.Tensor) and weights[k].shape != own[k].shape]
    return weights, _KeyFit(missing=[k for k in own if k not in weights],
                            unexpected=[k for k in weights if k not in own], wrong_shapes=wrong)


def _misfit_message(fit: _KeyFit, name: str, entry: str, model: str, strict: bool) -> str | None:
    """Part 3 of `load_weights`, the message: what does not fit, from ``name`` (its ``entry``) into the model
    class ``model``, and what to do; None when everything fits (with ``strict=False``: no shape differs)."""
    missing, unexpected = fit.missing, fit.unexpected
    wrong = [f"{k}: checkpoint {saved}, model {shape}" for k, saved, shape in fit.wrong_shapes]
    if not (wrong or (strict and (missing or unexpected))):
        return None
    lines = [f"{name}{f' ({entry})' if entry else ''} does not fit {model}:"]
    if strict and missing:
        lines.append(f"  missing in the checkpoint ({len(missing)}): {short_list(missing)}")
    if strict and unexpected:
        lines.append(f"  unexpected in the checkpoint ({len(unexpected)}): {short_list(unexpected)}")
    if wrong:
        lines.append(f"  wrong shape ({len(wrong)}):")
        lines += [f"    {w}" for w in wrong[:8]] + ([f"    ... ({len(wrong) - 8} more)"] if len(wrong) > 8 else [])
    hint = _prefix_hint(missing, unexpected) if strict else ""
    lines.append(hint.lstrip("\n") if hint else
                 "  Build the model with the same architecture and sizes as the one that was saved"
                 + ("; strict=False loads the matching keys and skips the rest." if strict and not wrong
                    else "."))
    return "\n".join(lines)


def load_weights(model: nn.Module, source: Any, map_location: MapLocation = None, *, strict: bool = True,
                 trusted: bool = False) -> nn.Module:
    """Load weights into ``model`` and return it.

    ``source`` is a path (any that `read_state_dict` reads: a ``torch.save`` file, a safetensors file, an
    index of sharded weights, a Hugging Face model folder) or an object already loaded: a state_dict, a
    training-checkpoint dict (the weights found as `find_state_dict` finds them) or a whole model.
    Wrapper prefixes (``module.``, ``_orig_mod.``) are removed; a tied weight (one tensor under two names in
    the model) saved under one name only is loaded under both; a wrapped ``model``
    is loaded through the module it wraps. With ``map_location=None`` the tensors go straight to the
    model's own device. When the weights do not fit, raises `CheckpointError` listing the missing,
    unexpected and wrong-shape keys (with ``strict=False`` only wrong shapes are errors).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"load_weights: the first argument must be the model (an nn.Module), got "
                        f"{type(model).__name__}. Build the model first, e.g. load_weights(FooNet(), path).")
    target = _unwrap(model)
    weights, name, entry = _source_weights(target, source, map_location, trusted)
    weights, fit = _fit_keys(target.state_dict(), weights)
    problem = _misfit_message(fit, name, entry, type(target).__name__, strict)
    if problem is not None:
        raise CheckpointError(problem)
    target.load_state_dict(weights, strict=strict)
    return model


# ------------------------------------------------------------------------------------------- optimizers

def _is_optimizer_state(obj: Any) -> TypeGuard[Mapping[str, Any]]:
    return isinstance(obj, Mapping) and "state" in obj and "param_groups" in obj


def find_optimizer_state(obj: Any, name: str = "the checkpoint") -> Mapping[str, Any]:
    """The optimizer state in ``obj``: an optimizer state_dict itself, or a training-checkpoint dict with
    it under ``optimizer``, ``optimizer_state_dict``, ``optimizer_state``, ``optim`` or ``opt``."""
    if _is_optimizer_state(obj):
        return obj
    if isinstance(obj, Mapping):
        for key in OPTIMIZER_KEYS:
            if key in obj and _is_optimizer_state(found := obj[key]):
                return found
        keys = ", ".join(repr(k) for k in list(obj)[:12])
        raise CheckpointError(f"{name}: no optimizer state found. It is a dict with the keys {keys}; an "
                              "optimizer's state_dict has the keys 'state' and 'param_groups' (looked under "
                              f"{', '.join(OPTIMIZER_KEYS)}).")
    raise CheckpointError(f"{name}: no optimizer state found in a {type(obj).__name__}.")


def load_optimizer_state(optimizer: torch.optim.Optimizer, source: Any, map_location: MapLocation = None, *,
                         trusted: bool = False) -> torch.optim.Optimizer:
    """Load an optimizer's state (from a path or a loaded object) onto the devices of its parameters.

    Move the model to its device and build the optimizer over its parameters *first*, then call this:
    each state tensor (Adam's moments, SGD's momentum) lands on the device of the parameter it belongs
    to, whatever device it was saved on, so the next ``optimizer.step()`` runs there. Returns the
    optimizer. Raises `CheckpointError` when the state does not fit the optimizer's parameter groups.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"load_optimizer_state: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if isinstance(source, str | os.PathLike):
        name = os.fspath(source)
        where = (params[0].device if params else "cpu") if map_location is None else map_location
        source = load_checkpoint(source, map_location=where, trusted=trusted)
    else:
        name = "the checkpoint"
    state = find_optimizer_state(source, name)
    try:
        optimizer.load_state_dict(dict(state))
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{name}: the optimizer state does not fit this {type(optimizer).__name__} "
                              f"({exc}). Build the optimizer of the same kind over the same parameters, in "
                              "the same order, as when it was saved.") from None
    return move_optimizer_state(optimizer)


def move_optimizer_state(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Put every state tensor of ``optimizer`` on the device (and in the dtype) of its parameter.

    The rule is the one ``Optimizer.load_state_dict`` follows: Adam's moments, SGD's momentum and the
    like go where their parameter is; a ``step`` counter stays where it is (plain Adam reads it on the
    CPU at every step), except for ``fused=True`` or ``capturable=True`` parameter groups, which compute
    with it on the device and get it there as float32. Use it when the model moved *after* its optimizer
    state was loaded. Returns the optimizer.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"move_optimizer_state: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    for group in optimizer.param_groups:
        step_on_device = bool(group.get("fused") or group.get("capturable"))
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state:
                continue
            for key, value in state.items():
                if not isinstance(value, torch.Tensor):
                    continue
                if key != "step":
                    dtype = p.dtype if value.is_floating_point() or value.is_complex() else value.dtype
                    state[key] = value.to(p.device, dtype)
                elif step_on_device:
                    state[key] = value.to(p.device, torch.float32)
    return optimizer
