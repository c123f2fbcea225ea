"""course_utils.subprocesses: run_python runs code in a fresh Python process, with environment variables
set or removed for it only, and reports a failing run's exit status."""

from __future__ import annotations

import os

from course_utils import subprocesses


def test_run_python_env():
    code = "import os; print(repr(os.environ.get('A_VAR')), repr(os.environ.get('B_VAR')))"
    os.environ["B_VAR"] = "parent"
    try:
        assert subprocesses.run_python(code, env={"A_VAR": "1,0", "B_VAR": None}).strip() == "'1,0' None"
        assert subprocesses.run_python(code).strip() == "None 'parent'"
    finally:
        del os.environ["B_VAR"]
    assert "(exit status 3)" in subprocesses.run_python("import sys; sys.exit(3)")
