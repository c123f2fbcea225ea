"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT.parent / "shared" / "fixtures" / "original_course"


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def original_course() -> Path:
    """The 2019 lecture's GPU checkpoints (../shared/fixtures/original_course); skipped when absent."""
    if not FIXTURES.is_dir():
        pytest.skip("../shared/fixtures/original_course is not present (only in the course's own CI)")
    return FIXTURES
