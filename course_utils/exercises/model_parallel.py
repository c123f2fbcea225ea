"""Checkers for notebook 11 (model parallelism): a tensor-parallel plan for a SwiGLU MLP run on gloo processes,
the collectives of the course's GPT predicted and then counted, and the microbatches of a pipeline chosen for
its bubble and its memory.

- Exercise 1, `check_swiglu_plan`: the student's ``{module name: ParallelStyle}`` plan for `SwiGLU` (gate and
  up, then down, the MLP of LLaMA-style models) is applied with ``parallelize_module`` on 2 gloo ranks
  (`swiglu_plan_worker`) and compared with one process: output, gradients, which weights are split, and the
  collectives ``CommDebugMode`` counts. A wrong plan is told what it does (the error it raises, the output it
  leaves split, the layer that stays whole, the collectives it adds) and why, in terms of partial sums and
  shards.
- Exercise 2, `check_collectives`: the student's ``collectives(n_blocks, sequence_parallel, loss_parallel)``
  predicts what ``CommDebugMode`` counts in one forward and one backward of the course's GPT, tensor-parallel
  over 2 ranks (`model_parallel_demos.tensor_parallel_gpt`, or ``sequence_parallel=True`` with sequence
  parallelism). The checker measures `COLLECTIVE_CASES` in one launch (`collectives_worker`), once per
  process, and says which part of a wrong prediction is off: what each block runs, or what runs outside the
  blocks (the embeddings' boundary, the head, the loss).
- Exercise 3, `check_microbatches`: ``microbatches(p, activation_bytes, budget_bytes, target)`` returns the
  fewest microbatches whose bubble ``(p − 1)/(m + p − 1)`` is at most ``target`` and a schedule whose
  activations in flight fit (GPipe keeps all m, 1F1B at most p on the first stage), or None; tried on
  `MICROBATCH_CASES`.
- Exercise 4, `check_layout`: ``choose_layout(cfg, gpus_per_node, nodes, gpu_bytes)`` returns the layout
  section 6's plan (`course_utils.memory.layout_plan`) says fits, with the fewest GPUs per copy of the model and
  then the most tensor parallelism within a node (Narayanan et al., 2021), or None; tried on `LAYOUT_CASES`.

Every failing verdict's hint names the concept; its closer hint (``%hint``, or a second failure) is nearer to
the code. No verdict states the answer of a case the student computes.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import functools
import math
import numbers
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    loss_parallel,
    parallelize_module,
)

from ..distributed import model_parallel_demos as demos
from ..memory.layout_plan import Layout, activation_bytes_per_gpu, state_bytes_per_gpu
from ..models import GPT, GPTConfig, token_batch
from . import TooSlow, Verdict, exercise, fail, ok, time_limit

__all__ = ["CALL_SECONDS", "COLLECTIVES", "COLLECTIVE_CASES", "LAYOUT_CASES", "LAYOUT_MICROBATCHES",
           "MICROBATCH_CASES", "SCHEDULES", "SWIGLU_SHAPE", "SwiGLU", "check_collectives", "check_layout",
           "check_microbatches", "check_swiglu_plan", "collectives_worker", "measured_collectives",
           "swiglu_plan_worker"]

TOLERANCE = demos.TOLERANCE
CALL_SECONDS = 1.0
"""How long exercise 3's checker waits for one call (where it can: on the main thread of a Unix process)."""


def _counts(mode: CommDebugMode) -> dict[str, int]:
    """``CommDebugMode``'s counts by the collective's short name (``all_reduce``)."""
    return {str(op).split(".")[-1]: int(n) for op, n in mode.get_comm_counts().items()}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _first_line(exc: BaseException, width: int = 160) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= width else text[: width - 1] + "…"


# --- 1. a tensor-parallel plan for a SwiGLU MLP --------------------------------------------------------------

SWIGLU_SHAPE = (64, 96)
"""Exercise 1's `SwiGLU`: 64 features in and out, 96 hidden features."""

_LINEARS = ("gate", "up", "down")


class SwiGLU(nn.Module):
    """The MLP of LLaMA-style models: ``down(silu(gate(x)) * up(x))``, three linear layers without bias.
    ``gate`` and ``up`` map ``d_model`` features to ``hidden``, ``down`` maps them back."""

    def __init__(self, d_model: int = SWIGLU_SHAPE[0], hidden: int = SWIGLU_SHAPE[1]) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def _run_plan(mesh: DeviceMesh, plan: dict[str, ParallelStyle]) -> dict[str, Any]:
    """One plan on this rank, against `SwiGLU` in this process on the same input: what it raised (and where),
    or the output's local shape, its largest differences from one process, each weight's placement and local
    shape, and the collectives of forward and backward."""
    torch.manual_seed(0)
    reference = SwiGLU()
    model = copy.deepcopy(reference)
    x = torch.randn(4, 8, SWIGLU_SHAPE[0], generator=torch.Generator().manual_seed(1))
    x_ref = x.clone().requires_grad_()
    out_ref = reference(x_ref)
    out_ref.square().mean().backward()
    found: dict[str, Any] = {"error": None}
    stage = "parallelize_module"
    try:
        parallelize_module(model, mesh, plan)
        found["weights"] = {name: (str(getattr(p, "placements", "whole")), tuple(_local(p).shape))
                            for name, p in model.named_parameters()}
        stage = "forward"
        x_tp = x.clone().requires_grad_()
        with CommDebugMode() as fwd:
            out = model(x_tp)
        found["forward"] = _counts(fwd)
        found["output_shape"] = tuple(_local(out).shape)
        found["output_placements"] = str(out.placements) if isinstance(out, DTensor) else ""
        if found["output_shape"] != tuple(out_ref.shape):
            return found  # the output is left split: each rank holds a piece of it
        found["output_diff"] = (_full(out) - out_ref).abs().max().item()
        stage = "backward"
        with CommDebugMode() as bwd:
            _local(out).square().mean().backward()
        found["backward"] = _counts(bwd)
        assert x_tp.grad is not None and x_ref.grad is not None
        diffs = [(x_tp.grad - x_ref.grad).abs().max().item()]
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            diffs.append(float("inf") if p.grad is None or q.grad is None
                         else (_full(p.grad) - q.grad).abs().max().item())
        found["grad_diff"] = max(diffs)
    except Exception as exc:  # the student's plan: what it raises is the feedback
        found["error"] = (stage, _first_line(exc))
    return found


def swiglu_plan_worker(rank: int, world_size: int, plans: list[dict[str, ParallelStyle]]) -> list[dict[str, Any]]:
    """Exercise 1's worker: each plan of ``plans`` applied to a fresh `SwiGLU` on a 1-D "tp" mesh of all the
    ranks and run once forward and backward (`launch` it; one launch grades many plans)."""
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    return [_run_plan(mesh, plan) for plan in plans]


def _kind(style: Any) -> str:
    if style is None:
        return "missing"
    if isinstance(style, ColwiseParallel):
        return "column"
    if isinstance(style, RowwiseParallel):
        return "row"
    return type(style).__name__


