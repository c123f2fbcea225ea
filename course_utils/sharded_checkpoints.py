"""Notebook 08: checkpoints written by ``torch.distributed.checkpoint`` (DCP), one folder per checkpoint, with
one file of shards per rank and a ``.metadata`` file that says where every tensor's pieces are.

DCP writes ``.metadata`` last, after every rank's shards, so a folder without it is a save that did not
finish. ``dcp.load`` then logs two tracebacks and raises a ``CheckpointException`` (a ``BaseException``)
whose rank error is ``AssertionError: metadata is None; global metadata read failed ...``. These helpers say what is wrong instead, and never load such a folder:

- `check_sharded_checkpoint(path)`: the folder exists, is not empty, has its ``.metadata``, and every shard
  file the metadata names is there and long enough; else `CheckpointError` naming the folder and what is
  missing.
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

from .checkpoints import CheckpointError

__all__ = ["check_divisible", "check_sharded_checkpoint", "load_sharded", "save_sharded"]

PARTIAL = ".partial"


def _shard_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.suffix == ".distcp")


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
    shards = _shard_files(folder)
    if ".metadata" not in names:
        raise CheckpointError(
            f"{folder} is a half-written checkpoint: it holds {len(shards)} shard file(s) "
            f"({', '.join(shards[:4])}{' ...' if len(shards) > 4 else ''}) but no .metadata, which "
            "torch.distributed.checkpoint writes last. The save was interrupted: do not load it; load the "
            "checkpoint before it.")
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
