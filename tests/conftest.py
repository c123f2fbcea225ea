"""Shared test fixtures."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT.parent / "shared" / "fixtures" / "original_course"


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def original_course() -> Path:
    """The 2019 lecture's GPU checkpoints (../shared/fixtures/original_course); skipped when absent."""
    if not FIXTURES.is_dir():
        pytest.skip("../shared/fixtures/original_course is not present (only in the course's own CI)")
    return FIXTURES


def notebook_solution(stem: str, name: str) -> Callable[..., Any]:
    """The function ``name`` as a notebook's hidden solution cell defines it (the course's right answer).

    Tests of a checker take their right answer from here rather than from a copy, so that the notebook, the
    checker and the tests cannot drift apart. The cell runs without its last line (the checker call).
    """
    nb = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if "solution" in cell["metadata"].get("tags", []) and f"def {name}(" in source:
            code = "\n".join(line for line in source.splitlines() if not line.startswith("check_"))
            namespace: dict[str, Any] = {"torch": torch, "F": F, "nn": nn}
            exec(compile(code, f"<{stem} solution>", "exec"), namespace)
            return namespace[name]
    raise LookupError(f"notebooks/{stem}.ipynb has no solution cell defining {name}()")
