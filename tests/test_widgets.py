"""course_utils.widgets: live() shows a function's output for a widget's value as a static output that
updates when the widget changes, and refuses arguments that are not widgets."""

from __future__ import annotations

import ipywidgets
import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

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
