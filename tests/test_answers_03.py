"""A catalogue of answers a class would write to the exercises of notebook 03 (torch.cuda API), run
through the checkers (course_utils.exercises.torch_cuda_api).

Each wrong answer must be rejected with a message that names its mistake (a substring of
``verdict.message``), a hint that names the concept (a substring of ``verdict.hint``, and no code in it),
and a closer hint that waits until it is asked for. Each right answer, written differently from the
notebook's solution, must be accepted. The notebook's own solution is taken from its solution cell. At the
end, the checkers' first tests (from tests/test_torch_cuda_api.py).

Takes about 1 s (``pytest tests/test_answers_03.py --durations=5``).
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from answers_helpers import rejected_without_code as rejected
from answers_helpers import solution_value
from conftest import notebook_functions

from course_utils.exercises import Verdict, torch_cuda_api
from course_utils.exercises import data_parallel as dp
from course_utils.exercises import torch_cuda_api as api
from course_utils.hardware import gpus

# === 03 · exercise 1: physical to logical =================================================================

NB03 = notebook_functions("03_torch_cuda_api", ("logical_to_physical", "pick_gpus"), tag="solution")


def l2p_sorted(visible, n):
    return list(range(n)) if visible is None else sorted(int(v) for v in visible.split(",") if v)


def l2p_empty_is_unset(visible, n):
    if not visible:
        return list(range(n))
    out = []
    for v in visible.split(","):
        if int(v) >= n:
            break
        out.append(int(v))
    return out


def l2p_skips_invalid(visible, n):
    if visible is None:
        return list(range(n))
    return [int(v) for v in visible.split(",") if v and int(v) < n]


def l2p_keeps_invalid(visible, n):
    return list(range(n)) if visible is None else [int(v) for v in visible.split(",") if v]


def l2p_off_by_one(visible, n):  # a value exactly on the limit: id == n_gpus
    if visible is None:
        return list(range(n))
    out = []
    for v in visible.split(","):
        if not v or int(v) > n:
            break
        out.append(int(v))
    return out


def l2p_four_gpus(visible, n):  # right for the lesson's 4-GPU table only
    if visible is None:
        return list(range(n))
    out = []
    for v in visible.split(","):
        if not v or int(v) >= 4:
            break
        out.append(int(v))
    return out


def l2p_strings(visible, n):
    return [str(i) for i in range(n)] if visible is None else [v for v in visible.split(",") if v]


def l2p_stub(visible, n):  # the exercise cell's starting point
    return [int(v) for v in visible.split(",")]


def l2p_logical_ids(visible, n):
    if visible is None:
        return list(range(n))
    return list(range(len(_valid_prefix(visible, n))))


def _valid_prefix(visible, n):
    out = []
    for v in visible.split(","):
        if not v.strip().isdigit() or int(v) >= n:
            break
        out.append(int(v))
    return out


_LESSON_TABLE = {"2,3": [2, 3], "3,1": [3, 1], "": [], "1,7,2": [1]}


def l2p_lesson_table(visible, n):  # right for the rows of the lesson's table only
    return list(range(n)) if visible is None else _LESSON_TABLE[visible]


L2P_WRONG = [
    (l2p_sorted, "in another order than the list '3,1'", "cuda:0"),
    (l2p_empty_is_unset, "as if the variable were unset", "empty string"),
    (l2p_skips_invalid, "left out 7 and kept 2, which comes after it", "after an invalid one"),
    (l2p_keeps_invalid, "kept 7, but a machine with 4 GPUs has GPUs 0 to 3 only", "does not exist"),
    (l2p_off_by_one, "kept 4, but a machine with 4 GPUs has GPUs 0 to 3 only", "Which ids exist"),
    (l2p_four_gpus, "left out 6, 0, 5, which exist on a machine with 8 GPUs", "4-GPU table"),
    (l2p_strings, "strings, not ints", "What type is each entry"),
    (l2p_stub, "raised AttributeError", "not set at all"),
    (l2p_logical_ids, "logical ids cuda:0 to cuda:1, not the physical GPUs", "physical or logical"),
    (l2p_lesson_table, "logical_to_physical('0', 8) raised KeyError", "Which rule of section 2's table"),
]


@pytest.mark.parametrize(("answer", "mistake", "concept"), L2P_WRONG, ids=[a.__name__ for a, *_ in L2P_WRONG])
def test_logical_to_physical_wrong(answer: Callable, mistake: str, concept: str) -> None:
    rejected(api.check_logical_to_physical(answer), mistake, concept)


def l2p_takewhile(visible, n_gpus):
    if visible is None:
        return list(range(n_gpus))
    entries = (e.strip() for e in visible.split(","))
    return [int(e) for e in itertools.takewhile(lambda e: e.isdigit() and int(e) < n_gpus, entries)]


def l2p_try_except(visible, n_gpus):
    if visible is None:
        return tuple(range(n_gpus))  # a tuple is accepted too
    ids: list[int] = []
    for entry in visible.split(","):
        try:
            index = int(entry)
        except ValueError:
            return tuple(ids)
        if not 0 <= index < n_gpus:
            return tuple(ids)
        ids.append(index)
    return tuple(ids)


def l2p_regex(visible, n_gpus):
    if visible is None:
        return range(n_gpus)  # a range is accepted too
    match = re.match(r"^(\d+(,\d+)*)", visible)
    out = []
    for v in (match.group(1).split(",") if match else []):
        if int(v) >= n_gpus:
            break
        out.append(int(v))
    return out


@pytest.mark.parametrize("answer", [NB03["logical_to_physical"], l2p_takewhile,
                                    l2p_try_except, l2p_regex, gpus.logical_to_physical],
                         ids=["notebook", "takewhile", "try_except", "regex", "course_utils"])
def test_logical_to_physical_right(answer: Callable) -> None:
    verdict = api.check_logical_to_physical(answer)
    assert verdict, str(verdict)


RIGHT_MEMORY = solution_value("03_torch_cuda_api", "prediction")


R = list(RIGHT_MEMORY)


MEMORY_WRONG = {
    "no cache (reserved = allocated)": ([(a, a) for a, _ in R], "reserved dropping from 384 to 128", "cache"),
    "del gives memory to the driver, z in a new segment":
        (R[:2] + [(128, 384), (192, 448)] + R[4:], "reserved growing from 384 to 448", "free cached block"),
    "empty_cache frees a split segment": (R[:4] + [(192, 192)] + R[5:], "reserved dropping from 384 to 192",
                                          "empty_cache"),
    "w fits in the hole": (R[:5] + [(392, 384)] + R[6:], "reserved (384) less than allocated (392)",
                           "smaller than allocated"),
    "w reuses part of the hole": (R[:5] + [(392, 392)] + R[6:], "reserved growing from 384 to 392",
                                  "fragmentation"),
    "empty_cache after del z returns nothing": (R[:6] + [(328, 584)], "reserved staying at 584", "entirely free"),
    "allocated kept after del": (R[:2] + [(384, 384)] + R[3:], "allocated staying at 384", "tensors alive"),
    "in bytes": ([(a * 2**20, r * 2**20) for a, r in R], "that is bytes", "bytes are in a MiB"),
    "in MB": ([(a * 2**20 / 1e6, r * 2**20 / 1e6) for a, r in R], "that is MB", "2**20 bytes"),
    "pairs swapped": ([(r, a) for a, r in R], "the two look swapped", "smaller than allocated"),
    "six pairs": (R[:6], "there are 7 steps, you gave 6 pairs", "One (allocated, reserved) pair"),
    "flat list": ([256, 256, 384, 384], "expected a list of 7 pairs", "One pair per step"),
}


@pytest.mark.parametrize("case", MEMORY_WRONG)
def test_memory_prediction_wrong(case: str) -> None:
    answer, mistake, concept = MEMORY_WRONG[case]
    rejected(api.check_memory_prediction(answer), mistake, concept)


@pytest.mark.parametrize("answer", [
    RIGHT_MEMORY,
    np.array(api.EXPECTED_MEMORY),                                            # a (7, 2) array
    [[a * 2**20 / 2**20, r * 2**20 / 2**20] for a, r in api.EXPECTED_MEMORY],  # lists of floats, from bytes
    tuple((float(a), r + 1e-7) for a, r in api.EXPECTED_MEMORY),             # within the stated 1e-6 MiB
], ids=["notebook", "numpy", "from_bytes", "tolerance"])
def test_memory_prediction_right(answer: Any) -> None:
    verdict = api.check_memory_prediction(answer)
    assert verdict, str(verdict)


def _qualifying(free, need):
    return sorted((i for i in free if free[i] >= need), key=lambda i: (-free[i], i))


def pick_stub(free, n, need):  # the exercise cell's starting point
    return ",".join(str(i) for i in list(free)[:n])


def pick_ascending(free, n, need):
    ids = sorted((i for i in free if free[i] >= need), key=lambda i: free[i])
    if len(ids) < n:
        raise RuntimeError("not enough GPUs")
    return ",".join(str(i) for i in ids[:n])


def pick_ignores_need(free, n, need):
    return ",".join(str(i) for i in _qualifying(free, 0)[:n])


def pick_strictly_more(free, n, need):  # a value exactly on the limit: free == need_mib
    ids = sorted((i for i in free if free[i] > need), key=lambda i: (-free[i], i))
    if len(ids) < n:
        raise RuntimeError("not enough GPUs")
    return ",".join(str(i) for i in ids[:n])


def pick_dict_order(free, n, need):  # ties right only when the dict lists the lower id first
    ids = sorted((i for i in free if free[i] >= need), key=lambda i: free[i], reverse=True)
    if len(ids) < n:
        raise RuntimeError("not enough GPUs")
    return ",".join(str(i) for i in ids[:n])


def pick_tie_to_higher(free, n, need):
    pairs = sorted(((free[i], i) for i in free if free[i] >= need), reverse=True)
    if len(pairs) < n:
        raise RuntimeError("not enough GPUs")
    return ",".join(str(i) for _, i in pairs[:n])


def pick_positions(free, n, need):  # right only when the ids are 0, 1, 2, ...
    ids = sorted((i for i in range(len(free)) if free[i] >= need), key=lambda i: (-free[i], i))
    if len(ids) < n:
        raise RuntimeError("not enough GPUs")
    return ",".join(str(i) for i in ids[:n])


def pick_deletes(free, n, need):  # changes its input in place
    chosen = []
    for _ in range(n):
        best = max(sorted(free), key=lambda i: free[i])
        if free[best] < need:
            raise RuntimeError("not enough GPUs")
        chosen.append(best)
        del free[best]
    return ",".join(str(i) for i in chosen)


def pick_index_error(free, n, need):  # "raises" when too few, by accident
    ids = _qualifying(free, need)
    return ",".join(str(ids[k]) for k in range(n))


def pick_raises_when_none(free, n, need):
    ids = _qualifying(free, need)
    if not ids:
        raise RuntimeError("no GPU has enough memory")
    return ",".join(str(i) for i in ids[:n])


def pick_raises_too_early(free, n, need):
    ids = _qualifying(free, need)
    if len(ids) <= n and n > 1:
        raise RuntimeError("not enough GPUs")
    if not ids:
        raise RuntimeError("not enough GPUs")
    return ",".join(str(i) for i in ids[:n])


def pick_list(free, n, need):
    ids = _qualifying(free, need)
    if len(ids) < n:
        raise RuntimeError("not enough GPUs")
    return ids[:n]


PICK_WRONG = [
    (pick_stub, "it includes GPU 0, which has 2100 MiB free, less than need_mib=80000", "take the job at all"),
    (pick_ascending, "GPU 2, with 139000 MiB free, was left out for one with less", "most free memory"),
    (pick_ignores_need, "only 0 GPU(s) have at least 4000 MiB free, fewer than n=1", "instead of answering"),
    (pick_strictly_more, "GPU 0 has exactly need_mib=40000 MiB free, so 2 GPUs have enough", "exactly need_mib"),
    (pick_dict_order, "you put 3 first: the dict lists it first", "rule for ties"),
    (pick_tie_to_higher, "(testing a tie) returned '2,1'", "rule for ties"),
    (pick_positions, "raised KeyError: 2. The ids of this case are [0, 1, 3]", "keys of the dict"),
    (pick_deletes, "changed the dict it was given", "table of free memory"),
    (pick_index_error, "raised IndexError", "say so itself"),
    (pick_raises_when_none, "returned '0,2', but only 2 GPU(s) have at least 50000 MiB free, fewer than n=3",
     "instead of answering"),
    (pick_raises_too_early, "but 3 GPU(s) have at least 80000 MiB free and n=3", "Raise only when"),
    (pick_list, "returned list [2, 3], not a string", "what type is its value"),
]


@pytest.mark.parametrize(("answer", "mistake", "concept"), PICK_WRONG, ids=[a.__name__ for a, *_ in PICK_WRONG])
def test_pick_gpus_wrong(answer: Callable, mistake: str, concept: str) -> None:
    rejected(api.check_pick_gpus(answer), mistake, concept)


def pick_heapq(free_mib, n, need_mib):
    fits = [i for i, f in free_mib.items() if f >= need_mib]
    if len(fits) < n:
        raise ValueError(f"{len(fits)} GPUs have {need_mib} MiB free, {n} asked for")
    return ", ".join(map(str, heapq.nlargest(n, fits, key=lambda i: (free_mib[i], -i))))  # spaces: fine


def pick_items(free_mib, n, need_mib):
    ranked = sorted(free_mib.items(), key=lambda kv: (-kv[1], kv[0]))
    chosen = [gpu for gpu, free in ranked if free >= need_mib][:n]
    if len(chosen) != n:
        raise RuntimeError("too few GPUs with enough free memory")
    return ",".join(f"{gpu}" for gpu in chosen)


def pick_course_utils(free_mib, n, need_mib):
    return gpus.choose_gpus([gpus.GpuMemory(i, f, 143_771) for i, f in free_mib.items()], n, need_mib)


@pytest.mark.parametrize("answer", [NB03["pick_gpus"], pick_heapq, pick_items,
                                    pick_course_utils], ids=["notebook", "heapq", "items", "course_utils"])
def test_pick_gpus_right(answer: Callable) -> None:
    verdict = api.check_pick_gpus(answer)
    assert verdict, str(verdict)


# === every checker of notebook 03 (test_answers_04.py: notebook 04's) ======================================

@pytest.mark.parametrize("checker", [api.check_logical_to_physical, api.check_pick_gpus])
def test_not_a_function(checker: Callable[..., Verdict]) -> None:
    rejected(checker("2,3"), "expected a function, got str", "function itself")


def test_every_checker_counts_failures_for_the_closer_hint() -> None:
    """All public checkers are decorated with `exercise`: the second failure shows the closer hint."""
    for module in (api, dp):
        for name in module.__all__:
            if name.startswith("check_"):
                checker = getattr(module, name)
                assert checker.__wrapped__, f"{module.__name__}.{name} is not decorated with @exercise"
    assert "Closer hint:" not in str(api.check_pick_gpus(pick_stub))
    assert "Closer hint:" in str(api.check_pick_gpus(pick_ascending))


# --- the checkers' first tests (from tests/test_torch_cuda_api.py) -------------------------------------------

def test_check_logical_to_physical():
    assert torch_cuda_api.check_logical_to_physical(gpus.logical_to_physical)

    def sorted_ids(visible, n):
        return list(range(n)) if visible is None else sorted(int(v) for v in visible.split(",") if v)

    def empty_means_all(visible, n):
        return list(range(n)) if not visible else [int(v) for v in visible.split(",")]

    def skips_invalid(visible, n):
        if visible is None:
            return list(range(n))
        return [int(v) for v in visible.split(",") if v and int(v) < n]

    def crashes_on_none(visible, n):
        return [int(v) for v in visible.split(",") if v]

    v = torch_cuda_api.check_logical_to_physical(sorted_ids)
    assert not v and "another order than the list" in v.message and "cuda:0" in v.hint
    v = torch_cuda_api.check_logical_to_physical(empty_means_all)
    assert not v and "as if the variable were unset" in v.message and "empty string" in v.hint
    v = torch_cuda_api.check_logical_to_physical(skips_invalid)
    assert not v and "left out 7 and kept 2" in v.message and "after an invalid one" in v.hint
    v = torch_cuda_api.check_logical_to_physical(crashes_on_none)
    assert not v and "raised AttributeError" in v.message and "not set at all" in v.hint
    v = torch_cuda_api.check_logical_to_physical(lambda visible, n: {0: 2, 1: 3})
    assert not v and "dict" in v.message
    assert not torch_cuda_api.check_logical_to_physical("2,3")


def test_check_memory_prediction():
    right = list(torch_cuda_api.EXPECTED_MEMORY)
    assert torch_cuda_api.check_memory_prediction(right)
    assert torch_cuda_api.check_memory_prediction([(float(a), float(r)) for a, r in right])
    # del gives memory back to the driver (it does not)
    wrong = right[:2] + [(128, 128)] + right[3:]
    v = torch_cuda_api.check_memory_prediction(wrong)
    assert not v and "step 3" in v.message and "reserved dropping from 384 to 128" in v.message and "cache" in v.hint
    # empty_cache releases a split segment (it does not)
    wrong = right[:4] + [(192, 192)] + right[5:]
    v = torch_cuda_api.check_memory_prediction(wrong)
    assert not v and "step 5" in v.message and "empty_cache" in v.hint and "entirely free" in v.closer
    # w reuses the 192 MiB that is left (it cannot)
    wrong = right[:5] + [(392, 392)] + right[6:]
    v = torch_cuda_api.check_memory_prediction(wrong)
    assert not v and "step 6" in v.message and "fragmentation" in v.hint
    v = torch_cuda_api.check_memory_prediction([(a, a) for a, _ in right])
    assert not v and "step 3" in v.message
    v = torch_cuda_api.check_memory_prediction([(256, 0)] + right[1:])
    assert not v and "less than allocated" in v.message
    assert not torch_cuda_api.check_memory_prediction(right[:5])
    assert not torch_cuda_api.check_memory_prediction("256, 256")
    assert not torch_cuda_api.check_memory_prediction(None)


def _reference_pick(free, n, need):
    ids = sorted((i for i in free if free[i] >= need), key=lambda i: (-free[i], i))
    if len(ids) < n:
        raise RuntimeError(f"only {len(ids)} GPUs have {need} MiB free")
    return ",".join(str(i) for i in ids[:n])


def test_check_pick_gpus():
    assert torch_cuda_api.check_pick_gpus(_reference_pick)
    assert torch_cuda_api.check_pick_gpus(lambda f, n, need: _reference_pick(f, n, need).replace(",", ", "))

    def first_n(free, n, need):
        return ",".join(str(i) for i in list(free)[:n])

    def ascending(free, n, need):
        ids = sorted((i for i in free if free[i] >= need), key=lambda i: free[i])
        if len(ids) < n:
            raise RuntimeError
        return ",".join(str(i) for i in ids[:n])

    def ignores_need(free, n, need):
        return _reference_pick(free, n, 0)

    def as_list(free, n, need):
        return [int(i) for i in _reference_pick(free, n, need).split(",")]

    def tie_to_higher(free, n, need):
        ids = sorted((i for i in free if free[i] >= need), key=lambda i: (free[i], i), reverse=True)
        if len(ids) < n:
            raise RuntimeError
        return ",".join(str(i) for i in ids[:n])

    v = torch_cuda_api.check_pick_gpus(first_n)
    assert not v and "the example" in v.message and "includes GPU 0" in v.message
    v = torch_cuda_api.check_pick_gpus(ascending)
    assert not v and "GPU 2, with 139000 MiB free, was left out for one with less" in v.message
    v = torch_cuda_api.check_pick_gpus(ignores_need)
    assert not v and "only 0 GPU(s) have at least 4000 MiB free" in v.message and "instead of answering" in v.hint
    v = torch_cuda_api.check_pick_gpus(as_list)
    assert not v and "not a string" in v.message
    v = torch_cuda_api.check_pick_gpus(tie_to_higher)
    assert not v and "a tie" in v.message and "you put 2 first" in v.message and "rule for ties" in v.hint
    v = torch_cuda_api.check_pick_gpus(lambda f, n, need: 1 / 0)
    assert not v and "ZeroDivisionError" in v.message
