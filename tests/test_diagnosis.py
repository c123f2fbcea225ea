"""course_utils.checkpoints.diagnosis, through load_checkpoint: each kind of damaged file gets its own diagnosis,
and code in a pickle (a function, os.system, a class of your own, a whole model) is named and never runs."""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import message
from torch import nn

from course_utils.checkpoints.diagnosis import _Global, _refused_by_safe_loader
from course_utils.checkpoints.loading import CheckpointError, load_checkpoint
from course_utils.models import FooNet


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
