"""Notebook 05: course_utils.distributed.launch, .ddp_demos, .torchrun, .ddp_train and the notebook-05 checkers.

The multi-process tests use gloo on 127.0.0.1 with free ports, a tiny model and few steps; the torchrun
runs are shared between tests (module-scoped fixtures), because starting a worker costs seconds.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_utils.distributed import ddp_demos as W
from course_utils.distributed import launch as L
from course_utils.distributed import torchrun as T
from course_utils.distributed.ddp_train import (
    SnapshotError,
    find_latest_snapshot,
    load_snapshot,
    save_snapshot,
    weights_sha256,
)
from course_utils.exercises.distributed_data_parallel import (
    check_average_gradients,
    check_epoch_orders,
    check_topology,
)

STEPS = ["--device", "cpu", "--steps", "12"]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ddp")


@pytest.fixture(scope="module")
def plain(work: Path) -> T.TorchrunResult:
    r = T.torchrun(["--standalone", "--nproc-per-node=2"], [*STEPS, "--checkpoint-dir", "plain"], cwd=work)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _hash_lines(r: T.TorchrunResult) -> list[str]:
    return [line for line in r.stdout.splitlines() if line.startswith("final weights sha256:")]


def test_free_port_is_bindable() -> None:
    port = L.free_port()
    assert 1024 <= port < 65536


def test_all_reduce_equals_ddp_equals_one_process() -> None:
    for r in L.launch(W.compare_gradients, 2):
        assert r["manual_vs_single"] and r["ddp_vs_single"] and r["manual_vs_ddp"], r
        assert r["max_diff"] < 1e-6


def test_collectives_demo() -> None:
    ranks = L.launch(W.collectives_demo, 2)
    assert ranks[0][1].endswith("[3.0, 30.0]") and ranks[1][1].endswith("[3.0, 30.0]")
    assert ranks[1][2].endswith("[0.0, 0.0]")  # broadcast from rank 0


def test_launch_reports_worker_error() -> None:
    with pytest.raises(L.WorkerError, match="rank 0"):
        L.launch(W.local_slice, 2)  # called as local_slice(rank, world_size): an argument is missing


def test_launch_refuses_main_function() -> None:
    def local(rank: int, world_size: int) -> None:  # pragma: no cover - never runs
        pass

    local.__module__ = "__main__"
    with pytest.raises(L.WorkerError, match="cannot import it"):
        L.launch(local, 2)


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


def test_error_message_drops_build_paths() -> None:
    exc = RuntimeError("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out")
    assert W.error_message(exc) == "RuntimeError: Timed out"
    peer = RuntimeError("Connection closed by peer [127.0.0.1]:4282. This is typically caused by a remote worker")
    assert W.error_message(peer).startswith("RuntimeError: Connection closed by peer [127.0.0.1]:PORT. This is")


TRAIN_SCRIPT = """\
import os
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for i in range(3):
    print(f"[rank {rank}] line {i}\\n", end="")
