"""Notebook 06 (loading across devices), behind `course_utils.checkpoints.loading.load_checkpoint`: what is wrong
with a checkpoint file that cannot be loaded, said so that a student knows what to do.

Two questions, each answered by one public function that returns the message, or None:

- `problem_before_loading(path, name)`: a missing file (or folder), a folder (of ``torch.save`` files, a
  ``torch.distributed.checkpoint`` folder, whole or half-written, a model folder in Hugging Face's layout, a
  folder of checkpoint folders), an empty file, or something that is not a ``torch.save`` checkpoint (a
  plain pickle, NumPy, HDF5, safetensors, the index of sharded weights, a ``torch.export`` or AOTInductor
  ``.pt2`` archive, a Git LFS pointer, a web page...).
- `problem_after_failed_load(path, name, exc, trusted)`: ``torch.load`` raised ``exc``. The file's structure
  is read to say why, and nothing of it is unpickled: its zip archive (end record, checksums,
  ``<folder>/data.pkl``, a TorchScript archive's ``constants.pkl``) or legacy layout, and the instructions of
  its pickles, walked with `pickletools.genops`. Whether a global is one the safe loader refuses is asked of
  ``torch.load`` itself.

Each diagnosis is a problem kind with its details, and `MESSAGES` is the one table from kind to message.

What a file or folder is, read from its first bytes, its zip entries or its file names (nothing is
loaded), is public, for `course_utils.checkpoints.loading` and `course_utils.checkpoints.sharded`:
`file_kind(path)`, `folder_contents(folder)`, `checkpoint_folders(folder)`, and `weight_files(path)` (the
files that hold the weights of a safetensors file, an index of sharded weights, or a Hugging Face folder).
"""

from __future__ import annotations

import difflib
import io
import json
import os
import pickle
import pickletools
import re
import sys
import warnings
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal, NamedTuple

import torch

from ..formatting import short_list, strip_ansi

__all__ = ["MESSAGES", "FolderContents", "WeightFiles", "checkpoint_folders", "file_kind", "folder_contents",
           "problem_after_failed_load", "problem_before_loading", "weight_files"]

_LEGACY_MAGIC = bytes.fromhex("6cfc9c46f9206aa85019")  # torch.save's magic number before PyTorch 1.6
_RELATIVE = "A relative path starts from the current working directory (in Jupyter, the notebook's folder)."

def _missing(path: Path) -> _Diagnosis:
    folder = path.parent
    if not folder.is_dir():
        return "missing_folder", {"folder": os.fspath(folder) if str(folder) not in ("", ".") else "the current folder"}
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    close = difflib.get_close_matches(path.name, names, n=3, cutoff=0.6)
    said = " or ".join(repr(os.fspath(folder / c)) for c in close)
    return "missing", {"close": f" Did you mean {said}?" if close else ""}



def _folder(path: Path) -> _Diagnosis:
    contents = folder_contents(path)
    if contents.dcp_metadata:
        return "dcp_folder", {"count": str(len(contents.dcp_shards))}
    if contents.dcp_shards:
        return "dcp_partial", {"count": str(len(contents.dcp_shards)), "shards": short_list(contents.dcp_shards, 4)}
    weights = weight_files(path)
    if weights is not None and (contents.config or weights.index_file is not None):
        return "hf_folder", _hf_details(weights, contents.config)
    found = sorted(p.name for p in path.iterdir()
                   if p.suffix in (".pt", ".pth", ".bin", ".pkl", ".ckpt", ".tar", ".safetensors"))
    inside = (" It contains " + ", ".join(found[:5]) + (" ..." if len(found) > 5 else "")
              + ": pass one of those files.") if found else ""
    if not found and (folders := checkpoint_folders(path)):
        described = "; ".join(f"{sub} ({what})" for sub, what in folders[:4]) + ("; ..." if len(folders) > 4 else "")
        return "folders", {"folders": described}
    return "folder", {"inside": inside}


