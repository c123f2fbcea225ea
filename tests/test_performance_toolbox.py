"""Notebook 07's helpers (models.GPT, traces, memory_accounting, compiling, input_pipeline) and its checkers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import notebook_solution
from torch import nn

from course_utils import compiling, traces
from course_utils.exercises import performance_toolbox as ex
from course_utils.input_pipeline import DecodedImages
from course_utils.memory_accounting import allocation_timeline, plot_memory_timeline, saved_tensor_bytes
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
        _op("aten::mul", 120, 500, tid=2),  # another thread, less op time than... no: more, see below
        _op("gemm", 130, 40, cat="kernel"), _op("elementwise", 300, 10, cat="kernel"),
        _op("train_step", 90, 300, cat="user_annotation"),
        {"ph": "M", "name": "process_name"},
    ])
    spans = traces.read_trace(path)
    cpu = [s.name for s in spans if s.row == traces.CPU_ROW]
    assert cpu == ["aten::mul"]  # the thread with the most op time is the main one
    assert [s.name for s in spans if s.row == traces.GPU_ROW] == ["gemm", "elementwise"]
    assert spans[0].start_us == 0 and spans[0].name == "train_step"


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


def test_real_profiler_trace_and_picture(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("step"):
            model(torch.randn(4, 8)).sum().item()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    spans = traces.read_trace(tmp_path / "t.json")
    assert any(s.row == traces.STEP_ROW and s.name == "step" for s in spans)
    assert any(s.row == traces.CPU_ROW and s.name == "aten::linear" for s in spans)
    assert traces.sync_calls(spans) == 1 and traces.sync_calls(tmp_path / "t.json") >= 1
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


# --- exercise checkers ------------------------------------------------------------------------------------

def test_graph_break_checker() -> None:
    assert ex.check_graph_break_fix(notebook_solution(NB, "normalize_then_tanh_fixed"))
    verdict = ex.check_graph_break_fix(ex.normalize_then_tanh)
    assert not verdict and "breaks the graph" in verdict.message

    def wrong(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * 2  # no normalisation: right for small inputs only

    verdict = ex.check_graph_break_fix(wrong)
    assert not verdict and "entries up to 5" in verdict.message


def _scaled_step(model, opt, scaler, x, y, *, scale=True, update=True, autocast=True, scaler_step=True):
    with torch.autocast(x.device.type, dtype=torch.float16, enabled=autocast):
        loss = F.mse_loss(model(x), y)
    (scaler.scale(loss) if scale else loss).backward()
    scaler.step(opt) if scaler_step else opt.step()
    if update and scaler_step:
        scaler.update()
    opt.zero_grad()


@pytest.mark.parametrize(("options", "expected"), [
    ({"scale": False, "scaler_step": False}, "not scaled"),
    ({"scale": False}, "did not use scaler.scale"),  # PyTorch's own message, passed on
    ({"update": False}, "should have halved"),
    ({"autocast": False}, "float32"),
    ({"scaler_step": False}, "65536 times too large"),
])
def test_grad_scaler_checker_names_each_mistake(options: dict, expected: str) -> None:
    verdict = ex.check_grad_scaler_step(lambda *a: _scaled_step(*a, **options))
    assert not verdict and expected in verdict.message


def test_grad_scaler_checker_accepts_the_solution() -> None:
    assert ex.check_grad_scaler_step(notebook_solution(NB, "fp16_step"))
    assert ex.check_grad_scaler_step(_scaled_step)


def test_no_sync_checker() -> None:
    assert ex.check_no_sync_loop(notebook_solution(NB, "train_epoch"))

    def per_step_reads(model, opt, batches, read):
        losses = []
        for x, y in batches:
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(read(loss))
        return [float(v) for v in losses]

    for read, name in [(lambda t: t.item(), "item"), (lambda t: t.cpu(), "cpu"), (lambda t: t.tolist(), "tolist"),
                       (lambda t: float(t), "__float__")]:
        verdict = ex.check_no_sync_loop(lambda m, o, b, read=read: per_step_reads(m, o, b, read))
        assert not verdict and f"({name})" in verdict.message and "after 1 of 8 steps" in verdict.message
    verdict = ex.check_no_sync_loop(lambda m, o, b: per_step_reads(m, o, b, lambda t: t.detach() * 2))
    assert not verdict and "differ" in verdict.message
