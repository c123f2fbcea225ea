"""Checkers for notebook 09 (when it breaks): four broken scripts to diagnose and fix, all on the CPU.

1. `check_predict`: an inference function that keeps autograd graphs alive (and leaves dropout on); the fix must
   leave the caller's grad mode and the model's training mode as it found them, whichever they were, and the
   model's settings, weights and requires_grad flags and the caller's batches (the list and its tensors) too.
2. `check_label_loss`: a loss on labels where -1 marks an unlabelled row, which the GPU reports as a device-side
   assert; the fix must be right for every batch, whatever labels it happens to hold, leave its inputs alone, and
   keep the loss's gradient (a detached loss trains nothing).
3. `check_stable_loss`: a hand-written softmax cross-entropy that turns large logits into NaN; the fix must hold
   however large the logits grow (the checker goes to ±1000: a wider dtype or a clamp only moves the limit).
4. `check_histogram`: counts made with ``put_``, which ``torch.use_deterministic_algorithms(True)`` refuses; the
   fix must be allowed on a GPU too (the checker runs on the CPU and refuses what CUDA would refuse under the
   setting, then runs the function once more with the ids on the ``meta`` device, to catch what works on the CPU
   only: see `_off_the_cpu`).

Each checker runs the student's function on cases of its own and says what is still wrong: the message names
the mistake, the hint the concept, the closer hint (on ``%hint`` or a second failure) where to look in the code.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ..formatting import error_message
from ..memory.leaks import graph_memory
from . import Verdict, exercise, fail, ok

# PyTorch documents __torch_dispatch__ modes with this class ("Extending PyTorch"), in a module whose name starts
# with an underscore, which `import torch` has already loaded (as course_utils.performance.cuda_graph_standin does).
TorchDispatchMode: Any = torch.utils._python_dispatch.TorchDispatchMode


__all__ = ["CLASSES", "EXP_LIMIT", "UNLABELLED", "broken_histogram", "broken_label_loss", "broken_predict",
           "broken_stable_loss", "check_histogram", "check_label_loss", "check_predict", "check_stable_loss",
           "classifier"]



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


def _fine_tuned(seed: int = 0) -> nn.Module:
    """A model as a fine-tuning loop holds it: training mode, but its first layer frozen (requires_grad False)
    and its BatchNorm kept in evaluation mode (its running statistics fixed)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10))
    model.train()
    model[1].eval()
    for p in model[0].parameters():
        p.requires_grad_(False)
    return model


def _module(model: nn.Module, name: str) -> str:
    """``model.2`` (Dropout): a submodule named for a message."""
    part = model.get_submodule(name) if name else model
    return f"`model{'.' + name if name else ''}` ({type(part).__name__})"


def _settings(model: nn.Module) -> dict[tuple[str, str], Any]:
    """Each module's plain settings (a Dropout's ``p``, a BatchNorm's ``momentum``, ...), its mode left out."""
    return {(name, attr): value for name, module in model.named_modules() for attr, value in vars(module).items()
            if not attr.startswith("_") and attr != "training"
            and isinstance(value, (bool, int, float, str, tuple, type(None)))}


def _model_changed(model: nn.Module, settings: dict[tuple[str, str], Any],
                   tensors: dict[str, torch.Tensor]) -> str | None:
    """How ``model`` no longer matches the settings and parameter (and buffer) values taken before, in words."""
    now = _settings(model)
    for (name, attr), value in settings.items():
        if now.get((name, attr), value) != value:
            return f"{_module(model, name)} has {attr} = {now[(name, attr)]!r}, was {value!r}"
    current = dict(model.named_parameters()) | dict(model.named_buffers())
    for name, before in tensors.items():
        after = current.get(name)
        if after is None or after.shape != before.shape or not torch.equal(after.detach(), before):
            return f"`model.{name}` holds other values than before the call"
    return None


