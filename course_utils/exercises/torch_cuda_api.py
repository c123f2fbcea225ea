"""Checkers for notebook 03 (the torch.cuda API): logical GPU ids, allocated vs reserved, choosing GPUs.

Each failing verdict names the mistake of the answer it was given (with the values it returned), a hint
that names the concept (a question, or the lesson's section), and a closer hint nearer to the code, shown
when the student asks (``%hint``) or fails the same exercise again.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

from ..formatting import short_repr
from ..hardware.gpus import GpuMemory, NoGpuError, choose_gpus, logical_to_physical
from . import Verdict, exercise, fail, ok

__all__ = [
    "ALLOCATION_STEPS",
    "EXPECTED_MEMORY",
    "check_logical_to_physical",
    "check_memory_prediction",
    "check_pick_gpus",
]



def _int_list(value: Any) -> list[int] | None:
    """``value`` as a list of ints when it is a list, tuple or range of whole numbers (not bools); else None."""
    if not isinstance(value, (list, tuple, range)):
        return None
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value):
        return None
    return [int(v) for v in value]


# --- 1. physical -> logical ---------------------------------------------------------------------------

_VISIBLE_CASES: list[tuple[str | None, int, str]] = [
    ("2,3", 4, "two GPUs of four"),
    ("3,1", 4, "the order of the list"),
    (None, 2, "the variable unset"),
    ("0", 8, "one GPU of eight"),
    ("", 4, "the variable set to an empty string"),
    ("1,7,2", 4, "an index that does not exist (7 on a 4-GPU machine)"),
    ("1,4,0", 4, "an index equal to the number of GPUs (4 on a 4-GPU machine)"),
    ("6,0,5", 8, "an 8-GPU machine"),
]
"""(CUDA_VISIBLE_DEVICES, GPUs in the machine, what the case tests). The last two catch an off-by-one in
the validity test and an answer that assumes the lesson's 4-GPU table."""

_TABLE = "section 2's table"


def _visible_feedback(visible: str | None, n: int, got: list[int], want: list[int]) -> tuple[str, str, str]:
    """(what is wrong, hint, closer hint) for a list of ints ``got`` that is not ``want``."""
    if visible is None:
        return (f"for an unset variable it gave {got}.",
                f"What does a process see when CUDA_VISIBLE_DEVICES is not set at all? ({_TABLE}, first row)",
                "Unset (None) hides nothing: every GPU of the machine, numbered as nvidia-smi does, so the "
                "list has n_gpus entries.")
    if visible == "":
        what = "every GPU, as if the variable were unset" if got == list(range(n)) else f"{got}"
        return (f"for an empty string it gave {what}.",
                f"Is an empty string the same as 'not set'? ({_TABLE}, row \"\")",
                "Only None means unset. \"\" is set, and lists no GPU; a test like `if not visible` is true "
                "for both.")
    entries = visible.split(",")
    too_big = [v for v in got if v >= n]
    if too_big:
        equal = any(v == n for v in too_big)
        return (f"it kept {', '.join(map(str, too_big))}, but a machine with {n} GPUs has GPUs 0 to {n - 1} only.",
                "Which ids exist on a machine with n_gpus GPUs, and what does CUDA do at an id that does "
                f"not exist? ({_TABLE}, row 1,7,2)",
                ("An id equal to n_gpus is already invalid (ids start at 0). " if equal else "")
                + "Read the entries left to right and stop at the first invalid one.")
    if sorted(got) == sorted(want):
        return (f"the right GPUs, in another order than the list {visible!r}.",
                f"Which GPU does the process call cuda:0? ({_TABLE}, row 3,1)",
                "Element i of your list is the i-th entry of the string, in the string's order: nothing "
                "may reorder them (no sorting, no set).")
    kept_after = [v for v in got if v not in want]
    if kept_after and len(got) > len(want):
        stop = next(e for e in entries if not (e.strip().isdigit() and int(e) < n))
        return (f"it left out {stop.strip()} and kept {', '.join(map(str, kept_after))}, which comes after it.",
                f"What does CUDA do with the entries after an invalid one? ({_TABLE}, row 1,7,2)",
                "The list ends at the first invalid entry: stop reading there rather than filtering it "
                "out and going on.")
    if got == list(range(len(got))) and len(got) == len(want):
        return (f"these are the logical ids cuda:0 to cuda:{len(got) - 1}, not the physical GPUs behind them.",
                "Which ids does CUDA_VISIBLE_DEVICES list, physical or logical? (section 2)",
                "The entries of the variable are physical ids; their position in your list is the logical id.")
    dropped = [v for v in want if v not in got]
    if dropped:
        return (f"it left out {', '.join(map(str, dropped))}, which exist on a machine with {n} GPUs.",
                "Which ids exist on a machine with n_gpus GPUs? Does your test use n_gpus, or a number "
                "from the lesson's 4-GPU table?",
                "An id is valid when 0 <= id < n_gpus, with n_gpus the function's argument.")
    return (f"that is not the list of physical ids in logical order (expected {want}).",
            f"Element i of the list is the physical id of cuda:i ({_TABLE}).",
            "Go through the string's entries in order, and turn each into the id of one GPU.")


