"""course_utils.checkpoints and the notebook-06 checkers: every error path, the 2019 GPU checkpoints."""

from __future__ import annotations

import io
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

from course_utils.checkpoints import (
    CheckpointError,
    find_state_dict,
    load_checkpoint,
    load_optimizer_state,
    load_weights,
    strip_prefixes,
)
from course_utils.exercises.checkpoints import check_gpu_checkpoint_on_cpu, check_two_prefix_repair

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "notebooks" / "data"
SHIPPED_FILES = ["06_foonet_cuda0.pt", "06_foonet_dataparallel.pt", "06_foonet_compiled.pt",
                 "06_foonet_training_cuda0.pt", "06_exercise_classifier.pt"]
LECTURE_STATE_DICTS = ["l30_model_in_gpu_0.pkl", "l30_model_in_multi_gpu.pkl", "l31_model_in_multi_gpu.pkl"]


class FooNet(nn.Module):
    """The lecture's network."""

    def __init__(self, out: int = 3) -> None:
        super().__init__()
        self.linears = nn.ModuleList([nn.Linear(3, out, bias=False) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for linear in self.linears:
            x = torch.relu(linear(x))
        return x


class TwoPart(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.submodule = nn.Linear(4, 2)


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (io.open, (str(self.marker), "w"))


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "foonet.pt"
    torch.save(FooNet().state_dict(), path)
    return path


def message(exc_info: pytest.ExceptionInfo) -> str:
    return str(exc_info.value)


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


def test_empty_file(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"empty\.pt is empty \(0 bytes\)"):
        load_checkpoint(tmp_path / "empty.pt")


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_truncated_zip_checkpoint(saved, cut):
    data = saved.read_bytes()
    saved.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(CheckpointError, match="is truncated or corrupt") as e:
        load_checkpoint(saved)
    assert "Save or download it again" in message(e)


def test_truncated_legacy_checkpoint(tmp_path):
    path = tmp_path / "legacy.pt"
    torch.save(FooNet().state_dict(), path, _use_new_zipfile_serialization=False)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(CheckpointError, match="is truncated or corrupt"):
        load_checkpoint(path)


@pytest.mark.parametrize("damage", ["directory", "pickle"])
def test_corrupt_zip_checkpoint(saved, damage):
    data = bytearray(saved.read_bytes())
    if damage == "directory":
        end = data.rfind(b"PK\x05\x06")
        data[end:end + 4] = b"XXXX"  # the end-of-central-directory record is gone
    else:
        start = data.find(b"\x80\x02", data.find(b"data.pkl"))  # the pickle stream of data.pkl
        assert start > 0
        data[start:start + 12] = b"\xff" * 12
    saved.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="is truncated or corrupt"):
        load_checkpoint(saved)


@pytest.mark.parametrize(("content", "expected"), [
    (b"these are not weights\n", "a text file"),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\n", "Git LFS pointer"),
    (b"<!DOCTYPE html><html></html>", "a web page"),
    (b"\x93NUMPY\x01\x00v\x00{'descr': '<f8'}", "NumPy"),
    (b"\x89HDF\r\n\x1a\n" + b"\0" * 20, "HDF5"),
    (b"\x00\x01\x02\xff\xfe\xfd\x00\x00", "not a PyTorch checkpoint"),
])
def test_not_a_pytorch_file(tmp_path, content, expected):
    path = tmp_path / "file.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=expected):
        load_checkpoint(path)


def test_safetensors_file_is_recognised(tmp_path):
    header = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    path = tmp_path / "model.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0\0\0\0")
    with pytest.raises(CheckpointError, match="safetensors.torch.load_file"):
        load_checkpoint(path)


def test_plain_pickle_and_foreign_zip(tmp_path):
    (tmp_path / "plain.pkl").write_bytes(pickle.dumps({"a": 1}, protocol=4))
    with pytest.raises(CheckpointError, match="plain Python pickle"):
        load_checkpoint(tmp_path / "plain.pkl")
    with zipfile.ZipFile(tmp_path / "other.pt", "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(CheckpointError, match="zip archive, but not one written by torch.save"):
        load_checkpoint(tmp_path / "other.pt")


def test_code_in_a_pickle_is_refused_and_does_not_run(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "weights.pt"
    torch.save({"w": _RunsCode(marker)}, path)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    assert "io.open" in message(e) and "trusted=True" in message(e) and "weights.pt" in message(e)
    assert not marker.exists()
    obj = load_checkpoint(path, trusted=True)  # what trusted=True means: the file's code runs
    obj["w"].close()
    assert marker.exists()


def test_whole_model_needs_trusted_and_an_importable_class(tmp_path):
    path = tmp_path / "whole.pt"
    torch.save(FooNet(), path)
    with pytest.raises(CheckpointError, match=r"needs the global .*FooNet \(a class\)"):
        load_checkpoint(path)
    assert isinstance(load_checkpoint(path, trusted=True), FooNet)  # importable here: loads


def test_map_location_naming_a_missing_device(saved):
    if torch.cuda.device_count() >= 8:
        pytest.skip("this machine has cuda:7")
    with pytest.raises(CheckpointError, match="names a device this machine does not have"):
        load_checkpoint(saved, map_location="cuda:7")
    with pytest.raises(CheckpointError, match="is not a device"):
        load_checkpoint(saved, map_location="gpu")


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
            super().__init__(out=3)
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


# ---------------------------------------------------------------------------------------- the checkers

def test_gpu_checkpoint_checker_right_and_wrong(original_course):
    path = original_course / "l30_model_in_multi_gpu.pkl"
    right = load_weights(FooNet(), path)
    assert check_gpu_checkpoint_on_cpu(right, path)
    verdict = check_gpu_checkpoint_on_cpu(FooNet(), path)  # forgot load_state_dict
    assert not verdict and "random initial weights" in verdict.message
    assert not check_gpu_checkpoint_on_cpu(load_checkpoint(path), path)  # the dict, not the model
    assert "still wrapped" in check_gpu_checkpoint_on_cpu(nn.DataParallel(right), path).message
    assert not check_gpu_checkpoint_on_cpu(nn.Linear(3, 3), path)
    assert not check_gpu_checkpoint_on_cpu(right, path.with_name("missing.pkl"))


def test_gpu_checkpoint_checker_needs_no_fixture(saved):
    assert check_gpu_checkpoint_on_cpu(load_weights(FooNet(), saved), saved)
    assert "not a dict" not in check_gpu_checkpoint_on_cpu(FooNet(), saved).message


def _broken() -> OrderedDict:
    torch.manual_seed(0)
    return nn.DataParallel(torch.compile(TwoPart())).state_dict()


def test_two_prefix_checker_right_answer():
    broken = _broken()
    assert list(broken)[0] == "module._orig_mod.encoder.weight"
    assert check_two_prefix_repair(strip_prefixes(broken), broken, TwoPart())


def test_two_prefix_checker_wrong_answers():
    broken = _broken()
    assert "returned None" in check_two_prefix_repair(None, broken, TwoPart()).message
    assert not check_two_prefix_repair([1], broken, TwoPart())
    one = {k.removeprefix("module."): v for k, v in broken.items()}
    assert "still start with a wrapper prefix" in check_two_prefix_repair(one, broken, TwoPart()).message
    replaced = {k.replace("module.", "").replace("_orig_mod.", ""): v for k, v in broken.items()}
    verdict = check_two_prefix_repair(replaced, broken, TwoPart())
    assert not verdict and "removeprefix" in verdict.hint
    fewer = dict(list(strip_prefixes(broken).items())[:2])
    assert "missing" in check_two_prefix_repair(fewer, broken, TwoPart()).message
    changed = {k: torch.zeros_like(v) for k, v in strip_prefixes(broken).items()}
    assert "same tensor" in check_two_prefix_repair(changed, broken, TwoPart()).message
    in_place = OrderedDict(broken)
    repaired = strip_prefixes(in_place)
    in_place.clear()
    in_place.update(repaired)  # the student changed `broken` itself
    assert "in place" in check_two_prefix_repair(repaired, in_place, TwoPart()).message


# ------------------------------------------------------------------ the GPU checkpoints shipped in data/

@pytest.mark.parametrize("name", SHIPPED_FILES)
def test_shipped_gpu_checkpoints(name):
    path = SHIPPED / name
    if not path.is_file():
        pytest.skip(f"notebooks/data/{name} is not there yet (tools/make_gpu_checkpoints.py on a GPU host)")
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
