"""Notebook 03 (the torch.cuda API): which GPUs does this machine have, how much memory is free on each,
and which should a job use?

Choosing GPUs happens *before* CUDA starts in the process: ``CUDA_VISIBLE_DEVICES`` is read once, when
CUDA initialises. So nothing here initialises CUDA in the caller. The free memory comes from

- ``nvidia-smi --query-gpu=index,memory.free,memory.total --format=csv,noheader,nounits`` (a stable,
  machine-readable format meant for scripts), or, where nvidia-smi is missing,
- ``torch.cuda.mem_get_info`` run in a *subprocess*, so the caller's CUDA stays uninitialised.

`pick_gpus` returns a ``CUDA_VISIBLE_DEVICES`` string (most free memory first, so logical GPU 0, the one
that does extra work in DataParallel, is the emptiest). Indices are nvidia-smi's, which follow the PCI
bus order: set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` too, so CUDA numbers the GPUs the same way.

Parsers take text, so they are tested without a GPU. `lecture_free_memory` reproduces the 2019
lecture's ``nvidia-smi -q -d Memory | grep -A4 GPU | grep Free``, which finds nothing on current drivers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..subprocesses import run_python

__all__ = [
    "CAPTURED_QUERY",
    "CAPTURED_REPORT",
    "GpuMemory",
    "NoGpuError",
    "captured_memory_report",
    "captured_query",
    "choose_gpus",
    "free_gpu_memory",
    "grep",
    "lecture_free_memory",
    "logical_to_physical",
    "parse_memory_report",
    "parse_query_csv",
    "pick_gpus",
    "query_nvidia_smi",
    "query_torch",
]

QUERY = ["--query-gpu=index,memory.free,memory.total", "--format=csv,noheader,nounits"]
CAPTURED_REPORT = Path(__file__).parents[1] / "data" / "nvidia_smi_q_memory_h200.txt"
"""``nvidia-smi -q -d Memory`` as printed on the course's GPU host (an H200), shipped with the package."""
CAPTURED_QUERY = Path(__file__).parents[1] / "data" / "nvidia_smi_query_h200.txt"
"""``nvidia-smi --query-gpu=index,name,memory.free,memory.total --format=csv,noheader,nounits`` there."""


class NoGpuError(RuntimeError):
    """No (suitable) NVIDIA GPU: the message says why and what to do."""


@dataclass(frozen=True)
class GpuMemory:
    """Memory of one GPU, in MiB. ``index`` is nvidia-smi's (physical, PCI bus order) index."""

    index: int
    free_mib: int
    total_mib: int

    def __str__(self) -> str:
        return f"GPU {self.index}: {self.free_mib} MiB free of {self.total_mib} MiB"


# --- parsers (text in, data out) -------------------------------------------------------------------

def parse_query_csv(text: str) -> list[GpuMemory]:
    """Parse ``nvidia-smi --query-gpu=index,memory.free,memory.total --format=csv,noheader,nounits``.

    Lines look like ``0, 142766, 143771``; a query that also asks for the name
    (``index,name,memory.free,memory.total``) gives ``0, NVIDIA H200, 142766, 143771`` and is read too.
    Lines whose numbers are not numbers (``[N/A]``) and other lines (warnings) are skipped.
    """
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) in (3, 4) and all(fields[i].isdigit() for i in (0, -2, -1)):
            gpus.append(GpuMemory(int(fields[0]), int(fields[-2]), int(fields[-1])))
    return gpus


_GPU_HEADER = re.compile(r"^GPU\s+[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+\s*$")
_VALUE = re.compile(r"^\s*(\w[\w ]*?)\s*:\s*(\d+)\s*MiB\s*$")


def parse_memory_report(text: str) -> list[GpuMemory]:
    """Parse ``nvidia-smi -q -d Memory`` properly: for each ``GPU 00000000:xx:00.0`` header, the
    ``Total`` and ``Free`` lines of its ``FB Memory Usage`` block (not BAR1's, not the others).

    GPUs are numbered in the order the report lists them, which is nvidia-smi's index order.
    A GPU whose values are not numbers (``N/A``) is left out.
    """
    gpus: list[GpuMemory] = []
    values: dict[str, int] | None = None
    section = ""

    def flush() -> None:
        if values is not None and "Total" in values and "Free" in values:
            gpus.append(GpuMemory(len(gpus), values["Free"], values["Total"]))

    for line in text.splitlines():
        if _GPU_HEADER.match(line):
            flush()
            values, section = {}, ""
            continue
        if values is None:
            continue
        stripped = line.strip()
        if stripped and ":" not in stripped:
            section = stripped  # a block header: "FB Memory Usage", "BAR1 Memory Usage", ...
            continue
        m = _VALUE.match(line)
        if m and section == "FB Memory Usage":
            values[m.group(1)] = int(m.group(2))
    flush()
    return gpus


