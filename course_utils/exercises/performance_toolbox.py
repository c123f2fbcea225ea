"""Checkers for notebook 07 (the performance toolbox). They run on the CPU, so every student gets feedback.

1. `check_profile_reading`: what a shipped GPU trace (`MYSTERY_TRACE`) says, read with the tools of
   section 1.
2. `check_recompile_fix`: `smoothed_loss` recompiles for every new smoothing value; a version that does not.
3. `check_scheduled_replays`: a training step captured once in a CUDA graph and replayed while a learning-rate
   schedule runs, against eager steps with the schedule (on a GPU for real; on the CPU through
   `course_utils.performance.cuda_graph_standin`).
4. `check_loader_options`: ``DataLoader`` options that hide `SlowReads`' slow storage from a training loop,
   within a budget of processes and memory.
"""

from __future__ import annotations

import functools
import math
import numbers
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from ..performance.compiling import recompile_messages
from ..performance.cuda_graph_standin import cpu_cuda_graphs
from ..performance.datasets import SlowReads
from ..performance.traces import (
    CPU_ROW,
    GPU_ROW,
    STEP_ROW,
    Span,
    busy_fraction,
    host_waits,
    idle_gaps,
    read_trace,
)
from . import Verdict, exercise, fail, ok

__all__ = ["BOTTLENECKS", "MYSTERY_TRACE", "PEAK_LR", "REPLAYS", "WARM_UP", "LoaderBudget", "check_loader_options",
           "check_profile_reading", "check_recompile_fix", "check_scheduled_replays", "smoothed_loss"]


# --- 1. reading a profile ---------------------------------------------------------------------------------

MYSTERY_TRACE = Path(__file__).parents[1] / "data" / "mystery_steps.json.gz"
"""Three training steps profiled on an H200 (tools/make_traces.py), gzipped as tensorboard_trace_handler writes."""
BOTTLENECKS = ("GPU-bound", "launch-bound", "host reads", "input pipeline")


def _idle_time_by_span(spans: list[Span]) -> dict[str, float]:
    """For each name on the CPU and step rows (``ProfilerStep#`` markers left out), the µs of GPU idle gaps
    that its spans cover: what the host was doing while the GPU had nothing to do."""
    gaps = idle_gaps(spans, GPU_ROW)
    covered: dict[str, float] = {}
    for s in spans:
        if s.row in (CPU_ROW, STEP_ROW) and not s.name.startswith("ProfilerStep#"):
            overlap = sum(max(0.0, min(s.end_us, g0 + glen) - max(s.start_us, g0)) for g0, glen in gaps)
            if overlap > 0:
                covered[s.name] = covered.get(s.name, 0.0) + overlap
    return covered


def _merged_busy_us(spans: list[Span], row: str) -> float:
    """The µs in which something ran on ``row`` (overlapping spans counted once)."""
    busy, end = 0.0, float("-inf")
    for s in sorted((s for s in spans if s.row == row), key=lambda s: s.start_us):
        if s.end_us > end:
            busy += s.end_us - max(s.start_us, end)
            end = s.end_us
    return busy


@functools.lru_cache(maxsize=8)
def _truth(path: Path) -> dict[str, Any]:
    """What the trace at ``path`` shows, and the figures a plausible wrong answer would give instead."""
    spans = read_trace(path)
    steps = sum(1 for s in spans if s.row == STEP_ROW and s.name.startswith("ProfilerStep#"))
    covered = _idle_time_by_span(spans)
    waits = host_waits(path)
    whole = max(s.end_us for s in spans) - min(s.start_us for s in spans)
    has_cpu = any(s.row == CPU_ROW for s in spans)
    return {"gpu_busy": busy_fraction(spans, GPU_ROW), "host_waits_per_step": len(waits) / max(steps, 1),
            "culprit": max(covered, key=covered.__getitem__) if covered else "",
            # what the wrong answers measure
            "steps": steps, "waits": len(waits), "item_reads": sum(1 for s in spans if s.row == CPU_ROW and
                                                                    s.name == "aten::item"),
            "gpu_busy_whole_trace": _merged_busy_us(spans, GPU_ROW) / whole if whole > 0 else 0.0,
            "cpu_busy": busy_fraction(spans, CPU_ROW) if has_cpu else None,
            "covered": covered, "idle_us": sum(length for _, length in idle_gaps(spans, GPU_ROW)),
            "gpu_names": {s.name for s in spans if s.row == GPU_ROW},
            "span_names": {s.name for s in spans if s.row in (CPU_ROW, STEP_ROW)}}


def _bottleneck(truth: Mapping[str, Any]) -> str:
    """The bottleneck of a trace, from what its GPU idles during (the rules the notebook's text gives)."""
    if truth["gpu_busy"] >= 0.9:
        return "GPU-bound"
    if "DataLoader" in truth["culprit"]:
        return "input pipeline"
    if truth["host_waits_per_step"] >= 2:
        return "host reads"
    return "launch-bound"


