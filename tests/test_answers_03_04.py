"""A catalogue of answers a class would write to the exercises of notebooks 03 (torch.cuda API) and 04
(DataParallel), run through the checkers.

Each wrong answer must be rejected with a message that names its mistake (a substring of
``verdict.message``), a hint that names the concept (a substring of ``verdict.hint``, and no code in it),
and a closer hint that waits until it is asked for. Each right answer, written differently from the
notebook's solution, must be accepted. The notebook's own solution is taken from its solution cell.

Takes about 1 s (``pytest tests/test_answers_03_04.py --durations=5``).
"""

from __future__ import annotations

import copy
import heapq
import itertools
import json
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from conftest import ROOT, notebook_functions, notebook_solution
from torch import nn

from course_utils import exercises
from course_utils.hardware import gpus
from course_utils.exercises import Verdict
from course_utils.exercises import data_parallel as dp
from course_utils.exercises import torch_cuda_api as api
from course_utils.distributed.data_parallel import chunk_sizes

CODE_IN_HINT = re.compile(r"isinstance\(|hasattr\(|getattr\(|torch\.cat|\.chunk\(|sorted\(|\bint\(|\bdef |return |"
                          r"lambda|>=|\.join|\.split\(|range\(|\[.*for .* in")
"""What a first hint must not contain: a call or a line of the answer."""


def rejected(verdict: Verdict, mistake: str, concept: str) -> None:
    """``verdict`` fails, its message names ``mistake``, its hint ``concept``; the closer hint waits."""
    assert not verdict, f"a wrong answer was accepted: {verdict}"
    assert mistake in verdict.message, verdict.message
    assert concept in verdict.hint, verdict.hint
    assert not CODE_IN_HINT.search(verdict.hint), f"the first hint gives code: {verdict.hint}"
    assert verdict.closer and verdict.closer != verdict.hint
    shown = str(verdict)
    assert verdict.closer not in shown and exercises.ASK in shown  # asked for with %hint, or a second failure


def solution_value(stem: str, name: str) -> Any:
    """The value ``name`` that a notebook's solution cell assigns (for exercises answered with data)."""
    nb = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if "solution" in cell["metadata"].get("tags", []) and re.search(rf"^{name} = ", source, re.M):
            namespace: dict[str, Any] = {}
            code = "\n".join(line for line in source.splitlines() if not re.match(r"[\w.]*check_\w+\(", line))
            exec(code, namespace)
            return namespace[name]
    raise LookupError(f"{stem} has no solution cell assigning {name}")


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


# === 03 · exercise 2: allocated vs reserved ===============================================================

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


# === 03 · exercise 3: pick GPUs ============================================================================

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


# === 04 · 7.1: predict the chunks ===========================================================================

RIGHT_CHUNKS = solution_value("04_data_parallel", "predictions")
CHUNKS_WRONG = {
    "balanced over every GPU (9, 4)": ({**RIGHT_CHUNKS, (9, 4): [3, 2, 2, 2]}, (9, 4),
                                       "spreads the samples over all 4 GPUs as evenly as possible",
                                       "choose the size"),
    "balanced everywhere": ({c: [len(p) for p in np.array_split(np.arange(c[0]), c[1])] for c in dp.CHUNK_CASES},
                            (9, 4), "as evenly as possible", "torch.chunk"),
    "floor division": ({**RIGHT_CHUNKS, (9, 4): [2, 2, 2, 2, 1]}, (9, 4), "5 chunks for 4 GPUs",
                       "one GPU take"),
    "short chunk first": ({**RIGHT_CHUNKS, (17, 3): [5, 6, 6]}, (17, 3), "the sizes are right, their order is not",
                          "leave short"),
    "remainder dropped": ({**RIGHT_CHUNKS, (9, 4): [2, 2, 2, 2]}, (9, 4), "add up to 8, but the batch has 9",
                          "lose a sample"),
    "an empty chunk for the idle GPU": ({**RIGHT_CHUNKS, (3, 4): [1, 1, 1, 0]}, (3, 4), "a chunk of 0 samples",
                                        "without samples"),
    "empty chunks for every idle GPU": ({**RIGHT_CHUNKS, (10, 8): [2, 2, 2, 2, 2, 0, 0, 0]}, (10, 8),
                                        "a chunk of 0 samples", "without samples"),
    "the chunk size of another case": ({**RIGHT_CHUNKS, (10, 8): [3, 3, 3, 1]}, (10, 8),
                                       "uses chunks of 3 samples", "choose the size"),
    "half samples": ({**RIGHT_CHUNKS, (16, 4): [4.5, 4.5, 4, 3]}, (16, 4), "not a list of whole numbers",
                     "what kind of number"),
    "a fraction that int() would cut off": ({**RIGHT_CHUNKS, (16, 4): [4.9, 4, 4, 4]}, (16, 4),
                                             "not a list of whole numbers", "what kind of number"),
    "a string": ({**RIGHT_CHUNKS, (9, 4): "3,3,3"}, (9, 4), "not a list of whole numbers", "what kind of number"),
    "not filled in": ({**RIGHT_CHUNKS, (17, 3): ...}, (17, 3), "not filled in yet", "rule of section 4"),
    # item 5 of the second student run: a case the exercise did not ask about, with a wrong prediction
    "a wrong extra case": ({**RIGHT_CHUNKS, (5, 2): [9]}, (5, 2),
                           "(5, 2) is not a case of the exercise, but your prediction for it is wrong: your chunks "
                           "add up to 9, but the batch has 5", "lose a sample"),
    "an extra case in halves": ({**RIGHT_CHUNKS, (5, 2): [2.5, 2.5]}, (5, 2),
                                "(5, 2) is not a case of the exercise, and its prediction [2.5, 2.5] is not a list",
                                "what kind of number"),
}


