"""Notebook 07: can ``torch.compile`` generate code here, and what did it recompile?

- `compile_problem(device)`: ``None`` when TorchInductor (``torch.compile``'s default backend) can build
  kernels for ``device`` on this machine, else a sentence saying what is missing (a C++ compiler for the
  CPU, Triton for CUDA) or what failed. Where those are present, one tiny function is compiled once per
  process and device, in a separate Python process with a time limit, so that a broken toolchain (macOS
  without its command-line tools, a compiler too old for Inductor's headers, a stale Inductor cache) gets
  its real first error line and what to do, instead of a long traceback in the middle of a notebook.
  Graph capture itself (``torch._dynamo.explain``, ``backend="eager"``) needs neither, so those demos run
  everywhere.
- `compile_log(**artifacts)`: a context manager that collects what ``torch.compile`` logs for the named
  log artifacts while it is open (``perf_hints=True`` is ``TORCH_LOGS=perf_hints``), one message per
  log record, without the prefix of time stamp and process id, so that a notebook can print them.
- `recompile_messages()`: `compile_log` for the "Recompiling function ..." messages
  (``TORCH_LOGS=recompiles``).
"""

from __future__ import annotations

import functools
import getpass
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr

import torch

__all__ = ["PROBE_TIMEOUT_S", "compile_log", "compile_problem", "recompile_messages"]

_PREFIX = re.compile(r"^[A-Z]\d{4} [\d:.]+ \d+ \S+\] (\[[^\]]*\] )*")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

PROBE_TIMEOUT_S = 300.0
"""How long the test compile of `compile_problem` may take. With an empty Inductor cache it took 15-30 s on a
2-core machine and 74 s on a 16-core GPU host in a gVisor sandbox; with a warm cache, a few seconds."""

# The test compile, run as `python -c _PROBE DEVICE`: the cache folder on its first line (printed before
# compiling, so that it is there even when the compile hangs), then the outcome as one line of JSON.
_PROBE = """
import json, sys
import torch
try:
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    print(json.dumps({"cache_dir": cache_dir()}), flush=True)
except Exception:
    pass
try:
    x = torch.ones(4, device=sys.argv[1])
    ok = torch.allclose(torch.compile(lambda x: x.sin() + 1)(x).cpu(), torch.ones(4).sin() + 1)
    print(json.dumps({"ok": bool(ok), "error": "" if ok else "the compiled function computed a wrong result"}))
except Exception as exc:
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
"""


def _cxx_compiler() -> str | None:
    names = [os.environ["CXX"]] if os.environ.get("CXX") else []
    names += ["cl"] if sys.platform == "win32" else ["g++", "clang++", "c++"]
    for name in names:
        if shutil.which(name):
            return name
    return None


