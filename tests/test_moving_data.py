"""Notebook 02's helpers: the exercise checkers (right and typical wrong answers) and the transfer sweep."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import notebook_solution

from course_utils.hardware import transfer
from course_utils.exercises import moving_data as md
from course_utils.formatting import format_bytes, format_number

# ---------------------------------------------------------------- exercise 1: fix the training loop


def only_x_fixed(model, batches, device, lr=0.05):
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    total = torch.zeros((), device=device)
    for x, y in batches:
        x = x.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.detach()
    return total / len(batches)


def accumulator_on_cpu(model, batches, device, lr=0.05):
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    total = torch.zeros(())
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.detach()
    return total / len(batches)


def uses_item(model, batches, device, lr=0.05):
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    total = 0.0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
    return torch.tensor(total / len(batches))


def no_zero_grad(model, batches, device, lr=0.05):
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    total = torch.zeros((), device=device)
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.detach()
    return total / len(batches)


def test_train_epoch_right_answer():
    verdict = md.check_train_epoch(notebook_solution("02_moving_data", "train_epoch"))
    assert verdict, str(verdict)
    assert "meta" in verdict.message


@pytest.mark.parametrize("fn, words", [
    (md.buggy_train_epoch, "not on the expected device"),
    (only_x_fixed, "not on the expected device"),
    (accumulator_on_cpu, "the returned loss is on cpu"),
    (uses_item, "item"),
    (no_zero_grad, "reference"),
    (None, "expected a function"),
])
def test_train_epoch_wrong_answers(fn, words):
    verdict = md.check_train_epoch(fn)
    assert not verdict
    assert words in str(verdict), str(verdict)
    assert verdict.hint


def test_buggy_loop_works_on_cpu_only():
    # The bug is invisible with one device: that is the point of the exercise.
    loss = md.buggy_train_epoch(md.make_model(), md.make_batches(), "cpu")
    assert loss.dim() == 0 and torch.isfinite(loss)


# ---------------------------------------------------------------- exercise 2: device-agnostic train_step


def good_step(model, optimizer, loss_fn, x, y):
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def hard_coded_cuda(model, optimizer, loss_fn, x, y):
    x, y = x.to("cuda"), y.to("cuda")
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def batch_not_moved(model, optimizer, loss_fn, x, y):
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def returns_item(model, optimizer, loss_fn, x, y):
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def not_detached(model, optimizer, loss_fn, x, y):
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def forgets_zero_grad(model, optimizer, loss_fn, x, y):
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def moves_model_to_batch(model, optimizer, loss_fn, x, y):
    model.to(x.device)
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def stub(model, optimizer, loss_fn, x, y):
    ...


def test_train_step_right_answer():
    verdict = md.check_train_step(good_step)
    assert verdict, str(verdict)
    # the hidden reference passes its own checker
    assert md.check_train_step(md._reference_train_step)


@pytest.mark.parametrize("fn, words", [
    (hard_coded_cuda, "names CUDA"),
    (batch_not_moved, "not on the expected device"),
    (returns_item, "float"),
    (not_detached, "requires grad"),
    (forgets_zero_grad, "nothing cleared them"),
    (moves_model_to_batch, "meta"),
    (stub, "returned None"),
    ("train_step", "expected a function"),
])
def test_train_step_wrong_answers(fn, words):
    verdict = md.check_train_step(fn)
    assert not verdict
    assert words in str(verdict), str(verdict)


# ---------------------------------------------------------------- exercise 3: the quiz

RIGHT = {"a": True, "b": False, "c": False, "d": True, "e": False, "f": True, "g": True, "h": True}


def test_quiz_key_matches_pytorch():
    assert md.quiz_truth() == RIGHT


def test_quiz_right_answer_keeps_the_reasons_until_asked():
    verdict = md.check_quiz(RIGHT)
    assert verdict, str(verdict)
    assert not any(why in str(verdict) for _, why in md.QUIZ.values()), "the solution's output gives reasons away"
    explained = md.check_quiz(RIGHT, explain=True)
    assert explained and all(why in str(explained) for _, why in md.QUIZ.values()), str(explained)


def test_quiz_wrong_answers_get_no_reasons_even_when_asked():
    verdict = md.check_quiz({**RIGHT, "c": True}, explain=True)
    assert not verdict and not any(why in str(verdict) for _, why in md.QUIZ.values())


@pytest.mark.parametrize("answers, words", [
    ({**RIGHT, "c": True}, "1 of 8 wrong"),
    ({**RIGHT, "h": False, "e": True}, "2 of 8 wrong"),
    ({k: True for k in RIGHT}, "3 of 8 wrong"),
    ({**RIGHT, "b": None}, "missing: b"),
    ({**RIGHT, "z": True}, "unknown case"),
    ({**RIGHT, "a": "same"}, "not True/False: a (str)"),
    ([True] * 8, "expected a dict"),
])
def test_quiz_wrong_answers(answers, words):
    verdict = md.check_quiz(answers)
    assert not verdict
    assert words in str(verdict), str(verdict)


def test_quiz_names_the_wrong_letters_in_the_closer_hint_only():
    verdict = md.check_quiz({**RIGHT, "c": True})
    assert "c)" not in str(verdict) and "copy=True" in verdict.hint
    assert "The wrong one: c." in str(verdict.closer_hint())


# ---------------------------------------------------------------- transfer sweep (on the CPU)


def test_transfer_sizes():
    sizes = transfer.transfer_sizes()
    assert sizes[0] == 4 << 10 and sizes[-1] == 1 << 30 and len(sizes) == 10
    assert transfer.transfer_sizes(1 << 20, 1 << 10, 32) == [1 << 10, 1 << 15, 1 << 20]
    with pytest.raises(ValueError):
        transfer.transfer_sizes(10, 100)


def test_format_bytes():
    assert format_bytes(4096) == "4 KiB"
    assert format_bytes(1 << 30) == "1 GiB"
    assert format_bytes(256 << 20) == "256 MiB"
    assert format_bytes(100) == "100 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 << 40) == "3 TiB"


def test_format_number():
    assert format_number(4127.3) == "4,127" and format_number(54.31) == "54.3" and format_number(0.9912) == "0.991"
    assert format_number(None) == format_number(float("nan")) == format_number("x") == format_number(True) == "–"


def test_buffers_and_bad_names():
    src, dst = transfer.transfer_buffers("h2d", 1024, "pageable", "cpu")
    assert src.numel() == dst.numel() == 1024 and src.dtype == torch.uint8
    assert int(src.sum()) == 1024  # filled: every page touched
    src, dst = transfer.transfer_buffers("d2h", 2048, "pageable", "cpu")
    assert int(src.sum()) == 2048
    with pytest.raises(ValueError, match="h2d"):
        transfer.transfer_buffers("up", 1024, "pageable", "cpu")
    with pytest.raises(ValueError, match="pinned"):
        transfer.measure_transfer("h2d", 1024, "locked", "cpu")


@pytest.mark.skipif(torch.accelerator.is_available(), reason="pinning works where an accelerator is present")
def test_pinned_without_accelerator_says_what_to_do():
    with pytest.raises(RuntimeError, match="pageable"):
        transfer.host_buffer(1024, pinned=True)


def test_measure_and_sweep_on_cpu():
    seen = []
    results = transfer.bandwidth_sweep("cpu", sizes=[4096, 65536], memories=("pageable",),
                                       progress=seen.append, repeat=3, warmup=1, min_sample_time=0.001)
    assert len(results) == len(seen) == 4
    r = results[0]
    assert (r.direction, r.memory, r.nbytes, r.non_blocking) == ("h2d", "pageable", 4096, False)
    assert r.gbps > 0 and r.seconds > 0 and "GB/s" in str(r)
    table = transfer.results_table(results)
    assert "H2D pageable" in table and "D2H pageable" in table and "64 KiB" in table
    assert "pinned" not in table
    fig = transfer.plot_bandwidth(results)
    assert len(fig.axes[0].lines) == 2
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_measure_transfer_times_the_copy_only():
    # The destination is made once, outside the timed call: copy_ writes into the same storage.
    r = transfer.measure_transfer("h2d", 1 << 16, "pageable", "cpu", repeat=3, warmup=1,
                                  min_sample_time=0.001)
    assert r.timing.method == "perf_counter" and r.timing.number >= 1
    with pytest.raises(ValueError, match="d2h"):
        transfer.bandwidth_sweep("cpu", sizes=[4096], directions=("sideways",))