@pytest.mark.parametrize("case", CHUNKS_WRONG)
def test_chunk_predictions_wrong(case: str) -> None:
    answer, key, mistake, concept = CHUNKS_WRONG[case]
    verdict = dp.check_chunk_predictions(answer)
    rejected(verdict, mistake, concept)
    # item of the student run: the feedback does not work out the case's answer, not even the closer hint
    assert str(chunk_sizes(*key)) not in str(verdict.closer_hint())


@pytest.mark.parametrize("answer", [
    RIGHT_CHUNKS,
    {c: [len(t) for t in torch.arange(c[0]).chunk(c[1])] for c in dp.CHUNK_CASES},  # asked torch itself
    {(b, g): tuple([math.ceil(b / g)] * (b // math.ceil(b / g)) + ([b % math.ceil(b / g)] if b % math.ceil(b / g)
                                                                     else [])) for b, g in dp.CHUNK_CASES},
    {c: np.array(chunk_sizes(*c)) * 1.0 for c in dp.CHUNK_CASES},                  # whole floats in an array
], ids=["notebook", "torch_chunk", "ceil_formula", "numpy_floats"])
def test_chunk_predictions_right(answer: Any) -> None:
    verdict = dp.check_chunk_predictions(answer)
    assert verdict, str(verdict)
    assert not any(str(chunk_sizes(*c)) in str(verdict) for c in dp.CHUNK_CASES if c[1] > 2)  # no answer printed
    assert "not a case" not in verdict.message


def test_chunk_predictions_extra_keys_are_named() -> None:
    """Item 5 of the second student run: keys the exercise did not ask about are no longer passed over
    silently; a right prediction for one is accepted, and the verdict says it is not a case."""
    verdict = dp.check_chunk_predictions({**RIGHT_CHUNKS, (5, 2): [3, 2]})
    assert verdict and "(5, 2) is not a case of the exercise; your prediction for it is right too" in verdict.message
    verdict = dp.check_chunk_predictions({**RIGHT_CHUNKS, (5, 2): ..., "notes": "by hand"})
    assert verdict and "(5, 2), 'notes' are not cases of the exercise and not a prediction to check" in verdict.message


# === 04 · 7.2: unwrap =========================================================================================

class MyDataParallel(nn.DataParallel):
    pass


class MyWrapper(nn.DataParallel):  # a subclass whose name does not say DataParallel
    pass


class Head(nn.Module):  # a plain model whose only layer is named module
    def __init__(self):
        super().__init__()
        self.module = nn.Linear(4, 2)


def unwrap_while(model):
    while hasattr(model, "module"):
        model = model.module
    return model


def unwrap_by_keys(model):
    if any(key.startswith("module.") for key in model.state_dict()):
        return model.module
    return model


