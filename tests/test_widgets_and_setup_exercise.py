"""widgets.live leaves a static output; the notebook-00 checker says what is wrong."""

from __future__ import annotations

import ipywidgets
import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from course_utils.exercises import Verdict
from course_utils.exercises.setup import check_tensor_on_device
from course_utils.widgets import live


def test_live_shows_static_output_and_updates():
    InteractiveShell.instance()
    slider = ipywidgets.IntSlider(value=3, min=1, max=10)
    calls = []

    def render(n):
        calls.append(n)
        return f"n squared is {n * n}"

    with capture_output() as cap:
        assert live(render, n=slider) is None
    texts = [o.data.get("text/plain") for o in cap.outputs]
    assert "'n squared is 9'" in texts
    slider.value = 4
    assert calls == [3, 4]


def test_live_rejects_non_widgets():
    with pytest.raises(TypeError, match="not a widget"):
        live(lambda n: n, n=3)


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
