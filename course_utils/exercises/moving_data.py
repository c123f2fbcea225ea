"""Checkers for notebook 02 (moving data).

Device bugs hide on a machine with one device: when everything is on the CPU, forgetting a ``.to()``
changes nothing. So the checkers also run your code on the **meta** device, which every PyTorch build
has (tensors with a shape and a dtype but no data): a tensor left behind on the CPU then meets one on
``meta`` and PyTorch raises, as it would with a GPU. Where an accelerator is present (CUDA, MPS...) the
checkers run on it too.

Besides the results, the checkers watch what your function does, so that they can say what went wrong:
the device of the model's input at each forward pass, the model's train/eval mode then and which module
ran (a forward pre-hook: a copy of the model carries it too), the arguments of the loss function and their
order (exercise 2 passes its own ``loss_fn``), the devices of the parameters each optimizer is built with
(exercise 1: an optimizer built before ``model.to`` breaks the rule of section 2), the tensors of your
function when it raises (which one was on which device), whether the batches you were given are left as
they were, and whether the process's global settings (default device, default dtype, grad mode) are as
they were after it returns (they are set back either way).

Exercise 1 runs on the CPU three times: 3 batches of 16 (the default lr), 5 batches of 8 with ``lr=0.2``
(a learning rate written into the function shows), and batches of 16, 16 and 5 samples (the mean of the
per-batch losses, as the loop you were given computes it, differs from the mean over the samples).
Exercise 2's CPU run gives targets in float64, and its ``loss_fn`` takes them in any floating dtype: a
function that casts the targets (``y.to(a_parameter)``) shows.

Numbers are compared on the CPU against a reference run with the same seed, with
``torch.allclose(rtol=1e-4, atol=1e-6)`` (against the CPU's figures on an accelerator: ``rtol=1e-3,
atol=1e-5``). A right answer that adds in another order or accumulates in float64 differs from the reference
in the last bits, and passes.
"""

from __future__ import annotations

import ast
import dis
import inspect
import re
import textwrap
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..devices import accelerator_type
from . import Verdict, exercise, fail, ok

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

TOLERANCE = {"rtol": 1e-4, "atol": 1e-6}
"""How close a result must be to the reference's, on the CPU."""
DEVICE_TOLERANCE = {"rtol": 1e-3, "atol": 1e-5}
"""How close a result on an accelerator must be to the CPU's."""


# --------------------------------------------------------------------------------------------------
# Shared data: a tiny regression problem, drawn on the CPU with a seed (so every device sees the same).


def make_model(seed: int = 0) -> nn.Module:
    """The exercises' model: Linear(4, 8) → ReLU → Linear(8, 1), on the CPU, seeded."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


class _Regressor(nn.Module):
    """Exercise 2's model: `make_model`'s layers (the same initial weights), but not an ``nn.Sequential``, so
    that an answer that indexes the model (``model[0]``) fails: ``train_step`` takes any model."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.hidden = nn.Linear(4, 8)
        self.out = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


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


def _close(a: torch.Tensor, b: torch.Tensor, tolerance: Mapping[str, float] = TOLERANCE) -> bool:
    return torch.allclose(a.detach().cpu().double(), b.detach().cpu().double(), rtol=tolerance["rtol"],
                          atol=tolerance["atol"])


def _describe_error(exc: BaseException, where: str) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else "(no message)"
    text = text if len(text) <= 120 else text[:120].rsplit(" ", 1)[0] + " …"
    return f"{where} it raised {type(exc).__name__}: {text.rstrip('.!')}"


def _stop(text: str) -> str:
    return text if text.endswith(("!", "?", ".")) else text + "."


