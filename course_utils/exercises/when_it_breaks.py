"""Checkers for notebook 09 (when it breaks): four broken scripts to diagnose and fix, all on the CPU.

1. `check_predict`: an inference function that keeps autograd graphs alive (and leaves dropout on); the fix must
   leave the caller's grad mode and the model's training mode as it found them.
2. `check_label_loss`: a loss on labels where -1 marks an unlabelled row, which the GPU reports as a device-side
   assert.
3. `check_stable_loss`: a hand-written softmax cross-entropy that turns large logits into NaN.
4. `check_histogram`: counts made with ``put_``, which ``torch.use_deterministic_algorithms(True)`` refuses; the
   fix must be allowed on a GPU too (the checker runs on the CPU and refuses what CUDA would refuse).

Each checker runs the student's function on cases of its own and says what is still wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ..leaks import graph_memory
from . import Verdict, fail, ok

__all__ = ["CLASSES", "UNLABELLED", "broken_histogram", "broken_label_loss", "broken_predict", "broken_stable_loss",
           "check_histogram", "check_label_loss", "check_predict", "check_stable_loss", "classifier"]


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


# --- 1. inference that keeps graphs --------------------------------------------------------------------

def classifier(seed: int = 0) -> nn.Module:
    """The exercise's model: an MLP with dropout (so train and eval mode give different outputs)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10))


def _batches(n: int = 6, seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(64, 32, generator=gen) for _ in range(n)]


def broken_predict(model: nn.Module, batches: list[torch.Tensor]) -> torch.Tensor:
    """The class probabilities of every batch, stacked (the script as it was handed in)."""
    probs = []
    for x in batches:
        probs.append(torch.softmax(model(x), dim=1))
    return torch.cat(probs)


def check_predict(predict: Callable[[nn.Module, list[torch.Tensor]], Any]) -> Verdict:
    """Exercise 1: ``predict(model, batches)`` returns the stacked class probabilities, computed as for
    inference: the same on every call, and with no autograd graph made or kept."""
    if not callable(predict):
        return fail(f"expected a function, got {type(predict).__name__}.", "pass the function itself: predict")
    batches = _batches()
    model = classifier()
    reference = classifier().eval()
    with torch.no_grad():
        want = torch.cat([torch.softmax(reference(x), dim=1) for x in batches])
    grad_was = torch.is_grad_enabled()
    try:
        with graph_memory(exclude=model) as meter:
            first = predict(model, batches)
            saved_during = meter.packed > 0
            held = meter.alive_bytes()
        grad_after, training_after = torch.is_grad_enabled(), model.training
        torch.set_grad_enabled(grad_was)
        model.train()
        second = predict(model, batches)
    except Exception as exc:  # the student's code: report, do not crash
        return fail(f"predict raised {_error(exc)}.", "run the function once on a few batches and read the error.")
    finally:
        torch.set_grad_enabled(grad_was)  # whatever predict did, the rest of the program gets its mode back
    if not isinstance(first, torch.Tensor) or first.shape != want.shape:
        shape = tuple(first.shape) if isinstance(first, torch.Tensor) else type(first).__name__
        return fail(f"predict returned {shape}, expected a tensor of shape {tuple(want.shape)} (one row of "
                    "probabilities per input).", "keep returning torch.cat of the per-batch probabilities.")
    if not torch.equal(first, second) or not torch.allclose(first, want, atol=1e-6):
        return fail("two calls give different probabilities, or not those of the model in inference mode: "
                    "something random is still switched on.",
                    "compare two calls with torch.equal; which layer of the model behaves differently in "
                    "training and in inference?")
    if held > 0 or first.requires_grad:
        return fail(f"after predict returned, autograd graphs still hold {held / 1024:.0f} KiB of saved "
                    "tensors (and the result requires grad): every batch's graph lives as long as the result.",
                    "measure it with graph_memory(exclude=model) and meter.alive_bytes(), as in section 1.")
    if saved_during:
        return fail("nothing is kept any more, but every batch still builds a graph (its saved tensors exist "
                    "until the batch's output is dropped): memory and time spent for a backward that never "
                    "comes.", "graph_memory counts what is saved while predict runs: inference needs none.")
    if not grad_after:
        return fail("right probabilities, but after predict returned, autograd was still switched off: the "
                    "training step that follows the report would compute no gradients, and raise at backward().",
                    "which tool switches autograd off only for the lines inside it?")
    if not training_after:
        return fail("right probabilities, but predict left the model in evaluation mode: the training that "
                    "follows the report would run without dropout, silently.",
                    "the model was in training mode when predict was called; how can predict put it back?")
    return ok("the same probabilities on every call, nothing saved for a backward pass, and the caller's grad "
              "mode and the model's training mode as they were.")


