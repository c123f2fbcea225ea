"""Checkers for notebook 08 (when the model does not fit). They run on the CPU, so every student gets feedback.

Exercise 1 shards the states by the ZeRO stages with the bytes per parameter it is given; exercise 2 plans a
job by its predicted peak (`course_utils.memory.planner`); exercise 3 resumes training in one process from a
sharded checkpoint of model and optimizer.

The checkers of exercises 1 and 2 run the student's function on all their cases first, then name the mistake
that explains the answers they got (a stage that shards the wrong states, bytes that ignore the call, a search
that stops at some number of GPUs, a plan in the wrong precision or for one rank), with the values of one case.
Every failing verdict's hint names the concept; its closer hint (``%hint``, or a second failure) is nearer to
the code.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import combinations
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from ..memory.planner import parameter_count, plan_memory
from ..models import GPT, GPTConfig, token_batch
from . import TooSlow, Verdict, exercise, fail, ok, time_limit

__all__ = ["CALL_SECONDS", "FEWEST_CASES", "PLAN_CASES", "TIE_TOLERANCE", "activation_bytes", "check_fewest_gpus",
           "check_memory_plan", "check_resume_on_one_process", "parameter_count", "reference_fewest_gpus",
           "reference_per_rank_bytes"]

CALL_SECONDS = 1.0
"""How long exercise 1's checker waits for one call (where it can: on the main thread of a Unix process)."""


# --- the reference memory model -------------------------------------------------------------------------

def activation_bytes(cfg: GPTConfig, checkpointed: bool = False) -> int:
    """Bytes autograd saves for backward in `GPT.loss` on a batch of ``cfg.batch`` sequences (float32), the
    token batch included: the memory plan's saved terms. With ``checkpointed``, each block keeps only its input."""
    saved = ("activations", "activations outside blocks", "the batch")
    phase = plan_memory(cfg, "fp32", checkpointed).phases["backward (the loss)"]
    return int(sum(t.nbytes for t in phase if t.name in saved))


def reference_per_rank_bytes(n_params: int, world_size: int, stage: int) -> float:
    """Bytes of parameters, gradients and AdamW state one rank holds with ZeRO ``stage`` on ``world_size``."""
    if stage not in (0, 1, 2, 3) or world_size < 1:
        raise ValueError(f"ZeRO stages are 0 to 3 and a world has at least 1 rank; got stage {stage}, "
                         f"world size {world_size}")
    return sum(b * n_params / (world_size if i >= 3 - stage else 1) for i, b in enumerate((4.0, 4.0, 8.0)))


def _valid_call(fn: Any, name: str) -> Verdict | None:
    if not callable(fn):
        return fail(f"expected your function, got {type(fn).__name__}.", f"pass the function itself: {name}")
    return None


# --- 1. the fewest GPUs for a ZeRO stage ------------------------------------------------------------------

STATES = ("weights", "gradients", "optimizer state")
BYTE_COUNTS: dict[tuple[float, float, float], str] = {
    (2, 2, 12): "the ZeRO paper's mixed precision", (4, 4, 8): "float32",
    (2, 4, 12): "bf16 weights with float32 gradients"}
"""Exercise 1's bytes per parameter (weights, gradients, optimizer state with any master copy), and their names."""

TIE_TOLERANCE = Fraction(1, 10**9)
"""Exercise 1: a share within this relative distance of the GPU's bytes lies on the budget (see `check_fewest_gpus`)."""


def _sharded_at(stage: int) -> frozenset[int]:
    """The states (indices into `STATES`) ZeRO ``stage`` shards: 1 the optimizer state, 2 the gradients too, 3 all."""
    return frozenset(range(3 - stage, 3))


def _names(states: frozenset[int]) -> str:
    names = [f"the {STATES[i]}" for i in sorted(states)]
    return "nothing" if not names else names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


@dataclass(frozen=True)
class _Split:
    """One case of exercise 1 under one reading of its stage: bytes every GPU holds whole, bytes divided among
    the GPUs, the GPU's bytes; exact fractions."""

    whole: Fraction
    sharded: Fraction
    gpu: Fraction

    def share(self, gpus: int) -> Fraction:
        return self.whole + self.sharded / gpus

    def fewest(self) -> int | None:
        room = self.gpu - self.whole
        if room < 0 or (room == 0 and self.sharded > 0):
            return None  # what stays whole fills the GPU, or more: no number of GPUs is enough
        return 1 if self.sharded == 0 else max(1, math.ceil(self.sharded / room))

    def on_budget(self, gpus: int) -> bool:
        return abs(self.share(gpus) - self.gpu) <= TIE_TOLERANCE * self.gpu

    def accepted(self) -> set[int | None]:
        """The fewest; and one more where the fewest lands on the budget and is not a power of two (a float
        sum of the same bytes can come out a last-place unit above it; dividing by a power of two is exact)."""
        want = self.fewest()
        if want is not None and self.sharded > 0 and want & (want - 1) and self.on_budget(want):
            return {want, want + 1}
        return {want}


def _split(n: int, gpu: float, counts: Sequence[float], sharded: frozenset[int]) -> _Split:
    per = [Fraction(c) for c in counts]
    return _Split(sum((per[i] for i in range(3) if i not in sharded), Fraction(0)) * n,
                  sum((per[i] for i in sharded), Fraction(0)) * n, Fraction(gpu))


