"""course_utils.distributed.ddp_train, the job notebook 05 runs under torchrun: one hash for the run, the same
hash after an injected fault and a restart, after a corrupt snapshot, and on two "nodes"; its snapshots and
hash. The torchrun runs are shared between tests (module-scoped fixtures): starting a worker costs seconds."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from course_utils.distributed import torchrun as T
from course_utils.distributed.ddp_train import (
    SnapshotError,
    find_latest_snapshot,
    load_snapshot,
    save_snapshot,
    weights_sha256,
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
