"""tools/execute_notebooks.py: errors checked both ways (a deliberate error must still raise, no other may)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("execute_notebooks", ROOT / "tools" / "execute_notebooks.py")
en = importlib.util.module_from_spec(_spec)
sys.modules["execute_notebooks"] = en
_spec.loader.exec_module(en)


def error(ename="ValueError", evalue="boom"):
    return new_output("error", ename=ename, evalue=evalue, traceback=[])


def stream(text="fine\n", name="stdout"):
    return new_output("stream", name=name, text=text)


def cell(source, outputs=(), tags=()):
    c = new_code_cell(source, outputs=list(outputs))
    if tags:
        c.metadata["tags"] = list(tags)
    return c


def test_a_deliberate_error_that_raised_is_ok():
    nb = new_notebook(cells=[new_markdown_cell("# t"), cell("x = 1", [stream()]),
                             cell("int('a')\n# more", [error()], ["raises-exception"]),
                             cell("1 / 0", [error("ZeroDivisionError")], ["nbval-raises-exception"])])
    assert en.check_outputs(nb) == ([], [])


def test_a_deliberate_error_that_did_not_raise_names_the_cell():
    nb = new_notebook(cells=[cell("x = 1"), cell("\nint('1')  # fixed\n", [stream("1\n")], ["raises-exception"])])
    problems, _ = en.check_outputs(nb)
    assert [(p.cell, p.kind, p.first_line) for p in problems] == [(1, "did-not-raise", "int('1')  # fixed")]
    assert str(problems[0]) == "cell 1 (\"int('1')  # fixed\"): was meant to raise but did not"


def test_an_untagged_error_fails_with_its_name_and_message():
    nb = new_notebook(cells=[cell("import torch", [stream()]),
                             cell("torch.nope", [error("AttributeError", "module 'torch' has no attribute 'nope'")])])
    problems, _ = en.check_outputs(nb)
    assert len(problems) == 1
    assert str(problems[0]) == ("cell 1 ('torch.nope'): AttributeError: module 'torch' has no attribute 'nope'")


def test_committed_outputs_decide_for_a_gpu_recording_replayed_on_the_cpu():
    """A %%gpu cell raises on a GPU host; on a CPU it replays its recording and must not raise at all."""
    replay = [stream("Recorded output ...\n"), stream("RuntimeError: ...\n", "stderr")]
    committed = new_notebook(cells=[cell("%%gpu 02-x\nbad()", replay, ["raises-exception"]),
                                    cell("int('a')", [error()], ["raises-exception"])])
    same = new_notebook(cells=[cell("%%gpu 02-x\nbad()", replay, ["raises-exception"]),
                               cell("int('a')", [error()], ["raises-exception"])])
    assert en.check_outputs(same, committed) == ([], [])

    now = new_notebook(cells=[cell("%%gpu 02-x\nbad()", [error("KeyError", "'02-x'")], ["raises-exception"]),
                              cell("int('a')", [stream()], ["raises-exception"])])
    problems, _ = en.check_outputs(now, committed)
    assert [(p.cell, p.kind, p.ename) for p in problems] == [(0, "error", "KeyError"), (1, "did-not-raise", "")]


def test_another_exception_than_the_committed_one_is_noted():
    committed = new_notebook(cells=[cell("f()", [error("RuntimeError", "mixed APIs")], ["raises-exception"])])
    now = new_notebook(cells=[cell("f()", [error("AttributeError", "no fp32_precision")], ["raises-exception"])])
    problems, notes = en.check_outputs(now, committed)
    assert problems == []
    assert [(n.cell, n.ename) for n in notes] == [(0, "AttributeError")]
    assert "committed output: RuntimeError" in str(notes[0])


def test_execution_on_a_copy_in_the_notebook_folder_without_a_gpu(tmp_path):
    """One kernel: cwd is a copy of the notebook's folder, the interpreter is this one, no GPU, both checks."""
    folder = tmp_path / "notebooks"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "value.txt").write_text("42\n")
    nb = new_notebook(cells=[
        cell("import os, sys\nprint(open('data/value.txt').read().strip(), sys.executable)\n"
             "print(repr(os.environ['CUDA_VISIBLE_DEVICES']), os.environ['COURSE_DEVICE'])"),
        cell("raise ValueError('on purpose')", tags=["raises-exception"]),
        cell("x = 'no longer raises'", tags=["raises-exception"]),
        cell("open('data/missing.txt')"),
        cell("print('went on after the errors')"),
    ])
    path = folder / "t.ipynb"
    nbformat.write(nb, path)
    committed = path.read_bytes()

    results = en.execute_notebooks([path], timeout=60, output_dir=tmp_path / "out", report=None)

    assert path.read_bytes() == committed, "the notebook itself must not be rewritten"
    (result,) = results
    assert not result.ok and not result.crash
    assert [(p.cell, p.kind, p.ename) for p in result.problems] == [(2, "did-not-raise", ""),
                                                                    (3, "error", "FileNotFoundError")]
    executed = nbformat.read(next((tmp_path / "out").glob("*/t.ipynb")), as_version=4)
    first = "".join(o.get("text", "") for o in executed.cells[0].outputs).split("\n")
    assert first[0] == f"42 {sys.executable}"
    assert first[1] == "'' cpu"
    assert executed.cells[4].outputs[0]["text"] == "went on after the errors\n"
    assert "FAIL t.ipynb" in en.format_result(result)
    assert en.summary(results) == "notebooks: 0 ok, 1 failed (t.ipynb)"


@pytest.mark.parametrize("source, expected", [("", ""), ("\n\n  a = 1\nb = 2", "a = 1"), (["x\n", "y"], "x")])
def test_first_line(source, expected):
    assert en.first_line(source) == expected
