"""Checkers for notebook 02 (moving data).

Device bugs hide on a machine with one device: when everything is on the CPU, forgetting a ``.to()``
changes nothing. So the checkers also run your code on the **meta** device, which every PyTorch build
has (tensors with a shape and a dtype but no data): a tensor left behind on the CPU then meets one on
``meta`` and PyTorch raises, as it would with a GPU. Where an accelerator is present (CUDA, MPS...) the
checkers run on it too. Numbers are compared on the CPU, against a reference, with the same seed.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..devices import accelerator_type
from . import Verdict, fail, ok

__all__ = [
    "QUIZ",
    "buggy_train_epoch",
    "check_quiz",
    "check_train_epoch",
    "check_train_step",
    "make_batches",
    "make_model",
    "quiz_truth",
]

_MISMATCH_HINT = ("every tensor an operation uses must be on the same device: move the model once, move "
                  "each batch (x AND y), and create new tensors with device=.")


# --------------------------------------------------------------------------------------------------
# Shared data: a tiny regression problem, drawn on the CPU with a seed (so every device sees the same).


def make_model(seed: int = 0) -> nn.Module:
    """The exercises' model: Linear(4, 8) → ReLU → Linear(8, 1), on the CPU, seeded."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def make_batches(n: int = 4, batch_size: int = 16, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` batches ``(x, y)`` on the CPU: x is (batch_size, 4), y is (batch_size, 1)."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        x = torch.randn(batch_size, 4, generator=gen)
        y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(batch_size, 1, generator=gen)
        batches.append((x, y))
    return batches


def _other_devices() -> list[torch.device]:
    """Devices to try besides the CPU: meta always, and the accelerator when there is one."""
    devices = [torch.device("meta")]
    kind = accelerator_type()
    if kind is not None:
        devices.append(torch.device("mps") if kind == "mps" else torch.device(kind, 0))
    return devices


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _describe_error(exc: BaseException, device: torch.device) -> str:
    text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "(no message)"
    where = "on the CPU" if device.type == "cpu" else f"on device {device.type!r}"
    return f"{where} it raised {type(exc).__name__}: {text.rstrip('.')}"


def _stop(text: str) -> str:
    return text if text.endswith(("!", "?", ".")) else text + "."


def _error_hint(exc: BaseException) -> str:
    text = str(exc)
    if "meta" in text and ("item" in text or "copy out" in text or "no data" in text):
        return ("it copied data off the device (.item(), float(), .tolist(), .cpu(), or moving the model "
                "to the batch's device). Keep the loss as a tensor on the device (detach it, accumulate with "
                "+=) and return it; move the batch to the model, not the model to the batch.")
    if "not compiled with CUDA" in text or ("CUDA" in text and "available" in text):
        return "do not write 'cuda' in the function: use the device you are given (or the model's)."
    if "device" in text:
        return _MISMATCH_HINT
    return "read the error message: it names the operation and the tensors involved."


def _uses_cuda_literally(fn: Callable[..., Any]) -> bool:
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    code = "\n".join(line.split("#", 1)[0] for line in source.splitlines())
    return bool(re.search(r"""['"]cuda(:\d+)?['"]|\.cuda\(""", code))


# --------------------------------------------------------------------------------------------------
# Exercise 1: fix the device bugs in a small training loop.


def buggy_train_epoch(model: nn.Module, batches: list, device: torch.device | str,
                      lr: float = 0.05) -> torch.Tensor:
    """The loop with device bugs that exercise 1 asks to fix (it works on the CPU only)."""
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    total = torch.zeros(())
    for x, y in batches:
        x.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.detach()
    return total / len(batches)


def _reference_train_epoch(model: nn.Module, batches: list, device: torch.device | str,
                           lr: float = 0.05) -> torch.Tensor:
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    total = torch.zeros((), device=device)
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.detach()
    return total / len(batches)


