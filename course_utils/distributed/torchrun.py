"""``torchrun`` from a notebook cell: notebooks 05 (DistributedDataParallel) and 08 (FSDP2).

`torchrun(...)` and `torchrun_two_nodes(...)` run ``python -m torch.distributed.run`` (the program behind
the ``torchrun`` command) with a timeout, and return a `TorchrunResult`: what the job printed, its exit
code and the final-weights hash rank 0 printed. The training script is `course_utils.distributed.ddp_train` (snapshots,
restarts), or a script file of your own (``script="train.py"``, the one notebook 05 writes).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..formatting import LOG_PREFIX
from .ddp_train import HASH_PREFIX
from .launch import free_port

__all__ = ["TorchrunResult", "short_digest", "torchrun", "torchrun_two_nodes"]


def short_digest(digest: str | None, digits: int = 12) -> str:
    """The first ``digits`` hex digits of a digest and "…", for the eye; "(none)" when there is none."""
    return f"{digest[:digits]}…" if digest else "(none)"


# The training script's own report of a crash it was asked to simulate (--fail-at-step).
_LESSON_CRASH = re.compile(r"^\[rank \d+\] simulated crash")
# torchrun's log lines about a failure: the first failed worker, the others being stopped, a restart.
_TORCHRUN_FAILURE = re.compile(r"failed \(exitcode|closing signal|restart", re.IGNORECASE)
_RANK_PREFIX = re.compile(r"^\[rank (\d+)\]")
_RANK_TAG = re.compile(r"(?=\[rank \d+\] )")  # where a rank's line starts, even inside another's text


@dataclass
class TorchrunResult:
    """What one ``torchrun`` launch printed. ``sha256`` is the final-weights hash rank 0 printed."""

    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    display: str = ""

    @property
    def sha256(self) -> str | None:
        for line in self.stdout.splitlines():
            if line.startswith(HASH_PREFIX):
                return line[len(HASH_PREFIX):].strip()
        return None

    def notable_stderr(self) -> list[str]:
        """The crash, failure and restart messages in stderr, in order, written the same way on every run.

        That is the training script's report of a simulated crash, and torchrun's log lines saying which
        worker failed first, that the others are being stopped, or that the group restarts; their log
        prefix (time, pid, source file), process ids and the interpreter's path are removed.
        """
        keep = []
        for line in self.stderr.splitlines():
            if _LESSON_CRASH.match(line):
                keep.append(line)
            elif LOG_PREFIX.match(line) and _TORCHRUN_FAILURE.search(line):
                line = LOG_PREFIX.sub("", line)
                line = re.sub(r"\(pid: \d+\)", "(pid: <PID>)", line)
                line = re.sub(r"process \d+", "process <PID>", line)
                line = re.sub(r"of binary: \S+", "of binary: python", line)
                keep.append(line)
        return keep

    def show(self, stderr: bool = True) -> None:
        """Print the command, what the ranks printed, and torchrun's notable messages.

        The processes print at the same time, so their lines arrive interleaved in an order that changes
        from run to run: lines that start with ``[rank N]`` are shown grouped by rank, each rank's in the
        order it printed them (other lines after them; a ``[rank N]`` tag inside a line starts a new one). The final-weights hash is shortened to its first 12 hex digits, followed by "…": the bytes of
        the weights depend on the CPU's instruction set, so the hash is for the eye (and for comparing
        runs on this machine, in code), not a value to expect elsewhere.
        """
        print(f"$ {self.display}")

        def rank_of(line: str) -> int:
            m = _RANK_PREFIX.match(line)
            return int(m.group(1)) if m else sys.maxsize

        # Both ranks write into one pipe: another process's text (gloo's "[Gloo] Rank 1 is connected ...", written
        # without its newline yet) can come just before a rank's line. Each "[rank N] " starts a line of its own.
        lines = [part for line in self.stdout.splitlines() for part in _RANK_TAG.split(line) if part.strip()]
        for line in sorted(lines, key=rank_of):  # sorted() keeps each rank's order
            if line.startswith(HASH_PREFIX):
                line = f"{HASH_PREFIX} {short_digest(line[len(HASH_PREFIX):].strip())}"
            print(f"  {line}")
        if stderr:
            for line in self.notable_stderr():
                print(f"  (stderr) {line}")
        print(f"  exit code {self.returncode}")


def _program(script: str | None) -> list[str]:
    """What torchrun runs: a script file, or the course's training module."""
    return [script] if script else ["-m", "course_utils.distributed.ddp_train"]


