"""course_utils.hardware.transfer: the sizes, buffers and timed copies of notebook 02's bandwidth sweep,
its table and its plot (on the CPU; pinned memory is refused where no accelerator is present)."""

from __future__ import annotations

import pytest
import torch

from course_utils.hardware import transfer


def test_transfer_sizes():
    sizes = transfer.transfer_sizes()
    assert sizes[0] == 4 << 10 and sizes[-1] == 1 << 30 and len(sizes) == 10
    assert transfer.transfer_sizes(1 << 20, 1 << 10, 32) == [1 << 10, 1 << 15, 1 << 20]
    with pytest.raises(ValueError):
        transfer.transfer_sizes(10, 100)


def test_buffers_and_bad_names():
    src, dst = transfer.transfer_buffers("h2d", 1024, "pageable", "cpu")
    assert src.numel() == dst.numel() == 1024 and src.dtype == torch.uint8
    assert int(src.sum()) == 1024  # filled: every page touched
    src, dst = transfer.transfer_buffers("d2h", 2048, "pageable", "cpu")
    assert int(src.sum()) == 2048
    with pytest.raises(ValueError, match="h2d"):
        transfer.transfer_buffers("up", 1024, "pageable", "cpu")
    with pytest.raises(ValueError, match="pinned"):
        transfer.measure_transfer("h2d", 1024, "locked", "cpu")


@pytest.mark.skipif(torch.accelerator.is_available(), reason="pinning works where an accelerator is present")
def test_pinned_without_accelerator_says_what_to_do():
    with pytest.raises(RuntimeError, match="pageable"):
        transfer.host_buffer(1024, pinned=True)


def test_measure_and_sweep_on_cpu():
    seen = []
    results = transfer.bandwidth_sweep("cpu", sizes=[4096, 65536], memories=("pageable",),
                                       progress=seen.append, repeat=3, warmup=1, min_sample_time=0.001)
    assert len(results) == len(seen) == 4
    r = results[0]
    assert (r.direction, r.memory, r.nbytes, r.non_blocking) == ("h2d", "pageable", 4096, False)
    assert r.gbps > 0 and r.seconds > 0 and "GB/s" in str(r)
    table = transfer.results_table(results)
    assert "H2D pageable" in table and "D2H pageable" in table and "64 KiB" in table
    assert "pinned" not in table
    fig = transfer.plot_bandwidth(results)
    assert len(fig.axes[0].lines) == 2
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_measure_transfer_times_the_copy_only():
    # The destination is made once, outside the timed call: copy_ writes into the same storage.
    r = transfer.measure_transfer("h2d", 1 << 16, "pageable", "cpu", repeat=3, warmup=1,
                                  min_sample_time=0.001)
    assert r.timing.method == "perf_counter" and r.timing.number >= 1
    with pytest.raises(ValueError, match="d2h"):
        transfer.bandwidth_sweep("cpu", sizes=[4096], directions=("sideways",))
