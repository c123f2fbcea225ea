"""Notebook 07's helpers (models.GPT, traces, memory_accounting, compiling, input_pipeline) and its checkers."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import notebook_functions, notebook_solution
from torch import nn

from course_utils.hardware import peak_flops as peaks
from course_utils.performance import compiling, traces
from course_utils.performance import cuda_graph_standin as graph_standin
from course_utils.exercises import performance_toolbox as ex
from course_utils.performance.cuda_graph_standin import cpu_cuda_graphs
from course_utils.performance.datasets import DecodedImages, SlowReads
from course_utils.memory.accounting import allocation_timeline, plot_memory_timeline, saved_tensor_bytes
from course_utils.models import GPT, GPTConfig, token_batch

NB = "07_performance_toolbox"


# --- the model -------------------------------------------------------------------------------------------

def test_gpt_config_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="multiple of n_heads"):
        GPTConfig(d_model=10, n_heads=4)
    with pytest.raises(ValueError, match="at least 1"):
        GPTConfig(batch=0)


def test_token_batch_is_seeded_and_learnable() -> None:
    cfg = GPTConfig(vocab=50, seq_len=12, batch=5)
    a = token_batch(cfg, torch.Generator().manual_seed(3))
    b = token_batch(cfg, torch.Generator().manual_seed(3))
    assert a.shape == (5, 12) and torch.equal(a, b)
    steps = (a[:, 1:] - a[:, :-1]) % cfg.vocab  # each row counts up with one stride of 1 to 4
    assert all(len(set(row.tolist())) == 1 and 1 <= row[0] <= 4 for row in steps)


def test_gpt_is_causal_and_trains() -> None:
    cfg = GPTConfig()
    torch.manual_seed(0)
    model = GPT(cfg)
    tokens = token_batch(cfg, torch.Generator().manual_seed(0))
    logits = model(tokens)
    assert logits.shape == (cfg.batch, cfg.seq_len, cfg.vocab)
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % cfg.vocab  # the last token must not change earlier predictions
    assert torch.allclose(model(changed)[:, :-1], logits[:, :-1], atol=1e-6)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = model.loss(tokens).item()
    for _ in range(30):
        loss = model.loss(tokens)
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert loss.item() < first - 1


# --- traces ------------------------------------------------------------------------------------------------

def _trace(tmp_path: Path, events: list[dict]) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _op(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


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


# --- memory accounting ---------------------------------------------------------------------------------

def test_saved_tensor_bytes_counts_activations_once_and_not_weights() -> None:
    linear = nn.Linear(100, 100, bias=False)
    x = torch.randn(32, 100, requires_grad=True)
    _, saved = saved_tensor_bytes(lambda: torch.relu(linear(x)), exclude=linear)
    # linear saves its input x (the weight is excluded); relu saves its output
    assert saved == 2 * 32 * 100 * 4
    _, with_weight = saved_tensor_bytes(lambda: linear(x))
    assert with_weight == (32 * 100 + 100 * 100) * 4
    with pytest.raises(TypeError, match="no arguments"):
        saved_tensor_bytes(linear(x))  # type: ignore[arg-type]


def test_activation_bytes_grow_with_the_batch() -> None:
    model = GPT(GPTConfig())
    sizes = [saved_tensor_bytes(lambda b=b: model.loss(token_batch(GPTConfig(batch=b))), exclude=model)[1]
             for b in (2, 4, 6)]
    assert sizes[2] - sizes[1] == sizes[1] - sizes[0] > 0.9 * sizes[0]  # linear; a tiny constant part


def test_allocation_timeline() -> None:
    snapshot = {"device_traces": [[
        {"action": "segment_alloc", "size": 1000}, {"action": "alloc", "size": 100},
        {"action": "alloc", "size": 50}, {"action": "free_requested", "size": 100},
        {"action": "free_completed", "size": 100},
    ]]}
    assert allocation_timeline(snapshot, start_bytes=10) == [10, 110, 160, 160, 60]
    with pytest.raises(ValueError, match="device 1"):
        allocation_timeline(snapshot, device=1)
    with pytest.raises(ValueError, match="not a memory snapshot"):
        allocation_timeline({"segments": []})
    fig = plot_memory_timeline([0, 2**30, 2**29], [("forward", 0, 2)])
    assert fig.axes[0].get_ylabel() == "allocated (GiB)"


# --- compiling --------------------------------------------------------------------------------------------

def test_compile_problem_without_a_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(compiling.shutil, "which", lambda name: None)
    message = compiling.compile_problem("cpu")
    assert message and "C++ compiler" in message and "apt-get install g++" in message
    monkeypatch.setattr(compiling.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(compiling, "_probe", lambda device, timeout: None)  # the test compile: tests/test_compiling.py
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


# --- input pipeline -----------------------------------------------------------------------------------------

def test_decoded_images_are_deterministic_and_checked() -> None:
    data = DecodedImages(n=4, size=16, classes=3, work=1)
    image, label = data[2]
    assert image.shape == (3, 16, 16) and label == 2
    assert torch.equal(image, data[2][0]) and abs(image.mean().item()) < 1e-5
    with pytest.raises(IndexError):
        data[4]
    with pytest.raises(ValueError, match="at least 1"):
        DecodedImages(n=0)


# --- peaks ---------------------------------------------------------------------------------------------------

def test_peak_tflops_reads_device_names() -> None:
    assert peaks.peak_tflops("NVIDIA H200") == 989.4
    assert peaks.peak_tflops("NVIDIA H100 80GB HBM3", "tf32") == 494.7
    assert peaks.peak_tflops("NVIDIA H100 PCIe") == 756.5
    assert peaks.peak_tflops("NVIDIA A100-SXM4-80GB", "fp32") == 19.5
    assert peaks.peak_tflops("NVIDIA L4") == 121.0 and peaks.peak_tflops("NVIDIA L40S") == 362.05
    assert peaks.peak_tflops("Tesla T4", "fp16") == 65.0
    with pytest.raises(peaks.UnknownGpuError, match="no tensor cores for bf16"):
        peaks.peak_tflops("Tesla T4", "bf16")
    with pytest.raises(peaks.UnknownGpuError, match="datasheet"):
        peaks.peak_tflops("NVIDIA B300")
    with pytest.raises(ValueError, match="precision"):
        peaks.peak_tflops("NVIDIA H200", "int8")


# --- the CPU stand-in of CUDA graphs ---------------------------------------------------------------------------

def test_graph_standin_replays_on_the_captured_tensors() -> None:
    with cpu_cuda_graphs():
        x = torch.ones(3)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = x * 2
            x.add_(1)  # an in-place write during capture: undone when the capture ends (nothing ran on a GPU)
        assert torch.equal(x, torch.ones(3))
        graph.replay()
        assert torch.equal(y, torch.full((3,), 2.0)) and torch.equal(x, torch.full((3,), 2.0))
        x.copy_(torch.full((3,), 5.0))
        graph.replay()
        assert torch.equal(y, torch.full((3,), 10.0)) and torch.equal(x, torch.full((3,), 6.0))
        with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                (x * 2).sum().item()
        with pytest.raises(RuntimeError, match="never captured"):
            torch.cuda.CUDAGraph().replay()
    assert torch.cuda.CUDAGraph is not graph_standin.CpuGraph  # restored


# --- recorded cells ---------------------------------------------------------------------------------------------

def test_model_compile_on_nn_sequential_still_captures_nothing() -> None:
    """Notebook 07 (section 3) and notebook 06 say that model.compile() on an nn.Sequential captures no graph
    (pytorch/pytorch#150915). When a PyTorch release fixes it, this fails: update both notebooks' text."""
    from torch._dynamo.utils import counters

    for compile_in_place, expected in [(True, 0), (False, 1)]:
        torch._dynamo.reset()
        counters.clear()
        net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        if compile_in_place:
            net.compile(backend="eager")
        else:
            net = torch.compile(net, backend="eager")  # type: ignore[assignment]
        net(torch.randn(2, 4))
        assert counters["stats"]["unique_graphs"] == expected, "pytorch/pytorch#150915 changed: update notebook 07"
    torch._dynamo.reset()


# --- exercise checkers ------------------------------------------------------------------------------------

def test_profile_reading_checker() -> None:
    spans = traces.read_trace(ex.MYSTERY_TRACE)
    steps = sum(s.name.startswith("ProfilerStep#") for s in spans)
    covered = ex._idle_time_by_span(spans)
    right = {"gpu_busy": traces.busy_fraction(spans),
             "host_waits_per_step": len(traces.host_waits(ex.MYSTERY_TRACE)) / steps,
             "culprit": max(covered, key=covered.__getitem__), "bottleneck": "input pipeline"}
    assert ex.check_profile_reading(right)
    for key, value, expected in [("gpu_busy", right["gpu_busy"] + 0.1, "gpu_busy"),
                                 ("host_waits_per_step", right["host_waits_per_step"] + 1, "host_waits_per_step"),
                                 ("culprit", "aten::item", "another name covers more"), ("bottleneck", "host reads", "does not fit"),
                                 ("bottleneck", "slow", "must be one of"), ("gpu_busy", None, "still None"),
                                 ("gpu_busy", 0.0, "gpu_busy"),  # a GPU that never ran: within 0.02 of ~0.011
                                 ("gpu_busy", right["gpu_busy"] * 1.5, "gpu_busy")]:
        verdict = ex.check_profile_reading({**right, key: value})
        assert not verdict and expected in verdict.message, (key, value, verdict)
    assert right["gpu_busy"] < 0.05, "the mystery trace's GPU is nearly idle: the case the relative tolerance is for"
    assert ex.check_profile_reading({**right, "gpu_busy": round(right["gpu_busy"], 3)})  # rounded, as people write it


def test_profile_reading_checker_on_a_gpu_bound_trace(tmp_path: Path) -> None:
    events = [_op("ProfilerStep#1", 0, 1000, cat="user_annotation"), _op("aten::mm", 10, 20),
              _op("gemm", 20, 970, cat="kernel")]
    path = _trace(tmp_path, events)
    answers = {"gpu_busy": 1.0, "host_waits_per_step": 0, "culprit": "", "bottleneck": "GPU-bound"}
    assert ex.check_profile_reading(answers, path)


def _smoothed_by_hand(logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> torch.Tensor:
    log_probs = F.log_softmax(logits, dim=-1)
    return (1 - smoothing) * F.nll_loss(log_probs, target) + smoothing * (-log_probs.mean(dim=-1)).mean()


def test_recompile_checker() -> None:
    assert ex.check_recompile_fix(notebook_solution(NB, "smoothed_loss_fixed"))
    assert ex.check_recompile_fix(_smoothed_by_hand)
    verdict = ex.check_recompile_fix(ex.smoothed_loss)
    assert not verdict and "recompile limit" in verdict.message
    verdict = ex.check_recompile_fix(lambda logits, target, s: F.cross_entropy(logits, target))
    assert not verdict and "differ" in verdict.message

    def not_compiled(logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> torch.Tensor:
        return torch.compiler.disable(ex.smoothed_loss)(logits, target, smoothing)

    verdict = ex.check_recompile_fix(not_compiled)
    assert not verdict and "captured no graph" in verdict.message

    def tensor_smoothing(logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> torch.Tensor:
        return F.cross_entropy(logits, target, label_smoothing=torch.tensor(smoothing))

    assert ex.check_recompile_fix(tensor_smoothing)


def _capture() -> Any:
    """Notebook 07's capture_step and the step it captures, as the notebook defines them."""
    return notebook_functions(NB, ("step", "capture_step"), {"torch": torch, "F": F})["capture_step"]


def test_scheduled_replays_checker_on_the_cpu_stand_in() -> None:
    capture_step = _capture()
    right = notebook_solution(NB, "make_optimizer")
    verdict = ex.check_scheduled_replays(right, capture_step, device="cpu")
    assert verdict, verdict.message

    # the cell's optimizer: replays run, with the rate of the moment of capture
    verdict = ex.check_scheduled_replays(lambda p: torch.optim.AdamW(p, lr=0.01, capturable=True), capture_step,
                                         device="cpu")
    assert not verdict and "all trained at 0.001, the rate when the step was captured" in verdict.message
    assert "what does a replay read" in verdict.hint
    fused = ex.check_scheduled_replays(lambda p: torch.optim.AdamW(p, lr=0.01, fused=True, capturable=True),
                                       capture_step, device="cpu")
    assert not fused and "the rate when the step was captured" in fused.message
    # without capturable=True PyTorch refuses a step during capture on a GPU (fused or not): the checker says so
    for options in ({}, {"foreach": False}, {"fused": True}):
        verdict = ex.check_scheduled_replays(
            lambda p, o=options: torch.optim.AdamW(p, lr=torch.tensor(0.01, device=p[0].device), **o),
            capture_step, device="cpu")
        assert not verdict and "capturable is False" in verdict.message and "step count" in verdict.hint
    # a tensor rate with the fused or the foreach implementation follows the schedule too
    for options in ({"fused": True, "capturable": True}, {"capturable": True, "foreach": True}):
        assert ex.check_scheduled_replays(
            lambda p, o=options: torch.optim.AdamW(p, lr=torch.tensor(0.01, device=p[0].device), **o),
            capture_step, device="cpu")
    # a rate in CPU memory whatever the parameters' device: right on the CPU only (found with meta parameters)
    verdict = ex.check_scheduled_replays(lambda p: torch.optim.AdamW(p, lr=torch.tensor(0.01), capturable=True),
                                         capture_step, device="cpu")
    assert not verdict and "for parameters on PyTorch's meta device" in verdict.message
    verdict = ex.check_scheduled_replays(lambda p: torch.optim.SGD(p, lr=torch.tensor(0.01)), capture_step,
                                         device="cpu")
    assert not verdict and "AdamW" in verdict.message
    verdict = ex.check_scheduled_replays(lambda p: torch.optim.AdamW(p, lr=torch.tensor(0.1), capturable=True),
                                         capture_step, device="cpu")
    assert not verdict and "0.01" in verdict.message
    verdict = ex.check_scheduled_replays(
        lambda p: torch.optim.AdamW(p, lr=torch.tensor(0.01), capturable=True, weight_decay=0.5), capture_step,
        device="cpu")
    assert not verdict and "weight_decay is 0.5" in verdict.message

    def no_warm_up(model, opt, static_x, static_y):  # AdamW's state made during capture: every replay remakes it
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss = F.mse_loss(model(static_x), static_y)
            loss.backward()
            opt.step()
        return graph, loss

    assert not ex.check_scheduled_replays(right, no_warm_up, device="cpu")
    assert not ex.check_scheduled_replays("not a function", capture_step, device="cpu")  # type: ignore[arg-type]
    assert torch.cuda.CUDAGraph is not graph_standin.CpuGraph  # the stand-in is gone afterwards


def test_the_standin_allows_capturable_optimizers_only_while_active() -> None:
    params = [nn.Parameter(torch.ones(3))]
    params[0].grad = torch.ones(3)
    with cpu_cuda_graphs():
        torch.optim.AdamW(params, lr=0.1, capturable=True).step()
    with pytest.raises(Exception, match="capturable=True"):
        torch.optim.AdamW(params, lr=0.1, capturable=True).step()


def test_loader_checker() -> None:
    verdict = ex.check_loader_options({"num_workers": 0})
    assert not verdict and "reads every batch itself" in verdict.message
    verdict = ex.check_loader_options({"num_workers": 4})  # workers started and storage opened at every epoch
    assert not verdict and "starting the workers again" in verdict.hint
    verdict = ex.check_loader_options({"num_workers": 5})
    assert not verdict and "the budget allows 4" in verdict.message
    verdict = ex.check_loader_options({"num_workers": 4, "prefetch_factor": 8})
    assert not verdict and "32 batches in flight" in verdict.message
    assert not ex.check_loader_options({"batch_size": 4})
    assert ex.check_loader_options({"num_workers": 4, "persistent_workers": True})


def test_slow_reads() -> None:
    data = SlowReads(n=3, read_ms=0, features=2)
    assert len(data) == 3 and torch.equal(data[2][0], torch.full((2,), 2.0)) and data[2][1] == 2
    with pytest.raises(IndexError):
        data[3]
    with pytest.raises(ValueError, match="at least"):
        SlowReads(n=0)
    with pytest.raises(ValueError, match="open_ms"):
        SlowReads(open_ms=-1)


def test_slow_reads_opens_once_per_process() -> None:
    data = SlowReads(n=4, read_ms=0, open_ms=400)
    t0 = time.perf_counter()
    data[0]
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    data[1], data[2]
    assert first >= 0.4 and time.perf_counter() - t0 < 0.4  # opened once: the later reads do not wait for it
    data._opened_in = -1  # as in a worker process, whose copy was made in another one: it opens again
    t0 = time.perf_counter()
    data[3]
    assert time.perf_counter() - t0 >= 0.4


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check)")
def test_scheduled_replays_checker_with_real_cuda_graphs() -> None:
    capture_step = _capture()
    assert ex.check_scheduled_replays(notebook_solution(NB, "make_optimizer"), capture_step, device="cuda")
    verdict = ex.check_scheduled_replays(lambda p: torch.optim.AdamW(p, lr=0.01, capturable=True), capture_step,
                                         device="cuda")
    assert not verdict and "same schedule." in verdict.message
    verdict = ex.check_scheduled_replays(lambda p: torch.optim.AdamW(p, lr=0.01), capture_step, device="cuda")
    assert not verdict and "captur" in verdict.message.lower()  # PyTorch refuses a non-capturable step in capture
    # a rate in CPU memory: a replay cannot read it, so the graph keeps (or refuses) its value at capture
    verdict = ex.check_scheduled_replays(lambda p: torch.optim.AdamW(p, lr=torch.tensor(0.01), capturable=True),
                                         capture_step, device="cuda")
    assert not verdict, "a CPU tensor rate followed the schedule on the GPU"
