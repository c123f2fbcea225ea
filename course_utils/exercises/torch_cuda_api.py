"""Checkers for notebook 03 (the torch.cuda API): logical GPU ids, allocated vs reserved, choosing GPUs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..gpus import GpuMemory, NoGpuError, choose_gpus, logical_to_physical
from . import Verdict, fail, ok

__all__ = [
    "ALLOCATION_STEPS",
    "EXPECTED_MEMORY",
    "check_logical_to_physical",
    "check_memory_prediction",
    "check_pick_gpus",
]

# --- 1. physical -> logical ---------------------------------------------------------------------------

_VISIBLE_CASES: list[tuple[str | None, int, str]] = [
    ("2,3", 4, "two GPUs of four"),
    ("3,1", 4, "the order of the list"),
    (None, 2, "the variable unset"),
    ("0", 8, "one GPU of eight"),
    ("", 4, "the variable set to an empty string"),
    ("1,7,2", 4, "an index that does not exist (7 on a 4-GPU machine)"),
]

_VISIBLE_HINTS = {
    "the order of the list": "CUDA keeps the order of the list: the first entry becomes cuda:0, even if its "
                             "number is larger. Do not sort.",
    "the variable unset": "unset (None) means every GPU is visible, in order: [0, 1, ..., n-1].",
    "the variable set to an empty string": "an empty string is *set*: it hides every GPU (this is how the "
                                           "course's tests hide GPUs). Only None means 'unset'.",
    "an index that does not exist (7 on a 4-GPU machine)":
        "CUDA reads the list left to right and stops at the first invalid index: what comes after it is "
        "ignored, not skipped over.",
}


def check_logical_to_physical(fn: Callable[[str | None, int], Any]) -> Verdict:
    """Exercise: ``fn(visible, n_gpus)`` returns the list of physical GPU ids in logical order
    (element i is the physical GPU that the process calls ``cuda:i``)."""
    if not callable(fn):
        return fail(f"expected a function, got {type(fn).__name__}.",
                    "define def logical_to_physical(visible, n_gpus): ... and pass the function itself.")
    for visible, n, what in _VISIBLE_CASES:
        want = logical_to_physical(visible, n)
        call = f"logical_to_physical({visible!r}, {n})"
        try:
            got = fn(visible, n)
        except Exception as exc:  # the student's code: report, do not crash
            return fail(f"{call} raised {type(exc).__name__}: {exc}.",
                        _VISIBLE_HINTS.get(what, "handle every case: unset (None), empty, a list of indices."))
        if isinstance(got, tuple):
            got = list(got)
        if isinstance(got, dict):
            return fail(f"{call} returned a dict; return a list whose element i is the physical id of cuda:i.",
                        "e.g. [2, 3] for '2,3': cuda:0 is physical 2, cuda:1 is physical 3.")
        if not isinstance(got, list) or not all(isinstance(v, int) for v in got):
            return fail(f"{call} returned {got!r}; expected a list of ints such as {want!r}.",
                        "convert each entry with int(...).")
        if got != want:
            hint = _VISIBLE_HINTS.get(what, "element i of the list is the physical id of cuda:i.")
            return fail(f"{call} (testing {what}) returned {got!r}, expected {want!r}.", hint)
    return ok(f"all {len(_VISIBLE_CASES)} cases right, including the empty string and an invalid index.")


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

_MEMORY_HINTS = [
    "a large tensor (10 MiB or more, a multiple of 2 MiB) gets its own segment of exactly its size.",
    "a second tensor that does not fit into a free cached block gets a new segment.",
    "del frees the block for PyTorch, not for the driver: allocated drops, reserved stays (the cache).",
    "the 64 MiB tensor reuses part of x's cached 256 MiB block (the block is split); no new segment.",
    "empty_cache only returns segments that are entirely free; x's segment is still partly used by z.",
    "200 MiB does not fit into the 192 MiB that is left of x's segment, so a new segment is reserved "
    "(fragmentation: 192 MiB cached, and still more is reserved).",
    "once z is gone, x's old segment is entirely free again, and empty_cache returns it.",
]


def check_memory_prediction(answer: Any) -> Verdict:
    """Exercise: a list of 7 pairs ``(allocated_MiB, reserved_MiB)``, one after each step of
    `ALLOCATION_STEPS`, as ``torch.cuda.memory_allocated()`` and ``memory_reserved()`` would report."""
    try:
        pairs = [(float(a), float(r)) for a, r in answer]
    except (TypeError, ValueError):
        return fail(f"expected a list of {len(EXPECTED_MEMORY)} pairs (allocated, reserved) in MiB, "
                    f"got {answer!r}.", "e.g. [(256, 256), (..., ...), ...]: one pair per step.")
    if len(pairs) != len(EXPECTED_MEMORY):
        return fail(f"there are {len(EXPECTED_MEMORY)} steps, you gave {len(pairs)} pairs.",
                    "one (allocated, reserved) pair after each step, in order.")
    for i, ((a, r), (wa, wr)) in enumerate(zip(pairs, EXPECTED_MEMORY, strict=True)):
        if r < a:
            return fail(f"step {i + 1}: reserved ({r:g}) is less than allocated ({a:g}).",
                        "reserved memory holds every allocated block, plus the cache: reserved >= allocated.")
        if (a, r) != (wa, wr):
            part = ("allocated" if a != wa else "") + (" and " if a != wa and r != wr else "") + \
                   ("reserved" if r != wr else "")
            return fail(f"step {i + 1} ({ALLOCATION_STEPS[i]}): {part} is not right "
                        f"(you said allocated {a:g}, reserved {r:g}).", _MEMORY_HINTS[i])
    return ok("every step right: allocated follows your tensors, reserved follows the allocator's segments.")


# --- 3. choosing GPUs -----------------------------------------------------------------------------------

_PICK_CASES: list[tuple[dict[int, int], int, int, str]] = [
    ({0: 2_100, 1: 80_500, 2: 139_000, 3: 81_000}, 2, 80_000, "the example"),
    ({0: 90_000, 1: 100_000, 2: 95_000}, 3, 80_000, "most free first"),
    ({0: 50_000, 1: 60_000, 2: 60_000}, 2, 0, "a tie"),
    ({0: 30_000, 1: 20_000, 2: 70_000}, 1, 40_000, "a GPU that lists first but is too full"),
    ({0: 1_000, 1: 2_000}, 1, 4_000, "too few GPUs with enough memory"),
]


def _expected_pick(free: dict[int, int], n: int, need: int) -> str | None:
    gpus = [GpuMemory(i, f, 143_771) for i, f in free.items()]
    try:
        return choose_gpus(gpus, n, need)
    except NoGpuError:
        return None


def check_pick_gpus(fn: Callable[[dict[int, int], int, int], Any]) -> Verdict:
    """Exercise: ``fn(free_mib, n, need_mib)`` returns the ``CUDA_VISIBLE_DEVICES`` string for the ``n``
    GPUs with the most free memory (at least ``need_mib`` each), most free first, ties to the lower id;
    it raises an exception when fewer than ``n`` GPUs have enough."""
    if not callable(fn):
        return fail(f"expected a function, got {type(fn).__name__}.", "pass the function itself: pick_gpus")
    for free, n, need, what in _PICK_CASES:
        want = _expected_pick(free, n, need)
        call = f"pick_gpus({free}, n={n}, need_mib={need})"
        try:
            got = fn(dict(free), n, need)
        except Exception as exc:  # the student's code: report, do not crash
            if want is None:
                continue
            return fail(f"{call} raised {type(exc).__name__}: {exc}, expected {want!r}.",
                        "only raise when fewer than n GPUs have need_mib free.")
        if want is None:
            return fail(f"{call} returned {got!r}, but no {n} GPU has {need} MiB free.",
                        "raise an exception (e.g. RuntimeError) saying so: a job started on a full GPU "
                        "fails later, with an out-of-memory error.")
        if not isinstance(got, str):
            return fail(f"{call} returned {type(got).__name__} {got!r}, not a string.",
                        "CUDA_VISIBLE_DEVICES is a string: ','.join(str(i) for i in ids).")
        normalised = got.replace(" ", "")
        if normalised == want:
            continue
        ids = normalised.split(",")
        if sorted(ids) == sorted(want.split(",")):
            hint = ("the right GPUs in the wrong order: most free memory first (it becomes cuda:0)"
                    + ("; on a tie, the lower id first." if what == "a tie" else "."))
        elif what == "a GPU that lists first but is too full" or any(
                i.isdigit() and int(i) in free and free[int(i)] < need for i in ids):
            hint = "leave out GPUs with less than need_mib free."
        elif len(ids) != n:
            hint = f"return exactly n={n} ids."
        else:
            hint = "sort the ids by free memory, largest first: sorted(free, key=lambda i: -free[i])."
        return fail(f"{call} (testing {what}) returned {got!r}, expected {want!r}.", hint)
    return ok(f"all {len(_PICK_CASES)} cases right: most free first, too-full GPUs left out, and an error "
              "when there are not enough.")