def reference_fewest_gpus(n_params: int, gpu_bytes: float, stage: int, weights: float = 2, grads: float = 2,
                          optimizer: float = 12) -> int | None:
    """The fewest GPUs on which one GPU's share of the states (``weights``, ``grads`` and ``optimizer`` bytes per
    parameter, the last including any master copy) fits in ``gpu_bytes`` at ZeRO ``stage``; None if none does.
    A share equal to ``gpu_bytes`` fits; computed in exact fractions."""
    return _split(n_params, gpu_bytes, (weights, grads, optimizer), _sharded_at(stage)).fewest()


FEWEST_PAIRS: tuple[tuple[int, float], ...] = (
    (1_000_000_000, 24e9), (7_500_000_000, 80e9), (70_000_000_000, 80e9), (7_500_000_000, 40e9),
    (12_000_000_000, 24e9), (5_990_000_000, 24e9), (1_000_000_000_000, 24e9), (1_600_000_000, 24e9))
"""Exercise 1's (parameters, bytes per GPU). 7.5 B on 40 GB lands exactly on the budget at stage 2 in float32
(on 9 GPUs) and at stage 3 (on 3); 12 B on 24 GB lands exactly on it at stage 3 (on 8 GPUs, every float sum
exact) and at stage 2 leaves the weights filling the GPU exactly; 5.99 B and 1 T need hundreds and
thousands of GPUs; 1.6 B on 24 GB fits when any one state is sharded, and not when none is. With these, each
reading of a stage (which of the three states it shards) gives answers no other reading gives (the tests
check it), so the checker can say which states a wrong stage sharded."""

FEWEST_CASES: tuple[tuple[int, float, int, tuple[float, float, float]], ...] = tuple(
    (n, gpu, stage, counts) for n, gpu in FEWEST_PAIRS for stage in range(4) for counts in BYTE_COUNTS)
"""(parameters, bytes per GPU, stage, bytes per parameter: weights, gradients, optimizer state) of exercise 1."""


def _call(case: tuple[int, float, int, tuple[float, float, float]]) -> str:
    n, gpu, stage, (w, g, o) = case
    return f"fewest_gpus({n:_}, {gpu / 1e9:g}e9, {stage}, weights={w}, grads={g}, optimizer={o})"


def _gb(x: Fraction | float) -> str:
    return f"{float(x) / 1e9:,.2f} GB"


def _gpus(k: int) -> str:
    return f"{k:,} GPU" + ("s" if k != 1 else "")


def _enough(k: int) -> str:
    return f"{_gpus(k)} {'is' if k == 1 else 'are'} enough"


def _on(k: int) -> str:
    return "on 1 GPU it holds" if k == 1 else f"on {k:,} GPUs each holds"


_STAGE_HINT = ("which states does each ZeRO stage divide among the GPUs, and which stay whole on every one? Each "
               "stage shards one state more than the stage before (section 3's formulas).")
_STAGE_CLOSER = ("stage 1 shards the optimizer state; stage 2 the gradients as well; stage 3 the weights as well. "
                 "What a stage does not shard counts whole on every GPU, however many there are.")
_SOLVE_HINT = ("solve the stage's formula for the number of GPUs N: what it shards, divided by N, must fit in what "
               "the unsharded part leaves of the GPU.")
_SOLVE_CLOSER = ("on N GPUs one GPU holds (what stays whole) + (what is sharded) / N bytes; the answer is the "
                 "fewest N for which that is at most gpu_bytes.")


def _right_split(case: tuple[int, float, int, tuple[float, float, float]]) -> _Split:
    n, gpu, stage, counts = case
    return _split(n, gpu, counts, _sharded_at(stage))


def _not_a_count(case: tuple[int, float, int, tuple[float, float, float]], got: Any) -> Verdict | None:
    """A failing verdict when ``got`` is neither None nor a whole number of GPUs of at least 1."""
    call = _call(case)
    if got is None or (isinstance(got, numbers.Integral) and not isinstance(got, bool) and int(got) >= 1):
        return None
    if isinstance(got, numbers.Integral) and not isinstance(got, bool) and int(got) == 0:
        return fail(f"{call} returned 0; a job runs on at least 1 GPU.",
                    "how many GPUs does a job need when its share fits on one, or when nothing is sharded?",
                    "a quotient below 1, rounded up, is 1; with nothing to shard the job runs on 1 GPU.")
    if isinstance(got, float) and got.is_integer() and got >= 1:
        return fail(f"{call} returned {got}, a float; a number of GPUs is a whole number: return an int.",
                    "which of your operations gives a float where a count is meant?",
                    "math.ceil and // of ints return ints; /, numpy's ceil and round(x, 0) return floats.")
    return fail(f"{call} returned {got!r}; expected a whole number of GPUs (at least 1), or None.",
                "the answer is a count of GPUs, or None when no count is enough.")


