"""course_utils.sharded_checkpoints: DCP folders saved and checked in one process (no process group)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from course_utils.checkpoints import CheckpointError
from course_utils.models import GPT, GPTConfig
from course_utils.sharded_checkpoints import (
    check_divisible,
    check_sharded_checkpoint,
    load_sharded,
    save_sharded,
)

CFG = GPTConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=1)


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    weights = GPT(CFG).state_dict()
    return save_sharded({"model": weights}, tmp_path / "step-10"), weights


def test_save_then_load_in_one_process(saved: tuple[Path, dict[str, torch.Tensor]]) -> None:
    folder, weights = saved
    assert folder.is_dir() and not folder.with_name("step-10.partial").exists()
    torch.manual_seed(1)
    fresh = {"model": GPT(CFG).state_dict()}
    load_sharded(fresh, folder)
    assert all(torch.equal(fresh["model"][k], weights[k]) for k in weights)


def test_half_written_folder_is_refused_with_a_clear_message(saved: tuple[Path, dict], tmp_path: Path) -> None:
    folder, _ = saved
    half = tmp_path / "half"
    shutil.copytree(folder, half)
    os.remove(half / ".metadata")
    with pytest.raises(CheckpointError, match=r"half-written checkpoint: it holds 1 shard file\(s\) \(__0_0.distcp\)"):
        load_sharded({"model": GPT(CFG).state_dict()}, half)


def test_missing_empty_file_and_lost_shard(saved: tuple[Path, dict], tmp_path: Path) -> None:
    folder, _ = saved
    with pytest.raises(CheckpointError, match="no such checkpoint folder"):
        check_sharded_checkpoint(tmp_path / "nothing")
    (tmp_path / "nothing.partial").mkdir()
    with pytest.raises(CheckpointError, match=r"nothing.partial exists: a save into it did not finish"):
        check_sharded_checkpoint(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="is empty"):
        check_sharded_checkpoint(tmp_path / "empty")
    (tmp_path / "model.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="is a file"):
        check_sharded_checkpoint(tmp_path / "model.pt")
    lost = tmp_path / "lost"
    shutil.copytree(folder, lost)
    os.remove(lost / "__0_0.distcp")
    with pytest.raises(CheckpointError, match=r"lacks 1 of the 1 shard files its .metadata names: __0_0.distcp"):
        check_sharded_checkpoint(lost)
    cut = tmp_path / "cut"
    shutil.copytree(folder, cut)
    data = (cut / "__0_0.distcp").read_bytes()
    (cut / "__0_0.distcp").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="end before the data"):
        check_sharded_checkpoint(cut)


def test_a_resave_replaces_the_old_folder_and_a_stale_partial(saved: tuple[Path, dict]) -> None:
    folder, weights = saved
    stale = folder.with_name(folder.name + ".partial")
    stale.mkdir()
    (stale / "junk").write_text("left by an interrupted save")
    zeros = {k: torch.zeros_like(v) for k, v in weights.items()}
    save_sharded({"model": zeros}, folder)
    out = {"model": GPT(CFG).state_dict()}
    load_sharded(out, folder)
    assert all(torch.count_nonzero(v) == 0 for v in out["model"].values()) and not stale.exists()


def test_check_divisible() -> None:
    assert check_divisible(16, 4) == 4
    with pytest.raises(ValueError, match=r"the global batch \(16\) does not divide among 3 ranks \(16 = 5 × 3 \+ 1\)"):
        check_divisible(16, 3)
    with pytest.raises(ValueError, match="at least 1"):
        check_divisible(16, 0)
