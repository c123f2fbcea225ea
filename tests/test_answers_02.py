"""A catalogue of answers for notebook 02's exercise checkers (course_utils.exercises.moving_data:
check_train_epoch, check_train_step and check_quiz).

For each checker: the wrong answers a class writes, each rejected with a message that names its mistake and a
first hint that names the concept, not the line (no line of the notebook's solution in it; the closer hint,
nearer to the code, waits for a second failure or %hint); and right answers written differently from the
notebook's solution, each accepted. The notebook's own solution comes from the notebook (conftest). Every test
leaves the global settings (default device and dtype, grad mode) as it found them. At the end, the checkers'
first tests (from tests/test_moving_data.py; the ones whose names the catalogue had taken end in _in_brief).
"""

from __future__ import annotations

import ast
import copy
import re
from types import MappingProxyType

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from answers_helpers import SOLUTIONS, accepted
from answers_helpers import rejected_without_solution_lines as rejected
from conftest import notebook_solution
from torch import nn

from course_utils import get_device
from course_utils.exercises import moving_data as md

pytestmark = pytest.mark.usefixtures("global_settings_kept")  # tests/conftest.py


def test_the_solutions_have_code_to_compare_with() -> None:
    assert "torch.ones(3, 3, dtype=torch.float16, device=device)" in SOLUTIONS["00"]
    assert "statistics.median(times)" in SOLUTIONS["01"]
    assert "torch.zeros((), device=device)" in SOLUTIONS["02-1"]
    assert "return loss.detach()" in SOLUTIONS["02-2"]
    assert any(p.startswith("answers = {") for p in SOLUTIONS["02-3"])


# ================================================================ 02, exercise 1: fix the training loop

def _epoch(model, batches, device, lr=0.05, *, move_y=True, total_device="device", optimizer_first=False,
           move_model=True, divide_by=None, detach=True, fixed_lr=None, total_dtype=None, first=None):
    """The loop, with one of the mistakes a class makes switched on by a keyword (``first``: a call made on the
    model and the device before anything else)."""
    if first is not None:
        first(model, device)
    if optimizer_first:
        optimizer = torch.optim.SGD(model.parameters(), lr=fixed_lr or lr)
    if move_model:
        model.to(device)
    if not optimizer_first:
        optimizer = torch.optim.SGD(model.parameters(), lr=fixed_lr or lr)
    where = {"device": device, "cpu": "cpu", "batch": batches[0][0].device}[total_device]
    total = torch.zeros((), device=where, dtype=total_dtype)
    for x, y in batches:
        x = x.to(device)
        if move_y:
            y = y.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.detach() if detach else loss
    return total / (divide_by or len(batches))


def writes_back_into_batches(model, batches, device, lr=0.05):
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    total = torch.zeros((), device=device)
    for i, (x, y) in enumerate(batches):
        batches[i] = x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.detach()
    return total / len(batches)


def moves_through_data(model, batches, device, lr=0.05):
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    total = torch.zeros((), device=device)
    for x, y in batches:
        x.data, y.data = x.data.to(device), y.data.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.detach()
    return total / len(batches)


def reads_the_loss_each_step(model, batches, device, lr=0.05):
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
    return torch.tensor(total / len(batches), device=device)


def _kw(**kw):
    def answer(model, batches, device, lr=0.05):
        return _epoch(model, batches, device, lr, **kw)
    return answer


def sets_the_default_device(model, batches, device, lr=0.05):
    torch.set_default_device(device)  # the total is then made on the device, and so is every later tensor
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


def switches_grad_off_at_the_end(model, batches, device, lr=0.05):
    result = _epoch(model, batches, device, lr)
    torch.set_grad_enabled(False)  # "no more training": for the whole process
    return result


def float64_by_default(model, batches, device, lr=0.05):
    torch.set_default_dtype(torch.float64)  # for the total; the model was made in float32 already
    return _epoch(model, batches, device, lr).float()