def _too_slow(case: tuple[int, float, int, tuple[float, float, float]]) -> Verdict:
    right, stage = _right_split(case), case[2]
    if right.fewest() is None:
        held = "more than" if right.whole > right.gpu else "exactly"
        return fail(f"{_call(case)} did not return within {CALL_SECONDS:g} s. No number of GPUs is enough here: "
                    f"{_gb(right.whole)} stays whole on every GPU at stage {stage}, {held} its {_gb(right.gpu)}, "
                    "so a search that adds GPUs until the share fits never ends.",
                    "when can no number of GPUs be enough? Find that out before counting.",
                    "compare what stays whole with gpu_bytes first: if it leaves no room, return None before any loop.")
    return fail(f"{_call(case)} did not return within {CALL_SECONDS:g} s.", _SOLVE_HINT,
                "the count follows from the formula: no need to try every N.")


def _raised(case: tuple[int, float, int, tuple[float, float, float]], exc: Exception) -> Verdict:
    right, stage = _right_split(case), case[2]
    message = f"{_call(case)} raised {type(exc).__name__}: {exc}"
    if isinstance(exc, ZeroDivisionError) and right.whole == right.gpu:
        return fail(f"{message}. At stage {stage} {_names(frozenset(range(3)) - _sharded_at(stage))} stay "
                    f"whole on every GPU: {_gb(right.whole)}, exactly the GPU's bytes.",
                    "what room does a GPU that the unsharded part fills exactly leave for the shards?",
                    "no room means no share fits, however many GPUs: that is the None case, equality included.")
    return fail(message, "run your function on these arguments yourself: the traceback's last lines show which "
                "operation fails, and on which value.",
                "the arguments are plain numbers: n_params an int, gpu_bytes a float, stage 0 to 3, and bytes per "
                "parameter that need not be 2, 2 and 12.")


def _diagnose_fewest(answers: list[int | None], wrong: list[int]) -> Verdict:
    """The failing verdict for exercise 1: the mistake that explains all the answers, else the first wrong case's."""
    case = FEWEST_CASES[wrong[0]]
    n, gpu, stage, counts = case
    got, right, call = answers[wrong[0]], _right_split(case), _call(case)
    want = right.fewest()

    def explains(states: frozenset[int], counts: tuple[float, float, float] | None = None) -> bool:
        """Whether every answer at this stage is the one for sharding ``states`` (with ``counts``, when given,
        in place of the call's bytes per parameter)."""
        return all(answers[i] in _split(c[0], c[1], counts or c[3], states).accepted()
                   for i, c in enumerate(FEWEST_CASES) if c[2] == stage)

    # a stage that shards other states than ZeRO's
    for size in range(4):
        for states in (frozenset(s) for s in combinations(range(3), size)):
            if states != _sharded_at(stage) and explains(states):
                other = [k for k in range(4) if _sharded_at(k) == states]
                like = f" (what stage {other[0]} shards)" if other else ""
                unsharded = frozenset(range(3)) - states
                keeps = f" and keep {_names(unsharded)} whole on every GPU" if unsharded else ""
                return fail(f"at stage {stage} your answers shard {_names(states)}{like}{keeps}; stage {stage} shards "
                            f"{_names(_sharded_at(stage))}. For example {call} returned {got}, where "
                            + (f"{_gpus(want)} {'is' if want == 1 else 'are'} right." if want is not None else "no number of GPUs is enough."),
                            _STAGE_HINT, _STAGE_CLOSER)
    # bytes per parameter other than the call's
    for fixed, label in BYTE_COUNTS.items():
        if fixed != tuple(counts) and explains(_sharded_at(stage), fixed):
            theirs = " + ".join(map(str, fixed))
            return fail(f"your answers are right for {theirs} bytes per parameter ({label}) whatever the call "
                        f"passes: {call} returned {got}, as {theirs} bytes give; with the bytes it passes, "
                        + (f"{_gpus(want)} {'is' if want == 1 else 'are'} right." if want is not None else "no number of GPUs is enough."),
                        "the bytes per parameter are arguments: another precision holds other bytes per state.",
                        "use weights, grads and optimizer as the call passes them, in place of fixed numbers.")
    # a search that stops at some number of GPUs
    needs = {i: _right_split(c).fewest() for i, c in enumerate(FEWEST_CASES)}
    found = [k for i, k in needs.items() if i not in wrong and k is not None]
    missed = [(k, i) for i in wrong if answers[i] is None and (k := needs[i]) is not None]
    if found and len(missed) == len(wrong) and min(missed)[0] > max(found):
        need, smallest = min(missed)
        split = _right_split(FEWEST_CASES[smallest])
        return fail(f"{_call(FEWEST_CASES[smallest])} returned None, but {_enough(need)} "
                    f"({_on(need)} {_gb(split.share(need))}). Every case that needs at most {max(found):,} GPUs is right, "
                    f"and every one that needs {need:,} or more returned None: your function gives up somewhere "
                    "in between.",
                    "None means that no number of GPUs is enough, which happens only when what a stage leaves "
                    "whole does not fit by itself; otherwise some count works, however large. Does your search "
                    "stop at a largest count?",
                    "drop the largest count you try: once the unsharded part is known to leave room, either count "
                    "up until the share fits or compute N from the formula and round it up.")
    # this case's own mistake
    kept = _names(frozenset(range(3)) - _sharded_at(stage))
    if want is None:
        if right.whole == right.gpu:
            why = (f"at stage {stage} {kept} stay whole on every GPU: {_gb(right.whole)}, exactly the GPU's "
                   "bytes, which leaves no room for any share")
        else:
            why = f"every GPU holds {_gb(right.whole)} whole at stage {stage} ({kept}), more than its {_gb(gpu)}"
        return fail(f"{call} returned {got}, but no number of GPUs is enough: {why}.",
                    "what a stage does not shard stays whole on every GPU, however many there are: when does no "
                    "number of GPUs help?",
                    "compare what stays whole with gpu_bytes before counting GPUs: if it leaves no room (equal "
                    "leaves none: the shards need some), return None.")
    room = right.gpu - right.whole
    if got is None:
        if right.sharded == 0:
            return fail(f"{call} returned None, but 1 GPU is enough: at stage 0 nothing is sharded, and the "
                        f"{_gb(right.whole)} of states fit in its {_gb(gpu)}.",
                        "None is for a job whose unsharded part does not fit by itself: does it fit here?",
                        "with nothing to shard, the answer is 1 when everything fits on one GPU, else None.")
        return fail(f"{call} returned None, but {_enough(want)} "
                    f"({_on(want)} {_gb(right.share(want))}): what stays whole at stage {stage} ({kept}), "
                    f"{_gb(right.whole)}, leaves {_gb(room)} of the GPU for the shards.",
                    "None is for a stage whose unsharded part does not fit by itself; here it fits, so enough GPUs "
                    "make the shards fit too: how many?", _SOLVE_CLOSER)
    if got == want + 1 and right.on_budget(want):
        return fail(f"{call} returned {got}, but {_enough(want)}: {_on(want)} exactly {float(right.gpu):,.0f} "
                    "bytes, all of the GPU, and a share equal to gpu_bytes fits.",
                    "'fits in gpu_bytes' includes an exact fit: where does your function treat equality as not "
                    "fitting?",
                    "compare with less-or-equal; and when rounding a quotient up, a whole-number quotient stays "
                    "as it is (math.ceil(8.0) is 8, int(8.0) + 1 is 9).")
    quotient = right.sharded / room
    if got < want:
        rounded = got in (math.floor(quotient), round(quotient))
        return fail(f"{call} returned {got}: {_on(got)} {_gb(right.share(got))}, more than {_gb(gpu)}.",
                    "a fraction of a GPU still takes a whole GPU: which way must the count be rounded?" if rounded
                    else _SOLVE_HINT,
                    "round the quotient up (math.ceil), never down (int, //) or to the nearest (round)." if rounded
                    else _SOLVE_CLOSER)
    return fail(f"{call} returned {got:,}, but {_enough(want)} "
                f"({_on(want)} {_gb(right.share(want))}).",
                "the fewest: is there a smaller count on which each GPU's share still fits?", _SOLVE_CLOSER)


