"""Checkers for notebook 09 (when it breaks): four broken scripts to diagnose and fix, all on the CPU.

1. `check_predict`: an inference function that keeps autograd graphs alive (and leaves dropout on); the fix must
   leave the caller's grad mode and the model's training mode as it found them, whichever they were.
2. `check_label_loss`: a loss on labels where -1 marks an unlabelled row, which the GPU reports as a device-side
   assert; the fix must be right for every batch, whatever labels it happens to hold, and leave its inputs alone.
3. `check_stable_loss`: a hand-written softmax cross-entropy that turns large logits into NaN; the fix must hold
   however large the logits grow (the checker goes to ±1000: a wider dtype or a clamp only moves the limit).
4. `check_histogram`: counts made with ``put_``, which ``torch.use_deterministic_algorithms(True)`` refuses; the
   fix must be allowed on a GPU too (the checker runs on the CPU and refuses what CUDA would refuse).

Each checker runs the student's function on cases of its own and says what is still wrong: the message names
the mistake, the hint the concept, the closer hint (on ``%hint`` or a second failure) where to look in the code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ..leaks import graph_memory
from . import Verdict, exercise, fail, ok

__all__ = ["CLASSES", "EXP_LIMIT", "UNLABELLED", "broken_histogram", "broken_label_loss", "broken_predict",
           "broken_stable_loss", "check_histogram", "check_label_loss", "check_predict", "check_stable_loss",
           "classifier"]


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def _not_callable(fn: Any, name: str) -> Verdict | None:
    if callable(fn):
        return None
    return fail(f"expected a function, got {type(fn).__name__}.",
                f"pass the function itself, {name}, without calling it.")


def _changed(name: str, before: torch.Tensor, after: torch.Tensor) -> str | None:
    """Where ``after`` (the tensor the student's function was given) no longer equals ``before``, in words."""
    if after.shape == before.shape and torch.equal(after, before):
        return None
    if after.shape != before.shape:
        return f"`{name}` changed shape, from {tuple(before.shape)} to {tuple(after.shape)}"
    where = (after != before).nonzero()
    first = tuple(where[0].tolist())
    spot = ", ".join(str(i) for i in first)
    return (f"`{name}` was changed in place: {len(where)} of its values differ after the call "
            f"({name}[{spot}] was {before[first].item():g}, is now {after[first].item():g})")


# --- 1. inference that keeps graphs --------------------------------------------------------------------

def classifier(seed: int = 0) -> nn.Module:
    """The exercise's model: an MLP with dropout (so train and eval mode give different outputs)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10))


def _batches(sizes: tuple[int, ...] = (64, 64, 64, 64, 64, 37), seed: int = 1) -> list[torch.Tensor]:
    """A report's batches: the last one shorter, as a DataLoader without ``drop_last`` gives them."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 32, generator=gen) for n in sizes]


def broken_predict(model: nn.Module, batches: list[torch.Tensor]) -> torch.Tensor:
    """The class probabilities of every batch, stacked (the script as it was handed in)."""
    probs = []
    for x in batches:
        probs.append(torch.softmax(model(x), dim=1))
    return torch.cat(probs)


_NO_GRAD_BLOCK = ("torch.no_grad() (or torch.inference_mode()) used as a `with` block builds no graph inside it and "
                  "puts back, when the block ends, whatever grad mode was there before.")


@exercise
def check_predict(predict: Callable[[nn.Module, list[torch.Tensor]], Any]) -> Verdict:
    """Exercise 1: ``predict(model, batches)`` returns the stacked class probabilities, computed as for
    inference: the same on every call, and with no autograd graph made or kept. It must leave the caller's grad
    mode, the model's training mode and its parameters' ``requires_grad`` as it found them: it is called once
    from a training loop (grad on, model in training mode) and once from an evaluation loop (inside
    ``torch.no_grad()``, model in evaluation mode). The batches have different sizes (the last one shorter)."""
    if (wrong := _not_callable(predict, "predict")) is not None:
        return wrong
    batches = _batches()
    model = classifier()
    reference = classifier().eval()
    with torch.no_grad():
        want = torch.cat([torch.softmax(reference(x), dim=1) for x in batches])
    grad_was = torch.is_grad_enabled()
    try:
        torch.set_grad_enabled(True)  # called from a training loop: grad on, the model in training mode
        with graph_memory(exclude=model) as meter:
            first = predict(model, batches)
            saved_during = meter.packed > 0
            held = meter.alive_bytes()
        grad_after, training_after = torch.is_grad_enabled(), model.training
        frozen = sum(not p.requires_grad for p in model.parameters())
        torch.set_grad_enabled(True)
        model.train()
        for p in model.parameters():
            p.requires_grad_(True)
        second = predict(model, batches)
        model.eval()  # called from an evaluation loop: inside no_grad, the model in evaluation mode
        with torch.no_grad():
            third = predict(model, batches)
            grad_switched_on = torch.is_grad_enabled()
        left_training = model.training
    except Exception as exc:  # the student's code: report, do not crash
        return fail(f"predict raised {_error(exc)}.",
                    "run the function yourself on a few batches and read the error's last line.",
                    "the checker's batches have 64 rows each but the last, which has 37: does predict assume "
                    "a size?")
    finally:
        torch.set_grad_enabled(grad_was)  # whatever predict did, the rest of the program gets its mode back
    if not isinstance(first, torch.Tensor) or first.shape != want.shape:
        shape = tuple(first.shape) if isinstance(first, torch.Tensor) else type(first).__name__
        return fail(f"predict returned {shape}, expected a tensor of shape {tuple(want.shape)} (one row of "
                    "probabilities per input row, of every batch, the last one of 37 rows included).",
                    "the result is the per-batch probabilities, stacked in order, whatever the batches' sizes.",
                    "torch.cat of the list of per-batch results, as broken_predict returns it.")
    if not torch.equal(first, second):
        return fail("two calls on the same batches give different probabilities: something random is still "
                    "switched on.",
                    "which layer of the model behaves differently in training and in inference?",
                    "model.eval() switches dropout to its inference behaviour (torch.no_grad() does not).")
    if not torch.allclose(first, want, atol=1e-6):
        gap = (first - want).abs().max().item()
        sums = first.sum(dim=1)
        if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
            return fail(f"the rows of the result do not sum to 1 (one sums to {sums[0].item():.3f}): the softmax "
                        "runs over the wrong dimension.", "each row holds one input's probabilities over the 10 "
                        "classes: which dimension are the classes?",
                        "the model's output has shape (rows, classes); broken_predict's softmax is the one to keep.")
        return fail(f"two calls agree, but not with the model in inference mode (largest difference {gap:.3f}): "
                    "is dropout still dropping, the same way on every call? A seed set inside predict makes it "
                    "repeat, not go away.",
                    "which layer of the model behaves differently in training and in inference?",
                    "model.eval() switches dropout to its inference behaviour; a seed does not.")
    if held > 0 or first.requires_grad:
        return fail(f"after predict returned, autograd graphs still hold {held / 1024:.0f} KiB of saved "
                    "tensors (and the result requires grad): every batch's graph lives as long as the result.",
                    "measure it with graph_memory(exclude=model) and meter.alive_bytes(), as in section 1: what "
                    "does a forward pass build by default that inference never uses?",
                    _NO_GRAD_BLOCK)
    if saved_during:
        return fail("nothing is kept any more, but every batch still builds a graph (its saved tensors exist "
                    "until the batch's output is dropped): memory and time spent for a backward that never "
                    "comes.", "graph_memory counts what is saved while predict runs: inference needs none.",
                    "detach() drops a graph after it was built; " + _NO_GRAD_BLOCK)
    if frozen:
        return fail(f"no graph, but predict left {frozen} of the model's {len(list(model.parameters()))} "
                    "parameter tensors with requires_grad=False: the training that follows would not update "
                    "them.", "switch autograd off for the computation, not for the model.", _NO_GRAD_BLOCK)
    if not grad_after:
        return fail("right probabilities, but after predict returned, autograd was still switched off: the "
                    "training step that follows the report would compute no gradients, and raise at backward().",
                    "which tool switches autograd off only for the lines inside it?",
                    "torch.set_grad_enabled(False) changes the mode for the rest of the program. "
                    + _NO_GRAD_BLOCK)
    if not training_after:
        return fail("right probabilities, but predict left the model in evaluation mode: the training that "
                    "follows the report would run without dropout, silently.",
                    "the model was in training mode when predict was called; how can predict put it back?",
                    "model.training says which mode the model is in when predict starts; model.train(mode) sets "
                    "it back.")
    if grad_switched_on:
        return fail("called inside torch.no_grad() (as an evaluation loop calls it), predict returned with "
                    "autograd switched on: it sets a mode at the end instead of putting back the one it found.",
                    "the caller's grad mode can be on or off: predict should leave whichever it was.",
                    "set_grad_enabled(True) at the end forces a mode. " + _NO_GRAD_BLOCK)
    if left_training:
        return fail("called on a model in evaluation mode (as an evaluation loop calls it), predict returned it "
                    "in training mode: it sets a mode at the end instead of putting back the one it found.",
                    "the model can be in either mode when predict is called: predict should leave whichever it "
                    "was.", "model.training says which mode the model is in when predict starts; model.train() "
                    "without an argument always means training.")
    if not isinstance(third, torch.Tensor) or third.shape != want.shape or not torch.allclose(third, want, atol=1e-6):
        return fail("called from an evaluation loop (inside torch.no_grad(), model in evaluation mode), predict "
                    "returned other probabilities than the model's.",
                    "the result must not depend on the mode the caller was in.",
                    "compare the result of a call inside torch.no_grad(), on a model in evaluation mode, with one "
                    "outside it.")
    return ok("the same probabilities on every call, nothing saved for a backward pass, and the caller's grad "
              "mode and the model's training mode as they were, whichever they were.")


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
    """Batches that differ in what they hold: with and without -1, with and without the first and the last class,
    with one labelled row; a fix that is right only for what one batch happens to hold fails one of them."""
    gen = torch.Generator().manual_seed(2)
    return {"a batch with unlabelled rows": (torch.randn(12, CLASSES, generator=gen),
                                             torch.tensor([0, 4, -1, 3, 1, -1, 2, 4, 0, -1, 1, 3])),
            "a batch where every row is labelled": (torch.randn(8, CLASSES, generator=gen),
                                                    torch.tensor([2, 0, 1, 3, 1, 2, 0, 3])),
            "a batch with unlabelled rows and no row of class 0 or 4": (
                torch.randn(9, CLASSES, generator=gen), torch.tensor([3, -1, 1, 2, -1, 3, 1, -1, 2])),
            "a batch with one labelled row": (torch.randn(6, CLASSES, generator=gen),
                                              torch.tensor([-1, -1, 2, -1, -1, -1]))}


def _close(got: torch.Tensor, value: torch.Tensor) -> bool:
    return bool(torch.isfinite(value)) and torch.allclose(got.detach().reshape(()).float(), value, atol=1e-6)


_SKIP_ROWS = ("cross_entropy has an argument for a target value whose rows it skips (its default is -100, not "
              "-1); or select the labelled rows with a boolean mask before the loss.")


def _label_mistake(what: str, got: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor,
                   want: torch.Tensor) -> Verdict:
    """Name the mistake behind a wrong loss on one batch (``got`` is finite and differs from ``want``)."""
    labelled = labels != UNLABELLED
    n_unlabelled = int((~labelled).sum())
    for k in range(CLASSES):
        if n_unlabelled and _close(got, F.cross_entropy(logits, torch.where(labelled, labels, k))):
            how = " (the last class, where -1 wraps around to)" if k == CLASSES - 1 else ""
            return fail(f"no error any more, but on {what} the unlabelled rows train as class {k}{how}: "
                        f"{n_unlabelled} of {len(labels)} rows teach the model a label nobody gave.",
                        "replacing -1 by a class hides the bad index; should a row without a label count in the "
                        "loss at all?", _SKIP_ROWS)
    per_row = F.cross_entropy(logits, labels.clamp(min=0), reduction="none") * labelled
    if n_unlabelled and _close(got, per_row.sum() / len(labels)):
        return fail(f"on {what} the loss is {got.item():.4f}, expected {want.item():.4f}: the sum is divided by "
                    f"every row ({len(labels)}), unlabelled ones included, not by the {int(labelled.sum())} "
                    "labelled ones.", "the mean is over the rows that count.",
                    "reduction='none' followed by .mean() averages over every row, zeros included.")
    if _close(got, per_row.sum()):
        return fail(f"on {what} the loss is {got.item():.4f}: the sum of the labelled rows' losses, not their "
                    f"mean ({want.item():.4f}).", "the batch's loss is a mean: what does a sum do to the step "
                    "size when batches hold more labelled rows?", "look at the reduction the loss uses.")
    for k in range(CLASSES):
        keep = labelled & (labels != k)
        if bool(keep.any()) and int(keep.sum()) < int(labelled.sum()) and _close(
                got, F.cross_entropy(logits[keep], labels[keep])):
            return fail(f"on {what}, the rows of class {k} are left out too: {int(labelled.sum() - keep.sum())} "
                        f"labelled rows count in no loss (the loss is {got.item():.4f}, expected "
                        f"{want.item():.4f}).",
                        "which label marks a row without a class? Is it the same in every batch, whatever labels "
                        "the batch happens to hold?",
                        "compare with UNLABELLED itself, not with a bound or something computed from the batch "
                        "(its smallest label, say).")
    if not bool((~labelled).any()):
        return fail(f"on {what} (no -1 in it) the loss is {got.item():.4f}, but there the plain cross-entropy is "
                    f"right, {want.item():.4f}: the fix changes a batch that needs no fixing.",
                    "what in your function depends on which labels a batch happens to hold?",
                    "a batch without -1 should give exactly what broken_label_loss gives it.")
    return fail(f"on {what} the loss is {got.item():.4f}, expected {want.item():.4f} (the mean cross-entropy of "
                "the labelled rows, over the batch's 5 classes).",
                "which rows have a class, which class, and what does the mean run over?",
                "print labels.min(), labels.max() and logits.shape[1]; keep the logits' 5 columns as they are.")


@exercise
def check_label_loss(label_loss: Callable[[torch.Tensor, torch.Tensor], Any]) -> Verdict:
    """Exercise 2: ``label_loss(logits, labels)`` with labels 0 … CLASSES - 1 and -1 for an unlabelled row: the
    mean cross-entropy over the labelled rows only, on batches with and without unlabelled rows, with and without
    the first and last class, and leaving ``logits`` and ``labels`` as they were (the training script uses them
    after the loss). Compared with ``atol=1e-6``."""
    if (wrong := _not_callable(label_loss, "label_loss")) is not None:
        return wrong
    for what, (logits, labels) in _label_cases().items():
        labelled = labels != UNLABELLED
        want = F.cross_entropy(logits[labelled], labels[labelled])
        given_logits, given_labels = logits.clone(), labels.clone()
        try:
            got = label_loss(given_logits, given_labels)
        except Exception as exc:
            return fail(f"on {what}, label_loss raised {_error(exc)}",
                        "the CPU names the bad value; what does that value mean in this data set?",
                        "-1 is UNLABELLED: a row nobody gave a class to. What should such a row teach the model?")
        for name, before, after in (("labels", labels, given_labels), ("logits", logits, given_logits)):
            if (change := _changed(name, before, after)) is not None:
                return fail(f"on {what}, {change}: the training script reads its batch again after the loss "
                            "(metrics, the count of unlabelled rows), and finds other values.",
                            "a loss reads its inputs and leaves them as they were: work on new tensors.",
                            "an assignment through an index (t[mask] = ...) or an operation ending in _ writes "
                            "into the caller's tensor; a mask can select rows without changing anything.")
        if not isinstance(got, torch.Tensor) or got.numel() != 1:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else repr(got)
            return fail(f"label_loss returned {shape}, expected a scalar loss tensor (the batch's mean).",
                        "return the mean loss, one number, as a tensor (backward() starts from it).",
                        "reduction='none' gives one loss per row; the batch's loss is their mean over the labelled "
                        "rows.")
        if _close(got, want):
            continue
        if not torch.isfinite(got).all():
            return fail(f"on {what} the loss is {got.item()}.", "a mean over no rows is 0 / 0: which rows are left?",
                        "print how many rows your function keeps on this batch; "
                        f"{int(labelled.sum())} of its {len(labels)} rows have a label.")
        return _label_mistake(what, got, logits, labels, want)
    return ok("unlabelled rows are left out of the loss, and every labelled row counts once, on batches with and "
              "without them, whatever classes they hold.")


# --- 3. NaN from a hand-written softmax ------------------------------------------------------------------

def broken_stable_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A hand-written softmax cross-entropy (the script as it was handed in)."""
    e = torch.exp(logits)
    p = e / e.sum(dim=1, keepdim=True)
    return -torch.log(p[torch.arange(len(target)), target]).mean()


EXP_LIMIT = {torch.float32: math.log(torch.finfo(torch.float32).max),  # 88.72: exp overflows above it
             torch.float64: math.log(torch.finfo(torch.float64).max)}  # 709.78
"""The largest x whose exp a dtype holds; a wider dtype moves the limit, it does not remove it."""


def _stable_cases() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Logits of growing size, in batches of different shapes: ordinary ones; up to 200 (where exp overflows
    float32); targets 240 and 300 below their row's largest logit (their probability underflows float32 to 0);
    and logits near ±1000, beyond what exp can hold even in float64 (one row of ties, one far below zero)."""
    gen = torch.Generator().manual_seed(3)
    ordinary = torch.randn(4, 5, generator=gen)
    up_to_200 = (torch.randn(4, 5, generator=gen) * 60 + 100).clamp(max=200)
    far_below = torch.tensor([[0.0, 300.0, 2.0, -5.0], [250.0, 10.0, 0.0, 240.0], [1.0, 2.0, 3.0, 4.0]])
    near_1000 = torch.cat([torch.tensor([[1000.0, -1000.0, 0.0, 500.0, 999.0, 3.0],
                                         [1000.0] * 6,  # a row of ties
                                         [-1000.0] * 5 + [-999.0],  # every logit far below zero
                                         [800.0, 0.0, -3.0, 2.0, 799.5, 1.0]]),
                           torch.randn(1, 6, generator=gen)])
    return {"ordinary logits": (ordinary, torch.tensor([0, 3, 1, 2])),
            "logits up to 200": (up_to_200, torch.tensor([0, 3, 1, 2])),
            "targets 300 and 240 below their row's largest logit": (far_below, torch.tensor([0, 1, 3])),
            "logits near ±1000": (near_1000, torch.tensor([1, 4, 5, 1, 2]))}


_CLAMPS = {"clamp", "clamp_", "clip", "clip_", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_", "minimum",
           "maximum"}
_ADDS = {"add", "add_", "__add__", "__radd__", "__iadd__"}
_LOG_PROBS = ("compute the log-probabilities without forming a probability, as section 4's sigmoid does with "
              "F.logsigmoid (\"A sigmoid by hand\"): PyTorch's log-space function for the softmax works as "
              "(x - max) - log(sum(exp(x - max))); torch.logsumexp's docs name the other half of it.")


@exercise
def check_stable_loss(stable_loss: Callable[[torch.Tensor, torch.Tensor], Any]) -> Verdict:
    """Exercise 3: ``stable_loss(logits, target)``: the mean softmax cross-entropy, with the same values as the
    hand-written loss where it works, and finite values and gradients however large the logits grow: the checker
    goes up to ±1000 (beyond float64's exp, which overflows above 709.78), with targets hundreds below their row's
    largest logit (a probability that underflows to 0), ties and batches of other shapes. ``logits`` (a model's
    output in a training step: not a leaf) must be left as it was. Values are compared with rtol=1e-4,
    atol=1e-5; gradients with rtol=1e-4, atol=1e-6."""
    if (wrong := _not_callable(stable_loss, "stable_loss")) is not None:
        return wrong
    for what, (logits, target) in _stable_cases().items():
        leaf = logits.clone().requires_grad_(True)
        x = leaf * 1  # a model's output: not a leaf, so an in-place change is possible and shows
        ref = logits.clone().requires_grad_(True)
        want = F.cross_entropy(ref, target)
        want.backward()
        try:
            with _OpsCalled() as called:
                got = stable_loss(x, target.clone())
        except Exception as exc:
            return fail(f"on {what} ({len(target)} rows of {logits.shape[1]} logits), stable_loss raised "
                        f"{_error(exc)}", "run it on a batch of another size and read the error's last line.",
                        "does a line assume the batch's size or the number of classes?")
        if (change := _changed("logits", logits, x.detach())) is not None:
            return fail(f"on {what}, {change}: the training step reads its logits again after the loss "
                        "(accuracy, a log), and finds other values.",
                        "a loss reads its inputs and leaves them as they were: work on new tensors.",
                        "`x -= ...` on a tensor is an in-place operation (x.sub_); `x = x - ...` makes a new one.")
        if not isinstance(got, torch.Tensor) or got.numel() != 1:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else repr(got)
            return fail(f"stable_loss returned {shape}, expected the batch's mean loss (one number, as a tensor).",
                        "the hand-written loss returns a mean over the batch: keep it so.",
                        "pick each row's value at its target, then take the mean over the rows.")
        names = {name for name, _, _ in called.calls}
        clamped = sorted(names & _CLAMPS)
        epsilon = [a for name, args, _ in called.calls if name in _ADDS for a in args
                   if isinstance(a, float) and 0 < a < 1e-3]
        wide = any(isinstance(a, torch.Tensor) and a.dtype == torch.float64 for _, args, _ in called.calls
                   for a in args)
        dtype = "float64" if wide else "float32"
        try:
            got.backward()
        except Exception as exc:
            return fail(f"on {what}, the backward of stable_loss raised {_error(exc)}",
                        "a training step calls backward() on the loss: every operation must have a gradient.",
                        "detach(), .item() or a trip through NumPy cuts the graph: build the loss from the logits "
                        "with torch operations.")
        value = got.detach().reshape(())
        if not torch.isfinite(value):
            gaps = logits.amax(dim=1) - logits[torch.arange(len(target)), target]
            worst = gaps.max()
            if value.item() == math.inf and torch.exp(-worst.to(torch.float64 if wide else torch.float32)) == 0:
                why = [f"on {what} the loss is inf: a target {worst.item():.0f} below its row's largest logit has a "
                       f"probability of e^-{worst.item():.0f}, which is 0 in {dtype}, and log(0) = -inf."]
                if names & {"max", "amax"}:
                    why.append("Subtracting the row's largest logit cures the overflow, not this underflow.")
                if wide:
                    why.append("float64 moves the limit (to about e^-745), it does not remove it.")
                if clamped:
                    why.append(f"{clamped[0]} moves it too.")
                return fail(" ".join(why), "does the loss need the probability itself, or only its log?", _LOG_PROBS)
            if wide:
                return fail(f"on {what} the loss is {value.item()}: computed in float64, exp overflows above "
                            f"{EXP_LIMIT[torch.float64]:.2f} (and underflows to 0 far below zero): a wider dtype "
                            "moves the limit, it does not remove it.",
                            "which intermediate tensor is inf or 0 here? A fix should not depend on how large the "
                            "logits are.", _LOG_PROBS)
            edge = (f" {clamped[0]} keeps each exp just inside float32's range (up to e^"
                    f"{EXP_LIMIT[torch.float32]:.2f}), but their sum over a row still overflows, or rounds past it."
                    if clamped else "")
            return fail(f"on {what} the loss is {value.item()}.{edge}", "torch.isfinite on each intermediate tensor of "
                        "the forward says which operation first makes inf or NaN (set_detect_anomaly only checks "
                        "the backward).", "exp(x) is inf in float32 for x above "
                        f"{EXP_LIMIT[torch.float32]:.2f}; section 4 (\"A sigmoid by hand\") shows how a loss gets "
                        "log-probabilities without it.")
        if leaf.grad is None or not torch.isfinite(leaf.grad).all():
            return fail(f"on {what} the loss is finite but its gradient is not: {leaf.grad}.",
                        "a finite value can hide an inf inside (nan_to_num, a clamp after the fact); "
                        "set_detect_anomaly(True) names the backward function that made it.", _LOG_PROBS)
        if not torch.allclose(value, want, rtol=1e-4, atol=1e-5):
            if torch.allclose(value, want * len(target), rtol=1e-4, atol=1e-5):
                return fail(f"on {what} the loss is {value.item():.5f}: the sum over the batch, not the mean "
                            f"({want.item():.5f}).", "the hand-written loss returns a mean over the batch.",
                            "look at the reduction at the end: a mean over the batch's rows.")
            how = (f" {clamped[0]} changes the logits (or the probabilities) where it bites: the fix only moves "
                   "the limit." if clamped else "")
            if epsilon:
                how += (f" The {epsilon[0]:g} added to a probability sets a floor under it: its log is wrong "
                        "wherever the probability is smaller than that.")
            return fail(f"on {what} the loss is {value.item():.5f}, the cross-entropy is {want.item():.5f}.{how}",
                        "the fix must not change the values: clamping the logits or adding an epsilon does.",
                        _LOG_PROBS)
        reference = ref.grad if ref.grad is not None else torch.zeros_like(logits)
        if not torch.allclose(leaf.grad, reference, rtol=1e-4, atol=1e-6):
            return fail(f"on {what} the gradient differs from the cross-entropy's (largest difference "
                        f"{(leaf.grad - reference).abs().max().item():.2g}).",
                        "keep the loss a smooth function of every logit: no clamp, no detach() on what depends "
                        "on the target's logit.", _LOG_PROBS)
    return ok("finite values and gradients, equal to the cross-entropy's, for logits from ordinary to ±1000, "
              "targets far below their row's largest logit included.")


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
    """Ids that repeat, with bins of two sizes: a fix written for 10 bins, or sized by the largest id, fails."""
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 7, (200,), generator=gen)
    ids[:3] = 9  # the last bin, and bin 8 left empty
    sparse = torch.randint(0, 6, (50,), generator=gen)  # of 13 bins, the last seven empty
    return {"ids up to the last bin": (ids, torch.bincount(ids, minlength=10).float()),
            "ids that leave the last bins empty": (sparse, torch.bincount(sparse, minlength=13).float())}


