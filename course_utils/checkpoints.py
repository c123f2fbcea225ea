"""Checkpoints across devices: load files saved anywhere (one GPU, several, a compiled model) on any device.

``torch.load`` does the work; this module adds what a student would otherwise meet as a bare traceback
from deep inside torch:

- `load_checkpoint(path)` loads safely (``weights_only=True``) onto the CPU by default, and turns every
  bad input (missing file, folder, empty, truncated or corrupt file, not a PyTorch file, a pickle that
  needs code the safe loader refuses, a whole model whose class is not importable) into a
  `CheckpointError` that names the file and says what to do.
- `strip_prefixes(state_dict)` removes the ``module.`` (DataParallel, DistributedDataParallel) and
  ``_orig_mod.`` (``torch.compile``) prefixes at the start of keys, never inside a key.
- `load_weights(model, source)` finds the weights in a file or a loaded object (also inside the usual
  training-checkpoint dicts), strips wrapper prefixes, maps the tensors to the model's device, and lists
  missing, unexpected and wrong-shape keys readably when the checkpoint does not fit.
- `load_optimizer_state(optimizer, source)` does the same for an optimizer, so training resumes on
  another device.
"""

from __future__ import annotations

import difflib
import os
import pickle
import re
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Union

import torch
from torch import nn

__all__ = [
    "CheckpointError",
    "find_optimizer_state",
    "find_state_dict",
    "load_checkpoint",
    "load_optimizer_state",
    "load_weights",
    "strip_prefixes",
]

PathLike = Union[str, "os.PathLike[str]"]  # noqa: UP007 (a string forward reference)
MapLocation = str | torch.device | Mapping[str, Any] | Callable[..., Any] | None

WRAPPER_PREFIXES = ("module.", "_orig_mod.")
"""Added by nn.DataParallel / DistributedDataParallel (``module.``) and torch.compile (``_orig_mod.``)."""

STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "net")
"""Where training checkpoints usually keep the model's weights."""

OPTIMIZER_KEYS = ("optimizer", "optimizer_state_dict", "optimizer_state", "optim", "opt")
"""Where training checkpoints usually keep the optimizer's state."""

_LEGACY_MAGIC = bytes.fromhex("6cfc9c46f9206aa85019")  # torch.save's magic number before PyTorch 1.6
_SAFE_LOADER = "the safe loader (torch.load with weights_only=True)"


class CheckpointError(RuntimeError):
    """A checkpoint could not be loaded, or does not fit: the message names the file and what to do."""


# --------------------------------------------------------------------------------------------- loading

def _shown(path: PathLike) -> str:
    """The path as the caller wrote it (so messages show 'data/x.pt', not a machine path)."""
    return os.fspath(path)


def _missing_file(path: Path, name: str) -> CheckpointError:
    folder = path.parent
    if not folder.is_dir():
        where = _shown(folder) if str(folder) not in ("", ".") else "the current folder"
        return CheckpointError(f"{name}: no such file; the folder {where!r} does not exist either. Check the "
                               "path: a relative path starts from the current working directory (in Jupyter, "
                               "the notebook's folder).")
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    close = difflib.get_close_matches(path.name, names, n=3, cutoff=0.6)
    hint = (" Did you mean " + " or ".join(repr(_shown(folder / c)) for c in close) + "?") if close else ""
    return CheckpointError(f"{name}: no such file.{hint} A relative path starts from the current working "
                           "directory (in Jupyter, the notebook's folder).")


def _directory(path: Path, name: str) -> CheckpointError:
    found = sorted(p.name for p in path.iterdir()
                   if p.suffix in (".pt", ".pth", ".bin", ".pkl", ".ckpt", ".tar", ".safetensors"))
    inside = (" It contains " + ", ".join(found[:5]) + (" ..." if len(found) > 5 else "")
              + ": pass one of those files.") if found else ""
    return CheckpointError(f"{name} is a folder, not a checkpoint file.{inside} (A folder written by "
                           "torch.distributed.checkpoint is read with torch.distributed.checkpoint.load.)")