@exercise
def check_fewest_gpus(fn: Callable[..., int | None]) -> Verdict:
    """Exercise: ``fn(n_params, gpu_bytes, stage, weights, grads, optimizer)`` returns the fewest GPUs on which
    each GPU's share of the states fits at that ZeRO stage, or None when no number of GPUs is enough.

    The checker calls ``fn`` on every case of `FEWEST_CASES` (each call for at most `CALL_SECONDS`, where a
    SIGALRM can stop it), then names the mistake that explains its answers. A share equal to ``gpu_bytes``
    fits; one whose unsharded part alone equals ``gpu_bytes`` leaves no room, so None. Shares are compared in
    exact fractions. Where the fewest GPUs' share is within a relative `TIE_TOLERANCE` (1e-9) of ``gpu_bytes``
    and that count is not a power of two, one GPU more is accepted as well: the same bytes summed in another
    order in floating point can land a last-place unit above the budget (``(4 + 4 / 9 + 8 / 9) * 7.5e9`` is
    40000000000.00001, ``30e9 + 90e9 / 9`` is 40e9). On a power of two every float sum of these bytes is exact,
    so there only the fewest is right: the case on 8 GPUs catches ``<`` for ``<=`` and ``int(x) + 1`` for
    ``math.ceil(x)``."""
    bad = _valid_call(fn, "check_fewest_gpus(fewest_gpus)")
    if bad is not None:
        return bad
    answers: list[int | None] = []
    for case in FEWEST_CASES:
        n, gpu, stage, counts = case
        try:
            with time_limit(CALL_SECONDS):
                got = fn(n, gpu, stage, *counts)
        except TooSlow:
            return _too_slow(case)
        except Exception as exc:  # the student's code: report any failure as feedback
            return _raised(case, exc)
        bad = _not_a_count(case, got)
        if bad is not None:
            return bad
        answers.append(None if got is None else int(got))
    wrong = [i for i, case in enumerate(FEWEST_CASES) if answers[i] not in _right_split(case).accepted()]
    if wrong:
        return _diagnose_fewest(answers, wrong)
    return ok(f"all {len(FEWEST_CASES)} cases agree: {len(FEWEST_PAIRS)} pairs of a model size and a GPU, stages 0 "
              "to 3, three sets of bytes per parameter (2 + 2 + 12, 4 + 4 + 8, 2 + 4 + 12); among them jobs that "
              "need hundreds and thousands of GPUs, shares that land exactly on the GPU's bytes, and a stage whose "
              "unsharded part fills the GPU exactly.")


# --- 2. what to shard or checkpoint for a budget: the peak, not the states ---------------------------------