def _hf_details(weights: WeightFiles, config: bool) -> dict[str, str]:
    if weights.index_file is not None:
        shards = [f.name for f in weights.files]
        where = f"{weights.index_file.name} and the {len(shards)} file(s) it names ({short_list(shards, 3)})"
    else:
        where = weights.files[0].name
    missing = (f" Its index names {len(weights.missing)} file(s) that are not in the folder "
               f"({short_list(weights.missing, 3)}): download or copy them into it first." if weights.missing else "")
    what = ("a model folder in Hugging Face's layout (config.json and the weights)" if config
            else "a folder of weights in Hugging Face's layout")
    return {"what": what, "where": where, "missing": missing}


# ------------------------------------------------------------------------- what a file or folder is

FileKind = Literal["torch.save", "torchscript", "export", "aoti", "safetensors", "index", "other"]
"""What wrote a file: ``torch.save``, ``torch.jit.save`` (TorchScript), ``torch.export.save``, AOTInductor's
packager, safetensors, an index of sharded weights (``*.index.json``), or something else."""

_INDEX_LIMIT = 64 << 20  # an index of sharded weights is a few MB even for the largest models
_SNIFF_LIMIT = 200  # files looked into per folder; the others count as "other"


def _is_safetensors(head: bytes, size: int) -> bool:
    """A safetensors file: 8 bytes of header length (little-endian), then the JSON header."""
    return len(head) >= 10 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < size


def _weight_map(path: Path) -> dict[str, str] | None:
    """The ``weight_map`` (tensor name -> file) of an index of sharded weights; None for any other file."""
    try:
        if path.stat().st_size > _INDEX_LIMIT:
            return None
        index = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    found = index.get("weight_map") if isinstance(index, dict) else None
    if isinstance(found, dict) and found and all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()):
        return found
    return None


def _zip_kind(names: list[str]) -> FileKind:
    """What wrote a zip archive, from its entries (``<root folder>/<entry>``)."""
    below = {n.split("/", 1)[1] for n in names if "/" in n}
    if "archive_format" in below:  # the PT2 archive of torch.export.save and of AOTInductor's packager
        return "aoti" if any(n.startswith("data/aotinductor/") for n in below) else "export"
    if "constants.pkl" in below:  # torch.load's own test for a TorchScript archive
        return "torchscript"
    if "data.pkl" in below:
        return "torch.save"
    return "other"


def file_kind(path: Path) -> FileKind:
    """What wrote the file ``path``, read from its first bytes and, for a zip archive, its list of entries."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return "other"
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as z:
                return _zip_kind(z.namelist())
        except (zipfile.BadZipFile, OSError):
            return "other"
    if _LEGACY_MAGIC in head[:32]:
        return "torch.save"
    if _is_safetensors(head, size):
        return "safetensors"
    if path.suffix == ".json" and head.lstrip()[:1] == b"{" and _weight_map(path) is not None:
        return "index"
    return "other"


@dataclass
class FolderContents:
    """The files of one folder, sorted by what wrote them (file names only, no paths)."""

    torch_files: list[str] = field(default_factory=list)  # written by torch.save
    dcp_shards: list[str] = field(default_factory=list)  # *.distcp: torch.distributed.checkpoint's shards
    dcp_metadata: bool = False  # .metadata: written last by torch.distributed.checkpoint
    config: bool = False  # config.json, as in a Hugging Face model folder
    other_weights: list[str] = field(default_factory=list)  # safetensors, indexes, TorchScript, .pt2 archives
    others: list[str] = field(default_factory=list)


def folder_contents(folder: Path) -> FolderContents:
    """What the files in ``folder`` are (not its subfolders)."""
    contents = FolderContents()
    files = sorted(p for p in folder.iterdir() if p.is_file())
    for i, p in enumerate(files):
        if p.name == ".metadata":
            contents.dcp_metadata = True
        elif p.suffix == ".distcp":
            contents.dcp_shards.append(p.name)
        elif p.name == "config.json":
            contents.config = True
        else:
            kind = file_kind(p) if i < _SNIFF_LIMIT else "other"
            (contents.torch_files if kind == "torch.save" else contents.others if kind == "other"
             else contents.other_weights).append(p.name)
    return contents


def checkpoint_folders(folder: Path) -> list[tuple[str, str]]:
    """The subfolders of ``folder`` that hold a checkpoint, each with a few words on what it holds."""
    found = []
    for sub in sorted((p for p in folder.iterdir() if p.is_dir()), key=lambda p: p.name)[:_SNIFF_LIMIT]:
        inside = folder_contents(sub)
        if inside.dcp_metadata:
            found.append((sub.name, "a torch.distributed.checkpoint"))
        elif inside.dcp_shards:
            found.append((sub.name, "a half-written torch.distributed.checkpoint"))
        elif inside.torch_files:
            found.append((sub.name, "torch.save files: " + short_list(inside.torch_files, 3)))
        elif inside.other_weights:
            found.append((sub.name, short_list(inside.other_weights, 3)))
    return found


class WeightFiles(NamedTuple):
    """The files that hold a model's weights: one file, or the shards an index names."""

    files: list[Path]  # in the order to read them
    index_file: Path | None  # the index (*.index.json) that names them, if any
    missing: list[str]  # files the index names that are not in its folder
    weight_map: dict[str, str]  # tensor name -> file name, from the index ({} without one)


