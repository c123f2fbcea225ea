"""course_utils.distributed.hangs: notebook 09's distributed jobs that hang (uneven batches, a collective on
one rank) end in bounded time and say where each rank waits; join lets uneven ranks finish. The jobs themselves
are marked slow (notebook 09 runs them under strict nbval); where_it_waits is tested on a made-up dump."""

from __future__ import annotations

import time

import pytest

from course_utils.distributed.hangs import BATCHES, log_on_one_rank, uneven_epoch, where_it_waits
from course_utils.distributed.launch import launch


def test_where_it_waits_keeps_only_the_module_frames():
    import course_utils.distributed.hangs as hangs

    dump = (f'Thread 0x1 (most recent call first):\n  File "/x/torch/distributed/c10d.py", line 3 in barrier\n'
            f'  File "{hangs.__file__}", line 1 in uneven_epoch\n')
    (frame,) = where_it_waits(dump)
    assert frame.startswith("uneven_epoch(): ")
    assert where_it_waits("no frames") == []


@pytest.mark.slow  # notebook 09 runs the same job under strict nbval in make test
def test_uneven_batches_hang_until_the_timeout_and_say_where():
    """Rank 1 reaches its wait 2 s before rank 0 (whose extra batch is slow): its 4-second timeout fires first,
    and gloo closes its connections, which ends rank 0's wait with "Connection closed by peer" 1 s before
    rank 0's own timeout would. Each margin is a second or more, so the outcome does not depend on which
    process the machine runs first (two timeouts due at the same moment used to race)."""
    start = time.monotonic()
    reports = launch(uneven_epoch, 2, False, 3.0, 2.0, group_timeout=4, quiet=True, timeout=60)
    assert time.monotonic() - start < 30, "the hang demo must end within seconds"
    assert [r["batches"] for r in reports] == [BATCHES[0], BATCHES[1]], reports
    assert "Connection closed by peer" in (reports[0]["error"] or ""), reports
    assert "Timed out waiting 4000ms" in (reports[1]["error"] or ""), reports
    assert "loss.backward()" in reports[0]["waits_in"][0], reports
    assert "dist.barrier()" in reports[1]["waits_in"][0], reports


@pytest.mark.slow  # notebook 09 runs the same job under strict nbval in make test
def test_join_lets_uneven_ranks_finish():
    reports = launch(uneven_epoch, 2, True, None, group_timeout=2, quiet=True, timeout=60)
    assert [(r["steps"], r["error"]) for r in reports] == [(BATCHES[0], None), (BATCHES[1], None)]


@pytest.mark.slow  # notebook 09 runs the same job under strict nbval in make test
def test_detail_reports_a_collective_on_one_rank_at_once():
    start = time.monotonic()
    reports = launch(log_on_one_rank, 2, group_timeout=2, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
                     quiet=True, timeout=60)
    assert time.monotonic() - start < 30
    assert "OpType=ALLREDUCE" in reports[0]["error"] and "Detected mismatch" in reports[0]["error"], reports
    assert "OpType=BARRIER" in reports[1]["error"], reports
