"""Notebooks 06 (loading across devices) and 08 (a sharded checkpoint turned into one file): load
checkpoints saved anywhere (one GPU, several, a compiled model) on any device.

``torch.load`` does the work; this module adds what a student would otherwise meet as a bare traceback
from deep inside torch:

- `load_checkpoint(path)` loads safely (``weights_only=True``) onto the CPU by default, and turns every
  bad input (missing file, folder, empty, truncated or damaged file, not a PyTorch file, a pickle that
  refers to code the safe loader refuses, a whole model whose class is not importable) into a
  `CheckpointError` that names the file and says what to do. When ``torch.load`` fails, the file's
  structure (its zip archive, the instructions of its pickles) is read to say why; nothing is unpickled
  (`course_utils.checkpoint_files`).
- `strip_prefixes(state_dict)` removes the ``module.`` (DataParallel, DistributedDataParallel) and
  ``_orig_mod.`` (``torch.compile``) prefixes at the start of keys, never inside a key.
- `load_weights(model, source)` finds the weights in a file or a loaded object (also inside the usual
  training-checkpoint dicts), strips wrapper prefixes, maps the tensors to the model's device, and lists
  missing, unexpected and wrong-shape keys readably when the checkpoint does not fit.
- `load_optimizer_state(optimizer, source)` does the same for an optimizer, so training resumes on
  another device.
- `move_optimizer_state(optimizer)` puts every state tensor where its parameter is (the loop notebook 06
  writes by hand), e.g. after the model moved once its optimizer state was loaded.
"""

from __future__ import annotations

import itertools
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeGuard, Union

import torch
from torch import nn

from .checkpoint_files import problem_after_failed_load, problem_before_loading

__all__ = [
    "CheckpointError",
    "find_optimizer_state",
    "find_state_dict",
    "load_checkpoint",
    "load_optimizer_state",
    "load_weights",
    "move_optimizer_state",
    "strip_prefixes",
]

PathLike = Union[str, "os.PathLike[str]"]  # noqa: UP007 (a string forward reference)
MapLocation = str | torch.device | dict[str, str] | Callable[..., Any] | None

WRAPPER_PREFIXES = ("module.", "_orig_mod.")
"""Added by nn.DataParallel / DistributedDataParallel (``module.``) and torch.compile (``_orig_mod.``)."""

STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "net")
"""Where training checkpoints usually keep the model's weights."""

OPTIMIZER_KEYS = ("optimizer", "optimizer_state_dict", "optimizer_state", "optim", "opt")
"""Where training checkpoints usually keep the optimizer's state."""


class CheckpointError(RuntimeError):
    """A checkpoint could not be loaded, or does not fit: the message names the file and what to do."""


# --------------------------------------------------------------------------------------------- loading

def _check_map_location(map_location: MapLocation, name: str) -> None:
    """A device named in map_location must exist here: say so now, not deep inside the unpickler."""
    if not isinstance(map_location, str | torch.device):
        return
    from .devices import available_devices

    try:
        dev = torch.device(map_location)
    except (RuntimeError, ValueError):
        raise CheckpointError(f"{name}: map_location={map_location!r} is not a device. Use 'cpu', 'cuda', "
                              f"'cuda:0', 'mps', a torch.device, a dict or a function.") from None
    have = available_devices()
    if dev.type == "cpu":
        return
    if dev.type == "cuda":
        count = len([d for d in have if d.startswith("cuda:")])
        if count and (dev.index is None or dev.index < count):
            return
    elif dev.type == "mps":
        if "mps:0" in have:
            return
    elif any(d.startswith(dev.type + ":") for d in have):
        return
    raise CheckpointError(f"{name}: map_location={map_location!r} names a device this machine does not "
                          f"have (it has {', '.join(have)}). Use map_location='cpu', or "
                          "course_utils.get_device() for the best device present.")


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
    problem = problem_before_loading(p, name)
    if problem is not None:
        raise CheckpointError(problem)
    _check_map_location(map_location, name)
    try:
        return torch.load(p, map_location=map_location, weights_only=not trusted)
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


