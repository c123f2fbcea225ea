"""Binder's environment (binder/requirements.txt) serves the Chinese edition too: README.zh-CN.md tells a reader
on Binder to switch JupyterLab to Chinese (Settings → Language), which needs the language pack in the image.
The image itself is built and every notebook run in it by `make binder-check` (tools/check_binder.py)."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    """A requirement's project name, normalised as PEP 503 does (case, and runs of -_. alike)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    assert match, f"not a requirement: {requirement!r}"
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def binder_requirements() -> set[str]:
    """The project names binder/requirements.txt installs (comments and pip options such as
    --extra-index-url left out)."""
    lines = (ROOT / "binder" / "requirements.txt").read_text(encoding="utf-8").splitlines()
    return {_name(line) for line in lines if line.strip() and not line.lstrip().startswith(("#", "-"))}


def test_binder_installs_the_chinese_extra() -> None:
    zh = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]["zh"]
    missing = {_name(r) for r in zh} - binder_requirements()
    assert not missing, f"binder/requirements.txt lacks {sorted(missing)} of pyproject's zh extra"


def test_the_chinese_readme_tells_how_to_switch_the_language_on_binder() -> None:
    readme = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    binder = [line for line in readme.splitlines() if "Binder" in line and "Settings → Language" in line]
    assert binder, "README.zh-CN.md does not say how to switch JupyterLab to Chinese on Binder"


def test_requirement_names_are_normalised() -> None:
    assert _name("jupyterlab-language-pack-zh-CN") == _name("JupyterLab_Language.Pack-zh-cn>=4")
    assert _name("torch==2.13.0+cpu") == "torch"