PLAN_PRECISION = "bf16"
"""Exercise 2's jobs train in bf16 as notebook 08 teaches: DDP with autocast for stages 0 and 1, FSDP2 with its
mixed-precision policy for stages 2 and 3 (`plan_memory`'s default); float32 master weights and AdamW state."""

Plan = tuple[int, bool]


def _least_plan(cfg: GPTConfig, world_size: int, budget: float, precision: str = PLAN_PRECISION,
                mixed_precision: str | None = None) -> Plan | None:
    for checkpointed in (False, True):
        for stage in range(4):
            if plan_memory(cfg, precision, checkpointed, stage, world_size,
                           mixed_precision=mixed_precision).fits(budget):
                return stage, checkpointed
    return None


def _reference_plan(cfg: GPTConfig, world_size: int, budget: float) -> Plan | None:
    return _least_plan(cfg, world_size, budget)


PLAN_CASES: tuple[tuple[GPTConfig, int, float], ...] = (
    (GPTConfig(vocab=50_304, seq_len=1024, d_model=768, n_heads=12, n_layers=12, batch=8), 8, 80 * 2**30),
    (GPTConfig(vocab=50_304, seq_len=1024, d_model=768, n_heads=12, n_layers=12, batch=8), 8, 8 * 2**30),
    (GPTConfig(vocab=50_304, seq_len=2048, d_model=2048, n_heads=16, n_layers=24, batch=4), 8, 32 * 2**30),
    (GPTConfig(vocab=50_304, seq_len=2048, d_model=2048, n_heads=16, n_layers=24, batch=4), 4, 24 * 2**30),
    (GPTConfig(vocab=50_304, seq_len=2048, d_model=4096, n_heads=32, n_layers=32, batch=8), 8, 26 * 2**30),
    (GPTConfig(vocab=50_304, seq_len=2048, d_model=4096, n_heads=32, n_layers=32, batch=1), 8, 40 * 2**30),
    (GPTConfig(vocab=50_304, seq_len=2048, d_model=4096, n_heads=32, n_layers=32, batch=1), 2, 24 * 2**30),
)
"""(model with the per-rank batch, ranks, bytes per GPU) of exercise 2; the notebook prints them."""

_UNPRINTED_PLAN_CASES: tuple[tuple[GPTConfig, int, float], ...] = (
    (GPTConfig(vocab=50_304, seq_len=1024, d_model=1024, n_heads=16, n_layers=24, batch=16), 2, 24 * 2**30),
    (GPTConfig(vocab=50_304, seq_len=1024, d_model=1024, n_heads=16, n_layers=24, batch=16), 4, 32 * 2**30),
    (GPTConfig(vocab=50_304, seq_len=2048, d_model=1536, n_heads=16, n_layers=24, batch=8), 4, 16 * 2**30),
)
"""Jobs exercise 2's checker tries after `PLAN_CASES` without printing them, whose least plans are none of the
printed jobs': an answer that knows the printed jobs rather than computing the plan fails here."""

_WRONG_READINGS: tuple[tuple[str, dict[str, Any], str, str], ...] = (
    ("the plans of a job trained in float32", {"precision": "fp32"},
     "which precision do these jobs train in, and what does it change in the plan? (the exercise's first "
     "sentence)", "plan_memory's precision argument: the jobs train in bf16."),
    ("the plans with autocast at every stage", {"mixed_precision": "autocast"},
     "how do the jobs train in bf16 at stages 2 and 3, where FSDP2 shards them? (section 3: two ways to train in "
     "bf16)", "left out, plan_memory's mixed_precision picks what the exercise says for each stage."),
    *((f"the plans for {w} rank{'s' if w > 1 else ''}, whatever world_size says", {"world_size": w},
       "a stage divides the states it shards among the ranks: how many ranks does each job have?",
       "plan_memory takes the number of ranks (world_size; its default is 1): pass the job's.")
      for w in (1, 2, 4, 8)),
)
"""Readings of exercise 2 that give wrong plans: (what the answers are, plan_memory's arguments, hint, closer)."""


def _reading(case: tuple[GPTConfig, int, float], options: dict[str, Any]) -> Plan | None:
    cfg, w, budget = case
    return _least_plan(cfg, options.get("world_size", w), budget, options.get("precision", PLAN_PRECISION),
                       options.get("mixed_precision"))


def _where(cfg: GPTConfig, w: int, budget: float) -> str:
    return (f"d_model {cfg.d_model}, {cfg.n_layers} blocks, batch {cfg.batch} × {cfg.seq_len} per rank, {w} ranks, "
            f"{budget / 2**30:.0f} GiB per GPU")


def _not_a_plan(got: Any) -> bool:
    return got is not None and (not isinstance(got, tuple) or len(got) != 2 or type(got[0]) is not int
                                or got[0] not in (0, 1, 2, 3) or not isinstance(got[1], bool))


def _need(plan: Any) -> str:
    return (f"{plan.total / 2**30:.1f} GiB per GPU: its largest phase, {plan.peak_phase}, allocates "
            f"{plan.peak / 2**30:.1f} GiB, and the GPU also holds the CUDA context "
            f"({plan.context / 2**30:.1f} GiB) and the allocator's margin ({plan.margin:.0%} of the peak)")