def _batches_changed(batches: Any, kept: list[torch.Tensor], values: list[torch.Tensor]) -> str | None:
    """How the caller's list of batches was used up or changed in place, in words; None if it was not."""
    if not isinstance(batches, list) or len(batches) != len(kept):
        held = len(batches) if isinstance(batches, list) else type(batches).__name__
        return (f"the caller's list `batches` held {len(kept)} batches before the call and {held} after it: predict "
                "used the list up (pop, del, clear), and the caller has no batches left for its next use")
    for i, (now, was) in enumerate(zip(batches, kept, strict=True)):
        if now is not was:
            return (f"the caller's list `batches` holds another tensor at position {i} after the call: predict "
                    "replaced the caller's batch in the list")
    for i, (now, before) in enumerate(zip(kept, values, strict=True)):
        if (change := _changed(f"batches[{i}]", before, now.detach())) is not None:
            return f"{change}: predict changed the caller's batches in place"
    return None


class _Stop(Exception):  # noqa: N818 - not an error: carries a verdict out of the block that runs predict
    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.message)
        self.verdict = verdict


def _as64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float64)


_INPUTS_HINT = "predict reads the caller's model and batches: it leaves them as it found them."

_NO_GRAD_BLOCK = ("torch.no_grad() (or torch.inference_mode()) used as a `with` block builds no graph inside it and "
                  "puts back, when the block ends, whatever grad mode was there before.")