def check_train_epoch(train_epoch: Callable[..., Any]) -> Verdict:
    """Exercise 1: ``train_epoch(model, batches, device, lr=0.05)`` trains one epoch of SGD on ``device``
    and returns the mean loss as a 0-dim tensor **on that device** (no ``.item()`` inside the loop).

    Run on the CPU (numbers compared with the reference), then on meta and on the accelerator if present.
    """
    if not callable(train_epoch):
        return fail(f"expected a function, got {type(train_epoch).__name__}.",
                    "define it with def train_epoch(model, batches, device, lr=0.05): ...")
    # 1. On the CPU: does it still train correctly?
    model, ref_model = make_model(), make_model()
    batches = make_batches()
    want = _reference_train_epoch(ref_model, make_batches(), "cpu")
    try:
        got = train_epoch(model, batches, torch.device("cpu"))
    except Exception as exc:
        return fail(_stop(_describe_error(exc, torch.device("cpu"))), _error_hint(exc))
    if not isinstance(got, torch.Tensor):
        return fail(f"it returned a {type(got).__name__}, not a tensor.",
                    "return the mean loss as a tensor (total / len(batches)), not a Python number.")
    if got.dim() != 0:
        return fail(f"it returned a tensor of shape {tuple(got.shape)}, not a 0-dim tensor (one number).",
                    "accumulate loss.detach() into total = torch.zeros((), device=device).")
    if not torch.allclose(got.detach().float(), want, rtol=1e-4, atol=1e-6):
        return fail(f"on the CPU the mean loss is {float(got):.5f}, the reference gives {float(want):.5f}.",
                    "fix only the device bugs: keep the loop's steps (zero_grad, backward, step) as they are.")
    for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
        if not torch.allclose(p.detach(), q, rtol=1e-4, atol=1e-6):
            return fail("on the CPU the trained weights differ from the reference.",
                        "fix only the device bugs: keep the loop's steps as they are.")
    # 2. On other devices: does everything follow the device?
    tried = []
    for dev in _other_devices():
        model = make_model()
        try:
            got = train_epoch(model, make_batches(), dev)
        except Exception as exc:
            return fail(_stop(_describe_error(exc, dev)), _error_hint(exc))
        if not isinstance(got, torch.Tensor) or not _same_device(got.device, dev):
            where = got.device if isinstance(got, torch.Tensor) else type(got).__name__
            return fail(f"on device {dev.type!r} the returned loss is on {where}, not on {dev.type}.",
                        "create the accumulator on the device: total = torch.zeros((), device=device).")
        off = [n for n, p in model.named_parameters() if not _same_device(p.device, dev)]
        if off:
            return fail(f"on device {dev.type!r} these parameters stayed behind: {', '.join(off)}.",
                        "model.to(device) moves every parameter (in place).")
        if dev.type != "meta":
            want_dev = _reference_train_epoch(make_model(), make_batches(), "cpu")
            if not torch.allclose(got.detach().cpu().float(), want_dev, rtol=1e-3, atol=1e-5):
                return fail(f"on {dev} the mean loss {float(got):.5f} differs from the CPU's "
                            f"{float(want_dev):.5f}.", "the same loop must give the same numbers everywhere.")
        tried.append(dev.type)
    return ok(f"same numbers as the reference on the CPU, and no tensor left behind on "
              f"{' or '.join(tried)}.")


# --------------------------------------------------------------------------------------------------
# Exercise 2: a device-agnostic train_step.


def _reference_train_step(model: nn.Module, optimizer: torch.optim.Optimizer,
                          loss_fn: Callable[..., torch.Tensor], x: torch.Tensor,
                          y: torch.Tensor) -> torch.Tensor:
    device = next(model.parameters()).device
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _run_steps(train_step: Callable[..., Any], device: torch.device,
               steps: int = 2) -> tuple[nn.Module, list[Any]]:
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for x, y in make_batches(n=steps):
        losses.append(train_step(model, optimizer, F.mse_loss, x, y))
    return model, losses


def check_train_step(train_step: Callable[..., Any]) -> Verdict:
    """Exercise 2: ``train_step(model, optimizer, loss_fn, x, y)`` with x and y on the CPU and the model on
    any device: moves the batch to the model's device, does one optimisation step and returns the loss,
    detached, as a 0-dim tensor on that device. No device written in the function.
    """
    if not callable(train_step):
        return fail(f"expected a function, got {type(train_step).__name__}.",
                    "def train_step(model, optimizer, loss_fn, x, y): ...")
    if _uses_cuda_literally(train_step):
        return fail("the function names CUDA ('cuda' or .cuda()), so it cannot run on mps or cpu.",
                    "find the device from the model: next(model.parameters()).device")
    cpu = torch.device("cpu")
    ref_model, want = _run_steps(_reference_train_step, cpu)
    try:
        model, got = _run_steps(train_step, cpu)
    except Exception as exc:
        return fail(_stop(_describe_error(exc, cpu)), _error_hint(exc))
    if any(g is None for g in got):
        return fail("it returned None.", "end with return loss.detach()")
    if not all(isinstance(g, torch.Tensor) for g in got):
        kind = next(type(g).__name__ for g in got if not isinstance(g, torch.Tensor))
        return fail(f"it returned a {kind}, not a tensor.",
                    "return loss.detach(): reading the number (.item()) waits for the GPU; leave that to "
                    "the caller, when it needs it.")
    if any(g.requires_grad for g in got):
        return fail("the returned loss still requires grad (it keeps the whole graph alive).",
                    "return loss.detach()")
    if any(g.dim() != 0 for g in got):
        return fail(f"the returned loss has shape {tuple(got[0].shape)}, not a 0-dim tensor.",
                    "use the loss function's output as it is (its mean over the batch).")
    if not torch.allclose(got[0], want[0], rtol=1e-4, atol=1e-6):
        return fail(f"the first loss is {float(got[0]):.5f}, expected {float(want[0]):.5f}.",
                    "return the loss of this batch, computed before optimizer.step().")
    weights_ok = all(torch.allclose(p.detach(), q, rtol=1e-4, atol=1e-6)
                     for p, q in zip(model.parameters(), ref_model.parameters(), strict=True))
    if not weights_ok or not torch.allclose(got[1], want[1], rtol=1e-4, atol=1e-6):
        return fail("after two steps the weights differ from the reference.",
                    "each step: optimizer.zero_grad(), loss = loss_fn(model(x), y), loss.backward(), "
                    "optimizer.step(). Without zero_grad the gradients of both batches add up.")
    tried = []
    for dev in _other_devices():
        try:
            model, got = _run_steps(train_step, dev)
        except Exception as exc:
            return fail(_stop(_describe_error(exc, dev)), _error_hint(exc))
        wrong = [g.device for g in got if not _same_device(g.device, dev)]
        if wrong:
            return fail(f"with the model on {dev.type!r} the loss came back on {wrong[0]}.",
                        "move x and y to the model's device before the forward pass.")
        off = [n for n, p in model.named_parameters() if not _same_device(p.device, dev)]
        if off:
            return fail(f"with the model on {dev.type!r}, train_step moved these parameters away: "
                        f"{', '.join(off)}.", "move the batch to the model, never the model to the batch.")
        if dev.type != "meta" and not torch.allclose(got[1].cpu(), want[1], rtol=1e-3, atol=1e-5):
            return fail(f"on {dev} the loss {float(got[1]):.5f} differs from the CPU's {float(want[1]):.5f}.",
                        "the same step must give the same numbers everywhere.")
        tried.append(dev.type)
    return ok(f"same losses and weights as the reference on the CPU, and it follows the model to "
              f"{' and '.join(tried)} without naming a device.")


