"""course_utils.checkpoints.loading: load_checkpoint, strip_prefixes, load_weights and the optimizer state, the
map_location checks, the 2019 lecture's GPU checkpoints and the GPU checkpoints shipped in notebooks/data/."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from conftest import message
from torch import nn

from course_utils.checkpoints.loading import (
    CheckpointError,
    find_state_dict,
    load_checkpoint,
    load_optimizer_state,
    load_weights,
    move_optimizer_state,
    strip_prefixes,
)
from course_utils.exercises.loading_across_devices import check_gpu_checkpoint_on_cpu
from course_utils.models import FooNet

ROOT = Path(__file__).resolve().parents[1]


SHIPPED = ROOT / "notebooks" / "data"
SHIPPED_FILES = ["06_foonet_cuda0.pt", "06_foonet_dataparallel.pt", "06_foonet_compiled.pt",
                 "06_foonet_training_cuda0.pt", "06_exercise_classifier.pt"]
LECTURE_STATE_DICTS = ["l30_model_in_gpu_0.pkl", "l30_model_in_multi_gpu.pkl", "l31_model_in_multi_gpu.pkl"]


# ------------------------------------------------------------------------------------ load_checkpoint

def test_loads_a_state_dict_safely_onto_the_cpu(saved):
    state = load_checkpoint(saved)
    assert list(state) == ["linears.0.weight", "linears.1.weight", "linears.2.weight"]
    assert {t.device.type for t in state.values()} == {"cpu"}


def test_missing_file_names_it_and_suggests_a_close_name(saved):
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(saved.with_name("fonet.pt"))
    assert "fonet.pt: no such file" in message(e) and "Did you mean" in message(e) and "foonet.pt" in message(e)


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist either"):
        load_checkpoint(tmp_path / "nowhere" / "x.pt")


def test_a_folder_lists_the_checkpoints_inside(saved):
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(saved.parent)
    assert "is a folder, not a checkpoint file" in message(e) and "foonet.pt" in message(e)


def test_map_location_naming_a_missing_device(saved):
    if torch.cuda.device_count() >= 8:
        pytest.skip("this machine has cuda:7")
    with pytest.raises(CheckpointError, match="names a device this machine does not have"):
        load_checkpoint(saved, map_location="cuda:7")
    with pytest.raises(CheckpointError, match="is not a device"):
        load_checkpoint(saved, map_location="gpu")


def _stored_error(stem: str, source: str) -> str:
    """The message of the error a notebook's cell with this source shows in its stored output."""
    import json

    for cell in json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "code" and "".join(cell["source"]) == source:
            return next(o["evalue"] for o in cell["outputs"] if o["output_type"] == "error")
    raise LookupError(f"notebooks/{stem}.ipynb has no cell {source!r}")


def test_map_location_message_is_the_one_notebook_06_shows(saved, tmp_path, monkeypatch):
    """On a machine with only a CPU (as course_utils.devices sees it), the message is word for word the
    one notebook 06 shows."""
    import course_utils.devices as devices

    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    monkeypatch.setattr(devices, "_other_accelerator", lambda: None)
    (tmp_path / "data").mkdir()
    saved.rename(tmp_path / "data" / "06_foonet_cuda0.pt")
    monkeypatch.chdir(tmp_path)
    cell = 'load_checkpoint("data/06_foonet_cuda0.pt", map_location="cuda:1")'
    with pytest.raises(CheckpointError) as e:
        load_checkpoint("data/06_foonet_cuda0.pt", map_location="cuda:1")
    assert message(e) == _stored_error("06_loading_across_devices", cell)


def test_map_location_devices_are_checked_by_course_utils_devices(saved, monkeypatch):
    """The rules are get_device's: each accelerator's count, one CPU, one MPS device; the device as resolved
    there (spaces trimmed) goes to torch.load."""
    import course_utils.devices as devices

    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    monkeypatch.setattr(devices, "_other_accelerator", lambda: ("xpu", 2))
    for missing in ("xpu:2", "cuda", "mps", "cpu:1"):
        with pytest.raises(CheckpointError, match=r"names a device this machine does not have \(it has xpu:0, "
                                                  r"xpu:1, cpu\)"):
            load_checkpoint(saved, map_location=missing)
    for not_a_device in ("gpu", "", "cuda:x"):
        with pytest.raises(CheckpointError, match="is not a device. Use 'cpu', 'cuda'"):
            load_checkpoint(saved, map_location=not_a_device)
    state = load_checkpoint(saved, map_location=" cpu ")
    assert {t.device.type for t in state.values()} == {"cpu"}
    with pytest.raises(CheckpointError, match="map_location='cuda' names a device"):
        load_weights(FooNet(), saved, map_location="cuda")


@pytest.mark.parametrize("where", ["cpu", torch.device("cpu"), {"cuda:0": "cpu"},
                                   lambda storage, loc: storage, None])
def test_map_location_forms(saved, where):
    state = load_checkpoint(saved, map_location=where)
    assert {t.device.type for t in state.values()} == {"cpu"}


