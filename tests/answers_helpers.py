"""Helpers shared by the checker catalogues of the notebooks (tests/test_answers_NN.py): what a verdict on a
wrong or a right answer must look like, a notebook's solution cell read as code (what a hint must not hand
over) or as a value (exercises answered with data), and an answer defined from its source. Not a test module:
pytest does not collect it (its name does not start with test_); the catalogues import it as conftest is.
"""

from __future__ import annotations

import ast
import json
import linecache
import re
from typing import Any

import torch
from conftest import ROOT
from torch import nn

from course_utils import exercises
from course_utils.exercises import Verdict

# --- notebooks 00, 01 and 02: hints that hand over no line of the notebook's solution ----------------------

def solution_code(stem: str, name: str) -> list[str]:
    """The code of the solution cell of notebook ``stem`` that mentions ``name``: its lines without comments,
    and the expressions of its assignments and returns (what a hint must not hand over)."""
    nb = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))
    source = next("".join(c["source"]) for c in nb["cells"]
                  if "solution" in c["metadata"].get("tags", []) and name in "".join(c["source"]))
    pieces = []
    for line in source.splitlines():
        code = line.split("  #")[0].strip()
        if not code or code.startswith(("#", "def ", "check_", "'''")):
            continue
        pieces.append(code)
        expression = code.split(" = ", 1)[1] if " = " in code else code.removeprefix("return ")
        if expression != code and re.search(r"\(\s*[^)\s]", expression):  # a call with arguments
            pieces.append(expression)
    return [p for p in pieces if len(p) >= 12]


SOLUTIONS = {
    "00": solution_code("00_setup", "check_tensor_on_device"),
    "01": solution_code("01_cpu_vs_gpu", "def time_per_call"),
    "02-1": solution_code("02_moving_data", "def train_epoch"),
    "02-2": solution_code("02_moving_data", "def train_step"),
    "02-3": solution_code("02_moving_data", "check_quiz"),
}


def rejected_without_solution_lines(verdict: Verdict, mistake: str, concept: str, solution: str) -> None:
    """``verdict`` fails; its message names ``mistake``; its first hint names ``concept`` and hands over no
    line of the solution; its closer hint (when it has one) is held back on a first failure and pastes no
    solution line either."""
    assert isinstance(verdict, Verdict) and not verdict, str(verdict)
    assert mistake in verdict.message, verdict.message
    assert concept in verdict.hint, verdict.hint
    for code in SOLUTIONS[solution]:
        assert code not in verdict.hint, f"the hint hands over {code!r}"
        if "(" in code and " = " in code:  # a whole assignment line of the solution
            assert code not in verdict.closer, f"the closer hint pastes {code!r}"
    if verdict.closer:
        assert verdict.closer not in str(verdict) and "%hint" in str(verdict)
        assert verdict.closer in str(verdict.closer_hint())


def accepted(verdict: Verdict) -> None:
    assert isinstance(verdict, Verdict) and verdict, str(verdict)
    assert str(verdict).startswith("✔ Correct.")


# --- notebooks 03 and 04: first hints without code ---------------------------------------------------------

CODE_IN_HINT = re.compile(r"isinstance\(|hasattr\(|getattr\(|torch\.cat|\.chunk\(|sorted\(|\bint\(|\bdef |return |"
                          r"lambda|>=|\.join|\.split\(|range\(|\[.*for .* in")
"""What a first hint must not contain: a call or a line of the answer."""


def rejected_without_code(verdict: Verdict, mistake: str, concept: str) -> None:
    """``verdict`` fails, its message names ``mistake``, its hint ``concept``; the closer hint waits."""
    assert not verdict, f"a wrong answer was accepted: {verdict}"
    assert mistake in verdict.message, verdict.message
    assert concept in verdict.hint, verdict.hint
    assert not CODE_IN_HINT.search(verdict.hint), f"the first hint gives code: {verdict.hint}"
    assert verdict.closer and verdict.closer != verdict.hint
    shown = str(verdict)
    assert verdict.closer not in shown and exercises.ASK in shown  # asked for with %hint, or a second failure


