"""Notebook 11's exercises: a catalogue of answers, as a class would write them, through the checkers
(course_utils.exercises.model_parallel); and the properties of the cases the checkers rely on.

For each checker: plausible wrong answers, each rejected with a message that names its mistake (what the plan
did on the ranks, which part of a prediction is off, which case and why), a hint that names the concept, and a
closer hint held back for ``%hint``; neither hint holds a line of the notebook's solution. Right answers written
otherwise than the notebook's solution are accepted. The notebook's own stubs and solutions come from its cells.

Starting processes costs seconds on a small machine, so this module starts them twice: every plan of exercise 1
is graded in one launch of 2 ranks (`_grade_plans`), and exercise 2's counts are measured once per process
(`measured_collectives`) and shared by all its answers.
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from answers_helpers import rejected_holding_back, solution_lines, solution_value
from conftest import ROOT, notebook_functions
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from course_utils.distributed import launch as launching
from course_utils.exercises import Verdict
from course_utils.exercises import model_parallel as ex
from course_utils.memory.layout_plan import Layout, activation_bytes_per_gpu, state_bytes_per_gpu
from course_utils.models import GPTConfig

NB = "11_model_parallel"

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _cells(tagged: bool) -> list[str]:
    """The sources of the notebook's code cells with (``tagged``) or without the ``solution`` tag."""
    nb = json.loads((ROOT / "notebooks" / f"{NB}.ipynb").read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"]
            if c["cell_type"] == "code" and ("solution" in c["metadata"].get("tags", [])) == tagged]


def _exercise_cell(check: str, solution: bool) -> str:
    """The source of the cell that calls ``check`` (the stub's, or the hidden solution's), without that call."""
    source = next(s for s in _cells(solution) if f"{check}(" in s)
    return "\n".join(line for line in source.splitlines() if not line.startswith(check))


SOLUTION_LINES = solution_lines(NB)


rejected = functools.partial(rejected_holding_back, solution_lines=SOLUTION_LINES)


def test_the_solution_lines_are_read() -> None:
    assert any("RowwiseParallel()" in line for line in SOLUTION_LINES)
    assert any("all_gather_into_tensor" in line for line in SOLUTION_LINES)
    assert any("min(m, p)" in line for line in SOLUTION_LINES)
    assert any("state + acts <= gpu_bytes" in line for line in SOLUTION_LINES)


# --- exercise 1: a tensor-parallel plan for a SwiGLU MLP ------------------------------------------------------

C, R = ColwiseParallel, RowwiseParallel
SHARED_STYLE = C()

WRONG_PLANS: dict[str, tuple[dict[str, Any], str, str]] = {
    # what each does on 2 ranks (torch 2.13): a shape error in forward, unless said otherwise
    "gate row-wise": ({"gate": R(), "up": C(), "down": R()}, "gate is row-wise", "a nonlinearity needs the whole"),
    "up row-wise": ({"gate": C(), "up": R(), "down": R()}, "up is row-wise",
                    "an elementwise product needs both factors split alike"),
    "all three row-wise": ({"gate": R(), "up": R(), "down": R()}, "silu(a + b) ≠ silu(a) + silu(b)",
                           "a nonlinearity needs the whole"),
    "roles swapped": ({"gate": R(), "up": R(), "down": C()}, "gate is row-wise", "a nonlinearity"),
    "all three column-wise": ({"gate": C(), "up": C(), "down": C()},
                              "down is column-wise: a column-wise layer needs its whole input",
                              "which split of a linear layer takes a shard of its input features"),
    "down left out": ({"gate": C(), "up": C()}, "down has no entry in your plan",
                      "parallelize_module changes only the modules its plan names"),
    "gate left out": ({"up": C(), "down": R()}, "gate has no entry in your plan", "a layer left out"),
    "gate and up left out": ({"down": R()}, "gate and up have no entry in your plan", "a layer left out"),
    "SequenceParallel on gate": ({"gate": SequenceParallel(), "up": C(), "down": R()},
                                 "gate is given SequenceParallel", "section 2's pairing"),
    # right values, more collectives: each row-wise layer all-reduces its output (3 all-reduces in forward)
    "row-wise with replicated inputs": (
        {"gate": R(input_layouts=Replicate()), "up": R(input_layouts=Replicate()),
         "down": R(input_layouts=Replicate())},
        "forward runs 3 all_reduce, where one all-reduce is enough: row-wise gate and up leave partial sums",
        "which split lets the SiLU and the product run"),
    # right values, 2 all-gathers in forward: down gathers its input, then its output
    "down column-wise, gathering": (
        {"gate": C(), "up": C(), "down": C(input_layouts=Shard(-1), output_layouts=Replicate())},
        "forward runs 2 all_gather_into_tensor, where one all-reduce is enough: a column-wise down",
        "which split lets the SiLU"),
    # runs, each rank left with 32 of the 64 output features (2 all-gathers before)
    "hidden features gathered, down column-wise": (
        {"gate": C(output_layouts=Replicate()), "up": C(output_layouts=Replicate()), "down": C()},
        "each rank is left with 32 of the 64 output features (its forward ran 2 all_gather_into_tensor)",
        "the MLP's output goes into the residual stream"),
    # right values, down whole on every rank (2 all-gathers feed it)
    "hidden features gathered, down left out": (
        {"gate": C(output_layouts=Replicate()), "up": C(output_layouts=Replicate())},
        "the values are right, but down stays whole on every rank", "saves memory and work only in the layers"),
    "down only re-laid out": (
        {"gate": C(), "up": C(),
         "down": PrepareModuleInput(input_layouts=Shard(-1), desired_input_layouts=Replicate(),
                                    use_local_output=True)},
        "down stays whole on every rank", "saves memory and work only"),
    # runs, each rank left with 4 of the 8 positions (a reduce-scatter)
    "down's output split along the sequence": (
        {"gate": C(), "up": C(), "down": R(output_layouts=Shard(1))},
        "each rank is left with 4 of the 8 positions of the sequence (its forward ran 1 reduce_scatter_tensor)",
        "sequence parallelism's (section 3)"),
}

