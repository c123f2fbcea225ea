"""Checkers for notebook 07 (the performance toolbox). They run on the CPU, so every student gets feedback."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from . import Verdict, fail, ok

__all__ = ["check_graph_break_fix", "check_grad_scaler_step", "check_no_sync_loop", "normalize_then_tanh"]


# --- 1. a graph break -----------------------------------------------------------------------------------

def normalize_then_tanh(x: torch.Tensor) -> torch.Tensor:
    """The exercise's function: if any entry is larger than 1 in size, divide by the largest size first."""
    if x.abs().max() > 1:  # a Python `if` on a tensor's value: torch.compile must break the graph here
        x = x / x.abs().max()
    return torch.tanh(x) * 2


def _explain(fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> Any:
    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(x)


def check_graph_break_fix(fn: Callable[[torch.Tensor], torch.Tensor]) -> Verdict:
    """Exercise: ``fn`` computes what `normalize_then_tanh` computes, for every input, with no graph break."""
    if not callable(fn):
        return fail(f"expected your function, got {type(fn).__name__}.", "pass the function itself: "
                    "check_graph_break_fix(normalize_then_tanh_fixed)")
    g = torch.Generator().manual_seed(7)
    cases = {"entries below 1": torch.rand(64, generator=g) * 0.9 - 0.45,
             "entries up to 5": torch.randn(64, generator=g) * 2.5}
    for what, x in cases.items():
        try:
            got = fn(x.clone())
        except Exception as exc:  # the student's code: report any failure as feedback
            return fail(f"your function raised {type(exc).__name__}: {exc}", "run it on torch.randn(8) first.")
        want = normalize_then_tanh(x.clone())
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            return fail(f"for {what}, your function returned {type(got).__name__} "
                        f"{tuple(got.shape) if isinstance(got, torch.Tensor) else ''}; expected a tensor of "
                        f"shape {tuple(want.shape)}.")
        if not torch.allclose(got, want, atol=1e-6):
            return fail(f"for {what}, your result differs from normalize_then_tanh's (largest difference "
                        f"{(got - want).abs().max().item():.3g}).",
                        "compute both branches and pick with torch.where(condition, divided, x): "
                        "condition is a tensor, so no Python `if` is needed.")
    for what, x in cases.items():
        explanation = _explain(fn, x)
        if explanation.graph_break_count:
            reasons = "; ".join(str(b.reason).splitlines()[0] for b in explanation.break_reasons)
            return fail(f"for {what}, torch.compile still breaks the graph {explanation.graph_break_count} "
                        f"time(s): {reasons}", "a Python `if` (or print, .item(), .tolist()) on a tensor's "
                        "value needs the value on the host; keep the decision inside tensor operations.")
    return ok("same results as the original on both kinds of input, captured as one graph with no break.")


# --- 2. an fp16 step with a GradScaler ----------------------------------------------------------------

def _underflow_setup() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A model that already fits its targets well: fp16 gradients of its mean loss underflow unscaled."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    x = torch.randn(8192, 64)
    with torch.no_grad():
        y = model(x) + 0.01 * torch.randn(8192, 64)
    return model, x, y


def _reference_step(model: nn.Module, opt: torch.optim.Optimizer, scaler: Any, x: torch.Tensor,
                    y: torch.Tensor, variant: str = "right") -> None:
    with torch.autocast(x.device.type, dtype=torch.float16, enabled=variant != "fp32"):
        loss = F.mse_loss(model(x), y)
    if variant in ("right", "fp32"):
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    elif variant == "unscaled":
        loss.backward()
        opt.step()
    elif variant == "scaled, plain step":
        scaler.scale(loss).backward()
        opt.step()
    opt.zero_grad(set_to_none=True)


def _weights_after(step: Callable[..., Any], variant: str | None = None, bad_input: bool = False
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor], float]:
    model, x, y = _underflow_setup()
    if bad_input:
        x = x.clone()
        x[0, 0] = float("inf")
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=10.0)
    scaler = torch.amp.GradScaler(x.device.type, init_scale=2.0**16)
    if variant is None:
        step(model, opt, scaler, x, y)
    else:
        _reference_step(model, opt, scaler, x, y, variant)
    return before, [p.detach().clone() for p in model.parameters()], float(scaler.get_scale())


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(p, q, rtol=1e-4, atol=1e-7) for p, q in zip(a, b, strict=True))