def _indexed(index: Path, weight_map: dict[str, str]) -> WeightFiles:
    names = sorted(set(weight_map.values()))
    return WeightFiles([index.parent / n for n in names], index,
                       [n for n in names if not (index.parent / n).is_file()], weight_map)


def weight_files(path: Path) -> WeightFiles | None:
    """The files that hold the weights at ``path``: a safetensors file, an index of sharded weights
    (``model.safetensors.index.json``, ``pytorch_model.bin.index.json``: its ``weight_map`` names the shard
    files), or a folder that holds one of those or ``model.safetensors`` / ``pytorch_model.bin`` (Hugging
    Face's layout), as transformers prefers them: safetensors first. None for anything else."""
    if path.is_file():
        kind = file_kind(path)
        if kind == "safetensors":
            return WeightFiles([path], None, [], {})
        weight_map = _weight_map(path) if kind == "index" else None
        return _indexed(path, weight_map) if weight_map else None
    if not path.is_dir():
        return None
    indexes = [(p, m) for p in sorted(path.glob("*.index.json")) if (m := _weight_map(p))]
    if indexes:
        index, weight_map = min(indexes, key=lambda pm: (pm[0].name != "model.safetensors.index.json",
                                                         not pm[0].name.endswith(".safetensors.index.json"),
                                                         pm[0].name != "pytorch_model.bin.index.json"))
        return _indexed(index, weight_map)
    for single in ("model.safetensors", "pytorch_model.bin"):
        if (path / single).is_file():
            return WeightFiles([path / single], None, [], {})
    safetensors = sorted(p for p in path.glob("*.safetensors") if p.is_file())
    return WeightFiles(safetensors, None, [], {}) if len(safetensors) == 1 else None


def _sniff(head: bytes, size: int) -> str | None:
    """What the file is, when it is not something torch.load can read; None when it may be."""
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")) or _LEGACY_MAGIC in head[:32]:
        return None  # the zip format of torch.save (PyTorch >= 1.6), or the legacy one
    if head.startswith(b"\x80"):
        return ("a plain Python pickle, not a file written by torch.save; read it with pickle.load, and only "
                "if you trust it (unpickling can run arbitrary code)")
    if head.startswith(b"\x93NUMPY"):
        return "a NumPy .npy array; read it with numpy.load, then torch.from_numpy"
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "an HDF5 file (Keras / TensorFlow weights?), not a PyTorch checkpoint"
    if head.startswith(b"GGUF"):
        return "a GGUF file (llama.cpp), not a PyTorch checkpoint"
    if _is_safetensors(head, size):
        return "a safetensors file; read it with safetensors.torch.load_file(path, device='cpu')"
    text = head.lstrip()
    if text.startswith(b"version https://git-lfs"):
        return ("a Git LFS pointer, not the file itself: run `git lfs pull` in the repository to fetch "
                "the real file")
    if text[:1] == b"<":
        return ("a web page (HTML/XML), not a checkpoint: a download saved the page around the file; "
                "download the file itself (the 'raw' link)")
    try:
        head.decode("utf-8")
        return "a text file, not a PyTorch checkpoint"
    except UnicodeDecodeError:
        return f"not a PyTorch checkpoint (it starts with the bytes {head[:8]!r})"