RIGHT_PLANS: dict[str, dict[str, Any]] = {
    "output kept a replicated DTensor": {"gate": C(), "up": C(), "down": R(use_local_output=False)},
    "layouts spelled out": {"gate": C(input_layouts=Replicate(), output_layouts=Shard(-1)),
                            "up": C(input_layouts=Replicate(), output_layouts=Shard(-1)),
                            "down": R(input_layouts=Shard(-1), output_layouts=Replicate())},
    "one style object for gate and up": {"gate": SHARED_STYLE, "up": SHARED_STYLE, "down": R()},
}


@pytest.fixture(scope="module")
def notebook_plan() -> dict[str, Any]:
    # the solution cell uses the stub cell's imports, as it does in the notebook
    return solution_value(NB, "plan", {"ColwiseParallel": ColwiseParallel, "RowwiseParallel": RowwiseParallel})


@pytest.fixture(scope="module")
def graded_plans(notebook_plan: dict[str, Any]) -> dict[str, Verdict]:
    """Every catalogued plan and the notebook's solution, graded together: one launch of 2 ranks."""
    plans = {"the notebook's solution": notebook_plan, **{n: p for n, (p, _, _) in WRONG_PLANS.items()},
             **RIGHT_PLANS}
    return dict(zip(plans, ex._grade_plans(list(plans.values())), strict=True))


@pytest.mark.parametrize("name", WRONG_PLANS)
def test_swiglu_plan_wrong_answers(graded_plans: dict[str, Verdict], name: str) -> None:
    _, message, hint = WRONG_PLANS[name]
    rejected(graded_plans[name], message, hint)


@pytest.mark.parametrize("name", ["the notebook's solution", *RIGHT_PLANS])
def test_swiglu_plan_right_answers(graded_plans: dict[str, Verdict], name: str) -> None:
    verdict = graded_plans[name]
    assert verdict, verdict
    assert "the forward runs one all-reduce (backward: 2 all_reduce" in verdict.message


def _no_launch(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("this answer must be judged without starting processes")


def test_swiglu_plan_the_notebooks_stub_is_judged_without_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launching, "launch", _no_launch)
    namespace: dict[str, Any] = {}
    exec(_exercise_cell("check_swiglu_plan", solution=False).replace("print(SwiGLU())", ""), namespace)
    assert namespace["plan"] == {}
    rejected(ex.check_swiglu_plan(namespace["plan"]), "your plan is empty", "a plan names each layer to split")


class _MyColwise(ColwiseParallel):
    """A style defined outside PyTorch, as a notebook cell would define it."""


@pytest.mark.parametrize(("plan", "message", "hint"), [
    ([("gate", C())], "expected a dict {module name: ParallelStyle}, got list", "parallelize_module takes a plan"),
    ({0: C()}, "is a int; keys are module names", "finds each module by its name"),
    ({"gate": ColwiseParallel, "up": C(), "down": R()}, "is the class ColwiseParallel, not a style made from it",
     "a plan holds ParallelStyle objects"),
    ({"gate": "colwise", "up": C(), "down": R()}, "is str 'colwise', not a ParallelStyle", "each value says how"),
    ({"mlp.gate": C(), "up": C(), "down": R()}, "no module of SwiGLU is named 'mlp.gate'", "print(SwiGLU())"),
    ({"gate": _MyColwise(), "up": C(), "down": R()}, "a _MyColwise defined outside PyTorch",
     "cannot import a class defined in a notebook cell"),
])
def test_swiglu_plan_malformed_plans_are_judged_without_processes(
        monkeypatch: pytest.MonkeyPatch, plan: Any, message: str, hint: str) -> None:
    monkeypatch.setattr(launching, "launch", _no_launch)
    rejected(ex.check_swiglu_plan(plan), message, hint)