def _same_for_every_job(cases: Sequence[tuple[GPTConfig, int, float]], got: Plan | None, first: int) -> Verdict:
    cfg, w, budget = cases[first]
    where = _where(cfg, w, budget)
    if got is None:
        detail = f"for {where} at least one of the eight plans fits."
    else:
        plan = plan_memory(cfg, PLAN_PRECISION, got[1], got[0], w)
        detail = (f"for {where}, {got} needs {_need(plan)}: it does not fit." if not plan.fits(budget)
                  else f"for {where}, {got} fits, but it is not the least plan that does.")
    return fail(f"your function returned {got!r} for all {len(cases)} jobs, whatever their model, batch, ranks and "
                f"GPU: {detail}",
                "the least plan depends on the job: how does your function find out whether a plan fits a job?",
                "section 3's plan_memory predicts what a plan needs on each GPU; try the plans in the order asked.")


def _plan_verdict(cfg: GPTConfig, w: int, budget: float, got: Plan | None, want: Plan | None) -> Verdict:
    """What is wrong with the plan ``got`` for one job whose least plan is ``want``."""
    where = _where(cfg, w, budget)
    order = ("the order is part of the answer: sharding costs communication, checkpointing a forward pass "
             "more per step; which does the exercise try first?")
    if got is None:
        assert want is not None
        return fail(f"for {where} you found no plan, but at least one of the eight fits.",
                    "None is for a job that no stage fits, with checkpointing or without: which plans did your "
                    "function try, and how did it decide that they do not fit?",
                    f"the least plan that fits this job is at stage {want[0]}, "
                    f"{'with' if want[1] else 'without'} checkpointing: why did your function reject it?")
    plan = plan_memory(cfg, PLAN_PRECISION, got[1], got[0], w)
    if not plan.fits(budget):
        need = _need(plan)
        if plan.peak <= budget:
            return fail(f"for {where}, your plan {got} needs {need}. The allocated peak alone fits in "
                        f"{budget / 2**30:.0f} GiB; the rest does not.",
                        "a GPU holds more than the tensors PyTorch allocates: what does the plan add to its "
                        "peak, and why?",
                        "a MemoryPlan has the allocated peak and what the GPU needs: fits() compares the second.")
        states = reference_per_rank_bytes(parameter_count(cfg), w, got[0])
        saved = sum(t.nbytes for t in plan.phases["backward (the loss)"] if t.name.startswith("activations"))
        if states + saved <= budget:
            return fail(f"for {where}, your plan {got} needs {need}. Counting only the states and the saved "
                        f"activations ({(states + saved) / 2**30:.1f} GiB) misses what lives for a moment: the "
                        "logits' gradient, the gradients in flight, a recomputed block, AdamW's temporaries, the "
                        "gathered units.",
                        "a GPU runs out at the step's largest moment, not at what the step keeps: which tensors "
                        "exist during one phase only?",
                        "section 3's memory plan adds them up phase by phase: ask plan_memory whether a plan "
                        "fits rather than summing terms yourself.")
        return fail(f"for {where}, your plan {got} needs {need}: it does not fit.",
                    "a plan fits when the GPU holds the step at its largest phase, with the context and the margin: "
                    "how does your function decide that?",
                    "a MemoryPlan knows whether it fits a GPU of budget_bytes: look at its methods.")
    assert want is not None  # the student's plan fits, so the reference finds one
    if got[1] and not want[1]:
        return fail(f"for {where}, your plan {got} checkpoints activations, but a ZeRO stage fits without "
                    "recomputing them.", order,
                    "try all four stages without checkpointing before any plan with it.")
    if got[0] > want[0] and got[1] == want[1]:
        return fail(f"for {where}, your plan {got} fits, but a lower stage fits too.",
                    "the least plan: stage 3 all-gathers the weights again in every forward and backward, and the "
                    "lower stages need no such gathering. Which fits first, in the order asked?",
                    "stop at the first stage that fits, trying 0, 1, 2, 3 in that order.")
    return fail(f"for {where}, your plan {got} is not the least one that fits.", order,
                "stages 0 to 3 without checkpointing, then stages 0 to 3 with it: the first that fits.")