GPU_BUSY_REL_TOL = 0.1
"""Exercise 1's tolerance on ``gpu_busy``, relative: the mystery trace's GPU is busy about 1% of the time, so an
absolute 0.02 would accept 0 (a GPU that never ran)."""
WAITS_ABS_TOL = 0.01
"""Exercise 1's tolerance on ``host_waits_per_step``, absolute: 2.33 for 7 waits in 3 steps is right."""
_FLOAT_SLACK = 1e-9  # a value exactly on a tolerance's limit passes, whatever its last bits


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a real number (a 1-element tensor or array too), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    return None


def _near(value: float, target: float | None) -> bool:
    """``value`` within `GPU_BUSY_REL_TOL` of ``target``, relative to ``target``."""
    return target is not None and abs(value - target) <= GPU_BUSY_REL_TOL * abs(target) * (1 + _FLOAT_SLACK)


@exercise
def check_profile_reading(answers: Mapping[str, Any], path: str | Path = MYSTERY_TRACE) -> Verdict:
    """Exercise: ``answers`` says what the trace at ``path`` shows:

    - ``gpu_busy``: the GPU row's busy fraction (from its first span to its last), within 10% of its value: a
      relative tolerance, since the fraction itself may be small; a value exactly 10% off passes;
    - ``host_waits_per_step``: the host's waits for the GPU per profiler step, within 0.01 (limit included);
    - ``culprit``: the name of the span, on the CPU or step rows, that covers most of the GPU's idle time
      (``ProfilerStep#`` markers left out; spans of one name added up), exactly as the trace writes it;
    - ``bottleneck``: one of `BOTTLENECKS`, the one that fits the three figures.

    Numbers may be Python, NumPy or 1-element tensor numbers. A wrong figure that another plausible
    measurement gives (the idle fraction, the CPU row's, the whole trace's length, the total over all steps)
    is named as such."""
    keys = ("gpu_busy", "host_waits_per_step", "culprit", "bottleneck")
    if not isinstance(answers, Mapping) or any(k not in answers for k in keys):
        got = f"the keys {', '.join(map(repr, answers))}" if isinstance(answers, Mapping) else type(answers).__name__
        return fail(f"expected a dict with the keys {', '.join(keys)}; got {got}.",
                    "fill in the dict of the exercise cell: one value per key.")
    missing = [k for k in keys if answers[k] is None]
    if missing:
        return fail(f"{', '.join(missing)} still None.",
                    "each key is something section 1 measured on its own traces: how busy the GPU row is, where "
                    "the host waited for the GPU, what the host did while the GPU had nothing to do.",
                    "read the trace with read_trace(MYSTERY_TRACE) and use the functions section 1 imported "
                    "from course_utils.performance.traces on it.")
    truth = _truth(Path(path))
    busy = _number(answers["gpu_busy"])
    if busy is None or not 0 <= busy <= 1:
        if busy is not None and 1 < busy <= 100 and _near(busy / 100, truth["gpu_busy"]):
            return fail(f"gpu_busy = {busy:.4g} looks like a percentage; the exercise asks for a fraction between "
                        "0 and 1.", "a fraction of the time: the share of it, 1 for always.")
        return fail(f"gpu_busy should be a fraction between 0 and 1, got {answers['gpu_busy']!r}.",
                    "a fraction of the time: 0 for a GPU that never ran, 1 for one that never stopped.")
    if not _near(busy, truth["gpu_busy"]):
        hint = ("the GPU's busy fraction: the time in which something ran on the GPU row, over the time from its "
                "first piece of work to its last.")
        closer = "section 1 printed a row's busy fraction with one of the trace functions: give it the GPU's row."
        if busy == 0:
            return fail(f"gpu_busy = 0 would be a GPU that never ran; the trace's GPU row has "
                        f"{len(truth['gpu_names'])} different kernels, copies and memsets.", hint, closer)
        if _near(busy, 1 - truth["gpu_busy"]):
            return fail(f"gpu_busy = {busy:.4g} is the share of the time the GPU was idle, not busy.", hint, closer)
        if _near(busy, truth["cpu_busy"]):
            return fail(f"gpu_busy = {busy:.4g} is the busy fraction of the CPU row (the host's operators), not of "
                        "the GPU's.", hint, closer)
        if _near(busy, truth["gpu_busy_whole_trace"]):
            return fail(f"gpu_busy = {busy:.4g} is the GPU's busy time over the length of the whole trace; the "
                        "exercise measures it from the GPU's first piece of work to its last.", hint, closer)
        return fail(f"gpu_busy = {busy:.4g} is not what the trace's GPU row shows.", hint, closer)
    waits = _number(answers["host_waits_per_step"])
    if waits is None or abs(waits - truth["host_waits_per_step"]) > WAITS_ABS_TOL * (1 + _FLOAT_SLACK):
        hint = ("a wait is any point where the host stops until the GPU has finished its queue (section 1, "
                "\"What a host read costs\"): value reads and blocking copies alike; count them per profiler step.")
        closer = ("host_waits(MYSTERY_TRACE) lists each wait once (it reads the file, not the spans); the step "
                  "row's ProfilerStep# spans count the steps.")
        steps = truth["steps"]
        if waits is None:
            return fail(f"host_waits_per_step should be a number, got {answers['host_waits_per_step']!r}.", hint,
                        closer)
        if steps > 1 and math.isclose(waits, truth["waits"]):
            return fail(f"host_waits_per_step = {waits:g} is the number of waits in the whole trace, over its "
                        f"{steps} steps.", hint, closer)
        if truth["waits"] > truth["item_reads"] and math.isclose(waits * steps, truth["item_reads"]):
            return fail(f"host_waits_per_step = {waits:g} counts the value reads (aten::item) only; the host "
                        "waits for the GPU in other operators too.", hint, closer)
        return fail(f"host_waits_per_step = {waits:g} is not what the trace shows.", hint, closer)
    culprit = answers["culprit"]
    if culprit != truth["culprit"]:
        hint = ("add up, per name, how much of the GPU's idle gaps each span covers: on the CPU row and on the "
                "step row, whose annotations enclose the CPU's operators.")
        closer = ("idle_gaps(mystery, GPU_ROW) gives the gaps as (start, length); a span and a gap overlap by "
                  "min(their ends) - max(their starts) when that is positive. Leave the ProfilerStep# markers out.")
        idle_ms = truth["idle_us"] / 1e3
        if not isinstance(culprit, str):
            return fail(f"culprit should be a span's name (a string), got {culprit!r}.", hint, closer)
        if culprit.startswith("ProfilerStep#"):
            return fail(f"{culprit!r} is the profiler's marker of a whole step: it covers every gap of its step, "
                        "so it names no cause.", hint, closer)
        if culprit not in truth["span_names"]:
            if culprit and any(culprit in name for name in truth["gpu_names"]):
                return fail(f"{culprit!r} runs on the GPU row; the culprit is what the host was doing while the GPU "
                            "had nothing to do.", hint, closer)
            if culprit and any(culprit in name for name in truth["span_names"]):
                return fail(f"{culprit!r} is part of a span's name: give the whole name, as the trace writes it.",
                            hint, closer)
            return fail(f"no span of the CPU or step rows is called {culprit!r}.", hint, closer)
        mine = truth["covered"].get(culprit, 0.0) / 1e3
        return fail(f"{culprit!r} covers {mine:.1f} ms of the GPU's {idle_ms:.1f} ms of idle time; another name "
                    "covers more.", hint, closer)
    bottleneck = answers["bottleneck"]
    if bottleneck not in BOTTLENECKS:
        return fail(f"bottleneck must be one of {', '.join(map(repr, BOTTLENECKS))}; got {bottleneck!r}.",
                    "the four names are written as the exercise gives them.")
    right = _bottleneck(truth)
    if bottleneck != right:
        hint = ("each bottleneck names what the GPU waits for: its own work (GPU-bound), the CPU's launches "
                "(launch-bound), the host's reads (host reads), the next batch (input pipeline). What was the "
                "host doing while this GPU idled?")
        closer = "your culprit is the answer to that question: which part of a training loop runs it?"
        if right == "GPU-bound":
            why = f"a GPU busy {busy:.0%} of the time waits for nothing"
        elif bottleneck == "GPU-bound":
            why = f"a GPU busy {busy:.1%} of the time spends most of it waiting"
        elif bottleneck == "host reads":
            why = (f"the host waited {waits:g} times per step, but the GPU's idle time is mostly spent in your "
                   "culprit, not in a wait")
        elif bottleneck == "launch-bound":
            why = ("a launch-bound GPU idles between kernels that the CPU is launching; this one idles mostly while "
                   "the host is in your culprit")
        else:
            why = "the GPU idles mostly while the host is in your culprit, which loads no data"
        return fail(f"{bottleneck!r} does not fit what you measured: {why}.", hint, closer)
    return ok("busy fraction, host waits, the span behind the idle GPU and the bottleneck all match the trace.")