def grep(lines: Sequence[str], pattern: str, after: int = 0) -> list[str]:
    """What ``grep -A<after> PATTERN`` (``grep PATTERN`` for ``after=0``) prints: matching lines and ``after`` lines after each, with
    with ``--`` between groups that do not touch (a plain substring match, case-sensitive, like grep)."""
    keep: list[int] = []
    last = -1
    for i, line in enumerate(lines):
        if pattern in line:
            for j in range(max(i, last + 1), min(len(lines), i + after + 1)):
                keep.append(j)
            last = max(last, i + after)
    out: list[str] = []
    for k, j in enumerate(keep):
        if after and k and j != keep[k - 1] + 1:
            out.append("--")
        out.append(lines[j])
    return out


def lecture_free_memory(text: str) -> list[int]:
    """The 2019 lecture's parser, faithfully: ``nvidia-smi -q -d Memory | grep -A4 GPU | grep Free``,
    then ``int(line.split()[2])`` of each line (the lecture took ``np.argmax`` of this list).

    Drivers then printed ``Total``, ``Used``, ``Free`` under ``FB Memory Usage``, so ``Free`` was the
    4th line after the ``GPU ...`` header. Current drivers print ``Total``, ``Reserved``, ``Used``,
    ``Free``: ``Free`` is the 5th line, outside the ``-A4`` window, and the list comes back empty.
    """
    window = grep(text.splitlines(), "GPU", after=4)
    return [int(line.split()[2]) for line in grep(window, "Free")]


def logical_to_physical(visible: str | None, physical_count: int) -> list[int]:
    """Physical GPU indices in logical order, for ``CUDA_VISIBLE_DEVICES=visible`` on a machine with
    ``physical_count`` GPUs: element ``i`` is the physical GPU that the process calls ``cuda:i``.

    Rules, as PyTorch models CUDA's own parsing: unset (``None``) shows every GPU; the list is read
    left to right, and the first entry that is not a valid index (``-1``, out of range, empty) ends it;
    a repeated index hides every GPU. ``""`` therefore hides all of them. UUIDs (``GPU-...``) are not
    handled here.
    """
    if physical_count < 0:
        raise ValueError(f"physical_count must be >= 0, got {physical_count}")
    if visible is None:
        return list(range(physical_count))
    if visible.strip().startswith(("GPU-", "MIG-")):
        raise ValueError("logical_to_physical() handles numeric indices only, not GPU-/MIG- UUIDs")
    out: list[int] = []
    for entry in visible.split(","):
        m = re.match(r"\d+", entry.strip())
        if m is None:
            break
        index = int(m.group())
        if index in out:
            return []
        if index >= physical_count:
            break
        out.append(index)
    return out


# --- choosing ---------------------------------------------------------------------------------------