def check_grad_scaler_step(step: Callable[..., Any]) -> Verdict:
    """Exercise: ``step(model, opt, scaler, x, y)`` does one fp16 mixed-precision training step of
    ``F.mse_loss(model(x), y)`` with the GradScaler ``scaler``."""
    if not callable(step):
        return fail(f"expected your step function, got {type(step).__name__}.")
    try:
        before, got, scale = _weights_after(step)
        _, got_bad, scale_bad = _weights_after(step, bad_input=True)
    except Exception as exc:  # the student's code: report any failure as feedback
        if "No inf checks were recorded" in str(exc):
            return fail(f"scaler.update() raised {type(exc).__name__}: {exc}",
                        "update() looks for the inf check that scaler.step(opt) makes: step with the scaler, "
                        "not with opt.step().")
        return fail(f"your step raised {type(exc).__name__}: {exc}",
                    "the order is scaler.scale(loss).backward(), scaler.step(opt), scaler.update().")
    _, want, _ = _weights_after(None, "right")  # type: ignore[arg-type]
    if _same(got, before):
        return fail("after your step the weights have not changed.",
                    "scaler.step(opt) runs the optimizer (it skips only when a gradient is inf or NaN).")
    if not _same(got, want):
        for variant, message, hint in [
            ("unscaled", "your update equals a step whose fp16 gradients were not scaled: most of them "
             "underflowed to zero.", "backpropagate scaler.scale(loss), not loss."),
            ("scaled, plain step", "your update used the scaled gradients as they are (65536 times too large).",
             "step with scaler.step(opt): it unscales the gradients first (and skips the step on inf)."),
            ("fp32", "your step ran in float32, not in float16.",
             "run the forward pass and the loss inside torch.autocast(x.device.type, dtype=torch.float16)."),
        ]:
            if _same(got, _weights_after(None, variant)[1]):  # type: ignore[arg-type]
                return fail(message, hint)
        return fail("your update differs from a correct fp16 GradScaler step.",
                    "autocast(float16) around forward and loss; scaler.scale(loss).backward(); "
                    "scaler.step(opt); scaler.update().")
    if not all(torch.equal(p, q) for p, q in zip(got_bad, before, strict=True)):
        return fail("with an inf in the input your step still changed the weights.",
                    "call scaler.step(opt) instead of opt.step(): it skips the step when gradients hold inf/NaN.")
    if not math.isclose(scale_bad, 2.0**15):
        return fail(f"after the step with inf gradients the scale is {scale_bad:g}; it should have halved "
                    "to 32768.", "call scaler.update() after scaler.step(opt): it lowers the scale after an "
                    "overflow and raises it after a run of good steps.")
    if not math.isclose(scale, 2.0**16):
        return fail(f"after a good step the scale is {scale:g}, expected 65536 unchanged.")
    return ok("the update matches a correct fp16 step, and a step with inf gradients is skipped and halves "
              "the scale.")


# --- 3. a training loop without host syncs ----------------------------------------------------------------

_READS = {"item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__"}


class _HostReads(TorchFunctionMode):
    """Notes each read of a tensor's value by the host (``.item()``, ``float()``, ``.cpu()``, ``if t:``...)
    with the number of optimizer steps done when it happened."""

    def __init__(self, steps: list[int], inside_step: list[bool]) -> None:
        super().__init__()
        self.steps, self.inside_step = steps, inside_step
        self.reads: list[tuple[str, int]] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        to_cpu = name == "to" and any(str(a) == "cpu" for a in [*args[1:], *(kwargs or {}).values()])
        if (name in _READS or to_cpu) and not self.inside_step[0]:
            self.reads.append((name, self.steps[0]))
        return func(*args, **(kwargs or {}))


def _loop_setup(n: int = 8) -> tuple[nn.Module, torch.optim.Optimizer, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)) for _ in range(n)]
    return model, torch.optim.SGD(model.parameters(), lr=0.05), batches


def _reference_losses() -> list[float]:
    model, opt, batches = _loop_setup()
    out = []
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def check_no_sync_loop(train_epoch: Callable[..., Any]) -> Verdict:
    """Exercise: ``train_epoch(model, opt, batches)`` trains on each ``(x, y)`` with ``F.mse_loss`` and
    returns the per-step losses as Python floats, without reading any value back to the host before
    the last step has been queued."""
    if not callable(train_epoch):
        return fail(f"expected your function, got {type(train_epoch).__name__}.")
    model, opt, batches = _loop_setup()
    steps, inside = [0], [False]

    def pre(*_: Any) -> None:
        inside[0] = True

    def post(*_: Any) -> None:
        inside[0] = False
        steps[0] += 1

    opt.register_step_pre_hook(pre)
    opt.register_step_post_hook(post)
    mode = _HostReads(steps, inside)
    try:
        with mode:
            losses = train_epoch(model, opt, batches)
    except Exception as exc:  # the student's code: report any failure as feedback
        return fail(f"your function raised {type(exc).__name__}: {exc}")
    want = _reference_losses()
    if steps[0] != len(batches):
        return fail(f"the optimizer stepped {steps[0]} times for {len(batches)} batches.", "one opt.step() per batch.")
    if not isinstance(losses, list | tuple) or len(losses) != len(want):
        return fail(f"expected a list of {len(want)} losses, got {type(losses).__name__}"
                    f"{f' of length {len(losses)}' if hasattr(losses, '__len__') else ''}.")
    if not all(isinstance(v, float) for v in losses):
        kinds = sorted({type(v).__name__ for v in losses})
        return fail(f"the losses should be Python floats, got {', '.join(kinds)}.",
                    "convert once, after the loop: torch.stack(losses).tolist().")
    if not all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7) for a, b in zip(losses, want, strict=True)):
        return fail("your losses differ from the loop's: did the training change?",
                    "keep each step as it was (forward, loss, backward, step, zero_grad); change only how "
                    "the losses are kept.")
    early = [(name, k) for name, k in mode.reads if k < len(batches)]
    if early:
        name, k = early[0]
        return fail(f"the host read a tensor's value ({name}) after {k} of {len(batches)} steps, "
                    f"{len(early)} such read(s) in all: on a GPU the CPU waits there until the GPU has "
                    "finished, and the GPU then idles until the CPU queues the next step.",
                    "keep the loss tensors (loss.detach()) in a list and convert them once after the loop.")
    return ok(f"{len(want)} steps queued without a single read back; the losses are converted once, at the end.")