_COUNTING = ("the docstring of torch.use_deterministic_algorithms (section 5) lists the operations that switch to "
             "a deterministic version and those that raise, with their conditions: an operation made for counting "
             "is in the second list only under a condition your call can avoid.")


@exercise
def check_histogram(histogram: Callable[[torch.Tensor, int], Any]) -> Verdict:
    """Exercise 4: ``histogram(ids, bins)`` returns the counts of each id 0 … bins - 1 (float or integer), with
    ``torch.use_deterministic_algorithms(True)`` on, using only operations that CUDA also allows then, for any
    number of bins (the checker asks for 10 and 13); it leaves ``ids``, and the setting (with its ``warn_only``),
    as it found them."""
    if (wrong := _not_callable(histogram, "histogram")) is not None:
        return wrong
    saved, saved_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    for what, (ids, want) in _histogram_cases().items():
        given = ids.clone()
        torch.use_deterministic_algorithms(True)
        try:
            with _OpsCalled() as called:
                got = histogram(given, len(want))
            still_on = torch.are_deterministic_algorithms_enabled()
            warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        except Exception as exc:
            return fail(f"with deterministic algorithms on, histogram raised {_error(exc)}",
                        "the message names the operation; find one that both counts repeated ids and has a "
                        "deterministic implementation.", _COUNTING)
        finally:
            torch.use_deterministic_algorithms(saved, warn_only=saved_warn)
        if not still_on or warn_only:
            return fail("histogram switched deterministic algorithms off (or to warnings only): the error is gone, "
                        "and so is the guarantee for the rest of the program.", "keep the setting; change the operation.",
                        "the setting belongs to the caller: histogram should not call use_deterministic_algorithms. "
                        + _COUNTING)
        if (change := _changed("ids", ids, given)) is not None:
            return fail(f"on {what}, {change}: the caller's ids are not the caller's any more.",
                        "a function that counts reads its input and leaves it as it was.",
                        "an operation ending in _ (sort_, clamp_) or an assignment through an index writes into "
                        "the caller's tensor.")
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            return fail(f"on {what}, expected a tensor of {len(want)} counts (bins={len(want)}), got "
                        f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}.",
                        "one count per bin the caller asks for, empty bins at the end included: the ids of one "
                        "call need not reach the last bin.",
                        "the result's length must come from bins, not from the ids (their largest value) nor from "
                        "a number written in the function.")
        if torch.equal(got.float(), (want > 0).float()):
            return fail("every bin that occurs holds 1: a repeated id overwrites instead of adding up (and which "
                        "write wins is not defined: that is why deterministic mode refused put_).",
                        "an operation made for counting adds repeated ids up; the docstring of "
                        "torch.use_deterministic_algorithms lists what it allows on each device.",
                        "counts[ids] = ... writes once per distinct id, whatever its right-hand side; an operation "
                        "that adds at indices adds once per occurrence.")
        if not torch.equal(got.float(), want):
            return fail(f"on {what}, the counts are {got.tolist()}, expected {want.tolist()}.",
                        "count each id once per occurrence.",
                        "check the result on ids = torch.tensor([1, 1, 3]) and bins = 5 by hand: [0, 2, 0, 1, 0].")
        refused = sorted(name for name, args, kwargs in called.calls
                         if name in _REFUSED_ON_CUDA and _REFUSED_ON_CUDA[name](args, kwargs))
        if refused:
            return fail(f"the right counts here, but with deterministic algorithms on, {refused[0]} as called here "
                        "raises on a CUDA tensor (the CPU allows it): the same function fails on a GPU.",
                        "the docstring of torch.use_deterministic_algorithms lists what it refuses on each device; "
                        "pick an operation made for counting that it allows on both.", _COUNTING)
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