UNWRAP_WRONG = [
    ("stub", lambda m: m.module, "raised AttributeError", "never wrapped"),
    ("getattr", lambda m: getattr(m, "module", m), "returned its layer 'module' (a Linear)", "state_dict keys"),
    ("hasattr", lambda m: m.module if hasattr(m, "module") else m, "not wrapped, it only has a layer of that name",
     "what does DataParallel wrap the model in?"),
    ("while_hasattr", unwrap_while, "returned its layer 'module'", "A layer called `module` does not make a wrapper"),
    ("state_dict_prefix", unwrap_by_keys, "returned its layer 'module'", "start with `module.` too"),
    ("type_is", lambda m: m.module if type(m) is nn.DataParallel else m, "A subclass of DataParallel is a "
     "DataParallel too", "subclass"),
    ("class_name", lambda m: m.module if type(m).__name__ == "DataParallel" else m, "returned the wrapper itself",
     "How does your test of the type treat subclasses?"),
    ("identity", lambda m: m, "returned the DataParallel wrapper itself", "What does DataParallel wrap"),
    ("deepcopy", lambda m: copy.deepcopy(m.module) if isinstance(m, nn.DataParallel) else m,
     "returned a copy of the model", "hand back the one that exists"),
    ("pops_the_model", lambda m: m._modules.pop("module") if isinstance(m, nn.DataParallel) else m,  # in place
     "took the model out of the wrapper", "still work after it"),
    # items 1-3 of the second student run
    ("class_name_contains", lambda m: m.module if "DataParallel" in type(m).__name__ else m,
     "returned the wrapper itself (_ForwardingWrapper)", "How does your test of the type treat subclasses?"),
    ("every_key_prefixed", lambda m: m.module if all(k.startswith("module.") for k in m.state_dict()) else m,
     "unwrap(a plain model whose only layer is named 'module') returned its layer 'module'", "start with `module.`"),
    ("only_child_module", lambda m: m.module if list(m._modules) == ["module"] else m,
     "unwrap(a plain model whose only layer is named 'module') returned its layer 'module'",
     "A layer called `module` does not make a wrapper"),
    ("eval_inner", lambda m: m.module.eval() if isinstance(m, nn.DataParallel) else m,
     "unwrap(nn.DataParallel(model)) changed the model's training mode (model.training True → False",
     "training and evaluation mode"),
    ("train_inner", lambda m: m.module.train() if isinstance(m, nn.DataParallel) else m,
     "changed the model's training mode (model.training False → True", "training and evaluation mode"),
    ("eval_every_model", lambda m: (m.module if isinstance(m, nn.DataParallel) else m).eval(),
     "changed the model's training mode", "besides returning it"),
    ("train_every_model", lambda m: (m.module if isinstance(m, nn.DataParallel) else m).train(),
     "unwrap(a model that is not wrapped) changed the model's training mode (model.training False → True",
     "besides returning it"),
]


@pytest.mark.parametrize(("answer", "mistake", "concept"), [w[1:] for w in UNWRAP_WRONG],
                         ids=[w[0] for w in UNWRAP_WRONG])
def test_unwrap_wrong(answer: Callable, mistake: str, concept: str) -> None:
    rejected(dp.check_unwrap(answer), mistake, concept)


def test_unwrap_hint_names_the_concept_before_the_isinstance_line() -> None:
    """Item of the student run: the first failure no longer hands over the isinstance test."""
    first = dp.check_unwrap(lambda m: getattr(m, "module", m))
    assert "isinstance" not in str(first) and "what does DataParallel wrap the model in?" in str(first)
    second = dp.check_unwrap(lambda m: m.module if hasattr(m, "module") else m)
    assert "Closer hint:" in str(second) and "isinstance" in second.closer
    assert "isinstance(model" not in str(second)  # a pointer, not the line


def unwrap_isinstance(model):
    return model.module if isinstance(model, nn.DataParallel) else model


def unwrap_duck(model):  # a wrapper has device_ids; a plain model does not
    return model.module if hasattr(model, "device_ids") else model


def unwrap_parallel_module(model):
    wrappers = (nn.parallel.DataParallel, nn.parallel.DistributedDataParallel)
    if not isinstance(model, wrappers):
        return model
    return model.module


@pytest.mark.parametrize("answer", [notebook_solution("04_data_parallel", "unwrap"), unwrap_isinstance,
                                    unwrap_duck, unwrap_parallel_module],
                         ids=["notebook", "isinstance", "duck_typing", "parallel_module"])