def find_state_dict(obj: Any, name: str = "the checkpoint") -> Mapping[str, Any]:
    """The model weights in ``obj``: a state_dict itself, a whole model, or a training-checkpoint dict
    with the weights under ``state_dict``, ``model_state_dict``, ``model`` or ``net``."""
    if isinstance(obj, nn.Module):
        return obj.state_dict()
    if _is_state_dict(obj):
        return obj
    if isinstance(obj, Mapping):
        for key in STATE_DICT_KEYS:
            if key in obj and (isinstance(obj[key], nn.Module) or _is_state_dict(obj[key])):
                return find_state_dict(obj[key], name)
        keys = ", ".join(repr(k) for k in list(obj)[:12])
        raise CheckpointError(f"{name}: no model weights found. It is a dict with the keys {keys}; none is a "
                              f"state_dict (looked for {', '.join(STATE_DICT_KEYS)}). Pass the entry that "
                              "holds the weights, e.g. load_weights(model, checkpoint['...']).")
    raise CheckpointError(f"{name}: no model weights found in a {type(obj).__name__}; expected a state_dict "
                          "(a dict of names to tensors), a training-checkpoint dict or a model.")


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


def _listing(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


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


def load_weights(model: nn.Module, source: Any, map_location: MapLocation = None, *, strict: bool = True,
                 trusted: bool = False) -> nn.Module:
    """Load weights into ``model`` and return it.

    ``source`` is a path (read with `load_checkpoint`) or an object already loaded: a state_dict, a
    training-checkpoint dict (weights under ``state_dict``, ``model_state_dict``, ``model`` or ``net``)
    or a whole model. Wrapper prefixes (``module.``, ``_orig_mod.``) are removed; a wrapped ``model``
    is loaded through the module it wraps. With ``map_location=None`` the tensors go straight to the
    model's own device. When the weights do not fit, raises `CheckpointError` listing the missing,
    unexpected and wrong-shape keys (with ``strict=False`` only wrong shapes are errors).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"load_weights: the first argument must be the model (an nn.Module), got "
                        f"{type(model).__name__}. Build the model first, e.g. load_weights(FooNet(), path).")
    target = _unwrap(model)
    if isinstance(source, str | os.PathLike):
        name = os.fspath(source)
        where = _model_device(target) if map_location is None else map_location
        source = load_checkpoint(source, map_location=where, trusted=trusted)
    else:
        name = "the checkpoint"
    weights = find_state_dict(source, name)
    own = target.state_dict()
    if set(weights) != set(own):
        weights = strip_prefixes(weights)
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    wrong = [f"{k}: checkpoint {tuple(weights[k].shape)}, model {tuple(own[k].shape)}"
             for k in own if k in weights and isinstance(weights[k], torch.Tensor)
             and isinstance(own[k], torch.Tensor) and weights[k].shape != own[k].shape]
    if wrong or (strict and (missing or unexpected)):
        lines = [f"{name} does not fit {type(target).__name__}:"]
        if strict and missing:
            lines.append(f"  missing in the checkpoint ({len(missing)}): {_listing(missing)}")
        if strict and unexpected:
            lines.append(f"  unexpected in the checkpoint ({len(unexpected)}): {_listing(unexpected)}")
        if wrong:
            lines.append(f"  wrong shape ({len(wrong)}):")
            lines += [f"    {w}" for w in wrong[:8]] + ([f"    ... ({len(wrong) - 8} more)"] if len(wrong) > 8 else [])
        hint = _prefix_hint(missing, unexpected) if strict else ""
        lines.append(hint.lstrip("\n") if hint else
                     "  Build the model with the same architecture and sizes as the one that was saved"
                     + ("; strict=False loads the matching keys and skips the rest." if strict and not wrong
                        else "."))
        raise CheckpointError("\n".join(lines))
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
