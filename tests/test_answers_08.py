"""Notebook 08's exercises: a catalogue of answers, as a class would write them, through the checkers; and the
reference memory model the checkers grade against (parameter_count, activation_bytes, the ZeRO stages).

For each checker: plausible wrong answers (each rejected with a message that names its mistake, a hint that
names the concept, and a closer hint; neither hint holds a line of the notebook's solution) and right answers
written otherwise than the notebook's solution (each accepted). The notebook's own solutions come from its
solution cells (`conftest.notebook_functions`). Then the properties of the cases the checkers rely on: every
reading of a ZeRO stage is told apart, the ties and the limits are where the checker's docstring says.

The notebook's solution cells end in demos that read the results of its torchrun runs (``n_small``,
``reports``, ``PLAN_CASES``), and `plan` and `resume_on_one_process` use names other cells define, so
`conftest.notebook_solution`, which runs the whole cell, cannot build them: `conftest.notebook_functions`
takes only the ``def`` from the cell and runs it with the names it is given.
"""

from __future__ import annotations

import functools
import math
import shutil
import tempfile
from collections.abc import Callable
from fractions import Fraction
from itertools import combinations, product
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from answers_helpers import rejected_holding_back, solution_lines
from conftest import notebook_functions
from torch import nn
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.utils.checkpoint import checkpoint

from course_utils.exercises import Verdict
from course_utils.exercises import fully_sharded_data_parallel as ex
from course_utils.memory.accounting import saved_tensor_bytes
from course_utils.memory.planner import plan_memory
from course_utils.models import GPT, GPTConfig, token_batch

NB = "08_fully_sharded_data_parallel"
SMALL = GPTConfig(vocab=256, seq_len=64, d_model=64, n_heads=4, n_layers=2, batch=16)  # the notebook's SMALL

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Any:
    """The small GPT trains faster on one thread; on a busy 2-core machine, two threads wait on each other
    (5 s instead of 0.2 s for the checkpoint's 5 steps)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SOLUTION_LINES = solution_lines(NB)


rejected = functools.partial(rejected_holding_back, solution_lines=SOLUTION_LINES)


def test_the_solution_lines_are_read() -> None:
    assert any("math.ceil" in line for line in SOLUTION_LINES)
    assert any(".fits(budget_bytes)" in line for line in SOLUTION_LINES)
    assert any("set_state_dict(" in line for line in SOLUTION_LINES)


# --- exercise 1: the fewest GPUs ----------------------------------------------------------------------------

def _parts(n: int, stage: int, weights: float, grads: float, optimizer: float) -> tuple[float, float]:
    """(bytes every GPU holds whole, bytes divided among the GPUs), in floats, as a student computes them."""
    per = (weights, grads, optimizer)
    return sum(per[:3 - stage]) * n, sum(per[3 - stage:]) * n


def capped(cap: int) -> Callable[..., int | None]:
    """A search that tries 1 to ``cap`` GPUs: right only while no case needs more."""
    def fewest_gpus(n: int, gpu: float, stage: int, weights: float, grads: float, optimizer: float) -> int | None:
        whole, sharded = _parts(n, stage, weights, grads, optimizer)
        for gpus in range(1, cap + 1):
            if whole + sharded / gpus <= gpu:
                return gpus
        return None
    return fewest_gpus


def endless(n: int, gpu: float, stage: int, weights: float, grads: float, optimizer: float) -> int | None:
    """Adds GPUs until the share fits, without asking first whether it ever will."""
    whole, sharded = _parts(n, stage, weights, grads, optimizer)
    gpus = 1
    while whole + sharded / gpus > gpu:
        gpus += 1
    return gpus


def sharding(states_at: Callable[[int], set[int]]) -> Callable[..., int | None]:
    """A right formula over a wrong reading of the stages: ``states_at(stage)``, the states (0 weights,
    1 gradients, 2 optimizer state) it shards."""
    def fewest_gpus(n: int, gpu: float, stage: int, weights: float, grads: float, optimizer: float) -> int | None:
        per, states = (weights, grads, optimizer), states_at(stage)
        whole = sum(per[i] for i in range(3) if i not in states) * n
        sharded = sum(per[i] for i in states) * n
        if whole > gpu or (whole == gpu and sharded):
            return None
        return 1 if sharded == 0 else max(1, math.ceil(sharded / (gpu - whole)))
    return fewest_gpus


def closed_form(rounding: Callable[[float], Any], none_when_over: bool = False) -> Callable[..., Any]:
    """The notebook's formula with another rounding of the quotient; ``none_when_over``: None only when the
    whole part is over the GPU (not when it fills it exactly)."""
    def fewest_gpus(n: int, gpu: float, stage: int, weights: float, grads: float, optimizer: float) -> Any:
        whole, sharded = _parts(n, stage, weights, grads, optimizer)
        if whole > gpu if none_when_over else whole >= gpu:
            return None
        return 1 if sharded == 0 else max(1, rounding(sharded / (gpu - whole)))
    return fewest_gpus


def strictly_less(n: int, gpu: float, stage: int, weights: float, grads: float, optimizer: float) -> int | None:
    """'Fits' read as strictly less than the GPU's bytes."""
    whole, sharded = _parts(n, stage, weights, grads, optimizer)
    if whole >= gpu:
        return None
    gpus = 1
    while not whole + sharded / gpus < gpu:
        gpus += 1
    return gpus


