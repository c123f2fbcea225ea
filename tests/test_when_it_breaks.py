"""Tests of notebook 09's helpers (course_utils.memory.leaks, hangs, worker_start) and its checkers (CPU only)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from conftest import notebook_solution
from torch import nn
from torch.utils.data import DataLoader

from course_utils.performance import dataloader_workers as worker_start
from course_utils.exercises import when_it_breaks as ex
from course_utils.distributed.hangs import BATCHES, log_on_one_rank, uneven_epoch, where_it_waits
from course_utils.distributed.launch import launch
from course_utils.memory.leaks import graph_memory, graph_nodes

STEM = "09_when_it_breaks"


# --- leaks ------------------------------------------------------------------------------------------------

def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def test_graph_memory_sees_graphs_kept_and_freed():
    net = _net()
    x = torch.randn(4, 8)
    with graph_memory(exclude=net) as meter:
        kept = [net(x).sum() for _ in range(3)]  # three graphs, never backwarded
        held = meter.alive_bytes()
        kept[0].backward()  # frees the first graph's saved tensors
        after_backward = meter.alive_bytes()
        del kept
        after_del = meter.alive_bytes()
    # each graph saves the ReLU's output (4 × 16 floats) and the input of the second linear (the same
    # storage) plus the input x, counted once overall since all three graphs share it
    assert held == 3 * 4 * 16 * 4 + 4 * 8 * 4
    assert after_backward == 2 * 4 * 16 * 4 + 4 * 8 * 4
    assert after_del == 0
    assert meter.packed > 0


def test_graph_memory_leaves_parameters_out_and_no_grad_saves_nothing():
    net = _net()
    with graph_memory(exclude=net) as meter, torch.no_grad():
        net(torch.randn(4, 8))
    assert meter.packed == 0 and meter.alive_bytes() == 0


def test_graph_nodes_counts_a_growing_chain():
    net = _net()
    total: torch.Tensor | float = 0.0
    counts = []
    for _ in range(3):
        loss = F.cross_entropy(net(torch.randn(3, 8)), torch.tensor([0, 1, 1]))
        loss.backward()
        total = total + loss
        assert isinstance(total, torch.Tensor)
        counts.append(graph_nodes(total))
    assert counts[1] - counts[0] == counts[2] - counts[1] > 0
    assert graph_nodes(torch.ones(2)) == 0


# --- worker_start -------------------------------------------------------------------------------------------

def test_forked_workers_inherit_and_spawned_ones_do_not(monkeypatch):
    monkeypatch.setitem(worker_start.PARENT_STATE, "set_by", "the test")
    seen = {}
    for method in ("fork", "spawn"):
        loader = DataLoader(worker_start.WhatWorkersSee(), batch_size=None, num_workers=1,
                            multiprocessing_context=method)
        seen[method] = next(iter(loader))
    assert seen["fork"] == {"in_a_worker": True, "PARENT_STATE set by": "the test"}
    assert seen["spawn"] == {"in_a_worker": True, "PARENT_STATE set by": "the module's import"}


# --- hangs: every run ends, in bounded time ------------------------------------------------------------

def test_where_it_waits_keeps_only_the_module_frames():
    import course_utils.distributed.hangs as hangs

    dump = (f'Thread 0x1 (most recent call first):\n  File "/x/torch/distributed/c10d.py", line 3 in barrier\n'
            f'  File "{hangs.__file__}", line 1 in uneven_epoch\n')
    (frame,) = where_it_waits(dump)
    assert frame.startswith("uneven_epoch(): ")
    assert where_it_waits("no frames") == []


@pytest.mark.slow  # notebook 09 runs the same job under strict nbval in make test
def test_uneven_batches_hang_until_the_timeout_and_say_where():
    """Rank 1 reaches its wait 2 s before rank 0 (whose extra batch is slow): its 4-second timeout fires first,
    and gloo closes its connections, which ends rank 0's wait with "Connection closed by peer" 1 s before
    rank 0's own timeout would. Each margin is a second or more, so the outcome does not depend on which
    process the machine runs first (two timeouts due at the same moment used to race)."""
    start = time.monotonic()
    reports = launch(uneven_epoch, 2, False, 3.0, 2.0, group_timeout=4, quiet=True, timeout=60)
    assert time.monotonic() - start < 30, "the hang demo must end within seconds"
    assert [r["batches"] for r in reports] == [BATCHES[0], BATCHES[1]], reports
    assert "Connection closed by peer" in (reports[0]["error"] or ""), reports
    assert "Timed out waiting 4000ms" in (reports[1]["error"] or ""), reports
    assert "loss.backward()" in reports[0]["waits_in"][0], reports
    assert "dist.barrier()" in reports[1]["waits_in"][0], reports


@pytest.mark.slow  # notebook 09 runs the same job under strict nbval in make test
def test_join_lets_uneven_ranks_finish():
    reports = launch(uneven_epoch, 2, True, None, group_timeout=2, quiet=True, timeout=60)
    assert [(r["steps"], r["error"]) for r in reports] == [(BATCHES[0], None), (BATCHES[1], None)]


@pytest.mark.slow  # notebook 09 runs the same job under strict nbval in make test
def test_detail_reports_a_collective_on_one_rank_at_once():
    start = time.monotonic()
    reports = launch(log_on_one_rank, 2, group_timeout=2, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
                     quiet=True, timeout=60)
    assert time.monotonic() - start < 30
    assert "OpType=ALLREDUCE" in reports[0]["error"] and "Detected mismatch" in reports[0]["error"], reports
    assert "OpType=BARRIER" in reports[1]["error"], reports


# --- checkers -------------------------------------------------------------------------------------------------

def test_predict_checker():
    assert ex.check_predict(notebook_solution(STEM, "predict"))
    broken = ex.check_predict(ex.broken_predict)
    assert not broken and "something random" in broken.message

    def eval_only(model, batches):  # dropout off, but graphs still built and kept
        model.eval()
        return torch.cat([torch.softmax(model(x), dim=1) for x in batches])

    verdict = ex.check_predict(eval_only)
    assert not verdict and "still hold" in verdict.message and "graph_memory" in verdict.hint

    def detach_each(model, batches):  # nothing kept at the end, but a graph per batch
        model.eval()
        return torch.cat([torch.softmax(model(x), dim=1).detach() for x in batches])

    verdict = ex.check_predict(detach_each)
    assert not verdict and "still builds a graph" in verdict.message

    def one_row(model, batches):
        return torch.zeros(3)

    assert "expected a tensor of shape" in ex.check_predict(one_row).message
    assert not ex.check_predict(42)

    def grad_never_restored(model, batches):  # right values, but autograd stays off for the caller
        model.eval()
        torch.set_grad_enabled(False)
        out = torch.cat([torch.softmax(model(x), dim=1) for x in batches])
        model.train()
        return out

    verdict = ex.check_predict(grad_never_restored)
    assert not verdict and "still switched off" in verdict.message
    assert torch.is_grad_enabled(), "the checker gives the caller its grad mode back"

    def left_in_eval(model, batches):
        model.eval()
        with torch.no_grad():
            return torch.cat([torch.softmax(model(x), dim=1) for x in batches])

    verdict = ex.check_predict(left_in_eval)
    assert not verdict and "evaluation mode" in verdict.message

    def inference_mode(model, batches):
        was = model.training
        model.eval()
        try:
            with torch.inference_mode():
                return torch.cat([torch.softmax(model(x), dim=1) for x in batches])
        finally:
            model.train(was)

    assert ex.check_predict(inference_mode)


def test_label_loss_checker():
    assert ex.check_label_loss(notebook_solution(STEM, "label_loss", {"UNLABELLED": ex.UNLABELLED}))
    assert ex.check_label_loss(lambda logits, labels: F.cross_entropy(logits[labels >= 0], labels[labels >= 0]))
    verdict = ex.check_label_loss(ex.broken_label_loss)
    assert not verdict and "IndexError: Target -1 is out of bounds." in verdict.message
    assert "what does that value mean" in verdict.hint
    default_ignore = ex.check_label_loss(lambda logits, labels: F.cross_entropy(logits, labels, ignore_index=-100))
    assert not default_ignore and "Target -1" in default_ignore.message
    clamp = ex.check_label_loss(lambda logits, labels: F.cross_entropy(logits, labels.clamp(min=0)))
    assert not clamp and "train as class 0" in clamp.message
    wrap = ex.check_label_loss(lambda logits, labels: F.cross_entropy(logits, labels % ex.CLASSES))
    assert not wrap and "wraps around" in wrap.message

    def over_every_row(logits, labels):  # the unlabelled rows' losses zeroed, but still counted in the mean
        losses = F.cross_entropy(logits, labels.clamp(min=0), reduction="none")
        return (losses * (labels >= 0)).mean()

    verdict = ex.check_label_loss(over_every_row)
    assert not verdict and "divided by every row" in verdict.message

    def only_when_present(logits, labels):  # a fix applied only to batches that hold -1: right, by design
        if (labels == -1).any():
            return F.cross_entropy(logits, labels, ignore_index=-1)
        return F.cross_entropy(logits, labels)

    assert ex.check_label_loss(only_when_present)
    shifted = ex.check_label_loss(lambda logits, labels: F.cross_entropy(F.pad(logits, (1, 0)), labels + 1))
    assert not shifted and "expected" in shifted.message


def test_stable_loss_checker():
    assert ex.check_stable_loss(notebook_solution(STEM, "stable_loss"))
    assert ex.check_stable_loss(lambda logits, target: F.cross_entropy(logits, target))
    verdict = ex.check_stable_loss(ex.broken_stable_loss)
    assert not verdict and "logits up to 200" in verdict.message and "set_detect_anomaly" in verdict.hint

    def clamped(logits, target):  # no NaN, but other values
        return ex.broken_stable_loss(logits.clamp(max=30), target)

    verdict = ex.check_stable_loss(clamped)
    assert not verdict and "the cross-entropy is" in verdict.message

    def nan_to_num(logits, target):  # a finite loss hiding a NaN gradient
        return torch.nan_to_num(ex.broken_stable_loss(logits, target), nan=0.0)

    verdict = ex.check_stable_loss(nan_to_num)
    assert not verdict and "gradient is not" in verdict.message


def test_histogram_checker():
    assert ex.check_histogram(notebook_solution(STEM, "histogram"))
    assert ex.check_histogram(lambda ids, bins: torch.zeros(bins, device=ids.device).index_add_(
        0, ids, torch.ones(len(ids), device=ids.device)))
    cpu_only = ex.check_histogram(lambda ids, bins: torch.zeros(bins).index_add_(0, ids, torch.ones(len(ids))))
    assert not cpu_only and "a tensor made on the CPU" in cpu_only.message
    assert not torch.are_deterministic_algorithms_enabled(), "the checker restores the setting"
    verdict = ex.check_histogram(ex.broken_histogram)
    assert not verdict and "put_ does not have a deterministic implementation" in verdict.message

    def overwrite(ids, bins):  # warn_only-style: no error, wrong counts
        counts = torch.zeros(bins)
        counts[ids] = 1.0
        return counts

    assert "overwrites" in ex.check_histogram(overwrite).message

    def switch_off(ids, bins):
        torch.use_deterministic_algorithms(False)
        return torch.bincount(ids, minlength=bins).float()

    assert "switched deterministic algorithms off" in ex.check_histogram(switch_off).message

    def put_accumulate(ids, bins):  # right on the CPU; refused on a CUDA tensor in deterministic mode
        return torch.zeros(bins).put_(ids, torch.ones(len(ids)), accumulate=True)

    verdict = ex.check_histogram(put_accumulate)
    assert not verdict and "put_ as called here raises on a CUDA tensor" in verdict.message
    histc = ex.check_histogram(lambda ids, bins: torch.histc(ids.float(), bins=bins, min=0, max=bins - 1))
    assert not histc and "histc" in histc.message
    weights = ex.check_histogram(lambda ids, bins: torch.bincount(ids, weights=torch.ones(len(ids)), minlength=bins))
    assert not weights and "bincount" in weights.message
    no_minlength = ex.check_histogram(lambda ids, bins: torch.bincount(ids).float())
    assert not no_minlength and "leave the last bins empty" in no_minlength.message
    assert "expected a tensor of 10 counts" in ex.check_histogram(lambda ids, bins: torch.bincount(ids).float()[:5]).message
    assert ex.check_histogram(lambda ids, bins: F.one_hot(ids, bins).sum(0).float())
    assert not torch.are_deterministic_algorithms_enabled()

    def warn_only(ids, bins):
        torch.use_deterministic_algorithms(True, warn_only=True)
        return torch.bincount(ids, minlength=bins).float()

    assert "warnings only" in ex.check_histogram(warn_only).message
    torch.use_deterministic_algorithms(False, warn_only=True)  # a caller's warn_only survives the checker
    try:
        ex.check_histogram(notebook_solution(STEM, "histogram"))
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("name", ["predict", "label_loss", "stable_loss", "histogram"])
def test_the_notebook_stubs_start_broken(name):
    """The exercise cells hand in the broken function: it must fail its checker."""
    checker = getattr(ex, f"check_{name}")
    broken = getattr(ex, f"broken_{name}")
    assert not checker(broken)


def test_deterministic_mode_no_longer_documents_cublas_workspace_config():
    """Notebooks 03 and 09 say: up to PyTorch 2.9 deterministic mode required CUBLAS_WORKSPACE_CONFIG, and from
    2.10 on neither the check nor its mention in the docstring remains (pytorch/pytorch#161749)."""
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    mentions = "CUBLAS_WORKSPACE_CONFIG" in (torch.use_deterministic_algorithms.__doc__ or "")
    assert mentions == (version < (2, 10)), f"PyTorch {torch.__version__}: the docstring mentions it: {mentions}"