# --- 2. a recompilation -----------------------------------------------------------------------------------

def smoothed_loss(logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> torch.Tensor:
    """The exercise's loss: cross-entropy with label smoothing, whose strength a schedule lowers every step."""
    return F.cross_entropy(logits, target, label_smoothing=smoothing)


_SCHEDULE = [0.2 * (1 - i / 10) for i in range(10)]
_OTHER_SHAPES = [(7, 5, 0.3), (3, 4, 0.0)]
"""Exercise 2's other inputs, run without compiling: (batch, classes, smoothing). Another number of classes than
the schedule's 10 (an answer written for 10 only fails), and a smoothing of 0."""


def _loss_inputs() -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(16, 10, generator=g), torch.randint(0, 10, (16,), generator=g)
    return [(logits, target, s) for s in _SCHEDULE]


def _other_inputs() -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(n, c, generator=g), torch.randint(0, c, (n,), generator=g), s) for n, c, s in _OTHER_SHAPES]


def _graphs_and_values(fn: Callable[..., torch.Tensor], inputs: list[tuple[torch.Tensor, torch.Tensor, float]]
                       ) -> tuple[int, bool, list[Any]]:
    """How many times ``fn`` is recompiled over the smoothing schedule (backend "eager": no compiler needed),
    whether that hit the recompile limit, and its values."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="eager")
    with recompile_messages() as messages:
        values = [compiled(*args) for args in inputs]
    torch._dynamo.reset()
    recompiles = sum(m.startswith("Recompiling function") for m in messages)
    return recompiles, any("recompile_limit" in m for m in messages), values


def _first_difference(got: list[Any], args: list[tuple[torch.Tensor, torch.Tensor, float]]) -> str | None:
    """How ``got`` first differs from `smoothed_loss` on ``args`` (a sentence), or None when it does not."""
    for value, (logits, target, smoothing) in zip(got, args, strict=True):
        want = smoothed_loss(logits, target, smoothing)
        if not isinstance(value, torch.Tensor):
            return f"for smoothing {smoothing:g} your function returned a {type(value).__name__}, not a tensor"
        if value.shape != want.shape:
            return (f"for smoothing {smoothing:g} your function returned a tensor of shape {tuple(value.shape)}; "
                    f"smoothed_loss returns one of shape {tuple(want.shape)} (the mean over the batch)")
        if not torch.allclose(value.detach().float(), want, atol=1e-5):
            return (f"for smoothing {smoothing:g} your function gives {value.item():.4f} and smoothed_loss "
                    f"{want.item():.4f}")
    return None


@exercise
def check_recompile_fix(fn: Callable[..., torch.Tensor]) -> Verdict:
    """Exercise: ``fn(logits, target, smoothing)`` computes `smoothed_loss` (to 1e-5) for every smoothing value
    of the schedule, and ``torch.compile`` captures it whole and recompiles it at most once (automatic dynamic
    shapes allow one). Also checked, without compiling: the values for other shapes and a smoothing of 0
    (`_OTHER_SHAPES`), and that ``fn`` leaves its arguments as they were."""
    if not callable(fn):
        return fail(f"expected your function, got {type(fn).__name__}.",
                    "the exercise asks for a function of (logits, target, smoothing).")
    inputs, others = _loss_inputs(), _other_inputs()
    kept = [(logits.clone(), target.clone()) for logits, target, _ in inputs[:1] + others]
    try:
        recompiles, hit_limit, got = _graphs_and_values(fn, inputs)
        got_others = [fn(*args) for args in others]
    except Exception as exc:  # the student's code: report any failure as feedback
        return fail(f"your function raised {type(exc).__name__}: {str(exc).splitlines()[0]}",
                    "the checker calls it as the training script does, with torch.compile around it: whatever it "
                    "calls is traced.")
    changed = [name for (logits, target, _), (logits0, target0) in zip(inputs[:1] + others, kept, strict=True)
               for name, now, before in (("logits", logits, logits0), ("target", target, target0))
               if not torch.equal(now, before)]
    if changed:
        return fail(f"your function changed its argument {changed[0]} in place.",
                    "a loss reads its inputs; its caller still needs them (for backward, for logging, for the "
                    "next call).", "an operation whose name ends in _ (sub_, log_softmax_...) or out= writes into "
                    "its tensor: compute into new tensors instead.")
    hint = ("label smoothing mixes the usual cross-entropy with the cross-entropy against a uniform target over "
            "all the classes; the docs of F.cross_entropy give the formula.")
    closer = ("F.cross_entropy's docs write the loss with label smoothing ε as (1 - ε) × the usual term + ε × the "
              "term against a uniform target; the log-probabilities (F.log_softmax) give both terms, each a mean "
              "over the batch.")
    difference = _first_difference(got, inputs)
    if difference:
        return fail(f"your values differ from smoothed_loss's: {difference}.", hint, closer)
    difference = _first_difference(got_others, others)
    if difference:
        return fail(f"your values are right for the schedule's logits (16 × 10 classes) but not for others: "
                    f"{difference}, with logits of {_OTHER_SHAPES[0][1]} classes.", hint,
                    "does your function assume the number of classes or the batch size of the checker's data? "
                    "Read them from logits.")
    explanation = torch._dynamo.explain(fn)(*inputs[0])
    torch._dynamo.reset()
    if explanation.graph_count == 0 or explanation.graph_break_count:
        if explanation.graph_count == 0:
            what = "captured no graph of your function"
        else:
            reason = str(explanation.break_reasons[0].reason).splitlines()[0] if explanation.break_reasons else ""
            what = (f"breaks your function's graph {explanation.graph_break_count} time(s)" +
                    (f" (the first: {reason})" if reason else ""))
        return fail(f"torch.compile {what}: it does not compile it whole.",
                    "the fix keeps the loss compiled, in one graph; what changes is what the graph treats as a "
                    "constant.",
                    "a graph breaks where Dynamo cannot trace: a value read on the host (.item(), float() of a "
                    "tensor), a Python `if` on a tensor, a function it is told to skip (torch.compiler.disable). "
                    "torch._dynamo.explain(fn)(logits, target, 0.1) lists the reasons.")
    if recompiles > 1:
        limit = (f", then hit its recompile limit ({torch._dynamo.config.recompile_limit}) and ran the remaining "
                 "steps without compiling" if hit_limit else "")
        return fail(f"torch.compile recompiled your function {recompiles} times over {len(_SCHEDULE)} steps{limit}.",
                    "read the guard in the recompilation message (recompile_messages(), section 3): which value "
                    "does it check, and why would a graph need that value as a constant?",
                    "label_smoothing= takes a Python number that the graph keeps as a constant, so every new "
                    "smoothing is a new graph. Compute the smoothed loss yourself, with smoothing a number that "
                    "the arithmetic multiplies.")
    return ok(f"the same values for all {len(_SCHEDULE)} smoothing values, and no recompilation per value (at "
              "most one, when torch.compile makes a number symbolic).")


# --- 3. a captured step that follows its learning-rate schedule -----------------------------------------------

PEAK_LR = 0.01
"""The exercise's AdamW learning rate after the warm-up."""
WARM_UP: dict[str, Any] = {"start_factor": 0.1, "end_factor": 1.0, "total_iters": 5}
"""The exercise's schedule: ``torch.optim.lr_scheduler.LinearLR`` from 10% to 100% of `PEAK_LR` in 5 steps."""
REPLAYS = 8