NOTEBOOK_FEWEST: Callable[..., int | None] = notebook_functions(NB, ("fewest_gpus",), {"math": math},
                                                                tag="solution")["fewest_gpus"]


def _plus_one(*args: Any) -> int | None:
    answer = NOTEBOOK_FEWEST(*args)
    return None if answer is None else answer + 1


FEWEST_WRONG: list[tuple[str, Callable[..., Any], str, str]] = [
    ("the stub: always 1", lambda *a: 1, "returned 1, but no number of GPUs is enough", "stays whole on every GPU"),
    ("always None", lambda *a: None, "returned None, but 1 GPU is enough", "None is for a job"),
    ("a search capped at 16 GPUs", capped(16),
     "Every case that needs at most 16 GPUs is right, and every one that needs 667 or more returned None",
     "Does your search stop at a largest count?"),
    ("a search capped at 1024 GPUs", capped(1024), "your function gives up somewhere in between",
     "Does your search stop at a largest count?"),
    ("a search that never asks whether a count exists", endless, "did not return within",
     "Find that out before counting"),
    ("stages that shard from the weights (per_parameter[:stage])", sharding(lambda s: set(range(s))),
     "at stage 1 your answers shard the weights and keep the gradients and the optimizer state whole",
     "which states does each ZeRO stage divide"),
    ("stages that shard one state each, not adding up", sharding(lambda s: {3 - s} if s else set()),
     "at stage 2 your answers shard the gradients and keep the weights and the optimizer state whole",
     "Each stage shards one state more"),
    ("stages shifted by one", sharding(lambda s: set(range(max(0, 2 - s), 3))),
     "at stage 0 your answers shard the optimizer state (what stage 1 shards)", "which states does each ZeRO stage"),
    ("every stage shards everything", sharding(lambda s: {0, 1, 2}),
     "at stage 0 your answers shard the weights, the gradients and the optimizer state (what stage 3 shards);",
     "which states does each ZeRO stage"),
    ("the paper's bytes, whatever the call passes", lambda n, g, s, w, gr, o: NOTEBOOK_FEWEST(n, g, s, 2, 2, 12),
     "right for 2 + 2 + 12 bytes per parameter (the ZeRO paper's mixed precision) whatever the call passes",
     "the bytes per parameter are arguments"),
    ("float32's bytes, whatever the call passes", lambda n, g, s, w, gr, o: NOTEBOOK_FEWEST(n, g, s, 4, 4, 8),
     "right for 4 + 4 + 8 bytes per parameter (float32)", "the bytes per parameter are arguments"),
    ("int(x) + 1 for rounding up: wrong on a whole quotient", closed_form(lambda x: int(x) + 1),
     "returned 9, but 8 GPUs are enough: on 8 GPUs each holds exactly 24,000,000,000 bytes", "includes an exact fit"),
    ("'fits' as strictly less", strictly_less, "but 8 GPUs are enough: on 8 GPUs each holds exactly",
     "includes an exact fit"),
    ("rounded down", closed_form(int), "returned 1: on 1 GPU it holds 120.00 GB, more than 80.00 GB",
     "which way must the count be rounded?"),
    ("rounded to the nearest", closed_form(round), "returned 4: on 4 GPUs each holds 41.25 GB, more than 40.00 GB",
     "which way must the count be rounded?"),
    ("None only when the whole part is over the GPU", closed_form(math.ceil, none_when_over=True),
     "raised ZeroDivisionError: float division by zero. At stage 2 the weights stay whole on every GPU: 24.00 GB, "
     "exactly the GPU's bytes", "fills exactly"),
    ("0 GPUs when nothing is sharded", lambda n, g, s, w, gr, o: 0 if s == 0 else NOTEBOOK_FEWEST(n, g, s, w, gr, o),
     "returned 0; a job runs on at least 1 GPU", "how many GPUs does a job need"),
    ("numpy's ceil: a float", closed_form(np.ceil), "returned 2.0, a float", "gives a float"),
    ("one GPU too many", _plus_one, "returned 2, but 1 GPU is enough (on 1 GPU it holds 16.00 GB)",
     "is there a smaller count"),
]


@pytest.mark.parametrize(("answer", "message", "hint"), [w[1:] for w in FEWEST_WRONG], ids=[w[0] for w in FEWEST_WRONG])
def test_fewest_gpus_rejects(answer: Callable[..., Any], message: str, hint: str,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "CALL_SECONDS", 0.2)  # the endless search: fail fast
    rejected(ex.check_fewest_gpus(answer), message, hint)


