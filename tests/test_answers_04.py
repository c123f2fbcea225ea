"""Notebook 04 (DataParallel): a catalogue of answers a class would write to its exercises, run
through the checkers (course_utils.exercises.data_parallel), and the notebook's own four steps of DataParallel.

Each wrong answer must be rejected with a message that names its mistake (a substring of
``verdict.message``), a hint that names the concept (a substring of ``verdict.hint``, and no code in it),
and a closer hint that waits until it is asked for. Each right answer, written differently from the
notebook's solution, must be accepted. The notebook's own solution is taken from its solution cell. Then the
checkers' first tests (from tests/test_data_parallel_exercises.py; the ones whose names the catalogue had taken
end in _in_brief).

Last, the four steps (scatter, replicate, parallel_apply, gather) and data_parallel, which live in the
notebook's own cells, the lesson's only copy (from tests/test_parallel.py): they must give what the plain module
gives. These tests take them from the cells, so that a change to a cell is tested here as well as by nbval.
"""

from __future__ import annotations

import copy
import math
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from answers_helpers import rejected_without_code as rejected
from answers_helpers import solution_value
from conftest import notebook_functions, notebook_solution
from torch import nn

from course_utils.devices import cuda_device_count
from course_utils.distributed.data_parallel import chunk_sizes
from course_utils.exercises import Verdict
from course_utils.exercises import data_parallel as dp
from course_utils.exercises.data_parallel import (
    CHUNK_CASES,
    check_chunk_predictions,
    check_dict_scatter_gather,
    check_unwrap,
)

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


# === every checker of notebook 04 (test_answers_03.py: notebook 03's) ======================================

@pytest.mark.parametrize("checker", [dp.check_unwrap])
def test_not_a_function(checker: Callable[..., Verdict]) -> None:
    rejected(checker("2,3"), "expected a function, got str", "function itself")


# --- the checkers' first tests (from tests/test_data_parallel_exercises.py) ----------------------------------

def _right() -> dict:
    return {case: chunk_sizes(*case) for case in CHUNK_CASES}


def test_chunk_predictions_right_in_brief() -> None:
    v = check_chunk_predictions(_right())
    assert v and "[3, 3, 3]" not in str(v)  # a solution's stored output prints no answer


def test_chunk_predictions_wrong_in_brief() -> None:
    v = check_chunk_predictions({**_right(), (9, 4): [3, 2, 2, 2]})
    assert not v and "[3, 2, 2, 2] spreads the samples over all 4 GPUs" in v.message and "[3, 3, 3]" not in str(v)
    v = check_chunk_predictions({**_right(), (17, 3): [5, 6, 6]})
    assert not v and "the sizes are right, their order is not" in v.message
    v = check_chunk_predictions({**_right(), (16, 2): [8, 7]})
    assert not v and "add up to 15, but the batch has 16" in v.message
    v = check_chunk_predictions({**_right(), (10, 8): ...})
    assert not v and "not filled in" in v.message
    v = check_chunk_predictions({(16, 2): [8, 8]})
    assert not v and "no prediction for" in v.message
    assert not check_chunk_predictions([8, 8])


def test_chunk_predictions_extra_keys() -> None:
    v = check_chunk_predictions({**_right(), (5, 2): [9]})  # a case not asked about, predicted wrong
    assert not v and "(5, 2) is not a case of the exercise" in v.message and "add up to 9" in v.message
    v = check_chunk_predictions({**_right(), (5, 2): [3, 2]})  # predicted right: accepted, and named
    assert v and "(5, 2) is not a case of the exercise" in v.message


def test_unwrap() -> None:
    assert check_unwrap(lambda m: m.module if isinstance(m, nn.DataParallel) else m)
    v = check_unwrap(lambda m: m.module)
    assert not v and "raised AttributeError" in v.message
    v = check_unwrap(lambda m: getattr(m, "module", m))
    assert not v and "returned its layer 'module'" in v.message and "isinstance" not in v.hint and "isinstance" in v.closer
    v = check_unwrap(lambda m: m)
    assert not v and "nn.DataParallel(model)" in v.message
    assert not check_unwrap("net.module")