@exercise
def check_logical_to_physical(fn: Callable[[str | None, int], Any]) -> Verdict:
    """Exercise: ``fn(visible, n_gpus)`` returns the list of physical GPU ids in logical order
    (element i is the physical GPU that the process calls ``cuda:i``), by the rules of section 2's table.

    A tuple or a range of ints is accepted as well as a list. Cases beyond the table: an index equal to the
    number of GPUs (already invalid), and an 8-GPU machine (so that a bound of 4 taken from the table fails).
    """
    if not callable(fn):
        return fail(f"expected a function, got {type(fn).__name__} {short_repr(fn, 40)}.",
                    "Pass the function itself, not its result.",
                    "check_logical_to_physical(logical_to_physical): no parentheses after the name.")
    for visible, n, what in _VISIBLE_CASES:
        want = logical_to_physical(visible, n)
        call = f"logical_to_physical({visible!r}, {n})"
        try:
            got = fn(visible, n)
        except Exception as exc:  # the student's code: report, do not crash
            raised = f"{call} raised {type(exc).__name__}: {exc}."
            if visible is None:
                return fail(raised + " None means the variable is not set: there is no string to split.",
                            f"What does a process see when CUDA_VISIBLE_DEVICES is not set at all? "
                            f"({_TABLE}, first row)",
                            "Handle visible is None before splitting: every GPU of the machine, in order.")
            if visible == "":
                return fail(raised + " An empty string has no GPU id in it.",
                            f"An empty string is set: which GPUs does it leave visible? ({_TABLE}, row \"\")",
                            "\"\".split(',') gives one empty entry: an entry that is not a number ends the list.")
            return fail(raised, f"Case tested: {what}. Which rule of {_TABLE} applies to it?",
                        "Every entry of the string is either a valid id (0 <= id < n_gpus) or the end of the list.")
        if isinstance(got, dict):
            return fail(f"{call} returned a dict {short_repr(got, 40)}, not a list.",
                        "Element i of the list is the physical id of cuda:i: the position is the logical id.",
                        "Return a list such as [2, 3] for '2,3' (cuda:0 is physical 2, cuda:1 physical 3).")
        ids = _int_list(got)
        if ids is None:
            strings = isinstance(got, (list, tuple)) and any(isinstance(v, str) for v in got)
            return fail(f"{call} returned {short_repr(got)}: "
                        + ("strings, not ints." if strings else "not a list of ints."),
                        "A GPU id is a number; the variable's value is text. What type is each entry?",
                        "Turn each entry of the string into an int before putting it in the list.")
        if ids != want:
            message, hint, closer = _visible_feedback(visible, n, ids, want)
            return fail(f"{call} (testing {what}) returned {ids}: {message}", hint, closer)
    return ok(f"all {len(_VISIBLE_CASES)} cases right, including the empty string and invalid indices.")


# --- 2. allocated vs reserved -------------------------------------------------------------------------

