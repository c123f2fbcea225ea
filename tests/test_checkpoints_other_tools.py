"""course_utils.checkpoints.loading on what other tools write: trainers' checkpoint dicts (DeepSpeed, Lightning, timm),
TorchScript and torch.export archives, AOTInductor packages, safetensors files, weights sharded over several
files with an index, and model folders in Hugging Face's layout. Each file is made here the way its tool makes
it; where a message gives advice, the test follows it and checks that it works."""

from __future__ import annotations

import json
import shutil
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file, save_model
from torch import nn

from course_utils.checkpoints.loading import (
    CheckpointError,
    find_state_dict,
    load_checkpoint,
    load_optimizer_state,
    load_weights,
    read_state_dict,
    strip_prefixes,
)
from course_utils.models import FooNet
from course_utils.performance import compiling


class Net(nn.Module):
    """A model of a class defined here: torch.jit.script reads its source."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


class TiedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.embed.weight


X = torch.arange(6.0).view(2, 3)


def _equal(a: Any, b: Any) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def _weights(seed: int = 0) -> OrderedDict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return FooNet().state_dict()


def _trained_adam(weights: OrderedDict[str, torch.Tensor]) -> tuple[FooNet, torch.optim.Adam]:
    model = FooNet()
    model.load_state_dict(weights)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    return model, opt


# ------------------------------------------------------------------------------ trainers' checkpoint dicts

def test_deepspeed_checkpoint_loads(tmp_path: Path) -> None:
    """As DeepSpeed's engine saves one (runtime/engine.py, _save_checkpoint): the weights under 'module', into
    <save_dir>/<tag>/mp_rank_00_model_states.pt, with a 'latest' file naming the tag."""
    weights = _weights()
    state = dict(module=weights, buffer_names=[], optimizer=None,
                 param_shapes=[OrderedDict((k, v.shape) for k, v in weights.items())], frozen_param_shapes=None,
                 shared_params={}, frozen_param_fragments=None, lr_scheduler=None, data_sampler=None,
                 random_ltd=None, sparse_tensor_module_names=set(), skipped_steps=0, global_steps=10,
                 global_samples=80, dp_world_size=2, mp_world_size=1,
                 ds_config={"train_batch_size": 8, "zero_optimization": {"stage": 2}}, ds_version="0.16.4")
    (tmp_path / "global_step10").mkdir()
    (tmp_path / "latest").write_text("global_step10")
    path = tmp_path / "global_step10" / "mp_rank_00_model_states.pt"
    torch.save(state, path)
    assert find_state_dict(load_checkpoint(path)) is not None
    assert _equal(load_weights(FooNet(), path).state_dict(), weights)


def test_lightning_checkpoint_loads_and_its_prefix_is_named(tmp_path: Path) -> None:
    """As Lightning's Trainer.save_checkpoint writes one: the LightningModule's state_dict (here its FooNet is
    the attribute `model`, so every key starts with 'model.'), the loops' and callbacks' states, the optimizer
    states in a list, the hyperparameters."""
    weights = _weights()
    _, opt = _trained_adam(weights)
    state = {"epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.5.0",
             "state_dict": OrderedDict(("model." + k, v) for k, v in weights.items()),
             "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 4, "completed": 3}}}},
             "callbacks": {"ModelCheckpoint{'monitor': None}": {"best_model_score": None}},
             "optimizer_states": [opt.state_dict()], "lr_schedulers": [], "hparams_name": "kwargs",
             "hyper_parameters": {"lr": 0.01}}
    path = tmp_path / "epoch=3-step=120.ckpt"
    torch.save(state, path)
    with pytest.raises(CheckpointError) as e:
        load_weights(FooNet(), path)
    text = str(e.value)
    assert text.startswith(f"{path} (checkpoint['state_dict']) does not fit FooNet")
    assert "carry the prefix 'model.': strip_prefixes(state_dict, ('model.',)) removes it" in text
    # the advice, followed
    fixed = strip_prefixes(find_state_dict(load_checkpoint(path)), ("model.",))
    assert _equal(load_weights(FooNet(), fixed).state_dict(), weights)


def test_timm_checkpoint_takes_the_weights_and_names_the_ema_copy(tmp_path: Path) -> None:
    """As timm's CheckpointSaver writes one: 'state_dict', 'optimizer', and the EMA weights in 'state_dict_ema'."""
    weights, ema = _weights(0), _weights(1)
    _, opt = _trained_adam(weights)
    path = tmp_path / "last.pth.tar"
    torch.save({"epoch": 9, "arch": "foonet", "state_dict": weights, "optimizer": opt.state_dict(), "version": 2,
                "metric": 0.5, "state_dict_ema": ema}, path)
    with pytest.warns(UserWarning, match=r"took the model weights from checkpoint\['state_dict'\]; it also holds "
                                         r"weights under checkpoint\['state_dict_ema'\]: pass that entry instead"):
        model = load_weights(FooNet(), path)
    assert _equal(model.state_dict(), weights)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the advice, followed: no warning, the EMA weights
        assert _equal(load_weights(FooNet(), load_checkpoint(path)["state_dict_ema"]).state_dict(), ema)


