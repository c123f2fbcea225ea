"""course_utils.distributed.ddp_demos: notebook 05's demos in gloo processes (all-reduce by hand against DDP,
no_sync, BatchNorm, unused parameters, a skipped and a mismatched collective), and that importing them computes
nothing (each spawned worker imports the module)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from course_utils.distributed import ddp_demos as W
from course_utils.distributed import launch as L


def test_all_reduce_equals_ddp_equals_one_process() -> None:
    for r in L.launch(W.compare_gradients, 2):
        assert r["manual_vs_single"] and r["ddp_vs_single"] and r["manual_vs_ddp"], r
        assert r["max_diff"] < 1e-6


def test_collectives_demo() -> None:
    ranks = L.launch(W.collectives_demo, 2)
    assert ranks[0][1].endswith("[3.0, 30.0]") and ranks[1][1].endswith("[3.0, 30.0]")
    assert ranks[1][2].endswith("[0.0, 0.0]")  # broadcast from rank 0


IMPORT_PROBE = """
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

calls, modules = [], []
class Record(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        calls.append(getattr(func, "__name__", repr(func)))
        return func(*args, **(kwargs or {}))
init = nn.Module.__init__
def counted(self, *args, **kwargs):
    modules.append(type(self).__name__)
    init(self, *args, **kwargs)
nn.Module.__init__ = counted
rng = torch.get_rng_state()
with Record():
    from course_utils.distributed import ddp_demos
print(calls, modules, torch.equal(rng, torch.get_rng_state()), ddp_demos._sync_buffers_flag.cache_info().currsize)
"""


def test_importing_the_workers_computes_nothing() -> None:
    """``import ddp_demos`` (each spawned worker does it) makes no tensor, no model, draws nothing and looks
    nothing up: the workers do their work when called."""
    r = subprocess.run([sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[-2] == "[] [] True 0", r.stdout


def test_no_sync_skips_the_all_reduce_and_keeps_the_gradients() -> None:
    for r in L.launch(W.accumulate_gradients, 2):
        assert r["every backward"] == {"all_reduces": 4, "equals_big_batch": True}, r
        assert r["no_sync"] == {"all_reduces": 1, "equals_big_batch": True}, r


def test_batchnorm_per_rank_statistics_and_buffer_sync() -> None:
    for r in L.launch(W.batchnorm_demo, 2):
        assert r["grads_equal_big_batch"] is False  # each rank normalises with its own batch
        assert r["sync_buffers=True"]["same_running_mean_at_each_forward"] is True
        assert r["sync_buffers=False"]["same_running_mean_at_each_forward"] is False


def test_sync_batchnorm_is_refused_on_the_cpu() -> None:
    for r in L.launch(W.batchnorm_demo, 2, True):
        assert r["converted"] == "SyncBatchNorm"
        assert r["error"] == "ValueError: SyncBatchNorm layers only work with GPU modules"
        assert r["forward_error"].startswith("ValueError: SyncBatchNorm expected input tensor to be on GPU")


def test_unused_parameters_error_debug_names_and_fix() -> None:
    plain = L.launch(W.unused_parameters, 2)[0]
    assert plain.startswith("step 1: RuntimeError: Expected to have finished reduction")
    assert "find_unused_parameters=True" in plain
    assert "Parameter indices which did not receive grad for rank 0: 4 5" in plain
    info = L.launch(W.unused_parameters, 2, env={"TORCH_DISTRIBUTED_DEBUG": "INFO"})[0]
    assert "Parameters which did not receive grad for rank 0: b.bias, b.weight" in info
    assert L.launch(W.unused_parameters, 2, True) == [
        "2 steps ran; parameters without a gradient: ['b.weight', 'b.bias']"] * 2


@pytest.mark.slow  # notebook 05 runs the same job under strict nbval in make test
def test_a_skipped_collective_times_out_and_detail_names_the_rank() -> None:
    plain = L.launch(W.skip_a_collective, 2, 2.0, group_timeout=1, quiet=True)
    assert plain[1] == "rank 1: skipped the all_reduce"
    assert plain[0].startswith("rank 0 after ") and "RuntimeError: Timed out waiting 1000ms" in plain[0]
    assert "/" not in plain[0]  # the C++ source location (a build path) is taken out
    detail = L.launch(W.skip_a_collective, 2, 2.0, group_timeout=1, quiet=True,
                      env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert "Ranks 1 failed to pass monitoredBarrier" in detail[0]


@pytest.mark.slow  # notebook 05 runs the same job under strict nbval in make test
def test_mismatched_collectives_under_detail() -> None:
    ranks = L.launch(W.mismatched_collectives, 2, group_timeout=2, quiet=True,
                     env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert "Detected mismatch between collectives on ranks" in ranks[0]
    assert "OpType=ALLREDUCE" in ranks[0] and "OpType=BROADCAST" in ranks[0]
    assert "TensorOptions(…)" in ranks[0] and "memory_format" not in ranks[0]
