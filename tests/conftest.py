"""Shared test fixtures."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

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


def notebook_solution(stem: str, name: str, names: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The function ``name`` as a notebook's hidden solution cell defines it (the course's right answer).
    ``names``: what the cell uses besides torch, F and nn (names the notebook imported earlier).

    Tests of a checker take their right answer from here rather than from a copy, so that the notebook, the
    checker and the tests cannot drift apart. The cell runs without its last line (the checker call).
    """
    nb = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if "solution" in cell["metadata"].get("tags", []) and f"def {name}(" in source:
            code = "\n".join(line for line in source.splitlines() if not line.startswith("check_"))
            namespace: dict[str, Any] = {"torch": torch, "F": F, "nn": nn, **(names or {})}
            exec(compile(code, f"<{stem} solution>", "exec"), namespace)
            return namespace[name]
    raise LookupError(f"notebooks/{stem}.ipynb has no solution cell defining {name}()")


def notebook_functions(stem: str, names: tuple[str, ...], namespace: dict[str, Any] | None = None, *,
                       tag: str | None = None) -> dict[str, Any]:
    """The functions ``names`` as a notebook's code cells define them, without the cells' other statements
    (demos that need the results of earlier cells). ``namespace``: what the functions use from elsewhere;
    ``tag``: look only in cells with that tag (``"solution"``: the right answer, not the exercise's stub).
    Each name must be defined exactly once in the cells looked at."""
    path = ROOT / "notebooks" / f"{stem}.ipynb"
    found: dict[str, ast.FunctionDef] = {}
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code" or (tag and tag not in cell["metadata"].get("tags", [])):
            continue
        try:
            body = ast.parse("".join(cell["source"])).body
        except SyntaxError:  # a cell with IPython magics (%%gpu, %pip) defines none of them
            continue
        for node in body:
            if isinstance(node, ast.FunctionDef) and node.name in names:
                assert node.name not in found, f"{path.name} defines {node.name}() twice"
                found[node.name] = node
    missing = [n for n in names if n not in found]
    assert not missing, f"{path.name} has no code cell{f' tagged {tag}' if tag else ''} defining {', '.join(missing)}"
    scope = dict(namespace or {})
    exec(compile(ast.Module(body=[found[n] for n in names], type_ignores=[]), f"<{stem} cells>", "exec"), scope)
    return {n: scope[n] for n in names}


@pytest.fixture(autouse=True)
def _fresh_exercise_counts() -> None:
    """Every test starts with no failed check counted (course_utils.exercises counts failures per checker in a
    process): each answer a test gives is a student's first try, whose verdict only offers the closer hint.
    (Cleared in place, not monkeypatched: a monkeypatch made here would outlive other fixtures' teardowns.)"""
    from course_utils import exercises

    exercises._failures.clear()
    exercises._last.clear()


@pytest.fixture
def global_settings_kept() -> Iterator[None]:
    """The checkers set back the global settings an answer changes: after each test they are the defaults (and
    are set back here only when a test failed before a checker could). The catalogues of notebooks 00, 01 and 02
    use it for every test (``pytestmark = pytest.mark.usefixtures("global_settings_kept")``)."""
    yield
    changed = (torch.get_default_device(), torch.get_default_dtype(), torch.is_grad_enabled())
    torch.set_default_device(None)
    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    assert changed == (torch.device("cpu"), torch.float32, True), f"left changed: {changed}"


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A file holding the state_dict of notebook 06's FooNet (seed 0): the checkpoint tests load it."""
    from course_utils.models import FooNet

    torch.manual_seed(0)
    path = tmp_path / "foonet.pt"
    torch.save(FooNet().state_dict(), path)
    return path


def message(exc_info: pytest.ExceptionInfo) -> str:
    """The text of the exception that `pytest.raises` caught."""
    return str(exc_info.value)
