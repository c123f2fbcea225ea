"""Checkers for notebook 09 (when it breaks): four broken scripts to diagnose and fix, all on the CPU.

1. `check_predict`: an inference function that keeps autograd graphs alive (and leaves dropout on).
2. `check_label_loss`: a loss on labels numbered from 1, which the GPU reports as a device-side assert.
3. `check_stable_loss`: a hand-written softmax cross-entropy that turns large logits into NaN.
4. `check_histogram`: counts made with ``put_``, which ``torch.use_deterministic_algorithms(True)`` refuses.

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

__all__ = ["CLASSES", "broken_histogram", "broken_label_loss", "broken_predict", "broken_stable_loss",
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
    try:
        with graph_memory(exclude=model) as meter:
            first = predict(model, batches)
            saved_during = meter.packed > 0
            held = meter.alive_bytes()
        second = predict(model, batches)
    except Exception as exc:  # the student's code: report, do not crash
        return fail(f"predict raised {_error(exc)}.", "run the function once on a few batches and read the error.")
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
    return ok("the same probabilities on every call, and nothing saved for a backward pass.")


# --- 2. labels numbered from 1 ---------------------------------------------------------------------------

CLASSES = 5
"""Classes of exercise 2: a CSV names them 1 … 5."""


def broken_label_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss as it was handed in (``labels`` as read from the CSV: 1 … CLASSES)."""
    return F.cross_entropy(logits, labels)


def check_label_loss(label_loss: Callable[[torch.Tensor, torch.Tensor], Any]) -> Verdict:
    """Exercise 2: ``label_loss(logits, labels)`` with labels 1 … CLASSES from the CSV: the cross-entropy
    with class k in logit column k - 1, for every label, the largest included."""
    if not callable(label_loss):
        return fail(f"expected a function, got {type(label_loss).__name__}.", "pass the function itself")
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(12, CLASSES, generator=gen)
    labels = torch.tensor([1, 2, 3, 4, 5, 5, 1, 3, 5, 2, 4, 5])
    want = F.cross_entropy(logits, labels - 1)
    try:
        got = label_loss(logits.clone(), labels.clone())
    except Exception as exc:
        return fail(f"label_loss raised {_error(exc)}", "the CPU names the bad value; compare labels.min() and "
                    "labels.max() with the number of logit columns.")
    if not isinstance(got, torch.Tensor) or got.numel() != 1:
        return fail(f"label_loss returned {got!r}, expected a scalar loss tensor.", "return the mean loss.")
    if torch.allclose(got, want, atol=1e-6):
        return ok("every label lands in its own logit column.")
    top = labels == CLASSES
    if torch.allclose(got, F.cross_entropy(logits, labels.clamp(max=CLASSES - 1)), atol=1e-6):
        return fail("no error any more, but labels 5 and 4 now share column 4, and column 0 is never a target: "
                    f"{int(top.sum())} of {len(labels)} rows train the wrong class.",
                    "clamping hides the bad index; look at which column each label value should use.")
    if torch.allclose(got, F.cross_entropy(logits, labels % CLASSES), atol=1e-6):
        return fail("no error any more, but label 5 wraps around to column 0, where label 1 should be, and "
                    "labels 1 … 4 land one column too far.", "compare labels.min() with 0, the first column.")
    return fail(f"the loss is {got.item():.4f}, expected {want.item():.4f}.",
                "print labels.min(), labels.max() and logits.shape[1]: which column should each label use?")


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


def check_histogram(histogram: Callable[[torch.Tensor, int], Any]) -> Verdict:
    """Exercise 4: ``histogram(ids, bins)`` returns float counts of each id, with
    ``torch.use_deterministic_algorithms(True)`` on, and leaves that setting as it found it."""
    if not callable(histogram):
        return fail(f"expected a function, got {type(histogram).__name__}.", "pass the function itself")
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 7, (200,), generator=gen)
    ids[:3] = 9  # the last bin, and bin 8 left empty
    want = torch.bincount(ids, minlength=10).float()
    saved = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with _OpsCalled() as called:
            got = histogram(ids.clone(), 10)
        still_on = torch.are_deterministic_algorithms_enabled()
    except Exception as exc:
        return fail(f"with deterministic algorithms on, histogram raised {_error(exc)}",
                    "the message names the operation; find one that both counts repeated ids and has a "
                    "deterministic implementation.")
    finally:
        torch.use_deterministic_algorithms(saved)
    if not still_on:
        return fail("histogram switched deterministic algorithms off: the error is gone, and so is the "
                    "guarantee for the rest of the program.", "keep the setting; change the operation.")
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return fail(f"expected a tensor of {len(want)} counts, got "
                    f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}.",
                    "one count per bin, empty bins included.")
    if torch.equal(got.float(), (want > 0).float()):
        return fail("every bin that occurs holds 1: a repeated id overwrites instead of adding up (and which "
                    "write wins is not defined: that is why deterministic mode refused put_).",
                    "an operation made for counting adds repeated ids up; the docstring of "
                    "torch.use_deterministic_algorithms lists what it allows on each device.")
    if not torch.equal(got.float(), want):
        return fail(f"the counts are {got.tolist()}, expected {want.tolist()}.", "count each id once per occurrence.")
    if "put_" in called.names or "put" in called.names:
        return fail("the right counts here, but put_(accumulate=True) is deterministic only on the CPU: with "
                    "deterministic algorithms on, the same call on a CUDA tensor raises.",
                    "the docstring of torch.use_deterministic_algorithms lists what it allows on each device; "
                    "pick an operation made for counting that it allows on both.")
    return ok("the right counts, with deterministic algorithms on.")


class _OpsCalled(TorchFunctionMode):
    """The names of the torch functions and tensor methods called inside it (``put_``, ``bincount``, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.add(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))
