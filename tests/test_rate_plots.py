"""course_utils.hardware.rate_plots: where a faster series overtakes a slower one (crossover), and the
figures of notebook 01 (rates, bars, the drawing of the architecture)."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from course_utils.hardware import rate_plots as plots  # noqa: E402


def test_crossover():
    sizes = [32, 64, 128, 256]
    assert plots.crossover(sizes, [1, 2, 3, 4], [0.5, 3, 9, 20]) == 64
    assert plots.crossover(sizes, [1, 2, 3, 4], [2, 1, 9, 20]) == 128  # a lucky point does not count
    assert plots.crossover(sizes, [1, 2, 3, 4], [0, 0, 0, 0]) is None
    with pytest.raises(ValueError):
        plots.crossover(sizes, [1, 2], [1, 2])
    with pytest.raises(ValueError):
        plots.crossover([2, 1], [1, 2], [1, 2])


def test_plots_make_figures():
    fig = plots.plot_rates([32, 64, 128], {"cpu": [1.0, 2.0, 3.0], "cuda": [0.5, 3.0, float("nan")]},
                           mark=64, title="t")
    assert len(fig.axes) == 1 and len(fig.axes[0].lines) == 3  # two series and the crossover line
    fig2, (a1, a2) = plt.subplots(1, 2)
    assert plots.plot_rates([1, 2], {"x": [1, 2]}, ax=a1) is fig2
    assert plots.plot_bars(["fp32", "bf16"], [50.0, 780.0], annotations=["1e-6", "3e-3"], ax=a2, log=True) is fig2
    arch = plots.draw_architecture()
    assert len(arch.axes) == 2 and len(arch.axes[1].collections[0].get_paths()) > 16 * 32
    with pytest.raises(ValueError):
        plots.plot_rates([1, 2], {"x": [1]})
    with pytest.raises(ValueError):
        plots.plot_rates([1, 2], {})
    with pytest.raises(ValueError):
        plots.plot_bars(["a"], [1.0, 2.0])
    plt.close("all")