def test_unwrap_second_run() -> None:
    """A test of the class's name, of the state_dict keys or of the only child, and .eval() on the way."""
    v = check_unwrap(lambda m: m.module if "DataParallel" in type(m).__name__ else m)
    assert not v and "returned the wrapper itself (_ForwardingWrapper)" in v.message
    v = check_unwrap(lambda m: m.module if all(k.startswith("module.") for k in m.state_dict()) else m)
    assert not v and "a plain model whose only layer is named 'module'" in v.message
    v = check_unwrap(lambda m: m.module if list(m._modules) == ["module"] else m)
    assert not v and "returned its layer 'module'" in v.message
    v = check_unwrap(lambda m: m.module.eval() if isinstance(m, nn.DataParallel) else m)
    assert not v and "changed the model's training mode (model.training True → False" in v.message
    v = check_unwrap(lambda m: (m.module if isinstance(m, nn.DataParallel) else m).train())
    assert not v and "changed the model's training mode" in v.message


# the notebook's solution cell is the right answer (tensors cut with .chunk, flags copied, cat in order)
_scatter_dict = notebook_solution("04_data_parallel", "scatter_dict")


_gather_dict = notebook_solution("04_data_parallel", "gather_dict")


def test_dict_scatter_gather_right_in_brief() -> None:
    assert check_dict_scatter_gather(_scatter_dict, _gather_dict)


def test_dict_scatter_gather_wrong_in_brief() -> None:
    def always_n(batch: dict, n: int) -> list[dict]:  # tensor_split gives n chunks, some empty
        parts = {k: v.tensor_split(n) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        return [{k: (parts[k][i] if k in parts else v) for k, v in batch.items()} for i in range(n)]

    v = check_dict_scatter_gather(always_n, _gather_dict)
    # 10 on 4: tensor_split gives 3, 3, 2, 2 where DataParallel (torch.chunk) gives 3, 3, 3, 1
    assert not v and "[3, 3, 2, 2] samples, as even as possible" in v.message

    def drops_flag(batch: dict, n: int) -> list[dict]:
        return [{k: c for k, c in d.items() if k != "augment"} for d in _scatter_dict(batch, n)]

    v = check_dict_scatter_gather(drops_flag, _gather_dict)
    assert not v and "chunk 0 has keys ['image', 'label']" in v.message

    def reversed_gather(outputs: list[dict]) -> dict:
        return _gather_dict(outputs[::-1])

    v = check_dict_scatter_gather(_scatter_dict, reversed_gather)
    assert not v and "not in the batch's order" in v.message
    assert not check_dict_scatter_gather(None, _gather_dict)

    def detached_gather(outputs: list[dict]) -> dict:
        return {k: torch.cat([o[k].detach() for o in outputs]) for k in outputs[0]}

    v = check_dict_scatter_gather(_scatter_dict, detached_gather)
    assert not v and "requires_grad=False" in v.message and "lost its graph" in v.message


# === the notebook's own steps of DataParallel (from tests/test_parallel.py) ==================================

# what the notebook's steps use from elsewhere
NAMESPACE = {"copy": copy, "threading": threading, "warnings": warnings, "torch": torch, "nn": nn}


STEPS = ("scatter", "replicate", "parallel_apply", "gather", "data_parallel")


@pytest.fixture(scope="module")
def nb() -> Any:
    """The notebook's functions, as attributes: nb.scatter, nb.replicate, ..."""
    return type("NotebookSteps", (), {k: staticmethod(v) for k, v in notebook_functions("04_data_parallel", STEPS, NAMESPACE).items()})


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))


def _grads(module: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters()]


def _loss(out: torch.Tensor) -> torch.Tensor:
    """A scalar that depends on every element of ``out``, each weighted differently."""
    return (out * torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)).sum()


def _compare(nb: Any, module: nn.Module, n: int, x: torch.Tensor, dim: int = 0) -> None:
    """Forward and backward through the module and through the notebook's data_parallel: same outputs,
    parameter gradients and input gradients."""
    ref_module = copy.deepcopy(module)
    ref_x = x.detach().clone().requires_grad_()
    ref_out = ref_module(ref_x)
    _loss(ref_out).backward()

    dp_x = x.detach().clone().requires_grad_()
    out = nb.data_parallel(module, (dp_x,), n, dim)
    _loss(out).backward()

    torch.testing.assert_close(out, ref_out)
    for g, g_ref in zip(_grads(module), _grads(ref_module), strict=True):
        torch.testing.assert_close(g, g_ref)
    torch.testing.assert_close(dp_x.grad, ref_x.grad)


