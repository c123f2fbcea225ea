"""The test suite's own tools: tools/run_tests.py (make test), tools/soak.py (make soak), and the logs a failing
multi-process job leaves (COURSE_SUBPROCESS_LOGS) so that a failure explains itself."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from course_utils.distributed import launch as L
from course_utils.distributed import torchrun as T

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


run_tests, soak = _tool("run_tests"), _tool("soak")


def test_the_two_passes() -> None:
    """The main pass leaves out what the other pass runs; the other pass runs every notebook on one thread with
    AVX2 kernels; both hide the GPUs and let OpenMP's threads sleep while they wait."""
    main_args, main_env = run_tests.PASSES["main"]
    other_args, other_env = run_tests.PASSES["other-cpu"]
    assert "notebooks" in other_args and other_env["OMP_NUM_THREADS"] == "1"
    assert other_env["ATEN_CPU_CAPABILITY"] in ("avx2", "default")
    for test in run_tests.BALANCED:
        assert (ROOT / test).is_file(), test
        assert f"--ignore={test}" in main_args and test in other_args
    assert run_tests.COMMON["CUDA_VISIBLE_DEVICES"] == "" and run_tests.COMMON["OMP_WAIT_POLICY"] == "PASSIVE"


def test_a_failed_torchrun_job_is_found_in_the_logs(tmp_path: Path) -> None:
    (tmp_path / "torchrun-1-a.log").write_text("$ torchrun a.py\nexit code 0 after 1.0 s\n--- stdout\n")
    (tmp_path / "torchrun-2-b.log").write_text("$ torchrun b.py\nexit code -6 after 2.0 s\n--- stderr\nterminate\n")
    assert [p.name for p in run_tests.failed_jobs(tmp_path)] == ["torchrun-2-b.log"]


def test_soak_names_the_failing_tests() -> None:
    log = "x\nFAILED tests/test_a.py::test_b - AssertionError\nERROR notebooks/x.ipynb::Cell 3\nFAILED (2)\n"
    assert sorted(m.group(2) for m in soak.FAILED.finditer(log)) == ["notebooks/x.ipynb::Cell", "tests/test_a.py::test_b"]
    with pytest.raises(SystemExit):
        soak.main(["--runs", "0"])


CRASHED_LOG = """\
=================================== FAILURES ===================================
__________________ notebooks/11_model_parallel.ipynb::Cell 5 __________________
WorkerError: run_demos: rank 3 died from signal SIGSEGV (exit code -11) without sending back an error
__________________ notebooks/11_model_parallel.ipynb::Cell 7 __________________
NameError: name 'two' is not defined
=========================== short test summary info ============================
FAILED notebooks/11_model_parallel.ipynb::Cell 5 - Notebook cell execution failed
FAILED notebooks/11_model_parallel.ipynb::Cell 7 - Notebook cell execution failed
"""


def test_only_failures_that_all_follow_a_workers_crash_are_run_again() -> None:
    assert run_tests.crashed_files(CRASHED_LOG) == ["notebooks/11_model_parallel.ipynb"]
    other = CRASHED_LOG.replace("=========================== short",
                                "________________________ tests/test_x.py::test_y ________________________\n"
                                "AssertionError\n=========================== short") + "FAILED tests/test_x.py::test_y\n"
    assert run_tests.crashed_files(other) == []  # a real failure beside the crash: nothing is run again
    assert run_tests.crashed_files(CRASHED_LOG.replace("died from signal SIGSEGV", "died with exit code 1")) == []
    unit = ("_____________ TestLaunch.test_demos[2] _____________\nWorkerError: run_demos: rank 1 died from signal "
            "SIGABRT (exit code -6)\n=== short test summary info ===\nFAILED tests/test_m.py::TestLaunch::test_demos[2]\n")
    assert run_tests.crashed_files(unit) == ["tests/test_m.py"]  # a unit test's report is headed by its name
    assert run_tests.crashed_files("") == []


def test_a_rerun_after_a_crash_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "other-cpu.log").write_text(CRASHED_LOG, encoding="utf-8")
    monkeypatch.setattr(run_tests, "OUT", tmp_path)
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append((cmd, kwargs["env"]))
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(run_tests.subprocess, "run", fake_run)
    assert run_tests.rerun_after_crash("other-cpu", 0) == 0 and not calls  # a pass that passed: nothing to do
    (tmp_path / "main.log").write_text("FAILED tests/test_x.py::test_y - AssertionError\n", encoding="utf-8")
    assert run_tests.rerun_after_crash("main", 2) == 2 and not calls  # a real failure stays one
    assert run_tests.rerun_after_crash("other-cpu", 1) == 0
    (cmd, env), = calls
    assert cmd[-1] == "notebooks/11_model_parallel.ipynb" and env["OMP_NUM_THREADS"] == "1"
    out = capsys.readouterr().out
    assert "RERUN notebooks/11_model_parallel.ipynb: passed when run again after rank 3 died from signal SIGSEGV" in out
    assert [m.group(1) for m in run_tests.RERUN.finditer(out)] == ["notebooks/11_model_parallel.ipynb"]


def test_a_torchrun_job_leaves_its_whole_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COURSE_SUBPROCESS_LOGS", str(tmp_path / "logs"))
    (tmp_path / "fail.py").write_text("import sys\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n")
    result = T.torchrun(["--standalone", "--nproc-per-node=1"], [], cwd=tmp_path, script="fail.py", timeout=120)
    assert result.returncode != 0
    (log,) = (tmp_path / "logs").glob("torchrun-*.log")
    text = log.read_text()
    assert text.startswith("$ torchrun --standalone --nproc-per-node=1 fail.py\nexit code ") and "to stderr" in text


def dies_loudly(rank: int, world_size: int) -> None:
    """A worker that writes to standard error and ends its process at once (as an abort would)."""
    if rank == 1:
        print("the last words of rank 1", file=sys.stderr, flush=True)
        os._exit(7)


def test_a_dead_quiet_workers_last_words_are_in_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log folder is the launcher's: workers come from the forkserver, whose environment is from when it
    started (here: before the folder was set)."""
    L.start_worker_pool()
    monkeypatch.setenv("COURSE_SUBPROCESS_LOGS", str(tmp_path))
    with pytest.raises(L.WorkerError, match="(?s)rank 1 died with exit code 7.*the last words of rank 1"):
        L.launch(dies_loudly, 2, quiet=True, timeout=60)