def solution_value(stem: str, name: str, namespace: dict[str, Any] | None = None) -> Any:
    """The value ``name`` that a notebook's solution cell assigns (for exercises answered with data);
    ``namespace``: what the cell uses from the cells before it (the stub cell's imports)."""
    nb = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if "solution" in cell["metadata"].get("tags", []) and re.search(rf"^{name} = ", source, re.M):
            scope = dict(namespace or {})
            code = "\n".join(line for line in source.splitlines() if not re.match(r"[\w.]*check_\w+\(", line))
            exec(code, scope)
            return scope[name]
    raise LookupError(f"{stem} has no solution cell assigning {name}")


# --- notebooks 05 and 06: a verdict with a closer hint, a cell of a notebook, an answer defined from source ---


def rejected(verdict: Verdict, message: str, hint: str, solution_bits: tuple[str, ...] = (),
             closer: bool = True) -> None:
    """A wrong answer's verdict: it names the mistake (``message``), gives the concept (``hint``), keeps the code
    for the closer hint, and neither the first hint nor the first display hands over the solution's line.
    Several answers checked in one test each count as a first try (the counts start again after each)."""
    assert not verdict, f"accepted a wrong answer: {verdict}"
    assert message in verdict.message, verdict.message
    assert hint in verdict.hint, verdict.hint
    assert verdict.hint not in verdict.message
    if closer:
        assert verdict.closer, "a closer hint, for %hint or a second failure"
        first_try = str(verdict)
        assert "Closer hint" not in first_try and verdict.closer not in first_try
    exercises._failures.clear()
    for bit in solution_bits:
        assert bit not in verdict.hint, f"the first hint gives away {bit!r}: {verdict.hint}"


def cell(stem: str, cell_id: str) -> str:
    """The source of one cell of a notebook, found by its id."""
    nb = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))
    return next("".join(c["source"]) for c in nb["cells"] if c["id"] == cell_id)


def cell_defs(stem: str, cell_id: str, name: str) -> str:
    """The source of the function or class ``name`` as a cell defines it (without the cell's other lines)."""
    source = cell(stem, cell_id)
    node = next(n for n in ast.parse(source).body
                if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == name)
    return ast.get_source_segment(source, node) or ""


def define(source: str, name: str, names: dict[str, Any] | None = None) -> Any:
    """``name`` as defined by ``source``, with its text where `inspect.getsource` finds it (as for a cell)."""
    filename = f"<answer {name} {abs(hash(source))}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"torch": torch, "nn": nn, **(names or {})}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


# --- notebooks 08 and 11: a wrong answer's verdict, with the closer hint held back --------------------------

def solution_lines(stem: str) -> list[str]:
    """The code lines of notebook ``stem``'s solution cells, without comments, imports, the checker's call and
    lines under 12 characters: what no hint may hand over."""
    nb = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))
    lines = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "solution" in cell["metadata"].get("tags", []):
            for line in "".join(cell["source"]).splitlines():
                code = line.split("#")[0].strip()
                if len(code) >= 12 and not code.startswith(("check_", "from ", "import ")):
                    lines.append(code)
    return lines


def rejected_holding_back(verdict: Verdict, message: str, hint: str, closer: bool = True, *,
                          solution_lines: list[str]) -> None:
    """``verdict`` fails, its message names the mistake (``message``), its hint the concept (``hint``); the
    closer hint (if ``closer``) is there but not shown on a first failure; no hint pastes one of the solution's
    ``solution_lines``. The catalogues bind their own lines: ``partial(rejected_holding_back, solution_lines=...)``."""
    assert isinstance(verdict, Verdict) and not verdict, verdict
    assert message in verdict.message, (message, verdict.message)
    assert hint in verdict.hint, (hint, verdict.hint)
    if closer:
        assert verdict.closer and verdict.closer != verdict.hint, verdict
        assert verdict.closer not in str(verdict)  # the second step waits for %hint or a second failure
    for line in solution_lines:
        assert line not in verdict.hint and line not in verdict.closer, (line, verdict)