_Problem = Literal["missing", "missing_folder", "folder", "folders", "dcp_folder", "dcp_partial", "hf_folder",
                   "empty", "not_checkpoint", "index", "export", "aoti", "torchscript",
                   "saved_on_missing_device", "zip_truncated", "zip_damaged", "zip_foreign",
                   "pickle_truncated", "pickle_damaged", "legacy_truncated", "legacy_damaged",
                   "unsafe_global", "unsafe_instruction", "class_missing", "module_missing", "unknown"]
_Diagnosis = tuple[_Problem, dict[str, str]]
"""What is wrong with a file, and the details its message needs."""

_AGAIN = "as after an interrupted save, copy or download. Save or download it again."
_LEGACY = ("in the legacy serialisation format (PyTorch < 1.6, or torch.save(..., "
           "_use_new_zipfile_serialization=False))")
_HF_ADVICE = ("course_utils.checkpoints.loading.read_state_dict(path) reads them into one state_dict, and "
              "load_weights(model, path) loads them into a model.")
_IF_TRUSTED = ("If you trust the file (you or someone you trust saved it), load_checkpoint(path, "
               "trusted=True), which is torch.load(path, weights_only=False), loads it and runs whatever "
               "code it contains")

MESSAGES: dict[_Problem, str] = {
    "missing": "{name}: no such file.{close} " + _RELATIVE,
    "missing_folder": "{name}: no such file; the folder {folder!r} does not exist either. Check the path: " + _RELATIVE,
    "folder": "{name} is a folder, not a checkpoint file.{inside} (A folder written by torch.distributed.checkpoint "
              "is read with torch.distributed.checkpoint.load.)",
    "folders": "{name} is a folder, not a checkpoint file. It holds no checkpoint files itself, but folders that "
               "do: {folders}. Pass a file from one of them.",
    "dcp_folder":
        "{name} is a checkpoint written by torch.distributed.checkpoint (DCP): a folder with a .metadata file and "
        "{count} shard file(s), not one file. course_utils.checkpoints.sharded.load_sharded(state_dict, path) loads "
        "it into a state_dict of the model it belongs to, in one process or several; "
        "torch.distributed.checkpoint.format_utils.dcp_to_torch_save(path, 'checkpoint.pt') writes it as one file "
        "that load_checkpoint reads.",
    "dcp_partial":
        "{name} is a half-written checkpoint: it holds {count} shard file(s) ({shards}) but no .metadata, which "
        "torch.distributed.checkpoint writes last. The save was interrupted: do not load it; load the checkpoint "
        "before it.",
    "hf_folder":
        "{name} is {what}, not a checkpoint file: the weights are in {where}.{missing} " + _HF_ADVICE,
    "empty": "{name} is empty (0 bytes): the save was interrupted or the copy or download failed. Save or "
             "download it again.",
    "not_checkpoint": "{name} is {what}.",
    "index":
        "{name} is the index of weights sharded over {count} file(s) ({shards}) in Hugging Face's layout, not a "
        "checkpoint itself.{missing} " + _HF_ADVICE,
    "export":
        "{name} is a torch.export archive (.pt2, written by torch.export.save), not a torch.save checkpoint. "
        "torch.export.load(path) reads it into an ExportedProgram: program.module() is the model, to call, and "
        "program.state_dict holds its weights (load_weights(model, program.state_dict) loads them into a model "
        "of your own). torch.export.load uses pickle, as its documentation warns: only for files you trust.",
    "aoti":
        "{name} is an AOTInductor package (.pt2, a model compiled ahead of time by "
        "torch._inductor.aoti_compile_and_package), not a torch.save checkpoint. "
        "torch._inductor.aoti_load_package(path) loads it as a model to call, on the kind of device it was "
        "compiled for. It runs the machine code the file holds: only for files you trust.",
    "torchscript":
        "{name} is a TorchScript archive, written by torch.jit.save (or a scripted or traced model's .save), not "
        "a torch.save checkpoint; the safe loader (weights_only=True) does not read TorchScript. "
        "torch.jit.load(path, map_location='cpu') reads it into a model you call without its Python class "
        "(calling it runs the TorchScript code the file holds), and load_weights(model, torch.jit.load(path)) "
        "copies its weights into a model of your own.",
    "saved_on_missing_device":
        "{name} holds tensors saved on {saved}, which this machine does not have (it has {have}). Pass "
        "map_location to put them on a device you have: map_location='cpu', or course_utils.get_device().",
    "zip_truncated":
        "{name} is truncated: its zip archive ends early (the end-of-archive record is missing), " + _AGAIN,
    "zip_damaged":
        "{name} is damaged: {what}, as after a faulty copy, download or disk. Save or download it again.",
    "zip_foreign":
        "{name} is a zip archive, but not one written by torch.save: it has no <folder>/data.pkl entry "
        "(it holds {entries}).",
    "pickle_truncated":
        "{name} is truncated: the pickled data in its zip archive ({entry}) ends early, " + _AGAIN,
    "pickle_damaged":
        "{name} is damaged: the pickled data in its zip archive ({entry}) is not a valid pickle (an unknown "
        "instruction at byte {position}). Save or download it again.",
    "legacy_truncated":
        "{name} is " + _LEGACY + ", and it ends early: {where}, " + _AGAIN,
    "legacy_damaged":
        "{name} is " + _LEGACY + ", and it is damaged: its pickled data is not a valid pickle (an unknown "
        "instruction at byte {position}). Save or download it again.",
    "unsafe_global":
        "{name} holds code or objects outside the safe set that torch.load(weights_only=True) accepts "
        "(tensors, numbers, strings and containers of them): it refers to the global {glob}. The safe loader "
        "refused it, so nothing in the file was run.{model} " + _IF_TRUSTED + "; for a class of your own, "
        "torch.serialization.add_safe_globals([YourClass]) allows that class and nothing else. Otherwise ask "
        "for a state_dict.",
    "unsafe_instruction":
        "{name} holds data outside the safe set that torch.load(weights_only=True) accepts: it uses {what}, "
        "which the safe loader does not support, so nothing in the file was run. " + _IF_TRUSTED + "; saved "
        "again with torch.save's default pickle protocol, it loads safely.",
    "class_missing":
        "{name} holds a whole pickled object whose class {cls} was defined in {where}, and {cls} cannot be "
        "found here. Define or import class {cls} (same name, in {module}) before loading - or, better, ask "
        "for a state_dict (model.state_dict()) and load it into a model you build yourself.",
    "module_missing":
        "{name} holds a whole pickled object whose class lives in module {module}, which is not importable "
        "here. Make that module importable (install it, or add its folder to sys.path) before loading - or, "
        "better, ask for a state_dict and load it into a model you build yourself.",
    "unknown":
        "{name} could not be loaded, although it looks like an intact {fmt}. PyTorch said: {said}",
}