def _sniff(head: bytes, size: int) -> str | None:
    """What the file is, when it is not something torch.load can read; None when it may be."""
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")) or _LEGACY_MAGIC in head[:32]:
        return None  # the zip format of torch.save (PyTorch >= 1.6), or the legacy one
    if head.startswith(b"\x80"):
        return ("a plain Python pickle, not a file written by torch.save; read it with pickle.load, and only "
                "if you trust it (unpickling can run arbitrary code)")
    if head.startswith(b"\x93NUMPY"):
        return "a NumPy .npy array; read it with numpy.load, then torch.from_numpy"
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "an HDF5 file (Keras / TensorFlow weights?), not a PyTorch checkpoint"
    if head.startswith(b"GGUF"):
        return "a GGUF file (llama.cpp), not a PyTorch checkpoint"
    if len(head) >= 10 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < size:
        return "a safetensors file; read it with safetensors.torch.load_file(path, device='cpu')"
    text = head.lstrip()
    if text.startswith(b"version https://git-lfs"):
        return ("a Git LFS pointer, not the file itself: run `git lfs pull` in the repository to fetch "
                "the real file")
    if text[:1] == b"<":
        return ("a web page (HTML/XML), not a checkpoint: a download saved the page around the file; "
                "download the file itself (the 'raw' link)")
    try:
        head.decode("utf-8")
        return "a text file, not a PyTorch checkpoint"
    except UnicodeDecodeError:
        return f"not a PyTorch checkpoint (it starts with the bytes {head[:8]!r})"


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