# --------------------------------------------------------------------------------------------------
# Exercise 3: does .to() return the same object?

QUIZ: dict[str, tuple[str, str]] = {
    "a": ('x.to("cpu")', "nothing changes (x is already a float32 tensor on the CPU): the same tensor."),
    "b": ("x.to(torch.float64)", "the dtype changes, so the data must be converted: a new tensor."),
    "c": ('x.to("cpu", copy=True)', "copy=True always makes a new tensor, even when nothing changes."),
    "d": ("x.to(torch.float32)", "float32 already: the same tensor."),
    "e": ('x.to("meta")', "another device: a new tensor (on meta, one without data)."),
    "f": ("x.to(w)  # w = torch.zeros(2) (float32, cpu)", "w has x's dtype and device: the same tensor."),
    "g": ("x.cpu()", "already on the CPU: .cpu() returns the same tensor."),
    "h": ("model.to(torch.float64)  # model is an nn.Module",
          "modules are converted in place and return themselves: the same object."),
}
"""Quiz cases: key → (expression, explanation). ``x = torch.arange(4.0)`` (float32, on the CPU)."""


def quiz_truth() -> dict[str, bool]:
    """Evaluate every quiz case for real: True where the expression returns the same object."""
    x = torch.arange(4.0)
    w = torch.zeros(2)
    model = nn.Linear(2, 2)
    results = {
        "a": x.to("cpu") is x,
        "b": x.to(torch.float64) is x,
        "c": x.to("cpu", copy=True) is x,
        "d": x.to(torch.float32) is x,
        "e": x.to("meta") is x,
        "f": x.to(w) is x,
        "g": x.cpu() is x,
        "h": model.to(torch.float64) is model,
    }
    assert results.keys() == QUIZ.keys()
    return results


def check_quiz(answers: Mapping[str, Any], explain: bool = False) -> Verdict:
    """Exercise 3: ``answers[key]`` is True when the expression returns the same object, else False.

    With every answer right and ``explain=True``, the verdict also gives the reason for each case (the
    hidden solution cell leaves it out, so its stored output does not give the answers away).
    """
    if not isinstance(answers, Mapping):
        return fail(f"expected a dict like {{'a': True, 'b': False, ...}}, got {type(answers).__name__}.",
                    "answers = {'a': True, 'b': False, ...}")
    unknown = sorted(set(map(str, answers)) - QUIZ.keys())
    if unknown:
        return fail(f"unknown case(s) {', '.join(unknown)}; the cases are {', '.join(QUIZ)}.",
                    "use the letters shown above as keys.")
    missing = [k for k in QUIZ if not isinstance(answers.get(k), bool)]
    if missing:
        return fail(f"answer every case with True or False; missing or not a bool: {', '.join(missing)}.",
                    "True = the same object comes back, False = a new object.")
    truth = quiz_truth()
    wrong = [k for k in QUIZ if answers[k] != truth[k]]
    if wrong:
        lines = "; ".join(f"{k}) {QUIZ[k][0].split('  #')[0]}" for k in wrong)
        return fail(f"{len(wrong)} of {len(QUIZ)} wrong: {lines}.",
                    "run each expression with `is x` to see for yourself: a change of dtype or device "
                    "(or copy=True) makes a new tensor; a module's .to() returns the module.")
    if not explain:
        return ok(f"all {len(QUIZ)} right. check_quiz(answers, explain=True) gives the reason for each.")
    return ok(f"all {len(QUIZ)} right.\n" + "\n".join(f"  {k}) {why}" for k, (_, why) in QUIZ.items()))