def _torchrun_cmd(launcher_args: Sequence[str], train_args: Sequence[str], script: str | None = None) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *launcher_args, *_program(script), *train_args]


def _display(launcher_args: Sequence[str], train_args: Sequence[str], port: int | None = None,
             script: str | None = None) -> str:
    text = " ".join(["torchrun", *launcher_args, *_program(script), *train_args])
    return text.replace(f":{port}", ":$PORT") if port else text


def _child_env() -> dict[str, str]:
    """The current environment (NCCL/multicast settings kept), with this package importable."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _popen(cmd: list[str], cwd: str | Path) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, cwd=cwd, env=_child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _finish(proc: subprocess.Popen[str], timeout: float, t0: float, cmd: list[str],
            display: str) -> TorchrunResult:
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        result = TorchrunResult(cmd, proc.returncode, out, err, time.monotonic() - t0, display)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every worker it started
        out, err = proc.communicate()
        err += f"\ntimeout: the job did not finish within {timeout:.0f} s and was killed\n"
        result = TorchrunResult(cmd, -9, out, err, time.monotonic() - t0, display)
    _keep_log(result)
    return result


def _keep_log(result: TorchrunResult) -> None:
    """With ``COURSE_SUBPROCESS_LOGS`` set to a folder (``make test`` sets it), write everything the job
    printed there, so that a failing test's report can show what the ranks said (show() keeps only the
    lines a lesson needs)."""
    folder = os.environ.get("COURSE_SUBPROCESS_LOGS")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^\w.-]+", "_", result.display)[:80]
    path = Path(folder) / f"torchrun-{time.strftime('%H%M%S')}-{os.getpid()}-{name}.log"
    path.write_text(f"$ {result.display}\nexit code {result.returncode} after {result.seconds:.1f} s\n"
                    f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}", encoding="utf-8")


def torchrun(launcher_args: Sequence[str], train_args: Sequence[str], cwd: str | Path = ".",
             timeout: float = 120.0, script: str | None = None) -> TorchrunResult:
    """Run ``torchrun LAUNCHER_ARGS -m course_utils.distributed.ddp_train TRAIN_ARGS`` and wait for it.

    With ``script`` (a path, relative to ``cwd``), run ``torchrun LAUNCHER_ARGS SCRIPT TRAIN_ARGS``
    instead. Uses ``python -m torch.distributed.run`` of this interpreter (no PATH set-up needed). The
    job and all its workers are killed after ``timeout`` seconds.
    """
    cmd = _torchrun_cmd(launcher_args, train_args, script)
    t0 = time.monotonic()
    return _finish(_popen(cmd, cwd), timeout, t0, cmd, _display(launcher_args, train_args, script=script))


def torchrun_two_nodes(train_args: Sequence[str], nproc_per_node: int = 2, cwd: str | Path = ".",
                       timeout: float = 120.0) -> list[TorchrunResult]:
    """Two ``torchrun`` launches on this machine acting as two nodes of one job (c10d rendezvous).

    Each launch is what you would type on one host of a real cluster; here both hosts are 127.0.0.1 and
    the rendezvous port is a free one. Returns the results of node 0's and node 1's launch.
    """
    port = free_port()
    launcher = ["--nnodes=2", f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=course-05"]
    cmd = _torchrun_cmd(launcher, train_args)
    t0 = time.monotonic()
    procs = [_popen(cmd, cwd) for _ in range(2)]
    results: list[TorchrunResult | None] = [None, None]

    def wait(i: int) -> None:
        results[i] = _finish(procs[i], timeout, t0, cmd, _display(launcher, train_args, port))

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]