# Where a pickle names a function by the private module that defines it, the name people know it by.
_PUBLIC_MODULE = {"posix": "os", "nt": "os", "_io": "io"}


class _Global(NamedTuple):
    """A function or class that a pickle names: unpickling imports ``module`` and gets ``name`` from it."""

    module: str  # "builtins", also where pickle protocol 2 writes "__builtin__"
    name: str

    def __str__(self) -> str:
        public = _PUBLIC_MODULE.get(self.module)  # os.system is posix.system; io.open is _io.open (3.12)
        alias = f" ({public}.{self.name})" if public else ""
        return f"{self.module}.{self.name}{alias}"


@dataclass
class _Scan:
    """What one pickle stream refers to, read instruction by instruction (never unpickled, nothing runs)."""

    globals: list[_Global] = field(default_factory=list)
    strings: set[str] = field(default_factory=set)
    storages: dict[str, tuple[_Global, int]] = field(default_factory=dict)  # key -> (storage class, numel)
    newer_opcode: str | None = None  # the first instruction of pickle protocol 3 or later, if any
    fault: Literal["ends early", "invalid"] | None = None
    position: int = 0  # where the fault is


_MARK = object()


def _scan_pickle(f: BinaryIO) -> _Scan:
    """Walk one pickle with pickletools.genops, following its stack of strings, numbers, globals, tuples."""
    scan = _Scan()
    stack: list[Any] = []
    memo: dict[object, Any] = {}
    try:
        for op, arg, _ in pickletools.genops(f):
            if op.proto > 2 and scan.newer_opcode is None:
                scan.newer_opcode = f"{op.name} (pickle protocol {op.proto})"
            if op.name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
                memo[len(memo) if op.name == "MEMOIZE" else arg] = stack[-1] if stack else None
                continue
            before = op.stack_before
            if pickletools.markobject in before:
                mark = len(stack) - 1 - stack[::-1].index(_MARK)
                popped = stack[mark + 1:]
                del stack[max(0, mark - before.index(pickletools.markobject)):]
            else:
                popped = stack[len(stack) - len(before):] if before else []
                del stack[len(stack) - len(popped):]
            value: Any = arg if isinstance(arg, str | int) and not isinstance(arg, bool) else None
            names = str(arg).split(" ", 1) if op.name in ("GLOBAL", "INST") else popped
            if op.name in ("GLOBAL", "INST", "STACK_GLOBAL") and len(names) == 2 and all(
                    isinstance(n, str) for n in names):
                value = _Global("builtins" if names[0] == "__builtin__" else names[0], names[1])
                scan.globals.append(value)
            elif op.name in ("GET", "BINGET", "LONG_BINGET"):
                value = memo.get(arg)
            elif op.name == "MARK":
                value = _MARK
            elif op.name.startswith(("TUPLE", "EMPTY_TUPLE")):
                value = tuple(popped)
            elif op.name == "BINPERSID" and popped and isinstance(popped[0], tuple):
                pid = popped[0]  # ('storage', storage class, key, location, numel, ...)
                if len(pid) >= 5 and pid[0] == "storage" and isinstance(pid[1], _Global) and isinstance(
                        pid[4], int):
                    scan.storages[str(pid[2])] = (pid[1], pid[4])
            if isinstance(value, str):
                scan.strings.add(value)
            stack.extend([value] * len(op.stack_after))
    except ValueError:  # genops: an unknown instruction, or the data ends before the pickle's STOP
        scan.position = f.tell() - 1
        scan.fault = "invalid" if f.read(1) else "ends early"
    return scan