def mean_over_the_samples(model, batches, device, lr=0.05):
    """Each batch's loss weighted by its size: the same as the loop's mean only when the batches are equal."""
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    total, seen = torch.zeros((), device=device), 0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.detach() * len(x)
        seen += len(x)
    return total / seen


def trains_a_copy(model, batches, device, lr=0.05):
    model = copy.deepcopy(model).to(device)  # the caller's model is left as it was
    return _epoch(model, batches, device, lr)


def batch_to_the_model(model, batches, device, lr=0.05):
    """The model never moved: the batches go where the model is (the CPU), the total to the device."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    where = next(model.parameters()).device
    total = torch.zeros((), device=device)
    for x, y in batches:
        x, y = x.to(where), y.to(where)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.detach()  # a 0-dim CPU tensor acts as a number: the total stays on the device
    return total / len(batches)


WRONG_EPOCHS = [
    (md.buggy_train_epoch, "the model got x on cpu, while its parameters are on meta", "The forgotten assignment"),
    (_kw(move_y=False), "y was on cpu, while the model is on meta", "one device"),
    (_kw(total_device="cpu"), "the returned loss is on cpu, not on meta", "without saying where"),
    # right only for the data it is given: the accumulator follows the batches' device, which is the CPU
    (_kw(total_device="batch"), "the returned loss is on cpu, not on meta", "without saying where"),
    (_kw(optimizer_first=True), "the optimizer was built while the model's parameters were on cpu",
     "The optimizer question"),
    (_kw(move_model=False), "the model's parameters were still on cpu when it got x on meta", "Section 2"),
    # right only for make_batches' default of 4 batches
    (_kw(divide_by=4), "the total divided by 4, though there were 3 batches", "how many batches"),
    (_kw(divide_by=1), "the total of the 3 losses, not their mean", "how many batches"),
    (_kw(detach=False), "still requires grad", "not detached"),
    (reads_the_loss_each_step, "read a value off the device", "host wait for the GPU"),
    (writes_back_into_batches, "replaced entries of the list of batches it was given", "leave its arguments"),
    (moves_through_data, "assigned a tensor on another device to a tensor's .data", "Section 1"),
    (lambda model, batches: _epoch(model, batches, "cpu"), "The checker calls it as train_epoch(", "the arguments"),
    (lambda model, batches, device: _epoch(model, batches, device), "unexpected keyword argument 'lr'",
     "the arguments"),
    # global settings left changed (the checker sets them back)
    (sets_the_default_device, "the default device from cpu to meta (after it, torch.zeros(2) made anywhere "
     "lands on meta)", "setting of the whole process"),
    (switches_grad_off_at_the_end, "the grad mode from True to False", "setting of the whole process"),
    (float64_by_default, "the default dtype from torch.float32 to torch.float64", "setting of the whole process"),
    # right only for the lr the loop was given
    (_kw(fixed_lr=0.05), "with 5 batches of 8 and lr=0.2, the mean loss is 6.19789, the reference gives 3.67402: "
     "6.19789 is what lr=0.05 gives", "the caller chooses it"),
    # right only for batches of equal sizes
    (mean_over_the_samples, "with 3 batches of 16, 16 and 5 samples, the mean loss is 5.54627, the reference "
     "gives 5.88725: 5.54627 is the mean over the 37 samples", "over the number of batches"),
    (_kw(first=lambda model, device: model.eval()), "left the model in eval mode", "caller's choice"),
    (_kw(total_dtype=torch.float64), "returned the mean loss as torch.float64, while the losses it adds up are "
     "torch.float32", "different dtypes"),
    (trains_a_copy, "the model it was given still has its initial weights: the function trained a copy of it",
     "The caller keeps the model it passed"),
    (batch_to_the_model, "the model was never moved to meta: its parameters are still on cpu after the call",
     "the model must go there"),
]


@pytest.mark.parametrize(("answer", "mistake", "concept"), WRONG_EPOCHS,
                         ids=lambda v: getattr(v, "__name__", None) if callable(v) else None)
def test_train_epoch_wrong_answers(answer, mistake, concept) -> None:
    rejected(md.check_train_epoch(answer), mistake, concept, "02-1")


def test_train_epoch_sets_back_what_it_changed() -> None:
    """The default device an answer set is the CPU again after the check, for the notebook's next cells."""
    verdict = md.check_train_epoch(sets_the_default_device)
    assert not verdict and "set it back" in verdict.message
    assert torch.get_default_device() == torch.device("cpu") and torch.zeros(2).device.type == "cpu"
    assert "device=" in verdict.closer and "with torch.device" in verdict.closer


