#!/usr/bin/env python3
"""Test the course against one torch release: its unit tests and every notebook, in a venv of their own.

    python tools/compat.py TORCH_VERSION [--ref COMMIT] [--keep] [--skip-unit] [--skip-notebooks]
                           [--timeout S] [notebooks ...]
    make compat TORCH=2.9.0

1. A snapshot of the repository in build/compat-<version>/src: the working tree's tracked and untracked,
   not ignored files, or with --ref the files of that commit. The tests, the notebooks and course_utils
   are then of one moment even while the working tree changes. A fresh venv in
   build/compat-<version>/venv (the folder is replaced).
2. ``torch==<version>`` alone, with what that release requires as pip resolves it (from PyPI that is the
   CUDA build; it runs on the CPU here). The pip configuration's own constraint file, if any, is
   replaced by the one written in step 3 (PIP_CONSTRAINT), so a cap there does not hold back a release.
3. tests/requirements.txt with the pins of tests/constraints.txt, less the pins of torch and of every
   package step 2 installed (torch's own requirements differ between releases), plus ``torch==<version>``:
   build/compat-<version>/constraints.txt.
4. course_utils from the snapshot, ``--no-deps``: its ``torch>=2.9`` is what this run tests, not what it
   assumes.
5. A probe: the kernel that the notebooks get must be this venv's python with that torch.
6. The unit tests, ``python -m pytest tests`` in the snapshot's root, with no GPU visible.
7. Every notebook of the snapshot executed on copies by tools/execute_notebooks.py (cells tagged
   raises-exception must raise, no other cell may), with no GPU visible.

It ends with one line (torch, unit tests passed/failed/skipped, notebooks ok/failed, time) and writes
build/compat-<version>/result.json; logs of each step lie beside it. The venv (GBs) and the snapshot
are removed unless --keep, which also keeps the executed notebooks in build/compat-<version>/executed.
Exit status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from check_binder import copy_repo

ROOT = Path(__file__).resolve().parents[1]
TOOLS = Path(__file__).resolve().parent
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": "", "COURSE_DEVICE": "cpu"}
# Printed by every kernel that ipykernel starts over TCP: kept in the logs, not repeated on the terminal.
QUIET = ("[IPKernelApp] WARNING | Kernel is running over TCP without encryption",)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str | None:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line.split("#", 1)[0])
    return normalize(m.group(1)) if m else None


def base_version(version: str) -> str:
    return version.split("+", 1)[0]


def venv_env(venv: Path, constraint: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JUPYTER", "CONDA", "COURSE_", "PIP_CONSTRAINT"))}
    # An empty PIP_CONSTRAINT does not lift a constraint file named in pip's configuration (pip 23 and 26
    # alike); a file named here replaces it.
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_CONSTRAINT=str(constraint))
    return env


def run(cmd: list, log: Path | None = None, **kw) -> int:
    """Run a command, its output on the terminal and, with ``log``, appended to that file too."""
    cmd = [str(c) for c in cmd]
    print("+", " ".join(cmd), flush=True)
    if log is None:
        return subprocess.run(cmd, **kw).returncode
    with open(log, "a", encoding="utf-8") as fh:
        fh.write("+ " + " ".join(cmd) + "\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.startswith(QUIET):
                print(line, end="", flush=True)
            fh.write(line)
        return proc.wait()


def check(rc: int, what: str) -> None:
    if rc:
        raise RuntimeError(f"{what} failed (exit status {rc})")


def installed(py: Path, env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run([str(py), "-m", "pip", "list", "--format=json"], env=env, check=True,
                         capture_output=True, text=True).stdout
    return {normalize(p["name"]): p["version"] for p in json.loads(out)}


def write_constraints(dest: Path, torch_version: str, drop: set[str]) -> list[str]:
    """tests/constraints.txt less the pins of ``drop`` and torch, plus torch==version; returns the dropped."""
    kept, dropped = [], []
    for line in (ROOT / "tests" / "constraints.txt").read_text(encoding="utf-8").splitlines():
        name = requirement_name(line)
        if name and (name == "torch" or name in drop):
            dropped.append(line.strip())
        else:
            kept.append(line)
    header = [f"# tests/constraints.txt for `make compat TORCH={torch_version}`: the pins of torch and of the",
              "# packages that this torch release brought with it are left out; torch is pinned to the release."]
    dest.write_text("\n".join(header + kept + [f"torch=={torch_version}", ""]), encoding="utf-8")
    return dropped


def build_venv(version: str, out: Path, venv: Path, src: Path) -> dict:
    """Steps 1-5; returns facts for result.json."""
    log = out / "install.log"
    empty = out / "no-constraints.txt"
    empty.write_text("", encoding="utf-8")
    check(run([sys.executable, "-m", "venv", venv], log), "creating the venv")
    py = venv / "bin" / "python"
    env = venv_env(venv, empty)
    check(run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], log, env=env), "upgrading pip")
    before = set(installed(py, env))
    # --no-cache-dir: a CUDA build of torch with its nvidia-* wheels is 3-4 GB; each run downloads it anew.
    check(run([py, "-m", "pip", "install", "--no-cache-dir", "--progress-bar", "off", f"torch=={version}"],
              log, env=env), f"pip install torch=={version}")
    with_torch = installed(py, env)
    brought = set(with_torch) - before
    constraints = out / "constraints.txt"
    dropped = write_constraints(constraints, version, brought)
    print(f"constraints: {constraints.relative_to(ROOT)}; pins left out: {', '.join(dropped)}", flush=True)
    env = venv_env(venv, constraints)
    check(run([py, "-m", "pip", "install", "--progress-bar", "off", "-r", ROOT / "tests" / "requirements.txt"],
              log, env=env), "pip install -r tests/requirements.txt")
    # A copy of the snapshot to build from: the build leaves build/ and egg-info behind.
    check(run([py, "-m", "pip", "install", "-q", "--no-deps", shutil.copytree(src, out / "build-src")],
              log, env=env), "pip install course_utils")
    shutil.rmtree(out / "build-src", ignore_errors=True)
    pip_check = subprocess.run([str(py), "-m", "pip", "check"], env=env, capture_output=True, text=True)
    conflicts = [line for line in pip_check.stdout.splitlines() if line.strip() and "No broken" not in line]
    for line in conflicts:
        print(f"pip check: {line}", flush=True)
    packages = installed(py, env)
    if base_version(packages.get("torch", "")) != version:
        raise RuntimeError(f"torch {packages.get('torch')} was installed, not {version}")

    probe = subprocess.run([str(py), TOOLS / "execute_notebooks.py", "--probe"], env={**env, **CPU_ONLY},
                           cwd=out, capture_output=True, text=True)
    print(probe.stdout, end="", flush=True)
    facts = dict(line.split(": ", 1) for line in probe.stdout.splitlines() if line.startswith("kernel "))
    if probe.returncode or Path(facts.get("kernel python", "")) != py \
            or base_version(facts.get("kernel torch", "")) != version:
        raise RuntimeError(f"the notebooks' kernel is not this venv's python with torch {version}: "
                           f"{probe.stdout.strip()} {probe.stderr.strip()[-2000:]}")
    return {"torch_installed": packages["torch"], "kernel_python": facts["kernel python"],
            "constraints_dropped": dropped, "pip_check": conflicts,
            "packages": {k: packages[k] for k in sorted(packages)}}


def unit_tests(venv: Path, out: Path, src: Path, env: dict[str, str]) -> dict:
    xml = out / "unit.xml"
    rc = run([venv / "bin" / "python", "-m", "pytest", "tests", "-p", "no:cacheprovider", "-q", "-rfE",
              f"--junitxml={xml}"], out / "unit.log", cwd=src, env={**env, **CPU_ONLY})
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures = []
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = "::".join(part for part in (case.get("classname"), case.get("name")) if part)
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if case.find("skipped") is not None:
                counts["skipped"] += 1
            elif bad is not None:
                counts["failed" if bad.tag == "failure" else "errors"] += 1
                failures.append({"test": name, "message": (bad.get("message") or "")[:1000]})
            else:
                counts["passed"] += 1
    return {"exit_status": rc, **counts, "failures": failures}


def notebooks(venv: Path, out: Path, env: dict[str, str], paths: list[Path], timeout: int, keep: bool) -> dict:
    results_json = out / "notebooks.json"
    keep_args = ["--output-dir", out / "executed"] if keep else []
    rc = run([venv / "bin" / "python", TOOLS / "execute_notebooks.py", "--timeout", timeout, "--json",
              results_json, *keep_args, *paths], out / "notebooks.log", cwd=out, env={**env, **CPU_ONLY})
    results = json.loads(results_json.read_text(encoding="utf-8")) if results_json.exists() else []
    return {"exit_status": rc, "ok": [r["name"] for r in results if r["ok"]],
            "failed": {r["name"]: r for r in results if not r["ok"]},
            "notes": {r["name"]: r["notes"] for r in results if r["notes"]}}


def notebook_paths(root: Path, names: list[str]) -> list[Path]:
    """root/notebooks/ paths for names (notebooks/01_cpu_vs_gpu.ipynb or 01_cpu_vs_gpu.ipynb); all by default."""
    if not names:
        return sorted((root / "notebooks").glob("*.ipynb"))
    paths = [root / "notebooks" / Path(name).name for name in names]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise RuntimeError(f"no such notebook in notebooks/: {', '.join(missing)}")
    return paths


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def snapshot(src: Path, ref: str | None) -> dict:
    """The files to test, in ``src``: the working tree's (not ignored) files, or those of commit ``ref``."""
    if ref:
        commit = git("rev-parse", "--verify", f"{ref}^{{commit}}").strip()
        archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        src.mkdir(parents=True)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(src, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        return {"ref": ref, "commit": commit}
    copy_repo(src)
    try:
        return {"ref": "working tree", "commit": git("rev-parse", "HEAD").strip(),
                "uncommitted_changes": len(git("status", "--porcelain").splitlines())}
    except (OSError, subprocess.CalledProcessError):
        return {"ref": "working tree"}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("torch", help="a torch release, e.g. 2.9.0")
    parser.add_argument("notebooks", nargs="*", help="notebooks to execute (default: notebooks/*.ipynb)")
    parser.add_argument("--keep", action="store_true", help="keep the venv and the executed notebooks")
    parser.add_argument("--skip-unit", action="store_true", help="do not run the unit tests")
    parser.add_argument("--skip-notebooks", action="store_true", help="do not execute the notebooks")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per notebook cell")
    parser.add_argument("--ref", help="test this commit (e.g. HEAD) instead of the working tree")
    args = parser.parse_args(argv)
    version = args.torch
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        parser.error(f"TORCH_VERSION must look like 2.9.0, not {version!r}")

    t0 = time.perf_counter()
    out = ROOT / "build" / f"compat-{version}"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    venv, src = out / "venv", out / "src"
    result: dict = {"torch": version, "python": platform.python_version(), "passed": False,
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        result["tree"] = snapshot(src, args.ref)
        paths = notebook_paths(src, args.notebooks)
        # tests/conftest.py finds the 2019 lecture's checkpoints at <root>/../shared/fixtures.
        if (ROOT.parent / "shared").is_dir():
            (out / "shared").symlink_to(ROOT.parent / "shared")
        result.update(build_venv(version, out, venv, src))
        t_build = time.perf_counter() - t0
        result["install_seconds"] = round(t_build)
        print(f"compat {version}: venv ready in {t_build:.0f} s", flush=True)
        env = venv_env(venv, out / "constraints.txt")
        if not args.skip_unit:
            result["unit"] = unit_tests(venv, out, src, env)
        if not args.skip_notebooks:
            result["notebooks"] = notebooks(venv, out, env, paths, args.timeout, args.keep)
    except Exception as exc:  # a failed install or probe: reported in the summary and result.json
        result["error"] = f"{exc} ({type(exc).__name__})" if isinstance(exc, OSError) else str(exc)
        print(f"compat {version}: {exc}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(venv, ignore_errors=True)
            shutil.rmtree(src, ignore_errors=True)
            (out / "shared").unlink(missing_ok=True)

    unit, nbs = result.get("unit"), result.get("notebooks")
    unit_ok = unit is None or (unit["exit_status"] == 0 and not unit["failed"] and not unit["errors"])
    notebooks_ok = nbs is None or (nbs["exit_status"] == 0 and not nbs["failed"])
    result["passed"] = "error" not in result and unit_ok and notebooks_ok
    result["seconds"] = round(time.perf_counter() - t0)
    parts = [f"torch {result.get('torch_installed', version)}"]
    if "error" in result:
        parts.append(f"error: {result['error'][:200]}")
    parts.append(f"unit tests {'skipped' if args.skip_unit else 'not run'}" if unit is None else
                 f"unit tests {unit['passed']} passed, {unit['failed']} failed, {unit['errors']} errors, "
                 f"{unit['skipped']} skipped")
    parts.append(f"notebooks {'skipped' if args.skip_notebooks else 'not run'}" if nbs is None else
                 f"notebooks {len(nbs['ok'])} ok, {len(nbs['failed'])} failed"
                 + (f" ({', '.join(nbs['failed'])})" if nbs["failed"] else ""))
    parts.append(f"{result['seconds']} s")
    line = f"compat {'passed' if result['passed'] else 'FAILED'}: " + "; ".join(parts)
    result["summary"] = line
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if unit and unit["failures"]:
        print("unit test failures:", *(f"  {f['test']}: {f['message'][:300]}" for f in unit["failures"]),
              sep="\n")
    if nbs and nbs["failed"]:
        print("notebook failures: see above, or", (out / "notebooks.json").relative_to(ROOT))
    print(line, flush=True)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
