"""The plainest way to test the course, `pip install -r requirements.txt` and then `pytest` from the root,
collects every test without an error: the tests that need test-only packages (polib, PyYAML) skip with a
reason instead of failing to import. Slow (a fresh virtual environment): `make test-slow`."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pinned_torch() -> str:
    return next(line.strip() for line in (ROOT / "tests" / "constraints.txt").read_text().splitlines()
                if line.startswith("torch=="))


@pytest.mark.slow
def test_requirements_then_pytest_collects_without_errors(tmp_path: Path) -> None:
    env_dir = tmp_path / "plain"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python"))

    def pip(*args: str) -> None:
        subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args], check=True)

    # As the README says for a machine without an NVIDIA GPU: the CPU build of torch first (PyPI's Linux
    # wheel is a CUDA build of several GB), then the student's requirements and the two test runners.
    pip("--index-url", "https://download.pytorch.org/whl/cpu", "--extra-index-url", "https://pypi.org/simple",
        _pinned_torch())
    pip("-r", str(ROOT / "requirements.txt"), "pytest", "nbval", "-e", str(ROOT))
    missing = subprocess.run([python, "-c", "import polib"], capture_output=True)
    assert missing.returncode != 0, "polib is installed: this environment does not test the plain path"
    result = subprocess.run([python, "-m", "pytest", "--collect-only", "-q", "-rs"], cwd=ROOT,
                            capture_output=True, text=True, env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "error" not in result.stdout.splitlines()[-1], result.stdout[-2000:]
    assert "tests/test_translations.py" in result.stdout and "need polib" in result.stdout
