"""course_utils.performance.compiling.compile_problem's test compile: a toolchain that fails, a compile that does not finish
in time, a damaged Inductor cache; each reported with its real first line, and the advice, followed, works.

Inductor on Linux compiles CPU kernels with $CXX (else g++), after checking that `$CXX --version` runs
(torch._inductor.cpp_builder.get_cpp_compiler). A fake compiler first on that path really breaks the compile.
Triton builds its CUDA launcher with $CC (else gcc or clang): the CUDA test does the same with $CC.

At the end, the rest of the module (from tests/test_performance_toolbox.py): compile_problem's quick answer
where no compiler is found, recompile_messages, and the report of what max-autotune tuned (parse_autotune_log,
autotune_report, print_autotune_summary).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from course_utils.performance import compiling

# The tests of the test compile run where a shell script can stand in for a compiler (the tests of the rest of
# the module, at the end of the file, run everywhere).
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="the fake compilers are shell scripts")

COMPILE_FAILS = "/tmp/include/cpp_prefix.h:3:10: fatal error: omp.h: No such file or directory"
DOES_NOT_RUN = "g++: fatal error: cannot execute 'cc1plus': execvp: No such file or directory"


@pytest.fixture(autouse=True)
def fresh_probe() -> Iterator[None]:
    """Each test asks anew: compile_problem keeps its answer for the process (a restarted kernel forgets it)."""
    compiling._probe.cache_clear()
    yield
    compiling._probe.cache_clear()


def _fake_compiler(folder: Path, name: str, real: str | None, error: str) -> Path:
    """A compiler that answers --version as ``real`` does (so that Inductor takes it), or not at all, and
    fails every compile with ``error`` on stderr, as a broken toolchain does."""
    path = folder / name
    version = (f'case "$1" in --version|-v|-dumpversion|-dumpfullversion) exec "{real}" "$@";; esac\n'
               if real else "")
    path.write_text(f"#!/bin/sh\n{version}echo \"{error}\" >&2\necho 'compilation terminated.' >&2\nexit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _real(*names: str) -> str:
    found = next((shutil.which(n) for n in names if shutil.which(n)), None)
    if found is None:
        pytest.skip(f"no {' or '.join(names)} here")
    return found


@posix_only
@pytest.mark.slow
@pytest.mark.parametrize(("runs", "error"), [(True, COMPILE_FAILS), (False, DOES_NOT_RUN)],
                         ids=["compile-fails", "compiler-does-not-run"])
def test_a_broken_cpu_toolchain_is_reported_with_its_first_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      runs: bool, error: str) -> None:
    real = _real("g++", "clang++", "c++")
    monkeypatch.setenv("CXX", str(_fake_compiler(tmp_path, "g++", real if runs else None, error)))
    message = compiling.compile_problem("cpu")
    assert message is not None
    assert message.startswith("torch.compile cannot build kernels for cpu here: a test compile for cpu")
    assert f"failed with: {error}. Fix the C++ toolchain that Inductor uses ($CXX if set, else g++" in message
    assert "Traceback" not in message and "\n" not in message
    assert compiling.compile_problem("cpu") is message  # asked once per process
    # the advice, followed: no CXX pointing to the broken compiler (Inductor takes its default, g++ or
    # clang++, as before), and a restarted kernel
    monkeypatch.delenv("CXX")
    compiling._probe.cache_clear()
    assert compiling.compile_problem("cpu") is None


@posix_only
@pytest.mark.slow
def test_a_compile_that_does_not_finish_in_time_and_a_damaged_cache(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "inductor-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    monkeypatch.delenv("CXX", raising=False)
    message = compiling.compile_problem("cpu", timeout=0.5)  # Python does not even import torch that fast
    assert message is not None
    assert "test compile for cpu (torch.compile of lambda x: x.sin() + 1, in a separate Python process) did not " \
           "finish within 0.5 s" in message
    assert "compile_problem(device, timeout=900) waits longer" in message
    assert compiling.compile_problem("cpu", timeout=900) is None  # the advice, followed (an empty cache: slow)

    # a damaged cache: every compiled library in it overwritten, as a faulty disk or copy leaves them
    libraries = list(cache.rglob("*.so"))
    assert libraries, f"the test compile left no compiled library in {cache}"
    for library in libraries:
        library.write_bytes(b"not a shared library")
    compiling._probe.cache_clear()
    message = compiling.compile_problem("cpu")
    assert message is not None
    first = re.search(r"failed with: (.*?)\. Fix the C\+\+ toolchain", message)
    assert first and re.search(r"\berror\b", first.group(1)), message  # the compiler's own line
    assert f"If torch.compile worked here before, delete Inductor's cache folder {cache} (or point " \
           "TORCHINDUCTOR_CACHE_DIR to an empty folder). Then restart the kernel" in message
    shutil.rmtree(cache)  # the advice, followed
    compiling._probe.cache_clear()
    assert compiling.compile_problem("cpu") is None


@posix_only
def test_the_quick_checks_come_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(compiling.shutil, "which", lambda name: None)
    monkeypatch.setattr(compiling, "_probe", lambda device, timeout: pytest.fail("no test compile without a compiler"))
    assert "none was found" in (compiling.compile_problem("cpu") or "")
    assert "compiles for the CPU and CUDA only; mps is left out" in (compiling.compile_problem("mps") or "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "CUDA is not available here" in (compiling.compile_problem("cuda") or "")


@posix_only
def test_the_first_error_line() -> None:
    inductor = ("CppCompileError: C++ compile error\n\nCommand:\ng++ x.cpp -o x.so\n\nOutput:\n"
                "In file included from x.cpp:1:\n\x1b[01mx.h:3:10: fatal error: omp.h: No such file\x1b[m\n"
                "compilation terminated.\n\nSet TORCHDYNAMO_VERBOSE=1 for the internal stack trace")
    assert compiling._first_error(inductor, "") == "x.h:3:10: fatal error: omp.h: No such file"
    msvc = "x.cpp(1): fatal error C1083: Cannot open include file: 'omp.h': No such file or directory"
    assert compiling._first_error("InductorError: CppCompileError: C++ compile error", msvc) == msvc
    assert compiling._first_error("RuntimeError: Found no NVIDIA driver on your system.\nmore", "a warning") == \
        "RuntimeError: Found no NVIDIA driver on your system."


@posix_only
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_compiles_or_names_what_breaks_triton(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert compiling.compile_problem("cuda") is None
    # Triton builds a small C launcher for each new kernel with $CC: a broken one, and empty caches
    real = _real("gcc", "clang", "cc")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("CC", str(_fake_compiler(tmp_path, "gcc", None, "gcc: fatal error: cannot execute 'cc1'")))
    compiling._probe.cache_clear()
    message = compiling.compile_problem("cuda")
    assert message is not None and "failed with: gcc: fatal error: cannot execute 'cc1'." in message, message
    assert "$CC" in message
    monkeypatch.setenv("CC", real)  # the advice, followed
    compiling._probe.cache_clear()
    assert compiling.compile_problem("cuda") is None
    assert os.environ["CC"] == real


# --- the rest of course_utils.performance.compiling (from tests/test_performance_toolbox.py) ------------------

def test_compile_problem_without_a_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(compiling.shutil, "which", lambda name: None)
    message = compiling.compile_problem("cpu")
    assert message and "C++ compiler" in message and "apt-get install g++" in message
    monkeypatch.setattr(compiling.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(compiling, "_probe", lambda device, timeout: None)  # the test compile: the tests above
    assert compiling.compile_problem("cpu") is None
    assert "this notebook compiles for the CPU and CUDA only" in (compiling.compile_problem("meta") or "")


def test_recompile_messages_are_collected_without_log_prefixes() -> None:
    torch._dynamo.reset()

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin().sum()

    compiled = torch.compile(f, backend="eager", dynamic=False)
    with compiling.recompile_messages() as messages:
        for n in (3, 5, 7):
            compiled(torch.randn(n))
    assert len(messages) == 2
    assert messages[0].startswith("Recompiling function f") and "expected 3, actual 5" in messages[0]
    torch._dynamo.reset()


# --- what max-autotune tuned -------------------------------------------------------------------------------

AUTOTUNE_LOG = Path(__file__).parent / "data" / "autotune_log.txt"  # from a recording of notebook 07 on an H200


def test_autotune_log_is_read_into_products(capsys: pytest.CaptureFixture[str]) -> None:
    report = compiling.parse_autotune_log(AUTOTUNE_LOG.read_text())
    assert [(p.op, p.product, p.winner, p.winner_kind) for p in report.products] == [
        ("addmm", "16368×1024 @ 1024×3072", "bias_addmm", "ATen (cuBLAS)"),
        ("addmm", "16368×1024 @ 1024×1024", "bias_addmm", "ATen (cuBLAS)"),
        ("addmm", "16368×1024 @ 1024×1024", "triton_mm_117", "Triton template")]  # the cut-off block is left out
    first = report.products[0]
    assert first.timings[:2] == (("bias_addmm", 0.1444), ("triton_mm_17", 0.1768)) and len(first.timings) == 10
    assert first.best_triton == ("triton_mm_17", 0.1768)
    assert first.seconds == pytest.approx(0.8010 + 3.0297)
    assert report.products[2].timings[4] == ("bias_addmm", 0.08)
    # nothing is lost: the warning and the JSON statistics are kept as they were
    assert report.other_lines[0].startswith("torch/_inductor/select_algorithm.py:3686: UserWarning")
    assert sum(line == "Autotune Choices Stats:" for line in report.other_lines) == 4
    compiling.print_autotune_summary(report)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "3 matrix products tuned (2 distinct), 5 s of benchmarking and precompiling; times in ms"
    assert out[2].split() == ["addmm", "16368×1024", "@", "1024×3072", "bias_addmm", "0.1444", "triton_mm_17", "0.1768"]
    assert out[-1] == "won by: ATen (cuBLAS) 2, Triton template 1"


def test_autotune_report_of_nothing_and_of_other_text(capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    with compiling.autotune_report() as report:
        sys.stderr.write("\x1b[31mnot a tuning block\x1b[0m\nAUTOTUNE mm(2x3, 3x4)\n  mm 0.0100 ms 100.0%\n")
    assert report.other_lines == ["not a tuning block"]
    assert [(p.product, p.winner, p.seconds) for p in report.products] == [("2×3 @ 3×4", "mm", None)]
    compiling.print_autotune_summary(compiling.AutotuneReport())
    assert capsys.readouterr().out == "max-autotune tuned no matrix product (nothing in its report)\n"


def test_compile_problem_checks_the_device_through_course_utils_devices() -> None:
    """A name that is no device is a DeviceError, as everywhere in the course; a device this machine lacks is
    named with what it has, before any probe process starts."""
    from course_utils.devices import DeviceError

    with pytest.raises(DeviceError, match="gpu"):
        compiling.compile_problem("gpu")
    assert "not a device of this machine" in compiling.compile_problem("cpu:1")
    if not torch.cuda.is_available():
        assert "CUDA is not available here" in compiling.compile_problem("cuda")
