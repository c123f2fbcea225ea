"""course_utils.checkpoints.sharded: DCP folders saved and checked in one process (no process group)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from course_utils.checkpoints.loading import (
    CheckpointError,
    load_checkpoint,
    load_optimizer_state,
    load_weights,
    read_state_dict,
)
from course_utils.checkpoints.sharded import (
    check_divisible,
    check_sharded_checkpoint,
    load_sharded,
    save_sharded,
)
from course_utils.models import GPT, GPTConfig, token_batch

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


# --- folders that are not DCP checkpoints ------------------------------------------------------------------

@pytest.fixture
def mesh() -> Iterator[DeviceMesh]:
    """A one-process gloo group and its mesh, for FSDP2 in the test process."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def _sharded_gpt(mesh: DeviceMesh, seed: int) -> GPT:
    torch.manual_seed(seed)
    model = GPT(CFG)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _fsdp2_example_checkpoint(root: Path, mesh: DeviceMesh, dcp_api: bool) -> tuple[Path, dict, dict]:
    """A checkpoint saved as pytorch/examples' distributed/FSDP2 (train.py, checkpoint.py) saves one: the
    model's and the optimizer's full (unsharded) state dicts, gathered with the DCP state_dict API
    (--dcp-api) or by hand from the DTensors (full_tensor()), and written by torch.save into
    checkpoints/{dcp_api|dtensor_api}/<time in ms>/model_state_dict.pt and optim_state_dict.pt."""
    model = _sharded_gpt(mesh, seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.loss(token_batch(CFG, torch.Generator().manual_seed(0))).backward()
    opt.step()
    opt.zero_grad()
    if dcp_api:
        model_sd = get_model_state_dict(model, options=FULL)
        optim_sd = get_optimizer_state_dict(model, opt, options=FULL)
    else:
        model_sd = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}
        sharded = opt.state_dict()
        optim_sd = {"param_groups": sharded["param_groups"],
                    "state": {i: {a: (t.full_tensor() if isinstance(t, DTensor) else t).cpu() for a, t in s.items()}
                              for i, s in sharded["state"].items()}}
    folder = root / "checkpoints" / ("dcp_api" if dcp_api else "dtensor_api") / str(int(time.time() * 1000))
    folder.mkdir(parents=True)
    torch.save(model_sd, folder / "model_state_dict.pt")
    torch.save(optim_sd, folder / "optim_state_dict.pt")
    return folder, copy.deepcopy(model_sd), get_optimizer_state_dict(model, opt, options=FULL)


def _equal(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("dcp_api", [True, False], ids=["dcp_api", "dtensor_api"])
def test_a_folder_of_torch_save_files_is_named_with_how_to_load_them(tmp_path: Path, mesh: DeviceMesh,
                                                                       dcp_api: bool) -> None:
    folder, weights, optim_by_name = _fsdp2_example_checkpoint(tmp_path, mesh, dcp_api)
    with pytest.raises(CheckpointError) as e:
        load_sharded({"model": GPT(CFG).state_dict()}, folder)
    text = str(e.value)
    assert "half-written" not in text and "interrupted" not in text
    assert text.startswith(f"{folder} is not a torch.distributed.checkpoint (DCP) checkpoint: it has no .metadata")
    assert "2 file(s) written by torch.save: model_state_dict.pt, optim_state_dict.pt" in text
    # the parent folders: they name the folder that holds the files
    with pytest.raises(CheckpointError, match=rf"folders that do hold checkpoints: {folder.name} \(torch.save files: "
                                              r"model_state_dict.pt, optim_state_dict.pt\)\. Pass one of them"):
        check_sharded_checkpoint(folder.parent)
    with pytest.raises(CheckpointError, match=rf"is a folder, not a checkpoint file. It holds no checkpoint files "
                                              rf"itself, but folders that do: {folder.name} \(torch.save files: "
                                              r"model_state_dict.pt, optim_state_dict.pt\)\. Pass a file from one"):
        load_checkpoint(folder.parent)

    # the advice, followed: load_checkpoint reads each file
    assert _equal(load_checkpoint(folder / "model_state_dict.pt"), weights)
    assert set(load_checkpoint(folder / "optim_state_dict.pt")) == {"state", "param_groups"}
    # load_weights and load_optimizer_state put them into a plain model and its optimizer
    plain = load_weights(GPT(CFG), folder / "model_state_dict.pt")
    assert _equal(plain.state_dict(), weights)
    plain_opt = load_optimizer_state(torch.optim.Adam(plain.parameters(), lr=1e-2), folder / "optim_state_dict.pt")
    assert torch.equal(plain_opt.state[plain.tok.weight]["exp_avg"], optim_by_name["state"]["tok.weight"]["exp_avg"])
    # set_model_state_dict puts the full weights into an FSDP2 model (other initial weights)
    sharded = _sharded_gpt(mesh, seed=1)
    set_model_state_dict(sharded, load_checkpoint(folder / "model_state_dict.pt"),
                         options=StateDictOptions(full_state_dict=True))
    assert _equal(get_model_state_dict(sharded, options=FULL), weights)
    # set_optimizer_state_dict takes an optimizer state keyed by parameter names (the --dcp-api files) ...
    opt = torch.optim.Adam(sharded.parameters(), lr=1e-2)
    state = load_checkpoint(folder / "optim_state_dict.pt")
    if dcp_api:
        set_optimizer_state_dict(sharded, opt, state, options=StateDictOptions(full_state_dict=True))
        got = get_optimizer_state_dict(sharded, opt, options=FULL)["state"]
        assert all(_equal(got[k], optim_by_name["state"][k]) for k in optim_by_name["state"])
    else:  # ... which is what the message says: one keyed by numbers it does not take
        assert all(isinstance(k, int) for k in state["state"])
        with pytest.raises(KeyError):
            set_optimizer_state_dict(sharded, opt, state, options=StateDictOptions(full_state_dict=True))


def test_load_checkpoint_names_a_dcp_folder_and_its_conversion_works(saved: tuple[Path, dict], tmp_path: Path) -> None:
    folder, weights = saved
    with pytest.raises(CheckpointError, match=r"step-10 is a checkpoint written by torch.distributed.checkpoint "
                                              r"\(DCP\): a folder with a .metadata file and 1 shard file\(s\)"):
        load_checkpoint(folder)
    dcp_to_torch_save(folder, tmp_path / "checkpoint.pt")  # the advice, followed
    assert _equal(load_checkpoint(tmp_path / "checkpoint.pt")["model"], weights)
    half = tmp_path / "half"
    shutil.copytree(folder, half)
    os.remove(half / ".metadata")
    with pytest.raises(CheckpointError, match=r"half is a half-written checkpoint: it holds 1 shard file\(s\)"):
        load_checkpoint(half)


def test_other_folders_are_named_not_called_half_written(tmp_path: Path) -> None:
    torch.manual_seed(0)
    weights = GPT(CFG).state_dict()
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt"}))
    save_file(weights, hf / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as e:
        check_sharded_checkpoint(hf)
    text = str(e.value)
    assert "is not a torch.distributed.checkpoint (DCP) checkpoint" in text and "half-written" not in text
    assert "a model folder in Hugging Face's layout" in text and "read_state_dict(path)" in text
    assert _equal(read_state_dict(hf), weights)  # the advice, followed
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "readme.txt").write_text("no checkpoint here")
    with pytest.raises(CheckpointError, match=r"no .metadata and no .distcp shard files. It holds readme.txt\.$"):
        check_sharded_checkpoint(notes)