def test_swiglu_is_the_llama_mlp() -> None:
    torch.manual_seed(0)
    mlp = ex.SwiGLU()
    x = torch.randn(2, 3, ex.SWIGLU_SHAPE[0])
    want = F.linear(F.silu(F.linear(x, mlp.gate.weight)) * F.linear(x, mlp.up.weight), mlp.down.weight)
    assert torch.allclose(mlp(x), want)
    assert [name for name, _ in mlp.named_children()] == ["gate", "up", "down"]
    assert all(m.bias is None for m in mlp.children())  # type: ignore[union-attr]


# --- exercise 2: predict the collectives ------------------------------------------------------------------

def _solution(n: int, sp: bool, lp: bool) -> dict[str, dict[str, int]]:
    return NOTEBOOK_COLLECTIVES(n, sp, lp)  # type: ignore[no-any-return]


NOTEBOOK_COLLECTIVES: Callable[..., Any] = notebook_functions(NB, ("collectives",), tag="solution")["collectives"]


def _changed(change: Callable[[int, bool, bool, dict[str, dict[str, int]]], None]) -> Callable[..., Any]:
    """The notebook's answer, changed in place by ``change(n, sp, lp, answer)``."""
    def collectives(n: int, sp: bool, lp: bool) -> dict[str, dict[str, int]]:
        answer = _solution(n, sp, lp)
        change(n, sp, lp, answer)
        return answer
    return collectives


def _blocks_only(n: int, sp: bool, lp: bool) -> dict[str, dict[str, int]]:
    per = {"all_gather_into_tensor": 2 * n, "reduce_scatter_tensor": 2 * n} if sp else {"all_reduce": 2 * n}
    return {"forward": dict(per), "backward": dict(per)}


def _swapped(n: int, sp: bool, lp: bool) -> dict[str, dict[str, int]]:
    right = _solution(n, sp, lp)
    return {"forward": right["backward"], "backward": right["forward"]}


def _lp_all_reduce_with_sp(n: int, sp: bool, lp: bool, a: dict[str, dict[str, int]]) -> None:
    if sp and lp:  # the head's input gradient all-reduced, as without sequence parallelism
        a["backward"]["reduce_scatter_tensor"] -= 1
        a["backward"]["all_reduce"] = 1


def _add(direction: str, name: str, k: int, when: Callable[[bool, bool], bool]) -> Callable[..., None]:
    def change(n: int, sp: bool, lp: bool, a: dict[str, dict[str, int]]) -> None:
        if when(sp, lp):
            a[direction][name] = a[direction].get(name, 0) + k
    return change


def _four_per_block(n: int, sp: bool, lp: bool, a: dict[str, dict[str, int]]) -> None:
    for counts in a.values():  # forward and backward counted together
        for name in list(counts):
            if name != "all_reduce" or not sp:
                counts[name] += 2 * n


def _raises(n: int, sp: bool, lp: bool) -> Any:
    return {"forward": {"all_reduce": 2 * n}, "backward": {"all_reduce": 2 * n + lp["head"]}}  # type: ignore[index]


