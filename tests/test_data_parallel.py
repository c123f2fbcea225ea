"""course_utils.distributed.data_parallel: chunk_sizes (the sizes torch.chunk, and so DataParallel, cuts
a batch into) and notebook 04's pictures of the split and of the mechanism. The notebook's own four steps of
DataParallel are tested in test_answers_04.py."""

from __future__ import annotations

import matplotlib
import pytest
import torch

from course_utils.distributed.data_parallel import chunk_sizes, plot_batch_split, plot_mechanism

matplotlib.use("Agg")


# ---------------------------------------------------------------------------------------- chunk_sizes

@pytest.mark.parametrize("batch", [0, 1, 3, 7, 9, 10, 16, 17, 33])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_chunk_sizes_is_torch_chunk(batch: int, n: int) -> None:
    assert chunk_sizes(batch, n) == [len(c) for c in torch.arange(batch).chunk(n)]


def test_chunk_sizes_examples_and_errors() -> None:
    assert chunk_sizes(9, 4) == [3, 3, 3]
    assert chunk_sizes(10, 8) == [2, 2, 2, 2, 2]
    with pytest.raises(ValueError, match="n_devices must be at least 1"):
        chunk_sizes(4, 0)
    with pytest.raises(TypeError):
        chunk_sizes(4.0, 2)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- pictures

def test_pictures() -> None:
    import matplotlib.pyplot as plt

    fig = plot_batch_split(9, 4)
    assert "chunks [3, 3, 3], 3 replica(s) run" in fig.axes[0].get_title()
    plt.close(fig)
    fig = plot_batch_split(10, 8)
    assert "5 replica(s)" in fig.axes[0].get_title()
    plt.close(fig)
    plt.close(plot_mechanism(3))