@exercise
def check_predict(predict: Callable[[nn.Module, list[torch.Tensor]], Any]) -> Verdict:
    """Exercise 1: ``predict(model, batches)`` returns the stacked class probabilities, computed as for
    inference: the same on every call, and with no autograd graph made or kept. It must leave the caller's grad
    mode, the model's training mode and its parameters' ``requires_grad`` as it found them: it is called once
    from a training loop (grad on, model in training mode) and once from an evaluation loop (inside
    ``torch.no_grad()``, model in evaluation mode), and once more from a fine-tuning loop (a first layer frozen,
    a BatchNorm kept in evaluation mode while the rest trains). It must leave the caller's list of batches (its
    length, its tensors and their values) and the model's settings (dropout's ``p``), parameters' values and each
    parameter's ``requires_grad`` as it found them. A submodule whose mode differs from the model's and comes back
    flipped is named in the passing verdict (``model.train(mode)`` sets every layer), not failed. The batches have
    different sizes (the last one shorter). Probabilities in float64 are accepted (compared in float64)."""
    if (wrong := _not_callable(predict, "predict")) is not None:
        return wrong
    batches = _batches()
    kept, values = list(batches), [x.clone() for x in batches]
    model = classifier()
    settings = _settings(model)
    tensors = {name: t.detach().clone() for name, t in [*model.named_parameters(), *model.named_buffers()]}
    reference = classifier().eval()
    with torch.no_grad():
        want = torch.cat([torch.softmax(reference(x), dim=1) for x in batches])
    tuned = _fine_tuned()
    tuned_settings = _settings(tuned)
    tuned_tensors = {name: t.detach().clone() for name, t in [*tuned.named_parameters(), *tuned.named_buffers()]}
    tuned_flags = {name: p.requires_grad for name, p in tuned.named_parameters()}
    tuned_modes = {name: m.training for name, m in tuned.named_modules()}
    grad_was = torch.is_grad_enabled()
    try:
        torch.set_grad_enabled(True)  # called from a training loop: grad on, the model in training mode
        with graph_memory(exclude=model) as meter:
            first = predict(model, batches)
            saved_during = meter.packed > 0
            held = meter.alive_bytes()
        grad_after, training_after = torch.is_grad_enabled(), model.training
        if (used := _batches_changed(batches, kept, values)) is not None:
            raise _Stop(fail(f"{used}.", _INPUTS_HINT,
                             "iterate over the list (for x in batches) instead of emptying it; work on new tensors "
                             "(x = x - ...) instead of writing into the caller's (x.sub_, x -= ...)."))
        if (changed := _model_changed(model, settings, tensors)) is not None:
            raise _Stop(fail(f"after predict returned, {changed}: predict changed the model for good, and the "
                             "training that follows runs another model.", _INPUTS_HINT,
                             "inference switches dropout off through the model's mode (model.eval(), then back "
                             "with model.train(mode)), not by changing a layer's settings or weights."))
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
        torch.set_grad_enabled(True)  # called from a fine-tuning loop: a frozen layer, a BatchNorm kept in eval
        predict(tuned, _batches(seed=5))
    except _Stop as stop:
        return stop.verdict
    except Exception as exc:  # the student's code: report, do not crash
        return fail(f"predict raised {error_message(exc, first_line=True)}.",
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
    if not isinstance(second, torch.Tensor) or second.shape != first.shape or not torch.equal(_as64(first),
                                                                                               _as64(second)):
        return fail("two calls on the same batches give different probabilities: something random is still "
                    "switched on.",
                    "which layer of the model behaves differently in training and in inference?",
                    "model.eval() switches dropout to its inference behaviour (torch.no_grad() does not).")
    if not torch.allclose(_as64(first), _as64(want), atol=1e-6):  # in float64: a float64 result is welcome
        gap = (_as64(first) - _as64(want)).abs().max().item()
        sums = _as64(first).sum(dim=1)
        if (_as64(first) <= 0).all() and torch.allclose(_as64(first).exp(), _as64(want), atol=1e-6):
            return fail("the result holds the log-probabilities (each row's exp is the right probabilities): the "
                        "report wants the probabilities themselves.",
                        "which function turns the model's outputs into probabilities, and which into their logs?",
                        "broken_predict's softmax is the one to keep; log_softmax is for losses.")
        if ((_as64(first) == 0) | (_as64(first) == 1)).all() and torch.allclose(sums, torch.ones_like(sums)):
            return fail("every row of the result is one 1 and zeros (the most likely class, one-hot): the report "
                        "wants each class's probability, not only the winner.",
                        "what does the softmax give that an argmax throws away?",
                        "keep broken_predict's softmax over the classes; change only how it is run.")
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
    if not isinstance(third, torch.Tensor) or third.shape != want.shape or not torch.allclose(
            _as64(third), _as64(want), atol=1e-6):
        return fail("called from an evaluation loop (inside torch.no_grad(), model in evaluation mode), predict "
                    "returned other probabilities than the model's.",
                    "the result must not depend on the mode the caller was in.",
                    "compare the result of a call inside torch.no_grad(), on a model in evaluation mode, with one "
                    "outside it.")
    thawed = [name for name, p in tuned.named_parameters() if p.requires_grad != tuned_flags[name]]
    if thawed:
        now = tuned.get_parameter(thawed[0]).requires_grad
        return fail(f"called on a model being fine-tuned, predict left `model.{thawed[0]}` (and {len(thawed) - 1} "
                    f"more) with requires_grad={now}, where the caller had set {not now}: "
                    + ("the frozen layer would be trained by the step that follows." if now else
                       "the training that follows would not update it."),
                    "switch autograd off for the computation, not for the parameters: each parameter's "
                    "requires_grad is the caller's choice, and some are frozen on purpose.", _NO_GRAD_BLOCK)
    if (changed := _model_changed(tuned, tuned_settings, tuned_tensors)) is not None:
        return fail(f"called on a model being fine-tuned, after predict returned, {changed}: predict changed the "
                    "model for good.", _INPUTS_HINT,
                    "a BatchNorm in training mode updates its running statistics on every forward pass: inference "
                    "runs every layer in evaluation mode.")
    flipped = [name for name, m in tuned.named_modules() if m.training != tuned_modes[name]]
    caveat = ""
    if flipped:
        caveat = (f" One more thing: on a model whose layers were in different modes (a fine-tuning loop that keeps "
                  f"{_module(tuned, flipped[0])} in evaluation mode while the rest trains), predict left it in "
                  f"{'training' if tuned.get_submodule(flipped[0]).training else 'evaluation'} mode: "
                  "model.train(mode) sets every layer. Saving each module's .training and putting it back leaves "
                  "such a model as it was too.")
    return ok("the same probabilities on every call, nothing saved for a backward pass, and the caller's grad "
              "mode, the model's training mode and its parameters' requires_grad as they were, whichever they "
              "were." + caveat)


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


def _no_gradient(got: torch.Tensor, leaf: torch.Tensor, reference: torch.Tensor | None) -> str | None:
    """How a loss with the right value fails to reach ``leaf`` (the logits) in backward, in words; None if its
    gradient is the cross-entropy's (``reference``)."""
    if not got.requires_grad:
        return "it does not require grad (no graph leads back to the logits)"
    try:
        got.backward()
    except Exception as exc:  # the student's graph: report, do not crash
        return f"its backward() raised {error_message(exc, first_line=True)}"
    if leaf.grad is None:
        return "backward() does not reach the logits"
    want = reference if reference is not None else torch.zeros_like(leaf)
    if not torch.allclose(leaf.grad.to(torch.float64), want.to(torch.float64), atol=1e-6):
        gap = (leaf.grad.to(torch.float64) - want.to(torch.float64)).abs().max().item()
        return f"its gradient with respect to the logits differs from the cross-entropy's (by up to {gap:.2g})"
    return None


def _close(got: torch.Tensor, value: torch.Tensor) -> bool:
    return bool(torch.isfinite(value)) and torch.allclose(got.detach().reshape(()).to(torch.float64),
                                                          value.detach().to(torch.float64), atol=1e-6)


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
    after the loss), and with a gradient: backward() from the loss must reach the logits with the cross-entropy's
    gradient (a ``.detach()`` on the logits or on the result fails). Compared with ``atol=1e-6``, in float64."""
    if (wrong := _not_callable(label_loss, "label_loss")) is not None:
        return wrong
    for what, (logits, labels) in _label_cases().items():
        labelled = labels != UNLABELLED
        ref = logits.clone().requires_grad_(True)
        want = F.cross_entropy(ref[labelled], labels[labelled])
        want.backward()
        want = want.detach()
        leaf = logits.clone().requires_grad_(True)
        given_logits, given_labels = leaf * 1, labels.clone()  # a model's output: not a leaf, and it has a graph
        try:
            got = label_loss(given_logits, given_labels)
        except Exception as exc:
            return fail(f"on {what}, label_loss raised {error_message(exc, first_line=True)}",
                        "the CPU names the bad value; what does that value mean in this data set?",
                        "-1 is UNLABELLED: a row nobody gave a class to. What should such a row teach the model?")
        for name, before, after in (("labels", labels, given_labels), ("logits", logits, given_logits.detach())):
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
            if (cut := _no_gradient(got, leaf, ref.grad)) is not None:
                return fail(f"on {what} the loss has the right value, {got.item():.4f}, but {cut}: the training "
                            "step's backward() would not reach the model, and nothing would learn.",
                            "a loss is for backward(): it must stay connected to the logits' graph.",
                            "detach() (on the logits or on the result), .item() or torch.tensor(...) of a value "
                            "cut the graph; the fix is about which rows count, not about gradients.")
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
_SUBS = {"sub", "sub_", "subtract", "__sub__", "__rsub__", "__isub__"}
_SCALES = {"div": "divided by", "div_": "divided by", "true_divide": "divided by", "__truediv__": "divided by",
           "mul": "multiplied by", "mul_": "multiplied by", "__mul__": "multiplied by", "__rmul__": "multiplied by",
           "multiply": "multiplied by"}


def _rescaled(calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]], shape: torch.Size) -> str | None:
    """"divided by 1000" when a tensor of the logits' shape was divided (or multiplied) by one number other than
    1 (a rescaling of the logits), else None."""
    for name, args, _ in calls:
        if name not in _SCALES or len(args) < 2:
            continue
        tensor, factor = (args[0], args[1]) if isinstance(args[0], torch.Tensor) else (args[1], args[0])
        if not isinstance(tensor, torch.Tensor) or tensor.shape != shape:
            continue
        if isinstance(factor, torch.Tensor) and factor.numel() == 1 and factor.device.type == "cpu":
            factor = factor.detach().item()
        if isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor not in (1, -1):
            return f"{_SCALES[name]} {factor:g}"
    return None
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
    atol=1e-5; gradients with rtol=1e-4, atol=1e-6, both in float64: a stable computation in float64 (say
    ``F.cross_entropy(logits.double(), target)``) is right, while the unstable formula in float64 still overflows
    near ±1000. An exp that overflows (inf from a large positive argument: a shift by something other than the
    row's maximum) and a probability that underflows to 0 get their own messages; a clamp is blamed only where it
    changed a value, and a rescaling of the logits is named as such."""
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
                        f"{error_message(exc, first_line=True)}", "run it on a batch of another size and read the error's last line.",
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
        clamped = called.bit  # the clamps that changed a value here (one that changed nothing is no mistake)
        scaled = _rescaled(called.calls, logits.shape)
        epsilon = [a for name, args, _ in called.calls if name in _ADDS for a in args
                   if isinstance(a, float) and 0 < a < 1e-3]
        wide = any(isinstance(a, torch.Tensor) and a.dtype == torch.float64 for _, args, _ in called.calls
                   for a in args)
        dtype = "float64" if wide else "float32"
        try:
            got.backward()
        except Exception as exc:
            return fail(f"on {what}, the backward of stable_loss raised {error_message(exc, first_line=True)}",
                        "a training step calls backward() on the loss: every operation must have a gradient.",
                        "detach(), .item() or a trip through NumPy cuts the graph: build the loss from the logits "
                        "with torch operations.")
        value = got.detach().reshape(()).to(torch.float64)  # compared in float64: a float64 answer is welcome
        want = want.detach().to(torch.float64)
        if not torch.isfinite(value):
            gaps = logits.amax(dim=1) - logits[torch.arange(len(target)), target]
            worst = gaps.max()
            if called.overflow is not None and not clamped and (value.item() == math.inf or names & _SUBS):
                arg, kind = called.overflow
                kind_name = str(kind).removeprefix("torch.")
                shift = (" Subtracting something from each row's logits was the right idea, but what was subtracted "
                         "leaves some exponents large and positive: only a shift that leaves none above 0, in every "
                         "row, keeps exp finite." if names & _SUBS else "")
                return fail(f"on {what} the loss is {value.item()}: an exp overflowed, not underflowed: exp({arg:.1f}) "
                            f"is inf in {kind_name}, whose exp holds values only up to e^"
                            f"{EXP_LIMIT.get(kind, EXP_LIMIT[torch.float32]):.2f}.{shift}",
                            "exp of a large positive number overflows to inf: after a shift, which exponent of a row "
                            "is the largest, and is it at most 0 however the logits are spread?", _LOG_PROBS)
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
            if scaled is not None:
                how += (f" The logits were {scaled}: a softmax depends on the differences between a row's logits, "
                        "and rescaling changes every difference, so every probability (adding the same number to "
                        "a row is the change that leaves them alone).")
            if epsilon:
                how += (f" The {epsilon[0]:g} added to a probability sets a floor under it: its log is wrong "
                        "wherever the probability is smaller than that.")
            return fail(f"on {what} the loss is {value.item():.5f}, the cross-entropy is {want.item():.5f}.{how}",
                        "the fix must not change the values: rescaling or clamping the logits, or adding an "
                        "epsilon, does.",
                        _LOG_PROBS)
        reference = ref.grad if ref.grad is not None else torch.zeros_like(logits)
        if not torch.allclose(leaf.grad.to(torch.float64), reference.to(torch.float64), rtol=1e-4, atol=1e-6):
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
    as it found them, and does not switch it off even around one operation. Once right on the CPU, it is run
    with the ids on the ``meta`` device (see `_off_the_cpu`): counts made on the CPU, a NumPy or Python round
    trip, or an operation without a CUDA kernel (``torch.histogram``) fail there."""
    if (wrong := _not_callable(histogram, "histogram")) is not None:
        return wrong
    saved, saved_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    first_case: tuple[torch.Tensor, int, list[Any]] | None = None  # for the run on meta, once the CPU's are right
    for what, (ids, want) in _histogram_cases().items():
        given = ids.clone()
        torch.use_deterministic_algorithms(True)
        try:
            with _OpsCalled() as called, _Shapes() as shapes:
                got = histogram(given, len(want))
            still_on = torch.are_deterministic_algorithms_enabled()
            warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        except Exception as exc:
            return fail(f"with deterministic algorithms on, histogram raised {error_message(exc, first_line=True)}",
                        "the message names the operation; find one that both counts repeated ids and has a "
                        "deterministic implementation.", _COUNTING)
        finally:
            torch.use_deterministic_algorithms(saved, warn_only=saved_warn)
        if not still_on or warn_only:
            return fail("histogram switched deterministic algorithms off (or to warnings only): the error is gone, "
                        "and so is the guarantee for the rest of the program.", "keep the setting; change the operation.",
                        "the setting belongs to the caller: histogram should not call use_deterministic_algorithms. "
                        + _COUNTING)
        if called.unguarded:
            op = next((name for name in called.unguarded if name in _REFUSED_ON_CUDA), called.unguarded[-1])
            return fail(f"histogram switches deterministic algorithms off (or to warnings only) around {op}, and "
                        f"back on: with the setting off, {op} raises nowhere, but it runs without the "
                        "guarantee either, and the setting belongs to the caller.",
                        "keep the setting, even for one line; change the operation.",
                        "histogram should not call use_deterministic_algorithms at all. " + _COUNTING)
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
        first_case = first_case or (ids, len(want), shapes.seen)
    if first_case is not None and (elsewhere := _off_the_cpu(histogram, *first_case)) is not None:
        return elsewhere
    return ok("the right counts, empty bins included, with deterministic algorithms on, with operations a GPU "
              "allows too, and on a device that is not the CPU (the ids on meta).")


# Operations whose output's size depends on the values of their input (so the meta device, which has no values,
# has no kernel for them) and which do have a CUDA kernel (ATen/ops/<name>_cuda_dispatch.h in the installed
# headers): the meta run replays the shapes they gave on the CPU instead of refusing them.
_VALUE_SIZED = ("bincount", "_unique2", "unique_dim", "unique_consecutive", "_unique", "nonzero", "masked_select")

# Operations with a CPU kernel only (no ATen/ops/<name>_cuda_dispatch.h): they raise on a CUDA tensor.
_CPU_ONLY = ("histogram", "histogramdd", "_histogramdd_bin_edges", "_histogramdd_from_bin_cts")


def _aten_name(func: Any) -> str:
    return str(getattr(func, "__name__", "")).split(".")[0]


class _Shapes(TorchDispatchMode):
    """Records, in order, the outputs of the `_VALUE_SIZED` operations run inside it, as meta tensors (shape and
    dtype, no values); with ``replay`` (those records), gives them back when the same operations run on meta."""

    def __init__(self, replay: list[Any] | None = None) -> None:
        super().__init__()
        self.seen: list[Any] = []
        self.replay = list(replay) if replay is not None else None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _aten_name(func) not in _VALUE_SIZED:
            return func(*args, **kwargs)
        tensors = _tensors_in((args, kwargs))
        if self.replay is None or not any(t.device.type == "meta" for t in tensors):
            out = func(*args, **kwargs)
            self.seen.append(_as_meta(out))
            return out
        devices = sorted({str(t.device) for t in tensors if t.dim() > 0})
        if len(devices) > 1:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{devices[0]} and {devices[1]}!")
        if not self.replay:
            raise _Unsure
        return self.replay.pop(0)


def _tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors in an operator's arguments (tensors, and lists, tuples and dicts of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    return []


def _as_meta(value: Any) -> Any:
    """An operator's output with each tensor replaced by an empty meta tensor of its shape and dtype."""
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_as_meta(v) for v in value)
    return value