def _invalid_plan(plan: Any) -> Verdict | None:
    """A failing verdict when ``plan`` is not a ``{module name: ParallelStyle}`` dict for `SwiGLU`."""
    example = "{\"gate\": ..., \"up\": ..., \"down\": ...}, each value a style such as ColwiseParallel()"
    if not isinstance(plan, Mapping):
        return fail(f"expected a dict {{module name: ParallelStyle}}, got {type(plan).__name__}.",
                    "parallelize_module takes a plan: a dict from each submodule's name to how to split it.",
                    f"write it as {example}.")
    for name, style in plan.items():
        if not isinstance(name, str):
            return fail(f"the plan's key {name!r} is a {type(name).__name__}; keys are module names (str).",
                        "parallelize_module finds each module by its name, as named_modules() gives it.",
                        f"write it as {example}.")
        if isinstance(style, type) and issubclass(style, ParallelStyle):
            return fail(f"the plan's value for {name!r} is the class {style.__name__}, not a style made from it.",
                        "a plan holds ParallelStyle objects, each possibly with its own options (layouts).",
                        f"call the class: {style.__name__}().")
        if not isinstance(style, ParallelStyle):
            return fail(f"the plan's value for {name!r} is {type(style).__name__} {style!r:.60}, not a ParallelStyle.",
                        "each value says how to split that module: one of torch.distributed.tensor.parallel's "
                        "styles.", "ColwiseParallel() or RowwiseParallel(), from torch.distributed.tensor.parallel.")
        if not type(style).__module__.startswith("torch."):
            return fail(f"the plan's value for {name!r} is a {type(style).__name__} defined outside PyTorch.",
                        "the checker sends the plan to new processes, which cannot import a class defined in a "
                        "notebook cell.", "use PyTorch's own styles from torch.distributed.tensor.parallel.")
    # "" is the module itself, and a key may be an fnmatch pattern (parallelize_module's rules)
    unknown = sorted(k for k in plan if k and not any(fnmatch.fnmatch(name, k) for name in _LINEARS))
    if unknown:
        return fail(f"no module of SwiGLU is named {', '.join(map(repr, unknown))}; its linear layers are "
                    f"{', '.join(map(repr, _LINEARS))}.",
                    "a plan's keys are the names of the submodules to split, relative to the module given to "
                    "parallelize_module: print(SwiGLU()) shows them.",
                    "the keys are 'gate', 'up' and 'down'.")
    return None


_WHOLE_HINT = ("parallelize_module changes only the modules its plan names: a layer left out keeps its whole weight "
               "on every rank and computes all its outputs there.")
_PAIR_HINT = ("section 2's pairing: a column-wise layer gives each rank whole values of some output features, with "
              "no communication; a row-wise layer turns a shard of its input features into partial sums of all its "
              "outputs, which one all-reduce adds. Which layers produce the hidden features, and which consumes "
              "them?")
_PAIR_CLOSER = ("gate and up both column-wise, so that each rank holds the same hidden features of both, whole; down "
                "row-wise, taking those features and ending with one all-reduce.")
_SILU = "silu(a + b) ≠ silu(a) + silu(b): the SiLU needs each hidden feature's whole pre-activation"


def _diagnose_error(kinds: dict[str, str], stage: str, error: str) -> Verdict:
    d, h = SWIGLU_SHAPE
    ran = f"on 2 ranks your plan fails in {stage} ({error})"
    others = [n for n in _LINEARS if kinds[n] not in ("column", "row", "missing")]
    if others:
        name = others[0]
        what = ("SequenceParallel keeps the weight whole on every rank and splits the activations along the "
                "sequence: it is for layers that work token by token, like the norms of section 3"
                if kinds[name] == "SequenceParallel" else
                f"{kinds[name]} changes the layouts of a module's inputs or outputs and splits no weight")
        return fail(f"{ran}. {name} is given {kinds[name]}: {what}.", _PAIR_HINT, _PAIR_CLOSER)
    if kinds["gate"] == "row":
        return fail(f"{ran}. gate is row-wise: a row-wise layer takes a shard of its input features (x reaches gate "
                    f"whole, all {d} features) and gives each rank a partial sum of every output. Even with x split, "
                    f"the SiLU could not run on those partial sums: {_SILU}.",
                    "a nonlinearity needs the whole value of each feature it acts on: which split of gate gives each "
                    "rank whole pre-activations of its own hidden features, with no communication?", _PAIR_CLOSER)
    if kinds["up"] == "row":
        return fail(f"{ran}. up is row-wise: it would give each rank a partial sum of all {h} hidden features, while "
                    f"gate gives {'each rank its own half' if kinds['gate'] == 'column' else 'every rank all'} of "
                    "them. silu(gate(x)) * up(x) multiplies hidden feature by hidden feature, so its two factors must "
                    "hold the same features, split the same way.",
                    "an elementwise product needs both factors split alike: which split gives each rank whole values "
                    "of its own hidden features?", _PAIR_CLOSER)
    missing = [name for name in ("gate", "up") if kinds[name] == "missing"]
    if len(missing) == 1:
        name, other = missing[0], "up" if missing[0] == "gate" else "gate"
        return fail(f"{ran}. {name} has no entry in your plan: it stays an ordinary nn.Linear, whole on every "
                    f"rank, and computes all {h} hidden features, while {other} (column-wise) gives each rank "
                    f"{h // 2}: the product of the two cannot be taken.", _WHOLE_HINT,
                    f"give {name} the same split as {other}.")
    if missing and kinds["down"] == "row":
        return fail(f"{ran}. gate and up have no entry in your plan: they stay whole on every rank and compute all "
                    f"{h} hidden features, but a row-wise down takes its input as this rank's shard of the hidden "
                    f"features, and holds only {h // 2} columns of its weight.", _WHOLE_HINT,
                    "split gate and up so that each rank holds whole values of its own hidden features: the ones "
                    "whose columns of down it holds.")
    if kinds["down"] == "column":
        return fail(f"{ran}. down is column-wise: a column-wise layer needs its whole input on every rank and splits "
                    f"its output features; after your gate and up each rank holds only its {h // 2} of the {h} "
                    "hidden features, a shard of down's input.",
                    "which split of a linear layer takes a shard of its input features, and what does it give "
                    "each rank? (section 2)",
                    "make down row-wise: each rank multiplies its hidden features by the matching columns of down's "
                    "weight, and one all-reduce adds the partial sums.")
    if kinds["down"] == "missing":
        return fail(f"{ran}. down has no entry in your plan: it stays an ordinary nn.Linear with the whole {d} × {h} "
                    f"weight on every rank, but receives only this rank's {h // 2} hidden features.", _WHOLE_HINT,
                    "give down the split that takes a shard of its input features.")
    return fail(f"{ran}.", _PAIR_HINT, _PAIR_CLOSER)


def _counted(counts: dict[str, int]) -> str:
    if not counts:
        return "no collective"
    return ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))


def _split_weights(weights: dict[str, tuple[str, tuple[int, ...]]]) -> list[str]:
    """The layers whose weight this rank holds a shard of."""
    return [name for name in _LINEARS if "Shard" in weights[f"{name}.weight"][0]]


