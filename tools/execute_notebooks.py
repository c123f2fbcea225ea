#!/usr/bin/env python3
"""Execute notebooks with nbclient and check their errors both ways, with no GPU visible.

    python tools/execute_notebooks.py [--timeout 600] [--output-dir DIR] [--json FILE] [notebooks ...]
    python tools/execute_notebooks.py --probe

Every notebook runs on a copy in a temporary folder (its folder is copied too, so ``data/`` beside it is
there; the committed notebooks are never rewritten), in a ``python3`` kernel of the interpreter that runs
this file, with the notebook's folder as working directory, ``CUDA_VISIBLE_DEVICES=""`` and
``COURSE_DEVICE=cpu``. Execution goes on after an error (``allow_errors``), and then:

- a code cell tagged ``raises-exception`` (or ``nbval-raises-exception``) must have raised: a deliberate
  error that no longer happens is a failure. A tagged cell whose committed outputs show no error (a
  ``%%gpu`` cell, which raises on a GPU host and replays its recording on a CPU) must not raise either;
- no other cell may have an error output.

A tagged cell that raised another exception than the one in the committed outputs is noted, not failed.
Outputs are not compared (that is nbval's work). Per notebook it prints ok/FAIL and the seconds, and each
problem with the cell index, the cell's first line, the exception's name and message. The exit status is 1
when any notebook failed. ``--probe`` runs one cell in such a kernel and prints its interpreter and torch.

Importable: ``execute_notebooks(paths)`` returns one ``NotebookResult`` per notebook and
``check_outputs(nb)`` checks a notebook that has already been executed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

RAISES_TAGS = frozenset({"raises-exception", "nbval-raises-exception"})
# What every kernel sees: no GPU, and the course's device choice pinned to the CPU.
CPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "COURSE_DEVICE": "cpu"}
KERNEL_NAME = "python3"
PROBE_CODE = ("import sys, torch\n"
              "print('kernel python:', sys.executable)\n"
              "print('kernel torch:', torch.__version__)\n"
              "print('kernel cuda available:', torch.cuda.is_available())")
# Not copied with a notebook's folder: editor and interpreter caches.
_SKIP_DIRS = {".ipynb_checkpoints", "__pycache__", ".pytest_cache"}


@dataclass
class Problem:
    """One failed check in one cell. kind: 'error' (an untagged cell raised) or 'did-not-raise'."""

    cell: int
    first_line: str
    kind: str
    ename: str = ""
    evalue: str = ""

    def __str__(self) -> str:
        where = f"cell {self.cell} ({self.first_line!r})"
        if self.kind == "did-not-raise":
            return f"{where}: was meant to raise but did not"
        if self.kind == "other-exception":
            return f"{where}: raised {self.ename}: {self.evalue}"
        return f"{where}: {self.ename}: {self.evalue}"


@dataclass
class NotebookResult:
    name: str
    ok: bool
    seconds: float
    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)
    crash: str = ""  # a timeout or a dead kernel: the run stopped there

    def to_dict(self) -> dict:
        return asdict(self)


def first_line(source: str | list[str], width: int = 70) -> str:
    text = source if isinstance(source, str) else "".join(source)
    lines = text.strip().splitlines()
    return lines[0][:width] if lines else ""


def _errors(cell: Mapping) -> list[Mapping]:
    return [out for out in cell.get("outputs", []) if out.get("output_type") == "error"]


def _tags(cell: Mapping) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def check_outputs(nb: Mapping, recorded: Mapping | None = None) -> tuple[list[Problem], list[Problem]]:
    """Check an executed notebook both ways; returns (problems, notes).

    problems: an untagged code cell with an error output, or a cell tagged ``raises-exception`` without one.
    ``recorded`` is the same notebook before execution, with its committed outputs (from a CPU run). A
    tagged cell whose committed outputs show it ran without raising must not raise: a ``%%gpu`` cell
    raises on a GPU host and shows its recording on a CPU. Without ``recorded``, or when the cell has no
    committed outputs, a tagged cell must raise.
    notes: a tagged cell that raised another exception than the committed one.
    """
    problems: list[Problem] = []
    notes: list[Problem] = []
    recorded_cells = list(recorded.get("cells", [])) if recorded is not None else []
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        errors = _errors(cell)
        line = first_line(cell.get("source", ""))
        if _tags(cell) & RAISES_TAGS:
            before = recorded_cells[i] if i < len(recorded_cells) else {}
            before_errors = _errors(before)
            meant_to_raise = bool(before_errors) or not before.get("outputs")
            if not errors:
                if meant_to_raise:
                    problems.append(Problem(i, line, "did-not-raise"))
                continue
            if not meant_to_raise:  # e.g. a %%gpu cell whose replay of its recording broke
                problems.extend(Problem(i, line, "error", str(out.get("ename", "")),
                                        f"{out.get('evalue', '')} (its committed outputs show no error)")
                                for out in errors)
            elif before_errors and before_errors[0].get("ename") != errors[0].get("ename"):
                notes.append(Problem(i, line, "other-exception", str(errors[0].get("ename", "")),
                                     f"{errors[0].get('evalue', '')} (committed output: "
                                     f"{before_errors[0].get('ename')})"))
        else:
            problems.extend(Problem(i, line, "error", str(out.get("ename", "")), str(out.get("evalue", "")))
                            for out in errors)
    return problems, notes


def _native_kernel_manager_class():
    """An AsyncKernelManager whose 'python3' is always this interpreter's ipykernel.

    A python3 kernelspec installed elsewhere (a user's, the system's) could start another Python; with no
    kernelspec folders, jupyter_client falls back to ipykernel's own spec: [sys.executable, -m, ...].
    """
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class NativeKernelManager(AsyncKernelManager):
        @default("kernel_spec_manager")
        def _kernel_spec_manager_default(self) -> KernelSpecManager:
            return KernelSpecManager(kernel_dirs=[], parent=self)

    return NativeKernelManager


def kernel_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(CPU_ENV)
    env.update(extra or {})
    return env


def execute_notebook(nb, cwd: Path, timeout: int = 600, env: Mapping[str, str] | None = None) -> str:
    """Execute ``nb`` (a NotebookNode, changed in place) in ``cwd``; returns '' or why the run stopped."""
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout, kernel_name=KERNEL_NAME, allow_errors=True,
                            kernel_manager_class=_native_kernel_manager_class(),
                            resources={"metadata": {"path": str(cwd)}})
    try:
        client.execute(env=kernel_env(env))
    except Exception as exc:  # a cell timeout or a dead kernel; cell errors are outputs (allow_errors)
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return ""


def _folder_files(folder: Path) -> list[Path] | None:
    """The folder's files that git does not ignore (relative), or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z", "--", "."], cwd=folder,
                             check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [Path(p) for p in out.split("\0") if p and (folder / p).is_file()]