ALLOCATION_STEPS: list[str] = [
    "x = torch.empty(256 * MiB, dtype=torch.uint8, device='cuda')",
    "y = torch.empty(128 * MiB, dtype=torch.uint8, device='cuda')",
    "del x",
    "z = torch.empty(64 * MiB, dtype=torch.uint8, device='cuda')",
    "torch.cuda.empty_cache()",
    "w = torch.empty(200 * MiB, dtype=torch.uint8, device='cuda')",
    "del z; torch.cuda.empty_cache()",
]
"""The sequence the exercise asks about, run in a fresh process (MiB = 2**20)."""

EXPECTED_MEMORY: list[tuple[int, int]] = [
    (256, 256), (384, 384), (128, 384), (192, 384), (192, 384), (392, 584), (328, 328),
]
"""(allocated, reserved) in MiB after each step, by the caching allocator's rules for large blocks."""

_MiB = 2**20

_RESERVED_HINTS: list[tuple[str, str]] = [  # (hint, closer hint) per step, when reserved is wrong
    ("How big is the segment the allocator reserves for a tensor of more than 10 MiB? (section 5, the "
     "allocator's rules)",
     "A tensor this large gets a segment of its own, its size rounded up to a multiple of 2 MiB; 256 MiB "
     "needs no rounding."),
    ("Is there a free cached block that y could use? If not, where does its memory come from?",
     "Nothing is cached yet, so y gets a new segment of its own size."),
    ("Does del give memory back to the driver, or to PyTorch's cache? (section 5: what reserved counts)",
     "allocated counts live tensors; reserved counts live tensors plus the cache, and x's freed block "
     "stays in the cache."),
    ("Is there a free cached block big enough for z? What does the allocator do with a free block larger "
     "than the tensor? (section 5, the allocator's rules)",
     "z is served from x's cached 256 MiB block, which is split: 64 MiB used, the rest stays free. No new "
     "segment."),
    ("Which segments does empty_cache give back to the driver? (section 5's list of calls)",
     "x's old segment still holds z: it is not entirely free, so empty_cache cannot return it."),
    ("Does a 200 MiB tensor fit into any free cached block? (fragmentation, as in section 5's plot)",
     "The free part of x's old segment is one block, smaller than 200 MiB: w gets a new segment of its own "
     "size, next to the free block."),
    ("After del z, is any segment entirely free? What does empty_cache do with such a segment?",
     "With z gone, x's old segment holds no tensor; empty_cache returns all of it, and only the segments of "
     "the tensors still alive stay."),
]


def _num(value: float) -> str:
    """A MiB figure as the student wrote it: 256, 268435456, 268.435456 (no exponent, no float noise)."""
    if not math.isfinite(value):
        return str(value)
    return str(int(value)) if value == int(value) else f"{value:.6f}".rstrip("0")


def _move(name: str, before: float, after: float) -> str:
    if not math.isfinite(after):
        return f"{name} at {after} MiB"
    if after == before:
        return f"{name} staying at {_num(after)} MiB"
    return f"{name} {'growing' if after > before else 'dropping'} from {_num(before)} to {_num(after)} MiB"


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=0.0, abs_tol=1e-6)


