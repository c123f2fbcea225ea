"""Checkers for notebook 07 (the performance toolbox). They run on the CPU, so every student gets feedback.

1. `check_profile_reading`: what a shipped GPU trace (`MYSTERY_TRACE`) says, read with the tools of
   section 1.
2. `check_recompile_fix`: `smoothed_loss` recompiles for every new smoothing value; a version that does not.
3. `check_graphed_step`: a training step captured in a CUDA graph and replayed, against eager steps (on a
   GPU for real; on the CPU through `course_utils.graph_standin`).
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

__all__ = ["BOTTLENECKS", "MYSTERY_TRACE", "LoaderBudget", "check_graphed_step", "check_loader_options",
           "check_profile_reading", "check_recompile_fix", "smoothed_loss"]


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


# --- 3. a training step in a CUDA graph --------------------------------------------------------------------

def _graph_training(device: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The exercise's model and optimizer: momentum keeps state that is made lazily at the first step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 5)).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _eager_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def check_graphed_step(graphed_step: Callable[..., Any], device: str | None = None) -> Verdict:
    """Exercise: ``graphed_step(model, opt, static_x, static_y)`` warms up (three steps on the static batch),
    captures one training step (cross-entropy, backward, ``opt.step()``) in a CUDA graph and returns
    ``replay(x, y)``, which runs that step on a new batch and returns its loss tensor. Checked against eager
    steps on a GPU when there is one, else on the CPU with `cpu_cuda_graphs`."""
    if not callable(graphed_step):
        return fail(f"expected your function, got {type(graphed_step).__name__}.")
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 32, generator=g).to(dev), torch.randint(0, 5, (16,), generator=g).to(dev))
               for _ in range(6)]
    def eager(batches_seen: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[nn.Module, torch.Tensor]:
        model, opt = _graph_training(dev)
        for x, y in [batches[0]] * 3 + batches_seen:  # three warm-up steps on the static batch, then the batches
            loss = _eager_step(model, opt, x, y)
        return model, loss

    model, opt = _graph_training(dev)
    replays = [0]
    try:
        with cpu_cuda_graphs() if dev == "cpu" else nullcontext(), _counting_replays(replays):
            replay = graphed_step(model, opt, batches[0][0].clone(), batches[0][1].clone())
            if not callable(replay):
                return fail(f"graphed_step should return the replay function, got {type(replay).__name__}.")
            losses = [replay(x, y) for x, y in batches]
    except Exception as exc:  # the student's code: report any failure as feedback
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return fail(f"your code raised {type(exc).__name__}: {message}",
                    "during capture nothing may make the host wait for the GPU." if "captur" in message else "")
    if replays[0] < len(batches):
        return fail(f"{len(batches)} calls of replay(x, y) replayed a graph {replays[0]} time(s).",
                    "a graph runs only when it is replayed: the step has to be captured once, and each call "
                    "of replay(x, y) has to replay it.")
    last = losses[-1]
    if not isinstance(last, torch.Tensor) or last.numel() != 1:
        return fail(f"replay(x, y) should return the loss tensor, got {type(last).__name__}.")

    def same(reference: nn.Module) -> bool:
        return all(torch.allclose(p, q, atol=1e-5) for p, q in zip(model.parameters(), reference.parameters(),
                                                                  strict=True))

    reference, want = eager(batches)
    if not same(reference):
        if same(eager([batches[0]] * len(batches))[0]):
            return fail("every replay trained on the batch the graph was captured with, not on the batch passed in.",
                        "a replay reads the memory it captured; new data has to go into those tensors.")
        return fail("after the replays, the weights differ from eager training on the same batches.",
                    "a replay repeats everything the capture did, once-only work included (the optimizer's state "
                    "made at its first step, gradients accumulated onto old ones): warm up, and let backward "
                    "make fresh gradients during the capture.")
    if not torch.allclose(last.detach().float(), want, atol=1e-5):
        return fail("the weights are right, but replay(x, y) returned another loss than that of the batch.",
                    "return the loss tensor that the captured step computed: the replay refills it.")
    where = "on the GPU" if dev != "cpu" else "with the CPU stand-in of CUDA graphs"
    return ok(f"{len(batches)} replays give the losses and weights of {len(batches)} eager steps ({where}).")


@contextmanager
def _counting_replays(count: list[int]) -> Iterator[None]:
    """Counts the calls of ``torch.cuda.CUDAGraph.replay`` (the stand-in's too) while the block runs."""
    cls = torch.cuda.CUDAGraph
    original = cls.replay

    def replay(self: Any) -> Any:
        count[0] += 1
        return original(self)

    cls.replay = replay  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.replay = original  # type: ignore[method-assign]


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
