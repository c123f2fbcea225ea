"""course_utils.performance.dataloader_workers: WhatWorkersSee shows what a DataLoader worker inherits
from its parent: a forked one the parent's state, a spawned one only what the module's import sets."""

from __future__ import annotations

from torch.utils.data import DataLoader

from course_utils.performance import dataloader_workers as worker_start


def test_forked_workers_inherit_and_spawned_ones_do_not(monkeypatch):
    monkeypatch.setitem(worker_start.PARENT_STATE, "set_by", "the test")
    seen = {}
    for method in ("fork", "spawn"):
        loader = DataLoader(worker_start.WhatWorkersSee(), batch_size=None, num_workers=1,
                            multiprocessing_context=method)
        seen[method] = next(iter(loader))
    assert seen["fork"] == {"in_a_worker": True, "PARENT_STATE set by": "the test"}
    assert seen["spawn"] == {"in_a_worker": True, "PARENT_STATE set by": "the module's import"}
