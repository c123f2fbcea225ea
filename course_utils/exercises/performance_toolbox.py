"""Checkers for notebook 07 (the performance toolbox). They run on the CPU, so every student gets feedback.

1. `check_profile_reading`: what a shipped GPU trace (`MYSTERY_TRACE`) says, read with the tools of
   section 1.
2. `check_recompile_fix`: `smoothed_loss` recompiles for every new smoothing value; a version that does not.
3. `check_scheduled_replays`: a training step captured once in a CUDA graph and replayed while a learning-rate
   schedule runs, against eager steps with the schedule (on a GPU for real; on the CPU through
   `course_utils.graph_standin`).
4. `check_loader_options`: ``DataLoader`` options that hide `SlowReads`' slow storage from a training loop,
   within a budget of processes and memory.
"""

from __future__ import annotations

import functools
import math
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

from ..compiling import recompile_messages
from ..graph_standin import cpu_cuda_graphs
from ..input_pipeline import SlowReads
from ..traces import CPU_ROW, GPU_ROW, STEP_ROW, Span, busy_fraction, host_waits, idle_gaps, read_trace
from . import Verdict, fail, ok

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


@functools.lru_cache(maxsize=8)
def _truth(path: Path) -> dict[str, Any]:
    spans = read_trace(path)
    steps = sum(1 for s in spans if s.row == STEP_ROW and s.name.startswith("ProfilerStep#"))
    covered = _idle_time_by_span(spans)
    return {"gpu_busy": busy_fraction(spans, GPU_ROW), "host_waits_per_step": len(host_waits(path)) / max(steps, 1),
            "culprit": max(covered, key=covered.__getitem__) if covered else ""}


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


def check_profile_reading(answers: Mapping[str, Any], path: str | Path = MYSTERY_TRACE) -> Verdict:
    """Exercise: ``answers`` says what the trace at ``path`` shows: ``gpu_busy`` (the GPU's busy fraction,
    within 10% of its value: a relative tolerance, since the fraction itself may be small), ``host_waits_per_step``, ``culprit`` (the span that covers most of the GPU's idle time)
    and ``bottleneck`` (one of `BOTTLENECKS`)."""
    keys = ("gpu_busy", "host_waits_per_step", "culprit", "bottleneck")
    if not isinstance(answers, Mapping) or any(k not in answers for k in keys):
        return fail(f"expected a dict with the keys {', '.join(keys)}.")
    missing = [k for k in keys if answers[k] is None]
    if missing:
        return fail(f"{', '.join(missing)} still None.", "read the trace with read_trace(MYSTERY_TRACE) and use the "
                    "functions of section 1 on it.")
    truth = _truth(Path(path))
    busy = answers["gpu_busy"]
    if not isinstance(busy, (int, float)) or not 0 <= busy <= 1:
        return fail(f"gpu_busy should be a fraction between 0 and 1, got {busy!r}.")
    if not math.isclose(busy, truth["gpu_busy"], rel_tol=GPU_BUSY_REL_TOL):
        return fail(f"gpu_busy = {busy:.4g} is not what the trace's GPU row shows.",
                    "the busy fraction of the GPU row: the time something ran on it over the time from its first "
                    "span to its last (busy_fraction).")
    waits = answers["host_waits_per_step"]
    if not isinstance(waits, (int, float)) or not math.isclose(waits, truth["host_waits_per_step"], abs_tol=0.01):
        return fail(f"host_waits_per_step = {waits!r} is not what the trace shows.",
                    "count the host's waits for the GPU (host_waits), each once, and divide by the number of "
                    "profiler steps (the ProfilerStep# spans).")
    if answers["culprit"] != truth["culprit"]:
        return fail(f"{answers['culprit']!r} is not the span that covers most of the GPU's idle time.",
                    "take the GPU row's idle gaps (idle_gaps) and add up, per name, how much of them each span of "
                    "the CPU and step rows covers.")
    if answers["bottleneck"] not in BOTTLENECKS:
        return fail(f"bottleneck must be one of {', '.join(BOTTLENECKS)}; got {answers['bottleneck']!r}.")
    if answers["bottleneck"] != _bottleneck(truth):
        return fail(f"{answers['bottleneck']!r} does not fit what you measured.",
                    "a GPU that is mostly idle is not GPU-bound; then ask what the host was doing while it idled: "
                    "your culprit names it.")
    return ok("busy fraction, host waits, the span behind the idle GPU and the bottleneck all match the trace.")


# --- 2. a recompilation -----------------------------------------------------------------------------------

