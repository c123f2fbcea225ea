"""tools/gpu_budget.py (make gpu-check GPU_BUDGET_GB=15): the arithmetic, and a clear refusal without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from gpu_budget import GIB, bytes_to_hold  # noqa: E402


def test_bytes_to_hold_leaves_the_budget_free():
    assert bytes_to_hold(free=139 * GIB, leave=15 * GIB) == 124 * GIB
    assert bytes_to_hold(free=10 * GIB, leave=15 * GIB) == 0  # already a smaller card: hold nothing
    with pytest.raises(ValueError, match="positive"):
        bytes_to_hold(free=GIB, leave=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_without_a_gpu_it_says_so_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_budget.py"), "--leave-gib", "15", "--",
                          sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "needs a CUDA GPU" in out.stderr
    assert not marker.exists(), "the command must not run when no budget could be set"


def test_a_bad_budget_is_refused_before_anything_starts():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_budget.py"), "--leave-gib", "0", "--", "true"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "positive" in out.stderr