def _schedule_model(device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).to(device)


def _mse_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


def _eager_with_schedule(device: str, batches: list[tuple[torch.Tensor, torch.Tensor]], follow: bool) -> nn.Module:
    """Eager training as the captured loop should train: three warm-up steps on the first batch (what
    ``capture_step`` does), then one step per batch, the schedule stepped after each (or not, ``follow=False``)."""
    model = _schedule_model(device)
    opt = torch.optim.AdamW(model.parameters(), lr=PEAK_LR)
    schedule = torch.optim.lr_scheduler.LinearLR(opt, **WARM_UP)
    for i, (x, y) in enumerate([batches[0]] * 3 + batches):
        opt.zero_grad(set_to_none=True)
        _mse_step(model, opt, x, y)
        if follow and i >= 3:
            schedule.step()
    return model


@contextmanager
def _standin(device: str) -> Iterator[None]:
    with cpu_cuda_graphs() if device == "cpu" else nullcontext():
        yield


_ADAMW_SETTINGS = ("betas", "eps", "weight_decay", "amsgrad", "maximize")
"""The AdamW settings exercise 3 keeps at PyTorch's defaults (the cell's optimizer sets only lr and capturable)."""


def _setting(value: Any) -> Any:
    """A hyperparameter as a comparable value: tensors of one element as floats, tuples element by element."""
    if isinstance(value, (tuple, list)):
        return tuple(_setting(v) for v in value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    return value


def _changed_settings(opt: torch.optim.Optimizer) -> str | None:
    """The first of `_ADAMW_SETTINGS` that ``opt``'s groups set to something else than AdamW's default."""
    defaults = torch.optim.AdamW([nn.Parameter(torch.zeros(1))]).defaults
    for i, group in enumerate(opt.param_groups):
        for key in _ADAMW_SETTINGS:
            if _setting(group.get(key)) != _setting(defaults[key]):
                where = f"param group {i}'s " if len(opt.param_groups) > 1 else ""
                return f"{where}{key} is {_setting(group.get(key))!r}, AdamW's default {defaults[key]!r}"
    return None


def _lr_device_for_meta_params(make_optimizer: Callable[[list[nn.Parameter]], Any]) -> str | None:
    """Where ``make_optimizer`` puts a tensor learning rate for parameters on the ``meta`` device (a device other
    than the CPU that every machine has; nothing is stepped): the device's type, ``"meta"`` also when the
    optimizer refuses a meta rate (it reads its value to check it); None when it cannot tell (a float rate, or
    another error)."""
    params = [nn.Parameter(p.detach().to("meta")) for p in _schedule_model("cpu").parameters()]
    try:
        opt = make_optimizer(params)
    except Exception as exc:  # a rate made on the parameters' device: the optimizer's own check cannot read it
        return "meta" if "meta" in str(exc) else None
    groups = getattr(opt, "param_groups", None) or [{}]
    lr = groups[0].get("lr")
    return lr.device.type if isinstance(lr, torch.Tensor) else None


_NOT_CAPTURABLE = ("Attempting CUDA graph capture of step() for an instance of AdamW but param_groups' capturable "
                   "is False.")


def _lr_elsewhere(where: str) -> Verdict:
    return fail(f"make_optimizer puts its learning-rate tensor {where}: it does not follow the parameters. On a "
                "GPU, a rate in CPU memory is copied into the captured kernels once, as a Python number is.",
                "where does a replay read from (section 4, rule 4)? Where do the parameters it updates live?",
                "a tensor made without a device is made on the CPU (or on your notebook's device), whatever device "
                "the parameters given to make_optimizer are on.")


@exercise
def check_scheduled_replays(make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                            capture_step: Callable[..., Any], device: str | None = None) -> Verdict:
    """Exercise: ``make_optimizer(params)`` returns the AdamW optimizer (peak learning rate `PEAK_LR`, AdamW's
    other settings at their defaults) of a small MLP whose step (``F.mse_loss``, backward, ``opt.step()``) is
    captured once with the notebook's ``capture_step(model, opt, static_x, static_y)`` and replayed on
    `REPLAYS` batches, the `WARM_UP` schedule stepped after each replay. Right when the weights are those of
    eager steps with the schedule (to 1e-5). Real CUDA graphs on a GPU when there is one, else the CPU stand-in
    (`cpu_cuda_graphs`), which leaves out what only a GPU shows, so the checker checks it itself: PyTorch's
    refusal to capture a step of an optimizer made without ``capturable=True`` (fused or not), and where a
    tensor learning rate lives: ``make_optimizer`` is also given parameters on the ``meta`` device (not
    stepped), and a tensor rate must follow them there, as on a GPU it must be in GPU memory."""
    if not callable(make_optimizer):
        return fail(f"expected your make_optimizer function, got {type(make_optimizer).__name__}.",
                    "the exercise asks for a function that takes the model's parameters and returns the optimizer.")
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 32, generator=g).to(dev), torch.randn(16, 8, generator=g).to(dev))
               for _ in range(REPLAYS)]
    model = _schedule_model(dev)
    rule_3 = ("section 4's rule 3: nothing may read a value on the host during capture. Which part of this step "
              "reads one, and why did section 4's optimizer not?")
    not_capturable = ("section 4: an optimizer's step can be captured only if what it changes at every step, its "
                      "step count, lives where the kernels read it. Which kind of optimizer does that?")
    capturable = ("section 4 made its optimizer with an argument that keeps its step count (and lets it keep its "
                  "rate) in device memory, where the kernels read it; the cell's optimizer had it too.")
    with _standin(dev):
        try:
            opt = make_optimizer(list(model.parameters()))
        except Exception as exc:  # the student's code: report any failure as feedback
            message = " ".join(str(exc).split())[:300]
            if "CUDA" in message and dev == "cpu":
                return fail(f"make_optimizer raised {type(exc).__name__}: {message}",
                            "the parameters here are on the CPU: does your optimizer assume a GPU?",
                            "the parameters it gets know their device.")
            return fail(f"make_optimizer raised {type(exc).__name__}: {message}",
                        "PyTorch's message says which option, or combination of options, it refuses.",
                        capturable if "capturable" in message else "")
        if not isinstance(opt, torch.optim.AdamW):
            return fail(f"the exercise trains with torch.optim.AdamW; make_optimizer returned {type(opt).__name__}.",
                        "the fix changes how the optimizer holds its learning rate, not which optimizer it is.")
        for i, group in enumerate(opt.param_groups):
            lr = group["lr"]
            if not math.isclose(float(lr), PEAK_LR, rel_tol=1e-6):
                held = (f" (a {str(lr.dtype).replace('torch.', '')} tensor holds {PEAK_LR} only approximately)"
                        if isinstance(lr, torch.Tensor) and math.isclose(float(lr), PEAK_LR, rel_tol=1e-2) else "")
                where = f"param group {i}'s learning rate" if len(opt.param_groups) > 1 else "yours"
                return fail(f"the exercise's learning rate is {PEAK_LR}; {where} is {float(lr):g}{held}.",
                            "a tensor holds its number in its dtype: which dtypes hold 0.01 closely?" if held else
                            "the schedule starts at 10% of the optimizer's rate and ends at 100%: the optimizer "
                            "gets the peak rate.")
        changed = _changed_settings(opt)
        if changed:
            return fail(f"the exercise keeps AdamW's settings; in yours, {changed}.",
                        "only how the learning rate is held may change; start again from the optimizer given in "
                        "the cell.")
        here = next(model.parameters()).device
        away = next((group["lr"].device for group in opt.param_groups
                     if isinstance(group["lr"], torch.Tensor) and group["lr"].device != here), None)
        if away is not None:
            return _lr_elsewhere(f"in {away.type} memory for parameters on {dev}")
        if dev == "cpu" and not all(group["capturable"] for group in opt.param_groups):
            # PyTorch's own check at a step during a capture, which runs only on a GPU: the stand-in's part
            return fail(f"capturing the step would raise on a GPU: {_NOT_CAPTURABLE} (PyTorch's check, made here on "
                        "the CPU stand-in's behalf).", not_capturable, capturable)
        try:
            schedule = torch.optim.lr_scheduler.LinearLR(opt, **WARM_UP)
            captured_lr = float(opt.param_groups[0]["lr"])
            static_x, static_y = batches[0][0].clone(), batches[0][1].clone()
            graph, _ = capture_step(model, opt, static_x, static_y)
            for x, y in batches:
                static_x.copy_(x)
                static_y.copy_(y)
                graph.replay()
                schedule.step()
        except Exception as exc:  # the student's code: report any failure as feedback
            message = " ".join(str(exc).split())[:300]
            if "capturable is False" in message:
                return fail(f"capturing or replaying raised {type(exc).__name__}: {message}", not_capturable,
                            capturable)
            host_read = "captur" in message.lower()
            return fail(f"capturing or replaying raised {type(exc).__name__}: {message}",
                        rule_3 if host_read else "PyTorch's message says what it needs.",
                        capturable if host_read else "")

    def gap(reference: nn.Module) -> float:
        return max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters(),
                                                              strict=True))

    followed = gap(_eager_with_schedule(dev, batches, follow=True))
    if followed <= 1e-5:
        meta = _lr_device_for_meta_params(make_optimizer)
        if meta not in (None, "meta"):  # right here, but not for parameters on another device
            return _lr_elsewhere(f"on the {meta} for parameters on PyTorch's meta device")
        where = ("on the GPU" if dev != "cpu" else
                 "with the CPU stand-in, where every tensor is memory a replay reads; on a GPU, that is GPU memory")
        return ok(f"{REPLAYS} replays follow the schedule: the weights are those of {REPLAYS} eager steps with it "
                  f"({where}).")
    rates = [PEAK_LR * WARM_UP["start_factor"] + PEAK_LR * (WARM_UP["end_factor"] - WARM_UP["start_factor"]) *
             min(i, WARM_UP["total_iters"]) / WARM_UP["total_iters"] for i in range(REPLAYS)]
    if gap(_eager_with_schedule(dev, batches, follow=False)) <= 1e-5:
        return fail(f"the {REPLAYS} replays all trained at {captured_lr:g}, the rate when the step was captured; the "
                    f"schedule asked for {rates[0]:g} rising to {rates[-1]:g}.",
                    "each replay sees its new batch (rule 4 is kept). What else changes from one step to the next "
                    "in this loop, and what does a replay read of it?",
                    "the schedule writes each new rate into opt.param_groups[0]['lr']. What is kept there: a Python "
                    "number, which the capture copied into the kernels' arguments once, or memory that each replay "
                    "reads? The compiled optimizer just before this exercise met the same question.")
    return fail(f"after {REPLAYS} replays the weights differ from {REPLAYS} eager steps with the same schedule, and "
                "from training at the rate of the moment of capture too.",
                "every part of the optimizer should follow the schedule in the same way: do all its parameter "
                "groups hold their rate alike?", "start again from the optimizer given in the cell, and change "
                "only how it holds its learning rate.")


