"""Checkers for notebook 04 (DataParallel)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..parallel import chunk_sizes
from . import Verdict, fail, ok

__all__ = ["CHUNK_CASES", "check_chunk_predictions", "check_dict_scatter_gather", "check_unwrap"]

CHUNK_CASES: tuple[tuple[int, int], ...] = ((16, 2), (16, 4), (9, 4), (10, 8), (3, 4), (17, 3))
"""(batch size, number of GPUs) pairs the chunk-size exercise asks about."""


def check_chunk_predictions(predictions: Any) -> Verdict:
    """Exercise: ``predictions[(batch, gpus)]`` is the list of chunk sizes DataParallel makes."""
    if not isinstance(predictions, dict):
        return fail(f"expected a dict {{(batch, gpus): [sizes]}}, got {type(predictions).__name__}.",
                    "start from the dict in the exercise cell and fill in each list.")
    missing = [case for case in CHUNK_CASES if case not in predictions]
    if missing:
        return fail(f"no prediction for {', '.join(map(str, missing))}.",
                    "give a list of chunk sizes for every (batch, gpus) key.")
    for (batch, gpus) in CHUNK_CASES:
        got, want = predictions[(batch, gpus)], chunk_sizes(batch, gpus)
        if got is ... or got is None:
            return fail(f"({batch}, {gpus}) is not filled in yet.", "replace ... by a list of ints.")
        try:
            got = [int(s) for s in got]
        except (TypeError, ValueError):
            return fail(f"({batch}, {gpus}): {got!r} is not a list of ints.", "e.g. [8, 8]")
        if got == want:
            continue
        if sum(got) != batch:
            return fail(f"({batch}, {gpus}): your chunks add up to {sum(got)}, but every one of the "
                        f"{batch} samples goes to exactly one GPU.", "the sizes must sum to the batch size.")
        if len(got) == gpus and len(want) < gpus:
            return fail(f"({batch}, {gpus}): you gave every GPU a chunk, but torch.chunk makes chunks of "
                        f"ceil({batch}/{gpus}) = {want[0]} samples, so only {len(want)} chunks exist and "
                        f"{gpus - len(want)} GPU(s) stay idle.",
                        "chunk size = ceil(batch / gpus); the last chunk takes what is left.")
        if sorted(got) == sorted(want):
            return fail(f"({batch}, {gpus}): right sizes, wrong order: {got}.",
                        "full chunks come first; the short one (if any) is the last.")
        return fail(f"({batch}, {gpus}): {got} is not what DataParallel makes.",
                    f"chunk size = ceil({batch} / {gpus}) = {want[0]}; then count how many chunks that gives.")
    return ok(f"all {len(CHUNK_CASES)} cases right, e.g. (9, 4) → {chunk_sizes(9, 4)} and "
              f"(10, 8) → {chunk_sizes(10, 8)}.")


class _Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class _Ensemble(nn.Module):
    """A plain model that happens to have a submodule called ``module``."""

    def __init__(self) -> None:
        super().__init__()
        self.module = nn.Linear(4, 2)
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x) + self.linear(x)


def check_unwrap(unwrap: Any) -> Verdict:
    """Exercise: ``unwrap(model)`` returns the module inside a DataParallel, and any other model as is."""
    if not callable(unwrap):
        return fail(f"expected a function, got {type(unwrap).__name__}.", "def unwrap(model): ...")
    inner = _Classifier()
    cases: list[tuple[str, nn.Module, nn.Module | None, str]] = [
        ("nn.DataParallel(model)", nn.DataParallel(inner), inner,
         "a DataParallel keeps the real model in its .module attribute."),
        ("a model that is not wrapped", _Classifier(), None,
         "return the model itself when it is not a DataParallel."),
        ("a plain model with a submodule named 'module'", _Ensemble(), None,
         "hasattr(model, 'module') is also true for a model with a layer called 'module'; "
         "test isinstance(model, nn.DataParallel) instead."),
    ]
    for what, model, want, hint in cases:
        want = model if want is None else want
        try:
            got = unwrap(model)
        except Exception as exc:  # the student's code raised: say which case
            return fail(f"unwrap({what}) raised {type(exc).__name__}: {exc}", hint)
        if got is not want:
            name = type(got).__name__
            return fail(f"unwrap({what}) returned a {name}, not the model you should get back.", hint)
    linear = unwrap(nn.DataParallel(inner)).linear
    return ok(f"unwrap(nn.DataParallel(model)).linear is the model's layer: {linear}.")


def _batch(n: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(n)
    return {"image": torch.randn(n, 3, generator=g), "label": torch.arange(n), "augment": True}


def check_dict_scatter_gather(scatter_dict: Any, gather_dict: Any) -> Verdict:
    """Exercise: ``scatter_dict(batch, n)`` → list of dicts (one per chunk), ``gather_dict(list) → dict``."""
    if not callable(scatter_dict) or not callable(gather_dict):
        return fail("expected two functions, scatter_dict(batch, n) and gather_dict(outputs).",
                    "define both with def, then pass them to the checker.")
    for batch_size, n in ((10, 4), (10, 8), (3, 4), (8, 1)):
        batch = _batch(batch_size)
        want = chunk_sizes(batch_size, n)
        try:
            chunks = scatter_dict(batch, n)
        except Exception as exc:
            return fail(f"scatter_dict(batch of {batch_size}, {n}) raised {type(exc).__name__}: {exc}",
                        "split each tensor value with value.chunk(n); copy other values to every chunk.")
        if not isinstance(chunks, (list, tuple)) or not all(isinstance(c, dict) for c in chunks):
            return fail(f"scatter_dict must return a list of dicts, got {type(chunks).__name__}.",
                        "one dict per chunk, with the same keys as the batch.")
        if len(chunks) != len(want):
            return fail(f"batch of {batch_size} on {n} GPUs: you made {len(chunks)} chunks, DataParallel "
                        f"makes {len(want)} ({want}).",
                        "use tensor.chunk(n) and make as many dicts as it returns chunks.")
        for i, chunk in enumerate(chunks):
            if set(chunk) != set(batch):
                return fail(f"chunk {i} has keys {sorted(chunk)}, the batch has {sorted(batch)}.",
                            "every chunk carries every key; non-tensor values are copied as they are.")
            if chunk["augment"] is not True:
                return fail(f"chunk {i}['augment'] is {chunk['augment']!r}, not True.",
                            "values that are not tensors go to every chunk unchanged.")
            for key in ("image", "label"):
                part = chunk[key]
                if not isinstance(part, torch.Tensor) or part.shape[0] != want[i]:
                    shape = tuple(part.shape) if isinstance(part, torch.Tensor) else type(part).__name__
                    return fail(f"batch of {batch_size} on {n} GPUs: chunk {i}[{key!r}] is {shape}, "
                                f"expected {want[i]} samples.", "split along dim 0 with .chunk(n).")
            start = sum(want[:i])
            if not torch.equal(chunk["label"], batch["label"][start:start + want[i]]):
                return fail(f"chunk {i} holds samples {chunk['label'].tolist()}, expected "
                            f"{list(range(start, start + want[i]))}.",
                            "keep the samples in order; image and label of a sample stay together.")
        outputs = [{"logits": c["image"] * 2, "label": c["label"]} for c in chunks]
        try:
            merged = gather_dict(outputs)
        except Exception as exc:
            return fail(f"gather_dict raised {type(exc).__name__}: {exc}",
                        "for each key, torch.cat([out[key] for out in outputs]).")
        if not isinstance(merged, dict) or set(merged) != {"logits", "label"}:
            return fail(f"gather_dict must return one dict with the outputs' keys, got {merged!r:.80}.",
                        "{key: torch.cat([o[key] for o in outputs]) for key in outputs[0]}")
        if not (torch.equal(merged["label"], batch["label"]) and torch.equal(merged["logits"], batch["image"] * 2)):
            return fail(f"gather_dict(scatter_dict(batch of {batch_size}, {n})) does not give back the batch "
                        "in its order.", "concatenate the chunks in order, along dim 0.")
    return ok("scatter_dict and gather_dict round-trip batches of 10 on 4 and 8 GPUs, 3 on 4 and 8 on 1.")