WRONG_COLLECTIVES: dict[str, tuple[Callable[..., Any], str, str]] = {
    "the notebook's stub": (lambda n, sp, lp: {"forward": {}, "backward": {}},
                            "each block adds no collective in your answers; that is too few all_reduce per block",
                            "section 2 counted one block"),
    "the blocks only": (_blocks_only, "with tensor parallelism and loss parallel, forward: what each block runs is "
                        "right, but outside the blocks your answers have no collective: too few all_reduce there",
                        "loss parallel (section 3)"),
    "sequence parallelism ignored": (lambda n, sp, lp: _solution(n, False, lp),
                                     "with sequence parallelism, forward: your blocks still all-reduce",
                                     "section 3: with sequence parallelism each all-reduce"),
    "forward and backward swapped": (_swapped, "your forward and backward counts are swapped",
                                     "which collectives run while the loss is computed"),
    "the loss-parallel head's gradient all-reduced with SP too": (
        _changed(_lp_all_reduce_with_sp),
        "too many all_reduce and too few reduce_scatter_tensor there", "which single collective sums and cuts"),
    "block 0's cut free in backward too": (
        _changed(_add("backward", "all_gather_into_tensor", -1, lambda sp, lp: sp)),
        "with sequence parallelism, backward: what each block runs is right, but outside the blocks your answers "
        "have no collective: too few all_gather_into_tensor there", "which placement does the gradient have"),
    "the replicated head's gradient reduce-scattered": (
        _changed(_add("backward", "reduce_scatter_tensor", 1, lambda sp, lp: sp and not lp)),
        "too many reduce_scatter_tensor there", "of the gather before the replicated head"),
    "the head's input not gathered": (
        _changed(_add("forward", "all_gather_into_tensor", -1, lambda sp, lp: sp)),
        "with sequence parallelism, forward: what each block runs is right, but outside the blocks your answers "
        "have no collective: too few all_gather_into_tensor there", "a collective runs where a tensor changes"),
    "one all-reduce for the loss": (_changed(_add("forward", "all_reduce", -2, lambda sp, lp: lp)),
                                    "outside the blocks your answers have 1 all_reduce: too few all_reduce there",
                                    "the cross-entropy computed from the vocabulary shards"),
    "a loss-parallel all-reduce in backward too": (
        _changed(_add("backward", "all_reduce", 3, lambda sp, lp: lp and not sp)),
        "with tensor parallelism and loss parallel, backward", "what is the gradient of its (replicated) input"),
    "forward and backward counted together per block": (
        _changed(_four_per_block), "each block adds 4 all_reduce in your answers; that is too many all_reduce",
        "section 2 counted one block"),
    "counts that double with each block": (lambda n, sp, lp: {"forward": {"all_reduce": 2**n}, "backward": {}},
                                           "differ by a count that is not the same for every block",
                                           "every block is the same layers"),
    "the names of the collectives shortened": (
        lambda n, sp, lp: {"forward": {"all_gather": 2 * n}, "backward": {}},
        "counts 'all_gather', which is not a collective that CommDebugMode reports here",
        "use the names sections 2 and 3 print"),
    "a pair instead of a dict": (lambda n, sp, lp: ({"all_reduce": 2 * n}, {"all_reduce": 2 * n}),
                                 "returned tuple; expected", "count each on its own"),
    "floats": (lambda n, sp, lp: {"forward": {"all_reduce": 2.0 * n}, "backward": {}},
               "a count is a whole number", "each entry counts"),
    "a function that raises": (_raises, "raised TypeError", "your function gets the number of blocks"),
}


def _by_table(n: int, sp: bool, lp: bool) -> dict[str, Counter[str]]:
    """A right answer written otherwise: each boundary's placement change looked up in a table."""
    collective = {("Shard", "Replicate"): "all_gather_into_tensor", ("Partial", "Replicate"): "all_reduce",
                  ("Partial", "Shard"): "reduce_scatter_tensor", ("Replicate", "Shard"): None}
    per_block_fwd = ["all_gather_into_tensor", "reduce_scatter_tensor"] * 2 if sp else ["all_reduce"] * 2
    forward: Counter[str] = Counter(per_block_fwd * n)
    backward: Counter[str] = Counter(per_block_fwd * n)
    changes_fwd, changes_bwd = [], []
    if sp:
        changes_fwd += [("Replicate", "Shard"), ("Shard", "Replicate")]  # block 0's cut, the head's gather
        changes_bwd += [("Shard", "Replicate"), ("Partial" if lp else "Replicate", "Shard")]
    elif lp:
        changes_bwd.append(("Partial", "Replicate"))
    for counts, changes in ((forward, changes_fwd), (backward, changes_bwd)):
        for change in changes:
            name = collective[change]
            if name is not None:  # a slice runs no collective
                counts[name] += 1
    if lp:
        forward["all_reduce"] += 3
    return {"forward": forward, "backward": backward}


def _with_zeros(n: int, sp: bool, lp: bool) -> dict[str, dict[str, int]]:
    answer = _solution(n, sp, lp)
    for counts in answer.values():
        for name in ex.COLLECTIVES:
            counts.setdefault(name, 0)
    return answer


RIGHT_COLLECTIVES: dict[str, Callable[..., Any]] = {
    "the notebook's solution": NOTEBOOK_COLLECTIVES,
    "placement changes looked up in a table, Counters": _by_table,
    "zero counts written out": _with_zeros,
}


@pytest.mark.parametrize("name", WRONG_COLLECTIVES)
def test_collectives_wrong_answers(name: str) -> None:
    fn, message, hint = WRONG_COLLECTIVES[name]
    verdict = ex.check_collectives(fn)
    rejected(verdict, message, hint, closer="returned tuple" not in message and "whole number" not in message)
    measured = ex.measured_collectives()
    for counts in measured.values():  # no verdict prints a measured answer
        assert str(counts) not in str(verdict.closer_hint())