def _plan_verdict(plan: Mapping[str, ParallelStyle], found: dict[str, Any]) -> Verdict:
    """Exercise 1's verdict for ``plan``, from rank 0's ``found`` (the ranks run the same code)."""
    d, h = SWIGLU_SHAPE
    kinds = {name: _kind(plan.get(name)) for name in _LINEARS}
    if found["error"] is not None:
        return _diagnose_error(kinds, *found["error"])
    fwd = found["forward"]
    extra = f" (its forward ran {_counted(fwd)})"
    shape = found["output_shape"]
    if shape != (4, 8, d):
        if shape[-1] != d:
            return fail(f"your plan runs, but each rank is left with {shape[-1]} of the {d} output features{extra}: "
                        "down is column-wise, and a column-wise layer's output is a shard of its features.",
                        "the MLP's output goes into the residual stream, which every rank holds whole: which split "
                        "of down ends with the whole output on every rank?",
                        "make down row-wise (its input: each rank's own hidden features, as column-wise gate and "
                        "up leave them), which ends in an all-reduce.")
        return fail(f"your plan runs, but each rank is left with {shape[1]} of the 8 positions of the sequence"
                    f"{extra}: down's output is split along the sequence.",
                    "a reduce-scatter that leaves each rank its share of the sequence is sequence parallelism's "
                    "(section 3); this MLP's caller expects the whole output on every rank.",
                    "keep RowwiseParallel's default output layout for down: Replicate, after an all-reduce.")
    if not (found["output_diff"] < TOLERANCE and found["grad_diff"] < TOLERANCE):
        worst = max(found["output_diff"], found["grad_diff"])
        return fail(f"your plan runs, but its output or gradients differ from one process by up to {worst:.2g} "
                    f"(tolerance {TOLERANCE:g}){extra}.",
                    f"where does a rank hold a partial sum, and is it added before it is used? {_SILU}.",
                    _PAIR_CLOSER)
    whole = [name for name in _LINEARS if name not in _split_weights(found["weights"])]
    if whole:
        if len(whole) == len(_LINEARS):
            message = ("your plan splits nothing: every rank holds all three weights and computes the whole MLP, "
                       "as one process does. The values are right, and nothing is saved.")
        else:
            names = " and ".join(whole)
            verb = "stays" if len(whole) == 1 else "stay"
            message = (f"the values are right, but {names} {verb} whole on every rank: each rank stores all of "
                       f"{'its' if len(whole) == 1 else 'their'} weight (with its gradient and optimizer state) and "
                       f"computes all of {'its' if len(whole) == 1 else 'their'} outputs{extra}.")
        return fail(message, "tensor parallelism saves memory and work only in the layers whose weights it "
                    "splits: " + _PAIR_HINT.split(": ", 1)[1], _PAIR_CLOSER)
    if fwd != {"all_reduce": 1}:
        if kinds["gate"] == "row" or kinds["up"] == "row":
            why = (f"row-wise gate and up leave partial sums of the hidden features, which must be added before the "
                   f"SiLU and the product ({_SILU}): all-reduces of the hidden activation, {h} features wide where "
                   f"the output has {d}")
        elif kinds["down"] == "column":
            why = ("a column-wise down needs its whole input, so the hidden features are gathered first, and it "
                   "leaves its output split, so that is gathered too")
        else:
            why = "each collective is time the ranks wait, on the critical path"
        return fail(f"the values are right and every weight is split, but your plan's forward runs {_counted(fwd)}, "
                    f"where one all-reduce is enough: {why}.",
                    "which split lets the SiLU and the product run on each rank's own hidden features, with no "
                    "communication until the output?", _PAIR_CLOSER)
    return ok(f"on 2 ranks every weight is split ({', '.join(_LINEARS)}: {h // 2} of {h} hidden features each), "
              f"the output and all gradients equal one process's within {TOLERANCE:g}, and the forward runs one "
              f"all-reduce (backward: {_counted(found['backward'])}, the input's gradient from each column-wise "
              "layer).")


def _grade_plans(plans: list[Any]) -> list[Verdict]:
    """Grade plans together: those that pass the checks here go to one launch of 2 ranks."""
    from ..distributed.launch import WorkerError, launch

    verdicts: dict[int, Verdict] = {}
    todo: list[int] = []
    for i, plan in enumerate(plans):
        bad = _invalid_plan(plan)
        if bad is None and not plan:
            bad = fail("your plan is empty: parallelize_module would leave every layer whole on every rank, each "
                       "rank computing the whole MLP as one process does (no memory saved, no work shared).",
                       "a plan names each layer to split and how: " + _PAIR_HINT.split(": ", 1)[1], _PAIR_CLOSER)
        if bad is not None:
            verdicts[i] = bad
        else:
            todo.append(i)
    if todo:
        try:
            ranks = launch(swiglu_plan_worker, 2, [dict(plans[i]) for i in todo], timeout=120, group_timeout=60,
                           quiet=True)
        except WorkerError as exc:
            last = str(exc).strip().splitlines()[-1]
            stuck = fail(f"the 2 processes that run your plan did not finish: {last}",
                         "a rank that waits in a collective the other never calls waits until its timeout: does "
                         "your plan make the ranks run different collectives?", _PAIR_CLOSER)
            return [verdicts.get(i, stuck) for i in range(len(plans))]
        for j, i in enumerate(todo):
            verdicts[i] = _plan_verdict(plans[i], ranks[0][j])
    return [verdicts[i] for i in range(len(plans))]


@exercise
def check_swiglu_plan(plan: Mapping[str, ParallelStyle]) -> Verdict:
    """Exercise 1: ``plan`` is a ``parallelize_module`` plan for `SwiGLU` (``{"gate": ..., "up": ..., "down":
    ...}``). The checker applies it on 2 gloo ranks (one launch, a few seconds) and runs one forward and one
    backward on the input of one process, then compares: no error; the output whole on every rank (a plain
    tensor or a replicated DTensor) and equal to one process's, and every gradient (weights gathered, and the
    input's), within `model_parallel_demos.TOLERANCE`; each weight split; and one all-reduce in forward. A
    plan that fails is told what it did on the ranks and why."""
    return _grade_plans([plan])[0]


# --- 2. predict the collectives of the GPT ------------------------------------------------------------------

COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")
"""The collectives DTensor issues here, as ``CommDebugMode`` names them."""

COLLECTIVE_CASES: tuple[tuple[int, bool, bool], ...] = tuple(
    (n, sp, lp) for sp in (False, True) for lp in (False, True) for n in (1, 4))
"""Exercise 2's cases: (blocks, sequence parallelism, loss parallel)."""

_MEASURE_CFG = dict(vocab=64, seq_len=9, d_model=32, n_heads=4, batch=2)  # 8 input tokens: 2 and 4 ranks divide them