# --- 4. a DataLoader within a budget -----------------------------------------------------------------------

class LoaderBudget:
    """The exercise's job: batches of 16 `SlowReads` items, each taking 2 ms to read (waiting on storage, not
    computing) after 300 ms to open the storage in each process, and a training step that takes 10 ms; at most
    4 worker processes and 16 batches in flight. The slow storage may make an epoch after the first at most
    1.3× as long as the same loader over storage that answers at once."""

    batch_size = 16
    batches = 32
    read_ms = 2.0
    open_ms = 300.0
    step_ms = 10.0
    max_workers = 4
    max_in_flight = 16
    slowdown = 1.3


def _epoch_seconds(loader: DataLoader[Any]) -> float:
    t0 = time.perf_counter()
    for _ in loader:
        time.sleep(LoaderBudget.step_ms / 1e3)  # the training step (on a GPU, the CPU would be free meanwhile)
    return time.perf_counter() - t0


def _predicted_slowdown(workers: int) -> float:
    """An epoch after the first with ``workers`` persistent workers, over its time over instant storage, as
    arithmetic predicts it: the first batch is read while the loop waits, then each step waits for the slower of
    the step and the workers' pace (``workers`` batches per batch's read)."""
    read = LoaderBudget.read_ms * LoaderBudget.batch_size
    slow = read + LoaderBudget.batches * max(LoaderBudget.step_ms, read / workers)
    return slow / (LoaderBudget.batches * LoaderBudget.step_ms)