def test_unwrap_right(answer: Callable) -> None:
    verdict = dp.check_unwrap(answer)
    assert verdict, str(verdict)
    assert answer(MyDataParallel(nn.Linear(2, 2))).__class__ is nn.Linear
    assert answer(MyWrapper(nn.Linear(2, 2))).__class__ is nn.Linear
    head = Head().eval()
    assert answer(head) is head and not head.training and not head.module.training


# === 04 · 7.3: scatter and gather a dict batch ==============================================================

SCATTER = notebook_solution("04_data_parallel", "scatter_dict")
GATHER = notebook_solution("04_data_parallel", "gather_dict")


def _cut(batch, n, cut):
    parts = {k: cut(v) for k, v in batch.items() if isinstance(v, torch.Tensor)}
    count = min(len(p) for p in parts.values())
    return [{k: parts[k][i] if k in parts else v for k, v in batch.items()} for i in range(count)]


def scatter_tensor_split(batch, n):
    return _cut(batch, n, lambda v: v.tensor_split(n))


def scatter_split(batch, n):
    return _cut(batch, n, lambda v: v.split(n))


def scatter_n_dicts(batch, n):
    parts = {k: v.chunk(n) for k, v in batch.items() if isinstance(v, torch.Tensor)}
    return [{k: parts[k][i] if k in parts else v for k, v in batch.items()} for i in range(n)]


def scatter_example_keys(batch, n):  # right only for the example's keys
    images, labels = batch["image"].chunk(n), batch["label"].chunk(n)
    return [{"image": i, "label": y, "augment": batch["augment"]} for i, y in zip(images, labels, strict=True)]


def scatter_pops_flags(batch, n):  # changes its input in place
    flags = {k: batch.pop(k) for k in [k for k, v in batch.items() if not isinstance(v, torch.Tensor)]}
    return [{**chunk, **flags} for chunk in _cut(batch, n, lambda v: v.chunk(n))]


def scatter_replaces_values(batch, n):  # changes its input in place
    for k, v in list(batch.items()):
        if isinstance(v, torch.Tensor):
            batch[k] = v.chunk(n)
    count = min(len(v) for v in batch.values() if isinstance(v, tuple))
    return [{k: v[i] if isinstance(v, tuple) else v for k, v in batch.items()} for i in range(count)]


def scatter_shuffled(batch, n):
    order = torch.randperm(len(next(v for v in batch.values() if isinstance(v, torch.Tensor))),
                           generator=torch.Generator().manual_seed(0))
    return _cut(batch, n, lambda v: v[order].chunk(n))


def scatter_tensors_only(batch, n):
    return [{k: v for k, v in d.items() if isinstance(v, torch.Tensor)} for d in SCATTER(batch, n)]


def scatter_last_dim(batch, n):
    return _cut(batch, n, lambda v: v.chunk(n, dim=-1))


def gather_stack(outputs):
    return {k: torch.stack([o[k] for o in outputs]) for k in outputs[0]}


def gather_reverses(outputs):  # changes its input in place
    outputs.reverse()
    return {k: torch.cat([o[k] for o in outputs]) for k in outputs[0]}


def gather_example_keys(outputs):  # right only for the keys of the first batches
    return {k: torch.cat([o[k] for o in outputs]) for k in ("logits", "label")}


def gather_list(outputs):
    return [torch.cat([o[k] for o in outputs]) for k in outputs[0]]


def gather_single_stack(outputs):  # right only when there is one chunk of each size
    return {k: torch.stack([o[k] for o in outputs]).flatten(0, 1) for k in outputs[0]}


def gather_detached(outputs):  # item 4 of the second student run: right values, no graph
    return {k: torch.cat([o[k].detach() for o in outputs]) for k in outputs[0]}


def gather_regrad(outputs):  # a new leaf: backward runs, but reaches no replica
    return {k: torch.cat([o[k].detach() for o in outputs]).requires_grad_(o[k].is_floating_point())
            for k in outputs[0] for o in outputs[:1]}


def gather_first_only(outputs):  # the first replica keeps its graph, the others do not
    return {k: torch.cat([outputs[0][k], *[o[k].detach() for o in outputs[1:]]]) for k in outputs[0]}


def gather_via_lists(outputs):
    return {k: torch.tensor([x for o in outputs for x in o[k].tolist()]) for k in outputs[0]}


