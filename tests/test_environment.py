"""environment_report: the facts, the table, the Colab hint."""

from __future__ import annotations

import torch

import course_utils.environment as env
from course_utils import environment_report


def test_report_facts(capsys, monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    report = environment_report()
    table = capsys.readouterr().out
    assert report["torch"] == torch.__version__
    assert report["cuda_build"] == torch.version.cuda
    assert report["torch_threads"] == torch.get_num_threads()
    assert report["devices"][-1] == "cpu"
    assert len(report["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    for label in ("Python", "PyTorch", "CUDA build", "cuDNN", "MPS (Apple GPU)", "CPU", "get_device()"):
        assert label in table
    assert report["hint"] is None or report["colab"]


def test_quiet_report_prints_nothing(capsys):
    environment_report(show=False)
    assert capsys.readouterr().out == ""


def test_colab_without_gpu_says_how_to_get_one(capsys, monkeypatch):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab")
    monkeypatch.setattr(env, "_gpus", lambda: [])
    report = environment_report()
    assert report["colab"] and report["hint"] == env.COLAB_GPU_HINT
    assert "Runtime → Change runtime type" in capsys.readouterr().out


def test_bad_course_device_is_reported_not_raised(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "nonsense")
    report = environment_report(show=False)
    assert report["course_device"].startswith("error: COURSE_DEVICE='nonsense'")


def test_gpu_rows_are_formatted():
    report = environment_report(show=False)
    report["gpus"] = [{"index": 0, "name": "NVIDIA H200", "capability": "9.0", "memory_gib": 139.8,
                       "multiprocessors": 132}]
    report["driver"] = "580.159.04"
    text = env.format_report(report)
    assert "GPU 0" in text and "NVIDIA H200, compute capability 9.0, 139.8 GiB, 132 SMs" in text
    assert "NVIDIA driver" in text


def test_cpu_model_is_a_string():
    assert isinstance(env.cpu_model(), str) and env.cpu_model()
