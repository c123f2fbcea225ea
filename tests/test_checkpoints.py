"""course_utils.checkpoints.loading and the notebook-06 checkers: every error path, the 2019 GPU checkpoints."""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import sys
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from course_utils.checkpoints.diagnosis import _Global, _refused_by_safe_loader
from course_utils.checkpoints.loading import (
    CheckpointError,
    find_state_dict,
    load_checkpoint,
    load_optimizer_state,
    load_weights,
    move_optimizer_state,
    strip_prefixes,
)
from course_utils.exercises.loading_across_devices import check_gpu_checkpoint_on_cpu, check_two_prefix_repair
from course_utils.models import FooNet

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "notebooks" / "data"
SHIPPED_FILES = ["06_foonet_cuda0.pt", "06_foonet_dataparallel.pt", "06_foonet_compiled.pt",
                 "06_foonet_training_cuda0.pt", "06_exercise_classifier.pt"]
LECTURE_STATE_DICTS = ["l30_model_in_gpu_0.pkl", "l30_model_in_multi_gpu.pkl", "l31_model_in_multi_gpu.pkl"]


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


class _Calls:
    """Unpickling this calls ``function(*args)``: what a malicious checkpoint does."""

    def __init__(self, function: Callable[..., Any], *args: Any) -> None:
        self.function, self.args = function, args

    def __reduce__(self):
        return (self.function, self.args)


class _Settings:
    """A class of the user's own; unpickling it runs its __setstate__, which leaves a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __setstate__(self, state: dict[str, Any]) -> None:
        Path(state["marker"]).touch()
        self.__dict__.update(state)


class _MarkingNet(nn.Linear):
    """A whole model whose unpickling runs code (its __setstate__ leaves a marker file)."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        Path(state["marker"]).touch()
        super().__setstate__(state)


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


def _with_data_pkl(path: Path, data: bytes) -> Path:
    """A zip with the structure torch.save writes, its data.pkl replaced by ``data``."""
    buf = io.BytesIO()
    torch.save({}, buf)
    with zipfile.ZipFile(buf) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, data if info.filename.endswith("/data.pkl") else src.read(info))
    return path


def _data_pkl(path: Path) -> bytes:
    with zipfile.ZipFile(path) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


def _flip(path: Path, at: int, size: int = 4) -> None:
    data = bytearray(path.read_bytes())
    data[at:at + size] = bytes(255 - b for b in data[at:at + size])
    path.write_bytes(bytes(data))


