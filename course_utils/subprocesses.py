"""Notebooks 02, 03, 07 and 09: Python code run in a fresh process, to show what happens before CUDA
starts, before anything was cached, or after a failed CUDA graph capture, none of which the notebook's own
process can show once it has used CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

__all__ = ["run_python"]


def run_python(code: str, env: Mapping[str, str | None] | None = None, timeout: float = 180.0) -> str:
    """Run ``code`` in a fresh Python process and return what it printed (stdout, then stderr).

    ``env`` changes the child's environment: a value sets a variable, ``None`` unsets it. A fresh
    process is the only way to show what happens *before* CUDA initialises.
    """
    child = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            child.pop(key, None)
        else:
            child[key] = value
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"(the child process did not finish within {timeout:.0f} s)\n"
    text = out.stdout
    if out.stderr.strip():
        text += out.stderr
    if out.returncode != 0:
        text += f"(exit status {out.returncode})\n"
    return text