def count_up_in_floats(n: int, gpu_bytes: float, stage: int, weights: float, grads: float,
                       optimizer: float) -> int | None:
    """Counts up, each GPU's share summed term by term as (weights + grads / N + optimizer / N) * n in floats: a
    last-place unit over the budget where the exact share equals it on 9 GPUs."""
    per = (weights, grads, optimizer)
    whole, sharded = sum(per[:3 - stage]) * n, sum(per[3 - stage:]) * n
    if whole > gpu_bytes or (whole == gpu_bytes and sharded):
        return None
    gpus = 1
    while sum(b / (gpus if i >= 3 - stage else 1) for i, b in enumerate(per)) * n > gpu_bytes:
        gpus += 1
    return gpus


def exact_integers(n: int, gpu_bytes: float, stage: int, weights: float, grads: float,
                   optimizer: float) -> int | None:
    """Whole numbers of bytes and a rounded-up integer division."""
    per = [Fraction(b) for b in (weights, grads, optimizer)]
    whole, sharded = sum(per[:3 - stage]) * n, sum(per[3 - stage:]) * n
    room = Fraction(gpu_bytes) - whole
    if room < 0 or (room == 0 and sharded):
        return None
    return max(1, -(-sharded // room)) if sharded else 1


def doubling_search(n: int, gpu_bytes: float, stage: int, weights: float, grads: float,
                    optimizer: float) -> int | None:
    """Doubles the count until the share fits, then halves the interval: no largest count."""
    per = (weights, grads, optimizer)
    whole, sharded = sum(per[:3 - stage]) * n, sum(per[3 - stage:]) * n
    if whole > gpu_bytes or (whole == gpu_bytes and sharded):
        return None

    def fits(gpus: int) -> bool:
        return whole + sharded / gpus <= gpu_bytes * (1 + 1e-12)

    high = 1
    while not fits(high):
        high *= 2
    low = high // 2  # does not fit (or 0)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    return high


def test_the_float_answer_lands_above_the_tie() -> None:
    # the student run's answer: on 9 GPUs (4 + 4 / 9 + 8 / 9) * 7.5e9 is 40000000000.00001, above 40e9
    assert (4 + 4 / 9 + 8 / 9) * 7_500_000_000 > 40e9 and count_up_in_floats(7_500_000_000, 40e9, 2, 4, 4, 8) == 10
    assert exact_integers(7_500_000_000, 40e9, 2, 4, 4, 8) == doubling_search(7_500_000_000, 40e9, 2, 4, 4, 8) == 9


@pytest.mark.parametrize("answer", [NOTEBOOK_FEWEST, count_up_in_floats, exact_integers, doubling_search],
                         ids=["the notebook's solution", "counting up in floats", "exact integers",
                              "doubling search"])
def test_fewest_gpus_accepts(answer: Callable[..., int | None]) -> None:
    verdict = ex.check_fewest_gpus(answer)
    assert verdict, verdict


def test_every_reading_of_a_stage_is_named() -> None:
    """A function that shards any other set of states at one stage (right at the others) is told which."""
    right = NOTEBOOK_FEWEST
    for stage in range(4):
        for size in range(4):
            for states in map(set, combinations(range(3), size)):
                if states == set(range(3 - stage, 3)):
                    continue
                wrong = sharding(lambda s, st=states, at=stage: st if s == at else set(range(3 - s, 3)))
                verdict = ex.check_fewest_gpus(wrong)
                named = ex._names(frozenset(states))
                assert not verdict and f"at stage {stage} your answers shard {named}" in verdict.message, verdict
    assert ex.check_fewest_gpus(right)


def test_the_cases_reach_their_limits() -> None:
    splits = [ex._right_split(case) for case in ex.FEWEST_CASES]
    wants = [s.fewest() for s in splits]
    assert max(w for w in wants if w is not None) > 1024  # a search capped at 1024 GPUs fails
    assert any(s.whole == s.gpu and s.sharded for s in splits)  # the unsharded part fills a GPU exactly
    ties = {(case[0], case[2], tuple(case[3]), w) for case, s, w in zip(ex.FEWEST_CASES, splits, wants, strict=True)
            if w is not None and s.sharded and s.share(w) == s.gpu}
    assert (7_500_000_000, 2, (4, 4, 8), 9) in ties and (12_000_000_000, 3, (2, 2, 12), 8) in ties
    for s, w in zip(splits, wants, strict=True):
        if w is None or not s.sharded:
            continue
        # the fewest lands exactly on the budget or clearly below it; one GPU fewer is clearly above it
        assert s.share(w) == s.gpu or s.share(w) < s.gpu * (1 - ex.TIE_TOLERANCE)
        assert w == 1 or s.share(w - 1) > s.gpu * (1 + ex.TIE_TOLERANCE)
        assert s.accepted() == ({w, w + 1} if s.share(w) == s.gpu and w & (w - 1) else {w})


def test_every_float_sum_is_exact_on_eight_gpus() -> None:
    """Where the checker accepts only the fewest on a tie (8 GPUs), no order of the float sum rounds."""
    n, gpu, w, g, o = 12_000_000_000, 24e9, 2, 2, 12
    orders = [(w + g + o) / 8 * n, (w + g + o) * n / 8, w * n / 8 + g * n / 8 + o * n / 8, (w / 8 + g / 8 + o / 8) * n]
    assert all(share == gpu for share in orders)
    n, gpu, w, g, o = 7_500_000_000, 40e9, 4, 4, 8  # stage 2 on 9 GPUs: some orders round up, some do not
    assert (w + g / 9 + o / 9) * n > gpu and w * n + (g + o) * n / 9 == gpu


# --- exercise 2: the memory plan ----------------------------------------------------------------------------

NOTEBOOK_PLAN: Callable[..., Any] = notebook_functions(NB, ("plan",), {"plan_memory": plan_memory},
                                                       tag="solution")["plan"]


def reading(precision: str = "bf16", world_size: int | None = None, mixed: str | None = None,
            checkpoint_first: bool = False) -> Callable[..., Any]:
    """The least plan in the exercise's order (or checkpointing first), read with other arguments."""
    def plan(cfg: GPTConfig, w: int, budget: float) -> tuple[int, bool] | None:
        for checkpointed in ((True, False) if checkpoint_first else (False, True)):
            for stage in range(4):
                if plan_memory(cfg, precision, checkpointed, stage, world_size or w,
                               mixed_precision=mixed).fits(budget):
                    return stage, checkpointed
        return None
    return plan


def states_and_activations(cfg: GPTConfig, w: int, budget: float) -> tuple[int, bool] | None:
    for checkpointed in (False, True):
        for stage in range(4):
            if ex.reference_per_rank_bytes(ex.parameter_count(cfg), w, stage) + ex.activation_bytes(
                    cfg, checkpointed) <= budget:
                return stage, checkpointed
    return None


def peak_only(cfg: GPTConfig, w: int, budget: float) -> tuple[int, bool] | None:
    for checkpointed in (False, True):
        for stage in range(4):
            if plan_memory(cfg, "bf16", checkpointed, stage, w).peak <= budget:
                return stage, checkpointed
    return None


def highest_stage(cfg: GPTConfig, w: int, budget: float) -> tuple[int, bool] | None:
    for checkpointed in (False, True):
        fits = [s for s in range(4) if plan_memory(cfg, "bf16", checkpointed, s, w).fits(budget)]
        if fits:
            return max(fits), checkpointed
    return None


def never_checkpoint(cfg: GPTConfig, w: int, budget: float) -> tuple[int, bool] | None:
    return next(((s, False) for s in range(4) if plan_memory(cfg, "bf16", False, s, w).fits(budget)), None)


_PRINTED = {case: NOTEBOOK_PLAN(*case) for case in ex.PLAN_CASES}

PLAN_WRONG: list[tuple[str, Callable[..., Any], str, str]] = [
    ("the stub: (0, False) for every job", lambda *a: (0, False), "returned (0, False) for all 10 jobs",
     "the least plan depends on the job"),
    ("None for every job", lambda *a: None, "returned None for all 10 jobs", "the least plan depends on the job"),
    ("states and saved activations only", states_and_activations,
     "Counting only the states and the saved activations (5.5 GiB) misses", "which tensors exist during one phase"),
    ("the allocated peak only", peak_only, "The allocated peak alone fits in 8 GiB; the rest does not",
     "what does the plan add to its peak"),
    ("checkpointing tried first", reading(checkpoint_first=True),
     "your plan (0, True) checkpoints activations, but a ZeRO stage fits without", "the order is part of the answer"),
    ("the highest stage that fits", highest_stage, "your plan (3, False) fits, but a lower stage fits too",
     "the least plan"),
    ("never checkpointing", never_checkpoint, "you found no plan, but at least one of the eight fits",
     "which plans did your function try"),
    ("float32", reading(precision="fp32"), "your answers are the plans of a job trained in float32",
     "which precision"),
    ("world_size left out", reading(world_size=1), "your answers are the plans for 1 rank, whatever world_size says",
     "how many ranks"),
    ("8 ranks, as most printed jobs have", reading(world_size=8), "the plans for 8 ranks, whatever world_size says",
     "how many ranks"),
    ("autocast at every stage", reading(mixed="autocast"), "your answers are the plans with autocast at every stage",
     "how do the jobs train in bf16 at stages 2 and 3"),
    ("the printed jobs' answers, looked up", lambda *case: _PRINTED[case], "a job the notebook did not print, your "
     "function raised KeyError", "any job from its arguments"),
    ("the printed jobs' answers, else None", lambda *case: _PRINTED.get(case),
     "your function is right for the 7 printed jobs, but not for one it was not shown", "None is for a job"),
    ("a list", lambda *case: list(NOTEBOOK_PLAN(*case) or ()) or None, "returned [0, False]; expected",
     "the answer is a plan"),
]


@pytest.mark.parametrize(("answer", "message", "hint"), [w[1:] for w in PLAN_WRONG], ids=[w[0] for w in PLAN_WRONG])
def test_memory_plan_rejects(answer: Callable[..., Any], message: str, hint: str) -> None:
    rejected(ex.check_memory_plan(answer), message, hint)


def ordered_pairs(cfg: GPTConfig, world_size: int, budget_bytes: float) -> tuple[int, bool] | None:
    """The eight plans in one list, the need compared by hand."""
    order = [(stage, checkpointed) for checkpointed, stage in product((False, True), range(4))]
    return next((p for p in order if plan_memory(cfg, "bf16", p[1], p[0], world_size).total <= budget_bytes), None)


def least_by_key(cfg: GPTConfig, world_size: int, budget_bytes: float) -> tuple[int, bool] | None:
    """Every plan that fits, then the least by (checkpointed, stage); the need from the peak, margin, context."""
    def need(stage: int, checkpointed: bool) -> float:
        plan = plan_memory(cfg, "bf16", checkpointed, stage, world_size)
        return plan.peak * (1 + plan.margin) + plan.context
    fitting = [(c, s) for c in (False, True) for s in range(4) if need(s, c) <= budget_bytes]
    return (min(fitting)[1], min(fitting)[0]) if fitting else None


@pytest.mark.parametrize("answer", [NOTEBOOK_PLAN, ordered_pairs, least_by_key],
                         ids=["the notebook's solution", "ordered pairs", "least by key"])
def test_memory_plan_accepts(answer: Callable[..., Any]) -> None:
    verdict = ex.check_memory_plan(answer)
    assert verdict, verdict


def test_no_job_sits_on_its_budget() -> None:
    """The docstring's promise: no plan's need within 0.8% of its budget, so no float tie decides a plan."""
    for cfg, w, budget in ex.PLAN_CASES + ex._UNPRINTED_PLAN_CASES:
        for checkpointed, stage in product((False, True), range(4)):
            assert abs(plan_memory(cfg, "bf16", checkpointed, stage, w).total / budget - 1) > 0.008


def test_the_unprinted_jobs_have_other_answers() -> None:
    printed = {ex._reference_plan(*case) for case in ex.PLAN_CASES}
    assert all(ex._reference_plan(*case) not in printed for case in ex._UNPRINTED_PLAN_CASES)


# --- exercise 3: resume in one process ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def resumable(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A DCP folder of {"model", "optim"} after 3 of the job's 5 steps (one process, the job's batches), and the
    weights after all 5."""
    folder = tmp_path_factory.mktemp("dcp") / "step-3"
    torch.manual_seed(0)
    model = GPT(SMALL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for step in range(1, 6):
        model.loss(token_batch(SMALL, g)).backward()
        opt.step()
        opt.zero_grad()
        if step == 3:
            model_state, optim_state = get_state_dict(model, opt)
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder))
    return folder, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _notebook_resume() -> Callable[..., Any]:
    names = {"GPT": GPT, "SMALL": SMALL, "dcp": dcp, "get_state_dict": get_state_dict, "set_state_dict": set_state_dict}
    return notebook_functions(NB, ("resume_on_one_process",), {"torch": torch, **names},
                              tag="solution")["resume_on_one_process"]


def _fresh() -> tuple[GPT, torch.optim.Optimizer]:
    model = GPT(SMALL)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def loaded_in_place(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    """get_state_dict's tensors are the model's and the optimizer's own: dcp.load fills them, no set needed."""
    model, opt = _fresh()
    model_state, optim_state = get_state_dict(model, opt)
    dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=folder)
    return model, opt


def one_by_one(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    model, opt = _fresh()
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.load(state, checkpoint_id=folder)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, opt, state["optim"])
    return model, opt


def converted_elsewhere(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    """One torch.save file, written to a temporary folder, then set_state_dict."""
    with tempfile.TemporaryDirectory() as scratch:
        dcp_to_torch_save(folder, Path(scratch) / "full.pt")
        state = torch.load(Path(scratch) / "full.pt", weights_only=False)
    model, opt = _fresh()
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return model, opt


class _Model:  # PyTorch's DCP recipe: Stateful objects that dcp.load calls
    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        self.model, self.opt = model, opt

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state)


class _Optim(_Model):
    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model, self.opt)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.opt, state)