# -------------------------------------------------------------------------------------- strip_prefixes

def test_strip_prefixes_only_at_the_start_and_repeatedly():
    t = torch.zeros(1)
    state = OrderedDict([("module._orig_mod.fc.weight", t), ("_orig_mod.module.fc.bias", t),
                         ("features.module.weight", t), ("submodule.weight", t)])
    out = strip_prefixes(state)
    assert list(out) == ["fc.weight", "fc.bias", "features.module.weight", "submodule.weight"]
    assert list(state)[0] == "module._orig_mod.fc.weight"  # the input is unchanged
    assert out["fc.weight"] is t
    assert list(strip_prefixes({"backbone.x": t}, ("backbone.",))) == ["x"]


def test_strip_prefixes_keeps_metadata_in_step():
    wrapped = nn.DataParallel(nn.BatchNorm1d(3)).state_dict()
    out = strip_prefixes(wrapped)
    assert "" in out._metadata and not any(k.startswith("module") for k in out._metadata)
    nn.BatchNorm1d(3).load_state_dict(out)


def test_strip_prefixes_rejects_non_mappings_and_collisions():
    with pytest.raises(TypeError):
        strip_prefixes([("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="two keys become 'w'"):
        strip_prefixes({"module.w": 1, "w": 2})


# ---------------------------------------------------------------------------------------- load_weights

def test_load_weights_from_wrapped_and_training_checkpoints(saved):
    want = load_checkpoint(saved)
    dp = OrderedDict(("module._orig_mod." + k, v) for k, v in want.items())
    for source in (saved, dp, {"epoch": 3, "model_state_dict": dp}, {"state_dict": want}, {"net": want},
                   {"model": want}):
        model = load_weights(FooNet(), source)
        assert all(torch.equal(model.state_dict()[k], v) for k, v in want.items())


def test_load_weights_into_a_wrapped_model(saved):
    wrapped = nn.DataParallel(FooNet())
    assert load_weights(wrapped, saved) is wrapped
    # With GPUs, DataParallel has moved the module to cuda:0, and load_weights loads onto the model's device.
    weight = wrapped.module.linears[0].weight
    assert torch.equal(weight.cpu(), load_checkpoint(saved)["linears.0.weight"])


def test_load_weights_mismatch_lists_missing_unexpected_and_shapes(saved):
    class Other(FooNet):
        def __init__(self) -> None:
            super().__init__()
            self.linears[0] = nn.Linear(3, 4, bias=False)
            self.linears.append(nn.Linear(3, 3, bias=False))
            self.head = nn.Linear(3, 1)

    state = dict(load_checkpoint(saved), extra=torch.zeros(2))
    with pytest.raises(CheckpointError) as e:
        load_weights(Other(), state)
    text = message(e)
    assert "does not fit Other" in text and "\n" in text
    assert "missing in the checkpoint (3): linears.3.weight, head.weight, head.bias" in text
    assert "unexpected in the checkpoint (1): extra" in text
    assert "linears.0.weight: checkpoint (3, 3), model (4, 3)" in text
    with pytest.raises(CheckpointError, match="wrong shape"):
        load_weights(Other(), state, strict=False)  # wrong shapes are errors even when not strict


def test_load_weights_non_strict_skips_missing_keys(saved):
    partial = dict(load_checkpoint(saved))
    del partial["linears.2.weight"]
    model = load_weights(FooNet(), partial, strict=False)
    assert torch.equal(model.linears[0].weight, partial["linears.0.weight"])


def test_load_weights_hints_at_an_unknown_prefix(saved):
    state = {"backbone." + k: v for k, v in load_checkpoint(saved).items()}
    with pytest.raises(CheckpointError, match="carry the prefix 'backbone.'"):
        load_weights(FooNet(), state)


def test_load_weights_warning_points_at_the_callers_line(saved, tmp_path):
    """Which of several sets of weights was taken is said at the line that called load_weights (or
    find_state_dict), not inside course_utils."""
    weights = load_checkpoint(saved)
    both = {"state_dict": weights, "ema": weights}
    torch.save(both, tmp_path / "both.pt")
    for call in (lambda: load_weights(FooNet(), both), lambda: load_weights(FooNet(), tmp_path / "both.pt"),
                 lambda: find_state_dict(both)):
        with pytest.warns(UserWarning, match=r"took the model weights from checkpoint\['state_dict'\]") as got:
            call()
        assert [Path(w.filename).name for w in got] == [Path(__file__).name]


def test_load_weights_bad_arguments(saved):
    with pytest.raises(TypeError, match="first argument must be the model"):
        load_weights(load_checkpoint(saved), FooNet())  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="no model weights found"):
        load_weights(FooNet(), {"epoch": 1, "loss": 0.5})
    with pytest.raises(CheckpointError, match="no model weights found in a list"):
        find_state_dict([1, 2])


# ------------------------------------------------------------------------------------------ optimizers

def _trained(seed: int = 0) -> tuple[FooNet, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = FooNet()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
    return model, opt


def test_optimizer_state_resumes_from_a_file(tmp_path):
    model, opt = _trained()
    path = tmp_path / "train.pt"
    torch.save({"epoch": 3, "model_state_dict": model.state_dict(), "optimizer_state_dict": opt.state_dict()},
               path)
    resumed = load_weights(FooNet(), path)
    new_opt = load_optimizer_state(torch.optim.Adam(resumed.parameters(), lr=0.01), path)
    p = next(resumed.parameters())
    assert int(new_opt.state[p]["step"]) == 3 and new_opt.state[p]["exp_avg"].device == p.device
    resumed(torch.randn(4, 3)).sum().backward()
    new_opt.step()
    assert int(new_opt.state[p]["step"]) == 4


def test_optimizer_state_errors():
    _, opt = _trained()
    with pytest.raises(CheckpointError, match="no optimizer state found"):
        load_optimizer_state(opt, {"epoch": 1})
    other = torch.optim.Adam(nn.Linear(3, 3).parameters())
    with pytest.raises(CheckpointError, match="does not fit this Adam"):
        load_optimizer_state(other, {"optimizer": opt.state_dict()})
    with pytest.raises(TypeError):
        load_optimizer_state(object(), {})  # type: ignore[arg-type]



def test_move_optimizer_state_follows_the_parameters_and_leaves_step():
    model, opt = _trained()
    model.to(torch.float64)  # the parameters change after the state exists: the state must follow
    p = next(model.parameters())
    step = opt.state[p]["step"]
    assert opt.state[p]["exp_avg"].dtype == torch.float32
    assert move_optimizer_state(opt) is opt
    assert opt.state[p]["exp_avg"].dtype == torch.float64 and opt.state[p]["exp_avg_sq"].dtype == torch.float64
    assert opt.state[p]["step"] is step and step.dtype == torch.float32 and step.device.type == "cpu"
    model(torch.randn(4, 3, dtype=torch.float64)).sum().backward()
    opt.step()
    assert int(opt.state[p]["step"]) == 4


def test_move_optimizer_state_puts_a_fused_step_on_the_device_as_float32():
    model = FooNet()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=True)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    p = next(model.parameters())
    opt.state[p]["step"] = opt.state[p]["step"].to(torch.float64)
    move_optimizer_state(opt)
    assert opt.state[p]["step"].dtype == torch.float32 and opt.state[p]["step"].device == p.device


def test_move_optimizer_state_adds_no_state_and_rejects_non_optimizers():
    opt = torch.optim.Adam(FooNet().parameters())
    move_optimizer_state(opt)
    assert len(opt.state) == 0
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        move_optimizer_state(object())  # type: ignore[arg-type]


# ---------------------------------------------------------------------- the 2019 lecture's GPU files

@pytest.mark.parametrize("name", LECTURE_STATE_DICTS)
def test_lecture_gpu_checkpoints_load_into_foonet_on_the_cpu(original_course, name):
    if not torch.cuda.is_available():  # the lecture's error, and the clear one
        with pytest.raises(RuntimeError, match="Attempting to deserialize object on a CUDA device"):
            torch.load(original_course / name)
        with pytest.raises(CheckpointError, match="saved on a CUDA device.*map_location='cpu'"):
            load_checkpoint(original_course / name, map_location=None)
    model = load_weights(FooNet(), original_course / name)
    assert model.linears[0].weight.device.type == "cpu"
    assert torch.equal(model.linears[0].weight, strip_prefixes(
        load_checkpoint(original_course / name))["linears.0.weight"])
    assert check_gpu_checkpoint_on_cpu(model, original_course / name)


def test_lecture_whole_model_pickle(original_course):
    path = original_course / "l31_foo_net.pkl"
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    assert "__main__.FooNet2" in message(e) and "trusted=True" in message(e)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, trusted=True)
    assert "class FooNet2" in message(e) and "cannot be found here" in message(e)


# ------------------------------------------------------------------ the GPU checkpoints shipped in data/

@pytest.mark.parametrize("name", SHIPPED_FILES)
def test_shipped_gpu_checkpoints(name):
    path = SHIPPED / name
    assert path.is_file(), f"notebooks/data/{name} is committed in the repository and must be there"
    obj = load_checkpoint(path)  # safe loader, onto the CPU
    weights = strip_prefixes(find_state_dict(obj))
    assert weights and {t.device.type for t in weights.values()} == {"cpu"}
    if not torch.cuda.is_available():
        with pytest.raises(CheckpointError, match="saved on a CUDA device"):
            load_checkpoint(path, map_location=None)  # really saved on a GPU
    if name.startswith("06_foonet"):
        load_weights(FooNet(), obj)
    if name == "06_foonet_training_cuda0.pt":
        model = load_weights(FooNet(), obj)
        opt = load_optimizer_state(torch.optim.Adam(model.parameters(), lr=0.01), obj)
        assert int(opt.state[next(model.parameters())]["step"]) == obj["epoch"]