def _element_size(storage: _Global) -> int | None:
    """Bytes per element of a storage class such as torch.FloatStorage (None when unknown here)."""
    if storage.name == "UntypedStorage":
        return 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the typed storage classes are deprecated
        dtype = getattr(getattr(torch, storage.name, None), "dtype", None)
    return dtype.itemsize if isinstance(dtype, torch.dtype) else None


def _inspect_legacy(path: Path) -> _Diagnosis | _Scan:
    """The legacy format: five pickles (magic number, protocol, sys_info, the object, storage keys), then
    each storage's element count (8 bytes) and data."""
    with open(path, "rb") as f:
        scans = []
        for _ in range(5):
            scans.append(_scan_pickle(f))
            if scans[-1].fault == "ends early":
                return "legacy_truncated", {"where": "its pickled data stops in the middle"}
            if scans[-1].fault == "invalid":
                return "legacy_damaged", {"position": str(scans[-1].position)}
        have = path.stat().st_size - f.tell()
    sizes = [(numel, _element_size(cls)) for cls, numel in scans[3].storages.values()]
    if all(size is not None for _, size in sizes):
        need = sum(8 + numel * (size or 0) for numel, size in sizes)
        if have < need:
            return "legacy_truncated", {"where": f"its tensor data has {have} of the {need} bytes it needs"}
    return scans[3]