def test_train_epoch_the_model_never_moved_is_not_an_optimizer_order() -> None:
    verdict = md.check_train_epoch(batch_to_the_model)
    assert "optimizer was built" not in verdict.message and "Build the optimizer after" not in verdict.closer
    assert "device argument" in verdict.closer


def test_train_epoch_eval_and_back_is_seen_too() -> None:
    def eval_for_the_loop(model, batches, device, lr=0.05):
        model.eval()
        result = _epoch(model, batches, device, lr)
        model.train()
        return result
    rejected(md.check_train_epoch(eval_for_the_loop), "the model ran 3 of its 3 forward passes in eval mode",
             "caller's choice", "02-1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="names CUDA on a machine without it")
def test_train_epoch_naming_cuda() -> None:
    def to_cuda(model, batches, device, lr=0.05):
        return _epoch(model, [(x.to("cuda"), y.to("cuda")) for x, y in batches], device, lr)
    rejected(md.check_train_epoch(to_cuda), "asked for CUDA", "which device should it use", "02-1")


def stacked_mean(model, batches, device, lr=0.05):
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for inputs, targets in batches:
        inputs, targets = (t.to(device, non_blocking=True) for t in (inputs, targets))
        optimizer.zero_grad()
        loss = F.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses).mean()


def by_hand_in_float64(model, batches, device, lr=0.05):
    """No optimizer object (plain SGD by hand), the total in float64: last bits differ from the reference."""
    model.to(device)
    total = torch.tensor(0.0, dtype=torch.float64, device=device)
    for x, y in batches:
        loss = F.mse_loss(model(x.to(device)), y.to(device))
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        total += loss.detach().double()
    return (total / len(batches)).float()


def cpu_zero_added_out_of_place(model, batches, device, lr=0.05):
    """Starts from a 0-dim CPU zero, but adds out of place: a 0-dim CPU tensor acts as a number (section 3),
    so the first sum is already on the device, and so is every later one."""
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    total = torch.zeros(())
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total = total + loss.detach()
    return total / len(batches)


def default_device_in_a_block(model, batches, device, lr=0.05):
    """`with torch.device(device):` sets the default for the block only: it is back on exit."""
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    with torch.device(device):
        total = torch.zeros(())
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.detach()
    return total / len(batches)


def train_mode_asked_for(model, batches, device, lr=0.05):
    """model.train() on a model in train mode changes nothing: a training function may ask for the mode."""
    model.train()
    return _epoch(model, batches, device, lr)


@pytest.mark.parametrize("answer", [stacked_mean, by_hand_in_float64, cpu_zero_added_out_of_place,
                                    default_device_in_a_block, train_mode_asked_for, "notebook"])
def test_train_epoch_right_answers(answer) -> None:
    if answer == "notebook":
        answer = notebook_solution("02_moving_data", "train_epoch")
    accepted(md.check_train_epoch(answer))


# ================================================================ 02, exercise 2: a device-agnostic train_step