# --- 2. rows without a label ------------------------------------------------------------------------------

CLASSES = 5
"""Classes of exercise 2: columns 0 … 4 of the logits; the CSV writes -1 where a row has no label yet."""

UNLABELLED = -1
"""The CSV's mark for a row nobody has labelled yet."""


def broken_label_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss as it was handed in (``labels`` as read from the CSV: 0 … CLASSES - 1, or -1 for a row without
    a label)."""
    return F.cross_entropy(logits, labels)


def _label_cases() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(2)
    return {"a batch with unlabelled rows": (torch.randn(12, CLASSES, generator=gen),
                                             torch.tensor([0, 4, -1, 3, 1, -1, 2, 4, 0, -1, 1, 3])),
            "a batch where every row is labelled": (torch.randn(8, CLASSES, generator=gen),
                                                    torch.tensor([2, 0, 1, 3, 1, 2, 0, 3])),
            "a batch with one labelled row": (torch.randn(6, CLASSES, generator=gen),
                                              torch.tensor([-1, -1, 2, -1, -1, -1]))}


def check_label_loss(label_loss: Callable[[torch.Tensor, torch.Tensor], Any]) -> Verdict:
    """Exercise 2: ``label_loss(logits, labels)`` with labels 0 … CLASSES - 1 and -1 for an unlabelled row: the
    mean cross-entropy over the labelled rows only, on batches with and without unlabelled rows."""
    if not callable(label_loss):
        return fail(f"expected a function, got {type(label_loss).__name__}.", "pass the function itself")
    for what, (logits, labels) in _label_cases().items():
        labelled = labels != UNLABELLED
        want = F.cross_entropy(logits[labelled], labels[labelled])
        try:
            got = label_loss(logits.clone(), labels.clone())
        except Exception as exc:
            return fail(f"on {what}, label_loss raised {_error(exc)}",
                        "the CPU names the bad value; what does that value mean in this data set?")
        if not isinstance(got, torch.Tensor) or got.numel() != 1:
            return fail(f"label_loss returned {got!r}, expected a scalar loss tensor.", "return the mean loss.")
        if torch.allclose(got, want, atol=1e-6):
            continue
        if not torch.isfinite(got).all():
            return fail(f"on {what} the loss is {got.item()}.", "a mean over no rows is 0 / 0: which rows are left?")
        if torch.allclose(got, F.cross_entropy(logits, labels.clamp(min=0)), atol=1e-6):
            return fail(f"no error any more, but on {what} the unlabelled rows train as class 0: "
                        f"{int((~labelled).sum())} of {len(labels)} rows teach the model a label nobody gave.",
                        "clamping hides the bad index; should a row without a label count in the loss at all?")
        if torch.allclose(got, F.cross_entropy(logits, labels % CLASSES), atol=1e-6):
            return fail(f"no error any more, but on {what} -1 wraps around to the last class: the unlabelled "
                        "rows train as class 4.", "should a row without a label count in the loss at all?")
        if torch.allclose(got, F.cross_entropy(logits, labels.clamp(min=0), reduction="sum") / len(labels),
                          atol=1e-6) or torch.allclose(
                got, F.cross_entropy(logits[labelled], labels[labelled], reduction="sum") / len(labels), atol=1e-6):
            return fail(f"on {what} the loss is {got.item():.4f}, expected {want.item():.4f}: the sum is "
                        "divided by every row, unlabelled ones included.",
                        "the mean is over the rows that count.")
        return fail(f"on {what} the loss is {got.item():.4f}, expected {want.item():.4f} (the mean "
                    "cross-entropy of the labelled rows).",
                    "print labels.min(), labels.max() and logits.shape[1]: which rows have a class?")
    return ok("unlabelled rows are left out of the loss, and every labelled row counts once, on batches with and "
              "without them.")


# --- 3. NaN from a hand-written softmax ------------------------------------------------------------------

def broken_stable_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A hand-written softmax cross-entropy (the script as it was handed in)."""
    e = torch.exp(logits)
    p = e / e.sum(dim=1, keepdim=True)
    return -torch.log(p[torch.arange(len(target)), target]).mean()