def test_notebook_scatter_agrees_with_chunk_sizes(nb: Any) -> None:
    for batch, n in [(9, 4), (10, 8), (16, 2), (3, 4), (17, 3)]:
        assert [len(c[0]) for c in nb.scatter((torch.zeros(batch, 2),), n)] == chunk_sizes(batch, n)


def test_scatter_tensors_and_other_arguments(nb: Any) -> None:
    x = torch.arange(10).reshape(5, 2)
    parts = nb.scatter((x, "flag", 3.0), 2)
    assert len(parts) == 2 and all(len(p) == 3 for p in parts)
    assert torch.equal(parts[0][0], x[:3]) and torch.equal(parts[1][0], x[3:])
    assert parts[1][1:] == ("flag", 3.0)
    # 3 samples of one tensor and 8 of another on 4 devices: only 3 replicas get both
    assert len(nb.scatter((torch.zeros(3, 1), torch.zeros(8, 1)), 4)) == 3
    seq = torch.zeros(5, 6, 4)  # (time, batch, features), cut along dim 1
    assert [c[0].shape for c in nb.scatter((seq,), 4, dim=1)] == [(5, 2, 4)] * 3


def test_replicas_copy_parameters_differentiably_and_sum_gradients(nb: Any) -> None:
    net = _mlp()
    replicas = nb.replicate(net, 3)
    assert len(replicas) == 3 and all(type(r) is nn.Sequential for r in replicas)
    for r in replicas:
        w = r[0].weight
        assert w is not net[0].weight and torch.equal(w, net[0].weight)
        assert w.grad_fn.next_functions[0][0].variable is net[0].weight
        assert list(r.parameters()) == []  # the copies are plain attributes, not Parameters
    x = torch.randn(6, 5)
    sum(r(x).sum() for r in replicas).backward()
    single = _mlp()
    (3 * single(x).sum()).backward()
    torch.testing.assert_close(net[0].weight.grad, single[0].weight.grad)


def test_replicas_share_attributes_and_replica_0_the_buffers(nb: Any) -> None:
    class Noted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[int] = []
            self.bn = nn.BatchNorm1d(2)

    net = Noted()
    r0, r1 = nb.replicate(net, 2)
    assert r0.seen is net.seen and r1.seen is net.seen  # a shallow copy: the same list
    assert r0.bn.running_mean is net.bn.running_mean
    assert r1.bn.running_mean is not net.bn.running_mean
    assert torch.equal(r1.bn.running_mean, net.bn.running_mean)


def test_replicate_under_no_grad_detaches(nb: Any) -> None:
    with torch.no_grad():
        replicas = nb.replicate(_mlp(), 2)
    assert not any(r[0].weight.requires_grad for r in replicas)