def _resolvable(dotted: str) -> bool:
    """Whether ``module.attr`` names something in an already imported module (imports nothing)."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is not None:
            obj: Any = module
            for attr in parts[i:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
    return False


def _unsafe_global(message: str) -> str | None:
    m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", message)
    return m.group(1) if m else None


def _corrupt(name: str, exc: BaseException, zipped: bool) -> CheckpointError:
    what = "its zip archive is incomplete or damaged" if zipped else "its pickle data is incomplete or damaged"
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    if "WeightsUnpickler error:" in text:  # the safe loader's wrapper: keep its own reason only
        text = text.split("WeightsUnpickler error:", 1)[1].strip()
    said = text.splitlines()[0] if text else ""
    said = said if len(said) <= 120 else said[:117] + "..."
    return CheckpointError(f"{name} is truncated or corrupt ({what}: an interrupted save, copy or download). "
                           f"Save or download it again. (PyTorch said: {type(exc).__name__}: {said})")


def _class_not_importable(name: str, exc: BaseException) -> CheckpointError:
    text = str(exc)
    m = re.search(r"Can't get attribute '([^']+)' on <module '([^']+)'", text)
    if m:
        cls, module = m.groups()
        where = ("the script that saved it (its __main__)" if module == "__main__" else f"module {module}")
        return CheckpointError(
            f"{name} holds a whole pickled object whose class {cls} was defined in {where}, and {cls} cannot "
            f"be found here. Define or import class {cls} (same name, in {module}) before loading - or, "
            "better, ask for a state_dict (model.state_dict()) and load it into a model you build yourself.")
    m = re.search(r"No module named '([^']+)'", text)
    module = m.group(1) if m else "?"
    return CheckpointError(
        f"{name} holds a whole pickled object whose class lives in module {module}, which is not importable "
        "here. Make that module importable (install it, or add its folder to sys.path) before loading - "
        "or, better, ask for a state_dict and load it into a model you build yourself.")


def load_checkpoint(path: PathLike, map_location: MapLocation = "cpu", *, trusted: bool = False) -> Any:
    """Load a file written by ``torch.save`` and return what it holds.

    Safe by default (``weights_only=True``: tensors, numbers, strings and containers only, no code
    runs). ``map_location`` (default ``"cpu"``) says where the tensors go, whatever device they were
    saved on: a device name, a `torch.device`, a dict such as ``{"cuda:1": "cuda:0"}``, a function
    ``(storage, location) -> storage``, or None to keep the devices they were saved on.

    ``trusted=True`` uses ``weights_only=False``, which can load whole pickled models (their class must
    be importable here) and **runs whatever code the file contains**: only for files you trust.

    Raises `CheckpointError` naming the file and what to do for: a missing file, a folder, an empty,
    truncated or corrupt file, a file that is not a PyTorch checkpoint, a pickle that needs globals the
    safe loader refuses, tensors saved on a device this machine lacks, a whole model whose class is not
    importable.
    """
    name = _shown(path)
    p = Path(path)
    if not p.exists():
        raise _missing_file(p, name)
    if p.is_dir():
        raise _directory(p, name)
    size = p.stat().st_size
    if size == 0:
        raise CheckpointError(f"{name} is empty (0 bytes): the save was interrupted or the copy or download "
                              "failed. Save or download it again.")
    with open(p, "rb") as f:
        head = f.read(64)
    kind = _sniff(head, size)
    if kind is not None:
        raise CheckpointError(f"{name} is {kind}.")
    _check_map_location(map_location, name)
    zipped = head.startswith(b"PK")
    try:
        return torch.load(p, map_location=map_location, weights_only=not trusted)
    except pickle.UnpicklingError as exc:
        glob = _unsafe_global(str(exc))
        if glob is None:
            raise _corrupt(name, exc, zipped) from None
        if glob.startswith("torch.") and not _resolvable(glob):
            raise _corrupt(name, exc, zipped) from None  # a name cut off mid-way: a truncated file
        kind_of = "a class" if glob.rsplit(".", 1)[-1][:1].isupper() else "a function"
        raise CheckpointError(
            f"{name} needs the global {glob} ({kind_of}), which {_SAFE_LOADER} refuses: loading it would "
            "run code named by the file. A file of weights does not need it; a whole pickled model or "
            "object does, and so does a file crafted to run code. If you trust the file (you or someone "
            "you trust saved it), load_checkpoint(path, trusted=True) - torch.load(path, "
            "weights_only=False) - runs whatever code the file contains. Otherwise ask for a state_dict."
        ) from None
    except RuntimeError as exc:
        text = str(exc)
        if "Attempting to deserialize object on" in text:
            from .devices import available_devices

            m = re.search(r"object on (?:a )?(\w+) device(?: (\d+))?", text)
            saved = (f"{m.group(1).lower()}:{m.group(2)}" if m and m.group(2)
                     else f"a {m.group(1)} device" if m else "a device")
            raise CheckpointError(
                f"{name} holds tensors saved on {saved}, which this machine does not have (it has "
                f"{', '.join(available_devices())}). Pass map_location to put them on a device you have: "
                "map_location='cpu', or course_utils.get_device().") from None
        if zipped and ("not in a subdirectory" in text or "data.pkl" in text):
            raise CheckpointError(f"{name} is a zip archive, but not one written by torch.save.") from None
        raise _corrupt(name, exc, zipped) from None
    except (AttributeError, ModuleNotFoundError) as exc:
        if trusted and ("Can't get attribute" in str(exc) or isinstance(exc, ModuleNotFoundError)):
            raise _class_not_importable(name, exc) from None
        raise _corrupt(name, exc, zipped) from None
    except (EOFError, KeyError, ValueError, IndexError, TypeError, OverflowError, MemoryError) as exc:
        raise _corrupt(name, exc, zipped) from None


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


def _is_state_dict(obj: Any) -> bool:
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
        if isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


def _model_device(model: nn.Module) -> torch.device:
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


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
        name = _shown(source)
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

def _is_optimizer_state(obj: Any) -> bool:
    return isinstance(obj, Mapping) and "state" in obj and "param_groups" in obj


def find_optimizer_state(obj: Any, name: str = "the checkpoint") -> Mapping[str, Any]:
    """The optimizer state in ``obj``: an optimizer state_dict itself, or a training-checkpoint dict with
    it under ``optimizer``, ``optimizer_state_dict``, ``optimizer_state``, ``optim`` or ``opt``."""
    if _is_optimizer_state(obj):
        return obj
    if isinstance(obj, Mapping):
        for key in OPTIMIZER_KEYS:
            if key in obj and _is_optimizer_state(obj[key]):
                return obj[key]
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
        name = _shown(source)
        where = (params[0].device if params else "cpu") if map_location is None else map_location
        source = load_checkpoint(source, map_location=where, trusted=trusted)
    else:
        name = "the checkpoint"
    state = find_optimizer_state(source, name)
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{name}: the optimizer state does not fit this {type(optimizer).__name__} "
                              f"({exc}). Build the optimizer of the same kind over the same parameters, in "
                              "the same order, as when it was saved.") from None
    for group in optimizer.param_groups:
        keep_step = not (group.get("fused") or group.get("capturable"))
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor) and value.device != p.device and not (
                        key == "step" and keep_step):
                    optimizer.state[p][key] = value.to(p.device)
    return optimizer
