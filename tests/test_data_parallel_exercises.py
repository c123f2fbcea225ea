"""Checkers of notebook 04's exercises: right answers pass, typical wrong answers get a useful message."""

from __future__ import annotations

import torch
from conftest import notebook_solution
from torch import nn

from course_utils.exercises.data_parallel import (
    CHUNK_CASES,
    check_chunk_predictions,
    check_dict_scatter_gather,
    check_unwrap,
)
from course_utils.distributed.data_parallel import chunk_sizes


def _right() -> dict:
    return {case: chunk_sizes(*case) for case in CHUNK_CASES}


def test_chunk_predictions_right() -> None:
    v = check_chunk_predictions(_right())
    assert v and "[3, 3, 3]" not in str(v)  # a solution's stored output prints no answer


def test_chunk_predictions_wrong() -> None:
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


def test_dict_scatter_gather_right() -> None:
    assert check_dict_scatter_gather(_scatter_dict, _gather_dict)


def test_dict_scatter_gather_wrong() -> None:
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
