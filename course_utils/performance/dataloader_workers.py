"""Notebook 09 (when it breaks): what a DataLoader worker inherits from its parent, under ``fork`` and
``spawn``.

A *forked* worker starts as a copy of the parent process: its memory, its imported modules, and its state,
including a CUDA context it cannot use (CUDA refuses to re-initialise in a forked child). A *spawned* worker
is a fresh Python that imports what it needs by name; nothing the parent did after its imports reaches it.
`WhatWorkersSee` lets a notebook see the difference on any machine: it reports, from inside the worker,
the value of `PARENT_STATE`, which the parent changes after importing this module.
"""

from __future__ import annotations

import os

from torch.utils.data import Dataset

__all__ = ["PARENT_STATE", "WhatWorkersSee"]

PARENT_STATE: dict[str, str] = {"set_by": "the module's import"}
"""A module-level value the notebook changes in the parent after importing this module."""


class WhatWorkersSee(Dataset[dict[str, object]]):
    """Each item says, from the process that made it, what that process sees."""

    def __init__(self, items: int = 2) -> None:
        self.items = items
        self.parent_pid = os.getpid()

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> dict[str, object]:
        return {"in_a_worker": os.getpid() != self.parent_pid, "PARENT_STATE set by": PARENT_STATE["set_by"]}
