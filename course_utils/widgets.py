"""Notebooks 01, 02 and 04: interactive cells that also leave a static output.

`live(render, **controls)` shows ipywidgets controls and the result of ``render(**values)`` below them.
The first result is an ordinary display output, so it appears in a static render of the notebook and in
nbval's comparison; moving a control replaces that same output in place (a display handle), so a student
never sees two copies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["live"]


def _as_displayable(result: Any) -> Any:
    """A matplotlib figure is closed after rendering, so the inline backend does not show it twice."""
    try:
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        return result
    if isinstance(result, Figure):
        import matplotlib.pyplot as plt

        plt.close(result)
    return result


def live(render: Callable[..., Any], **controls: Any) -> None:
    """Display ``controls`` (ipywidgets with a ``value``) and ``render(**values)`` below them.

    ``render`` returns something displayable (a matplotlib Figure, a string, a DataFrame...). Without
    ipywidgets, only the static result is displayed. Returns None, so a cell ending in ``live(...)``
    prints nothing more.
    """
    from IPython.display import display

    for name, widget in controls.items():
        if not hasattr(widget, "value"):
            raise TypeError(f"live(): control {name!r} is a {type(widget).__name__}, not a widget with a "
                            "value (use e.g. ipywidgets.IntSlider or Dropdown)")
    values = {name: w.value for name, w in controls.items()}
    try:
        import ipywidgets
    except ImportError:
        display(_as_displayable(render(**values)))
        return None
    display(ipywidgets.HBox(list(controls.values())))
    handle = display(_as_displayable(render(**values)), display_id=True)

    def update(_change: dict[str, Any]) -> None:
        current = {name: w.value for name, w in controls.items()}
        handle.update(_as_displayable(render(**current)))

    for widget in controls.values():
        widget.observe(update, names="value")
    return None