_SURELY_OVER = 1.5
"""Options whose predicted slowdown (`_predicted_slowdown`) is at least this are told so without timing: far
enough over the 1.3× budget that no machine's timing would pass them."""


@exercise
def check_loader_options(options: Mapping[str, Any]) -> Verdict:
    """Exercise: ``DataLoader(SlowReads(...), batch_size=16, **options)`` hides the slow storage: an epoch after
    the first takes at most 1.3× as long as the same loader (same options) over storage that answers at once
    (limit included, with a relative float tolerance of 1e-9), with at most 4 workers and at most 16 batches in
    flight (``num_workers × prefetch_factor``, limit included).

    Options that are over the budget by arithmetic alone are told so without timing: no workers (the loop
    reads every batch itself), workers started anew at every epoch (each opens the storage again, 300 ms, while
    the epoch's steps take 320 ms), and too few workers to read a batch per step (`_SURELY_OVER`). The others are
    timed: the two loaders in turn, twice each (once when far over), and the faster epoch of each is kept: both
    see the same load from other programs and pay the same costs of worker processes (starting them, copying
    batches between processes), so the verdict depends on the options, not on how busy the machine is."""
    if not isinstance(options, Mapping):
        return fail(f"expected a dict of DataLoader options, got {type(options).__name__}.",
                    "the options go into DataLoader(..., **loader_options): a dict of keyword arguments.")
    allowed = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")
    bad = sorted(set(options) - set(allowed))
    if bad:
        return fail(f"choose only {', '.join(allowed)}; got {', '.join(bad)}.",
                    "the batch size and the data set are the job's; the exercise asks how the loader reads them.")
    workers, prefetch = options.get("num_workers", 0), options.get("prefetch_factor")
    if isinstance(workers, bool) or not isinstance(workers, numbers.Integral) or workers < 0:
        return fail(f"num_workers is a number of processes, 0 or more; got {workers!r}.",
                    "section 6's list of options says what each one takes.")
    if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, numbers.Integral) or
                                 prefetch < 1):
        return fail(f"prefetch_factor is a number of batches per worker, 1 or more; got {prefetch!r}.",
                    "section 6's list of options says what each one takes.")
    workers, prefetch = int(workers), None if prefetch is None else int(prefetch)
    n_flight = workers * (prefetch or 2)
    if workers > LoaderBudget.max_workers:
        return fail(f"{workers} workers: the budget allows {LoaderBudget.max_workers} (each is a process with its "
                    "own copy of the data set).", "how many batches must be read at the same time to keep up "
                    "with the steps? No more workers than that are needed.")
    if n_flight > LoaderBudget.max_in_flight:
        return fail(f"{workers} workers × prefetch_factor {prefetch or 2} = {n_flight} batches in flight: the memory "
                    f"budget allows {LoaderBudget.max_in_flight}.", "batches read ahead are memory; how far ahead "
                    "must the workers read to keep pace with the steps?")
    read_ms = LoaderBudget.read_ms * LoaderBudget.batch_size
    waiting = ("reading here is waiting, not computing: what can wait for several items at once, while the step "
               "runs?")
    if workers == 0:
        if prefetch is not None or options.get("persistent_workers"):
            given = "prefetch_factor" if prefetch is not None else "persistent_workers"
            return fail(f"{given} sets how worker processes behave, and num_workers=0 starts none (DataLoader "
                        "refuses it).", waiting, "section 6's options: which one starts processes that read "
                        "the next batches?")
        pinned = (" pin_memory=True makes the copy of a batch to a GPU faster; it reads nothing sooner."
                  if options.get("pin_memory") else "")
        return fail(f"with num_workers=0 the training loop reads every batch itself: {LoaderBudget.batch_size} "
                    f"items × {LoaderBudget.read_ms:g} ms = {read_ms:g} ms of waiting before each "
                    f"{LoaderBudget.step_ms:g} ms step, nothing overlapping it.{pinned}", waiting,
                    "section 6's options: which one starts processes that read the next batches while the loop "
                    "trains?")
    if not options.get("persistent_workers"):
        return fail(f"{workers} worker{'s' * (workers > 1)} started anew at every epoch: each opens the storage again "
                    f"({LoaderBudget.open_ms:g} ms) before its first batch, at every epoch, while the epoch's "
                    f"{LoaderBudget.batches} steps take {LoaderBudget.batches * LoaderBudget.step_ms:g} ms.",
                    "what does starting the workers again cost at every epoch, here?",
                    "section 6's list of options has one that keeps the workers from one epoch to the next.")
    if _predicted_slowdown(workers) >= _SURELY_OVER:
        return fail(f"{workers} worker{'s' * (workers > 1)} each read a batch in {read_ms:g} ms: together one batch every "
                    f"{read_ms / workers:g} ms, and the steps use one every {LoaderBudget.step_ms:g} ms.",
                    "how many batches must be in reading at once for the reading to keep pace with the steps?",
                    "section 6 starts num_workers near the number of free cores: that is for work that computes. "
                    "Waiting uses no core.")
    n = LoaderBudget.batches * LoaderBudget.batch_size
    slow_data = SlowReads(n, read_ms=LoaderBudget.read_ms, open_ms=LoaderBudget.open_ms)
    instant_data = SlowReads(n, read_ms=0.0)
    try:
        with warnings.catch_warnings():  # more workers than cores: right for waiting, which uses no core
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            warnings.filterwarnings("ignore", message=".*pin_memory")  # without a GPU: nothing to pin for
            slow = DataLoader(slow_data, batch_size=LoaderBudget.batch_size, **options)
            instant = DataLoader(instant_data, batch_size=LoaderBudget.batch_size, **options)
            _epoch_seconds(slow), _epoch_seconds(instant)  # the first epochs: workers start, storage is opened
            rounds = [(_epoch_seconds(slow), _epoch_seconds(instant))]
            if rounds[0][0] < 2 * LoaderBudget.slowdown * rounds[0][1]:  # far over: a second round would not pass
                rounds.append((_epoch_seconds(slow), _epoch_seconds(instant)))
    except Exception as exc:  # the student's options: report any failure as feedback
        return fail(f"the DataLoader raised {type(exc).__name__}: {str(exc).splitlines()[0]}",
                    "PyTorch's message says which option it refuses.")
    slow_s, instant_s = min(r[0] for r in rounds), min(r[1] for r in rounds)
    if slow_s > LoaderBudget.slowdown * instant_s * (1 + 1e-9):
        return fail(f"an epoch after the first took {slow_s:.2f} s over the slow storage and {instant_s:.2f} s over "
                    f"storage that answers at once: more than the {LoaderBudget.slowdown}× budget.", waiting,
                    "count how many batches the workers read per step's time, and what each epoch's start costs.")
    return ok(f"epochs after the first stayed within {LoaderBudget.slowdown}× their time over storage that answers "
              "at once, within the budget of workers and of batches in flight.")