@exercise
def check_memory_prediction(answer: Any) -> Verdict:
    """Exercise: a list of 7 pairs ``(allocated_MiB, reserved_MiB)``, one after each step of
    `ALLOCATION_STEPS`, as ``torch.cuda.memory_allocated()`` and ``memory_reserved()`` would report.

    Any sequence of pairs of numbers is accepted (tuples, lists, a numpy array of shape (7, 2)); each value
    is compared with the allocator's (whole MiB) within 1e-6 MiB, so 256.0 and 2**28 / 2**20 are right.
    The first wrong step is reported, with what the answer claims happened at it.
    """
    n = len(EXPECTED_MEMORY)
    try:
        pairs = [(float(a), float(r)) for a, r in answer]
    except (TypeError, ValueError):
        return fail(f"expected a list of {n} pairs (allocated, reserved) in MiB, got {short_repr(answer)}.",
                    "One pair per step, in the order of the steps.",
                    "prediction = [(allocated_1, reserved_1), (allocated_2, reserved_2), ...]: numbers in MiB.")
    if len(pairs) != n:
        return fail(f"there are {n} steps, you gave {len(pairs)} pairs.",
                    "One (allocated, reserved) pair after each step, in order.",
                    "Count the lines printed by the cell above the exercise: one pair for each.")
    before = (0.0, 0.0)
    for i, ((a, r), (wa, wr)) in enumerate(zip(pairs, EXPECTED_MEMORY, strict=True)):
        step = f"step {i + 1} ({ALLOCATION_STEPS[i]})"
        if _close(a, wa * _MiB) or _close(r, wr * _MiB):
            return fail(f"{step}: you gave {_num(a)}, {_num(r)}: that is bytes, and the exercise asks MiB.",
                        "How many bytes are in a MiB?",
                        "Divide by MiB = 2**20 (not 10**6).")
        if _close(a, wa * _MiB / 1e6) or _close(r, wr * _MiB / 1e6):
            return fail(f"{step}: you gave {_num(a)}, {_num(r)}: that is MB (10**6 bytes), not MiB.",
                        "A MiB is 2**20 bytes, a MB 10**6: which one do the steps use?",
                        "Count in MiB: 256 * MiB bytes is 256 MiB.")
        if r < a:
            swapped = _close(r, wa) and _close(a, wr)
            return fail(f"{step}: you have reserved ({_num(r)}) less than allocated ({_num(a)})"
                        + ("; the two look swapped." if swapped else "."),
                        "Reserved memory holds every live tensor plus the cache: can it be smaller than "
                        "allocated?",
                        "Each pair is (allocated, reserved), in that order, and reserved >= allocated at "
                        "every step.")
        a_ok, r_ok = _close(a, wa), _close(r, wr)
        if not a_ok:
            also = f" (and reserved: {_move('reserved', before[1], r)})" if not r_ok else ""
            return fail(f"{step}: allocated is not right: you have {_move('allocated', before[0], a)}{also}.",
                        "allocated counts the bytes of the tensors alive after the step: which are alive, "
                        "and how big is each?",
                        "List the tensors alive after this step and add their sizes; del removes one, "
                        "empty_cache none.")
        if not r_ok:
            hint, closer = _RESERVED_HINTS[i]
            return fail(f"{step}: reserved is not right: you have {_move('reserved', before[1], r)}.",
                        hint, closer)
        before = (a, r)
    return ok("every step right: allocated follows your tensors, reserved follows the allocator's segments.")


# --- 3. choosing GPUs -----------------------------------------------------------------------------------

_PICK_CASES: list[tuple[dict[int, int], int, int, str]] = [
    ({0: 2_100, 1: 80_500, 2: 139_000, 3: 81_000}, 2, 80_000, "the example"),
    ({0: 90_000, 1: 100_000, 2: 95_000}, 3, 80_000, "most free first"),
    ({0: 50_000, 1: 60_000, 2: 60_000}, 2, 0, "a tie"),
    ({3: 60_000, 1: 60_000, 0: 50_000}, 2, 0, "a tie, the higher id listed first"),
    ({0: 40_000, 1: 50_000, 2: 39_999}, 2, 40_000, "a GPU with exactly need_mib free"),
    ({0: 30_000, 1: 20_000, 2: 70_000}, 1, 40_000, "a GPU that lists first but is too full"),
    ({0: 1_000, 1: 2_000}, 1, 4_000, "too few GPUs with enough memory"),
    ({0: 90_000, 1: 10_000, 2: 85_000, 3: 5_000}, 3, 50_000, "some GPUs with enough memory, but fewer than n"),
]
"""(free MiB per GPU id, n, need_mib, what the case tests). Free memory is in whole MiB, as nvidia-smi
reports it; a GPU with exactly need_mib free has enough ("at least"). Dict order is not id order in one tie,
so an answer that relies on the dict's order (a stable sort by free memory only) fails there."""