class _Unsure(Exception):  # noqa: N818 - not an error: the meta run cannot follow this answer, no verdict
    pass


_ON_THE_DEVICE = ("on a GPU the ids live on the GPU: every tensor the function makes must be made where the ids "
                  "live, its values must stay there, and every operation needs a kernel for that device.")


def _off_the_cpu(histogram: Callable[[torch.Tensor, int], Any], ids: torch.Tensor, bins: int,
                 seen: list[Any]) -> Verdict | None:
    """Run ``histogram`` once more, on ``ids`` moved to the meta device (a device that is not the CPU, where
    tensors have a shape, a dtype and a device but no values), with deterministic algorithms on. What it checks:
    that every tensor the function makes is made on the ids' device (``torch.zeros(bins)`` without ``device=``
    meets the ids and raises, or returns counts on the CPU); that no value is read back to the host (NumPy,
    ``tolist``, ``item``, ``.cpu()``: a meta tensor has none to give); that every operation has a kernel off the
    CPU (``torch.histogram`` has a CPU kernel only: no ``histogram_cuda_dispatch.h`` among the installed
    headers, and none for meta either); and that the counts come back on the ids' device. Operations whose
    output's size depends on the values (``bincount``, ``unique``: they do have CUDA kernels) get the shapes they
    gave on the CPU. A failure here is a function that works on the CPU only; None when it passes, or when the
    meta run cannot tell."""
    saved, saved_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with _Shapes(replay=seen):
            got = histogram(ids.to("meta"), bins)
    except _Unsure:
        return None
    except Exception as exc:  # the student's code: report, do not crash
        text = str(exc)
        if "device" in text and ("same device" in text or "expected device" in text or "to be on" in text):
            cause = ("a tensor made on the CPU (without the ids' device) meets the ids, which live elsewhere: "
                     "on a GPU this raises")
        elif "numpy" in text.lower() or "copy out of meta" in text or "no data" in text or "item()" in text:
            cause = ("the ids' values are read back to the CPU (NumPy, tolist, item or .cpu()): on a GPU that is a "
                     "round trip through the host, and the counts are made on the CPU")
        elif (op := re.search(r"aten::(\w+)", text)) and op.group(1) in _CPU_ONLY:
            cause = (f"torch.{op.group(1)} has a CPU implementation only (no CUDA kernel): on a GPU tensor it "
                     "raises")
        elif op is not None and ("Meta kernel" in text or "fake impl" in text):
            cause = f"{op.group(1)} has no kernel for a device other than the CPU here"
        else:
            cause = "the function does not run on a device other than the CPU"
        said = error_message(exc, first_line=True)
        if len(said) > 160 and ". " in said:  # PyTorch's long messages: their first sentence says it
            said = said[:said.index(". ") + 1]
        return fail(f"the right counts on the CPU, but with the ids on another device (the checker's meta device, "
                    f"which is not the CPU), histogram raised {said.rstrip('.')}: {cause}.", _ON_THE_DEVICE,
                    "torch.zeros(bins) and torch.ones(n) are made on the CPU unless given device=ids.device (or "
                    "made with new_zeros, zeros_like); NumPy works on CPU memory only; torch.histogram has no CUDA "
                    "kernel. " + _COUNTING)
    finally:
        torch.use_deterministic_algorithms(saved, warn_only=saved_warn)
    if not isinstance(got, torch.Tensor) or got.device != torch.device("meta"):
        where = got.device if isinstance(got, torch.Tensor) else type(got).__name__
        return fail(f"the right counts on the CPU, but with the ids on another device (the checker's meta device, "
                    f"which is not the CPU), histogram returned counts on {where}: the counts are made on the CPU, "
                    "not where the ids live.", _ON_THE_DEVICE,
                    "a tensor made without device= is made on the CPU, and an operation that writes into it keeps it "
                    "there: make the counts with device=ids.device (or new_zeros, zeros_like).")
    return None