DICT_WRONG = [
    (scatter_tensor_split, GATHER, "[3, 3, 2, 2] samples, as even as possible over all 4 GPUs", "what does its number"),
    (scatter_split, GATHER, "4 was used as the size of each chunk", "the size of each chunk"),
    (scatter_n_dicts, GATHER, "scatter_dict(batch of 10, 8) raised IndexError", "small batch"),
    (scatter_example_keys, GATHER, "raised KeyError: 'image'. This batch's keys are", "any keys"),
    (scatter_pops_flags, GATHER, "changed the batch it was given (key(s) ['augment'])", "should scattering change"),
    (scatter_replaces_values, GATHER, "changed the batch it was given (key(s) ['image', 'label'])",
     "should scattering change"),
    (scatter_shuffled, GATHER, "not consecutive samples in the batch's order", "a run of consecutive"),
    (scatter_tensors_only, GATHER, "chunk 0 has keys ['image', 'label']", "not tensors"),
    (scatter_last_dim, GATHER, "chunk 0['image'] has shape (10, 1)", "samples of a batch lie"),
    (SCATTER, gather_stack, "raised RuntimeError: stack expects each tensor to be equal size",
     "along the batch dimension"),
    (SCATTER, gather_reverses, "changed the list of outputs", "reorder, empty or change"),
    (SCATTER, gather_example_keys, "raised KeyError: 'logits'. These outputs' keys are ['scores', 'target']",
     "any keys"),
    (SCATTER, gather_list, "returned a list; the outputs are dicts", "one replica's output"),
    (SCATTER, gather_single_stack, "raised RuntimeError", "along the batch dimension"),
    (SCATTER, gather_detached, "['logits'] has requires_grad=False, while every replica's output requires grad",
     "backward runs from it through the gather"),
    (SCATTER, gather_regrad, "does not reach the output(s) of replica(s) [0, 1, 2, 3] (of 4)",
     "what must gathering keep"),
    (SCATTER, gather_first_only, "does not reach the output(s) of replica(s) [1, 2, 3] (of 4)",
     "what must gathering keep"),
    (SCATTER, gather_via_lists, "has requires_grad=False", "what must gathering keep"),
]


@pytest.mark.parametrize(("scatter", "gather", "mistake", "concept"), DICT_WRONG,
                         ids=[(s if g is GATHER else g).__name__ for s, g, *_ in DICT_WRONG])
def test_dict_scatter_gather_wrong(scatter: Callable, gather: Callable, mistake: str, concept: str) -> None:
    verdict = dp.check_dict_scatter_gather(scatter, gather)
    rejected(verdict, mistake, concept)
    # exercise 7.1's answers are not given away here either (10 on 8, 3 on 4 are among its cases)
    assert str(chunk_sizes(10, 8)) not in str(verdict.closer_hint())


def scatter_loop(batch, n):
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    size = math.ceil(len(next(iter(tensors.values()))) / n)  # torch.chunk's chunk size
    chunks = []
    for start in range(0, len(next(iter(tensors.values()))), size):
        chunk = dict(batch)                      # non-tensor values as they are
        for k, v in tensors.items():
            chunk[k] = v[start:start + size]
        chunks.append(chunk)
    return chunks


def scatter_split_by_ceil(batch, n):
    return _cut(batch, n, lambda v: torch.split(v, math.ceil(v.shape[0] / n)))


def gather_loop(outputs):
    merged: dict[str, list[torch.Tensor]] = {}
    for out in outputs:
        for k, v in out.items():
            merged.setdefault(k, []).append(v)
    return {k: torch.concat(vs, dim=0) for k, vs in merged.items()}


@pytest.mark.parametrize(("scatter", "gather"), [(SCATTER, GATHER), (scatter_loop, gather_loop),
                                                 (scatter_split_by_ceil, GATHER), (SCATTER, gather_loop)],
                         ids=["notebook", "loops", "split_by_ceil", "notebook_scatter_loop_gather"])
def test_dict_scatter_gather_right(scatter: Callable, gather: Callable) -> None:
    verdict = dp.check_dict_scatter_gather(scatter, gather)
    assert verdict, str(verdict)


# === every checker ===========================================================================================

@pytest.mark.parametrize("checker", [api.check_logical_to_physical, api.check_pick_gpus, dp.check_unwrap])
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