_ACCIDENTS = (IndexError, KeyError, TypeError, AttributeError, NameError, ZeroDivisionError)
"""Exceptions that come from a bug in the code rather than from a decision to report too few GPUs."""


def _expected_pick(free: dict[int, int], n: int, need: int) -> str | None:
    gpus = [GpuMemory(i, f, 143_771) for i, f in free.items()]
    try:
        return choose_gpus(gpus, n, need)
    except NoGpuError:
        return None


def _parse_ids(text: str) -> list[int] | None:
    parts = text.replace(" ", "").split(",")
    return [int(p) for p in parts] if all(p.isdigit() for p in parts) else None


def _pick_feedback(free: dict[int, int], n: int, need: int, ids: list[int],
                   want: list[int], what: str) -> tuple[str, str, str]:
    """(what is wrong, hint, closer hint) for a pick ``ids`` (ints) that is not ``want``."""
    unknown = [i for i in ids if i not in free]
    if unknown:
        return (f"GPU {unknown[0]} is not in free_mib (its ids are {sorted(free)}).",
                "Where do the ids come from: positions in a list, or the keys of the dict?",
                "Use free_mib's keys as the GPU ids; they need not be 0, 1, 2, ...")
    short = [i for i in ids if free[i] < need]
    if short:
        i = short[0]
        return (f"it includes GPU {i}, which has {free[i]} MiB free, less than need_mib={need}.",
                "Which GPUs can take the job at all?",
                "Leave out every GPU with less than need_mib free before choosing among the others.")
    if len(ids) != n:
        return (f"{len(ids)} id(s) for n={n}.",
                "How many GPUs did the caller ask for?",
                "Return exactly n ids: the first n of your order.")
    if len(set(ids)) != len(ids):
        return ("an id appears twice.", "Can one GPU be two of the job's GPUs?",
                "Each GPU may appear once; take n different ids.")
    if sorted(ids) == sorted(want):
        for a, b in zip(ids, ids[1:], strict=False):
            if free[a] == free[b] and a > b:
                return (f"GPUs {b} and {a} have the same free memory ({free[a]} MiB), and you put {a} first"
                        + (": the dict lists it first, but the dict's order is not a rule." if "listed" in what
                           else "."),
                        "The exercise sets a rule for ties: which id comes first?",
                        "Sort by free memory, largest first, and on a tie by id, smallest first: one sort key "
                        "for both, not the dict's order.")
            if free[a] < free[b]:
                return (f"GPU {a} ({free[a]} MiB free) comes before GPU {b} ({free[b]} MiB free).",
                        "Which GPU becomes cuda:0, and which one should that be? (most free first)",
                        "Sort by free memory, largest first.")
    richer = [i for i in free if i not in ids and free[i] >= need and free[i] > min(free[j] for j in ids)]
    if richer:
        i = richer[0]
        return (f"GPU {i}, with {free[i]} MiB free, was left out for one with less.",
                f"Which {n} GPU(s) have the most free memory?",
                "Order every GPU with enough memory by free memory, largest first, and take the first n.")
    return ("that is not the n GPUs with the most free memory, most free first.",
            "Which GPUs qualify, and in which order? (the exercise's rules)",
            "Filter by need_mib, sort by free memory (largest first, then lower id), take n.")


