"""`make soak`: the flake budget in CI's own terms. Runs the README's test command (`make test`) N times, each
on a fresh clone of this repository's HEAD (a new .venv every time, as CI has), and reports each run's result,
time, failing tests and the files run again after a worker's crash (`tools/run_tests.py`).

    python tools/soak.py [--runs N] [--burn K] [--target test] [--keep]

- ``--burn K`` runs K busy processes beside every run (a loaded CI runner: other jobs on the same cores).
- Every run's whole log is kept in ``test-output/soak/run-NN.log`` (``run-NN-burnK.log`` with ``--burn K``); the
  table goes to ``test-output/soak/summary.txt`` (``summary-burnK.txt``). A run's clone (``build/soak/run-NN``)
  is deleted when it passes, kept when it fails (``--keep``: always kept), so that its ``test-output/`` and work
  folders can be read.
- Exit status: 0 when every run passed, 1 otherwise.

Only committed work is tested: a clone of HEAD, as CI's clone of main.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from run_tests import FAILED, RERUN  # noqa: E402  (how the logs name a failing test, a rerun: one pattern each)


def _burn() -> None:  # pragma: no cover - a busy loop until terminated
    while True:
        pass


def soak_once(index: int, target: str, keep: bool, out: Path, name: str) -> tuple[int, float, list[str]]:
    """Clone HEAD into build/soak/NAME, run ``make TARGET`` there; (exit status, seconds, failing tests)."""
    clone = ROOT / "build" / "soak" / name
    shutil.rmtree(clone, ignore_errors=True)
    clone.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    log = out / f"{name}.log"
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as f:
        status = subprocess.run(["make", target], cwd=clone, stdout=f, stderr=subprocess.STDOUT).returncode
    seconds = time.monotonic() - start
    text = log.read_text(encoding="utf-8", errors="replace")
    failing = sorted({m.group(2) for m in FAILED.finditer(text)})
    failing += [f"rerun after a crash: {m.group(1)}" for m in RERUN.finditer(text)]
    if status == 0 and not keep:
        shutil.rmtree(clone, ignore_errors=True)
    return status, seconds, failing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="how many fresh-clone runs (default 10)")
    parser.add_argument("--burn", type=int, default=0, help="busy processes beside each run (default 0)")
    parser.add_argument("--target", default="test", help="the make target to run (default: test)")
    parser.add_argument("--keep", action="store_true", help="keep every clone, not only the failing ones")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.burn < 0:
        parser.error("--runs must be at least 1 and --burn at least 0")
    out = ROOT / "test-output" / "soak"
    out.mkdir(parents=True, exist_ok=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    summary = f"summary{f'-burn{args.burn}' if args.burn else ''}.txt"
    lines = [f"make {args.target} on fresh clones of {head}, {args.burn} busy process(es) beside each run"]
    print(lines[0], flush=True)
    failures = 0
    for i in range(1, args.runs + 1):
        burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.burn)]
        for b in burners:
            b.start()
        try:
            name = f"run-{i:02d}" + (f"-burn{args.burn}" if args.burn else "")
            status, seconds, failing = soak_once(i, args.target, args.keep, out, name)
        finally:
            for b in burners:
                b.terminate()
                b.join()
        failures += status != 0
        line = (f"run {i:2d}: {'pass' if status == 0 else f'FAIL (exit {status})'} in {seconds / 60:5.2f} min"
                + (f"  {', '.join(failing)}" if failing else ""))
        lines.append(line)
        print(line, flush=True)
        (out / summary).write_text("\n".join(lines) + "\n", encoding="utf-8")
    lines.append(f"{args.runs - failures} of {args.runs} passed; logs in test-output/soak/")
    print(lines[-1])
    (out / summary).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