def test_parallel_apply_uses_one_thread_per_replica_and_keeps_order(nb: Any) -> None:
    seen: list[str] = []
    lock = threading.Lock()

    class Who(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with lock:
                seen.append(threading.current_thread().name)
            return x * 2

    replicas = nb.replicate(Who(), 3)
    outs = nb.parallel_apply(replicas, [(torch.full((1,), float(i)),) for i in range(3)])
    assert [o.item() for o in outs] == [0.0, 2.0, 4.0]
    assert sorted(seen) == ["replica-0", "replica-1", "replica-2"]


def test_parallel_apply_reports_the_failing_replica(nb: Any) -> None:
    net = nn.Linear(4, 2)
    with pytest.raises(RuntimeError, match=r"Caught RuntimeError in replica 1: .*mat1 and mat2") as info:
        nb.parallel_apply(nb.replicate(net, 2), [(torch.zeros(2, 4),), (torch.zeros(2, 3),)])
    assert isinstance(info.value.__cause__, RuntimeError)


def test_grad_mode_reaches_the_threads(nb: Any) -> None:
    with torch.no_grad():
        out = nb.data_parallel(_mlp(), (torch.randn(6, 5),), 3)
    assert out.grad_fn is None and not out.requires_grad


def test_gather_concatenates_in_order_and_warns_on_scalars(nb: Any) -> None:
    assert nb.gather([torch.zeros(2, 1), torch.ones(1, 1)]).flatten().tolist() == [0.0, 0.0, 1.0]
    assert nb.gather([torch.zeros(1, 2), torch.ones(1, 1)], dim=1).tolist() == [[0.0, 0.0, 1.0]]
    with pytest.warns(UserWarning, match="all input tensors were scalars; will instead unsqueeze"):
        v = nb.gather([torch.tensor(1.0), torch.tensor(2.0)])
    assert v.tolist() == [1.0, 2.0]


@pytest.mark.parametrize(("batch", "n"), [(16, 2), (9, 4), (10, 8), (7, 3), (17, 4), (3, 4), (1, 4), (5, 1)])
def test_outputs_and_gradients_match_plain_module(nb: Any, batch: int, n: int) -> None:
    """Uneven batches, batches smaller than n_devices (fewer replicas), and one device."""
    _compare(nb, _mlp(), n, torch.randn(batch, 5))


def test_dim_1(nb: Any) -> None:
    """A sequence-first batch (time, batch, features), cut along dim 1."""
    _compare(nb, _mlp(1), 3, torch.randn(4, 8, 5), dim=1)


def test_batchnorm_buffers_like_data_parallel(nb: Any) -> None:
    """Train mode: each chunk is normalised with its own statistics and the running stats come from
    the first chunk only (replica 0 owns the real buffers). Eval mode: same as the plain module."""
    torch.manual_seed(7)
    x = torch.randn(10, 4) * 3 + 1
    bn = nn.BatchNorm1d(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = nb.data_parallel(bn, (x,), 2)
    first = nn.BatchNorm1d(4)
    want_first = first(x[:5])
    torch.testing.assert_close(bn.running_mean, first.running_mean)
    torch.testing.assert_close(bn.running_var, first.running_var)
    assert bn.num_batches_tracked.item() == 1
    torch.testing.assert_close(out[:5], want_first)
    torch.testing.assert_close(out[5:], nn.BatchNorm1d(4)(x[5:]))
    assert not torch.allclose(out, nn.BatchNorm1d(4)(x))  # not the whole-batch statistics

    bn.eval()
    _compare(nb, bn, 3, x)


def test_attribute_updates_in_forward_are_lost(nb: Any) -> None:
    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0
            self.linear = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return self.linear(x)

    net = Counter()
    nb.data_parallel(net, (torch.zeros(4, 2),), 2)
    assert net.calls == 0


def test_scalar_output_becomes_one_value_per_replica(nb: Any) -> None:
    class LossInside(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x).pow(2).mean()

    torch.manual_seed(6)
    net, x = LossInside(), torch.randn(9, 3)
    with pytest.warns(UserWarning, match="scalars; will instead unsqueeze"):
        losses = nb.data_parallel(net, (x,), 4)
    assert losses.shape == (3,)  # 9 samples on 4 devices: 3 replicas
    torch.testing.assert_close(losses, torch.stack([net(c) for c in x.chunk(4)]).detach())


@pytest.mark.skipif(cuda_device_count() < 2, reason="needs 2 CUDA GPUs to run the real nn.DataParallel")
def test_matches_real_data_parallel_on_two_gpus(nb: Any) -> None:
    torch.manual_seed(8)
    net = nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.ReLU(), nn.Linear(7, 3))
    cpu_net = copy.deepcopy(net)
    x = torch.randn(9, 5)
    dp = nn.DataParallel(net.to("cuda:0"), device_ids=[0, 1])
    out = dp(x.to("cuda:0"))
    _loss(out).backward()
    cpu_out = nb.data_parallel(cpu_net, (x,), 2)
    _loss(cpu_out).backward()
    torch.testing.assert_close(out.cpu(), cpu_out, atol=1e-4, rtol=1e-4)
    for p, q in zip(net.parameters(), cpu_net.parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=1e-4, rtol=1e-4)
    for b, c in zip(net.buffers(), cpu_net.buffers(), strict=True):
        torch.testing.assert_close(b.cpu(), c, atol=1e-5, rtol=1e-5)