def check_stable_loss(stable_loss: Callable[[torch.Tensor, torch.Tensor], Any]) -> Verdict:
    """Exercise 3: ``stable_loss(logits, target)``: the same values as the hand-written loss where it
    works, and finite values and gradients for logits as large as 200."""
    if not callable(stable_loss):
        return fail(f"expected a function, got {type(stable_loss).__name__}.", "pass the function itself")
    gen = torch.Generator().manual_seed(3)
    target = torch.tensor([0, 3, 1, 2])
    cases = {"ordinary logits": torch.randn(4, 5, generator=gen),
             "logits up to 200": (torch.randn(4, 5, generator=gen) * 60 + 100).clamp(max=200)}
    for what, logits in cases.items():
        x = logits.clone().requires_grad_(True)
        ref = logits.clone().requires_grad_(True)
        want = F.cross_entropy(ref, target)
        want.backward()
        try:
            got = stable_loss(x, target)
            got.backward()
        except Exception as exc:
            return fail(f"on {what}, stable_loss (or its backward) raised {_error(exc)}",
                        "call it on a batch, then backward(), as a training step does.")
        if not torch.isfinite(got).all():
            return fail(f"on {what} the loss is {got.item()}.", "torch.isfinite on each intermediate tensor of the "
                        "forward says which operation first makes inf or NaN (set_detect_anomaly only checks the backward).")
        if x.grad is None or not torch.isfinite(x.grad).all():
            return fail(f"on {what} the loss is finite but its gradient is not: {x.grad}.",
                        "a finite value can hide an inf inside (nan_to_num, a clamp after the fact); "
                        "set_detect_anomaly(True) names the backward function that made it.")
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
            return fail(f"on {what} the loss is {got.item():.5f}, the cross-entropy is {want.item():.5f}.",
                        "the fix must not change the values: clamping the logits or adding an epsilon does.")
        if ref.grad is None or not torch.allclose(x.grad, ref.grad, rtol=1e-4, atol=1e-6):
            return fail(f"on {what} the gradient differs from the cross-entropy's.",
                        "keep the loss a smooth function of every logit.")
    return ok("finite values and gradients, equal to the cross-entropy's, on large logits too.")


# --- 4. counts that determinism refuses --------------------------------------------------------------------

def broken_histogram(ids: torch.Tensor, bins: int) -> torch.Tensor:
    """How often each id in ``ids`` occurs, for ids ``0 … bins - 1`` (the script as it was handed in)."""
    counts = torch.zeros(bins)
    counts.put_(ids, torch.ones(len(ids)))
    return counts


