#!/usr/bin/env python3
"""Re-execute notebooks in place, so their stored outputs come from a fresh CPU run.

    python tools/refresh_notebooks.py notebooks/01_cpu_vs_gpu.ipynb [...]

Run it in the pinned test environment (`make refresh` does). GPUs are hidden (CUDA_VISIBLE_DEVICES=""
and COURSE_DEVICE=cpu), so GPU cells store their recordings, as on a student's CPU-only machine and in
strict nbval. Cells tagged ``raises-exception`` may raise; any other error stops with a message.

Tracebacks of those deliberate errors name files on this machine; they are stored with the installed
packages' folder as ``<site-packages>/`` and this repository's files relative to its root, so that a
student never reads the folders of the machine that refreshed the notebook.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from course_utils.recording import PACKAGE_FOLDER

ROOT = Path(__file__).resolve().parents[1]
_IPYKERNEL_CELL = re.compile(r"/tmp/ipykernel_\d+/\d+\.py")


def scrub_paths(text: str, root: Path = ROOT) -> str:
    """``text`` without this machine's folders: installed packages, this repository, kernel cell files."""
    text = PACKAGE_FOLDER.sub("<site-packages>/", text)
    text = _IPYKERNEL_CELL.sub("<ipykernel-cell>", text)
    return text.replace(str(root) + os.sep, "")


def scrub_outputs(nb: nbformat.NotebookNode) -> None:
    """Apply `scrub_paths` to every stored traceback, error value and stream text."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "traceback" in out:
                out["traceback"] = [scrub_paths(line) for line in out["traceback"]]
            for key in ("evalue", "text"):
                if isinstance(out.get(key), str):
                    out[key] = scrub_paths(out[key])


def refresh(path: Path, timeout: int = 600) -> float:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - t0
    scrub_outputs(nb)
    nbformat.write(nb, path)
    return elapsed


def main(argv: list[str]) -> int:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["COURSE_DEVICE"] = "cpu"
    os.environ.pop("COURSE_RECORD", None)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    paths = [Path(p) for p in argv] or sorted(Path("notebooks").glob("*.ipynb"))
    for path in paths:
        try:
            print(f"{path}: {refresh(path):.1f} s", flush=True)
        except CellExecutionError as exc:
            print(f"{path}: a cell failed; the notebook was not rewritten.\n{exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
