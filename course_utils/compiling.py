"""Notebook 07: can ``torch.compile`` generate code here, and what did it recompile?

- `compile_problem(device)`: ``None`` when TorchInductor (``torch.compile``'s default backend) can build
  kernels for ``device`` on this machine, else a sentence saying what is missing: a C++ compiler for
  the CPU, Triton for CUDA. Graph capture itself (``torch._dynamo.explain``, ``backend="eager"``) needs
  neither, so those demos run everywhere.
- `compile_log(**artifacts)`: a context manager that collects what ``torch.compile`` logs for the named
  log artifacts while it is open (``perf_hints=True`` is ``TORCH_LOGS=perf_hints``), one message per
  log record, without the prefix of time stamp and process id, so that a notebook can print them.
- `recompile_messages()`: `compile_log` for the "Recompiling function ..." messages
  (``TORCH_LOGS=recompiles``).
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr

import torch

__all__ = ["compile_log", "compile_problem", "recompile_messages"]

_PREFIX = re.compile(r"^[A-Z]\d{4} [\d:.]+ \d+ \S+\] (\[[^\]]*\] )*")


def _cxx_compiler() -> str | None:
    names = [os.environ["CXX"]] if os.environ.get("CXX") else []
    names += ["cl"] if sys.platform == "win32" else ["g++", "clang++", "c++"]
    for name in names:
        if shutil.which(name):
            return name
    return None


def compile_problem(device: str | torch.device) -> str | None:
    """Why ``torch.compile``'s default backend cannot build kernels for ``device`` here, or ``None``."""
    kind = torch.device(device).type
    if kind == "cpu" and _cxx_compiler() is None:
        return ("torch.compile needs a C++ compiler to build CPU kernels, and none was found (g++, clang++ "
                "or $CXX; on Windows, MSVC's cl). Install one (Debian/Ubuntu: apt-get install g++), or run "
                "this on a GPU runtime, e.g. Colab's. The cells that do not generate code still run.")
    if kind == "cuda" and importlib.util.find_spec("triton") is None:
        return ("torch.compile builds CUDA kernels with Triton, which is not installed here "
                "(pip install triton; Linux wheels of torch bring it along).")
    if kind not in ("cpu", "cuda"):
        return f"this notebook compiles for the CPU and CUDA only; {kind} is left out"
    return None


@contextmanager
def compile_log(**artifacts: bool) -> Iterator[list[str]]:
    """Collect ``torch.compile``'s log messages of ``artifacts`` (e.g. ``recompiles=True``,
    ``perf_hints=True``) while the block runs; one string per message, its continuation lines included."""
    messages: list[str] = []
    buffer = io.StringIO()
    with redirect_stderr(buffer):
        torch._logging.set_logs(**artifacts)  # type: ignore[arg-type]  # its handler writes to this stderr
    try:
        yield messages
    finally:
        torch._logging.set_logs()
        for line in buffer.getvalue().splitlines():
            text = _PREFIX.sub("", line)
            if text[:1].isspace() and messages:  # an indented line continues the message before it
                messages[-1] += "\n" + text
            else:
                messages.append(text)
        messages[:] = [m for m in messages if m.strip()]


@contextmanager
def recompile_messages() -> Iterator[list[str]]:
    """Collect ``torch.compile``'s recompilation messages while the block runs (one string each)."""
    with compile_log(recompiles=True) as messages:
        yield messages