def compile_problem(device: str | torch.device, *, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why ``torch.compile``'s default backend cannot build kernels for ``device`` here, or ``None``.

    First the quick checks (a C++ compiler for the CPU, Triton for CUDA), then a test: one tiny function
    compiled and run in a separate Python process (``sys.executable``, this process's environment), which
    may take ``timeout`` seconds. Its outcome is kept for the rest of this process, per device and timeout.
    A failure is reported with its first error line (the compiler's own, when it ran) and what to do.
    """
    dev = torch.device(device)
    kind = dev.type
    if kind == "cpu" and _cxx_compiler() is None:
        return ("torch.compile needs a C++ compiler to build CPU kernels, and none was found (g++, clang++ "
                "or $CXX; on Windows, MSVC's cl). Install one (Debian/Ubuntu: apt-get install g++), or run "
                "this on a GPU runtime, e.g. Colab's. The cells that do not generate code still run.")
    if kind == "cuda" and not torch.cuda.is_available():
        return ("CUDA is not available here (torch.cuda.is_available() is False), so torch.compile cannot build "
                "CUDA kernels; compile for the CPU instead, or run this on a GPU runtime, e.g. Colab's.")
    if kind == "cuda" and importlib.util.find_spec("triton") is None:
        return ("torch.compile builds CUDA kernels with Triton, which is not installed here "
                "(pip install triton; Linux wheels of torch bring it along).")
    if kind not in ("cpu", "cuda"):
        return f"this notebook compiles for the CPU and CUDA only; {kind} is left out"
    return _probe(str(dev), float(timeout))


_COMPILER_ERROR = re.compile(r"\b(fatal )?error( [A-Z]+\d+)?:", re.IGNORECASE)  # gcc, clang; MSVC's "error C1083:"


def _first_error(message: str, stderr: str) -> str:
    """The line of a failure that says what went wrong: the compiler's first error line when its output
    is there (in Inductor's message, after 'Output:', or on the test process's stderr), else the first line
    of the exception's message."""
    message, stderr = _ANSI.sub("", message), _ANSI.sub("", stderr)
    output = message.split("\nOutput:\n", 1)[1] if "\nOutput:\n" in message else ""
    for text in (output, stderr):
        for line in text.splitlines():
            if _COMPILER_ERROR.search(line):
                return _shorten(line.strip())
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return _shorten(lines[0] if lines else "no message")


def _shorten(line: str, limit: int = 300) -> str:
    return line if len(line) <= limit else line[:limit - 3] + "..."


_TOOLCHAIN = ("Fix the C++ toolchain that Inductor uses ($CXX if set, else g++; clang++ on macOS; cl on Windows): "
              "Debian/Ubuntu: apt-get install g++; macOS: xcode-select --install; Windows: the Visual Studio Build "
              "Tools (C++), with Python started from their Developer Command Prompt; in conda, a compiler new "
              "enough for PyTorch's headers, or CXX pointing to one. If torch.compile worked here before, ")
_TRITON = ("Triton, which builds the CUDA kernels, compiles a small C launcher with $CC (else gcc, else clang) "
           "and Python's headers: install them (Debian/Ubuntu: apt-get install gcc python3-dev), or point CC to a "
           "working compiler. If torch.compile worked here before, ")
_CACHE = ("delete Inductor's cache folder {cache} (or point TORCHINDUCTOR_CACHE_DIR to an empty folder). Then "
          "restart the kernel: this answer is kept until then. The cells that do not generate code still run.")


def _cache_dir() -> str:
    """Inductor's cache folder as torch computes it, when the test process could not say."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return os.path.abspath(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        return os.path.join(tempfile.gettempdir(), "torchinductor_<your user name>")
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def _stop(process: subprocess.Popen[str]) -> None:
    """Kill the test process and whatever it started (a compiler): its own process group on POSIX."""
    if os.name == "posix":
        try:
            os.killpg(process.pid, signal.SIGKILL)
            return
        except OSError:  # already gone
            pass
    process.kill()


@functools.cache
def _probe(device: str, timeout: float) -> str | None:
    """Compile and run one tiny function for ``device`` in a separate Python process: None when it works."""
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1")  # no pool of compile workers for one kernel
    with subprocess.Popen([sys.executable, "-c", _PROBE, device], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env, start_new_session=os.name == "posix") as process:
        try:
            out, err = process.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            _stop(process)
            out, err = process.communicate()
            timed_out = True
        except BaseException:  # e.g. the notebook's kernel interrupted: leave no compile running behind
            _stop(process)
            raise
    said: dict[str, object] = {}
    for line in out.splitlines():
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict):
            said.update(found)
    cache = _CACHE.format(cache=said.get("cache_dir") or _cache_dir())
    test = f"a test compile for {device} (torch.compile of lambda x: x.sin() + 1, in a separate Python process)"
    if timed_out:
        return (f"torch.compile may not work here: {test} did not finish within {timeout:g} s. A first compile "
                "with an empty cache can take minutes on a slow machine: compile_problem(device, timeout=900) "
                "waits longer. If even that does not finish, something hangs, e.g. on a lock left behind in "
                "Inductor's cache: " + cache)
    if said.get("ok") is True:
        return None
    if "ok" in said:
        first = _first_error(str(said.get("error", "")), err)
    else:  # the process died before it could report
        ended = (f"was killed by signal {-process.returncode}" if process.returncode < 0
                 else f"ended with exit code {process.returncode}")
        last = [line.strip() for line in _ANSI.sub("", err).splitlines() if line.strip()]
        first = f"the process {ended}" + (f"; its last words: {_shorten(last[-1])}" if last else "")
    stop = "" if first.endswith((".", "!", "?")) else "."
    advice = (_TOOLCHAIN if torch.device(device).type == "cpu" else _TRITON) + cache
    return f"torch.compile cannot build kernels for {device} here: {test} failed with: {first}{stop} {advice}"


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