def _inspect_zip(path: Path) -> _Diagnosis | _Scan:
    """The zip format: an end-of-archive record, entries whose checksums hold, and <folder>/data.pkl."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - (1 << 16) - 22))
        tail = f.read()
    end = tail.rfind(b"PK\x05\x06")
    if end < 0 or len(tail) - end < 22:
        return "zip_truncated", {}
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            pkl = next((i for i in infos if i.filename.count("/") == 1 and i.filename.endswith("/data.pkl")),
                       None)
            if pkl is None:
                names = ", ".join(i.filename for i in infos[:4]) + (" ..." if len(infos) > 4 else "")
                return "zip_foreign", {"entries": names or "nothing"}
            for info in (i for i in infos if i.CRC):  # torch.save writes 0 when checksums are turned off
                try:
                    handle = z.open(info)
                except (zipfile.BadZipFile, NotImplementedError):
                    return "zip_damaged", {"what": f"the zip record of {info.filename} is unreadable"}
                try:
                    with handle:
                        while handle.read(1 << 24):
                            pass
                except (zipfile.BadZipFile, EOFError):
                    return "zip_damaged", {"what": f"the data of {info.filename} fails its checksum"}
            if pkl.CRC:
                data = z.read(pkl)
            else:  # no checksum to verify: read the entry as stored (torch.save does not compress)
                with open(path, "rb") as f:
                    f.seek(pkl.header_offset + 26)
                    skip = int.from_bytes(f.read(2), "little") + int.from_bytes(f.read(2), "little")
                    f.seek(skip, os.SEEK_CUR)  # past the entry's name and extra field
                    data = f.read(pkl.compress_size)
    except zipfile.BadZipFile:
        return "zip_damaged", {"what": "its zip directory is unreadable"}
    scan = _scan_pickle(io.BytesIO(data))
    if scan.fault == "ends early":
        return "pickle_truncated", {"entry": pkl.filename}
    if scan.fault == "invalid":
        return "pickle_damaged", {"entry": pkl.filename, "position": str(scan.position)}
    return scan


def _refused_by_safe_loader(globs: Iterable[_Global]) -> list[_Global]:
    """The globals that torch.load(weights_only=True) refuses: asked of torch itself, one pickle per global
    that only names it (naming calls nothing)."""
    template = io.BytesIO()
    torch.save(None, template)
    refused = []
    for glob in globs:
        probe = io.BytesIO()
        with zipfile.ZipFile(template) as src, zipfile.ZipFile(probe, "w") as dst:
            for info in src.infolist():
                dst.writestr(info.filename, b"\x80\x02c%s\n%s\n." % (glob.module.encode(), glob.name.encode())
                             if info.filename.endswith("/data.pkl") else src.read(info))
        probe.seek(0)
        try:
            torch.load(probe, weights_only=True)
        except pickle.UnpicklingError:
            refused.append(glob)
        except Exception:  # no verdict on this global
            continue
    return refused


def _imported_but_missing(glob: _Global) -> bool:
    """Whether ``glob``'s module is imported but lacks it (a class renamed, moved or deleted)."""
    obj: Any = sys.modules.get(glob.module)
    for attr in glob.name.split("."):
        if obj is None or not hasattr(obj, attr):
            return obj is not None
        obj = getattr(obj, attr)
    return False