def choose_gpus(gpus: Sequence[GpuMemory], n: int = 1, min_free_mib: int = 0,
                allowed: Sequence[int] | None = None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` string for the ``n`` GPUs with the most free memory (at least
    ``min_free_mib`` each), most free first; ties go to the lower index. ``allowed`` restricts the
    choice (e.g. to the GPUs a scheduler gave this job). Raises `NoGpuError` when too few qualify.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    candidates = [g for g in gpus if (allowed is None or g.index in allowed) and g.free_mib >= min_free_mib]
    candidates.sort(key=lambda g: (-g.free_mib, g.index))
    if len(candidates) < n:
        table = "; ".join(str(g) for g in sorted(gpus, key=lambda g: g.index)) or "no GPUs"
        scope = "" if allowed is None else f" among the allowed GPUs {list(allowed)}"
        raise NoGpuError(f"asked for {n} GPU(s) with at least {min_free_mib} MiB free{scope}, but only "
                         f"{len(candidates)} qualify ({table}). Ask for fewer GPUs or less memory, or wait.")
    return ",".join(str(g.index) for g in candidates[:n])


# --- querying the machine ---------------------------------------------------------------------------

def query_nvidia_smi(timeout: float = 15.0) -> list[GpuMemory]:
    """Free and total memory of every GPU from nvidia-smi's query form. Raises `NoGpuError` (saying
    why) when nvidia-smi is missing, fails, or lists no GPU. Does not touch CUDA in this process."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise NoGpuError("nvidia-smi is not on the PATH (no NVIDIA driver installed here)")
    try:
        out = subprocess.run([exe, *QUERY], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NoGpuError(f"nvidia-smi could not be run ({type(exc).__name__}: {exc})") from None
    if out.returncode != 0:
        msg = (out.stderr or out.stdout).strip().splitlines()
        raise NoGpuError(f"nvidia-smi failed (exit {out.returncode}): {msg[0] if msg else 'no message'}")
    gpus = parse_query_csv(out.stdout)
    if not gpus:
        raise NoGpuError("nvidia-smi lists no GPU")
    return gpus


_TORCH_PROBE = """
import json, torch
if not torch.cuda.is_available():
    print(json.dumps([]))
else:
    print(json.dumps([[i, *torch.cuda.mem_get_info(i)] for i in range(torch.cuda.device_count())]))
"""


def query_torch(timeout: float = 180.0) -> list[GpuMemory]:
    """Free and total memory of every GPU from ``torch.cuda.mem_get_info``, run in a subprocess (with
    ``CUDA_VISIBLE_DEVICES`` unset and ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so indices are physical and
    match nvidia-smi's). The caller's CUDA stays uninitialised. Raises `NoGpuError` saying why."""
    import torch

    if torch.version.cuda is None:
        raise NoGpuError(f"this PyTorch ({torch.__version__}) is built without CUDA")
    text = run_python(_TORCH_PROBE, env={"CUDA_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
                      timeout=timeout)
    try:
        rows = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise NoGpuError(f"the torch.cuda.mem_get_info probe failed: {text.strip()[-300:]}") from None
    if not rows:
        raise NoGpuError("PyTorch sees no CUDA GPU (torch.cuda.is_available() is False)")
    return [GpuMemory(int(i), int(free) // 2**20, int(total) // 2**20) for i, free, total in rows]


def free_gpu_memory(method: str = "auto") -> list[GpuMemory]:
    """Every GPU with its free memory, most free first. ``method``: ``'nvidia-smi'``, ``'torch'`` or
    ``'auto'`` (nvidia-smi, else torch in a subprocess). Raises `NoGpuError` saying why, e.g. on a
    machine with no GPU or without nvidia-smi and without a CUDA build of PyTorch."""
    if method not in ("auto", "nvidia-smi", "torch"):
        raise ValueError(f"method must be 'auto', 'nvidia-smi' or 'torch', got {method!r}")
    reasons = []
    for name, query in (("nvidia-smi", query_nvidia_smi), ("torch", query_torch)):
        if method not in ("auto", name):
            continue
        try:
            gpus = query()
        except NoGpuError as exc:
            reasons.append(str(exc))
            continue
        return sorted(gpus, key=lambda g: (-g.free_mib, g.index))
    raise NoGpuError("No NVIDIA GPU found: " + "; and ".join(reasons)
                     + ". On this machine, run on the CPU (or another accelerator) instead.")


def pick_gpus(n: int = 1, min_free_mib: int = 0, method: str = "auto") -> str:
    """A ``CUDA_VISIBLE_DEVICES`` string for the ``n`` GPUs with the most free memory, e.g. ``'3,1'``.

    If ``CUDA_VISIBLE_DEVICES`` is already set (by you or by a cluster scheduler), only those GPUs
    are candidates. Use the result before CUDA initialises, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``::

        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        os.environ["CUDA_VISIBLE_DEVICES"] = pick_gpus(2)

    Raises `NoGpuError` saying why when there is no GPU, no way to ask, or too few GPUs qualify.
    """
    gpus = free_gpu_memory(method)
    current = os.environ.get("CUDA_VISIBLE_DEVICES")
    allowed = None
    if current is not None:
        allowed = logical_to_physical(current, max(g.index for g in gpus) + 1)
        if not allowed:
            raise NoGpuError(f"CUDA_VISIBLE_DEVICES={current!r} is set and hides every GPU from this "
                             "process; unset it (or restart the kernel without it) to choose among all GPUs")
    return choose_gpus(gpus, n, min_free_mib, allowed)


# --- plumbing for the notebook's subprocess demonstrations ------------------------------------------

def captured_memory_report() -> str | None:
    """The ``nvidia-smi -q -d Memory`` text captured on the course's GPU host, or None if not shipped."""
    try:
        return CAPTURED_REPORT.read_text(encoding="utf-8")
    except OSError:
        return None


def captured_query() -> str | None:
    """The query-form output captured on the course's GPU host, or None if not shipped."""
    try:
        return CAPTURED_QUERY.read_text(encoding="utf-8")
    except OSError:
        return None