@exercise
def check_pick_gpus(fn: Callable[[dict[int, int], int, int], Any]) -> Verdict:
    """Exercise: ``fn(free_mib, n, need_mib)`` returns the ``CUDA_VISIBLE_DEVICES`` string for the ``n``
    GPUs with the most free memory (at least ``need_mib`` each: exactly need_mib is enough), most free
    first, ties to the lower id; it raises an error when fewer than ``n`` GPUs have enough.

    Spaces after the commas are accepted. The raised error must be one the code chose to raise (e.g.
    RuntimeError or ValueError): an IndexError, KeyError, TypeError... from a bug does not count. ``fn``
    must not change the dict it is given.
    """
    if not callable(fn):
        return fail(f"expected a function, got {type(fn).__name__} {short_repr(fn, 40)}.",
                    "Pass the function itself, not its result.",
                    "check_pick_gpus(pick_gpus): no parentheses after the name.")
    for free, n, need, what in _PICK_CASES:
        want = _expected_pick(free, n, need)
        enough = [i for i in free if free[i] >= need]
        call = f"pick_gpus({free}, n={n}, need_mib={need})"
        given = dict(free)
        refused = False  # the function raised an error of its own choosing
        try:
            got = fn(given, n, need)
        except Exception as exc:  # the student's code: report, do not crash
            raised = f"{call} (testing {what}) raised {type(exc).__name__}: {exc}"
            if want is None and not isinstance(exc, _ACCIDENTS):
                got, refused = None, True
            elif want is None:
                return fail(raised + f": a bug of the code rather than an error saying that only "
                            f"{len(enough)} GPU(s) have at least {need} MiB free.",
                            "When too few GPUs have enough memory, the function should say so itself: who "
                            "reads the error, and what should it tell them?",
                            "Count the GPUs with enough memory first, and raise an error (e.g. RuntimeError) "
                            "with a message when there are fewer than n.")
            elif isinstance(exc, KeyError):
                return fail(raised + f". The ids of this case are {sorted(free)}.",
                            "Where do the GPU ids come from: positions in a list, or the keys of the dict?",
                            "Use free_mib's keys as the ids; a scheduler may give GPUs 0, 1 and 3, not 0, 1, 2.")
            elif isinstance(exc, _ACCIDENTS):
                return fail(raised + ".", f"Case tested: {what}. Which step of your function fails on it?",
                            "Call pick_gpus with this case in a cell of its own and read the traceback.")
            elif any(free[i] == need for i in free) and len(enough) >= n:
                exact = next(i for i in free if free[i] == need)
                return fail(raised + f", but GPU {exact} has exactly need_mib={need} MiB free, so "
                            f"{len(enough)} GPUs have enough.",
                            "Does a GPU with exactly need_mib free have enough? (\"at least need_mib\")",
                            "'At least' includes the limit: compare with >=.")
            else:
                return fail(raised + f", but {len(enough)} GPU(s) have at least {need} MiB free and n={n}.",
                            "Raise only when the job cannot get n GPUs with enough memory: is that so here?",
                            "Raise when the number of GPUs with enough memory is smaller than n, and only then.")
        if given != free:
            return fail(f"{call} changed the dict it was given: afterwards it was {short_repr(given)}.",
                        "The caller still needs its table of free memory: should choosing GPUs change it?",
                        "Work on a sorted list of the ids (or a copy) instead of deleting from, or writing to, "
                        "free_mib.")
        if want is None:
            if refused:
                continue
            return fail(f"{call} (testing {what}) returned {got!r}, but only {len(enough)} GPU(s) have "
                        f"at least {need} MiB free, fewer than n={n}.",
                        "What happens to a job started on GPUs without enough memory? What should "
                        "pick_gpus do instead of answering? (the exercise's last sentence)",
                        "Raise an error (e.g. RuntimeError) that says how many GPUs qualify; returning fewer "
                        "ids, '' or None starts the job anyway.")
        if got is None or not isinstance(got, str):
            return fail(f"{call} returned {type(got).__name__} {short_repr(got, 40)}, not a string.",
                        "CUDA_VISIBLE_DEVICES is an environment variable: what type is its value?",
                        "Join the ids, as text, with commas: \"2,3\".")
        ids = _parse_ids(got)
        if ids is None:
            return fail(f"{call} returned {got!r}: not ids separated by commas.",
                        "What does CUDA_VISIBLE_DEVICES look like? (section 2)",
                        "Only the ids and commas, like \"2,3\".")
        if ids == [int(i) for i in want.split(",")]:
            continue
        message, hint, closer = _pick_feedback(free, n, need, ids, [int(i) for i in want.split(",")], what)
        return fail(f"{call} (testing {what}) returned {got!r}: {message}", hint, closer)
    return ok(f"all {len(_PICK_CASES)} cases right: most free first, ties to the lower id, too-full GPUs left "
              "out, and an error when there are not enough.")