# What CUDA refuses under deterministic algorithms (the docstring of torch.use_deterministic_algorithms, "will
# throw a RuntimeError"), for the functions a histogram could be made with; the CPU allows some of them.
_REFUSED_ON_CUDA: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], bool]] = {
    "histc": lambda args, kwargs: True,
    "bincount": lambda args, kwargs: kwargs.get("weights") is not None or (len(args) > 1 and args[1] is not None),
    "put_": lambda args, kwargs: True,  # accumulate=False raises everywhere, accumulate=True on CUDA
    "put": lambda args, kwargs: True,
    "cumsum": lambda args, kwargs: isinstance(args[0], torch.Tensor) and (
        (kwargs.get("dtype") or args[0].dtype).is_floating_point),
    "scatter_reduce": lambda args, kwargs: (kwargs.get("reduce") or (args[3] if len(args) > 3 else None)) == "prod",
    "scatter_reduce_": lambda args, kwargs: (kwargs.get("reduce") or (args[3] if len(args) > 3 else None)) == "prod",
}


def _histogram_cases() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 7, (200,), generator=gen)
    ids[:3] = 9  # the last bin, and bin 8 left empty
    sparse = torch.randint(0, 6, (50,), generator=gen)  # the last four bins empty
    return {"ids up to the last bin": (ids, torch.bincount(ids, minlength=10).float()),
            "ids that leave the last bins empty": (sparse, torch.bincount(sparse, minlength=10).float())}


def check_histogram(histogram: Callable[[torch.Tensor, int], Any]) -> Verdict:
    """Exercise 4: ``histogram(ids, bins)`` returns float counts of each id, with
    ``torch.use_deterministic_algorithms(True)`` on, using only operations that CUDA also allows then, and
    leaves that setting (and its ``warn_only``) as it found it."""
    if not callable(histogram):
        return fail(f"expected a function, got {type(histogram).__name__}.", "pass the function itself")
    saved, saved_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    for what, (ids, want) in _histogram_cases().items():
        torch.use_deterministic_algorithms(True)
        try:
            with _OpsCalled() as called:
                got = histogram(ids.clone(), len(want))
            still_on = torch.are_deterministic_algorithms_enabled()
            warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        except Exception as exc:
            return fail(f"with deterministic algorithms on, histogram raised {_error(exc)}",
                        "the message names the operation; find one that both counts repeated ids and has a "
                        "deterministic implementation.")
        finally:
            torch.use_deterministic_algorithms(saved, warn_only=saved_warn)
        if not still_on or warn_only:
            return fail("histogram switched deterministic algorithms off (or to warnings only): the error is gone, "
                        "and so is the guarantee for the rest of the program.", "keep the setting; change the operation.")
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            return fail(f"on {what}, expected a tensor of {len(want)} counts, got "
                        f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}.",
                        "one count per bin, empty bins at the end included.")
        if torch.equal(got.float(), (want > 0).float()):
            return fail("every bin that occurs holds 1: a repeated id overwrites instead of adding up (and which "
                        "write wins is not defined: that is why deterministic mode refused put_).",
                        "an operation made for counting adds repeated ids up; the docstring of "
                        "torch.use_deterministic_algorithms lists what it allows on each device.")
        if not torch.equal(got.float(), want):
            return fail(f"on {what}, the counts are {got.tolist()}, expected {want.tolist()}.",
                        "count each id once per occurrence.")
        refused = sorted(name for name, args, kwargs in called.calls
                         if name in _REFUSED_ON_CUDA and _REFUSED_ON_CUDA[name](args, kwargs))
        if refused:
            return fail(f"the right counts here, but with deterministic algorithms on, {refused[0]} as called here "
                        "raises on a CUDA tensor (the CPU allows it): the same function fails on a GPU.",
                        "the docstring of torch.use_deterministic_algorithms lists what it refuses on each device; "
                        "pick an operation made for counting that it allows on both.")
    return ok("the right counts, empty bins included, with deterministic algorithms on, with operations a GPU "
              "allows too.")


class _OpsCalled(TorchFunctionMode):
    """The torch functions and tensor methods called inside it, with their arguments: ``calls`` holds
    ``(name, args, kwargs)`` (``put_``, ``bincount``, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls.append((getattr(func, "__name__", ""), tuple(args), dict(kwargs or {})))
        return func(*args, **(kwargs or {}))
