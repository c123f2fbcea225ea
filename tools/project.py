"""What the course is made of, in one place: its repository, its lessons, the code each lesson uses, and
the make targets. `tools/sync_notebooks.py` writes README's generated parts from here, the tests check
the notebooks against it, and the site (site_src/) links to the repository named here.

- `repository_url()`: ``[project.urls] Repository`` in pyproject.toml (a fork changes that line only).
- `CURRICULUM`: the lessons in order, as (file stem, title, what it teaches). The notebook set must be
  exactly these (plus appendices, ``9N_appendix_*.ipynb``).
- `notebook_modules(path)`: the ``course_utils`` modules a notebook's code cells import, read from the
  notebook itself, so README's map of notebook → code cannot drift from the code.
- `make_targets()`: each make target with the ``##`` comment above it in the Makefile (``make help``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Lesson(NamedTuple):
    stem: str
    title: str
    teaches: str


CURRICULUM: tuple[Lesson, ...] = (
    Lesson("00_setup", "Setup",
           "what hardware you have; getting a GPU on Colab; how recorded GPU outputs appear on a CPU-only machine"),
    Lesson("01_cpu_vs_gpu", "CPU vs GPU",
           "latency vs throughput; a measured matmul sweep; asynchronous execution and timing it right; launch "
           "overhead; precision and speed"),
    Lesson("02_moving_data", "Moving data",
           "`.to()` for tensors and modules; device mismatch errors; pinned memory and `non_blocking`; "
           "device-agnostic code"),
    Lesson("03_torch_cuda_api", "The torch.cuda API",
           "physical vs logical GPUs and `CUDA_VISIBLE_DEVICES`; choosing GPUs by free memory; seeds; memory "
           "and out-of-memory"),
    Lesson("04_data_parallel", "DataParallel",
           "scatter → parallel compute → gather; `nn.DataParallel` and its limits; a CPU-runnable model of it"),
    Lesson("05_distributed_data_parallel", "DistributedDataParallel",
           "processes and all-reduce; DDP on CPU and GPU; `torchrun` on one and two nodes; fault tolerance"),
    Lesson("06_loading_across_devices", "Loading across devices",
           "`map_location`; `module.` and `_orig_mod.` prefixes; `weights_only`; optimizer state across devices; "
           "`mmap=True`; safetensors"),
    Lesson("07_performance_toolbox", "The performance toolbox",
           "profiling a step (trace and timeline); mixed precision and GradScaler; `torch.compile`; CUDA graphs; "
           "memory snapshots and fragmentation; the input pipeline; the speed ladder and MFU"),
    Lesson("08_fully_sharded_data_parallel", "When the model does not fit: FSDP2",
           "memory anatomy of a training step; activation checkpointing; FSDP2 `fully_shard` on gloo and NCCL; "
           "ZeRO stages measured; distributed checkpoints saved on N ranks, loaded on M"),
    Lesson("09_when_it_breaks", "When it breaks: a clinic",
           "memory that grows; device-side asserts; CUDA in forked workers; NaN and inf; nondeterminism; an "
           "idle GPU; hung ranks; a wrong install: each failure reproduced, diagnosed and fixed"),
    Lesson("11_model_parallel", "Model parallelism: tensor, sequence and pipeline",
           "a DeviceMesh and its groups; tensor parallelism of a GPT block with DTensor (Shard, Replicate, "
           "Partial) and its all-reduces counted; sequence parallelism and loss parallel; pipeline schedules "
           "(GPipe, 1F1B, interleaved), their bubble and the activations they keep; FSDP2 × TP and its "
           "checkpoint on another mesh; choosing (dp, tp, pp) from what each GPU holds and sends"),
)

APPENDIX = re.compile(r"^9\d_appendix_[a-z0-9_]+$")
"""File stems of appendices (maintainers' validation and the like), numbered from 90."""


def repository_url() -> str:
    """``https://github.com/OWNER/NAME`` from pyproject.toml's ``[project.urls] Repository``."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    m = re.search(r'^Repository\s*=\s*"(https://github\.com/[^"]+?)/?"', text, re.M)
    if not m:
        sys.exit('pyproject.toml: [project.urls] needs Repository = "https://github.com/OWNER/NAME"')
    return m.group(1)


# --- which course_utils modules a notebook uses ---------------------------------------------------------

_FROM = re.compile(r"^\s*from course_utils(\.[\w.]+)? import \(?([\w\s,()]+?)\)?\s*$", re.M)
_IMPORT_MODULE = re.compile(r"^\s*import course_utils\.([\w.]+)", re.M)
PACKAGE = ROOT / "course_utils"


def _package_names() -> dict[str, str]:
    """Names ``course_utils/__init__.py`` re-exports → the module each comes from (read, not imported)."""
    text = (PACKAGE / "__init__.py").read_text(encoding="utf-8")
    names: dict[str, str] = {}
    for module, imported in re.findall(r"^from \.(\w+) import ([^\n]+)$", text, re.M):
        for name in imported.split(","):
            names[name.strip()] = module
    return names


def _is_module(dotted: str) -> bool:
    return (PACKAGE / f"{dotted.replace('.', '/')}.py").is_file()


def _is_package(dotted: str) -> bool:
    return (PACKAGE / dotted.replace(".", "/") / "__init__.py").is_file()


def notebook_modules(path: Path) -> list[str]:
    """The ``course_utils`` modules a notebook's code cells import, sorted, as dotted paths below the package
    (``timing``, ``hardware.gpus``, ``exercises.setup``).

    ``from course_utils import benchmark`` counts as the module that defines ``benchmark`` (timing);
    ``from course_utils.hardware import gpus`` as ``hardware.gpus``; ``from course_utils.hardware.gpus import
    pick_gpus`` as ``hardware.gpus``. The ``%%gpu`` magic (module ``recording``), which every notebook loads in
    its setup cell, is left out.
    """
    nb = json.loads(path.read_text(encoding="utf-8"))
    source = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    exported = _package_names()
    found: set[str] = set()
    for where, names in _FROM.findall(source):
        where = where.lstrip(".")
        if where and _is_module(where):
            found.add(where)
            continue
        for item in re.split(r"[,()]+", names):
            name = item.split(" as ")[0].strip()
            if not name:
                continue
            dotted = f"{where}.{name}" if where else name
            if _is_module(dotted):
                found.add(dotted)
            elif not where and name in exported:
                found.add(exported[name])
            elif where and _is_package(where):
                found.add(where)
    found.update(m for m in _IMPORT_MODULE.findall(source) if _is_module(m))
    found.discard("recording")
    return sorted(found)


# --- make targets -------------------------------------------------------------------------------------

class Target(NamedTuple):
    name: str
    help: str


def make_targets() -> list[Target]:
    """Every make target that has ``## ...`` comment lines right above its rule, in Makefile order."""
    targets: list[Target] = []
    comment: list[str] = []
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            comment.append(line[3:].strip())
            continue
        m = re.match(r"^([a-z][\w-]*):", line)
        if m and comment:
            targets.append(Target(m.group(1), " ".join(comment)))
        comment = []
    return targets


if __name__ == "__main__":
    if sys.argv[1:] == ["help"]:
        import textwrap

        width = max(len(t.name) for t in make_targets()) + 7
        for t in make_targets():
            print(textwrap.fill(t.help, 110, initial_indent=f"make {t.name:<{width - 5}}",
                                subsequent_indent=" " * width))
    else:
        sys.exit("usage: python tools/project.py help")