def test_weights_found_by_shape_and_never_the_optimizer(tmp_path: Path) -> None:
    weights = _weights()
    model, opt = _trained_adam(weights)
    nested = {"state": {"model": weights, "optimizers": {"Adam": opt.state_dict()}}, "rng": [1, 2, 3]}  # Composer
    assert _equal(load_weights(FooNet(), nested).state_dict(), weights)
    assert _equal(find_state_dict({"generator_weights": weights, "step": 5}), weights)  # a name no list has
    assert _equal(find_state_dict({"wrapper": model}), model.state_dict())  # a whole model, an unknown name
    with pytest.raises(CheckpointError, match="no model weights found"):  # the optimizer's state is no model
        find_state_dict({"epoch": 1, "optimizer_state": opt.state_dict(), "extra": {"adam": opt.state_dict()}})
    with pytest.raises(CheckpointError) as e:
        load_weights(FooNet(), opt.state_dict())
    assert "is an optimizer's state (the keys 'state' and 'param_groups'), not model weights" in str(e.value)
    resumed = FooNet()
    resumed.load_state_dict(model.state_dict())  # the advice, followed: load_optimizer_state takes it
    new_opt = load_optimizer_state(torch.optim.Adam(resumed.parameters(), lr=0.01), opt.state_dict())
    assert int(new_opt.state[resumed.linears[0].weight]["step"]) == 1


def test_several_sets_of_weights_without_a_known_name_ask_to_choose(tmp_path: Path) -> None:
    student, teacher = _weights(0), _weights(1)
    path = tmp_path / "distill.pt"
    torch.save({"student": student, "teacher": teacher, "step": 7}, path)
    with pytest.raises(CheckpointError) as e:
        load_weights(FooNet(), path)
    text = str(e.value)
    assert "holds several sets of model weights: checkpoint['student'] (3 tensors), checkpoint['teacher'] " in text
    assert f"e.g. load_weights(model, load_checkpoint({str(path)!r})['student'])" in text
    # the advice, followed
    assert _equal(load_weights(FooNet(), load_checkpoint(path)["teacher"]).state_dict(), teacher)
    with pytest.raises(CheckpointError, match="several sets"):  # the same name at the same depth: no choice made
        find_state_dict({"a": {"model": student}, "b": {"model": teacher}})


# ------------------------------------------------------------------------------------- model archives