def _step(model, optimizer, loss_fn, x, y, *, to=None, move_y=True, zero=True, zero_late=False, item=False,
          detach=True, loss_after=False, swapped=False, evaluate=False, returned_dtype=None):
    """The step, with one of the mistakes a class makes switched on by a keyword."""
    where = next(model.parameters()).device if to is None else to
    if evaluate:
        model.eval()
    x = x.to(where)
    y = y.to(where) if move_y else y
    if zero:
        optimizer.zero_grad()
    loss = loss_fn(y, model(x)) if swapped else loss_fn(model(x), y)
    loss.backward()
    if zero_late:
        optimizer.zero_grad()
    optimizer.step()
    if loss_after:
        loss = loss_fn(model(x), y)
    if item:
        return loss.item()
    if returned_dtype is not None:
        return loss.detach().to(returned_dtype)
    return loss.detach() if detach else loss


def _step_kw(**kw):
    def answer(model, optimizer, loss_fn, x, y):
        return _step(model, optimizer, loss_fn, x, y, **kw)
    return answer


def _in_notebook(source: str, **names):
    """A function defined as a notebook cell would, with the notebook's names (``device``, ``get_device``)."""
    scope = {"torch": torch, "F": F, **names}
    exec(source, scope)
    return next(v for k, v in scope.items() if k not in names and callable(v) and k not in ("torch", "F"))


def hard_coded_cuda(model, optimizer, loss_fn, x, y):
    return _step(model, optimizer, loss_fn, x, y, to="cuda")


def chooses_cuda_when_there(model, optimizer, loss_fn, x, y):
    where = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return _step(model, optimizer, loss_fn, x, y, to=where)


def returns_to_the_cpu(model, optimizer, loss_fn, x, y):
    return _step(model, optimizer, loss_fn, x, y).cpu()


def asks_the_module(model, optimizer, loss_fn, x, y):
    return _step(model, optimizer, loss_fn, x, y, to=model.device)


def indexes_the_model(model, optimizer, loss_fn, x, y):
    # right only for the model it was tried on: an nn.Sequential whose first layer has weights
    return _step(model, optimizer, loss_fn, x, y, to=model[0].weight.device)


def its_own_loss(model, optimizer, loss_fn, x, y):
    # right only for the loss it was tried with
    return _step(model, optimizer, lambda out, target: F.mse_loss(out, target), x, y)


def moves_the_model(model, optimizer, loss_fn, x, y):
    model.to(x.device)
    return _step(model, optimizer, loss_fn, x, y)


def standardises_in_place(model, optimizer, loss_fn, x, y):
    x = x.to(next(model.parameters()).device)  # on the CPU, .to() hands back x itself
    x.sub_(x.mean(dim=0))
    return _step(model, optimizer, loss_fn, x, y)


def step_by_parameter(model, optimizer, loss_fn, x, y):
    """.to(a parameter): its device and its dtype (section 3), for the targets too; model.zero_grad; .data is
    detached too."""
    param = next(iter(model.parameters()))
    inputs, targets = x.to(param), y.to(param)
    model.zero_grad()
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.data


def sets_the_default_device_in_a_step(model, optimizer, loss_fn, x, y):
    torch.set_default_device(next(model.parameters()).device)
    return _step(model, optimizer, loss_fn, x, y)


def cpu_named_to_place(model, optimizer, loss_fn, x, y):
    """A device compared, and also written to place the batch: the second is what is rejected."""
    where = next(model.parameters()).device
    if where.type == "cpu":
        x, y = x.to("cpu"), y.to("cpu")
    return _step(model, optimizer, loss_fn, x, y)


GLOBAL_DEVICE = """
def train_step(model, optimizer, loss_fn, x, y):
    x, y = x.to(device), y.to(device)
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()
"""