def copy_folder(src: Path, dest: Path) -> None:
    """Copy a notebook folder (without ignored files and caches) to ``dest``."""
    files = _folder_files(src)
    if not files:  # outside a git checkout, or a folder git ignores
        shutil.copytree(src, dest, ignore=lambda _d, names: [n for n in names if n in _SKIP_DIRS])
        return
    dest.mkdir(parents=True, exist_ok=True)
    for rel in files:
        if _SKIP_DIRS & set(rel.parts):
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dest / rel)


def execute_notebooks(paths: Iterable[Path], timeout: int = 600, output_dir: Path | None = None,
                      env: Mapping[str, str] | None = None,
                      report: Callable[[str], None] | None = print) -> list[NotebookResult]:
    """Execute copies of the notebooks and check them; the executed copies stay in ``output_dir`` if given."""
    import nbformat

    paths = [Path(p).resolve() for p in paths]
    work = Path(output_dir).resolve() if output_dir else Path(tempfile.mkdtemp(prefix="execute-notebooks-"))
    copies: dict[Path, Path] = {}
    results = []
    try:
        for path in paths:
            if path.parent not in copies:
                copies[path.parent] = work / f"{len(copies)}-{path.parent.name}"
                copy_folder(path.parent, copies[path.parent])
            copy = copies[path.parent] / path.name
            if not copy.exists():  # an ignored or untracked-and-ignored notebook was asked for by name
                shutil.copy2(path, copy)
            recorded = nbformat.read(copy, as_version=4)
            nb = nbformat.read(copy, as_version=4)
            t0 = time.perf_counter()
            crash = execute_notebook(nb, copy.parent, timeout=timeout, env=env)
            seconds = time.perf_counter() - t0
            problems, notes = check_outputs(nb, recorded)
            result = NotebookResult(path.name, not problems and not crash, round(seconds, 1), problems, notes,
                                    crash)
            nbformat.write(nb, copy)
            results.append(result)
            if report:
                report(format_result(result))
    finally:
        if not output_dir:
            shutil.rmtree(work, ignore_errors=True)
    return results


def format_result(result: NotebookResult) -> str:
    lines = [f"{'ok' if result.ok else 'FAIL':4} {result.name}: {result.seconds:.1f} s"]
    if result.crash:
        lines.append(f"  stopped: {result.crash}")
    lines += [f"  {p}" for p in result.problems]
    lines += [f"  note: {p}" for p in result.notes]
    return "\n".join(lines)


def summary(results: list[NotebookResult]) -> str:
    failed = [r.name for r in results if not r.ok]
    text = f"notebooks: {len(results) - len(failed)} ok, {len(failed)} failed"
    return text + (f" ({', '.join(failed)})" if failed else "")


def probe(timeout: int = 120) -> str:
    """Run PROBE_CODE in a kernel as the notebooks get it; returns its printed output."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(PROBE_CODE)])
    with tempfile.TemporaryDirectory(prefix="kernel-probe-") as tmp:
        crash = execute_notebook(nb, Path(tmp), timeout=timeout)
    if crash:
        raise RuntimeError(f"the kernel probe stopped: {crash}")
    cell = nb.cells[0]
    if _errors(cell):
        err = _errors(cell)[0]
        raise RuntimeError(f"the kernel probe raised {err.get('ename')}: {err.get('evalue')}")
    return "".join(out.get("text", "") for out in cell.outputs if out.get("output_type") == "stream")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to run (default: notebooks/*.ipynb of this repository)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    parser.add_argument("--output-dir", type=Path, help="keep the executed copies here")
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--probe", action="store_true", help="print the kernel's interpreter and torch")
    args = parser.parse_args(argv)
    if args.probe:
        print(probe(), end="", flush=True)
        return 0
    paths = args.notebooks or sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
    results = execute_notebooks(paths, timeout=args.timeout, output_dir=args.output_dir,
                                report=lambda line: print(line, flush=True))
    print(summary(results), flush=True)
    if args.json:
        args.json.write_text(json.dumps([r.to_dict() for r in results], indent=1) + "\n", encoding="utf-8")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