@pytest.mark.parametrize("name", RIGHT_COLLECTIVES)
def test_collectives_right_answers(name: str) -> None:
    verdict = ex.check_collectives(RIGHT_COLLECTIVES[name])
    assert verdict, verdict


def test_collectives_the_notebooks_stub() -> None:
    namespace: dict[str, Any] = {}
    exec(_exercise_cell("check_collectives", solution=False), namespace)
    rejected(ex.check_collectives(namespace["collectives"]), "each block adds no collective in your answers",
             "section 2 counted one block")


def test_collectives_are_measured_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    first = ex.measured_collectives()
    monkeypatch.setattr(launching, "launch", _no_launch)
    assert ex.measured_collectives() == first
    assert ex.check_collectives(NOTEBOOK_COLLECTIVES)


def test_collective_cases_tell_the_blocks_from_the_edges() -> None:
    """Two numbers of blocks in every setting: what each block adds and what runs outside them are both found."""
    settings = Counter((sp, lp) for _, sp, lp in ex.COLLECTIVE_CASES)
    assert set(settings) == {(False, False), (False, True), (True, False), (True, True)}
    assert all(k == 2 for k in settings.values())
    measured = ex.measured_collectives()
    # one block as sections 2 and 3 counted it, and the edges each setting adds
    assert measured[(1, False, False)] == {"forward": {"all_reduce": 2}, "backward": {"all_reduce": 2}}
    edges = {case: {d: Counter(c) - Counter({k: 2 * case[0] for k in c}) for d, c in counts.items()}
             for case, counts in measured.items()}
    assert edges[(4, True, True)]["backward"] == Counter({"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1})


# --- exercise 3: choose the microbatches -------------------------------------------------------------------

NOTEBOOK_MICROBATCHES: Callable[..., Any] = notebook_functions(NB, ("microbatches",), tag="solution")["microbatches"]


def _loop(meets: Callable[[int, int, float], bool], memory: Callable[[int, int, float, float], str | None]
          ) -> Callable[..., Any]:
    """Count m up from 1 until ``meets(p, m, target)``; then ``memory(p, m, act, budget)`` names the schedule."""
    def microbatches(p: int, act: float, budget: float, target: float) -> Any:
        m = 1
        while not meets(p, m, target):
            m += 1
        schedule = memory(p, m, act, budget)
        return None if schedule is None else (schedule, m)
    return microbatches


def _bubble(p: int, m: int, t: float) -> bool:
    return (p - 1) / (m + p - 1) <= t


def _one_f_one_b(p: int, m: int, act: float, budget: float) -> str | None:
    return "1F1B" if min(m, p) * act <= budget else None


def _closed_form(solve: Callable[[int, float], float]) -> Callable[..., Any]:
    def microbatches(p: int, act: float, budget: float, target: float) -> Any:
        m = max(1, math.ceil(solve(p, target)))
        return ("1F1B", m) if min(m, p) * act <= budget else None
    return microbatches


def _endless(p: int, act: float, budget: float, target: float) -> Any:
    m = 1
    while not _bubble(p, m, target) or min(m, p) * act > budget:  # adds microbatches until they fit
        m += 1
    return "1F1B", m


WRONG_MICROBATCHES: dict[str, tuple[Callable[..., Any], str, str]] = {
    "the notebook's stub": (lambda p, a, b, t: ("1F1B", 1), "returned m = 1, whose bubble, 0.75, is above the target",
                            "the bubble (section 4)"),
    "a bubble strictly below the target": (_loop(lambda p, m, t: (p - 1) / (m + p - 1) < t, _one_f_one_b),
                                           "those of a bubble strictly below the target", "a bubble equal to it"),
    "the bubble read as (p - 1)/m": (_loop(lambda p, m, t: (p - 1) / m <= t, _one_f_one_b),
                                     "the bubble read as (p − 1)/m", "the bubble (section 4)"),
    "the bubble read as 1/m": (_loop(lambda p, m, t: 1 / m <= t, _one_f_one_b), "the bubble read as 1/m",
                               "the bubble (section 4)"),
    "(p - 1)(1 - t)/t rounded up": (_closed_form(lambda p, t: (p - 1) * (1 - t) / t),
                                    "m − 1 gives a bubble exactly equal to it, which meets it (a formula solved for m "
                                    "in floating point can round past such a tie)", "the fewest m"),
    "GPipe only": (_loop(_bubble, lambda p, m, a, b: "GPipe" if m * a <= b else None),
                   "returned None, but a schedule fits at the fewest m: 1F1B holds at most p", "activations in flight"),
    "1F1B holds p, even with fewer microbatches": (
        _loop(_bubble, lambda p, m, a, b: "1F1B" if p * a <= b else None),
        "with fewer microbatches than stages, 1F1B holds only those m, as GPipe does", "never more than m"),
    "an exact fit taken for too much": (_loop(_bubble, lambda p, m, a, b: "1F1B" if min(m, p) * a < b else None),
                                        "1F1B's activations in flight land exactly on the budget, and an exact fit "
                                        "fits", "activations in flight"),
    "memory ignored": (_loop(_bubble, lambda p, m, a, b: "1F1B"),
                       "neither schedule fits: 1F1B holds 4 microbatches of 3 GB, more than 11 GB", "activations in"),
    "GPipe whatever it holds": (_loop(_bubble, lambda p, m, a, b: "GPipe"),
                                "but GPipe holds 9 microbatches' activations at once on the first stage, 9 GB",
                                "GPipe runs every forward before the first backward"),
    "a search for an m that fits": (_endless, "did not return within 1 s. No schedule fits here, at any m",
                                    "what do more microbatches do to the activations in flight"),
    "one stage forgotten": (lambda p, a, b, t: ("1F1B", math.ceil((p - 1) * (1 - t) / t)),
                            "returned m = 0; a number of microbatches is a whole number", "gives a float or 0"),
    "m a float": (lambda p, a, b, t: ("1F1B", float(NOTEBOOK_MICROBATCHES(p, a, b, 1.0)[1])),
                  "returned m = 1.0 (a float)", "gives a float or 0"),
    "the schedule in lower case": (lambda p, a, b, t: ("1f1b", 1), "spelled '1F1B', as torch.distributed.pipelining",
                                   "the two schedules of section 4"),
    "m first": (lambda p, a, b, t: (1, "1F1B"), "the schedule comes first", "unpacks schedule, m"),
    "a list": (lambda p, a, b, t: ["1F1B", 1], "expected (schedule, m), a tuple, or None", "the answer is a pair"),
}


def _gpipe_first(p: int, m: int, act: float, budget: float) -> str | None:
    return "GPipe" if m * act <= budget else "1F1B" if min(m, p) * act <= budget else None


def _in_fractions(p: int, act: float, budget: float, target: float) -> Any:
    m = 1
    while Fraction(p - 1, m + p - 1) > Fraction(target):
        m += 1
    return ("1F1B", m) if min(m, p) * Fraction(act) <= Fraction(budget) else None


RIGHT_MICROBATCHES: dict[str, Callable[..., Any]] = {
    "the notebook's solution": NOTEBOOK_MICROBATCHES,
    "GPipe where it fits": _loop(_bubble, _gpipe_first),
    "exact fractions": _in_fractions,
    "(p - 1)/t - (p - 1) rounded up": _closed_form(lambda p, t: (p - 1) / t - (p - 1)),
}


@pytest.mark.parametrize("name", WRONG_MICROBATCHES)
def test_microbatches_wrong_answers(name: str) -> None:
    fn, message, hint = WRONG_MICROBATCHES[name]
    verdict = ex.check_microbatches(fn)
    rejected(verdict, message, hint, closer="the two schedules" not in hint and "unpacks" not in hint)
    # no verdict names the fewest m of the case it reports, unless the answer gave it
    case = next(c for c in ex.MICROBATCH_CASES if ex._case_text(c) in verdict.message) if any(
        ex._case_text(c) in verdict.message for c in ex.MICROBATCH_CASES) else None
    if case is not None and "did not return" not in verdict.message:
        want = ex._fewest(case[0], case[3])
        got = fn(*case)
        if not (isinstance(got, tuple) and len(got) == 2 and got[1] == want):
            assert f"m = {want}" not in verdict.message and f", {want})" not in verdict.message, verdict


@pytest.mark.parametrize("name", RIGHT_MICROBATCHES)
def test_microbatches_right_answers(name: str) -> None:
    verdict = ex.check_microbatches(RIGHT_MICROBATCHES[name])
    assert verdict, verdict


def test_microbatches_the_notebooks_stub() -> None:
    namespace: dict[str, Any] = {}
    exec(_exercise_cell("check_microbatches", solution=False), namespace)
    rejected(ex.check_microbatches(namespace["microbatches"]), "whose bubble, 0.75, is above the target",
             "the bubble (section 4)")


def test_microbatch_cases_hold_the_edges_the_statement_promises() -> None:
    rows = []
    for p, act, budget, target in ex.MICROBATCH_CASES:
        m = ex._fewest(p, target)
        assert m == ex._fewest(p, target, exact=True)  # no case depends on how the bubble is rounded
        fits = ex._fitting(p, act, budget, m)
        rows.append((p, m, fits, ex._bubble(p, m) == target, m * act == budget, min(m, p) * act == budget))
    assert any(tie for *_, tie, _, _ in rows)  # a bubble on the target
    assert any(gpipe_exact and "GPipe" in fits for _, _, fits, _, gpipe_exact, _ in rows)
    assert any(exact and fits == ["1F1B"] for _, _, fits, _, _, exact in rows)  # 1F1B exactly at the budget
    assert any(m < p and fits for p, m, fits, *_ in rows)  # fewer microbatches than stages
    assert any(p == 1 and fits for p, _, fits, *_ in rows) and any(p == 1 and not fits for p, _, fits, *_ in rows)
    assert any(not fits and p > 1 for p, _, fits, *_ in rows)
    assert any(fits == ["1F1B"] for _, _, fits, *_ in rows) and any("GPipe" in fits for _, _, fits, *_ in rows)
    assert max(m for _, m, *_ in rows) > 100  # a loop over m must be quick, not clever


# --- exercise 4: choose the layout ---------------------------------------------------------------------------

PLAN_NAMES = {"Layout": Layout, "state_bytes_per_gpu": state_bytes_per_gpu,
              "activation_bytes_per_gpu": activation_bytes_per_gpu}
NOTEBOOK_LAYOUT: Callable[..., Any] = notebook_functions(NB, ("choose_layout",), PLAN_NAMES,
                                                         tag="solution")["choose_layout"]


def _need(cfg: GPTConfig, layout: Layout) -> float:
    return sum(state_bytes_per_gpu(cfg, layout).values()) + activation_bytes_per_gpu(
        cfg, layout, 1, 8, "1F1B", act=2, res=4)


def _search(tps: Callable[[int, int], list[int]], fits: Callable[[GPTConfig, Layout, float], bool],
            skip_errors: bool = True, zero: int = 1, uses_all: bool = True) -> Callable[..., Any]:
    """A search over GPUs per copy, fewest first, trying ``tps(per_node, per_copy)`` in that order."""
    def choose_layout(cfg: GPTConfig, per_node: int, nodes: int, gpu: float) -> Any:
        total = per_node * nodes
        for per_copy in (k for k in range(1, total + 1) if total % k == 0):
            for tp in tps(per_node, per_copy):
                layout = Layout(dp=total // per_copy if uses_all else 1, tp=tp, pp=per_copy // tp, zero=zero,
                                sequence_parallel=True)
                try:
                    if fits(cfg, layout, gpu):
                        return layout
                except ValueError:
                    if not skip_errors:
                        raise
        return None
    return choose_layout


def _within_node(per_node: int, per_copy: int) -> list[int]:
    return [t for t in range(min(per_node, per_copy), 0, -1) if per_node % t == 0 and per_copy % t == 0]


def _fits(cfg: GPTConfig, layout: Layout, gpu: float) -> bool:
    return _need(cfg, layout) <= gpu


WRONG_LAYOUTS: dict[str, tuple[Callable[..., Any], str, str]] = {
    "the notebook's stub: data parallelism only": (
        lambda cfg, g, n, gpu: Layout(dp=g * n, zero=1, sequence_parallel=True),
        "your layout, dp 8 × tp 1 × pp 1, needs 79.9 GB per GPU, 60.5 GB of state and 19.3 GB of activations",
        "section 6's plan"),
    "tp as large as the node, never less": (
        _search(lambda g, k: [min(g, k)] if k % min(g, k) == 0 else [], _fits),
        "the 13 B, 20 heads model on 4 nodes of 8 GPUs with 34.9 GB each you returned None, but a layout fits",
        "did your search try every tp within a node"),
    "tp at most a node's GPUs, not dividing them": (
        _search(lambda g, k: [t for t in range(min(g, k), 0, -1) if k % t == 0], _fits),
        "your layout has tp 4, which does not fit within a node of 6 GPUs", "tensor parallelism stays within a node"),
    "the least tp first": (_search(lambda g, k: _within_node(g, k)[::-1], _fits),
                           "with as many GPUs per copy of the model a larger tp fits too", "Narayanan et al.'s rule"),
    "the state alone": (_search(_within_node, lambda cfg, lay, gpu: sum(state_bytes_per_gpu(cfg, lay).values()) <= gpu),
                        "19.3 GB of activations: more than 70.9 GB",
                        "the model's state and the activations of the most loaded stage"),
    "tp across nodes": (_search(lambda g, k: [t for t in range(k, 0, -1) if k % t == 0], _fits),
                        "has tp 8, which does not fit within a node of 4 GPUs", "tensor parallelism stays within"),
    "layouts layout_plan refuses not skipped": (_search(_within_node, _fits, skip_errors=False),
                                                "your function raised ValueError: tp (8) must divide the heads (20)",
                                                "your search must skip those"),
    "one copy of the model only": (_search(_within_node, _fits, uses_all=False),
                                   "your layout, dp 1 × tp 2 × pp 1, uses 2 GPUs of the 8",
                                   "data parallelism takes the GPUs"),
    "ZeRO 0": (_search(_within_node, _fits, zero=0), "the exercise plans with ZeRO 1 and sequence parallelism",
               "only dp, tp and pp are chosen"),
    "a tuple": (lambda cfg, g, n, gpu: (lay.dp, lay.tp, lay.pp) if (lay := NOTEBOOK_LAYOUT(cfg, g, n, gpu)) else None,
                "you returned tuple (4, 2, 1); expected a Layout", "the answer is layout_plan's Layout"),
    "the most GPUs per copy": (
        lambda cfg, g, n, gpu: next((lay for lay in sorted(
            ex._candidates(cfg, g, n), key=lambda lay: (-lay.tp * lay.pp, -lay.tp)) if _fits(cfg, lay, gpu)), None),
        "fits, but a layout with fewer GPUs per copy of the model fits too", "every GPU added to a copy"),
}


def _sorted_candidates(cfg: GPTConfig, per_node: int, nodes: int, gpu: float) -> Layout | None:
    """A right answer written otherwise: every layout, sorted by the rule, the first that fits."""
    total = per_node * nodes
    layouts = [Layout(dp=total // (tp * pp), tp=tp, pp=pp, zero=1, sequence_parallel=True)
               for tp in range(1, per_node + 1) if per_node % tp == 0
               for pp in range(1, total // tp + 1) if total % (tp * pp) == 0]
    for layout in sorted(layouts, key=lambda lay: (lay.tp * lay.pp, -lay.tp)):
        if layout.tp <= cfg.n_heads and cfg.n_heads % layout.tp == 0 and cfg.vocab % layout.tp == 0 \
                and layout.pp <= cfg.n_layers and _fits(cfg, layout, gpu):
            return layout
    return None


RIGHT_LAYOUTS: dict[str, Callable[..., Any]] = {"the notebook's solution": NOTEBOOK_LAYOUT,
                                                "all layouts sorted by the rule": _sorted_candidates}


@pytest.mark.parametrize("name", WRONG_LAYOUTS)
def test_layout_wrong_answers(name: str) -> None:
    fn, message, hint = WRONG_LAYOUTS[name]
    rejected(ex.check_layout(fn), message, hint, closer=name not in ("ZeRO 0",))


@pytest.mark.parametrize("name", RIGHT_LAYOUTS)
def test_layout_right_answers(name: str) -> None:
    verdict = ex.check_layout(RIGHT_LAYOUTS[name])
    assert verdict, verdict


def test_layout_the_notebooks_stub() -> None:
    namespace: dict[str, Any] = dict(PLAN_NAMES)
    exec(_exercise_cell("check_layout", solution=False), namespace)
    rejected(ex.check_layout(namespace["choose_layout"]), "needs 79.9 GB per GPU", "section 6's plan")


def test_layout_cases_hold_what_the_checker_promises() -> None:
    answers = {}
    for case in ex.LAYOUT_CASES:
        name, cfg, per_node, nodes, gpu = case
        candidates = ex._candidates(cfg, per_node, nodes)
        assert all(abs(_need(cfg, lay) / gpu - 1) > 1e-3 for lay in candidates)  # no float ties
        answers[(name, per_node, nodes)] = ex._reference_layout(cfg, per_node, nodes, gpu)
    assert None in answers.values()
    assert any(lay is not None and lay.pp > 1 for lay in answers.values())
    # the heads limit tp: the same model with 40 heads gets tp 8 on the same cluster, with 20 heads tp 4
    assert answers[("13 B, 40 heads", 8, 4)].tp == 8 and answers[("13 B, 20 heads", 8, 4)].tp == 4  # type: ignore[union-attr]
    # a smaller tp fits where the largest does not, for the same GPUs per copy
    lay = answers[("175 B", 8, 8)]
    assert lay is not None and lay.tp < 8 and lay.tp * lay.pp == 64
    assert any(per_node == 4 for _, _, per_node, _, _ in ex.LAYOUT_CASES)


def test_swiglu_plan_keys_may_name_the_module_itself_or_a_pattern() -> None:
    """parallelize_module reads "" as the module itself and a key as an fnmatch pattern: such plans are not
    turned away as naming no module (whether they are right is for the ranks to say)."""
    from torch.distributed.tensor.parallel import PrepareModuleInput

    whole = PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Replicate())
    assert ex._invalid_plan({"": whole, "gate": ColwiseParallel(), "up": ColwiseParallel(),
                             "down": RowwiseParallel()}) is None
    assert ex._invalid_plan({"[gu]*": ColwiseParallel(), "down": RowwiseParallel()}) is None
    assert ex._invalid_plan({"g*x": ColwiseParallel()}) is not None