WRONG_STEPS = [
    (lambda model, optimizer, loss_fn, x, y: None, "it returned None", "return the loss"),
    (hard_coded_cuda, "names CUDA ('cuda')", "A function written once"),
    (chooses_cuda_when_there, "names CUDA", "A function written once"),
    (returns_to_the_cpu, "moves a tensor to the CPU (.cpu())", "Reading it waits for the GPU"),
    (_in_notebook(GLOBAL_DEVICE, device=torch.device("cpu")),
     "the batch reached the model on cpu: it went to the notebook's variable device (cpu here)",
     "the batch follows the model"),
    (_in_notebook(GLOBAL_DEVICE.replace("to(device)", "to(get_device())"), get_device=get_device),
     "it went to get_device() (cpu here), not to the model's device", "the batch follows the model"),
    (_step_kw(move_y=False),
     "the loss got the model's output on meta and y on cpu", "one operation on two tensors"),
    (asks_the_module, "asked a module for its .device", "each parameter is a tensor"),
    (indexes_the_model, "indexes the model (model[...])", "any model"),
    (its_own_loss, "never called the loss_fn it was given", "the caller chooses the loss"),
    (_step_kw(item=True), "it returned a float, not a tensor", "waits for the GPU"),
    (_step_kw(detach=False), "still requires grad", "cuts a tensor off from the graph"),
    (_step_kw(zero=False), "the first batch's gradients were still there in the second step", "what resets it"),
    (_step_kw(zero=False, zero_late=True), "the weights are still the initial ones", "In which order"),
    (_step_kw(loss_after=True), "the first loss is", "computed after the update"),
    (moves_the_model, "train_step moved the model off meta", "the batch follows the model"),
    (standardises_in_place, "changed a batch's x it was given in place", "leave its arguments"),
    (cpu_named_to_place, "names a device ('cpu')", "A function written once"),
    # right only for a symmetric loss such as the checker's MSE
    (_step_kw(swapped=True), "called loss_fn with the target first and the model's output second",
     "(input, target)"),
    # right only for float32 targets: integer class labels, for one, would become floats
    (step_by_parameter, "loss_fn got the target as torch.float32, but y was given as torch.float64: the "
     "function cast y to torch.float32", "changes its device only"),
    (_step_kw(evaluate=True), "the function left the model in eval mode", "caller's choice"),
    (_step_kw(returned_dtype=torch.float64), "it returned the loss as torch.float64, while loss_fn gave it as "
     "torch.float32", "as the step computed it"),
    (sets_the_default_device_in_a_step, "the default device from cpu to meta", "setting of the whole process"),
]


@pytest.mark.parametrize(("answer", "mistake", "concept"), WRONG_STEPS,
                         ids=lambda v: getattr(v, "__name__", None) if callable(v) else None)
def test_train_step_wrong_answers(answer, mistake, concept) -> None:
    rejected(md.check_train_step(answer), mistake, concept, "02-2")


def step_by_parameter_device(model, optimizer, loss_fn, x, y):
    """The input .to(a parameter), its device and its dtype (section 3), the target to its device only;
    model.zero_grad; .data is detached too."""
    param = next(iter(model.parameters()))
    inputs, targets = x.to(param), y.to(param.device)
    model.zero_grad()
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.data


def non_blocking_off_the_cpu(model, optimizer, loss_fn, x, y):
    """A device's type compared (to choose non_blocking) reads where the model is; it does not choose it."""
    device = next(model.parameters()).device
    nb = device.type != "cpu"
    x, y = x.to(device, non_blocking=nb), y.to(device, non_blocking=nb)
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def pinned_for_accelerators(model, optimizer, loss_fn, x, y):
    device = next(model.parameters()).device
    if device.type in ("cuda", "xpu") and device != torch.device("cpu"):
        x, y = x.pin_memory(), y.pin_memory()
    return _step(model, optimizer, loss_fn, x, y)


def step_keeping_zeroed_grads(model, optimizer, loss_fn, x, y):
    where = next(model.parameters()).device
    optimizer.zero_grad(set_to_none=False)
    loss = loss_fn(model(x.to(where)), y.to(where))
    loss.backward()
    optimizer.step()
    return loss.detach().clone()


@pytest.mark.parametrize("answer", [step_by_parameter_device, step_keeping_zeroed_grads, non_blocking_off_the_cpu,
                                    pinned_for_accelerators, "notebook"])