class _OpsCalled(TorchFunctionMode):
    """The torch functions and tensor methods called inside it, with their arguments: ``calls`` holds
    ``(name, args, kwargs)`` (``put_``, ``bincount``, ...). Also kept: ``overflow``, the largest argument of an
    ``exp`` whose result is inf where the argument was finite (with its dtype); ``bit``, the clamps that changed
    a value; ``unguarded``, the operations called while deterministic algorithms were off (or warn-only)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.overflow: tuple[float, torch.dtype] | None = None
        self.bit: list[str] = []
        self.unguarded: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        self.calls.append((name, tuple(args), dict(kwargs or {})))
        if not torch.are_deterministic_algorithms_enabled() or torch.is_deterministic_algorithms_warn_only_enabled():
            self.unguarded.append(name)
        first = args[0] if args else None
        before = None
        if name in _CLAMPS | {"exp", "exp_"} and isinstance(first, torch.Tensor) and first.device.type == "cpu":
            before = first.detach().clone()  # an in-place call changes its first argument
        result = func(*args, **(kwargs or {}))
        if before is not None and isinstance(result, torch.Tensor):
            try:  # what the call did, for the messages; never a reason for the checker to fail
                out = result.detach()
                if name in ("exp", "exp_") and out.is_floating_point():
                    burst = torch.isinf(out) & torch.isfinite(before) & (before > 0)
                    if bool(burst.any()):
                        arg = before[burst].max().item()
                        if self.overflow is None or arg > self.overflow[0]:
                            self.overflow = (arg, out.dtype)
                elif name in _CLAMPS and name not in self.bit and not torch.equal(out, before.expand_as(out)):
                    self.bit.append(name)
            except Exception:  # noqa: S110 - a shape or dtype this bookkeeping does not follow: leave it out
                pass
        return result