def _diagnose(path: Path, exc: Exception, trusted: bool) -> _Diagnosis:
    """Why torch.load failed on ``path``: from the exception, and from the file's structure, which is read
    instruction by instruction and never unpickled."""
    said = strip_ansi(str(exc)).strip()
    if "Attempting to deserialize object on" in said:
        from ..devices import available_devices

        m = re.search(r"object on (?:a )?(\w+) device(?: (\d+))?", said)
        saved = (f"{m.group(1).lower()}:{m.group(2)}" if m and m.group(2)
                 else f"a {m.group(1)} device" if m else "a device")
        return "saved_on_missing_device", {"saved": saved, "have": ", ".join(available_devices())}
    with open(path, "rb") as f:
        zipped = f.read(2) == b"PK"
    if zipped and file_kind(path) == "torchscript":
        return "torchscript", {}
    found = _inspect_zip(path) if zipped else _inspect_legacy(path)
    if not isinstance(found, _Scan):
        return found
    globs = [g for g in dict.fromkeys(found.globals) if "\n" not in g.module + g.name]
    refused = [] if trusted else _refused_by_safe_loader(globs)
    if refused:
        named = re.search(r"GLOBAL (\S+)", said)  # torch's own words, when they name the global
        if named:
            refused.sort(key=lambda g: named.group(1) not in (f"{g.module}.{g.name}", g.name))
        others = ", ".join(map(str, refused[1:4])) + (", ..." if len(refused) > 4 else "")
        more = f" (and {len(refused) - 1} more: {others})" if len(refused) > 1 else ""
        model = (" It is a whole pickled model: a state_dict (model.state_dict()) holds the same weights and "
                 "loads safely." if {"_modules", "_parameters"} <= found.strings else "")
        return "unsafe_global", {"glob": f"{refused[0]}{more}", "model": model}
    if not trusted and isinstance(exc, pickle.UnpicklingError):
        op = re.search(r"Unsupported operand (\d+)", said)
        code = next((o for o in pickletools.opcodes if op and o.code == chr(int(op.group(1)))), None)
        what = (f"the pickle instruction {code.name} (pickle protocol {code.proto})" if code
                else f"the pickle instruction {found.newer_opcode}" if found.newer_opcode
                else "an object or pickle instruction")
        return "unsafe_instruction", {"what": what}
    if trusted and isinstance(exc, ModuleNotFoundError):
        return "module_missing", {"module": exc.name or "?"}
    lost = next((g for g in globs if _imported_but_missing(g)), None)
    if trusted and isinstance(exc, AttributeError) and lost is not None:
        where = ("the script that saved it (its __main__)" if lost.module == "__main__"
                 else f"module {lost.module}")
        return "class_missing", {"cls": lost.name, "module": lost.module, "where": where}
    first = (said.split("WeightsUnpickler error:", 1)[-1].strip().splitlines() or [""])[0]
    first = first if len(first) <= 200 else first[:197] + "..."
    fmt = "PyTorch zip checkpoint" if zipped else "PyTorch checkpoint in the legacy format"
    return "unknown", {"fmt": fmt, "said": f"{type(exc).__name__}: {first}"}


def problem_before_loading(path: Path, name: str, *, trusted: bool = False) -> str | None:
    """Why ``path`` cannot be a checkpoint, found without loading it (None when it may be one).

    ``name`` is the path as the caller wrote it: messages show that, not this machine's folders. A
    TorchScript archive is reported unless ``trusted`` (then ``torch.load`` hands it to ``torch.jit.load``).
    """
    found: _Diagnosis | None = None
    if not path.exists():
        found = _missing(path)
    elif path.is_dir():
        found = _folder(path)
    elif path.stat().st_size == 0:
        found = "empty", {}
    elif (kind := file_kind(path)) in ("export", "aoti") or (kind == "torchscript" and not trusted):
        found = kind, {}
    elif kind == "index" and (weights := weight_files(path)) is not None:
        shards = [f.name for f in weights.files]
        one = len(weights.missing) == 1
        missing = (f" {len(weights.missing)} of them {'is' if one else 'are'} not in its folder "
                   f"({short_list(weights.missing, 3)}): download or copy {'it' if one else 'them'} there first."
                   if weights.missing else "")
        found = "index", {"count": str(len(shards)), "shards": short_list(shards, 3), "missing": missing}
    else:
        with open(path, "rb") as f:
            what = _sniff(f.read(64), path.stat().st_size)
        found = ("not_checkpoint", {"what": what}) if what is not None else None
    return None if found is None else MESSAGES[found[0]].format(name=name, **found[1])


def problem_after_failed_load(path: Path, name: str, exc: Exception, trusted: bool) -> str:
    """What is wrong with ``path``, on which ``torch.load`` raised ``exc`` (``trusted``: weights_only=False)."""
    problem, details = _diagnose(path, exc, trusted)
    return MESSAGES[problem].format(name=name, **details)
