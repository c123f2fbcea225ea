"""Checkers for notebook 04 (DataParallel).

Each failing verdict names the mistake of the answer it was given (with the values it gave), a hint that
names the concept (a question, or the lesson's section), and a closer hint nearer to the code, shown when
the student asks (``%hint``) or fails the same exercise again. No message works out an answer of exercise
7.1 (the chunk sizes of a case): the dict exercise's messages do not print the expected sizes either.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
from torch import nn

from ..distributed.data_parallel import chunk_sizes
from ..formatting import short_repr
from . import Verdict, exercise, fail, ok

__all__ = ["CHUNK_CASES", "check_chunk_predictions", "check_dict_scatter_gather", "check_unwrap"]

CHUNK_CASES: tuple[tuple[int, int], ...] = ((16, 2), (16, 4), (9, 4), (10, 8), (3, 4), (17, 3))
"""(batch size, number of GPUs) pairs the chunk-size exercise asks about."""

_SPLIT_RULE = "section 4: how the batch splits"



def _whole_numbers(values: Any) -> list[int] | None:
    """``values`` as a list of ints when it is a sequence of whole numbers (3, 3.0, numpy ints); else None."""
    try:
        items = list(values)
    except TypeError:
        return None
    out = []
    for v in items:
        if isinstance(v, bool) or not isinstance(v, (numbers.Real, torch.Tensor)):
            return None
        f = float(v)
        if not math.isfinite(f) or f != int(f):
            return None
        out.append(int(f))
    return out


def _balanced(batch: int, n: int) -> list[int]:
    """The sizes of ``torch.tensor_split`` (or numpy's array_split): as even as possible, n chunks."""
    return [batch // n + (1 if i < batch % n else 0) for i in range(n)]


def _by_size(batch: int, size: int) -> list[int]:
    """The sizes of ``torch.split(size)``: chunks of ``size``, the rest last."""
    return [size] * (batch // size) + ([batch % size] if batch % size else [])


def _sizes_feedback(batch: int, gpus: int, got: list[int], want: list[int]) -> tuple[str, str, str]:
    """(what is wrong, hint, closer hint) for chunk sizes ``got`` that are not DataParallel's ``want``.
    Says what the sizes do, never which sizes are right."""
    rule_hint = f"How does torch.chunk choose the size of its chunks, and how many does it make? ({_SPLIT_RULE})"
    rule_closer = ("Every chunk but the last has ⌈batch / GPUs⌉ samples (rounded up), the last what is left; "
                   "count how many chunks that makes.")
    if sum(got) != batch:
        return (f"your chunks add up to {sum(got)}, but the batch has {batch} samples.",
                "Does DataParallel lose a sample, or send one to two GPUs?",
                "Every sample goes to exactly one GPU: the sizes sum to the batch size.")
    if any(s <= 0 for s in got):
        return (f"{got} has a chunk of {min(got)} samples.",
                "Does a GPU without samples get a chunk (and a replica)? (section 4: GPUs without a chunk)",
                "List only the chunks that exist: a GPU that gets no sample is idle, not given an empty chunk.")
    if len(got) > gpus:
        return (f"{got} is {len(got)} chunks for {gpus} GPUs.",
                "How many chunks can one GPU take in one forward pass?",
                "At most one chunk per GPU: the chunk size comes from dividing the batch by the GPUs.")
    if sorted(got) == sorted(want):
        return (f"{got}: the sizes are right, their order is not.",
                "Which chunk does torch.chunk leave short, the first or the last?",
                "torch.chunk fills full chunks from the start of the batch; what is left goes to the end.")
    if len(got) == gpus and got == _balanced(batch, gpus):
        return (f"{got} spreads the samples over all {gpus} GPUs as evenly as possible; DataParallel's split "
                "does not.", rule_hint, rule_closer)
    head, last = got[:-1], got[-1]
    if head and len(set(head)) == 1 and last <= head[0]:
        return (f"{got} uses chunks of {head[0]} samples: that is not the size torch.chunk picks for {batch} "
                f"samples on {gpus} GPUs.", rule_hint, rule_closer)
    return (f"{got} is not how torch.chunk cuts {batch} samples for {gpus} GPUs.", rule_hint, rule_closer)


def _as_case(key: Any) -> tuple[int, int] | None:
    """``key`` as a (batch, gpus) pair of positive ints, when it is one; else None."""
    if not isinstance(key, tuple) or len(key) != 2:
        return None
    numbers_ = _whole_numbers(key)
    if numbers_ is None or min(numbers_) < 1:
        return None
    return numbers_[0], numbers_[1]


@exercise
def check_chunk_predictions(predictions: Any) -> Verdict:
    """Exercise: ``predictions[(batch, gpus)]`` is the list of chunk sizes DataParallel makes.

    Sizes may be given as any sequence of whole numbers (3, 3.0, numpy or 0-dim tensor ints); 2.5 is not a
    size. The first wrong case is reported, by what its sizes do wrong, without the right sizes. Keys that
    are not cases of the exercise are named in the verdict; a prediction given for such a (batch, gpus)
    pair is checked as well (a wrong one is rejected), since the student wrote it as an answer.
    """
    if not isinstance(predictions, dict):
        return fail(f"expected a dict {{(batch, gpus): [sizes]}}, got {type(predictions).__name__}.",
                    "Start from the dict in the exercise cell and fill in each list.",
                    "predictions = {(16, 2): [8, 8], (16, 4): [...], ...}: keep the keys as they are.")
    missing = [case for case in CHUNK_CASES if case not in predictions]
    if missing:
        return fail(f"no prediction for {', '.join(map(str, missing))}.",
                    "Give a list of chunk sizes for every (batch, gpus) key of the exercise.",
                    "The keys are tuples (batch, gpus), such as (9, 4).")
    for (batch, gpus) in CHUNK_CASES:
        got = predictions[(batch, gpus)]
        if got is ... or got is None:
            return fail(f"({batch}, {gpus}) is not filled in yet.",
                        "Work it out by hand from the rule of section 4, then replace ... by your list.",
                        "One int per chunk, in order, as in (16, 2): [8, 8].")
        sizes = _whole_numbers(got)
        if sizes is None:
            return fail(f"({batch}, {gpus}): {short_repr(got)} is not a list of whole numbers.",
                        "A chunk is a number of samples: what kind of number is that?",
                        "One int per chunk, in order, as in (16, 2): [8, 8].")
        want = chunk_sizes(batch, gpus)
        if sizes == want:
            continue
        message, hint, closer = _sizes_feedback(batch, gpus, sizes, want)
        return fail(f"({batch}, {gpus}): {message}", hint, closer)
    extra = [key for key in predictions if key not in CHUNK_CASES]
    checked, ignored = [], []
    for key in extra:
        case, got = _as_case(key), predictions[key]
        if case is None or got is ... or got is None:
            ignored.append(key)  # nothing to check: not a (batch, gpus) pair, or not filled in
            continue
        checked.append(key)
        sizes = _whole_numbers(got)
        if sizes is None:
            return fail(f"{key} is not a case of the exercise, and its prediction {short_repr(got)} is not a list of "
                        "whole numbers.",
                        "A chunk is a number of samples: what kind of number is that?",
                        "Remove the cases the exercise does not ask about, or give one int per chunk, in order.")
        if sizes != chunk_sizes(*case):
            message, hint, closer = _sizes_feedback(*case, sizes, chunk_sizes(*case))
            return fail(f"{key} is not a case of the exercise, but your prediction for it is wrong: {message}",
                        hint, closer)
    done = f"all {len(CHUNK_CASES)} cases right, the ones that leave GPUs idle included."
    if checked:
        done += (f" {_keys(checked)} {'is not a case' if len(checked) == 1 else 'are not cases'} of the exercise; "
                 f"your prediction{'' if len(checked) == 1 else 's'} for {'it is' if len(checked) == 1 else 'them are'}"
                 " right too.")
    if ignored:
        done += (f" {_keys(ignored)} {'is not a case' if len(ignored) == 1 else 'are not cases'} of the exercise "
                 "and not a prediction to check: ignored.")
    return ok(done)


def _keys(keys: list[Any]) -> str:
    return ", ".join(short_repr(k, 30) for k in keys[:5]) + (", ..." if len(keys) > 5 else "")


# --- 7.2 unwrap -----------------------------------------------------------------------------------------

class _Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class _Ensemble(nn.Module):
    """A plain model that happens to have a submodule called ``module`` (state_dict keys ``module.*``)."""

    def __init__(self) -> None:
        super().__init__()
        self.module = nn.Linear(4, 2)
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x) + self.linear(x)


class _Head(nn.Module):
    """A plain model whose only submodule is called ``module``: every state_dict key starts with ``module.``
    and ``_modules`` lists only ``module``, as for a wrapper."""

    def __init__(self) -> None:
        super().__init__()
        self.module = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


class _ForwardingWrapper(nn.DataParallel):
    """A subclass of DataParallel as projects write it: unknown attributes are looked up on the model. Its
    name does not contain "DataParallel", so that only a test of the type that accepts subclasses passes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def _module_label(name: str, wrapped: bool) -> str:
    """How a message names the submodule ``name`` of a case: the wrapper, the model, model.linear, ..."""
    if not wrapped:
        return "model" + (f".{name}" if name else "")
    return "wrapper" if not name else "model" + name[len("module"):]


_WRAPPER_HINT = ("What does DataParallel wrap your model in, and where does the wrapper keep it? "
                 "(section 5, `'DataParallel' object has no attribute`)")


@exercise
def check_unwrap(unwrap: Any) -> Verdict:
    """Exercise: ``unwrap(model)`` returns the module inside a DataParallel (or inside an instance of a
    subclass of it), and any other model as is: the same object, not a copy. It must leave the wrapper as it
    was (still holding the model)."""
    if not callable(unwrap):
        return fail(f"expected a function, got {type(unwrap).__name__} {short_repr(unwrap, 40)}.",
                    "Pass the function itself, not its result.",
                    "check_unwrap(unwrap): no parentheses after the name.")
    inner, sub_inner = _Classifier(), _Classifier()
    # some models in training mode, some in eval mode: an unwrap that calls .eval() or .train() changes one
    cases: list[tuple[str, nn.Module, nn.Module]] = [
        ("nn.DataParallel(model)", nn.DataParallel(inner), inner),
        ("a model that is not wrapped", (plain := _Classifier()).eval(), plain),
        ("a plain model with a layer named 'module'", (ensemble := _Ensemble()), ensemble),
        ("a plain model whose only layer is named 'module'", (head := _Head()).eval(), head),
        ("a subclass of nn.DataParallel named _ForwardingWrapper, wrapping the model",
         _ForwardingWrapper(sub_inner).eval(), sub_inner),
    ]
    for what, model, want in cases:
        call = f"unwrap({what})"
        wrapped = isinstance(model, nn.DataParallel)
        modes = {name: m.training for name, m in model.named_modules()}
        try:
            got = unwrap(model)
        except Exception as exc:  # the student's code raised: say which case
            raised = f"{call} raised {type(exc).__name__}: {exc}"
            if not wrapped:
                return fail(raised + ". A model that was never wrapped has no .module.",
                            "unwrap also gets models that were never wrapped: what should it give back then, "
                            "and how can it tell the two apart?",
                            "First decide whether the model is a DataParallel; read .module only then, and "
                            "otherwise return the model unchanged.")
            return fail(raised + ".", _WRAPPER_HINT, "The wrapper holds your model as an attribute, as "
                        "section 5's net.module.linear shows.")
        left = model._modules.get("module")
        if wrapped and left is not want:
            return fail(f"{call} took the model out of the wrapper: afterwards the wrapper's .module is "
                        f"{'gone' if left is None else 'a ' + type(left).__name__}.",
                        "unwrap only looks inside: should the DataParallel still work after it?",
                        "Read the attribute; do not delete, pop or replace it.")
        changed = [(name, before) for name, m in model.named_modules()
                   if (before := modes.get(name, m.training)) != m.training]
        if changed:
            flags = ", ".join(f"{_module_label(name, wrapped)}.training {before} → {not before}"
                              for name, before in changed[:3]) + (", ..." if len(changed) > 3 else "")
            return fail(f"{call} changed the model's training mode ({flags}): after unwrapping, dropout and batch "
                        "norm would behave differently than before the call.",
                        "unwrap only looks inside: should it switch the model between training and evaluation "
                        "mode? What else does the method you called on the model do, besides returning it?",
                        "Return the module as it is: .eval() and .train() return the model, but they also set "
                        "training on it and on every submodule.")
        if got is want:
            continue
        name = type(got).__name__
        if type(got) is type(want):
            return fail(f"{call} returned a copy of the model, not the model itself: training it or loading "
                        "weights into it would not reach the one the caller holds.",
                        "Should unwrap build a new model, or hand back the one that exists?",
                        "Return the object you found, without copying it.")
        if got is None:
            return fail(f"{call} returned None.", "Does your function return a model on every path?",
                        "Each branch of unwrap ends with a return of a model.")
        if what.startswith("a plain model"):
            return fail(f"{call} returned its layer 'module' (a {name}), not the model: this model is not "
                        "wrapped, it only has a layer of that name.",
                        "A layer called `module` does not make a wrapper: this plain model's state_dict keys "
                        "start with `module.` too. What is true of every wrapped model and of no plain one? "
                        "(what does DataParallel wrap the model in?)",
                        "Decide by the model's type, with the built-in that also accepts subclasses "
                        "(isinstance), not by whether an attribute named module exists.")
        if wrapped and got is model:
            if isinstance(model, _ForwardingWrapper):
                return fail(f"{call} returned the wrapper itself ({name}), not the model inside it. A subclass "
                            "of DataParallel is a DataParallel too, whatever its name.",
                            "Is an instance of a subclass of DataParallel a DataParallel? How does your test "
                            "of the type treat subclasses?",
                            "Comparing type(model) with nn.DataParallel, or looking for 'DataParallel' in its "
                            "name, is true for that class only (a subclass may have any name); the built-in "
                            "isinstance accepts subclasses.")
            return fail(f"{call} returned the DataParallel wrapper itself, not the model inside it.",
                        _WRAPPER_HINT, "The wrapper holds your model as an attribute, as section 5's "
                        "net.module.linear shows.")
        return fail(f"{call} returned a {name}, not the model you should get back.",
                    _WRAPPER_HINT if wrapped else "A model that is not wrapped: what should unwrap give back?",
                    "Return the model inside a wrapper, and any other model itself.")
    linear = unwrap(nn.DataParallel(inner)).linear
    return ok(f"unwrap(nn.DataParallel(model)).linear is the model's layer: {linear}.")


# --- 7.3 a dict batch -----------------------------------------------------------------------------------

def _batch(n: int, other_keys: bool = False) -> tuple[dict[str, Any], str, str]:
    """A dict batch of ``n`` samples, the key that holds each sample's index, and the key of its features.
    ``other_keys``: other names and values than the exercise's example, so that an answer written for the
    example's keys fails."""
    g = torch.Generator().manual_seed(n)
    if other_keys:
        return ({"tokens": torch.randn(n, 5, generator=g), "target": torch.arange(n), "split": "validation",
                 "augment": False}, "target", "tokens")
    return {"image": torch.randn(n, 3, generator=g), "label": torch.arange(n), "augment": True}, "label", "image"


_DICT_CASES: tuple[tuple[int, int, bool], ...] = ((10, 4, False), (10, 8, False), (3, 4, False), (8, 1, False),
                                                  (7, 3, True))
"""(batch size, GPUs, other keys) for the dict exercise; the last batch has other keys than the example."""


def _scatter_sizes_feedback(b: int, n: int, sizes: list[int], want: list[int]) -> tuple[str, str, str]:
    chunk_hint = "Which function cuts DataParallel's chunks, and what does its number mean? (section 3, step 1)"
    chunk_closer = ("Cut every tensor with .chunk(n) along dim 0 and make one dict per chunk it returns: it "
                    "may return fewer than n.")
    if any(s == 0 for s in sizes):
        return (f"the chunks have {sizes} samples: some are empty.",
                "Does DataParallel run a replica on an empty chunk? How many chunks does torch.chunk make for a "
                "small batch? (section 3, step 1)", chunk_closer)
    if n < b and sizes == _by_size(b, n) and sizes != want:
        return (f"the chunks have {sizes} samples: {n} was used as the size of each chunk, not as the number of "
                "GPUs.",
                "Does the function you used take the number of chunks, or the size of each chunk?",
                "torch.split (Tensor.split) takes a size; torch.chunk takes a number of chunks, as "
                "DataParallel's scatter does.")
    if len(sizes) == n and sizes == _balanced(b, n):
        return (f"the chunks have {sizes} samples, as even as possible over all {n} GPUs; DataParallel's "
                "scatter does not balance them like that.", chunk_hint, chunk_closer)
    return (f"the chunks have {sizes} samples; that is not how DataParallel's scatter cuts {b} samples for "
            f"{n} GPUs.", chunk_hint, chunk_closer)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return type(a) is type(b) and a == b


def _check_scatter(scatter_dict: Any, b: int, n: int, other_keys: bool) -> tuple[Verdict | None, list[dict]]:
    batch, index_key, feature_key = _batch(b, other_keys)
    kept = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    where = f"scatter_dict(batch of {b}, {n})"
    tensor_keys = [k for k, v in batch.items() if isinstance(v, torch.Tensor)]
    try:
        chunks = scatter_dict(batch, n)
    except Exception as exc:
        raised = f"{where} raised {type(exc).__name__}: {exc}"
        if isinstance(exc, KeyError):
            return fail(raised + f". This batch's keys are {list(batch)}.",
                        "scatter_dict gets batches with any keys: does your code depend on the names of the "
                        "example's?",
                        "Go through batch.items(); decide what to do with a value by its type, not its key."), []
        if isinstance(exc, IndexError):
            return fail(raised + ".",
                        "How many chunks does torch.chunk make for a small batch? (section 3, step 1)",
                        "Make as many dicts as the tensors have chunks, not n."), []
        return fail(raised + ".",
                    "A dict batch is scattered like section 3's tuple of arguments: what happens to a tensor "
                    "value, and to any other value? (section 3, step 1)",
                    "Cut each tensor value with .chunk(n) along dim 0; give every other value to every chunk "
                    "unchanged."), []
    if set(batch) != set(kept) or not all(_same(batch[k], kept[k]) for k in kept):
        changed = sorted(set(kept) - set(batch)) or [k for k in kept if k in batch and not _same(batch[k], kept[k])]
        return fail(f"{where} changed the batch it was given (key(s) {changed}).",
                    "The caller still holds the batch: should scattering change it?",
                    "Build new dicts for the chunks; do not pop, assign or modify in place the batch's "
                    "values."), []
    if not isinstance(chunks, (list, tuple)) or not all(isinstance(c, dict) for c in chunks):
        return fail(f"{where} returned {type(chunks).__name__} {short_repr(chunks, 60)}, not a list of dicts.",
                    "What does a replica receive: one dict, like the batch, with its part of the samples?",
                    "Return a list with one dict per chunk, each with the batch's keys."), []
    for i, chunk in enumerate(chunks):
        if set(chunk) != set(batch):
            lost = sorted(set(batch) - set(chunk))
            plain = [k for k in lost if k not in tensor_keys]
            return fail(f"{where}: chunk {i} has keys {sorted(chunk)}, the batch has {sorted(batch)}.",
                        "What happens to values that are not tensors, like the flag of section 3's step 1?"
                        if plain else "Every chunk carries every key of the batch.",
                        "Every chunk has all the batch's keys; values that are not tensors are copied as they "
                        "are."), []
        for k, v in batch.items():
            if k not in tensor_keys and not _same(chunk[k], v):
                return fail(f"{where}: chunk {i}[{k!r}] is {short_repr(chunk[k], 40)}, the batch's is {v!r}.",
                            "What happens to a value that is not a tensor (a flag, a name)? (section 3, step 1)",
                            "Give every chunk the batch's value itself, unchanged."), []
        for k in tensor_keys:
            part = chunk[k]
            if not isinstance(part, torch.Tensor):
                return fail(f"{where}: chunk {i}[{k!r}] is a {type(part).__name__}, not a tensor.",
                            "What is a chunk of a tensor?", "Keep each tensor's chunks as tensors."), []
            if part.shape[1:] != batch[k].shape[1:]:
                return fail(f"{where}: chunk {i}[{k!r}] has shape {tuple(part.shape)}; the batch's "
                            f"{k!r} is {tuple(batch[k].shape)}.",
                            "Along which dimension do the samples of a batch lie?",
                            "Cut along dim 0, the batch dimension."), []
    sizes = {k: [c[k].shape[0] for c in chunks] for k in tensor_keys}
    if len({tuple(s) for s in sizes.values()}) > 1:
        return fail(f"{where}: the tensors are cut differently: {sizes}.",
                    "Must the features and the label of a sample stay on the same GPU?",
                    "Cut every tensor of the batch the same way."), []
    got_sizes, want = sizes[tensor_keys[0]], chunk_sizes(b, n)
    if got_sizes != want:
        message, hint, closer = _scatter_sizes_feedback(b, n, got_sizes, want)
        return fail(f"{where}: {message}", hint, closer), []
    start = 0
    for i, chunk in enumerate(chunks):
        end = start + want[i]
        if not torch.equal(chunk[index_key], batch[index_key][start:end]):
            return fail(f"{where}: chunk {i} holds samples {chunk[index_key].tolist()} (by {index_key!r}): not "
                        "consecutive samples in the batch's order.",
                        "Which samples does a chunk of torch.chunk hold: a run of consecutive ones, or every "
                        "n-th?", "Cut with .chunk(n); do not shuffle, stride or reorder."), []
        if not torch.equal(chunk[feature_key], batch[feature_key][start:end]):
            return fail(f"{where}: chunk {i}[{feature_key!r}] does not hold the same samples as its "
                        f"{index_key!r}.",
                        "Must the features and the label of a sample stay together?",
                        "Cut every tensor the same way, in the batch's order."), []
        start = end
    return None, list(chunks)


def _check_gather(gather_dict: Any, chunks: list[dict], b: int, n: int, other_keys: bool) -> Verdict | None:
    batch, index_key, feature_key = _batch(b, other_keys)
    out_key = "scores" if other_keys else "logits"
    # as a replica's forward: the outputs come out of a layer with a parameter, so they require grad
    scale = torch.tensor(2.0, requires_grad=True)
    outputs = [{out_key: c[feature_key] * scale, index_key: c[index_key]} for c in chunks]
    for o in outputs:
        o[out_key].retain_grad()
    kept = [dict(o) for o in outputs]
    where = f"gather_dict(the {len(outputs)} outputs of a batch of {b} on {n})"
    cat_hint = ("Gathering joins the replicas' outputs along the batch dimension they already have: which "
                "operation does that? (section 3, step 4)")
    cat_closer = ("For each key, join the outputs' tensors along dim 0 in the list's order (torch.stack would "
                  "add a dimension instead).")
    try:
        merged = gather_dict(outputs)
    except Exception as exc:
        if isinstance(exc, KeyError):
            return fail(f"{where} raised KeyError: {exc}. These outputs' keys are {list(outputs[0])}.",
                        "gather_dict gets outputs with any keys: does your code depend on the example's names?",
                        "Take the keys from the outputs themselves (outputs[0]).")
        return fail(f"{where} raised {type(exc).__name__}: {exc}.", cat_hint, cat_closer)
    if len(outputs) != len(kept) or any(set(o) != set(k) or any(o[key] is not k[key] for key in k)
                                         for o, k in zip(outputs, kept, strict=False)):
        return fail(f"{where} changed the list of outputs it was given.",
                    "The outputs belong to the caller: should gathering reorder, empty or change them?",
                    "Read the outputs; build the merged dict from them without changing the list or its dicts.")
    if not isinstance(merged, dict) or set(merged) != set(outputs[0]):
        shown = sorted(merged) if isinstance(merged, dict) else f"a {type(merged).__name__}"
        return fail(f"{where} returned {shown}; the outputs are dicts with keys {sorted(outputs[0])}.",
                    "The gathered output has the form of one replica's output: what form is that here?",
                    "Return one dict with each key of the outputs, holding all the chunks' tensors for that key.")
    whole = {out_key: batch[feature_key] * 2, index_key: batch[index_key]}
    for key, value in whole.items():
        got = merged[key]
        if not isinstance(got, torch.Tensor) or got.shape != value.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return fail(f"{where}[{key!r}] is {shape}, the whole batch's is {tuple(value.shape)}.",
                        "Does gathering add a dimension, or extend the batch dimension? (section 3, step 4)",
                        cat_closer)
    if not torch.equal(merged[index_key], whole[index_key]):
        return fail(f"{where}[{index_key!r}] gives the samples in the order {merged[index_key].tolist()}, "
                    "not in the batch's order.",
                    "In which order must the replicas' outputs be joined?",
                    "Join them in the order of the list: the first replica's output first.")
    if not torch.equal(merged[out_key], whole[out_key]):
        return fail(f"{where}[{out_key!r}] does not hold the outputs of the samples in {index_key!r}'s order.",
                    "Must every key be joined the same way?", "Join every key's tensors in the list's order.")
    return _check_graph(where, merged[out_key], [o[out_key] for o in outputs], out_key)


def _check_graph(where: str, got: torch.Tensor, parts: list[torch.Tensor], out_key: str) -> Verdict | None:
    """The gathered ``got`` keeps the autograd graph of the replicas' outputs ``parts`` (which require grad
    and retain their grad): a backward from it reaches every one of them."""
    graph_hint = ("The loss is computed on the gathered output, and backward runs from it through the gather to "
                  "every replica: what must gathering keep of the replicas' outputs? (section 3, step 4)")
    graph_closer = ("Join the outputs' tensors themselves, with an operation autograd records: no .detach(), "
                    ".data, .numpy() or .tolist() on the way, and no torch.no_grad().")
    if not got.requires_grad:
        return fail(f"{where}[{out_key!r}] has requires_grad=False, while every replica's output requires grad: "
                    "the gathered output lost its graph, and loss.backward() on it cannot run.",
                    graph_hint, graph_closer)
    try:
        got.sum().backward()
    except Exception as exc:
        return fail(f"backward from {where}[{out_key!r}] raised {type(exc).__name__}: {exc}.", graph_hint,
                    graph_closer)
    cut = [i for i, part in enumerate(parts) if part.grad is None]
    if cut:
        return fail(f"backward from {where}[{out_key!r}] does not reach the output(s) of replica(s) {cut} (of "
                    f"{len(parts)}): the gathered output lost their graph, so their gradients would be missing.",
                    graph_hint, graph_closer)
    return None


@exercise
def check_dict_scatter_gather(scatter_dict: Any, gather_dict: Any) -> Verdict:
    """Exercise: ``scatter_dict(batch, n)`` → list of dicts (one per chunk), ``gather_dict(list) → dict``.

    Batches of 10 on 4 and 8 GPUs, 3 on 4, 8 on 1, and 7 on 3 with other keys than the exercise's example
    (so an answer written for the names image/label/augment fails). Neither function may change what it is
    given. Messages say what the answer's chunks do, not which sizes are right (exercise 7.1 asks those).
    """
    if not callable(scatter_dict) or not callable(gather_dict):
        return fail("expected two functions, scatter_dict(batch, n) and gather_dict(outputs).",
                    "Define both with def, then pass the functions themselves to the checker.",
                    "check_dict_scatter_gather(scatter_dict, gather_dict): no parentheses after the names.")
    for b, n, other_keys in _DICT_CASES:
        verdict, chunks = _check_scatter(scatter_dict, b, n, other_keys)
        if verdict is None:
            verdict = _check_gather(gather_dict, chunks, b, n, other_keys)
        if verdict is not None:
            return verdict
    return ok("scatter_dict and gather_dict round-trip batches of 10 on 4 and 8 GPUs, 3 on 4, 8 on 1, and 7 on 3 "
              "with other keys.")
