"""course_utils.distributed.torchrun: a script under torchrun, its lines grouped by rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from course_utils.distributed import torchrun as T

TRAIN_SCRIPT = """\
import os
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for i in range(3):
    print(f"[rank {rank}] line {i}\\n", end="")
print(f"local rank {os.environ['LOCAL_RANK']}")  # no rank prefix: shown after the ranks' lines
dist.destroy_process_group()
"""


def test_torchrun_runs_a_script_and_groups_lines_by_rank(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "job.py").write_text(TRAIN_SCRIPT)
    r = T.torchrun(["--standalone", "--nproc-per-node=2"], [], cwd=tmp_path, script="job.py")
    assert r.returncode == 0, r.stderr[-3000:]
    r.show()
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == "$ torchrun --standalone --nproc-per-node=2 job.py"
    assert shown[1:7] == [f"  [rank {k}] line {i}" for k in (0, 1) for i in range(3)]
    # Untagged lines of the two ranks share one pipe: their order (and, under heavy load, their position
    # against the exit line) is not fixed, so only what the ranks tag is checked line by line. torch 2.9's
    # gloo also logs "[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks
    # is : 1" into that pipe, even between a print's text and its newline (a write is never split, but two
    # writes of one print can be): each rank's line must be there whole, and nothing else but gloo's words.
    rest = " ".join(shown[7:-1])
    for k in (0, 1):
        assert rest.count(f"local rank {k}") == 1, shown
        rest = rest.replace(f"local rank {k}", " ")
    gloo = set("[Gloo] Rank is connected to peer ranks. Expected number of connected peer ranks is :".split())
    assert all(word in gloo or word.isdigit() for word in rest.split()), shown
    assert shown[-1] == "  exit code 0"


def test_a_rank_line_written_after_unfinished_text_is_still_grouped(capsys: pytest.CaptureFixture[str]) -> None:
    """Gloo's log line can reach the shared pipe before its newline, with a rank's line glued to it."""
    out = ("[rank 0] line 0\n[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks "
           "is : 1[rank 1] line 0\n[rank 1] line 1\n[rank 0] line 1\n")
    T.TorchrunResult(["torchrun"], 0, out, "", 1.0, "torchrun job.py").show()
    shown = capsys.readouterr().out.splitlines()
    assert shown[1:5] == ["  [rank 0] line 0", "  [rank 0] line 1", "  [rank 1] line 0", "  [rank 1] line 1"]
    assert shown[5].startswith("  [Gloo] Rank 1 is connected") and shown[-1] == "  exit code 0"
