"""course_utils.performance.traces: reading Chrome traces of the PyTorch profiler (the outermost CPU ops
of the user's thread, the GPU's kernels and copies, the steps; gzip and older categories), the host's waits,
kernel launches and their short names, idle gaps and the busy fraction, on made-up traces, on a GPU trace
shipped in tests/data and on a real profile of the CPU."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from torch import nn
from trace_events import op as _op
from trace_events import write_trace as _trace

from course_utils.performance import traces


def test_read_trace_keeps_outermost_ops_kernels_and_steps(tmp_path: Path) -> None:
    path = _trace(tmp_path, [
        _op("aten::linear", 100, 50), _op("aten::addmm", 110, 30),  # nested: dropped
        _op("aten::relu", 200, 10),
        _op("aten::mul", 120, 500, tid=2),  # the backward thread: more op time, but not the user's Python
        _op("gemm", 130, 40, cat="kernel"), _op("elementwise", 300, 10, cat="kernel"),
        _op("Memcpy HtoD", 95, 5, cat="gpu_memcpy"),
        _op("train_step", 90, 300, cat="user_annotation"),
        {"ph": "M", "name": "process_name"},
    ])
    spans = traces.read_trace(path)
    cpu = [s.name for s in spans if s.row == traces.CPU_ROW]
    assert cpu == ["aten::linear", "aten::relu"]  # the thread that holds the annotation
    assert "record_function annotations" in spans.cpu_thread and "1 other thread" in spans.cpu_thread
    assert [(s.name, s.kind) for s in spans if s.row == traces.GPU_ROW] == [
        ("Memcpy HtoD", "memcpy"), ("gemm", "kernel"), ("elementwise", "kernel")]
    assert spans[0].start_us == 0 and spans[0].name == "train_step"


def test_read_trace_prefers_profiler_steps_then_python_functions(tmp_path: Path) -> None:
    events = [_op("aten::add", 100, 10, tid=1), _op("aten::mm", 50, 500, tid=2),
              _op("ProfilerStep#1", 40, 600, cat="user_annotation", tid=1),
              _op("other", 45, 10, cat="user_annotation", tid=2), _op("other", 60, 10, cat="user_annotation", tid=2)]
    spans = traces.read_trace(_trace(tmp_path, events))
    assert "ProfilerStep#" in spans.cpu_thread and [s.name for s in spans if s.row == traces.CPU_ROW] == ["aten::add"]
    events = [_op("aten::add", 100, 10, tid=1), _op("aten::mm", 50, 500, tid=2),
              _op("train.py(3): main", 90, 50, cat="python_function", tid=1)]
    assert "python_function" in traces.read_trace(_trace(tmp_path, events)).cpu_thread
    events = [_op("aten::add", 10, 10, tid=1), _op("aten::mm", 50, 500, tid=2)]  # no hint: the first to start
    spans = traces.read_trace(_trace(tmp_path, events))
    assert "started the first operator" in spans.cpu_thread
    assert [s.name for s in spans if s.row == traces.CPU_ROW] == ["aten::add"]


def test_read_trace_reads_gzip_and_older_categories(tmp_path: Path) -> None:
    # PyTorch 1.8-1.9 traces: "Operator" CPU ops (profiler steps among them), "Runtime", "Kernel", "Memcpy",
    # "Memset" (as torch-tb-profiler's own tests write them), thread ids as strings
    events = [
        {"ph": "X", "cat": "Operator", "name": "ProfilerStep#1", "pid": 13721, "tid": "123", "ts": 50, "dur": 400},
        {"ph": "X", "cat": "Operator", "name": "aten::to", "pid": 13721, "tid": "123", "ts": 200, "dur": 60},
        {"ph": "X", "cat": "Operator", "name": "aten::item", "pid": 13721, "tid": "123", "ts": 300, "dur": 60},
        {"ph": "X", "cat": "Runtime", "name": "cudaStreamSynchronize", "pid": 13721, "tid": "123", "ts": 310, "dur": 40},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 13721, "tid": "123", "ts": 210, "dur": 5,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": "stream 7", "ts": 205, "dur": 10},
        {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0, "tid": "stream 7", "ts": 420, "dur": 5},
        {"ph": "X", "cat": "Kernel", "name": "void gemm", "pid": 0, "tid": "stream 7", "ts": 230, "dur": 15,
         "args": {"correlation": 7}},
    ]
    path = tmp_path / "old.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(events).encode()))
    spans = traces.read_trace(path)
    assert sorted(s.kind for s in spans if s.row == traces.GPU_ROW) == ["kernel", "memcpy", "memset"]
    assert [s.name for s in spans if s.row == traces.STEP_ROW] == ["ProfilerStep#1"]
    assert [s.name for s in spans if s.row == traces.CPU_ROW] == ["aten::to", "aten::item"]
    assert traces.host_waits(path) == ["aten::item"]  # aten::item → cudaStreamSynchronize: one wait
    assert traces.kernel_launches(path) == [traces.Launch("cudaLaunchKernel", "void gemm", "aten::to")]


def test_host_waits_count_each_wait_once(tmp_path: Path) -> None:
    rt = "cuda_runtime"
    path = _trace(tmp_path, [
        _op("aten::item", 100, 50), _op("aten::_local_scalar_dense", 105, 40),
        _op("cudaMemcpyAsync", 110, 5, cat=rt), _op("cudaStreamSynchronize", 116, 20, cat=rt),  # one .item()
        _op("cudaDeviceSynchronize", 200, 30, cat=rt),  # torch.cuda.synchronize(): no op around it
        _op("aten::item", 300, 5),  # .item() of a CPU tensor (no runtime call inside): waits for nothing
        _op("ProfilerStep#1", 0, 500, cat="user_annotation"),
        _op("cudaDeviceSynchronize", 600, 30, cat=rt),  # after the last step: the profiler's own
        _op("cudaLaunchKernel", 400, 5, cat=rt),
    ])
    assert traces.host_waits(path) == ["aten::item", "cudaDeviceSynchronize"]
    assert traces.sync_calls(path) == 2


def test_shipped_gpu_trace() -> None:
    """tests/data/gpu_sync_steps.json.gz (tools/make_traces.py, on an H200): two profiled steps of the small
    GPT, each ending with loss.item() and torch.cuda.synchronize(); backward on the autograd thread."""
    path = Path(__file__).parent / "data" / "gpu_sync_steps.json.gz"
    spans = traces.read_trace(path)
    assert "ProfilerStep#" in spans.cpu_thread
    assert traces.host_waits(path) == ["aten::item", "cudaDeviceSynchronize"] * 2  # the profiler's own: left out
    assert sum(s.name.startswith("ProfilerStep#") for s in spans) == 2
    launches = traces.kernel_launches(path)
    assert launches and all(launch.kernel for launch in launches if "Launch" in launch.api)
    assert any(launch.caller.startswith("autograd::engine::evaluate_function") for launch in launches)
    assert 0 < traces.busy_fraction(spans) < 1
    names = {traces.short_kernel_name(launch.kernel) for launch in launches}
    assert all(name and not name.startswith("void") and "<" not in name and "(" not in name for name in names)
    assert any(name.startswith("at::native::") for name in names), names


def test_short_kernel_name() -> None:
    short = traces.short_kernel_name
    assert short("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<TensorListMetadata<4>, "
                 "AdamFunctor<float, 4>>(TensorListMetadata<4>, float)") == "at::native::multi_tensor_apply_kernel"
    assert short("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                 "std::array<char*, 1ul>>(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)") == \
        "at::native::vectorized_elementwise_kernel"
    assert short("triton_per_fused_add_mean_0") == "triton_per_fused_add_mean_0"
    assert short("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_coopB_TNT") == "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_coopB_TNT"
    assert short("") == ""


def test_idle_gaps_and_busy_fraction() -> None:
    row = traces.GPU_ROW
    spans = [traces.Span(row, "a", 0, 10), traces.Span(row, "b", 5, 10), traces.Span(row, "c", 40, 10),
             traces.Span(row, "d", 52, 8)]
    assert traces.idle_gaps(spans, row) == [(15, 25), (50, 2)]
    assert traces.idle_gaps(spans, row, min_gap_us=5) == [(15, 25)]
    assert traces.busy_fraction(spans, row) == pytest.approx(1 - 27 / 60)
    with pytest.raises(ValueError, match="no spans on row"):
        traces.busy_fraction(spans, traces.CPU_ROW)


def test_read_trace_bad_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="export_chrome_trace"):
        traces.read_trace(tmp_path / "missing.json")
    (tmp_path / "junk.json").write_text("not json")
    with pytest.raises(ValueError, match="not a Chrome trace"):
        traces.read_trace(tmp_path / "junk.json")
    with pytest.raises(ValueError, match="no CPU ops"):
        traces.read_trace(_trace(tmp_path, []))
    (tmp_path / "junk.json.gz").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(ValueError, match="not a Chrome trace"):
        traces.read_trace(tmp_path / "junk.json.gz")


def test_real_profiler_trace_and_picture(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("step"):
            model(torch.randn(4, 8)).sum().item()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    spans = traces.read_trace(tmp_path / "t.json")
    assert any(s.row == traces.STEP_ROW and s.name == "step" for s in spans)
    assert any(s.row == traces.CPU_ROW and s.name == "aten::linear" for s in spans)
    assert traces.sync_calls(spans) == 1  # one value read among the outermost ops
    assert traces.host_waits(tmp_path / "t.json") == []  # on the CPU it waits for no GPU
    fig = traces.plot_timeline(spans, "t")
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [traces.CPU_ROW, traces.STEP_ROW]
