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
- `autotune_report()`: a context manager that takes what ``mode="max-autotune"`` writes to stderr while it
  tunes (hundreds of lines for a model: one block per matrix product, every candidate kernel with its time)
  and gives it back as `TunedProduct`s (the product, the winner, the best Triton template and the others'
  times); `print_autotune_summary` prints one line per product and who won how often. `parse_autotune_log`
  reads such a log from a file or another run; lines it does not know are kept, not lost.
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
from dataclasses import dataclass, field

import torch

from ..devices import available_devices, find_device
from ..formatting import LOG_PREFIX, strip_ansi

__all__ = ["PROBE_TIMEOUT_S", "AutotuneReport", "TunedProduct", "autotune_report", "compile_log", "compile_problem",
           "parse_autotune_log", "print_autotune_summary", "recompile_messages"]

_FRAME_IDS = re.compile(r"^(\[[^\]]*\] )*")
"""After the glog prefix, torch.compile's log lines may carry frame ids such as ``[0/0] ``."""

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
    present = find_device(device)  # a name that is no device: DeviceError, as everywhere in the course
    kind = torch.device(device).type
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
    if present is None:
        return f"{str(device)!r} is not a device of this machine, which has {', '.join(available_devices())}"
    return _probe(str(present), float(timeout))


_COMPILER_ERROR = re.compile(r"\b(fatal )?error( [A-Z]+\d+)?:", re.IGNORECASE)  # gcc, clang; MSVC's "error C1083:"


def _first_error(message: str, stderr: str) -> str:
    """The line of a failure that says what went wrong: the compiler's first error line when its output
    is there (in Inductor's message, after 'Output:', or on the test process's stderr), else the first line
    of the exception's message."""
    message, stderr = strip_ansi(message), strip_ansi(stderr)
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
        last = [line.strip() for line in strip_ansi(err).splitlines() if line.strip()]
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
            text = _FRAME_IDS.sub("", LOG_PREFIX.sub("", line))
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


# --- what max-autotune tuned ---------------------------------------------------------------------------------
# Inductor's select_algorithm writes one block to stderr per tuned product:
#   AUTOTUNE addmm(16368x3072, 16368x1024, 1024x3072)
#   strides: ...            dtypes: ...
#     bias_addmm 0.1444 ms 100.0%
#     triton_mm_17 0.1768 ms 81.7% BLOCK_K=64, ...
#   SingleProcess AUTOTUNE benchmarking takes 0.80 seconds and 3.03 seconds precompiling for 21 choices

_AUTOTUNE = re.compile(r"^AUTOTUNE (?P<op>\w+)\((?P<sizes>[^)]*)\)\s*$")
_CHOICE = re.compile(r"^\s+(?P<name>\S+) (?P<ms>[\d.]+|inf|nan) ms\b")
_TOOK = re.compile(r"AUTOTUNE benchmarking takes (?P<bench>[\d.]+) seconds and (?P<pre>[\d.]+) seconds precompiling")
_STATS = "Autotune Choices Stats:"


def _kind(choice: str) -> str:
    """Who made a candidate kernel, from the name Inductor gives it."""
    if choice.startswith("triton_"):
        return "Triton template"
    if choice.startswith(("cutlass", "cuda_")):
        return "CUTLASS"
    if choice.startswith("decompose_k"):
        return "decompose-k"
    return "ATen (cuBLAS)"


@dataclass(frozen=True)
class TunedProduct:
    """One matrix product that max-autotune tuned: its operator, input sizes, and each candidate's time in ms,
    fastest first (as the log lists them)."""

    op: str
    sizes: tuple[str, ...]
    timings: tuple[tuple[str, float], ...]
    seconds: float | None = None  # benchmarking + precompiling, when the log says

    @property
    def winner(self) -> str:
        return self.timings[0][0]

    @property
    def winner_kind(self) -> str:
        return _kind(self.winner)

    @property
    def best_triton(self) -> tuple[str, float] | None:
        return next(((n, t) for n, t in self.timings if n.startswith("triton_")), None)

    @property
    def product(self) -> str:
        """The product as M×K @ K×N (an ``addmm``'s bias left out), or the sizes as logged."""
        sizes = self.sizes[1:] if self.op in ("addmm", "baddbmm") and len(self.sizes) == 3 else self.sizes
        return " @ ".join(s.replace("x", "×") for s in sizes)