def test_train_step_right_answers(answer) -> None:
    if answer == "notebook":
        answer = notebook_solution("02_moving_data", "train_step")
    accepted(md.check_train_step(answer))


# ================================================================ 02, exercise 3: the quiz

RIGHT = dict(ast.literal_eval(next(p for p in SOLUTIONS["02-3"] if p.startswith("answers = {"))
                              .removeprefix("answers = ")))


@pytest.mark.parametrize(("answers", "mistake", "topics", "letters"), [
    ({k: True for k in "abcdefgh"}, "3 of 8 wrong.", ["a dtype asked", "a device asked", "copy=True"], "b, c, e"),
    ({**RIGHT, "c": True}, "1 of 8 wrong.", ["concerns copy=True"], "The wrong one: c."),
    ({**RIGHT, "h": False}, "1 of 8 wrong.", ["a module's .to() (section 2"], "The wrong one: h."),
    ({**RIGHT, "f": False, "g": False}, "2 of 8 wrong.", [".to(another tensor)", "a device asked"], "f, g."),
], ids=["all-same", "copy-true", "module", "to-other-and-cpu"])
def test_quiz_wrong_answers(answers, mistake, topics, letters) -> None:
    """How many are wrong, and which rules they concern; not which letters (in a True/False quiz the student
    would just flip them): only the closer hint names them."""
    verdict = md.check_quiz(answers)
    rejected(verdict, mistake, "Section 1's rule", "02-3")
    assert all(topic in verdict.hint for topic in topics), verdict.hint
    for key, (expression, _) in md.QUIZ.items():
        for text in (verdict.message, verdict.hint):
            assert not re.search(rf"(?<![\w.]){key}\)", text), text  # a case's label: "c)"
            assert expression.split("  #")[0] not in text, text
    assert letters in verdict.closer, verdict.closer


@pytest.mark.parametrize(("answers", "mistake", "concept"), [
    ({k: int(v) for k, v in RIGHT.items()}, "not True/False: a (int), b (int)", "True = the same object"),
    ({k: np.int64(v) for k, v in RIGHT.items()}, "not True/False: a (numpy.int64)", "True = the same object"),
    ({**RIGHT, "a": "same"}, "not True/False: a (str).", "True = the same object"),
    ({k: v for k, v in RIGHT.items() if k != "h"}, "missing: h.", "True = the same object"),
    ({**RIGHT, "b": None, "c": 0}, "missing: b; not True/False: c (int).", "True = the same object"),
    ({k.upper(): v for k, v in RIGHT.items()}, "unknown case(s) A, B", "letters shown above"),
    (list(RIGHT.values()), "expected a dict", "a dict from each case's letter"),
], ids=["ints", "numpy-ints", "str", "missing", "missing-and-int", "upper-case", "list"])
def test_quiz_answers_in_the_wrong_form(answers, mistake, concept) -> None:
    rejected(md.check_quiz(answers), mistake, concept, "02-3")


def test_quiz_numpy_bools() -> None:
    """What comparing NumPy values gives (np.bool_, whose type is named 'bool' in NumPy 2) is True or False too;
    a NumPy bool that is wrong is counted as wrong, not as not-a-bool."""
    accepted(md.check_quiz({k: np.bool_(v) for k, v in RIGHT.items()}))
    answers = dict(zip(RIGHT, np.array(list(RIGHT.values())) == np.array([True] * 8), strict=True))
    accepted(md.check_quiz(answers))
    verdict = md.check_quiz({**RIGHT, "c": np.True_})
    rejected(verdict, "1 of 8 wrong.", "Section 1's rule", "02-3")
    assert "bool" not in verdict.message