@exercise
def check_memory_plan(fn: Callable[[GPTConfig, int, float], Plan | None]) -> Verdict:
    """Exercise: ``fn(cfg, world_size, budget_bytes)`` returns ``(stage, checkpointed)``, the least sharding
    whose predicted need (`course_utils.memory.planner.plan_memory`: the peak, its margin and the CUDA context)
    fits (stage 0 before 1, 2, 3; activation checkpointing only when no stage fits without it), or None.

    The checker calls ``fn`` on the printed `PLAN_CASES` and then on three jobs it does not print, then names
    the reading of the exercise that explains every answer (float32, autocast at every stage, a fixed number of
    ranks), else the first wrong job's mistake. No job's need is within 0.8% of its budget, so the same sums
    taken in another order give the same answers (no float ties)."""
    bad = _valid_call(fn, "check_memory_plan(plan)")
    if bad is not None:
        return bad
    cases = PLAN_CASES + _UNPRINTED_PLAN_CASES
    answers: list[Plan | None] = []
    for i, (cfg, w, budget) in enumerate(cases):
        unseen = i >= len(PLAN_CASES)
        try:
            got = fn(cfg, w, budget)
        except Exception as exc:  # the student's code: report any failure as feedback
            return fail(f"for {_where(cfg, w, budget)}{', a job the notebook did not print,' if unseen else ''} "
                        f"your function raised {type(exc).__name__}: {exc}",
                        "your function must plan any job from its arguments, not only the printed ones."
                        if unseen else "run your function on this job yourself: the traceback shows which "
                        "operation fails.",
                        "compute the plan from cfg, world_size and budget_bytes: section 3's plan_memory predicts "
                        "what each plan needs.")
        if _not_a_plan(got):
            return fail(f"for {_where(cfg, w, budget)} you returned {got!r}; expected (stage, checkpointed): "
                        "stage 0 to 3 and True or False, or None.",
                        "the answer is a plan, (stage, checkpointed), or None when no plan fits.",
                        "a tuple of an int from 0 to 3 and a bool, in that order: not a list, not a MemoryPlan.")
        answers.append(got)
    wants = [_reference_plan(*case) for case in cases]
    wrong = [i for i in range(len(cases)) if answers[i] != wants[i]]
    if not wrong:
        return ok(f"all {len(PLAN_CASES)} printed jobs and {len(_UNPRINTED_PLAN_CASES)} unprinted ones get the "
                  "least plan that fits at its peak, and None where nothing does.")
    first = wrong[0]
    if len(set(answers)) == 1:
        return _same_for_every_job(cases, answers[0], first)
    for what, options, hint, closer in _WRONG_READINGS:
        if all(answers[i] == _reading(case, options) for i, case in enumerate(cases)):
            cfg, w, budget = cases[first]
            return fail(f"your answers are {what}: for {_where(cfg, w, budget)} you returned {answers[first]}.",
                        hint, closer)
    verdict = _plan_verdict(*cases[first], answers[first], wants[first])
    if first >= len(PLAN_CASES):
        return fail(f"your function is right for the {len(PLAN_CASES)} printed jobs, but not for one it was not "
                    f"shown: {verdict.message}", verdict.hint, verdict.closer)
    return verdict


# --- 3. resume in one process from a 4-rank checkpoint ------------------------------------------------------

RESUME_STEPS = (3, 5)
"""Exercise 3's checkpoint holds the state after step 3 of the job's 5."""

_LOAD_CLOSER = ("get_state_dict(model, optimizer) gives the two dicts to load into; dcp.load fills them in place "
                "under the keys the job saved; set_state_dict puts them into the model and the optimizer.")


