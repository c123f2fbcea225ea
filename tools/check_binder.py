#!/usr/bin/env python3
"""Check that Binder's environment serves the course: build it from binder/ and run every notebook in it.

    python tools/check_binder.py [--venv build/binder-venv] [--keep] [notebooks ...]

As Binder (repo2docker) would: a fresh venv; ``pip install -r binder/requirements.txt``; ``binder/postBuild``
run from the repository root with that venv's python first on PATH. Then every notebook is executed with
nbclient inside that venv by tools/execute_notebooks.py, on copies in a temporary folder (the committed
notebooks are not touched), with no GPU visible. Any error in a cell not tagged ``raises-exception`` fails
the check, and so does a tagged cell that did not raise. The peak memory of the kernels is printed against
Binder's ~2 GB.

The install runs against a copy of the repository (its tracked and untracked, not ignored files), so
postBuild's ``pip install .`` leaves no build/ or egg-info behind here. An index that cannot be reached
(binder/requirements.txt names PyTorch's CPU index) fails fast: pip runs with --retries 0 --timeout 5.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BINDER_RAM_MB = 2048


def repo_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        return [Path(p) for p in out.split("\0") if p and (ROOT / p).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "build", "site", "test-output", "__pycache__"}
        return [p.relative_to(ROOT) for p in ROOT.rglob("*")
                if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


def copy_repo(dest: Path) -> None:
    for rel in repo_files():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)


def clean_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JUPYTER", "CONDA", "COURSE_"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               PIP_RETRIES="0", PIP_TIMEOUT="5", PIP_DISABLE_PIP_VERSION_CHECK="1",
               CUDA_VISIBLE_DEVICES="", PYTHONHASHSEED="0")
    return env


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def build(venv: Path, repo: Path) -> None:
    if venv.exists():
        shutil.rmtree(venv)
    run([sys.executable, "-m", "venv", str(venv)])
    env = clean_env(venv)
    py = str(venv / "bin" / "python")
    run([py, "-m", "pip", "install", "-q", "--retries", "0", "--timeout", "5", "-r",
         str(repo / "binder" / "requirements.txt")], cwd=repo, env=env)
    post = repo / "binder" / "postBuild"
    if post.exists():
        run(["bash", str(post)], cwd=repo, env=env)


def execute_all(paths: list[Path], timeout: int, output_dir: Path | None = None) -> int:
    """Runs inside the Binder venv: execute copies of the notebooks and check them (execute_notebooks.py),
    then report the kernels' peak memory."""
    import resource

    from execute_notebooks import execute_notebooks, summary

    results = execute_notebooks(paths, timeout=timeout, output_dir=output_dir,
                                report=lambda line: print(line, flush=True))
    print(summary(results), flush=True)
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak memory of a kernel (or a process it waited for): {peak_mb:.0f} MB "
          f"(Binder gives about {BINDER_RAM_MB} MB)", flush=True)
    if peak_mb > BINDER_RAM_MB * 0.75:
        print(f"WARNING: over {BINDER_RAM_MB * 0.75:.0f} MB: close to Binder's limit", flush=True)
    return 0 if all(r.ok for r in results) else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=ROOT / "build" / "binder-venv",
                        help="where to build the venv (replaced)")
    parser.add_argument("--keep", action="store_true", help="keep the venv and the executed copies")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    parser.add_argument("--execute", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args(argv)
    if args.execute:  # the inner step, in the Binder venv
        return execute_all(args.notebooks, args.timeout, args.output_dir)

    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="binder-check-"))
    venv = args.venv.resolve()
    try:
        repo = work / "repo"
        copy_repo(repo)
        build(venv, repo)
        t_build = time.perf_counter() - t0
        print(f"Binder environment built in {t_build:.0f} s", flush=True)
        names = [p.name for p in args.notebooks] or sorted(p.name for p in (repo / "notebooks").glob("*.ipynb"))
        paths = [str(repo / "notebooks" / n) for n in names]
        env = clean_env(venv)
        env.pop("PYTHONHASHSEED")
        # Run from outside the repository copy, so `import course_utils` finds the installed package.
        keep = ["--output-dir", str(work / "executed")] if args.keep else []
        rc = subprocess.run([str(venv / "bin" / "python"), str(Path(__file__).resolve()), "--execute",
                             "--timeout", str(args.timeout), *keep, *paths], cwd=work, env=env).returncode
        print(f"binder-check: {'passed' if rc == 0 else 'FAILED'} in {time.perf_counter() - t0:.0f} s "
              f"(environment {t_build:.0f} s)", flush=True)
        return rc
    finally:
        if args.keep:
            print(f"kept: {venv} and {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(venv, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