@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("how", ["script", "trace"])
def test_torchscript_archive_is_named_and_torch_jit_load_reads_it(tmp_path: Path, how: str) -> None:
    torch.manual_seed(0)
    net = Net()
    path = tmp_path / "net.pt"
    torch.jit.save(torch.jit.script(net) if how == "script" else torch.jit.trace(net, X), path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.load is not even tried: no warning of its own
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(path)
    text = str(e.value)
    assert text.startswith(f"{path} is a TorchScript archive, written by torch.jit.save")
    assert "add_safe_globals" not in text and "__torch__" not in text
    # the advice, followed
    scripted = torch.jit.load(path, map_location="cpu")
    assert torch.equal(scripted(X), net(X))
    assert _equal(load_weights(Net(), torch.jit.load(path)).state_dict(), net.state_dict())


def test_torch_export_archive_is_named_and_torch_export_load_reads_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = Net()
    path = tmp_path / "net.pt2"
    torch.export.save(torch.export.export(net, (X,)), path)
    for trusted in (False, True):
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(path, trusted=trusted)
        assert str(e.value).startswith(f"{path} is a torch.export archive (.pt2, written by torch.export.save)")
    # the advice, followed
    program = torch.export.load(path)
    assert torch.equal(program.module()(X), net(X))
    assert _equal(load_weights(Net(), program.state_dict).state_dict(), net.state_dict())


@pytest.mark.slow
def test_aoti_package_is_named_and_aoti_load_package_runs_it(tmp_path: Path) -> None:
    if compiling.compile_problem("cpu"):
        pytest.skip("torch.compile cannot build CPU kernels here: " + str(compiling.compile_problem("cpu")))
    torch.manual_seed(0)
    net = Net()
    path = torch._inductor.aoti_compile_and_package(torch.export.export(net, (X,)),
                                                    package_path=str(tmp_path / "net.pt2"))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    assert str(e.value).startswith(f"{path} is an AOTInductor package (.pt2, a model compiled ahead of time")
    assert "torch.export.load" not in str(e.value)
    # the advice, followed
    assert torch.allclose(torch._inductor.aoti_load_package(path)(X), net(X))


# ---------------------------------------------------------------------------------------- safetensors

def _save_pretrained_like(weights: dict[str, torch.Tensor], folder: Path, shards: int = 1, fmt: str = "safetensors",
                          config: bool = True) -> None:
    """A folder as transformers' save_pretrained writes it: config.json, and the weights in
    model.safetensors (safetensors metadata {'format': 'pt'}), or, when they are sharded, in
    model-00001-of-0000N.safetensors ... with model.safetensors.index.json ({'metadata': {'total_size': ...},
    'weight_map': {tensor name: file name}}); with fmt='bin', pytorch_model*.bin files written by torch.save."""
    folder.mkdir(parents=True, exist_ok=True)
    if config:
        (folder / "config.json").write_text(json.dumps({"architectures": ["FooNet"], "model_type": "foonet"}))
    stem, suffix = ("model", ".safetensors") if fmt == "safetensors" else ("pytorch_model", ".bin")

    def write(part: dict[str, torch.Tensor], name: str) -> None:
        if fmt == "safetensors":
            save_file(part, folder / name, metadata={"format": "pt"})
        else:
            torch.save(part, folder / name)

    if shards == 1:
        write(weights, stem + suffix)
        return
    keys = list(weights)
    weight_map = {}
    for i in range(shards):
        name = f"{stem}-{i + 1:05d}-of-{shards:05d}{suffix}"
        part = {k: weights[k] for k in keys[i::shards]}
        write(part, name)
        weight_map.update(dict.fromkeys(part, name))
    index = {"metadata": {"total_size": sum(t.nbytes for t in weights.values())},
             "weight_map": dict(sorted(weight_map.items()))}
    (folder / f"{stem}{suffix}.index.json").write_text(json.dumps(index, indent=2))


def test_a_safetensors_file_gets_advice_that_works_and_load_weights_reads_it(tmp_path: Path) -> None:
    weights = _weights()
    path = tmp_path / "foonet.safetensors"
    save_file(weights, path)
    with pytest.raises(CheckpointError, match=r"is a safetensors file; read it with "
                                              r"safetensors.torch.load_file\(path, device='cpu'\)"):
        load_checkpoint(path)
    assert _equal(load_file(path, device="cpu"), weights)  # the advice, followed
    assert _equal(read_state_dict(path), weights)
    assert _equal(load_weights(FooNet(), path).state_dict(), weights)


def test_a_tied_model_saved_by_save_model_loads_strictly(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tied = TiedNet()
    save_model(tied, tmp_path / "tied.safetensors")  # keeps one name of the shared tensor, the other in metadata
    loaded = load_weights(TiedNet(), tmp_path / "tied.safetensors")
    assert torch.equal(loaded.out.weight, tied.out.weight) and loaded.out.weight is loaded.embed.weight


def test_a_tied_weight_saved_once_loads_under_both_names(tmp_path: Path) -> None:
    """transformers' save_pretrained drops the tied copy (the output layer that shares the embedding matrix)."""
    torch.manual_seed(0)
    tied = TiedNet()
    weights = {"embed.weight": tied.embed.weight.detach()}
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    torch.save(weights, tmp_path / "tied.pt")
    for path in (tmp_path / "model.safetensors", tmp_path / "tied.pt"):
        loaded = load_weights(TiedNet(), path)
        assert torch.equal(loaded.out.weight, tied.out.weight) and loaded.out.weight is loaded.embed.weight
    with pytest.raises(CheckpointError, match=r"missing in the checkpoint \(1\): fc.bias"):  # untied: still missing
        load_weights(nn.Sequential(OrderedDict(fc=nn.Linear(4, 10))), {"fc.weight": torch.zeros(10, 4)})


def test_a_damaged_safetensors_file(tmp_path: Path) -> None:
    weights = _weights()
    path = tmp_path / "model.safetensors"
    save_file(weights, path)
    data = path.read_bytes()
    path.write_bytes(data[:-20])  # a download cut short
    with pytest.raises(CheckpointError, match=r"model.safetensors is not a valid safetensors file \(safetensors says: "
                                              r".*\): a damaged or partly downloaded file. Download or save it again"):
        read_state_dict(path)
    save_file(weights, path)  # the advice, followed
    assert _equal(read_state_dict(path), weights)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_sharded_weights_and_their_index(tmp_path: Path, fmt: str) -> None:
    weights = _weights()
    folder = tmp_path / "foonet"
    _save_pretrained_like(weights, folder, shards=2, fmt=fmt, config=False)
    index = folder / ("model.safetensors.index.json" if fmt == "safetensors" else "pytorch_model.bin.index.json")
    first, second = (f"{'model' if fmt == 'safetensors' else 'pytorch_model'}-0000{i}-of-00002."
                     f"{'safetensors' if fmt == 'safetensors' else 'bin'}" for i in (1, 2))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(index)
    text = str(e.value)
    assert text.startswith(f"{index} is the index of weights sharded over 2 file(s) ({first}, {second}) in "
                           "Hugging Face's layout, not a checkpoint itself.")
    assert "course_utils.checkpoints.loading.read_state_dict(path) reads them into one state_dict" in text
    # the advice, followed
    assert _equal(read_state_dict(index), weights)
    assert _equal(load_weights(FooNet(), index).state_dict(), weights)
    # a shard that was not downloaded
    shutil.move(folder / second, tmp_path / second)
    with pytest.raises(CheckpointError, match=rf"1 of them is not in its folder \({second}\): download or copy it "
                                              "there first"):
        load_checkpoint(index)
    with pytest.raises(CheckpointError, match=rf"its index {index} names 1 file\(s\) that are not in its folder: "
                                              rf"{second}\. Download or copy them there"):
        load_weights(FooNet(), index)
    with pytest.raises(CheckpointError, match=rf"is a folder of weights in Hugging Face's layout, not a checkpoint "
                                              rf"file: .* Its index names 1 file\(s\) that are not in the folder "
                                              rf"\({second}\): download or copy them into it first"):
        load_checkpoint(folder)
    shutil.move(tmp_path / second, folder / second)  # the advice, followed
    assert _equal(read_state_dict(index), weights)
    # a shard from another save: the index names tensors it lacks
    if fmt == "safetensors":
        save_file({"other.weight": torch.zeros(1)}, folder / second)
        with pytest.raises(CheckpointError, match=r"its index names 1 tensor\(s\) that its files do not hold"):
            read_state_dict(index)


@pytest.mark.parametrize(("shards", "fmt"), [(1, "safetensors"), (2, "safetensors"), (1, "bin"), (3, "bin")])
def test_hugging_face_model_folders(tmp_path: Path, shards: int, fmt: str) -> None:
    weights = _weights()
    folder = tmp_path / "foonet-hf"
    _save_pretrained_like(weights, folder, shards=shards, fmt=fmt)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(folder)
    text = str(e.value)
    assert text.startswith(f"{folder} is a model folder in Hugging Face's layout (config.json and the weights), "
                           "not a checkpoint file: the weights are in ")
    assert ("the 2 file(s) it names" in text) if shards == 2 else True
    # the advice, followed
    assert _equal(read_state_dict(folder), weights)
    assert _equal(load_weights(FooNet(), folder).state_dict(), weights)


def test_a_folder_with_both_formats_reads_the_safetensors(tmp_path: Path) -> None:
    folder = tmp_path / "both"
    _save_pretrained_like(_weights(0), folder)
    torch.save(_weights(1), folder / "pytorch_model.bin")  # older weights next to the safetensors
    assert _equal(read_state_dict(folder), _weights(0))


def test_read_state_dict_of_a_torch_save_file_and_of_other_folders(tmp_path: Path) -> None:
    weights = _weights()
    torch.save({"epoch": 1, "model_state_dict": weights}, tmp_path / "train.pt")
    assert _equal(read_state_dict(tmp_path / "train.pt"), weights)
    with pytest.raises(CheckpointError, match="is a folder, not a checkpoint file. It contains train.pt"):
        read_state_dict(tmp_path)
