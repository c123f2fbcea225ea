"""Notebook 08: checkpoints written by ``torch.distributed.checkpoint`` (DCP), one folder per checkpoint, with
one file of shards per rank and a ``.metadata`` file that says where every tensor's pieces are.

DCP writes ``.metadata`` last, after every rank's shards, so a folder with shards and without it is a save
that did not finish. ``dcp.load`` then logs two tracebacks and raises a ``CheckpointException`` (a
``BaseException``) whose rank error is ``AssertionError: metadata is None; global metadata read failed ...``.
A folder of ``torch.save`` files (as pytorch/examples' FSDP2 example writes full state dicts, into
``checkpoints/dcp_api/<time>/``) gets the same error, and was never a DCP checkpoint. These helpers say what
is wrong instead, and never load such a folder:

- `check_sharded_checkpoint(path)`: the folder exists, is not empty, is a DCP checkpoint (not ``torch.save``
  files, a Hugging Face model folder, or a folder of checkpoint folders: each is named, with how to load it),
  has its ``.metadata``, and every shard file the metadata names is there and long enough; else
  `CheckpointError` naming the folder and what is missing.
- `save_sharded(state_dict, path)`: ``dcp.save`` into ``<path>.partial``, then (rank 0, after every rank has
  written) a rename to ``path``: an interrupted save leaves only the ``.partial`` folder, never a ``path`` that
  looks complete.
- `load_sharded(state_dict, path)`: `check_sharded_checkpoint`, then ``dcp.load`` in place.
- `check_divisible(total, world_size, what)`: a clear error when ``world_size`` does not divide ``total``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ..formatting import short_list
from .diagnosis import MESSAGES, checkpoint_folders, folder_contents, problem_before_loading
from .loading import CheckpointError

__all__ = ["check_divisible", "check_sharded_checkpoint", "load_sharded", "save_sharded"]

PARTIAL = ".partial"

_NOT_DCP = ("{folder} is not a torch.distributed.checkpoint (DCP) checkpoint: it has no .metadata and no .distcp "
            "shard files.")
_TORCH_FILES = (
    " It holds {count} file(s) written by torch.save: {files}. torch.load reads each whole: "
    "course_utils.checkpoints.loading.load_checkpoint(path) reads one safely onto the CPU; load_weights(model, path) loads "
    "model weights into a model, load_optimizer_state(optimizer, path) an optimizer's state into its optimizer. "
    "Into an FSDP2 model, on every rank, full state dicts go with set_model_state_dict(model, state_dict, "
    "options=StateDictOptions(full_state_dict=True)) and, for an optimizer state keyed by parameter names (as "
    "get_optimizer_state_dict writes it), set_optimizer_state_dict(model, optimizer, state, "
    "options=StateDictOptions(full_state_dict=True)), both from torch.distributed.checkpoint.state_dict.")



def _not_dcp(folder: Path, torch_files: list[str]) -> str:
    """What a folder without DCP's files holds instead, and how to load it."""
    said = _NOT_DCP.format(folder=folder)
    if torch_files:
        return said + _TORCH_FILES.format(count=len(torch_files), files=short_list(torch_files, 4))
    folders = checkpoint_folders(folder)
    if folders:
        listed = "; ".join(f"{name} ({what})" for name, what in folders[:4]) + ("; ..." if len(folders) > 4 else "")
        return said + f" It holds folders that do hold checkpoints: {listed}. Pass one of them."
    other = problem_before_loading(folder, str(folder)) or ""
    if " is a folder, not a checkpoint file." not in other:  # a folder load_checkpoint has more to say about
        return said + " " + other
    return said + f" It holds {short_list(sorted(p.name for p in folder.iterdir()), 6)}."


def check_sharded_checkpoint(path: str | os.PathLike[str]) -> Path:
    """``path`` as a `Path` if it holds a complete DCP checkpoint; `CheckpointError` saying what is wrong."""
    folder = Path(path)
    if not folder.exists():
        partial = folder.with_name(folder.name + PARTIAL)
        hint = (f" {partial} exists: a save into it did not finish." if partial.exists() else "")
        raise CheckpointError(f"{folder}: no such checkpoint folder.{hint}")
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is a file; torch.distributed.checkpoint writes a folder (one file of "
                              "shards per rank and a .metadata file). A single file is read with torch.load.")
    names = sorted(p.name for p in folder.iterdir())
    if not names:
        raise CheckpointError(f"{folder} is empty: nothing was saved into it.")
    contents = folder_contents(folder)
    if not contents.dcp_metadata:
        if not contents.dcp_shards:
            raise CheckpointError(_not_dcp(folder, contents.torch_files))
        raise CheckpointError(MESSAGES["dcp_partial"].format(name=folder, count=len(contents.dcp_shards),
                                                             shards=short_list(contents.dcp_shards, 4)))
    try:
        metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    except Exception as exc:  # a damaged .metadata: any failure to read it is reported the same way
        raise CheckpointError(f"{folder}/.metadata cannot be read ({type(exc).__name__}: {exc}); the "
                              "checkpoint is damaged.") from None
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    missing = [name for name in sorted(needed) if name not in names]
    if missing:
        raise CheckpointError(f"{folder} lacks {len(missing)} of the {len(needed)} shard files its .metadata "
                              f"names: {', '.join(missing)}. A rank's file was lost or not copied.")
    short = [name for name, end in sorted(needed.items()) if (folder / name).stat().st_size < end]
    if short:
        raise CheckpointError(f"{folder}: shard file(s) {', '.join(short)} end before the data .metadata "
                              "places in them (truncated by an interrupted copy?).")
    return folder


def save_sharded(state_dict: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Save ``state_dict`` with ``dcp.save`` (every rank calls it) so that ``path`` appears only once
    complete: written into ``<path>.partial``, renamed by rank 0 after a barrier. Returns ``path``."""
    folder = Path(path)
    partial = folder.with_name(folder.name + PARTIAL)
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    if rank == 0 and partial.exists():
        shutil.rmtree(partial)  # left by an earlier interrupted save
    if distributed:
        dist.barrier()
    dcp.save(state_dict, checkpoint_id=str(partial))
    if distributed:
        dist.barrier()  # every rank's shards and the metadata are written
    if rank == 0:
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(partial, folder)
    if distributed:
        dist.barrier()  # nobody returns before the rename
    return folder


def load_sharded(state_dict: dict[str, Any], path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check the folder (`check_sharded_checkpoint`), then ``dcp.load`` into ``state_dict`` in place, on any
    number of ranks (DCP reshards) or in a single process. Returns ``state_dict``."""
    folder = check_sharded_checkpoint(path)
    dcp.load(state_dict, checkpoint_id=str(folder))
    return state_dict


def check_divisible(total: int, world_size: int, what: str = "the global batch") -> int:
    """``total // world_size``, or a ValueError that says which numbers do not divide."""
    if world_size < 1:
        raise ValueError(f"world size must be at least 1, got {world_size}")
    if total % world_size:
        raise ValueError(f"{what} ({total}) does not divide among {world_size} ranks ({total} = "
                         f"{total // world_size} × {world_size} + {total % world_size}); choose a world size "
                         f"that divides {total}, or change {what}.")
    return total // world_size