def test_quiz_right_answers() -> None:
    x, w, model = torch.arange(4.0), torch.zeros(2), nn.Linear(2, 2)
    computed = {"a": x.to("cpu") is x, "b": x.to(torch.float64) is x, "c": x.to("cpu", copy=True) is x,
                "d": x.to(torch.float32) is x, "e": x.to("meta") is x, "f": x.to(w) is x, "g": x.cpu() is x,
                "h": model.to(torch.float64) is model}
    accepted(md.check_quiz(computed))
    accepted(md.check_quiz(MappingProxyType(dict(reversed(list(RIGHT.items()))))))
    accepted(md.check_quiz(dict(zip("abcdefgh", [True, False, False, True, False, True, True, True], strict=True))))


def test_right_answers_pass_the_accelerator_branch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks a machine with an accelerator adds (numbers compared with the CPU's), tried with the CPU
    standing in for the accelerator: the right answers pass them too."""
    monkeypatch.setattr(md, "_other_devices", lambda: [torch.device("meta"), torch.device("cpu")])
    for answer in (notebook_solution("02_moving_data", "train_epoch"), stacked_mean, by_hand_in_float64):
        accepted(md.check_train_epoch(answer))
    for answer in (notebook_solution("02_moving_data", "train_step"), step_by_parameter_device,
                   non_blocking_off_the_cpu):
        accepted(md.check_train_step(answer))


# --- the checkers' first tests (from tests/test_moving_data.py) ---------------------------------------------

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
def test_train_epoch_wrong_answers_in_brief(fn, words):
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


def moves_to_cuda(model, optimizer, loss_fn, x, y):
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
    (moves_to_cuda, "names CUDA"),
    (batch_not_moved, "not on the expected device"),
    (returns_item, "float"),
    (not_detached, "requires grad"),
    (forgets_zero_grad, "nothing cleared them"),
    (moves_model_to_batch, "meta"),
    (stub, "returned None"),
    ("train_step", "expected a function"),
])
def test_train_step_wrong_answers_in_brief(fn, words):
    verdict = md.check_train_step(fn)
    assert not verdict
    assert words in str(verdict), str(verdict)


# ---------------------------------------------------------------- exercise 3: the quiz

QUIZ_KEY = {"a": True, "b": False, "c": False, "d": True, "e": False, "f": True, "g": True, "h": True}


def test_quiz_key_matches_pytorch():
    assert md.quiz_truth() == QUIZ_KEY


def test_quiz_right_answer_keeps_the_reasons_until_asked():
    verdict = md.check_quiz(QUIZ_KEY)
    assert verdict, str(verdict)
    assert not any(why in str(verdict) for _, why in md.QUIZ.values()), "the solution's output gives reasons away"
    explained = md.check_quiz(QUIZ_KEY, explain=True)
    assert explained and all(why in str(explained) for _, why in md.QUIZ.values()), str(explained)


def test_quiz_wrong_answers_get_no_reasons_even_when_asked():
    verdict = md.check_quiz({**QUIZ_KEY, "c": True}, explain=True)
    assert not verdict and not any(why in str(verdict) for _, why in md.QUIZ.values())


@pytest.mark.parametrize("answers, words", [
    ({**QUIZ_KEY, "c": True}, "1 of 8 wrong"),
    ({**QUIZ_KEY, "h": False, "e": True}, "2 of 8 wrong"),
    ({k: True for k in QUIZ_KEY}, "3 of 8 wrong"),
    ({**QUIZ_KEY, "b": None}, "missing: b"),
    ({**QUIZ_KEY, "z": True}, "unknown case"),
    ({**QUIZ_KEY, "a": "same"}, "not True/False: a (str)"),
    ([True] * 8, "expected a dict"),
])
def test_quiz_wrong_answers_in_brief(answers, words):
    verdict = md.check_quiz(answers)
    assert not verdict
    assert words in str(verdict), str(verdict)


def test_quiz_names_the_wrong_letters_in_the_closer_hint_only():
    verdict = md.check_quiz({**QUIZ_KEY, "c": True})
    assert "c)" not in str(verdict) and "copy=True" in verdict.hint
    assert "The wrong one: c." in str(verdict.closer_hint())
