"""`make test`'s two passes, on every core, with a report that explains a failure.

    python tools/run_tests.py [--workers N] [--only main|other-cpu] [-- PYTEST_ARGS...]

1. **main**: the unit tests and strict nbval of every notebook, in this environment (GPUs hidden: the stored
   outputs are from a CPU run);
2. **other-cpu**: strict nbval of every notebook again on another CPU code path (one thread, AVX2 kernels
   in ATen, MKL and oneDNN), as another machine runs them.

Each pass runs its tests on ``--workers`` processes (pytest-xdist; default: one per core). A test file, or a
notebook, stays on one worker from start to end (``--dist loadfile``): a notebook's cells share its kernel.
Each pass's whole output goes to ``test-output/<pass>.log``; what the course's subprocesses print (torchrun
jobs, quiet workers) goes to ``test-output/subprocess/`` (``COURSE_SUBPROCESS_LOGS``). When a pass fails,
the end of this run's output names the failing tests and shows the end of every torchrun log whose job
exited with an error, so that CI's own log says what happened.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "test-output"
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": "", "COURSE_DEVICE": "cpu"}
# how one machine imitates another CPU; OTHER_CPU_ISA=default: ATen's plain kernels (`make test OTHER_CPU_ISA=default`)
OTHER_CPU = {"OMP_NUM_THREADS": "1", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "ATEN_CPU_CAPABILITY": os.environ.get("OTHER_CPU_ISA", "avx2"), "ONEDNN_MAX_CPU_ISA": "AVX2"}
PASSES = {"main": ([], {}), "other-cpu": (["notebooks"], OTHER_CPU)}
FAILED = re.compile(r"^(FAILED|ERROR) (\S+)", re.M)


def run_pass(name: str, workers: int, extra: list[str]) -> tuple[int, float]:
    """One pytest session, its output shown as it comes and kept in test-output/NAME.log."""
    paths, env_extra = PASSES[name]
    env = {**os.environ, **CPU_ONLY, **env_extra, "COURSE_SUBPROCESS_LOGS": str(OUT / "subprocess")}
    cmd = [sys.executable, "-m", "pytest", *(["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []),
           "--durations=10", "-rfE", *paths, *extra]
    print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
    start = time.monotonic()
    with (OUT / f"{name}.log").open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        status = proc.wait()
    return status, time.monotonic() - start


def failed_jobs(folder: Path, since: float) -> list[Path]:
    """torchrun logs written since ``since`` whose job exited with an error."""
    found = []
    for path in sorted(folder.glob("torchrun-*.log")):
        if path.stat().st_mtime < since:
            continue
        head = path.read_text(encoding="utf-8", errors="replace").split("\n", 2)
        if len(head) > 1 and not head[1].startswith("exit code 0 "):
            found.append(path)
    return found


def report(name: str, since: float, tail: int = 25) -> None:
    """After a failed pass: its failing tests, and the end of each failed torchrun job's output."""
    text = (OUT / f"{name}.log").read_text(encoding="utf-8", errors="replace")
    names = sorted({m.group(2) for m in FAILED.finditer(text)})
    print(f"\n=== {name} failed: {len(names)} test(s)", *[f"  {n}" for n in names], sep="\n")
    jobs = failed_jobs(OUT / "subprocess", since)
    for path in jobs:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        print(f"\n--- {path.relative_to(ROOT)} (the end of {len(lines)} lines)", *lines[:2], "...",
              *lines[-tail:], sep="\n")
    if jobs:
        print(f"\n({len(jobs)} torchrun job(s) exited with an error during this pass; some lessons mean "
              "theirs to. Whole logs: test-output/subprocess/, whole output: "
              f"test-output/{name}.log)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="pytest-xdist workers per pass (default: one per core; 1: no xdist)")
    parser.add_argument("--only", choices=sorted(PASSES), help="run one pass only")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    OUT.mkdir(exist_ok=True)
    shutil.rmtree(OUT / "subprocess", ignore_errors=True)
    results = {}
    for name in ([args.only] if args.only else list(PASSES)):
        since = time.time()
        status, seconds = run_pass(name, args.workers, args.pytest_args)
        results[name] = (status, seconds)
        if status != 0:
            report(name, since)
            break  # as `make` stops at the first failing command
    print("\n" + "; ".join(f"{n}: {'passed' if s == 0 else f'FAILED (exit {s})'} in {t:.0f} s"
                           for n, (s, t) in results.items()))
    return next((s for s, _ in results.values() if s != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