def stateful(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    model, opt = _fresh()
    dcp.load({"model": _Model(model, opt), "optim": _Optim(model, opt)}, checkpoint_id=folder)
    return model, opt


@pytest.mark.parametrize("answer", [_notebook_resume(), loaded_in_place, one_by_one, converted_elsewhere, stateful],
                         ids=["the notebook's solution", "loaded in place", "one by one", "converted elsewhere",
                              "stateful"])
def test_resume_accepts(answer: Callable[..., Any], resumable: tuple[Path, dict[str, torch.Tensor]]) -> None:
    folder, expected = resumable
    verdict = ex.check_resume_on_one_process(answer, folder, expected)
    assert verdict, verdict


def weights_only(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    model, opt = _fresh()
    dcp.load({"model": model.state_dict()}, checkpoint_id=folder)
    return model, opt


def plain_state_dicts(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A fresh AdamW's own state_dict(): no state for dcp.load to fill."""
    model, opt = _fresh()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.load(state, checkpoint_id=folder)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    return model, opt


def flat(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    model, opt = _fresh()
    dcp.load(model.state_dict(), checkpoint_id=folder)  # without the checkpoint's "model" level
    return model, opt


def optimizer_never_loaded(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Loads the model's key only; the optimizer keeps the state get_state_dict made for it."""
    model, opt = _fresh()
    model_state, optim_state = get_state_dict(model, opt)
    dcp.load({"model": model_state}, checkpoint_id=folder)
    set_state_dict(model, opt, model_state_dict=model_state, optim_state_dict=optim_state)
    return model, opt


def other_optimizer(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    model, _ = one_by_one(folder)
    return model, torch.optim.AdamW(GPT(SMALL).parameters(), lr=1e-3)


def stepped(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    """One training step 'to check that it works' before returning."""
    model, opt = one_by_one(folder)
    model.loss(token_batch(SMALL, torch.Generator().manual_seed(7))).backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def drifted(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    model, opt = one_by_one(folder)
    with torch.no_grad():
        model.head.weight.add_(0.01)
    return model, opt


def sgd(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = GPT(SMALL)
    dcp.load({"model": get_model_state_dict(model)}, checkpoint_id=folder)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def wider(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = GPT(GPTConfig(vocab=256, seq_len=64, d_model=128, n_heads=4, n_layers=2, batch=16))
    dcp.load({"model": get_model_state_dict(model)}, checkpoint_id=folder)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def with_a_process_group(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    return one_by_one(folder)


def converted_into_the_checkpoint(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Writes its torch.save file into the checkpoint's folder: the input changed in place."""
    dcp_to_torch_save(folder, Path(folder) / "full.pt")
    state = torch.load(Path(folder) / "full.pt", weights_only=False)
    model, opt = _fresh()
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return model, opt


RESUME_WRONG: list[tuple[str, Callable[..., Any], str, str]] = [
    ("torch.load on the folder", torch.load, "raised IsADirectoryError", "which library reads it back?"),
    ("the stub: a fresh model and AdamW", lambda folder: _fresh(), "no state for 30 of 30 parameters",
     "a resume needs everything the next step depends on"),
    ("the weights only", weights_only, "no state for 30 of 30 parameters", "AdamW's moments and step count"),
    ("a fresh AdamW's own state_dict()", plain_state_dicts, "no state for 30 of 30 parameters",
     "AdamW's moments and step count"),
    ("without the checkpoint's keys", flat, "Missing key", "the job saved {'model': ..., 'optim': ...}"),
    ("the optimizer's key never loaded", optimizer_never_loaded,
     "step counts are [1], not 3: its state was made in this process", "did your function load it"),
    ("a new optimizer after loading", other_optimizer, "does not update the parameters of the model you returned",
     "which model's parameters did yours get?"),
    ("a step before returning", stepped, "step counts are [4], not 3: something stepped it after",
     "a resume continues from the saved step"),
    ("weights changed after loading", drifted, "away from the run that never stopped",
     "nothing may change them between the load and the return"),
    ("SGD", sgd, "your optimizer is SGD, not AdamW", "the job trained with AdamW"),
    ("a wider model", wider, "Size mismatch", "is the model you load into the job's?"),
    ("a process group", with_a_process_group, "your function started a process group", "one process needs none"),
]


@pytest.mark.parametrize(("answer", "message", "hint"), [w[1:] for w in RESUME_WRONG],
                         ids=[w[0] for w in RESUME_WRONG])
def test_resume_rejects(answer: Callable[..., Any], message: str, hint: str,
                        resumable: tuple[Path, dict[str, torch.Tensor]]) -> None:
    folder, expected = resumable
    try:
        rejected(ex.check_resume_on_one_process(answer, folder, expected), message, hint)
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def test_resume_rejects_a_changed_checkpoint(resumable: tuple[Path, dict[str, torch.Tensor]],
                                             tmp_path: Path) -> None:
    folder, expected = resumable
    copy = tmp_path / "step-3"
    shutil.copytree(folder, copy)
    rejected(ex.check_resume_on_one_process(converted_into_the_checkpoint, copy, expected),
             "your function changed the checkpoint's folder (full.pt)", "what in your function writes there?")


@pytest.mark.parametrize(("answer", "message", "hint"), [
    (lambda folder: one_by_one(folder)[::-1], "returned (optimizer, model); expected (model, optimizer)",
     "the checker unpacks"),
    (lambda folder: one_by_one(folder)[0], "returned GPT; expected (model, optimizer)", "return both"),
], ids=["(optimizer, model)", "the model alone"])
def test_resume_rejects_the_wrong_shape_of_answer(answer: Callable[..., Any], message: str, hint: str,
                                                  resumable: tuple[Path, dict[str, torch.Tensor]]) -> None:
    folder, expected = resumable
    rejected(ex.check_resume_on_one_process(answer, folder, expected), message, hint, closer=False)
SHAPES = (
    GPTConfig(),
    GPTConfig(vocab=50, seq_len=12, d_model=24, n_heads=3, n_layers=3, batch=5),
    GPTConfig(vocab=256, seq_len=128, d_model=128, n_heads=4, n_layers=4, batch=8),  # the notebook's MID
    GPTConfig(vocab=50_304, seq_len=2048, d_model=4096, n_heads=32, n_layers=32, batch=8),
)


# ============================================ the notebook's own functions, the reference memory model
# --- the notebook's own functions ----------------------------------------------------------------------------

def _section_one() -> dict[str, Callable[..., Any]]:
    """parameter_count and activation_bytes as section 1's cell defines them."""
    return notebook_functions(NB, ("parameter_count", "activation_bytes"))


def _solution(name: str, **names: Any) -> Callable[..., Any]:
    """The function ``name`` of the notebook's solution cell; ``names``: what it uses from other cells."""
    return notebook_functions(NB, (name,), {"torch": torch, **names}, tag="solution")[name]


def test_notebook_formulas_equal_the_checkers() -> None:
    nb = _section_one()
    for cfg in SHAPES:
        assert nb["parameter_count"](cfg) == ex.parameter_count(cfg), cfg
        assert nb["activation_bytes"](cfg) == ex.activation_bytes(cfg), cfg
        assert nb["activation_bytes"](cfg, checkpointed=True) == ex.activation_bytes(cfg, checkpointed=True), cfg
        assert nb["activation_bytes"](cfg, True) < nb["activation_bytes"](cfg)  # the flag is not ignored


# --- the reference memory model ----------------------------------------------------------------------------

def test_reference_per_rank_bytes_by_hand() -> None:
    # 100 parameters on 4 ranks: 400 B of weights, 400 B of gradients, 800 B of AdamW moments
    assert ex.reference_per_rank_bytes(100, 4, 0) == 1600  # nothing sharded
    assert ex.reference_per_rank_bytes(100, 4, 1) == 400 + 400 + 200  # the moments
    assert ex.reference_per_rank_bytes(100, 4, 2) == 400 + 100 + 200  # and the gradients
    assert ex.reference_per_rank_bytes(100, 4, 3) == 100 + 100 + 200  # and the weights
    assert ex.reference_per_rank_bytes(100, 1, 3) == 1600  # one rank holds everything at any stage


@pytest.mark.parametrize("cfg", SHAPES[:3], ids=["default", "tiny", "mid"])
def test_parameter_count_equals_a_real_gpt(cfg: GPTConfig) -> None:
    assert ex.parameter_count(cfg) == sum(p.numel() for p in GPT(cfg).parameters())


def _checkpointed_loss(model: GPT, tokens: torch.Tensor) -> torch.Tensor:
    """GPT.loss with each block checkpointed: it keeps its input and recomputes the rest in backward."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    x = model.tok(inputs) + model.pos(torch.arange(inputs.shape[1]))
    for block in model.blocks:
        x = checkpoint(block, x, use_reentrant=False)
    logits = model.head(model.norm(x))
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@pytest.mark.parametrize("cfg", SHAPES[1:3], ids=["tiny", "mid"])
def test_activation_bytes_equal_what_autograd_saves(cfg: GPTConfig) -> None:
    torch.manual_seed(0)
    model = GPT(cfg)
    tokens = token_batch(cfg, torch.Generator().manual_seed(0))
    _, plain = saved_tensor_bytes(lambda: model.loss(tokens), exclude=model)
    _, checkpointed = saved_tensor_bytes(lambda: _checkpointed_loss(model, tokens), exclude=model)
    assert ex.activation_bytes(cfg) == plain
    assert ex.activation_bytes(cfg, checkpointed=True) == checkpointed < plain


# --- 1. the fewest GPUs -----------------------------------------------------------------------------------

def test_fewest_gpus_reference_by_hand() -> None:
    # the ZeRO paper's 7.5 B parameters (2 + 2 + 12 bytes) on GPUs of 32 GB
    assert ex.reference_fewest_gpus(7_500_000_000, 32e9, 0) is None  # 120 GB whole on every GPU
    assert ex.reference_fewest_gpus(7_500_000_000, 32e9, 1) == 45  # 30 GB whole, then 90 GB / 45 = 2 GB
    assert ex.reference_fewest_gpus(7_500_000_000, 32e9, 2) == 7  # 15 GB whole, 105 GB / 7 = 15 GB
    assert ex.reference_fewest_gpus(7_500_000_000, 32e9, 3) == 4  # 120 GB / 4 = 30 GB
    assert ex.reference_fewest_gpus(1000, 16_000, 0, 4, 4, 8) == 1  # exactly full fits
    assert ex.reference_fewest_gpus(1000, 8_000, 1, 4, 4, 8) is None  # the whole part fills it exactly


def test_fewest_gpus_checker() -> None:
    solution = _solution("fewest_gpus", math=math)
    assert ex.check_fewest_gpus(solution)
    cases = [
        (lambda n, g, s, w, gr, o: 1, "no number of GPUs is enough"),
        (lambda n, g, s, w, gr, o: ex.reference_fewest_gpus(n, g, s), "whatever the call passes"),
        (lambda n, g, s, w, gr, o: (solution(n, g, s, w, gr, o) or 0) + 1 or None, "returned 2, but 1 GPU is enough"),
        (lambda n, g, s, w, gr, o: None, "returned None, but"),
        (lambda n, g, s, w, gr, o: 1.5, "expected a whole number of GPUs"),
        (lambda n, g, s, w, gr, o: n // 0, "raised ZeroDivisionError"),
    ]
    for fn, expected in cases:
        verdict = ex.check_fewest_gpus(fn)
        assert not verdict and expected in verdict.message + verdict.hint, (expected, verdict)


# --- 2. the memory plan -------------------------------------------------------------------------------------

def _solution_plan() -> Callable[..., Any]:
    return _solution("plan", plan_memory=plan_memory)


def test_memory_plan_checker_accepts_the_solution() -> None:
    solution = _solution_plan()
    assert ex.check_memory_plan(solution)
    answers = [solution(*case) for case in ex.PLAN_CASES]
    assert None in answers and any(a and a[1] for a in answers) and any(a and not a[1] for a in answers)


def test_memory_plan_checker_names_each_mistake() -> None:
    solution = _solution_plan()
    mistakes: list[tuple[Callable[..., Any], str]] = [
        (states_and_activations, "Counting only the states and the saved activations"),
        (peak_only, "The allocated peak alone fits"),
        (lambda cfg, w, budget: next(((s, True) for s in range(4) if plan_memory(cfg, "bf16", True, s, w).fits(budget)),
                                     None), "checkpoints activations, but a ZeRO stage fits without"),
        (highest_stage, "a lower stage fits too"),
        (lambda cfg, w, budget: solution(cfg, w, budget) or (3, True), "GiB per GPU: its largest phase"),
        (lambda cfg, w, budget: None, "returned None for all 10 jobs"),
        (lambda cfg, w, budget: (solution(cfg, w, budget) or (1, True)) if w > 4 else None, "you found no plan, but"),
        (lambda cfg, w, budget: list(solution(cfg, w, budget) or ()) or None, "returned [0, False]; expected"),
        (lambda cfg, w, budget: (5, False), "returned (5, False); expected (stage, checkpointed)"),
        (lambda cfg, w, budget: (0, 0), "returned (0, 0); expected"),
        (lambda cfg, w, budget: (True, False), "returned (True, False); expected"),
        (lambda cfg, w, budget: cfg.layers, "raised AttributeError"),
    ]
    for plan, expected in mistakes:
        verdict = ex.check_memory_plan(plan)
        assert not verdict and expected in verdict.message, (expected, verdict)


def _resume_solution() -> Callable[..., Any]:
    return _solution("resume_on_one_process", GPT=GPT, SMALL=SMALL, dcp=dcp, get_state_dict=get_state_dict,
                     set_state_dict=set_state_dict)


def test_resume_checker_accepts_the_solution(resumable: tuple[Path, dict[str, torch.Tensor]]) -> None:
    folder, expected = resumable
    verdict = ex.check_resume_on_one_process(_resume_solution(), folder, expected)
    assert verdict and "1 shard file(s)" in verdict.message


def test_resume_checker_names_each_mistake(resumable: tuple[Path, dict[str, torch.Tensor]]) -> None:
    folder, expected = resumable
    solution = _resume_solution()

    def step_count_bumped(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
        model, opt = solution(folder)
        for state in opt.state.values():
            state["step"] += 1
        return model, opt

    mistakes: list[tuple[Callable[..., Any], str]] = [
        (torch.load, "raised IsADirectoryError"),
        (weights_only, "no state for 30 of 30 parameters"),  # the catalogue's wrong answers, above
        (other_optimizer, "does not update the parameters"),
        (flat, "Missing key"),
        (step_count_bumped, "step counts are [4], not 3"),
        (drifted, "away from the run that never stopped"),
        (lambda folder: solution(folder)[0], "expected (model, optimizer)"),
    ]
    for fn, expected_message in mistakes:
        verdict = ex.check_resume_on_one_process(fn, folder, expected)
        assert not verdict and expected_message in verdict.message, (expected_message, verdict)


@pytest.mark.parametrize(("check", "call"), [
    (ex.check_fewest_gpus, "check_fewest_gpus(fewest_gpus)"),
    (ex.check_memory_plan, "check_memory_plan(plan)"),
    (lambda fn: ex.check_resume_on_one_process(fn, "no-folder", {}),
     "check_resume_on_one_process(resume_on_one_process, folder, expected)"),
], ids=["fewest_gpus", "memory_plan", "resume_on_one_process"])
def test_checkers_ask_for_the_function_itself(check: Callable[[Any], Verdict], call: str) -> None:
    verdict = check((0, False))
    assert not verdict and "expected your function, got tuple" in verdict.message and call in verdict.hint