print(f"local rank {os.environ['LOCAL_RANK']}")  # no rank prefix: shown after the ranks' lines
dist.destroy_process_group()
"""


def test_torchrun_runs_a_script_and_groups_lines_by_rank(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "job.py").write_text(TRAIN_SCRIPT)
    r = T.torchrun(["--standalone", "--nproc-per-node=2"], [], cwd=tmp_path, script="job.py")
    assert r.returncode == 0, r.stderr[-3000:]
    r.show()
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == "$ torchrun --standalone --nproc-per-node=2 job.py"
    assert shown[1:7] == [f"  [rank {k}] line {i}" for k in (0, 1) for i in range(3)]
    # Untagged lines of the two ranks share one pipe: their order (and, under heavy load, their position
    # against the exit line) is not fixed, so only what the ranks tag is checked line by line. torch 2.9's
    # gloo also logs "[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks
    # is : 1" into that pipe, even between a print's text and its newline (a write is never split, but two
    # writes of one print can be): each rank's line must be there whole, and nothing else but gloo's words.
    rest = " ".join(shown[7:-1])
    for k in (0, 1):
        assert rest.count(f"local rank {k}") == 1, shown
        rest = rest.replace(f"local rank {k}", " ")
    gloo = set("[Gloo] Rank is connected to peer ranks. Expected number of connected peer ranks is :".split())
    assert all(word in gloo or word.isdigit() for word in rest.split()), shown
    assert shown[-1] == "  exit code 0"


def test_torchrun_prints_one_hash(plain: T.TorchrunResult) -> None:
    assert len(_hash_lines(plain)) == 1
    assert plain.sha256 is not None and len(plain.sha256) == 64


def test_show_prints_a_short_hash_and_two_decimal_losses(plain: T.TorchrunResult,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """What a notebook stores must not depend on the CPU: the full hash and 4-decimal losses do."""
    plain.show()
    shown = capsys.readouterr().out
    assert plain.sha256 is not None and plain.sha256 not in shown
    assert f"final weights sha256: {plain.sha256[:12]}…" in shown
    losses = [line.split("loss ")[1].split()[0] for line in shown.splitlines() if " loss " in line]
    assert losses and all(len(x.split(".")[1]) == 2 for x in losses), losses
    assert T.short_digest(None) == "(none)"


@pytest.mark.slow  # notebook 05 runs the same job under strict nbval in make test
def test_fault_injected_run_has_same_hash(plain: T.TorchrunResult, work: Path) -> None:
    r = T.torchrun(["--standalone", "--nproc-per-node=2", "--max-restarts=1"],
                   [*STEPS, "--checkpoint-dir", "faulty", "--fail-at-step", "6"], cwd=work)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "simulated crash at step 6" in r.stderr
    notable = r.notable_stderr()  # the crash, then torchrun naming the failed worker; no pids or paths
    assert notable[0] == "[rank 1] simulated crash at step 6 (attempt 0)", notable
    assert any(line.startswith("failed (exitcode: 1) local_rank: 1 (pid: <PID>) of binary: python")
               for line in notable), notable
    assert not any(ch.isdigit() for line in notable[1:] for ch in line.split("exitcode")[0]), notable
    assert "resumed from snapshot-000004.pt" in r.stdout
    assert r.sha256 == plain.sha256


@pytest.mark.slow  # notebook 05 runs the same job under strict nbval in make test
def test_corrupt_snapshot_is_skipped_and_run_resumes(plain: T.TorchrunResult, work: Path) -> None:
    folder = work / "corrupt"
    shutil.copytree(work / "plain", folder)
    newest = folder / "snapshot-000012.pt"
    newest.write_bytes(newest.read_bytes()[:-50])
    (folder / ".snapshot-000016.pt.tmp").write_bytes(b"half")
    r = T.torchrun(["--standalone", "--nproc-per-node=2"], [*STEPS, "--checkpoint-dir", "corrupt"], cwd=work)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "skipping snapshot-000012.pt fails its checksum" in r.stdout
    assert "resumed from snapshot-000008.pt" in r.stdout
    assert r.sha256 == plain.sha256


@pytest.mark.slow  # notebook 05 runs the same job under strict nbval in make test
def test_two_nodes_equal_one_node_of_four(work: Path) -> None:
    nodes = T.torchrun_two_nodes([*STEPS, "--checkpoint-dir", "nodes"], nproc_per_node=2, cwd=work)
    assert [r.returncode for r in nodes] == [0, 0], nodes[0].stderr[-3000:] + nodes[1].stderr[-3000:]
    hashes = [r.sha256 for r in nodes if r.sha256]
    assert len(hashes) == 1  # exactly one launch hosts rank 0
    single = T.torchrun(["--standalone", "--nproc-per-node=4"], [*STEPS, "--checkpoint-dir", "single"], cwd=work)
    assert single.returncode == 0, single.stderr[-3000:]
    assert "world size 4" in single.stdout
    assert hashes[0] == single.sha256


def test_snapshot_roundtrip_and_corruption(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    save_snapshot(tmp_path, 4, {"step": 4, "model": model.state_dict()})
    save_snapshot(tmp_path, 8, {"step": 8, "model": model.state_dict()})
    assert load_snapshot(tmp_path / "snapshot-000008.pt")["step"] == 8
    bad = tmp_path / "snapshot-000008.pt"
    data = bytearray(bad.read_bytes())
    data[-5] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match="checksum"):
        load_snapshot(bad)
    (tmp_path / "snapshot-000012.pt").write_bytes(b"not a snapshot")
    messages: list[str] = []
    path, state = find_latest_snapshot(tmp_path, log=messages.append)
    assert path.name == "snapshot-000004.pt" and state["step"] == 4
    assert len(messages) == 2 and "bad header" in messages[0]
    assert find_latest_snapshot(tmp_path / "missing") is None
    assert not list(tmp_path.glob("*.tmp"))


def test_weights_sha256_depends_on_every_byte() -> None:
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    assert weights_sha256(a) == weights_sha256(b)
    with torch.no_grad():
        b.bias[0] = torch.nextafter(b.bias[0], torch.tensor(1.0))
    assert weights_sha256(a) != weights_sha256(b)


def test_check_topology() -> None:
    assert check_topology({"world_size": 8, "rank": 6, "local_rank": 2, "local_world_size": 4})
    v = check_topology({"world_size": 8, "rank": 10, "local_rank": 2, "local_world_size": 4})
    assert not v and "nodes count from 1" in v.message and "numbered from 0" in v.closer
    assert not check_topology({"world_size": 4, "rank": 6, "local_rank": 2, "local_world_size": 4})
    assert "no local_world_size" in check_topology({"world_size": 8, "rank": 6, "local_rank": 2}).message


def test_check_epoch_orders() -> None:
    def fixed(sampler, epochs):  # type: ignore[no-untyped-def]
        return [list(sampler) for _ in range(epochs)]

    def good(sampler, epochs):  # type: ignore[no-untyped-def]
        out = []
        for e in range(epochs):
            sampler.set_epoch(e)
            out.append(list(sampler))
        return out

    v = check_epoch_orders(fixed)
    assert not v and "same order" in v.message
    assert check_epoch_orders(good)


def average_gradients_ok(model):  # type: ignore[no-untyped-def]
    for p in model.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)  # noqa: F821 - the checker provides dist
        p.grad /= dist.get_world_size()  # noqa: F821


def average_gradients_sum_only(model):  # type: ignore[no-untyped-def]
    for p in model.parameters():
        dist.all_reduce(p.grad)  # noqa: F821


def average_gradients_nothing(model):  # type: ignore[no-untyped-def]
    for p in model.parameters():
        p.grad.clone()


def test_check_average_gradients() -> None:
    assert check_average_gradients(average_gradients_ok)
    v = check_average_gradients(average_gradients_sum_only)
    assert not v and "2× the average" in v.message
    v = check_average_gradients(average_gradients_nothing)
    assert not v and "only its own gradient" in v.message
