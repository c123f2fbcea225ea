"""CONTRIBUTING.md: its generated blocks (`make sync`), and the files and make targets it names exist."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import sync_notebooks  # noqa: E402  (tools/sync_notebooks.py: what make sync writes)
from project import make_targets  # noqa: E402

TEXT = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")


def test_the_generated_blocks_are_current():
    assert sync_notebooks.sync_contributing(TEXT) == TEXT, "run `make sync`"


def test_a_stale_block_is_rewritten_and_a_missing_one_is_named():
    stale = TEXT.replace("| `notebooks/00_setup.ipynb` | 00 · Setup |", "| `notebooks/00_setup.ipynb` | 00 · Old |")
    assert stale != TEXT
    assert sync_notebooks.sync_contributing(stale) == TEXT
    without = re.sub(r"<!-- commands:.*?<!-- /commands -->", "", TEXT, flags=re.S)
    with pytest.raises(SystemExit, match="CONTRIBUTING.md has no <!-- commands"):
        sync_notebooks.sync_contributing(without)


def test_every_notebook_is_listed():
    listed = set(re.findall(r"`notebooks/(\d\d_\w+\.ipynb)`", TEXT))
    on_disk = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert on_disk <= listed, f"not in CONTRIBUTING.md's list: {sorted(on_disk - listed)}"


def test_every_make_command_it_names_exists():
    targets = {t.name for t in make_targets()} | {"help"}
    named = set(re.findall(r"`make ([a-z][\w-]*)", TEXT))
    assert named and named <= targets, f"no such make target: {sorted(named - targets)}"


def test_every_file_it_names_exists():
    paths = {p for p in re.findall(r"`((?:\.ci|\.github|tools|tests|course_utils|notebooks)/[\w./-]*)", TEXT)
             if not re.search(r"NN|9N|NAME|<|\*", p)}
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert paths and not missing, f"CONTRIBUTING.md names files that do not exist: {missing}"