def _bad_files(tmp: Path) -> dict[str, tuple[Path, str]]:
    """One file of each kind of damage, and the words its message must contain."""
    torch.manual_seed(0)
    weights = FooNet().state_dict()
    good = tmp / "good.pt"
    torch.save(weights, good)
    zipped, legacy = good.read_bytes(), tmp / "legacy_good.pt"
    torch.save(weights, legacy, _use_new_zipfile_serialization=False)
    files: dict[str, tuple[Path, str]] = {}

    def add(kind: str, data: bytes | None, expected: str) -> Path:
        path = tmp / f"{kind}.pt"
        if data is not None:
            path.write_bytes(data)
        files[kind] = (path, expected)
        return path

    add("missing", None, "no such file")
    files["directory"] = (tmp, "is a folder, not a checkpoint file")
    add("empty", b"", "is empty (0 bytes)")
    add("junk", bytes(range(7, 250, 3)), "not a PyTorch checkpoint (it starts with the bytes")
    for label, cut in (("30 bytes", 30), ("half", len(zipped) // 2), ("90%", len(zipped) * 9 // 10),
                       ("all but 1 byte", len(zipped) - 1)):
        add(f"zip cut at {label}", zipped[:cut],
            "is truncated: its zip archive ends early (the end-of-archive record is missing)")
    pkl_at = zipped.find(b"\x80\x02", zipped.find(b"data.pkl"))
    _flip(add("zip entry damaged", zipped, "is damaged: the data of good/data.pkl fails its checksum"), pkl_at + 6)
    _flip(add("zip record damaged", zipped, "is damaged: the zip record of good/data/0 is unreadable"),
          zipped.find(b"PK\x03\x04", zipped.find(b"good/data/0") - 40), 2)
    _flip(add("zip directory damaged", zipped, "is damaged: its zip directory is unreadable"),
          zipped.find(b"PK\x01\x02"), 2)
    pkl = _data_pkl(good)
    _with_data_pkl(add("pickle cut", None, "is truncated: the pickled data in its zip archive"),
                   pkl[: len(pkl) // 2])
    _with_data_pkl(add("pickle invalid", None, "is damaged: the pickled data in its zip archive (archive/data.pkl)"
                       " is not a valid pickle (an unknown instruction at byte 2)"), b"\x80\x02\xff\xff\xff.")
    old = legacy.read_bytes()
    add("legacy cut in its pickles", old[:300], "is in the legacy serialisation format (PyTorch < 1.6, or "
        "torch.save(..., _use_new_zipfile_serialization=False)), and it ends early: its pickled data stops")
    add("legacy cut in its tensor data", old[:-5], "and it ends early: its tensor data has")
    at = old.find(b"linears.1")  # a BINUNICODE instruction (1 byte, then a 4-byte length) comes before it
    add("legacy damaged", old[:at - 5] + b"\xff" + old[at - 4:], "legacy serialisation format (PyTorch < 1.6, "
        "or torch.save(..., _use_new_zipfile_serialization=False)), and it is damaged: its pickled data is not a "
        "valid pickle (an unknown instruction at byte")
    return files


def test_a_legacy_format_file_that_is_fine_loads(tmp_path):
    path = tmp_path / "legacy.pt"
    torch.save(FooNet().state_dict(), path, _use_new_zipfile_serialization=False)
    assert list(load_checkpoint(path)) == ["linears.0.weight", "linears.1.weight", "linears.2.weight"]


DAMAGE = ["missing", "directory", "empty", "junk", "zip cut at 30 bytes", "zip cut at half", "zip cut at 90%",
          "zip cut at all but 1 byte", "zip entry damaged", "zip record damaged", "zip directory damaged",
          "pickle cut", "pickle invalid", "legacy cut in its pickles", "legacy cut in its tensor data",
          "legacy damaged"]


@pytest.mark.parametrize("kind", DAMAGE)
def test_each_damage_gets_its_own_diagnosis(tmp_path, kind):
    path, expected = _bad_files(tmp_path)[kind]
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    text = message(e)
    assert text.startswith(str(path)) and expected in text, text
    assert "safe" not in text and "trusted" not in text  # never mistaken for a refused pickle


def test_damage_kinds_get_different_messages(tmp_path):
    seen: dict[str, str] = {}
    for kind, (path, _) in _bad_files(tmp_path).items():
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(path)
        seen.setdefault(message(e).replace(str(path), "FILE"), kind)
    assert len(seen) == len(DAMAGE) - 3, seen  # one message for each kind; the four zip cuts share theirs


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


def _stack_global_pickle(code: str) -> bytes:
    """A hand-written protocol-4 pickle, {'name': 'exec', 'w': exec(code)}, whose global is built by
    STACK_GLOBAL from a string fetched back from the memo (BINGET) and one pushed just before."""
    def text(s: str) -> bytes:
        return b"\x8c" + bytes([len(s)]) + s.encode() + b"\x94"  # SHORT_BINUNICODE, MEMOIZE

    return (b"\x80\x04}\x94(" + text("name") + text("exec") + text("w") + text("builtins")
            + b"h\x02\x93\x94" + text(code) + b"\x85\x94R\x94u.")  # BINGET 2 = 'exec'; TUPLE1, REDUCE


def _exec_leaving(marker: Path) -> _Calls:
    return _Calls(exec, f"open({str(marker)!r}, 'w').close()")


def _unsafe_files(tmp: Path) -> dict[str, tuple[Path, str, Path | None]]:
    """Files the safe loader refuses: (file, the global the message must name, the marker file that running
    the file's code would create, or None when it runs none)."""
    files: dict[str, tuple[Path, str, Path | None]] = {}

    def add(kind: str, glob: str, make: Callable[[Path], Any], runs: bool = True, **save: Any) -> None:
        path, marker = tmp / f"unsafe_{len(files)}.pt", tmp / f"ran_{len(files)}"
        obj = make(marker)
        if isinstance(obj, bytes):
            _with_data_pkl(path, obj)
        else:
            torch.save(obj, path, **save)
        files[kind] = (path, glob, marker if runs else None)

    def marking_net(marker: Path) -> _MarkingNet:
        net = _MarkingNet(2, 2)
        net.marker = str(marker)
        return net

    add("builtin function", "builtins.exec", lambda m: {"w": _exec_leaving(m)})
    add("os.system", f"{os.system.__module__}.system (os.system)", lambda m: {"w": _Calls(os.system, f"touch {m}")})
    io_open = "io.open" if io.open.__module__ == "io" else f"{io.open.__module__}.open (io.open)"
    add("io.open", io_open, lambda m: {"w": _RunsCode(m)})
    add("class of your own", f"{__name__}._Settings", lambda m: {"config": _Settings(m)})
    add("whole model", "torch.nn.modules.linear.Linear", lambda m: nn.Linear(2, 2), runs=False)
    add("whole model of your own", f"{__name__}._MarkingNet", marking_net)
    add("hand-written STACK_GLOBAL", "builtins.exec",
        lambda m: _stack_global_pickle(f"open({str(m)!r}, 'w').close()"))
    add("protocol 4", io_open, lambda m: {"w": _RunsCode(m)}, pickle_protocol=4)
    add("legacy format", "builtins.exec", lambda m: {"w": _exec_leaving(m)}, _use_new_zipfile_serialization=False)
    add("legacy whole model", "torch.nn.modules.linear.Linear", lambda m: nn.Linear(2, 2), runs=False,
        _use_new_zipfile_serialization=False)
    return files


UNSAFE = ["builtin function", "os.system", "io.open", "class of your own", "whole model", "whole model of your own",
          "hand-written STACK_GLOBAL", "protocol 4", "legacy format", "legacy whole model"]


@pytest.mark.parametrize("kind", UNSAFE)
@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4")
def test_unsafe_content_is_named_and_never_runs(tmp_path, kind):
    path, glob, marker = _unsafe_files(tmp_path)[kind]
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    text = message(e)
    assert text.startswith(f"{path} holds code or objects outside the safe set that torch.load(weights_only=True)"
                           f" accepts (tensors, numbers, strings and containers of them): it refers to the global "
                           f"{glob}"), text
    assert "nothing in the file was run" in text and "load_checkpoint(path, trusted=True)" in text
    assert "torch.serialization.add_safe_globals([YourClass])" in text
    assert ("It is a whole pickled model" in text) == ("model" in kind)
    assert not any(word in text for word in ("corrupt", "truncated", "damaged", "ends early"))
    if marker is not None:
        assert not marker.exists()
        if kind != "os.system" or os.name == "posix":  # the payload is real: trusted=True runs it
            load_checkpoint(path, trusted=True)
            assert marker.exists()


def test_the_hand_written_pickle_is_well_formed():
    ops = [op.name for op, _, _ in pickletools.genops(_stack_global_pickle("pass"))]
    assert ops.count("STACK_GLOBAL") == 1 and "BINGET" in ops and "MEMOIZE" in ops


def test_the_safe_loader_is_asked_which_globals_it_refuses():
    torch_own = [_Global("collections", "OrderedDict"), _Global("torch._utils", "_rebuild_tensor_v2"),
                 _Global("torch", "FloatStorage")]
    unsafe = [_Global("posix", "system"), _Global("builtins", "print"), _Global("__main__", "FooNet2")]
    assert _refused_by_safe_loader(torch_own + unsafe) == unsafe


def test_add_safe_globals_lets_a_class_of_your_own_load(tmp_path):
    path = _unsafe_files(tmp_path)["class of your own"][0]
    with torch.serialization.safe_globals([_Settings]):  # what the message advises, for a trusted class
        assert isinstance(load_checkpoint(path)["config"], _Settings)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4")
def test_an_unsupported_pickle_instruction_is_named(tmp_path):
    path = tmp_path / "protocol4.pt"
    torch.save(FooNet().state_dict(), path, pickle_protocol=4)  # no unsafe global, newer instructions
    try:
        load_checkpoint(path)  # a torch whose safe loader reads pickle protocol 4
    except CheckpointError as e:
        text = str(e)
        assert "outside the safe set" in text and "the pickle instruction " in text and "(pickle protocol 4)" in text
        assert "nothing in the file was run" in text and "trusted=True" in text and "corrupt" not in text


def test_missing_class_or_module_with_trusted(tmp_path, monkeypatch):
    path = tmp_path / "whole.pt"
    torch.save(TwoPart(), path)
    monkeypatch.delattr(sys.modules[__name__], "TwoPart")  # as in a process that never defined it
    with pytest.raises(CheckpointError, match=f"class TwoPart was defined in module {__name__}, and TwoPart "
                                              "cannot be found here"):
        load_checkpoint(path, trusted=True)
    _with_data_pkl(path, b"\x80\x02cno_such_module_here\nNet\n)\x81.")
    with pytest.raises(CheckpointError, match="class lives in module no_such_module_here, which is not importable"):
        load_checkpoint(path, trusted=True)
    with pytest.raises(CheckpointError, match="it refers to the global no_such_module_here.Net. "):
        load_checkpoint(path)


def test_whole_model_needs_trusted_and_an_importable_class(tmp_path):
    path = tmp_path / "whole.pt"
    torch.save(FooNet(), path)
    with pytest.raises(CheckpointError, match=r"refers to the global course_utils\.models\.FooNet \(and 2 more: torch\.nn\.modules"):
        load_checkpoint(path)
    assert isinstance(load_checkpoint(path, trusted=True), FooNet)  # importable here: loads


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


# ---------------------------------------------------------------------------------------- the checkers

def test_gpu_checkpoint_checker_right_and_wrong(original_course):
    path = original_course / "l30_model_in_multi_gpu.pkl"
    right = load_weights(FooNet(), path)
    assert check_gpu_checkpoint_on_cpu(right, path)
    verdict = check_gpu_checkpoint_on_cpu(FooNet(), path)  # forgot load_state_dict
    assert not verdict and "still has the random weights it was built with" in verdict.message
    assert not check_gpu_checkpoint_on_cpu(load_checkpoint(path), path)  # the dict, not the model
    assert "DataParallel wrapper" in check_gpu_checkpoint_on_cpu(nn.DataParallel(right), path).message
    assert not check_gpu_checkpoint_on_cpu(nn.Linear(3, 3), path)
    assert not check_gpu_checkpoint_on_cpu(right, path.with_name("missing.pkl"))


def test_gpu_checkpoint_checker_after_loading(saved):
    """The weights loaded, then changed by a training step, or the model frozen: both rejected for what they did."""
    stepped = load_weights(FooNet(), saved)
    opt = torch.optim.SGD(stepped.parameters(), lr=0.1)
    stepped(torch.randn(4, 3)).sum().backward()
    opt.step()
    verdict = check_gpu_checkpoint_on_cpu(stepped, saved)
    assert not verdict and "something changed the weights after loading" in verdict.message, verdict
    assert "still has the random weights" not in verdict.message
    verdict = check_gpu_checkpoint_on_cpu(load_weights(FooNet(), saved).requires_grad_(False), saved)
    assert not verdict and "requires_grad is False for 3 of its 3 parameters" in verdict.message, verdict
    verdict = check_gpu_checkpoint_on_cpu(load_weights(FooNet(), saved).eval(), saved)
    assert not verdict and "eval mode" in verdict.message, verdict


def test_gpu_checkpoint_checker_needs_no_fixture(saved):
    assert check_gpu_checkpoint_on_cpu(load_weights(FooNet(), saved), saved)
    assert "you passed a dict" not in check_gpu_checkpoint_on_cpu(FooNet(), saved).message
    assert "cannot read the checkpoint" in check_gpu_checkpoint_on_cpu(FooNet(), saved.with_name("gone.pt")).message


def test_two_prefix_checker_tries_the_prefixes_the_wrappers_really_add():
    """The checker writes its state_dicts' prefixes by hand: they are those of the real wrappers."""
    from course_utils.exercises.loading_across_devices import _CASES

    real = {
        "module._orig_mod.": nn.DataParallel(torch.compile(TwoPart())),  # the notebook's `broken`
        "_orig_mod.module.": torch.compile(nn.DataParallel(TwoPart())),  # what torch.compile(ddp_model) saves
        "module.": nn.DataParallel(TwoPart()),
        "_orig_mod.": torch.compile(TwoPart()),
        "": TwoPart(),
    }
    from course_utils.exercises.loading_across_devices import _prefixed

    assert [prefix for prefix, _ in _CASES] == list(real)
    for prefix, wrapped in real.items():
        assert list(wrapped.state_dict()) == [prefix + k for k in TwoPart().state_dict()]
        # and the version metadata that a real state_dict carries, the wrappers' own entries included
        assert wrapped.state_dict()._metadata == _prefixed(TwoPart(), prefix)._metadata
    assert check_two_prefix_repair(strip_prefixes, TwoPart())


def test_two_prefix_checker_wrong_answers():
    def none(state_dict):
        return None

    def one(state_dict):
        return {k.removeprefix("module."): v for k, v in state_dict.items()}

    def replaced(state_dict):
        return {k.replace("module.", "").replace("_orig_mod.", ""): v for k, v in state_dict.items()}

    def fewer(state_dict):
        return dict(list(strip_prefixes(state_dict).items())[:2])

    def changed(state_dict):
        return {k: torch.zeros_like(v) for k, v in strip_prefixes(state_dict).items()}

    def in_place(state_dict):
        repaired = strip_prefixes(state_dict)
        state_dict.clear()
        state_dict.update(repaired)  # the student changed `broken` itself
        return state_dict

    assert "returned None" in check_two_prefix_repair(none, TwoPart()).message
    assert "expected a dict of weights" in check_two_prefix_repair(lambda sd: [1], TwoPart()).message
    assert "still start with a wrapper prefix" in check_two_prefix_repair(one, TwoPart()).message
    verdict = check_two_prefix_repair(replaced, TwoPart())
    assert not verdict and "str.replace pitfall" in verdict.hint and "removeprefix" in verdict.closer
    assert "missing" in check_two_prefix_repair(fewer, TwoPart()).message
    assert "same tensor" in check_two_prefix_repair(changed, TwoPart()).message
    assert "changed the dict it was given" in check_two_prefix_repair(in_place, TwoPart()).message

    import copy

    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    def shallow_copy(state_dict):
        state_dict = copy.copy(state_dict)  # shares _metadata with the argument
        for prefix in ("module.", "_orig_mod.", "module."):
            consume_prefix_in_state_dict_if_present(state_dict, prefix)
        return state_dict

    def last_parts(state_dict):
        return {".".join(k.split(".")[-2:]): v for k, v in state_dict.items()}

    assert "its _metadata" in check_two_prefix_repair(shallow_copy, TwoPart()).message
    assert "a deeper model" in check_two_prefix_repair(last_parts, TwoPart()).message
    assert "torch.float64" in check_two_prefix_repair(
        lambda sd: {k: v.double() for k, v in strip_prefixes(sd).items()}, TwoPart()).message
    assert "on meta" in check_two_prefix_repair(
        lambda sd: {k: v.to("meta") for k, v in strip_prefixes(sd).items()}, TwoPart()).message
    assert "more that it does not have: ['epoch']" in check_two_prefix_repair(
        lambda sd: {**strip_prefixes(sd), "epoch": 1}, TwoPart()).message


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
