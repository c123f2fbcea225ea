"""`make test`'s two passes, side by side on a machine's cores, with a report that explains a failure.

    python tools/run_tests.py [--serial] [--only main|other-cpu] [-- PYTEST_ARGS...]

1. **main**: the unit tests and strict nbval of every notebook, in this environment (GPUs hidden: the stored
   outputs are from a CPU run), with the CPU's own kernels and threads;
2. **other-cpu**: strict nbval of every notebook again on another CPU code path (one thread, AVX2 kernels
   in ATen, MKL and oneDNN), as another machine runs them; and, to balance the two, the unit tests of
   `BALANCED`, which start several processes.

The two passes run at the same time, each in its own pytest process (``--serial``, or a machine of one core:
one after the other).
Each pass's whole output goes to ``test-output/<pass>.log``; what the course's subprocesses print (torchrun
jobs, quiet workers) goes to ``test-output/subprocess/`` (``COURSE_SUBPROCESS_LOGS``). At the end the runner
prints each pass's result and, for a pass that failed, its failing tests and the end of every torchrun log whose
job exited with an error, so that CI's own log says what happened.

One failure is run again: a test file or notebook whose failures all come from a worker process that crashed
in native code (`course_utils.distributed.launch` reports it as "died from signal ..."; in CI on 2026-12-05 a
worker of notebook 11 lost its process to a general protection fault inside ``malloc``, in gloo's transport
thread ``pt_gloo_runloop``, as the kernel logged it). Such a crash is not the course's code, and no test can
make it impossible; so the failing files run once more, alone, in the same environment (log:
``test-output/<pass>-rerun.log``). A pass that then passes prints ``RERUN <file>: ...`` with the crash's first
line, which ``make soak`` counts; any other failure, or a second crash, fails the pass as before.

Both passes run with ``OMP_WAIT_POLICY=PASSIVE``: OpenMP's threads then sleep, rather than spin, while they wait
for each other. With spinning threads, a notebook that uses both cores slowed down fivefold (29 s to 141 s for
notebook 07) as soon as any other process wanted a core, which made the suite slow and its timeouts fragile on
a busy machine.
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
COMMON = {"CUDA_VISIBLE_DEVICES": "", "COURSE_DEVICE": "cpu", "OMP_WAIT_POLICY": "PASSIVE"}
# how one machine imitates another CPU; OTHER_CPU_ISA=default: ATen's plain kernels (`make test OTHER_CPU_ISA=default`)
OTHER_CPU = {"OMP_NUM_THREADS": "1", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "ATEN_CPU_CAPABILITY": os.environ.get("OTHER_CPU_ISA", "avx2"), "ONEDNN_MAX_CPU_ISA": "AVX2"}
# Unit tests that start several processes or wait on timers, which make the main pass the longer one: they run
# beside the other pass's notebooks instead, so that the two passes end at about the same time (the environment
# of either is fine for them).
BALANCED = ["tests/test_ddp_demos.py", "tests/test_ddp_train.py", "tests/test_torchrun.py", "tests/test_answers_07.py",
            "tests/test_model_parallel_demos.py", "tests/test_answers_11.py", "tests/test_answers_01.py",
            "tests/test_test_tools.py"]
PASSES = {"main": ([*(f"--ignore={t}" for t in BALANCED)], {}), "other-cpu": (["notebooks", *BALANCED], OTHER_CPU)}
FAILED = re.compile(r"^(FAILED|ERROR) ((?:tests|notebooks)/\S+)", re.M)
SECTION = re.compile(r"^_{3,} (?:ERROR at \w+ of )?(\S.*?) _{3,}$", re.M)  # a failure's report: "_ test_x _"
CRASH = re.compile(r"rank \d+ died from signal \w+")  # course_utils.distributed.launch's words for a crash
RERUN = re.compile(r"^RERUN (\S+): ", re.M)


def pass_env(name: str, logs: Path) -> dict[str, str]:
    """A pass's environment: GPUs hidden, its CPU code path, its subprocesses' logs in ``logs``."""
    return {**os.environ, **COMMON, **PASSES[name][1], "COURSE_SUBPROCESS_LOGS": str(logs)}


def start(name: str, extra: list[str]) -> tuple[subprocess.Popen[bytes], float]:
    """One pass as a pytest process, its output going to test-output/NAME.log."""
    paths, _ = PASSES[name]
    env = pass_env(name, OUT / "subprocess" / name)
    cmd = [sys.executable, "-m", "pytest", "--durations=10", "-rfE", *paths, *extra]
    print(f"{name}: {' '.join(cmd[1:])}  (output in test-output/{name}.log)", flush=True)
    log = (OUT / f"{name}.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()  # the child holds its own copy
    return proc, time.monotonic()


def failed_jobs(folder: Path) -> list[Path]:
    """torchrun logs in ``folder`` whose job exited with an error."""
    found = []
    for path in sorted(folder.glob("torchrun-*.log")):
        head = path.read_text(encoding="utf-8", errors="replace").split("\n", 2)
        if len(head) > 1 and not head[1].startswith("exit code 0 "):
            found.append(path)
    return found


def crashed_files(log: str) -> list[str]:
    """The test files and notebooks to run again: those whose failing tests' reports hold a worker's crash
    (`CRASH`), when every failing test of the log is in one of them (else none: a real failure stays one)."""
    failing = {m.group(2) for m in FAILED.finditer(log)}  # "tests/test_x.py::test_y", "notebooks/x.ipynb::Cell"
    starts = list(SECTION.finditer(log))
    crashed = set()
    for i, m in enumerate(starts):
        if not CRASH.search(log, m.end(), starts[i + 1].start() if i + 1 < len(starts) else len(log)):
            continue
        header = m.group(1)  # "notebooks/x.ipynb::Cell 5", or a test's name: "test_y", "TestX.test_y[1]"
        if header.startswith(("tests/", "notebooks/")):
            crashed.add(header.split("::")[0])
        else:
            crashed |= {t.split("::")[0] for t in failing if t.endswith("::" + header.replace(".", "::"))}
    if not failing or not crashed or any(t.split("::")[0] not in crashed for t in failing):
        return []
    return sorted(crashed)


def rerun_after_crash(name: str, status: int) -> int:
    """A pass's exit status, once its crashed files (`crashed_files`) have run again if it failed by a crash:
    0 if they pass now."""
    if status == 0:
        return 0
    text = (OUT / f"{name}.log").read_text(encoding="utf-8", errors="replace")
    files = crashed_files(text)
    if not files:
        return status
    crash = CRASH.search(text)
    print(f"{name}: {', '.join(files)} failed by a worker's crash ({crash.group(0) if crash else '?'}); "
          f"running {'it' if len(files) == 1 else 'them'} once more (test-output/{name}-rerun.log)", flush=True)
    env = pass_env(name, OUT / "subprocess" / f"{name}-rerun")
    with (OUT / f"{name}-rerun.log").open("wb") as log:
        status = subprocess.run([sys.executable, "-m", "pytest", "-rfE", *files], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT).returncode
    if status == 0:
        for f in files:
            print(f"RERUN {f}: passed when run again after {crash.group(0) if crash else 'a crash'}", flush=True)
    return status


def report(name: str, tail: int = 25) -> None:
    """A pass's end, and for a failed pass: its failing tests and each failed torchrun job's last lines."""
    text = (OUT / f"{name}.log").read_text(encoding="utf-8", errors="replace")
    print(f"\n=== {name}: the end of test-output/{name}.log\n" + "\n".join(text.splitlines()[-60:]))
    names = sorted({m.group(2) for m in FAILED.finditer(text)})
    print(f"\n=== {name} failed: {len(names)} test(s)", *[f"  {n}" for n in names], sep="\n")
    rerun = OUT / f"{name}-rerun.log"
    if rerun.exists():
        lines = rerun.read_text(encoding="utf-8", errors="replace").splitlines()
        print(f"\n=== {name}: run again after a worker's crash, and failed again: the end of {rerun.relative_to(ROOT)}",
              *lines[-40:], sep="\n")
    jobs = failed_jobs(OUT / "subprocess" / name)
    for path in jobs:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        print(f"\n--- {path.relative_to(ROOT)} (the end of {len(lines)} lines)", *lines[:2], "...",
              *lines[-tail:], sep="\n")
    if jobs:
        print(f"\n({len(jobs)} torchrun job(s) of this pass exited with an error; some lessons mean theirs to. "
              f"Whole logs: test-output/subprocess/{name}/)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serial", action="store_true", help="one pass after the other (a one-core machine)")
    parser.add_argument("--only", choices=sorted(PASSES), help="run one pass only")
    parser.add_argument("--lint", metavar="COMMAND", help="a lint command to run beside the passes (make lint)")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --)")
    args = parser.parse_args(argv)
    OUT.mkdir(exist_ok=True)
    shutil.rmtree(OUT / "subprocess", ignore_errors=True)
    for name in PASSES:
        (OUT / f"{name}-rerun.log").unlink(missing_ok=True)
    names = [args.only] if args.only else list(PASSES)
    results: dict[str, tuple[int, float]] = {}
    lint = None
    if args.lint:  # light: beside the passes rather than before them
        print(f"lint: {args.lint}  (output in test-output/lint.log)", flush=True)
        with (OUT / "lint.log").open("wb") as log:
            lint = (subprocess.Popen(args.lint, shell=True, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT),
                    time.monotonic())
    if args.serial or len(names) == 1 or (os.cpu_count() or 1) < 2:
        for name in names:
            proc, began = start(name, args.pytest_args)
            results[name] = (rerun_after_crash(name, proc.wait()), time.monotonic() - began)
            if results[name][0] != 0:
                break  # as `make` stops at the first failing command
    else:
        running = {name: start(name, args.pytest_args) for name in names}
        while running:
            for name, (proc, began) in list(running.items()):
                if proc.poll() is not None:
                    results[name] = (rerun_after_crash(name, proc.returncode), time.monotonic() - began)
                    print(f"{name}: {'passed' if results[name][0] == 0 else 'FAILED'} in {results[name][1]:.0f} s",
                          flush=True)
                    del running[name]
            time.sleep(0.5)
    if lint is not None:
        results["lint"] = (lint[0].wait(), time.monotonic() - lint[1])
        if results["lint"][0] != 0:
            print("\n=== lint failed:\n" + (OUT / "lint.log").read_text(encoding="utf-8", errors="replace"))
    for name, (status, _) in results.items():
        if name == "lint":
            continue
        if status != 0:
            report(name)
        else:
            last = (OUT / f"{name}.log").read_text(encoding="utf-8", errors="replace").strip().splitlines()
            rerun = OUT / f"{name}-rerun.log"
            if rerun.exists():
                last += [f"(after a rerun) {rerun.read_text(encoding='utf-8', errors='replace').strip().splitlines()[-1]}"]
            print(f"{name}: {last[-1] if last else '(no output)'}")
    print("; ".join(f"{n}: {'passed' if s == 0 else f'FAILED (exit {s})'}" + ("" if n == "lint" else f" in {t:.0f} s")
                    for n, (s, t) in results.items()))
    return next((s for s, _ in results.values() if s != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