def _files(folder: str | os.PathLike[str]) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: (size, modification time); empty when there is no such folder."""
    root = Path(folder)
    if not root.is_dir():
        return {}
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
            if p.is_file()}


def _raised_while_loading(exc: BaseException) -> Verdict:
    # dcp's CheckpointException (a BaseException) carries each rank's own error
    errors = [e for e, _ in exc.failures.values()] if isinstance(exc, dcp.CheckpointException) else [exc]
    first = errors[0] if errors else exc
    text = str(first).splitlines()[0][:300] if str(first) else ""
    message = f"your function raised {type(first).__name__}: {text}"
    if isinstance(first, (IsADirectoryError, PermissionError)):
        return fail(message, "the checkpoint is a folder of shard files written by torch.distributed.checkpoint, "
                    "not one torch.save file: which library reads it back?",
                    "dcp.load(state_dict, checkpoint_id=folder) fills a state dict of the saved structure in place.")
    if "Missing key" in str(first):
        return fail(message + ": the dict you loaded into has a key that the checkpoint does not.",
                    "dcp.load matches keys by their full path: the job saved {'model': ..., 'optim': ...}. Does "
                    "your dict have the same structure?", _LOAD_CLOSER)
    if "Size mismatch" in str(first):
        return fail(message, "dcp.load fills tensors of the saved shapes: is the model you load into the job's?",
                    "the job trained GPT(SMALL).")
    if "process group" in str(first).lower():
        return fail(message, "one process needs no process group: what in your function asks for one?",
                    "dcp.load and the state_dict helpers work without one; dist.get_rank() and collectives do not.")
    return fail(message, "run your function on the folder yourself: the traceback shows which call fails.",
                _LOAD_CLOSER)


@exercise
def check_resume_on_one_process(fn: Callable[[str | os.PathLike[str]], tuple[nn.Module, torch.optim.Optimizer]],
                                folder: str | os.PathLike[str], expected: dict[str, torch.Tensor],
                                tolerance: float = 1e-4) -> Verdict:
    """Exercise: ``fn(folder)`` returns ``(model, optimizer)``: a plain `GPT` and AdamW (lr 1e-3) holding the
    state of the DCP checkpoint in ``folder`` (``{"model": ..., "optim": ...}`` after step 3), loaded in this
    process without a process group. The checker trains them through steps 4 and 5 on the job's batches (the
    ``token_batch`` stream of seed 1) and compares with ``expected``, the weights of the run that never stopped.

    It also fails a function that leaves a process group open or changes the checkpoint's folder (adds,
    removes or rewrites a file). A process group opened and destroyed inside the function it cannot see."""
    bad = _valid_call(fn, "check_resume_on_one_process(resume_on_one_process, folder, expected)")
    if bad is not None:
        return bad
    before = _files(folder)
    try:
        got = fn(folder)
    except (Exception, dcp.CheckpointException) as exc:  # the student's code: any failure is feedback
        return _raised_while_loading(exc)
    if dist.is_available() and dist.is_initialized():
        return fail("your function started a process group.", "one process needs none: dcp.load reads "
                    "every shard file itself when no process group exists.",
                    "remove init_process_group: a plain model and optimizer load without it.")
    after = _files(folder)
    if after != before:
        changed = sorted(set(before) ^ set(after)) or sorted(f for f in after if after[f] != before[f])
        return fail(f"your function changed the checkpoint's folder ({', '.join(changed[:4])}): a resume reads a "
                    "checkpoint, it does not write into it.",
                    "the checkpoint is the job's only copy of its state: what in your function writes there?",
                    "write anything you convert or save to another folder (a temporary one), or load without "
                    "writing at all.")
    if (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], torch.optim.Optimizer)
            and isinstance(got[1], nn.Module)):
        return fail("your function returned (optimizer, model); expected (model, optimizer), in that order.",
                    "the checker unpacks model, optimizer = your_function(folder).")
    if (not isinstance(got, tuple) or len(got) != 2 or not isinstance(got[0], nn.Module)
            or not isinstance(got[1], torch.optim.Optimizer)):
        kinds = (f"({', '.join(type(x).__name__ for x in got)})" if isinstance(got, tuple)
                 else type(got).__name__)
        return fail(f"your function returned {kinds}; expected (model, optimizer).",
                    "return both: the model and the optimizer that holds its state.")
    model, optimizer = got
    if not isinstance(model, GPT):
        return fail(f"your model is a {type(model).__name__}, not the course's GPT.",
                    "the checkpoint holds the job's GPT: the checker trains the model you return on its batches.",
                    "start from GPT(SMALL).")
    if not isinstance(optimizer, torch.optim.AdamW):
        return fail(f"your optimizer is {type(optimizer).__name__}, not AdamW: the checkpoint holds AdamW's state.",
                    "the job trained with AdamW: a resume continues with the same optimizer.",
                    "torch.optim.AdamW(model.parameters(), lr=1e-3), as the exercise says.")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if {id(p) for p in params} != {id(p) for p in model.parameters()}:
        return fail("your optimizer does not update the parameters of the model you returned.",
                    "an optimizer steps the tensors it was given when it was made: which model's parameters did "
                    "yours get?",
                    "make the AdamW from the parameters of the model you return, and load its state into that one.")
    missing = sum(1 for p in params if not optimizer.state.get(p))
    if missing:
        return fail(f"your optimizer has no state for {missing} of {len(params)} parameters: a fresh AdamW "
                    "would start again from zero moments and step 1.",
                    "a resume needs everything the next step depends on, and AdamW's moments and step count "
                    "are in the checkpoint too: section 4's resume loads them with the model's.",
                    "dcp.load fills only the entries of the dict you pass, and a fresh AdamW's own state_dict() "
                    "has no state to fill. " + _LOAD_CLOSER)
    steps = {int(s["step"]) for s in optimizer.state.values() if "step" in s}
    if steps != {RESUME_STEPS[0]}:
        if max(steps, default=0) > RESUME_STEPS[0]:
            return fail(f"your optimizer's step counts are {sorted(steps)}, not {RESUME_STEPS[0]}: something stepped "
                        "it after the checkpoint's state was loaded.",
                        "a resume continues from the saved step: the checker runs step 4 itself.",
                        "return right after loading: no optimizer.step() (or training) in your function.")
        return fail(f"your optimizer's step counts are {sorted(steps)}, not {RESUME_STEPS[0]}: its state was made in "
                    "this process (a first step, or get_state_dict preparing a state to load into), not read from "
                    "the checkpoint.",
                    "the job saved AdamW's state next to the model's, under its own key: did your function load "
                    "it, and put it into the optimizer?", _LOAD_CLOSER)
    g = torch.Generator().manual_seed(1)
    for step in range(1, RESUME_STEPS[1] + 1):
        tokens = token_batch(model.cfg, g)
        if step > RESUME_STEPS[0]:
            model.loss(tokens).backward()
            optimizer.step()
            optimizer.zero_grad()
    state = model.state_dict()
    if set(state) != set(expected):
        return fail(f"your model's keys differ from the checkpoint's: {sorted(set(state) ^ set(expected))[:4]}.",
                    "the checkpoint holds the job's GPT: is yours built the same way?", "start from GPT(SMALL).")
    difference = max((state[k].detach().cpu() - expected[k].cpu()).abs().max().item() for k in expected)
    if not difference < tolerance:
        return fail(f"after steps 4 and 5 your model is up to {difference:.2g} away from the run that never "
                    f"stopped (tolerance {tolerance:g}).",
                    "both the weights and AdamW's state must come from the checkpoint, and nothing may change "
                    "them between the load and the return.",
                    "check that every tensor of the model was loaded, and the learning rate is the job's.")
    shards = len([p for p in os.listdir(folder) if p.endswith(".distcp")])
    return ok(f"resumed from {shards} shard file(s) in one process: after steps 4 and 5 every tensor is within "
              f"{tolerance:g} of the run that never stopped.")
