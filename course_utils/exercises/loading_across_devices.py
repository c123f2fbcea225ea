"""Checkers for notebook 06 (loading across devices)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..checkpoints import CheckpointError, find_state_dict, load_checkpoint, strip_prefixes
from . import Verdict, fail, ok

__all__ = ["check_gpu_checkpoint_on_cpu", "check_two_prefix_repair"]


def check_gpu_checkpoint_on_cpu(model: Any, path: str | os.PathLike[str]) -> Verdict:
    """Exercise: the GPU checkpoint at ``path`` loaded into ``model``, which is on the CPU."""
    if isinstance(model, Mapping):
        return fail("you passed a dict (the loaded checkpoint), not the model.",
                    "torch.load returns the saved dict; model.load_state_dict(weights) copies it into the model.")
    if not isinstance(model, nn.Module):
        return fail(f"expected the model (an nn.Module), got {type(model).__name__}.",
                    "pass the model you loaded the weights into.")
    try:
        want = strip_prefixes(find_state_dict(load_checkpoint(path, map_location="cpu"), os.fspath(path)))
    except CheckpointError as exc:
        return fail(f"the checker cannot read the checkpoint: {exc}")
    if isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
        return fail("the model is still wrapped in DataParallel.",
                    "load into the plain model: strip the 'module.' prefix from the checkpoint's keys instead.")
    have = model.state_dict()
    if set(have) != set(want):
        return fail(f"the model's keys {sorted(have)[:3]}... are not the checkpoint's {sorted(want)[:3]}....",
                    "build the model with the class given in the exercise.")
    devices = sorted({str(t.device) for t in have.values()})
    if devices != ["cpu"]:
        return fail(f"the model's weights are on {', '.join(devices)}, not on the CPU.",
                    "map_location='cpu' puts the loaded tensors on the CPU; keep the model there.")
    for key, value in want.items():
        if have[key].shape != value.shape or not torch.equal(have[key], value.to(have[key].dtype)):
            return fail(f"{key} does not hold the checkpoint's values (the model still has its own "
                        "random initial weights?).",
                        "torch.load only returns the weights: model.load_state_dict(...) puts them in the model.")
    return ok(f"all {len(want)} tensors of the GPU checkpoint are in the model, on the CPU.")


def check_two_prefix_repair(repaired: Any, broken: Mapping[str, Any], model: nn.Module) -> Verdict:
    """Exercise: ``repaired`` is ``broken`` without its two wrapper prefixes, fitting ``model``;
    ``broken`` itself is unchanged."""
    if repaired is None:
        return fail("your function returned None.", "return the new dict of weights.")
    if not isinstance(repaired, Mapping):
        return fail(f"expected a dict of weights, got {type(repaired).__name__}.", "return the new dict.")
    want = model.state_dict()
    if not broken or not any(k.startswith(("module.", "_orig_mod.")) for k in broken):
        return fail("`broken` no longer has its prefixed keys: your code changed it in place.",
                    "build a new dict (or copy first: consume_prefix_in_state_dict_if_present works in place), "
                    "then re-run the cell that makes `broken`.")
    still = [k for k in repaired if k.startswith(("module.", "_orig_mod."))]
    if still:
        return fail(f"some keys still start with a wrapper prefix, e.g. {still[0]!r}.",
                    "the keys carry two prefixes: remove 'module.' and '_orig_mod.' from the start until "
                    "neither is left.")
    lost = [k for k in repaired if k not in want]
    if lost:
        return fail(f"keys that the model does not have: {lost[:3]} (expected e.g. {sorted(want)[:2]}).",
                    "remove prefixes only at the start of a key (str.removeprefix); k.replace('module.', '') "
                    "also cuts 'module.' out of the middle of names such as 'submodule.weight'.")
    missing = [k for k in want if k not in repaired]
    if missing:
        return fail(f"keys missing from your dict: {missing[:3]}.", "keep every entry of `broken`.")
    originals = {_strip_key(k): v for k, v in broken.items()}
    for key, value in repaired.items():
        if not isinstance(value, torch.Tensor) or not torch.equal(value, originals[key]):
            return fail(f"{key} does not hold the same tensor as in `broken`.", "change the keys, not the values.")
    try:
        model.load_state_dict(repaired)
    except RuntimeError as exc:  # pragma: no cover - keys and values were checked above
        return fail(f"load_state_dict refused it: {str(exc).splitlines()[0]}")
    return ok(f"{len(repaired)} keys repaired; they load into {type(model).__name__} with strict=True.")


def _strip_key(key: str) -> str:
    """``key`` without ``module.`` / ``_orig_mod.`` at its start (the checker's reference)."""
    return next(iter(strip_prefixes({key: None})))