def _listing(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _first(*checks: Callable[[], Verdict | None]) -> Verdict | None:
    """The first verdict the checks give, in order (None when none gives one). A failing Verdict is falsy,
    hence no ``or``."""
    for check in checks:
        verdict = check()
        if verdict is not None:
            return verdict
    return None


# --------------------------------------------------------------------------------------------------
# What the checkers watch while the student's function runs.


@dataclass
class _Watch:
    """The model's input at each forward (with the parameters' device then), the mode (``training``) of the
    module that ran each forward and whether it was the watched model itself (a copy of it carries the hook
    too), the model's outputs, each call of the loss function the checker passed and what it returned, and
    the parameters' devices of each optimizer built (when asked)."""

    inputs: list[tuple[torch.Tensor, torch.device | None]] = field(default_factory=list)
    modes: list[bool] = field(default_factory=list)
    copies: int = 0
    outputs: list[Any] = field(default_factory=list)
    losses: list[tuple[Any, Any]] = field(default_factory=list)
    results: list[torch.Tensor] = field(default_factory=list)
    optimizers: list[list[torch.device]] = field(default_factory=list)

    def loss_fn(self, prediction: Any, target: Any) -> torch.Tensor:
        """The loss function exercise 2 passes: mean squared error, recorded. It takes a target of another
        floating dtype than the prediction (converted to the prediction's, as a caller's loss might), so
        that a float64 target given by the checker reaches it, unless the function cast it."""
        self.losses.append((prediction, target))
        if (isinstance(prediction, torch.Tensor) and isinstance(target, torch.Tensor)
                and target.dtype != prediction.dtype and target.is_floating_point()):
            target = target.to(prediction.dtype)
        result = F.mse_loss(prediction, target)
        self.results.append(result)
        return result

    def produced(self, value: Any) -> bool:
        """Whether ``value`` is (or was computed from) the model's output: one of the outputs seen, or a
        tensor that requires grad."""
        return isinstance(value, torch.Tensor) and (value.requires_grad or any(value is o for o in self.outputs))


@contextmanager
def _watching(model: nn.Module, optimizers: bool = False) -> Iterator[_Watch]:
    watch = _Watch()

    def before_forward(module: nn.Module, args: tuple[Any, ...]) -> None:
        watch.modes.append(module.training)
        watch.copies += module is not model
        if args and isinstance(args[0], torch.Tensor):
            param = next(module.parameters(), None)
            watch.inputs.append((args[0], None if param is None else param.device))

    def after_forward(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        watch.outputs.append(output)

    handles = [model.register_forward_pre_hook(before_forward), model.register_forward_hook(after_forward)]
    original = torch.optim.Optimizer.__init__

    def built(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        watch.optimizers.append([p.device for group in self.param_groups for p in group["params"]])

    if optimizers:
        torch.optim.Optimizer.__init__ = built  # type: ignore[method-assign]
    try:
        yield watch
    finally:
        torch.optim.Optimizer.__init__ = original  # type: ignore[method-assign]
        for handle in handles:
            handle.remove()


@dataclass(frozen=True)
class _Settings:
    """The process's global settings a function might change and leave changed."""

    device: torch.device
    dtype: torch.dtype
    grad: bool

    @staticmethod
    def now() -> _Settings:
        return _Settings(torch.get_default_device(), torch.get_default_dtype(), torch.is_grad_enabled())

    def restore(self) -> list[tuple[str, Any, Any]]:
        """Set the settings back to these; return what had changed: (setting, before, after) for each."""
        after = _Settings.now()
        changed = [(name, getattr(self, name), getattr(after, name)) for name in ("device", "dtype", "grad")
                   if getattr(self, name) != getattr(after, name)]
        if self.device.type == "cpu" or after.device != self.device:
            # also removes a default of cpu set by the function (the same device, but a global mode all the same)
            torch.set_default_device(None if self.device.type == "cpu" else self.device)
        torch.set_default_dtype(self.dtype)
        torch.set_grad_enabled(self.grad)
        return changed


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Exception | None,
                                                                      list[tuple[str, Any, Any]]]:
    """Call the student's ``fn``: (what it returned, the exception it raised or None, the global settings it
    left changed). The settings are set back whatever happened."""
    before = _Settings.now()
    result: Any = None
    error: Exception | None = None
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:
        error = exc
    finally:
        changed = before.restore()
    return result, error, changed


_SETTING_EFFECT = {
    "device": ("the default device", "torch.zeros(2) made anywhere lands on {after}",
               "Give the tensor you make its device with device= (a `with torch.device(...):` block, which puts "
               "the default back on exit, works too) instead of setting the process's default device."),
    "dtype": ("the default dtype", "torch.zeros(2) made anywhere is {after}",
              "Pass dtype= (or convert with .to()) where you need another dtype, instead of setting the "
              "process's default dtype."),
    "grad": ("the grad mode", "torch.is_grad_enabled() is {after} for the caller's code too",
             "Use a `with torch.no_grad():` block around the lines that need it: it puts the grad mode back on "
             "exit."),
}


def _settings_changed(changed: list[tuple[str, Any, Any]], where: str) -> Verdict:
    """A failing verdict naming the global settings the function left changed."""
    what = "; ".join(f"{_SETTING_EFFECT[name][0]} from {before} to {after} (after it, "
                     f"{_SETTING_EFFECT[name][1].format(after=after)})" for name, before, after in changed)
    first = changed[0][0]
    where_taught = "Section 5, 'Default devices': the default device" if first == "device" else \
        f"{_SETTING_EFFECT[first][0].capitalize()}, like the default device (section 5, 'Default devices'),"
    return fail(f"{where} the function changed a setting of the whole process and left it changed: {what}. "
                "The checker has set it back.",
                f"{where_taught} is a setting of the whole process, for every line that runs after the function, "
                "the caller's included. A function should change only what it is asked to.",
                _SETTING_EFFECT[first][2])


def _mode_changed(model: nn.Module, watch: _Watch, where: str) -> Verdict | None:
    """A failing verdict when the function switched the model (given in train mode) to eval mode, for its
    forward passes or for the caller (None: it trained in train mode and left it so)."""
    left = [name for name, module in model.named_modules() if not module.training]
    if not left and all(watch.modes):
        return None
    hint = ("train() and eval() set a mode that changes what some layers do (dropout, batch norm): it is the "
            "caller's choice. A training function trains in the mode it is given and leaves the model in it.")
    closer = "Remove the call that switches the model to eval mode (.eval(), or .train(False))."
    if left:
        whom = "the model" if "" in left else f"the model's layers {_listing(left)}"
        return fail(f"{where} the function left {whom} in eval mode (model.training was True when the function "
                    f"got it, {model.training} after it).", hint, closer)
    return fail(f"{where} the model ran {watch.modes.count(False)} of its {len(watch.modes)} forward passes in "
                "eval mode (the function switched it, and back): it came in train mode.", hint, closer)


_LIBRARIES = (str(Path(torch.__file__).parent), str(Path(__file__).parents[1]))
"""torch's folder, and course_utils' (where the checkers call the student's function)."""


def _frame_locals(exc: BaseException, fn: Callable[..., Any]) -> dict[str, Any]:
    """The local variables, when ``exc`` was raised, of the innermost frame of the student's code (``fn``, or a
    helper of theirs that it called; the frames of torch and of the checkers aside); empty when there is none."""
    code = getattr(fn, "__code__", None)
    started, found = False, {}
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        mine = frame.f_code is code or not frame.f_code.co_filename.startswith(_LIBRARIES)
        started = started or mine
        if started and mine:
            found = dict(frame.f_locals)
        tb = tb.tb_next
    return found


def _moved_a_module(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while a module was being moved (``module.to()``, ``.cpu()``...)."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name in ("to", "cpu", "cuda", "_apply") and isinstance(frame.f_locals.get("self"),
                                                                                  nn.Module):
            return True
        tb = tb.tb_next
    return False


def _name_of(value: Any, local: Mapping[str, Any], default: str) -> str:
    return next((name for name, v in local.items() if v is value), default)


def _own_device_choice(fn: Callable[..., Any]) -> str | None:
    """How ``fn`` chooses a device of its own instead of asking the model: the notebook's global ``device``,
    ``get_device()`` or ``torch.accelerator.current_accelerator()``; None when it uses none of them."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    for ins in dis.get_instructions(code):
        if ins.opname == "LOAD_GLOBAL" and ins.argval == "device":
            return "the notebook's variable device"
        if ins.opname == "LOAD_GLOBAL" and ins.argval == "get_device":
            return "get_device()"
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval == "current_accelerator":
            return "torch.accelerator.current_accelerator()"
    return None


_DEVICE_NAME = re.compile(r"(cuda|mps|xpu|cpu|meta)(:\d*)?")


def _compared(tree: ast.AST) -> set[int]:
    """The ids of the nodes that are only compared with something (``device.type != "cpu"``, ``x.device ==
    torch.device("cpu")``, ``device.type in ("cuda", "xpu")``): a name there reads where the code runs, it
    does not choose it."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for operand in (node.left, *node.comparators):
            items = operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]
            for item in items:
                found.add(id(item))
                if (isinstance(item, ast.Call) and isinstance(item.func, ast.Attribute | ast.Name)
                        and getattr(item.func, "attr", getattr(item.func, "id", None)) == "device"):
                    found.update(id(arg) for arg in item.args)
    return found


def _names_a_device(fn: Callable[..., Any]) -> str | None:
    """The first device name written in ``fn``'s code to choose a device (a string such as 'cuda' or 'cpu:0',
    or an attribute such as .cuda() or torch.cuda), docstrings, comments and names only compared with (a
    device's type tested) aside; None when it names none."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    compared = _compared(tree)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                and id(node) not in compared and _DEVICE_NAME.fullmatch(node.value)):
            return repr(node.value)
        if isinstance(node, ast.Attribute) and node.attr in ("cuda", "mps", "xpu", "cpu"):
            return f".{node.attr}"
    return None


def _inputs_changed(batches: list[Any], given: list[Any], originals: list[tuple[torch.Tensor, torch.Tensor]],
                    where: str) -> Verdict | None:
    """A failing verdict when the function changed the batches it was given (None: it left them alone)."""
    leave = ("A function should leave its arguments as it got them: the caller may use the same batches again "
             "(another epoch, an evaluation on the CPU).")
    if len(batches) != len(given) or any(a is not b for a, b in zip(batches, given, strict=True)):
        return fail(f"{where} it replaced entries of the list of batches it was given.",
                    leave + " What does .to() give you to work with?",
                    "Bind the moved tensors to names inside the loop; do not write them back into batches.")
    for (x, y), (x0, y0) in zip(batches, originals, strict=True):
        for t, t0, name in ((x, x0, "x"), (y, y0, "y")):
            if t.device != t0.device or t.dtype != t0.dtype or t.shape != t0.shape or not torch.equal(t, t0):
                return fail(f"{where} it changed a batch's {name} it was given in place (its values are not "
                            "the same now).",
                            leave + " Section 1: when nothing has to change, .to() returns the very same "
                            "tensor, so an in-place operation on what it returned changes the caller's batch.",
                            "Use out-of-place operations (a new tensor) on the moved batch, not in-place ones "
                            "(the methods ending in _, or -=).")
    return None


def _diagnose(exc: BaseException, fn: Callable[..., Any], dev: torch.device, watch: _Watch,
              where: str, step: bool) -> Verdict:
    """A failing verdict for an exception raised by the student's function (``step``: exercise 2's
    train_step, else exercise 1's train_epoch), run with ``dev`` as the model's device. ``where`` opens the
    message ("on the CPU", "with device='meta'")."""
    text = str(exc)
    error = _describe_error(exc, "").strip().removeprefix("it raised ")
    raised = _stop(f"{where} it raised {error}")
    local = _frame_locals(exc, fn)
    if isinstance(exc, TypeError) and ("positional argument" in text or "keyword argument" in text) and not local:
        call = ("train_step(model, optimizer, loss_fn, x, y)" if step
                else f"train_epoch(model, batches, device) (lr=0.05 by default), and with lr={_OTHER_LR} too")
        return fail(f"{raised} The checker calls it as {call}.",
                    "Does your function take the arguments the exercise names, in that order?",
                    "Copy the first line (def ...) of the function from the exercise's cell.")
    if "not compiled with CUDA" in text or ("CUDA" in text and "available" in text):
        given = "the model's device" if step else "the device it is given"
        return fail(f"{where} the function asked for CUDA, which this machine does not have ({error}).",
                    f"Code that names a device runs only where that device exists: which device should it use? "
                    f"(Section 5: {given}.)",
                    "Find the device from the model's parameters instead of naming one." if step else
                    "Use the device argument wherever the function names 'cuda'.")
    if step and _moved_a_module(exc):
        return fail(f"{where} train_step moved the model off {dev.type} ({error}).",
                    "Section 5's rule: the caller places the model once; inside a step, the batch follows the "
                    "model, never the other way round.",
                    "Move x and y to where the model is, and leave the model alone.")
    if dev.type == "meta" and any(w in text for w in ("item", "copy out", "no data")):
        return fail(f"{where} the function read a value off the device (.item(), float(), .tolist() or .cpu()): "
                    f"{error}.",
                    "Reading a value off a GPU makes the host wait for the GPU at every step: keep the loss a "
                    "tensor on the device, where it was computed, as the exercise asks.",
                    "Return the detached loss tensor itself; the caller reads the number when it needs it." if step
                    else "Keep the running total a tensor on the device (no .item() or float() in the loop).")
    if "set_data" in text:
        return fail(f"{where} the function assigned a tensor on another device to a tensor's .data ({error}).",
                    "Section 1: a tensor cannot change device in place; .to() gives a new tensor on the other "
                    "device.", "Keep what .to() returns under a name of your own.")
    if isinstance(exc, AttributeError) and "has no attribute 'device'" in text and "NoneType" not in text:
        return fail(f"{where} the function asked a module for its .device, which a module does not have "
                    f"({error}).",
                    "Section 5: a module holds parameters, and each parameter is a tensor that knows its device.",
                    "Take the device of one of model.parameters().")
    if isinstance(exc, TypeError) and "not subscriptable" in text:
        return fail(f"{where} the function indexes the model (model[...]), which only an nn.Sequential allows "
                    f"({error}). The checker's model is another nn.Module, as a caller's may be.",
                    "train_step gets any model: what does every module with weights have, whatever its layers?",
                    "model.parameters() works for any module.")
    if watch.inputs:
        seen, param_device = watch.inputs[-1]
        name = _name_of(seen, local, "its input")
        if param_device is not None and not _same_device(seen.device, param_device):
            if not _same_device(param_device, dev):
                return fail(f"{where} the model's parameters were still on {param_device} when it got {name} on "
                            f"{seen.device} ({error}).",
                            "Section 2: a module's .to() moves all its parameters, in place. Has the model been "
                            "moved to the device?",
                            "Call the model's .to() with the device, before building the optimizer.")
            if step:
                chosen = _own_device_choice(fn)
                why = f": it went to {chosen} ({seen.device} here), not to the model's device" if chosen else ""
                return fail(f"{where} the batch reached the model on {seen.device}{why} ({error}).",
                            "Section 5, 'A function written once': the batch follows the model. Which argument "
                            "of train_step knows where the model is?",
                            "A module has no .device of its own; its parameters do (model.parameters()).")
            return fail(f"{where} the model got {name} on {seen.device}, while its parameters are on "
                        f"{param_device} ({error}).",
                        "A tensor's .to() returns a moved copy and leaves the original where it was (section 1; "
                        "section 3, 'The forgotten assignment'). Which one does the model get?",
                        "Keep what .to(device) returns, for x and for y alike.")
    if step and watch.losses:
        prediction, target = watch.losses[-1]
        if (isinstance(prediction, torch.Tensor) and isinstance(target, torch.Tensor)
                and not _same_device(prediction.device, target.device)):
            name = _name_of(target, local, "the target")
            return fail(f"{where} the loss got the model's output on {prediction.device} and {name} on "
                        f"{target.device} ({error}).",
                        "The loss is one operation on two tensors: both must be on the model's device "
                        "(section 3).", "Move y as you moved x, and keep the result.")
    behind: dict[str, list[str]] = {}
    for n, v in local.items():
        if isinstance(v, torch.Tensor) and not _same_device(v.device, dev):
            behind.setdefault(str(v.device), []).append(n)
    if "device" in text and behind:
        left = "; ".join(f"{_listing(names)} {'was' if len(names) == 1 else 'were'} on {d}"
                         for d, names in behind.items())
        return fail(f"{raised} When it did, {left}, while the model is on {dev}.",
                    "Every tensor that one operation uses must be on one device (section 3), and a tensor's .to() "
                    "returns a moved copy, leaving the original where it was.",
                    "Move each tensor of the batch that meets the model or its output, and keep what .to() "
                    "returns.")
    return fail(raised, "The error names the operation and what it found wrong; for a device error, the two "
                "devices (section 3).",
                "Run your function by hand on the model and batches with a print of each tensor's .device.")


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
                           lr: float = 0.05, losses: list[torch.Tensor] | None = None) -> torch.Tensor:
    """The fixed loop (``losses``: a list to collect each batch's detached loss in)."""
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
        if losses is not None:
            losses.append(loss.detach())
    return total / len(batches)


_OTHER_LR = 0.2
"""The learning rate exercise 1's second run passes (the first and third use the default, 0.05)."""

_CPU_RUNS: tuple[tuple[tuple[int, ...], float | None], ...] = (((16,) * 3, None), ((8,) * 5, _OTHER_LR),
                                                                 ((16, 16, 5), None))
"""Exercise 1 on the CPU: (the batches' sizes, the lr passed or None for the default) of each run. None has
make_batches' default of 4 batches, so that a mean divided by a fixed 4 shows; the second passes another lr,
so that a learning rate written into the function shows; the third has a short last batch, as a DataLoader
gives, so that a mean over the samples (each batch's loss weighted by its size) differs from the loop's mean
of the per-batch losses."""


def _sized_batches(sizes: tuple[int, ...], seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of the given sizes (make_batches' data when they are all equal)."""
    if len(set(sizes)) == 1:
        return make_batches(len(sizes), sizes[0], seed)
    (x, y), = make_batches(1, sum(sizes), seed)
    return [(a.clone(), b.clone()) for a, b in zip(x.split(list(sizes)), y.split(list(sizes)), strict=True)]


def _describe_run(sizes: tuple[int, ...], lr: float | None) -> str:
    batches = (f"{len(sizes)} batches of {sizes[0]}" if len(set(sizes)) == 1
               else f"{len(sizes)} batches of {_listing([str(n) for n in sizes])} samples")
    return f"on the CPU, with {batches}{'' if lr is None else f' and lr={lr}'},"


def _epoch_result(got: Any, where: str, dtype: torch.dtype) -> Verdict | None:
    """What is wrong with the type of train_epoch's result (None: a 0-dim tensor of the loss's ``dtype``,
    without a graph)."""
    if not isinstance(got, torch.Tensor):
        return fail(f"{where} it returned a {type(got).__name__}, not a tensor.",
                    "The exercise asks for the mean loss as a tensor on the device, so that the loop never "
                    "waits for the GPU to hand over a number.",
                    "Keep the running total a tensor (no .item() or float() in the loop) and return it divided "
                    "by the number of batches.")
    if got.dim() != 0:
        return fail(f"{where} it returned a tensor of shape {tuple(got.shape)}, not a 0-dim tensor (one number).",
                    "A 0-dim tensor holds one number and has the shape (). What shape has the tensor your total "
                    "starts from?", "torch.zeros(()) has the shape (); torch.zeros(1) has the shape (1,).")
    if got.requires_grad:
        return fail(f"{where} the returned loss still requires grad: it keeps the graph of every step alive.",
                    "The loop you were given added detached losses: what does a loss that is not detached "
                    "keep in memory?", "Accumulate loss.detach(), as the loop you were given did.")
    if got.dtype != dtype:
        return fail(f"{where} it returned the mean loss as {got.dtype}, while the losses it adds up are {dtype}.",
                    "Section 1: a tensor has a dtype as well as a device, and adding two tensors of different "
                    "dtypes gives the wider one: the total's dtype decides the result's. Which dtype has the loss?",
                    f"Start the total in the loss's dtype ({dtype}, the default), or convert the mean back to it "
                    "before returning it.")
    return None


def _epoch_on_cpu(train_epoch: Callable[..., Any], sizes: tuple[int, ...], lr: float | None) -> Verdict | None:
    cpu = torch.device("cpu")
    n = len(sizes)
    where = _describe_run(sizes, lr)
    model, ref_model = make_model(), make_model()
    batches = _sized_batches(sizes)
    given, originals = list(batches), [(x.clone(), y.clone()) for x, y in batches]
    losses: list[torch.Tensor] = []
    want = _reference_train_epoch(ref_model, _sized_batches(sizes), "cpu", 0.05 if lr is None else lr, losses)
    with _watching(model) as watch:
        got, error, changed = _call(train_epoch, model, batches, cpu, **({} if lr is None else {"lr": lr}))
        if error is not None:
            return _diagnose(error, train_epoch, cpu, watch, "on the CPU", step=False)
    if changed:
        return _settings_changed(changed, where)
    verdict = _first(lambda: _inputs_changed(batches, given, originals, where),
                     lambda: _epoch_result(got, where, want.dtype), lambda: _mode_changed(model, watch, where))
    if verdict is not None:
        return verdict
    if not _close(got, want):
        g, w = float(got), float(want)
        divisor = n * w / g if g else 0.0
        if g and abs(divisor - round(divisor)) < 1e-3 and round(divisor) != n:
            what = (f"the total of the {n} losses, not their mean" if round(divisor) == 1
                    else f"the total divided by {round(divisor)}, though there were {n} batches")
            return fail(f"{where} the mean loss is {g:.5f}, the reference gives {w:.5f}: that is {what}.",
                        "The mean is the total over the number of batches: how many batches does the function "
                        "get?", "Divide by the length of batches, not by a fixed number.")
        if lr is not None and _close(got, _reference_train_epoch(make_model(), _sized_batches(sizes), "cpu")):
            return fail(f"{where} the mean loss is {g:.5f}, the reference gives {w:.5f}: {g:.5f} is what lr=0.05 "
                        f"gives. The function trained with 0.05, not with the lr={lr} it was given.",
                        "The learning rate is an argument: the caller chooses it, and the optimizer must use the "
                        "one the function is given.",
                        "Build the optimizer with the function's lr argument, not with a number.")
        weighted = sum(float(loss) * size for loss, size in zip(losses, sizes, strict=True)) / sum(sizes)
        if len(set(sizes)) > 1 and _close(got, torch.tensor(weighted)):
            return fail(f"{where} the mean loss is {g:.5f}, the reference gives {w:.5f}: {g:.5f} is the mean "
                        f"over the {sum(sizes)} samples (each batch's loss weighted by its size). The exercise's "
                        f"loop returns the mean of the {n} per-batch losses, each batch counting once, whatever "
                        "its size.",
                        "Fix only the device bugs: what the loop you were given returns (the total of its batches' "
                        "losses over the number of batches) stays what it is.",
                        "Add each batch's detached loss as it is, and divide by the number of batches.")
        return fail(f"{where} the mean loss is {g:.5f}, the reference gives {w:.5f}.",
                    "Fix only the device bugs: on the CPU the fixed loop must give the numbers the loop you "
                    "were given gives.", "Keep zero_grad, backward and step in their order, with SGD and lr.")
    if any(not _close(p, q) for p, q in zip(model.parameters(), ref_model.parameters(), strict=True)):
        if all(_close(p, q) for p, q in zip(model.parameters(), make_model().parameters(), strict=True)):
            trained = "a copy of it" if watch.copies else "another model"
            return fail(f"{where} the mean loss is right, but the model it was given still has its initial "
                        f"weights: the function trained {trained}, and the caller's model learnt nothing.",
                        "Section 2: a module's .to() works in place and returns the module itself. The caller "
                        "keeps the model it passed: the training must change that model's weights.",
                        "Train the model you were given: move it with its .to(), without copying it first.")
        return fail(f"{where} the mean loss is right but the trained weights differ from the reference.",
                    "Fix only the device bugs: the loop's training steps stay as they were.",
                    "Keep zero_grad, backward and step in their order, with SGD and lr.")
    return None


def _epoch_elsewhere(train_epoch: Callable[..., Any], dev: torch.device) -> Verdict | None:
    where = f"with device={dev.type!r}"
    model = make_model()
    batches = make_batches()
    given, originals = list(batches), [(x.clone(), y.clone()) for x, y in batches]
    with _watching(model, optimizers=True) as watch:
        got, error, changed = _call(train_epoch, model, batches, dev)
        if error is not None:
            return _diagnose(error, train_epoch, dev, watch, where, step=False)
    if changed:
        return _settings_changed(changed, where)
    off = [n for n, p in model.named_parameters() if not _same_device(p.device, dev)]
    ran_on = {str(d) for _, d in watch.inputs if d is not None}
    if off and len(off) == len(list(model.parameters())) and not any(
            d is not None and _same_device(d, dev) for _, d in watch.inputs):
        stayed = sorted({str(p.device) for p in model.parameters()})
        ran = f", and its forward passes ran on {_listing(sorted(ran_on))}" if ran_on and not watch.copies else ""
        return fail(f"{where} the model was never moved to {dev.type}: its parameters are still on "
                    f"{_listing(stayed)} after the call{ran}.",
                    "The function is given the device to train on: the model must go there, all its parameters "
                    "(section 2: a module's .to() moves them, in place), and the batches follow it.",
                    "Move the model to the device argument with its .to(), at the top, then build the optimizer.")
    early = [devices for devices in watch.optimizers if any(not _same_device(d, dev) for d in devices)]
    if early:
        then = sorted({str(d) for d in early[0] if not _same_device(d, dev)})
        return fail(f"{where} the optimizer was built while the model's parameters were on {_listing(then)}, "
                    f"before the model was moved to {dev.type}.",
                    "Section 2, 'The optimizer question': an optimizer keeps the parameters, and later its "
                    "state, as they are when it is built. What is the rule for the order of the two lines?",
                    "Build the optimizer after the line that moves the model.")
    verdict = _first(lambda: _inputs_changed(batches, given, originals, where),
                     lambda: _epoch_result(got, where, torch.float32))
    if verdict is not None:
        return verdict
    if not _same_device(got.device, dev):
        return fail(f"{where} the returned loss is on {got.device}, not on {dev.type}.",
                    "Where does a tensor live when you make it without saying where? Your total meets the loss "
                    "of every step (section 1, 'Make tensors where they are needed').",
                    "torch.zeros takes a device= argument, and the function is given its device.")
    if off:
        return fail(f"{where} these parameters stayed behind: {', '.join(off)}.",
                    "Section 2: a module's .to() moves every parameter, in place.",
                    "Move the model with its .to(), not parameter by parameter.")
    verdict = _mode_changed(model, watch, where)
    if verdict is not None:
        return verdict
    if dev.type != "meta":
        want = _reference_train_epoch(make_model(), make_batches(), "cpu")
        if not _close(got, want, DEVICE_TOLERANCE):
            return fail(f"on {dev} the mean loss {float(got):.5f} differs from the CPU's {float(want):.5f}.",
                        "The same loop must give the same numbers on every device.")
    return None


@exercise
def check_train_epoch(train_epoch: Callable[..., Any]) -> Verdict:
    """Exercise 1: ``train_epoch(model, batches, device, lr=0.05)`` trains one epoch of SGD on ``device``
    and returns the mean loss as a 0-dim tensor **on that device** (no ``.item()`` inside the loop), builds
    its optimizer after moving the model (section 2's rule), and leaves ``batches`` as it got them, the model
    in its train mode, and the process's default device, default dtype and grad mode as they were. The loss
    keeps its dtype (float32), and the model trained is the caller's (no copy).

    Run on the CPU three times (3 batches of 16; 5 of 8 with lr=0.2; 16, 16 and 5 samples; numbers compared
    with the reference), then on meta and on the accelerator if present.
    """
    if not callable(train_epoch):
        return fail(f"expected a function, got {type(train_epoch).__name__}.",
                    "Pass the function itself (its name, without parentheses), not what calling it returns.")
    # 1. On the CPU: does it still train correctly, for any number of batches?
    for sizes, lr in _CPU_RUNS:
        verdict = _epoch_on_cpu(train_epoch, sizes, lr)
        if verdict is not None:
            return verdict
    # 2. On other devices: does everything follow the device?
    tried = []
    for dev in _other_devices():
        verdict = _epoch_elsewhere(train_epoch, dev)
        if verdict is not None:
            return verdict
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


def _step_without_zero_grad(model: nn.Module, optimizer: torch.optim.Optimizer,
                            loss_fn: Callable[..., torch.Tensor], x: torch.Tensor,
                            y: torch.Tensor) -> torch.Tensor:
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _reference_steps(step: Callable[..., torch.Tensor] = _reference_train_step,
                     steps: int = 2) -> tuple[nn.Module, list[torch.Tensor]]:
    model = _Regressor()
    optimizer = _optimizer(model)
    return model, [step(model, optimizer, F.mse_loss, x, y) for x, y in make_batches(n=steps)]


def _step_result(got: list[Any]) -> Verdict | None:
    if any(g is None for g in got):
        return fail("it returned None.",
                    "The exercise asks train_step to return the loss of the step it made, detached, on the "
                    "model's device.", "Return the loss tensor, detached from its graph.")
    if not all(isinstance(g, torch.Tensor) for g in got):
        kind = next(type(g).__name__ for g in got if not isinstance(g, torch.Tensor))
        return fail(f"it returned a {kind}, not a tensor.",
                    "Reading a number out of a GPU tensor (.item(), float()) waits for the GPU: the exercise "
                    "asks for the loss as a tensor, left on the device, for the caller to read when it needs to.",
                    "Return the tensor itself, detached, not its value.")
    if any(g.requires_grad for g in got):
        return fail("the returned loss still requires grad: as long as the caller holds it, it keeps the step's "
                    "whole graph (every activation) alive.",
                    "What cuts a tensor off from the graph that computed it?",
                    "Tensor.detach() returns the same values without the graph.")
    if any(g.dim() != 0 for g in got):
        shape = next(tuple(g.shape) for g in got if g.dim() != 0)
        return fail(f"the returned loss has shape {shape}, not a 0-dim tensor.",
                    "The loss function already returns one number for the batch (its mean).",
                    "Return the loss function's output as it is, detached.")
    return None


def _returned_dtype(got: list[torch.Tensor], watch: _Watch, where: str) -> Verdict | None:
    """A failing verdict when the returned loss has another dtype than loss_fn's result."""
    given = watch.results[-1].dtype if watch.results else None
    converted = [g.dtype for g in got if given is not None and g.dtype != given]
    if not converted:
        return None
    return fail(f"{where} it returned the loss as {converted[0]}, while loss_fn gave it as {given}.",
                "The exercise asks for the loss as the step computed it: a conversion is one more operation at "
                "every step, and float64 is slow on most GPUs (MPS has none).",
                "Return the detached loss as it is, without converting it.")


def _run_steps(train_step: Callable[..., Any], model: nn.Module, optimizer: torch.optim.Optimizer,
               batches: list[tuple[torch.Tensor, torch.Tensor]], dev: torch.device, watch: _Watch,
               where: str) -> tuple[list[Any], Verdict | None]:
    """One step per batch: what the steps returned, or a failing verdict for the first step that raised or
    left a global setting changed."""
    got: list[Any] = []
    for x, y in batches:
        result, error, changed = _call(train_step, model, optimizer, watch.loss_fn, x, y)
        if error is not None:
            return got, _diagnose(error, train_step, dev, watch, where, step=True)
        if changed:
            return got, _settings_changed(changed, where)
        got.append(result)
    return got, None


def _step_on_cpu(train_step: Callable[..., Any]) -> Verdict | None:
    cpu = torch.device("cpu")
    where = "on the CPU"
    ref_model, want = _reference_steps()
    model = _Regressor()
    optimizer = _optimizer(model)
    # the targets in float64 (the same values): a function that casts them shows
    batches = [(x, y.double()) for x, y in make_batches(n=2)]
    originals = [(x.clone(), y.clone()) for x, y in batches]
    with _watching(model) as watch:
        got, verdict = _run_steps(train_step, model, optimizer, batches, cpu, watch, "on the CPU")
    if verdict is not None:
        return verdict
    changed = _inputs_changed(batches, batches, originals, "on the CPU")
    if changed is not None:
        return changed
    bad = _step_result(got)
    if bad is not None:
        return bad
    if not watch.losses:
        return fail("it never called the loss_fn it was given: it computed a loss of its own.",
                    "train_step gets its loss function as an argument: the caller chooses the loss.",
                    "Compute the loss with loss_fn(prediction, target).")
    if any(watch.produced(t) and not watch.produced(p) for p, t in watch.losses):
        return fail("it called loss_fn with the target first and the model's output second: loss_fn(y, output). "
                    "The mean squared error happens to give the same number both ways; most losses do not.",
                    "PyTorch's loss functions take (input, target): the model's prediction first, the target "
                    "second. For cross-entropy, BCE or KL divergence the two play different parts.",
                    "Swap the two arguments of loss_fn: the model's output first, y second.")
    cast = [t.dtype for p, t in watch.losses
            if isinstance(t, torch.Tensor) and not watch.produced(t) and t.dtype != torch.float64]
    if cast:
        return fail(f"loss_fn got the target as {cast[0]}, but y was given as torch.float64: the function cast y "
                    f"to {cast[0]} while moving it.",
                    "Moving a batch changes its device only. Section 1: .to(a tensor) takes that tensor's dtype as "
                    "well as its device (and section 3 uses .to(a parameter) for the model's input, which must "
                    "meet the weights' dtype). The target is for the loss: class labels, for one, must stay "
                    "integers.",
                    "Move y with the model's device (a torch.device), not with a parameter or a dtype.")
    verdict = _first(lambda: _returned_dtype(got, watch, where), lambda: _mode_changed(model, watch, where))
    if verdict is not None:
        return verdict
    if not _close(got[0], want[0]):
        return fail(f"the first loss is {float(got[0]):.5f}, expected {float(want[0]):.5f}.",
                    "Which loss does a step return: the one its gradients came from, or one computed after "
                    "the update?", "Return the loss of the forward pass that backward() used.")
    if all(_close(p, q) for p, q in zip(model.parameters(), ref_model.parameters(), strict=True)) \
            and _close(got[1], want[1]):
        return None
    if all(_close(p, q) for p, q in zip(model.parameters(), _Regressor().parameters(), strict=True)):
        return fail("after two steps the weights are still the initial ones: the optimizer had no gradients to "
                    "apply (or never stepped).",
                    "In which order must a step's parts run (zero the gradients, forward, loss, backward, step) for "
                    "the gradients to reach the optimizer?",
                    "Clear the gradients before backward(), not between backward() and step().")
    stale_model, _ = _reference_steps(_step_without_zero_grad)
    if all(_close(p, q) for p, q in zip(model.parameters(), stale_model.parameters(), strict=True)):
        return fail("after two steps the weights differ from the reference: the first batch's gradients were "
                    "still there in the second step, nothing cleared them.",
                    "backward() adds into each parameter's .grad: what resets it between steps?",
                    "The optimizer has a method for it; call it at the start of each step.")
    return fail("after two steps the weights differ from the reference.",
                "One optimisation step is: zero the gradients, forward, loss, backward, step; each once.",
                "Compare the order and the number of those calls in your function with that list.")


def _step_elsewhere(train_step: Callable[..., Any], dev: torch.device) -> Verdict | None:
    where = f"with the model on {dev.type!r}"
    model = _Regressor().to(dev)
    optimizer = _optimizer(model)
    batches = make_batches(n=2)
    originals = [(x.clone(), y.clone()) for x, y in batches]
    with _watching(model) as watch:
        got, verdict = _run_steps(train_step, model, optimizer, batches, dev, watch, where)
    if verdict is not None:
        return verdict
    changed = _inputs_changed(batches, batches, originals, where)
    if changed is not None:
        return changed
    bad = _step_result(got)
    if bad is not None:
        return bad
    wrong = [g.device for g in got if not _same_device(g.device, dev)]
    if wrong:
        return fail(f"{where} the loss came back on {wrong[0]}.",
                    "The exercise asks for the loss on the model's device: where was it computed, and what "
                    "moved it?", "Return the detached loss as the loss function gave it, without a .to().")
    off = [n for n, p in model.named_parameters() if not _same_device(p.device, dev)]
    if off:
        return fail(f"{where}, train_step moved these parameters away: {', '.join(off)}.",
                    "Section 5's rule: the caller places the model once; inside a step, the batch follows the "
                    "model, never the other way round.", "Move x and y to where the model is, and leave the "
                    "model alone.")
    verdict = _first(lambda: _returned_dtype(got, watch, where), lambda: _mode_changed(model, watch, where))
    if verdict is not None:
        return verdict
    if dev.type != "meta":
        _, want = _reference_steps()
        if not _close(got[1], want[1], DEVICE_TOLERANCE):
            return fail(f"on {dev} the loss {float(got[1]):.5f} differs from the CPU's {float(want[1]):.5f}.",
                        "The same step must give the same numbers on every device.")
    return None


@exercise
def check_train_step(train_step: Callable[..., Any]) -> Verdict:
    """Exercise 2: ``train_step(model, optimizer, loss_fn, x, y)`` with x and y on the CPU and the model on
    any device: moves the batch to the model's device, does one optimisation step with ``loss_fn`` and returns
    the loss, detached, as a 0-dim tensor on that device, in the dtype loss_fn gave it. No device written in
    the function to choose where it runs (a device's type compared is fine); any model (the checker's is not an
    ``nn.Sequential``); ``loss_fn(output, target)`` in that order; x and y left as they were given, and moved
    without a change of dtype (the CPU run gives float64 targets); the model left in its train mode and the
    process's global settings as they were.
    """
    if not callable(train_step):
        return fail(f"expected a function, got {type(train_step).__name__}.",
                    "Pass the function itself (its name, without parentheses), not what calling it returns.")
    named = _names_a_device(train_step)
    if named == ".cpu":
        return fail("the function moves a tensor to the CPU (.cpu()): the exercise asks for the loss on the model's "
                    "device, and for no device named in the function.",
                    "Why does the exercise leave reading the loss to the caller? (Reading it waits for the GPU.)",
                    "Return the detached loss where the loss function computed it.")
    if named is not None:
        what = "CUDA" if "cuda" in named else "a device"
        return fail(f"the function names {what} ({named}): it then runs where that device is, not where the "
                    "model is (and fails where that device does not exist).",
                    "Section 5, 'A function written once': a device-agnostic function learns the device from "
                    "what it is given. Which of its arguments knows where the work must happen?",
                    "The model's parameters know their device.")
    verdict = _step_on_cpu(train_step)
    if verdict is not None:
        return verdict
    tried = []
    for dev in _other_devices():
        verdict = _step_elsewhere(train_step, dev)
        if verdict is not None:
            return verdict
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


_QUIZ_TOPIC_OF = {"a": "device", "e": "device", "g": "device", "b": "dtype", "d": "dtype", "c": "copy",
                  "f": "tensor", "h": "module"}
"""Which rule each quiz case is about (several cases share one, so that a topic does not give its case away)."""

_QUIZ_TOPICS = {
    "device": "a device asked of a tensor (.to(a device), .cpu()): is the tensor there already? (section 1)",
    "dtype": "a dtype asked of a tensor: has the tensor that dtype already? (section 1)",
    "copy": "copy=True (section 1)",
    "tensor": ".to(another tensor), which asks for that tensor's dtype and device (section 1)",
    "module": "a module's .to() (section 2: in place)",
}


def _is_bool(value: Any) -> bool:
    """True or False, as a Python bool or a NumPy one (np.bool_, what comparing arrays gives)."""
    kind = type(value)
    return isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_"))


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


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


@exercise
def check_quiz(answers: Mapping[str, Any], explain: bool = False) -> Verdict:
    """Exercise 3: ``answers[key]`` is True when the expression returns the same object, else False.

    With every answer right and ``explain=True``, the verdict also gives the reason for each case (the
    hidden solution cell leaves it out, so its stored output does not give the answers away).
    """
    if not isinstance(answers, Mapping):
        return fail(f"expected a dict like {{'a': True, 'b': False, ...}}, got {type(answers).__name__}.",
                    "The exercise's cell shows the form: a dict from each case's letter to True or False.")
    unknown = sorted(set(map(str, answers)) - QUIZ.keys())
    if unknown:
        return fail(f"unknown case(s) {', '.join(unknown)}; the cases are {', '.join(QUIZ)}.",
                    "use the letters shown above as keys.")
    missing = [k for k in QUIZ if answers.get(k) is None]
    odd = [f"{k} ({_type_name(answers[k])})" for k in QUIZ if k not in missing and not _is_bool(answers[k])]
    if missing or odd:
        parts = ([f"missing: {', '.join(missing)}"] if missing else []) + \
                ([f"not True/False: {', '.join(odd)}"] if odd else [])
        return fail(f"answer every case with True or False; {'; '.join(parts)}.",
                    "True = the same object comes back, False = a new object.")
    truth = quiz_truth()
    wrong = [k for k in QUIZ if bool(answers[k]) != truth[k]]
    if wrong:
        topics = list(dict.fromkeys(_QUIZ_TOPICS[_QUIZ_TOPIC_OF[k]] for k in wrong))
        concern = topics[0] if len(topics) == 1 else "; ".join(topics[:-1]) + "; and " + topics[-1]
        return fail(f"{len(wrong)} of {len(QUIZ)} wrong.",
                    "Section 1's rule: .to() returns a new tensor only when something has to change (and a copy "
                    f"asked for is always new). Your {'wrong answer concerns' if len(wrong) == 1 else 'wrong answers concern'}"
                    f" {concern}.",
                    f"The wrong {'one' if len(wrong) == 1 else 'ones'}: {', '.join(wrong)}. Run each of those "
                    "expressions followed by `is x` (or `is model`) and compare with your answer.")
    if not explain:
        return ok(f"all {len(QUIZ)} right. check_quiz(answers, explain=True) gives the reason for each.")
    return ok(f"all {len(QUIZ)} right.\n" + "\n".join(f"  {k}) {why}" for k, (_, why) in QUIZ.items()))