@dataclass
class AutotuneReport:
    """What `autotune_report` or `parse_autotune_log` found: the tuned products in order, and the other lines
    (warnings, the JSON statistics) unchanged."""

    products: list[TunedProduct] = field(default_factory=list)
    other_lines: list[str] = field(default_factory=list)


def parse_autotune_log(text: str) -> AutotuneReport:
    """Read Inductor's max-autotune report (what it writes to stderr) into `TunedProduct`s. A block cut short
    (no candidate times) is skipped; lines outside the blocks are kept in ``other_lines``."""
    report = AutotuneReport()
    block: dict | None = None

    def close() -> None:
        nonlocal block
        if block is not None and block["timings"]:
            report.products.append(TunedProduct(block["op"], block["sizes"], tuple(block["timings"]),
                                                block["seconds"]))
        block = None

    lines = strip_ansi(text).splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        start = _AUTOTUNE.match(line)
        choice = _CHOICE.match(line) if block is not None else None
        took = _TOOK.search(line)
        if start:
            close()
            sizes = tuple(s.strip() for s in start["sizes"].split(",") if s.strip())
            block = {"op": start["op"], "sizes": sizes, "timings": [], "seconds": None}
        elif choice:
            block["timings"].append((choice["name"], float(choice["ms"])))  # type: ignore[index]
        elif block is not None and line.startswith(("strides:", "dtypes:")):
            pass
        elif took and block is not None:
            block["seconds"] = float(took["bench"]) + float(took["pre"])
            close()
        elif line.strip() == _STATS:  # the JSON line after it belongs to the statistics
            close()
            report.other_lines += lines[i:i + 2]
            i += 1
        else:
            close()
            if line.strip():
                report.other_lines.append(line)
        i += 1
    close()
    return report


@contextmanager
def autotune_report() -> Iterator[AutotuneReport]:
    """Collect what max-autotune writes to stderr while the block runs, as an `AutotuneReport`."""
    report = AutotuneReport()
    buffer = io.StringIO()
    try:
        with redirect_stderr(buffer):
            yield report
    finally:
        parsed = parse_autotune_log(buffer.getvalue())
        report.products[:], report.other_lines[:] = parsed.products, parsed.other_lines


def print_autotune_summary(report: AutotuneReport) -> None:
    """One line per tuned product (the winner and the runner-up, with their times), then the winners by kind."""
    products = report.products
    if not products:
        print("max-autotune tuned no matrix product (nothing in its report)")
        return
    shapes = {(p.op, p.sizes) for p in products}
    seconds = sum(p.seconds or 0.0 for p in products)
    print(f"{len(products)} matrix products tuned ({len(shapes)} distinct), {seconds:.0f} s of benchmarking "
          "and precompiling; times in ms")
    labels = [f"{p.op} {p.product}" for p in products]
    width = max(len(label) for label in labels)
    print(f"  {'product':{width}} {'winner':>14} {'ms':>7}  {'runner-up':>14} {'ms':>7}")
    for label, p in zip(labels, products, strict=True):
        second = f"{p.timings[1][0]:>14} {p.timings[1][1]:7.4f}" if len(p.timings) > 1 else ""
        print(f"  {label:{width}} {p.winner:>14} {p.timings[0][1]:7.4f}  {second}".rstrip())
    kinds: dict[str, int] = {}
    for p in products:
        kinds[p.winner_kind] = kinds.get(p.winner_kind, 0) + 1
    print("won by: " + ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1])))
