"""A catalogue of answers for notebook 00's exercise checker (course_utils.exercises.setup:
check_tensor_on_device, a tensor on the course device).

The wrong answers a class writes, each rejected with a message that names its mistake and a first hint that
names the concept, not the line (no line of the notebook's solution in it; the closer hint, nearer to the code,
waits for a second failure or %hint); and right answers written differently from the notebook's solution, each
accepted. Every test leaves the global settings (default device and dtype, grad mode) as it found them. At the
end, the checker's first tests (from tests/test_widgets_and_setup_exercise.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from answers_helpers import SOLUTIONS, accepted
from answers_helpers import rejected_without_solution_lines as rejected

from course_utils.exercises import Verdict
from course_utils.exercises.setup import check_tensor_on_device

pytestmark = pytest.mark.usefixtures("global_settings_kept")  # tests/conftest.py


# ================================================================ 00: a tensor on the course device

F16 = torch.float16


@pytest.mark.parametrize(("answer", "course_device", "mistake", "concept"), [
    (torch.ones(3, 3), "cpu", "the dtype is torch.float32 (what a factory function makes", "which argument"),
    (torch.ones(3, 3, dtype=torch.bfloat16), "cpu", "torch.bfloat16, not torch.float16", "16-bit"),
    (torch.tensor([[1, 1, 1]] * 3), "cpu", "the dtype is torch.int64", "which argument"),
    (torch.ones(3, dtype=F16), "cpu", "the shape is (3,), not (3, 3)", "how many sizes"),
    (torch.ones(1, 3, 3, dtype=F16), "cpu", "the shape is (1, 3, 3)", "how many sizes"),
    (torch.zeros(3, 3, dtype=F16), "cpu", "not every element is 1", "which one gives ones"),
    (torch.rand(3, 3, dtype=F16), "cpu", "not every element is 1", "which one gives ones"),
    ([[1.0] * 3] * 3, "cpu", "expected a torch.Tensor, got list", "which one fills it with ones"),
    (np.ones((3, 3), dtype=np.float16), "cpu", "got ndarray", "which one fills it with ones"),
    (torch.ones(3, 3, dtype=F16), "meta", "the tensor is on cpu, not on meta", "Section 3"),
    (torch.ones(3, 3, dtype=F16, device="meta"), "cpu", "the tensor is on meta, not on cpu", "Section 3"),
], ids=["stub-float32", "bfloat16", "int64", "1-dim", "3-dim", "zeros", "rand", "list", "numpy",
        "cpu-not-course-device", "meta-not-course-device"])
def test_setup_wrong_answers(answer, course_device, mistake, concept) -> None:
    rejected(check_tensor_on_device(answer, course_device), mistake, concept, "00")


@pytest.mark.parametrize(("make", "course_device"), [
    (lambda d: torch.ones(3, 3, dtype=torch.half, device=d), "cpu"),
    (lambda d: torch.full((3, 3), 1.0, dtype=F16, device=d), "cpu"),
    (lambda d: torch.ones(9).view(3, 3).to(d, F16), "cpu"),  # made, then moved: the checker cannot tell
    (lambda d: torch.ones((3, 3), dtype=F16, device=d), "meta"),  # no data on meta: nothing to compare
    (lambda d: torch.ones(3, 3, dtype=F16, device=d), torch.device("cpu")),
], ids=["half", "full", "view-then-to", "on-meta", "torch.device"])
def test_setup_right_answers(make, course_device) -> None:
    accepted(check_tensor_on_device(make(course_device), course_device))


def test_setup_the_notebook_solution_and_the_second_try() -> None:
    ns = {"device": torch.device("cpu")}
    exec("t = " + next(p for p in SOLUTIONS["00"] if p.startswith("torch.ones")), {"torch": torch, **ns}, ns)
    accepted(check_tensor_on_device(ns["t"], "cpu"))
    first = check_tensor_on_device(torch.ones(3, 3), "cpu")
    again = check_tensor_on_device(torch.ones(3, 3), "cpu")
    assert "Closer hint" not in str(first) and f"Closer hint: {again.closer}" in str(again)


# --- the checker's first tests (from tests/test_widgets_and_setup_exercise.py) ---------------------------------

def test_setup_checker():
    right = torch.ones(3, 3, dtype=torch.float16)
    assert isinstance(check_tensor_on_device(right, "cpu"), Verdict)
    assert check_tensor_on_device(right, "cpu")
    cases = [
        ([[1.0]], "expected a torch.Tensor"),
        (torch.ones(2, 3, dtype=torch.float16), "shape is (2, 3)"),
        (torch.ones(3, 3), "dtype is torch.float32"),
        (torch.zeros(3, 3, dtype=torch.float16), "not every element is 1"),
    ]
    for value, message in cases:
        verdict = check_tensor_on_device(value, "cpu")
        assert not verdict and message in verdict.message and verdict.hint
    wrong_device = check_tensor_on_device(right, "meta")
    assert not wrong_device and "not on meta" in wrong_device.message
    assert str(wrong_device).startswith("✘ Not yet.") and "Hint:" in str(wrong_device)