def smoothed_loss(logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> torch.Tensor:
    """The exercise's loss: cross-entropy with label smoothing, whose strength a schedule lowers every step."""
    return F.cross_entropy(logits, target, label_smoothing=smoothing)


_SCHEDULE = [0.2 * (1 - i / 10) for i in range(10)]


def _loss_inputs() -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(16, 10, generator=g), torch.randint(0, 10, (16,), generator=g)
    return [(logits, target, s) for s in _SCHEDULE]


def _graphs_and_values(fn: Callable[..., torch.Tensor]) -> tuple[int, bool, list[torch.Tensor]]:
    """How many times ``fn`` is recompiled over the smoothing schedule (backend "eager": no compiler needed),
    whether that hit the recompile limit, and its values."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="eager")
    with recompile_messages() as messages:
        values = [compiled(*args) for args in _loss_inputs()]
    torch._dynamo.reset()
    recompiles = sum(m.startswith("Recompiling function") for m in messages)
    return recompiles, any("recompile_limit" in m for m in messages), values


def check_recompile_fix(fn: Callable[..., torch.Tensor]) -> Verdict:
    """Exercise: ``fn(logits, target, smoothing)`` computes `smoothed_loss` for every smoothing value of the
    schedule, and ``torch.compile`` recompiles it at most once (automatic dynamic shapes allow one)."""
    if not callable(fn):
        return fail(f"expected your function, got {type(fn).__name__}.")
    try:
        recompiles, hit_limit, got = _graphs_and_values(fn)
    except Exception as exc:  # the student's code: report any failure as feedback
        return fail(f"your function raised {type(exc).__name__}: {str(exc).splitlines()[0]}")
    want = [smoothed_loss(*args) for args in _loss_inputs()]
    if not all(isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, atol=1e-5)
               for a, b in zip(got, want, strict=True)):
        return fail("your values differ from smoothed_loss's for some smoothing values.",
                    "label smoothing mixes the usual cross-entropy with the cross-entropy against a uniform "
                    "target; the docs of F.cross_entropy give the formula.")
    explanation = torch._dynamo.explain(fn)(*_loss_inputs()[0])
    torch._dynamo.reset()
    if explanation.graph_count == 0 or explanation.graph_break_count:
        what = ("captured no graph of your function" if explanation.graph_count == 0 else
                f"breaks your function's graph {explanation.graph_break_count} time(s)")
        return fail(f"torch.compile {what}: it does not compile it whole.",
                    "the fix keeps the loss compiled; what changes is what the graph treats as a constant.")
    if recompiles > 1:
        limit = (f", then hit its recompile limit ({torch._dynamo.config.recompile_limit}) and ran the remaining "
                 "steps without compiling" if hit_limit else "")
        return fail(f"torch.compile recompiled your function {recompiles} times over {len(_SCHEDULE)} steps{limit}.",
                    "read the guard in the recompilation message: which value does it check? A Python number "
                    "that an operator needs as a constant is baked into the graph.")
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


def check_scheduled_replays(make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                            capture_step: Callable[..., Any], device: str | None = None) -> Verdict:
    """Exercise: ``make_optimizer(params)`` returns the AdamW optimizer (peak learning rate `PEAK_LR`) of a
    small MLP whose step (``F.mse_loss``, backward, ``opt.step()``) is captured once with the notebook's
    ``capture_step(model, opt, static_x, static_y)`` and replayed on `REPLAYS` batches, the `WARM_UP`
    schedule stepped after each replay. Right when the weights are those of eager steps with the schedule.
    Real CUDA graphs on a GPU when there is one, else the CPU stand-in (`cpu_cuda_graphs`)."""
    if not callable(make_optimizer):
        return fail(f"expected your make_optimizer function, got {type(make_optimizer).__name__}.")
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 32, generator=g).to(dev), torch.randn(16, 8, generator=g).to(dev))
               for _ in range(REPLAYS)]
    model = _schedule_model(dev)
    try:
        with _standin(dev):
            opt = make_optimizer(list(model.parameters()))
            if not isinstance(opt, torch.optim.AdamW):
                return fail(f"the exercise trains with torch.optim.AdamW; make_optimizer returned "
                            f"{type(opt).__name__}.")
            lr = opt.param_groups[0]["lr"]
            if not math.isclose(float(lr), PEAK_LR, rel_tol=1e-6):
                return fail(f"the exercise's learning rate is {PEAK_LR} (the schedule starts at 10% of it); "
                            f"yours is {float(lr):g}.")
            schedule = torch.optim.lr_scheduler.LinearLR(opt, **WARM_UP)
            static_x, static_y = batches[0][0].clone(), batches[0][1].clone()
            graph, _ = capture_step(model, opt, static_x, static_y)
            for x, y in batches:
                static_x.copy_(x)
                static_y.copy_(y)
                graph.replay()
                schedule.step()
    except Exception as exc:  # the student's code: report any failure as feedback
        message = " ".join(str(exc).split())[:300]
        hint = ("section 4's rules: during capture nothing may bring a value back to the host, and the "
                "optimizer has to be one that can be captured." if "captur" in message.lower() else
                "PyTorch's message names what it needs." if "not supported" in message else "")
        return fail(f"capturing or replaying raised {type(exc).__name__}: {message}", hint)

    def gap(reference: nn.Module) -> float:
        return max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters(),
                                                              strict=True))

    followed = gap(_eager_with_schedule(dev, batches, follow=True))
    if followed <= 1e-5:
        where = ("on the GPU" if dev != "cpu" else
                 "with the CPU stand-in, where every tensor is memory a replay reads; on a GPU, that is GPU memory")
        return ok(f"{REPLAYS} replays follow the schedule: the weights are those of {REPLAYS} eager steps with it "
                  f"({where}).")
    if gap(_eager_with_schedule(dev, batches, follow=False)) <= 1e-5:
        return fail(f"after {REPLAYS} replays the weights differ from {REPLAYS} eager steps with the same schedule.",
                    "each replay sees its new batch (rule 4 is kept). What else changes from one step to the next "
                    "in this loop, and what does a replay read of it?")
    return fail(f"after {REPLAYS} replays the weights differ from {REPLAYS} eager steps with the same schedule, "
                "and from training at one fixed rate too.",
                "the exercise keeps AdamW's defaults apart from the learning rate; start again from the "
                "optimizer given in the cell.")


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


def check_loader_options(options: Mapping[str, Any]) -> Verdict:
    """Exercise: ``DataLoader(SlowReads(...), batch_size=16, **options)`` hides the slow storage: an epoch after
    the first takes at most 1.3× as long as the same loader (same options) over storage that answers at once,
    with at most 4 workers and at most 16 batches in flight.

    The two loaders are timed in turn, twice each (once when far over), and the faster epoch of each is kept:
    both see the same load from other programs and pay the same costs of worker processes (starting them,
    copying batches between processes), so the verdict depends on the options, not on how busy the machine is."""
    if not isinstance(options, Mapping):
        return fail(f"expected a dict of DataLoader options, got {type(options).__name__}.")
    bad = sorted(set(options) - {"num_workers", "prefetch_factor", "persistent_workers", "pin_memory"})
    if bad:
        return fail(f"choose only num_workers, prefetch_factor, persistent_workers and pin_memory; got {', '.join(bad)}.")
    workers = int(options.get("num_workers", 0))
    in_flight = workers * int(options.get("prefetch_factor") or 2)
    if workers > LoaderBudget.max_workers:
        return fail(f"{workers} workers: the budget allows {LoaderBudget.max_workers} (each is a process with its "
                    "own copy of the data set).")
    if in_flight > LoaderBudget.max_in_flight:
        return fail(f"{workers} workers × prefetch_factor {in_flight // max(workers, 1)} = {in_flight} batches in "
                    f"flight: the memory budget allows {LoaderBudget.max_in_flight}.")
    n = LoaderBudget.batches * LoaderBudget.batch_size
    slow_data = SlowReads(n, read_ms=LoaderBudget.read_ms, open_ms=LoaderBudget.open_ms)
    instant_data = SlowReads(n, read_ms=0.0)
    try:
        with warnings.catch_warnings():  # more workers than cores: right for waiting, which uses no core
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            slow = DataLoader(slow_data, batch_size=LoaderBudget.batch_size, **options)
            instant = DataLoader(instant_data, batch_size=LoaderBudget.batch_size, **options)
            _epoch_seconds(slow), _epoch_seconds(instant)  # the first epochs: workers start, storage is opened
            rounds = [(_epoch_seconds(slow), _epoch_seconds(instant))]
            if rounds[0][0] < 2 * LoaderBudget.slowdown * rounds[0][1]:  # far over: a second round would not pass
                rounds.append((_epoch_seconds(slow), _epoch_seconds(instant)))
    except Exception as exc:  # the student's options: report any failure as feedback
        return fail(f"the DataLoader raised {type(exc).__name__}: {str(exc).splitlines()[0]}")
    slow_s, instant_s = min(r[0] for r in rounds), min(r[1] for r in rounds)
    if slow_s > LoaderBudget.slowdown * instant_s:
        return fail(f"an epoch after the first took {slow_s:.2f} s over the slow storage and {instant_s:.2f} s over "
                    f"storage that answers at once: more than the {LoaderBudget.slowdown}× budget.",
                    "reading here is waiting, not computing: what can wait for several items at once? And what "
                    "does starting that again cost at every epoch?")
    return ok(f"epochs after the first stayed within {LoaderBudget.slowdown}× their time over storage that answers "
              "at once, within the budget of workers and of batches in flight.")