def _measure(mesh: DeviceMesh, n_blocks: int, sequence_parallel: bool, vocab_parallel: bool) -> dict[str, Any]:
    cfg = GPTConfig(n_layers=n_blocks, **_MEASURE_CFG)
    tokens = token_batch(cfg, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    reference = GPT(cfg)
    ref_loss = reference.loss(tokens)
    ref_loss.backward()
    build = functools.partial(demos.tensor_parallel_gpt, sequence_parallel=sequence_parallel)
    gpt = build(cfg, mesh, vocab_sharded_head=vocab_parallel)
    with loss_parallel() if vocab_parallel else contextlib.nullcontext():  # backward too must run inside it
        with CommDebugMode() as fwd:
            loss = gpt.loss(tokens)
        with CommDebugMode() as bwd:
            loss.backward()
    worst = abs(_full(loss).item() - ref_loss.item())
    for (name, p), q in zip(gpt.named_parameters(), reference.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        grad = _full(p.grad)
        if name.endswith(("qkv.weight", "qkv.bias")):
            grad = demos.qkv_major(grad, cfg.n_heads)
        worst = max(worst, (grad - q.grad).abs().max().item())
    return {"forward": _counts(fwd), "backward": _counts(bwd), "equal": worst < TOLERANCE}


def collectives_worker(rank: int, world_size: int, cases: list[tuple[int, bool, bool]]) -> list[dict[str, Any]]:
    """Exercise 2's worker: for each ``(blocks, sequence parallelism, loss parallel)`` of ``cases``, the GPT
    tensor-parallel over all the ranks (`model_parallel_demos.tensor_parallel_gpt`, with or without ``sequence_parallel``),
    one ``gpt.loss(tokens)`` and its backward counted by ``CommDebugMode``, and whether the loss and the
    gradients equal one process's."""
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    return [_measure(mesh, *case) for case in cases]


Counts = dict[str, dict[str, int]]
_MEASURED: dict[tuple[int, bool, bool], Counts] = {}


def measured_collectives() -> dict[tuple[int, bool, bool], Counts]:
    """`COLLECTIVE_CASES`' counts, ``{case: {"forward": {...}, "backward": {...}}}``, measured on 2 gloo ranks
    in one launch the first time they are asked for in this process, then kept."""
    if not _MEASURED:
        from ..distributed.launch import launch

        results = launch(collectives_worker, 2, list(COLLECTIVE_CASES), timeout=180, quiet=True)[0]
        for case, found in zip(COLLECTIVE_CASES, results, strict=True):
            if not found["equal"]:
                raise RuntimeError(f"the tensor-parallel GPT of case {case} does not compute what one process does")
            _MEASURED[case] = {"forward": found["forward"], "backward": found["backward"]}
    return dict(_MEASURED)


def _setting(sp: bool, lp: bool) -> str:
    return {(False, False): "tensor parallelism alone", (False, True): "tensor parallelism and loss parallel",
            (True, False): "sequence parallelism", (True, True): "sequence parallelism and loss parallel"}[(sp, lp)]


def _call_text(case: tuple[int, bool, bool]) -> str:
    n, sp, lp = case
    return f"collectives({n}, sequence_parallel={sp}, loss_parallel={lp})"


def _read_counts(case: tuple[int, bool, bool], got: Any) -> Counts | Verdict:
    """``got`` as ``{"forward": {name: n}, "backward": {name: n}}`` without zero counts, or a failing verdict."""
    call = _call_text(case)
    shape = ('{"forward": {"all_reduce": ...}, "backward": {...}}: for each direction, a dict from a collective\'s '
             "name to how many times it runs")
    if not isinstance(got, Mapping) or set(got) != {"forward", "backward"}:
        keys = f" with keys {sorted(map(str, got))}" if isinstance(got, Mapping) else ""
        return fail(f"{call} returned {type(got).__name__}{keys}; expected {shape}.",
                    "the forward and the backward run different collectives: count each on its own.",
                    'return {"forward": {...}, "backward": {...}}.')
    read: Counts = {}
    for direction in ("forward", "backward"):
        counts = got[direction]
        if not isinstance(counts, Mapping):
            return fail(f"{call}[{direction!r}] is a {type(counts).__name__}; expected a dict from a collective's "
                        "name to a count.", "CommDebugMode counts each collective by its name, as sections 2 and 3 "
                        "print them.", 'for example {"all_reduce": 3}.')
        read[direction] = {}
        for name, n in counts.items():
            if name not in COLLECTIVES:
                return fail(f"{call}[{direction!r}] counts {name!r}, which is not a collective that CommDebugMode "
                            f"reports here; it names them {', '.join(map(repr, COLLECTIVES))}.",
                            "use the names sections 2 and 3 print for the collectives DTensor runs.",
                            "an all-gather is 'all_gather_into_tensor', a reduce-scatter 'reduce_scatter_tensor'.")
            if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 0:
                return fail(f"{call}[{direction!r}][{name!r}] is {n!r}; a count is a whole number, 0 or more.",
                            "each entry counts how many times that collective runs.")
            if n:
                read[direction][name] = int(n)
    return read


def _per_block(a: dict[str, int], b: dict[str, int], blocks: int) -> dict[str, Fraction]:
    """What each of ``blocks`` more blocks adds, from the counts ``a`` (fewer blocks) and ``b`` (more)."""
    return {name: Fraction(b.get(name, 0) - a.get(name, 0), blocks) for name in COLLECTIVES}


def _described(counts: Mapping[str, Fraction | int]) -> str:
    items = [(name, n) for name, n in counts.items() if n]
    return "no collective" if not items else ", ".join(f"{n} {name}" for name, n in items)


def _compared(got: Mapping[str, Fraction | int], want: Mapping[str, Fraction | int]) -> str:
    parts = []
    for name in COLLECTIVES:
        g, w = got.get(name, 0), want.get(name, 0)
        if g != w:
            parts.append(f"{'too many' if g > w else 'too few'} {name}")
    return " and ".join(parts)


_BLOCK_HINT = {
    False: ("section 2 counted one block: Megatron-LM's pair of column-wise and row-wise layers in attention and in "
            "the MLP, each pair ending in an all-reduce in forward, each column-wise layer's input gradient "
            "all-reduced in backward.",
            "per block: the all-reduces after proj and after the MLP's out in forward; in backward, those of the "
            "input gradients of qkv and of the MLP's fc."),
    True: ("section 3: with sequence parallelism each all-reduce of a block becomes an all-gather (before a "
           "column-wise layer) and a reduce-scatter (after a row-wise one); in backward each turns into the "
           "other.",
           "per block, forward: an all-gather before qkv and before fc, a reduce-scatter after proj and after out; "
           "backward mirrors them, an all-gather's gradient reduce-scattered and a reduce-scatter's gathered."),
}

_EDGE_HINTS: dict[tuple[bool, bool, str], tuple[str, str]] = {
    (False, False, "forward"): (
        "outside the blocks, tensor_parallel_gpt splits nothing: the embeddings, the final norm and the head are "
        "replicated.", "a replicated layer computes the same on every rank, without a collective."),
    (False, False, "backward"): (
        "outside the blocks everything is replicated: its gradients are computed whole on every rank.",
        "the embeddings' gradient comes from block 0's input gradient, which the blocks' own collectives already "
        "made whole."),
    (False, True, "forward"): (
        "loss parallel (section 3): the cross-entropy computed from the vocabulary shards of the logits needs a few "
        "numbers per token from every rank.",
        "per token: the largest logit, the sum of the exponentials and the target's logit, each all-reduced "
        "across the vocabulary shards; section 3 printed the count for 2 blocks."),
    (False, True, "backward"): (
        "the head is column-wise with loss parallel: what is the gradient of its (replicated) input, when each "
        "rank holds a share of the vocabulary?",
        "each rank's head gives a partial sum of the input's gradient, added as for any column-wise layer."),
    (True, False, "forward"): (
        "a collective runs where a tensor changes placement. Which boundaries outside the blocks change one: "
        "before block 0 (whole sequence to shares), and before the head (shares to the whole sequence)?",
        "cutting a replicated tensor into shares is a slice, without communication; putting the shares together "
        "is an all-gather."),
    (True, False, "backward"): (
        "in backward each boundary's gradient goes the other way: which placement does the gradient have on each "
        "side of the cut before block 0, and of the gather before the replicated head?",
        "before the head, the gradient is the same on every rank (the head and the loss are replicated), so "
        "cutting it into shares is a slice; before block 0, the shares' gradients must be put together for the "
        "replicated embeddings."),
    (True, True, "forward"): (
        "sequence parallelism's boundaries and loss parallel's cross-entropy together: the column-wise head needs "
        "the whole sequence, and the loss needs a few numbers per token from every vocabulary shard.",
        "the head's input is gathered from the shares of the sequence once; the cross-entropy all-reduces as "
        "without sequence parallelism."),
    (True, True, "backward"): (
        "in backward each boundary's gradient goes the other way. The column-wise head's input gradient is a "
        "partial sum over the vocabulary shards, and its input came from shares of the sequence: which single "
        "collective sums and cuts at once?",
        "the head's input gradient: a reduce-scatter (partial sums back to shares of the sequence); before block "
        "0, the shares' gradients put together for the replicated embeddings."),
}


def _diagnose_counts(answers: dict[tuple[int, bool, bool], Counts],
                     measured: dict[tuple[int, bool, bool], Counts]) -> Verdict:
    cases = list(measured)
    if all(answers[c]["forward"] == measured[c]["backward"] and answers[c]["backward"] == measured[c]["forward"]
           for c in cases):
        return fail("your forward and backward counts are swapped.",
                    "which collectives run while the loss is computed, and which while its gradients flow back?",
                    'the "forward" counts are those of gpt.loss(tokens), the "backward" ones those of '
                    "loss.backward().")
    small, large = min(c[0] for c in cases), max(c[0] for c in cases)
    for sp in (False, True):
        for lp in (False, True):
            few, many = (small, sp, lp), (large, sp, lp)
            if few not in answers or many not in answers:
                continue
            for direction in ("forward", "backward"):
                got = _per_block(answers[few][direction], answers[many][direction], large - small)
                want = _per_block(measured[few][direction], measured[many][direction], large - small)
                where = f"with {_setting(sp, lp)}, {direction}"
                calls = f"{_call_text(few)} and {_call_text(many)}"
                if got != want:
                    if any(n.denominator != 1 for n in got.values()):
                        return fail(f"{where}: {calls} differ by a count that is not the same for every block.",
                                    "every block is the same layers under the same plan: each adds the same "
                                    "collectives.", _BLOCK_HINT[sp][1])
                    if sp and got == _per_block({}, {"all_reduce": 2}, 1):
                        return fail(f"{where}: your blocks still all-reduce, as without sequence parallelism.",
                                    *_BLOCK_HINT[True])
                    return fail(f"{where}: from {calls}, each block adds {_described(got)} in your answers; that is "
                                f"{_compared(got, want)} per block.", *_BLOCK_HINT[sp])
                edge_got = {k: answers[few][direction].get(k, 0) - small * got[k] for k in COLLECTIVES}
                edge_want = {k: measured[few][direction].get(k, 0) - small * want[k] for k in COLLECTIVES}
                if edge_got != edge_want:
                    return fail(f"{where}: what each block runs is right, but outside the blocks your answers have "
                                f"{_described(edge_got)}: {_compared(edge_got, edge_want)} there.",
                                *_EDGE_HINTS[(sp, lp, direction)])
    wrong = next(c for c in cases if answers[c] != measured[c])
    return fail(f"{_call_text(wrong)} differs from what CommDebugMode counts.", *_BLOCK_HINT[wrong[1]])


@exercise
def check_collectives(fn: Callable[[int, bool, bool], Any]) -> Verdict:
    """Exercise 2: ``fn(n_blocks, sequence_parallel, loss_parallel)`` returns ``{"forward": {name: count},
    "backward": {name: count}}``, the collectives ``CommDebugMode`` counts in one ``gpt.loss(tokens)`` and in
    its ``backward()`` for the course's GPT of ``n_blocks`` blocks on a 2-rank "tp" mesh:
    `model_parallel_demos.tensor_parallel_gpt` (``vocab_sharded_head=loss_parallel``), or with sequence
    parallelism ``tensor_parallel_gpt(..., sequence_parallel=True)``; under ``loss_parallel()`` when ``loss_parallel``. Names as
    `COLLECTIVES`; a count of 0 may be left out.

    The checker calls ``fn`` on every case of `COLLECTIVE_CASES` first, then measures them (one launch per
    process, `measured_collectives`), then compares: for each setting and direction, what each block adds
    (from the two numbers of blocks), then what runs outside the blocks."""
    if not callable(fn):
        return fail(f"expected your function, got {type(fn).__name__}.",
                    "pass the function itself: check_collectives(collectives).")
    answers: dict[tuple[int, bool, bool], Counts] = {}
    for case in COLLECTIVE_CASES:
        try:
            got = fn(*case)
        except Exception as exc:  # the student's code: any failure is feedback
            return fail(f"{_call_text(case)} raised {_first_line(exc)}",
                        "your function gets the number of blocks and two booleans, and counts from them.",
                        "build the counts per block, then add what runs outside the blocks for each setting.")
        read = _read_counts(case, got)
        if isinstance(read, Verdict):
            return read
        answers[case] = read
    measured = measured_collectives()
    if all(answers[c] == measured[c] for c in COLLECTIVE_CASES):
        return ok(f"all {len(COLLECTIVE_CASES)} predictions equal what CommDebugMode counted on 2 ranks: 1 and 4 "
                  "blocks, with and without sequence parallelism and loss parallel, forward and backward.")
    return _diagnose_counts(answers, measured)


# --- 3. choose the microbatches -----------------------------------------------------------------------------

_GB = 10**9


def _realistic_case(pp: int, tp: int, dp: int, target: float) -> tuple[int, float, float, float]:
    """Section 6's 65 B model on 80 GB GPUs (the same margin and context): one microbatch's activations on
    the first stage, and what the stage's state leaves of the GPU for activations."""
    cfg = GPTConfig(vocab=32_000, seq_len=4097, d_model=8192, n_heads=64, n_layers=80)
    layout = Layout(dp=dp, tp=tp, pp=pp, zero=1, sequence_parallel=True)
    gpu = 80e9 * 0.9 - 2**30
    per_microbatch = activation_bytes_per_gpu(cfg, layout, 1, 1, "1F1B", act=2, res=4)
    return pp, per_microbatch, gpu - sum(state_bytes_per_gpu(cfg, layout).values()), target


MICROBATCH_CASES: tuple[tuple[int, float, float, float], ...] = (
    (4, 1 * _GB, 8 * _GB, 0.25),  # the bubble lands on 0.25; GPipe does not fit, 1F1B does
    (4, 1 * _GB, 9 * _GB, 0.25),  # GPipe exactly at the budget
    (4, 3 * _GB, 11 * _GB, 0.25),  # neither fits
    (4, 3 * _GB, 12 * _GB, 0.25),  # 1F1B exactly at the budget
    (8, 1 * _GB, 7 * _GB, 0.5),  # fewer microbatches than stages: 1F1B keeps m of them
    (8, 1 * _GB, 6.5 * _GB, 0.5),  # ... and then neither fits
    (1, 2 * _GB, 2 * _GB, 0.1),  # one stage: no bubble
    (1, 3 * _GB, 2 * _GB, 0.1),  # one stage, too big
    (4, 1 * _GB, 80 * _GB, 0.2),  # the bubble lands on 0.2, a float: (p-1)(1-t)/t rounds past it
    (16, 2 * _GB, 40 * _GB, 0.05),  # hundreds of microbatches
    (4, 1 * _GB, 4 * _GB, 0.75),  # one microbatch is enough
    (2, 5 * _GB, 10 * _GB, 0.2),  # two stages
    (3, 1 * _GB, 10 * _GB, 0.3),  # a bubble below the target, not on it
    _realistic_case(4, 8, 2, 0.08),  # section 6's 65 B model, dp 2 × tp 8 × pp 4
    _realistic_case(8, 8, 1, 0.15),  # ... and dp 1 × tp 8 × pp 8
)
"""Exercise 3's cases: (stages p, bytes of one microbatch's activations on the first stage, bytes a stage has
for activations, the largest bubble allowed)."""

SCHEDULES = ("GPipe", "1F1B")


def _bubble(p: int, m: int) -> float:
    return (p - 1) / (m + p - 1)


def _fewest(p: int, target: float, exact: bool = False) -> int:
    """The fewest microbatches whose bubble is at most ``target`` (``exact``: compared in fractions)."""
    def meets(m: int) -> bool:
        return Fraction(p - 1, m + p - 1) <= Fraction(target) if exact else _bubble(p, m) <= target

    m = max(1, math.ceil((p - 1) * (1 - target) / target) if target > 0 else 1)
    while m > 1 and meets(m - 1):
        m -= 1
    while not meets(m):
        m += 1
    return m


def _in_flight(schedule: str, p: int, m: int) -> int:
    """Microbatches whose activations the first stage holds at once."""
    return m if schedule == "GPipe" else min(m, p)


def _fitting(p: int, act: float, budget: float, m: int) -> list[str]:
    return [s for s in SCHEDULES if _in_flight(s, p, m) * act <= budget]


def _case_text(case: tuple[int, float, float, float]) -> str:
    p, act, budget, target = case
    return f"microbatches({p}, {act / _GB:.3g} GB, {budget / _GB:.3g} GB, {target:g})"


_BUBBLE_HINT = ("the bubble (section 4): with p stages and m microbatches a stage idles (p − 1)/(m + p − 1) of the "
                "step. The fewest m whose bubble is at most the target: a bubble equal to it meets it.")
_BUBBLE_CLOSER = ("count m up from 1 until (p - 1) / (m + p - 1) <= target; or solve for m, round up, and then check "
                  "m and m - 1 with the formula itself, since a float can land either side of a tie.")
_MEMORY_HINT = ("activations in flight (section 4): GPipe runs every forward before the first backward, so its first "
                "stage holds all m microbatches; 1F1B starts backwards after a warm-up of p forwards, so it holds at "
                "most p, and never more than m.")
_MEMORY_CLOSER = ("at the fewest m: GPipe fits when m × activation_bytes <= budget_bytes; 1F1B when min(m, p) × "
                  "activation_bytes <= budget_bytes; an exact fit fits.")


def _not_an_answer(case: tuple[int, float, float, float], got: Any) -> Verdict | None:
    call = _case_text(case)
    if got is None:
        return None
    if not isinstance(got, tuple) or len(got) != 2:
        return fail(f"{call} returned {got!r:.80}; expected (schedule, m), a tuple, or None.",
                    "the answer is a pair: the schedule's name and the number of microbatches.",
                    'for example ("1F1B", 12), or None when no schedule fits.')
    schedule, m = got
    if isinstance(schedule, numbers.Integral) and isinstance(m, str):
        return fail(f"{call} returned {got!r}: the schedule comes first, then m.",
                    "the checker unpacks schedule, m = your answer.")
    if schedule not in SCHEDULES:
        close = [s for s in SCHEDULES if isinstance(schedule, str) and s.lower() == schedule.lower()]
        return fail(f"{call} returned the schedule {schedule!r}; expected {' or '.join(map(repr, SCHEDULES))}"
                    + (f" (spelled {close[0]!r}, as torch.distributed.pipelining names its Schedule{close[0]})"
                       if close else "") + ".",
                    "the two schedules of section 4 whose memory differs: GPipe and 1F1B.")
    if not isinstance(m, numbers.Integral) or isinstance(m, bool) or m < 1:
        kind = " (a float)" if isinstance(m, float) else ""
        return fail(f"{call} returned m = {m!r}{kind}; a number of microbatches is a whole number, at least 1.",
                    "which of your operations gives a float or 0 where a count is meant?",
                    "math.ceil and // of ints give ints; / gives a float; with one stage a single microbatch "
                    "already has no bubble.")
    return None


def _wrong_formula(answers: list[Any]) -> Verdict | None:
    """A failing verdict when every answer's m is what another reading of the bubble gives."""
    readings: list[tuple[str, Callable[[int, int, float], bool], str]] = [
        ("a bubble strictly below the target", lambda p, m, t: _bubble(p, m) < t,
         "'at most the target' includes a bubble equal to it: several cases land exactly on it."),
        ("the bubble read as (p − 1)/m", lambda p, m, t: (p - 1) / m <= t,
         "the step lasts m + p − 1 slots of one microbatch (section 4): the idle share is (p − 1) over that."),
        ("the bubble read as (p − 1)/(m + p)", lambda p, m, t: (p - 1) / (m + p) <= t,
         "count the slots of a step: m of work, and p − 1 of filling and draining the pipeline."),
        ("the bubble read as 1/m", lambda p, m, t: 1 / m <= t,
         "the bubble grows with the number of stages: each stage but one waits at the start and the end."),
    ]
    ms = [got[1] if got is not None else None for got in answers]
    for label, meets, why in readings:
        def fewest(p: int, t: float, meets: Callable[[int, int, float], bool] = meets) -> int | None:
            return next((m for m in range(1, 100_000) if meets(p, m, t)), None)

        predicted = [fewest(case[0], case[3]) for case in MICROBATCH_CASES]
        if all(m is None or m == want for m, want in zip(ms, predicted, strict=True)) and any(
                m is not None and m != _fewest(case[0], case[3]) for m, case in zip(ms, MICROBATCH_CASES, strict=True)):
            return fail(f"your numbers of microbatches are those of {label}: {why}", _BUBBLE_HINT, _BUBBLE_CLOSER)
    return None


def _case_verdict(case: tuple[int, float, float, float], got: Any) -> Verdict | None:
    p, act, budget, target = case
    call = _case_text(case)
    accepted = {_fewest(p, target), _fewest(p, target, exact=True)}
    want = min(accepted)
    fits = _fitting(p, act, budget, want)
    if got is None:
        if not fits:
            return None
        exact = [s for s in fits if _in_flight(s, p, want) * act == budget]
        if want < p:
            return fail(f"{call} returned None, but a schedule fits at the fewest m: with fewer microbatches than "
                        "stages, 1F1B holds only those m, as GPipe does"
                        + (", and they land exactly on the budget: an exact fit fits." if exact else "."),
                        _MEMORY_HINT, _MEMORY_CLOSER)
        if exact:
            return fail(f"{call} returned None, but at the fewest m {exact[0]}'s activations in flight land exactly "
                        "on the budget, and an exact fit fits.", _MEMORY_HINT, _MEMORY_CLOSER)
        return fail(f"{call} returned None, but a schedule fits at the fewest m: 1F1B holds at most p microbatches "
                    "at once.", _MEMORY_HINT, _MEMORY_CLOSER)

    schedule, m = got
    if m not in accepted:
        if m > want and all(_bubble(p, k) <= target for k in range(want, m)):
            tie = _bubble(p, m - 1) == target
            return fail(f"{call} returned m = {m}, but fewer microbatches already meet the target"
                        + (": m − 1 gives a bubble exactly equal to it, which meets it (a formula solved for m in "
                           "floating point can round past such a tie)." if tie else "."),
                        "the fewest m: a microbatch's size is fixed, so each one more makes the step's batch larger "
                        "(and GPipe hold more activations). " + _BUBBLE_HINT.split(". ", 1)[1], _BUBBLE_CLOSER)
        return fail(f"{call} returned m = {m}, whose bubble, {_bubble(p, m):.4g}, is above the target.",
                    _BUBBLE_HINT, _BUBBLE_CLOSER)
    if not fits:
        return fail(f"{call} returned {got!r}, but at m = {m} neither schedule fits: {schedule} holds "
                    f"{_in_flight(schedule, p, m)} microbatches of {act / _GB:.3g} GB, more than "
                    f"{budget / _GB:.3g} GB. More microbatches would not help: GPipe would hold more of them, and "
                    "1F1B as many. Return None.", _MEMORY_HINT, _MEMORY_CLOSER)
    if schedule not in fits:
        held = _in_flight(schedule, p, m)
        return fail(f"{call} returned {got!r}, but {schedule} holds {held} microbatches' activations at once on the "
                    f"first stage, {held * act / _GB:.4g} GB, more than {budget / _GB:.4g} GB.",
                    _MEMORY_HINT, _MEMORY_CLOSER)
    return None


@exercise
def check_microbatches(fn: Callable[[int, float, float, float], Any]) -> Verdict:
    """Exercise 3: ``fn(p, activation_bytes, budget_bytes, target)`` returns ``(schedule, m)``: the fewest
    microbatches ``m`` whose bubble ``(p − 1)/(m + p − 1)`` is at most ``target``, and ``"GPipe"`` or ``"1F1B"``
    such that the first stage's activations in flight fit in ``budget_bytes`` (GPipe holds m microbatches of
    ``activation_bytes``, 1F1B ``min(m, p)``; an exact fit fits); or None when neither fits at that m (more
    microbatches never help). Either schedule is accepted where both fit.

    The checker calls ``fn`` on every case of `MICROBATCH_CASES` (each call for at most `CALL_SECONDS`, where a
    SIGALRM can stop it), then names a reading of the bubble that explains all the answers, else the first
    wrong case's mistake. Where the bubble of the fewest m lands exactly on ``target`` both the float
    comparison and the exact one are accepted, where they differ."""
    if not callable(fn):
        return fail(f"expected your function, got {type(fn).__name__}.",
                    "pass the function itself: check_microbatches(microbatches).")
    answers = []
    for case in MICROBATCH_CASES:
        try:
            with time_limit(CALL_SECONDS):
                got = fn(*case)
        except TooSlow:
            p, act, budget, target = case
            if not _fitting(p, act, budget, _fewest(p, target)):
                return fail(f"{_case_text(case)} did not return within {CALL_SECONDS:g} s. No schedule fits here, "
                            "at any m: a search that adds microbatches until the activations fit never ends.",
                            "what do more microbatches do to the activations in flight, with GPipe and with 1F1B?",
                            _MEMORY_CLOSER + " If neither fits at the fewest m, return None.")
            return fail(f"{_case_text(case)} did not return within {CALL_SECONDS:g} s.",
                        "does your search for m stop? " + _BUBBLE_HINT.split(". ", 1)[1], _BUBBLE_CLOSER)
        except Exception as exc:  # the student's code: any failure is feedback
            return fail(f"{_case_text(case)} raised {_first_line(exc)}",
                        "run your function on these arguments yourself: the traceback shows which operation fails "
                        "(one stage, p = 1, has no bubble at all).", _BUBBLE_CLOSER)
        bad = _not_an_answer(case, got)
        if bad is not None:
            return bad
        answers.append(got)
    reading = _wrong_formula(answers)
    if reading is not None:
        return reading
    for case, got in zip(MICROBATCH_CASES, answers, strict=True):
        bad = _case_verdict(case, got)
        if bad is not None:
            return bad
    return ok(f"all {len(MICROBATCH_CASES)} cases agree: from 1 to 16 stages, bubbles that land exactly on the "
              "target, activations exactly at the budget, fewer microbatches than stages, and section 6's 65 B "
              "model on 80 GB GPUs.")


# --- 4. choose the layout -----------------------------------------------------------------------------------

LAYOUT_MICROBATCHES = 8
"""Exercise 4 plans as section 6 does: 8 microbatches of one sequence per step and dp rank, 1F1B, bf16 products
and a float32 residual stream (``act=2, res=4``), float32 weights, gradients and AdamW moments, ZeRO 1 and
sequence parallelism."""


def _gpu(gb: float) -> float:
    """Section 6's budget of a GPU of ``gb`` GB: less a 10% allocator margin and the CUDA context."""
    return gb * 1e9 * 0.9 - 2**30


_MODELS = {
    "7 B": GPTConfig(vocab=32_000, seq_len=4097, d_model=4096, n_heads=32, n_layers=32),
    "13 B, 20 heads": GPTConfig(vocab=32_000, seq_len=4097, d_model=5120, n_heads=20, n_layers=40),
    "13 B, 40 heads": GPTConfig(vocab=32_000, seq_len=4097, d_model=5120, n_heads=40, n_layers=40),
    "65 B": GPTConfig(vocab=32_000, seq_len=4097, d_model=8192, n_heads=64, n_layers=80),
    "175 B": GPTConfig(vocab=51_200, seq_len=2049, d_model=12288, n_heads=96, n_layers=96),
}

LAYOUT_CASES: tuple[tuple[str, GPTConfig, int, int, float], ...] = (
    ("7 B", _MODELS["7 B"], 8, 1, _gpu(80)),
    ("7 B", _MODELS["7 B"], 8, 1, _gpu(24)),
    ("7 B", _MODELS["7 B"], 4, 2, _gpu(24)),
    ("13 B, 40 heads", _MODELS["13 B, 40 heads"], 8, 4, _gpu(40)),
    ("13 B, 20 heads", _MODELS["13 B, 20 heads"], 8, 4, _gpu(40)),
    ("65 B", _MODELS["65 B"], 8, 8, _gpu(80)),
    ("65 B", _MODELS["65 B"], 8, 1, _gpu(80)),
    ("175 B", _MODELS["175 B"], 8, 8, _gpu(80)),
    ("175 B", _MODELS["175 B"], 8, 64, _gpu(80)),
    ("7 B", _MODELS["7 B"], 6, 2, _gpu(40)),  # nodes of 6: tp 4 would fit the memory, but not in a node
)
"""Exercise 4's cases: (the model's name, its shape, GPUs per node, nodes, bytes a GPU has for the step)."""


def _layout_need(cfg: GPTConfig, layout: Layout) -> float:
    """Bytes the most loaded GPU needs: the model's state and the activations of section 6's step. Raises
    ValueError for a layout `layout_plan` cannot split the model by."""
    state = sum(state_bytes_per_gpu(cfg, layout).values())
    return state + activation_bytes_per_gpu(cfg, layout, 1, LAYOUT_MICROBATCHES, "1F1B", act=2, res=4)


def _candidates(cfg: GPTConfig, per_node: int, nodes: int) -> list[Layout]:
    """Every layout of section 6's kind on the whole cluster that `layout_plan` can split the model by, with tp
    within a node: fewest GPUs per model copy (tp × pp) first, then the largest tp."""
    total = per_node * nodes
    found = []
    for copy_size in (k for k in range(1, total + 1) if total % k == 0):
        for tp in (t for t in range(min(per_node, copy_size), 0, -1) if per_node % t == 0 and copy_size % t == 0):
            layout = Layout(dp=total // copy_size, tp=tp, pp=copy_size // tp, zero=1, sequence_parallel=True)
            try:
                _layout_need(cfg, layout)
            except ValueError:
                continue
            found.append(layout)
    return found


def _reference_layout(cfg: GPTConfig, per_node: int, nodes: int, gpu_bytes: float) -> Layout | None:
    return next((lay for lay in _candidates(cfg, per_node, nodes) if _layout_need(cfg, lay) <= gpu_bytes), None)


def _layout_case_text(case: tuple[str, GPTConfig, int, int, float]) -> str:
    name, _, per_node, nodes, gpu = case
    return (f"the {name} model on {nodes} node{'s' if nodes > 1 else ''} of {per_node} GPUs with "
            f"{gpu / 1e9:.1f} GB each")


def _short(layout: Layout) -> str:
    return f"dp {layout.dp} × tp {layout.tp} × pp {layout.pp}"


_LAYOUT_HINT = ("Narayanan et al.'s rule (section 6): as few GPUs per copy of the model as fit, tp × pp; of those, "
                "as much tensor parallelism as fits within a node (the bubble and the stages' imbalance come with "
                "pp); data parallelism over the rest.")
_LAYOUT_CLOSER = ("try the numbers of GPUs per copy that divide the cluster, from 1 up; for each, tp from the largest "
                  "that divides both it and a node's GPUs down to 1 (pp the rest), skipping those layout_plan raises "
                  "for; return the first whose state and activations fit.")


def _layout_verdict(case: tuple[str, GPTConfig, int, int, float], got: Any) -> Verdict | None:
    _, cfg, per_node, nodes, gpu = case
    where = _layout_case_text(case)
    want = _reference_layout(cfg, per_node, nodes, gpu)
    if got is None:
        if want is None:
            return None
        return fail(f"for {where} you returned None, but a layout fits.",
                    "None is for a cluster on which no layout fits: did your search try every tp within a node "
                    "with every pp?", _LAYOUT_CLOSER)
    if not isinstance(got, Layout):
        return fail(f"for {where} you returned {type(got).__name__} {got!r:.60}; expected a Layout, or None.",
                    "the answer is layout_plan's Layout(dp=..., tp=..., pp=..., zero=1, sequence_parallel=True).",
                    "from course_utils.memory.layout_plan import Layout.")
    if got.zero != 1 or not got.sequence_parallel:
        return fail(f"for {where} you returned {got}; the exercise plans with ZeRO 1 and sequence parallelism "
                    "(zero=1, sequence_parallel=True), as section 6's 65 B rows do.",
                    "the layout's other settings are fixed: only dp, tp and pp are chosen.")
    if got.gpus != per_node * nodes:
        return fail(f"for {where} your layout, {_short(got)}, uses {got.gpus} GPUs of the {per_node * nodes}.",
                    "a layout uses the whole cluster: data parallelism takes the GPUs model parallelism leaves.",
                    "dp is the cluster's GPUs divided by tp × pp.")
    if got.tp > per_node or per_node % got.tp:
        return fail(f"for {where} your layout has tp {got.tp}, which does not fit within a node of {per_node} GPUs: "
                    "its all-reduces, two per block in every forward and two in every backward, would cross the network "
                    "between nodes (section 1).", "tensor parallelism stays within a node: which tp can a node "
                    "hold whole?", "tp must divide the GPUs of a node.")
    try:
        need = _layout_need(cfg, got)
    except ValueError as exc:
        return fail(f"for {where} your layout, {_short(got)}, cannot split the model: {exc}.",
                    "tensor parallelism splits whole heads and the vocabulary; a pipeline stage holds at least one "
                    "block.", "skip the layouts for which layout_plan raises ValueError.")
    if need > gpu:
        state = sum(state_bytes_per_gpu(cfg, got).values())
        return fail(f"for {where} your layout, {_short(got)}, needs {need / 1e9:.1f} GB per GPU, "
                    f"{state / 1e9:.1f} GB of state and {(need - state) / 1e9:.1f} GB of activations: more than "
                    f"{gpu / 1e9:.1f} GB.",
                    "section 6's plan: the model's state and the activations of the most loaded stage must both "
                    "fit.", "add state_bytes_per_gpu's values and activation_bytes_per_gpu(cfg, layout, 1, 8, "
                    "'1F1B', act=2, res=4), and compare with gpu_bytes.")
    assert want is not None  # the student's layout fits, so the reference finds one
    if got.tp * got.pp > want.tp * want.pp:
        return fail(f"for {where} your layout, {_short(got)}, fits, but a layout with fewer GPUs per copy of the "
                    "model fits too.", "every GPU added to a copy of the model adds communication or bubble: "
                    + _LAYOUT_HINT, _LAYOUT_CLOSER)
    if got != want:
        return fail(f"for {where} your layout, {_short(got)}, fits, but with as many GPUs per copy of the model a "
                    "larger tp fits too.", _LAYOUT_HINT, _LAYOUT_CLOSER)
    return None


@exercise
def check_layout(fn: Callable[[GPTConfig, int, int, float], Any]) -> Verdict:
    """Exercise 4: ``fn(cfg, gpus_per_node, nodes, gpu_bytes)`` returns the `Layout` (``zero=1,
    sequence_parallel=True``) on all ``gpus_per_node × nodes`` GPUs whose most loaded GPU's state and section 6's
    activations (`LAYOUT_MICROBATCHES` microbatches of one sequence, 1F1B) fit in ``gpu_bytes``, with tp dividing
    a node's GPUs; of those, the fewest GPUs per copy of the model (tp × pp), then the largest tp; None if none
    fits. Layouts that `layout_plan` raises for (tp not dividing the heads or the vocabulary, more stages than
    blocks) are not layouts. The checker calls ``fn`` on every case of `LAYOUT_CASES`, then reports the first
    wrong one. No candidate layout of these cases needs within 0.1% of its GPU's bytes, so sums taken in
    another order give the same answers."""
    if not callable(fn):
        return fail(f"expected your function, got {type(fn).__name__}.",
                    "pass the function itself: check_layout(choose_layout).")
    for case in LAYOUT_CASES:
        _, cfg, per_node, nodes, gpu = case
        try:
            got = fn(cfg, per_node, nodes, gpu)
        except Exception as exc:  # the student's code: any failure is feedback
            hint = ("layout_plan raises ValueError for a layout it cannot split the model by: your search must "
                    "skip those." if isinstance(exc, ValueError) else
                    "run your function on this case yourself: the traceback shows which operation fails.")
            return fail(f"for {_layout_case_text(case)} your function raised {_first_line(exc)}", hint,
                        _LAYOUT_CLOSER)
        bad = _layout_verdict(case, got)
        if bad is not None:
            return bad
    return ok(f"all {len(LAYOUT_CASES)} clusters get the layout with the fewest GPUs per copy of the model and the "
              "most tensor parallelism within a node that fits, and None where none fits: among them a model whose "
              "heads limit tp, nodes of 4 and of 6 GPUs, and a model for which a smaller tp fits where a larger does not.")
