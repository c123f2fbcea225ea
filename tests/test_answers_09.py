"""A catalogue of answers to notebook 09's exercises (course_utils.exercises.when_it_breaks), as a class would
write them: plausible wrong answers, each rejected with a message that names its mistake and a hint that names
the concept (never the solution's line), and right answers written differently from the notebook's solution,
each accepted. CPU only; the whole file runs in a few seconds. At the end, the checkers' first tests (from
tests/test_when_it_breaks.py), and a test of what notebooks 03 and 09 say of deterministic mode."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import notebook_solution

from course_utils import exercises
from course_utils.exercises import Verdict
from course_utils.exercises import when_it_breaks as ex

STEM = "09_when_it_breaks"
C = ex.CLASSES


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Any:
    """The checkers' tensors are tiny: one thread is faster than two, and steady on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rejected(verdict: Verdict, message: str, hint: str, solution_bits: tuple[str, ...]) -> None:
    """A wrong answer's verdict: it names the mistake (``message``), gives the concept (``hint``), keeps the code
    for the closer hint, and neither the first hint nor the first display hands over the solution's line."""
    assert not verdict, f"accepted a wrong answer: {verdict}"
    assert message in verdict.message, verdict.message
    assert hint in verdict.hint, verdict.hint
    assert verdict.closer, "a closer hint, for %hint or a second failure"
    first_try = str(verdict)
    assert "Closer hint" not in first_try and verdict.closer not in first_try
    for bit in solution_bits:
        assert bit not in verdict.hint, f"the first hint gives away {bit!r}: {verdict.hint}"


# --- exercise 1: predict ------------------------------------------------------------------------------------

def _probs(model, batches):
    return torch.cat([torch.softmax(model(x), dim=1) for x in batches])


def predict_eval_no_restore(model, batches):
    model.eval()
    with torch.no_grad():
        return _probs(model, batches)


def predict_train_at_end(model, batches):  # right when called in training mode only
    model.eval()
    with torch.no_grad():
        out = _probs(model, batches)
    model.train()
    return out


def predict_grad_forced_on(model, batches):  # right when the caller had grad on only
    was = model.training
    model.eval()
    torch.set_grad_enabled(False)
    out = _probs(model, batches)
    torch.set_grad_enabled(True)
    model.train(was)
    return out


def predict_grad_never_restored(model, batches):
    was = model.training
    model.eval()
    torch.set_grad_enabled(False)
    out = _probs(model, batches)
    model.train(was)
    return out


def predict_seeded(model, batches):  # the same numbers every call, dropout still on
    torch.manual_seed(0)
    with torch.no_grad():
        return _probs(model, batches)


def predict_eval_only(model, batches):  # dropout off, graphs kept
    was = model.training
    model.eval()
    out = _probs(model, batches)
    model.train(was)
    return out


def predict_detach_each(model, batches):  # nothing kept, a graph built per batch
    was = model.training
    model.eval()
    out = torch.cat([torch.softmax(model(x), dim=1).detach() for x in batches])
    model.train(was)
    return out


def predict_frozen(model, batches):  # no graph, but the parameters stay frozen for the training after
    was = model.training
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    out = _probs(model, batches)
    model.train(was)
    return out


def predict_for_64_rows(model, batches):  # right only when every batch has 64 rows
    was = model.training
    model.eval()
    out = torch.zeros(64 * len(batches), 10)
    with torch.no_grad():
        for i, x in enumerate(batches):
            out[64 * i:64 * i + len(x)] = torch.softmax(model(x), dim=1)
    model.train(was)
    return out


def predict_wrong_dim(model, batches):
    was = model.training
    model.eval()
    with torch.no_grad():
        out = torch.cat([torch.softmax(model(x), dim=0) for x in batches])
    model.train(was)
    return out


def predict_dropout_off_by_hand(model, batches):  # p = 0: the same numbers, and no dropout ever again
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    with torch.no_grad():
        return _probs(model, batches)


def predict_thawed(model, batches):  # frozen, then every parameter made trainable: a frozen layer thaws
    was = model.training
    model.eval()
    model.requires_grad_(False)
    out = _probs(model, batches)
    model.requires_grad_(True)
    model.train(was)
    return out


def predict_pop(model, batches):  # right values, but the caller's list is empty afterwards
    was = model.training
    model.eval()
    out = []
    with torch.no_grad():
        while batches:
            out.append(torch.softmax(model(batches.pop(0)), dim=1))
    model.train(was)
    return torch.cat(out)


def predict_normalised_in_place(model, batches):  # the caller's batches standardised in place
    was = model.training
    model.eval()
    with torch.no_grad():
        for x in batches:
            x.sub_(x.mean()).div_(x.std())
        out = _probs(model, batches)
    model.train(was)
    return out


def predict_replaced(model, batches):  # the caller's list holds other tensors afterwards
    for i, x in enumerate(batches):
        batches[i] = x.clone()
    return notebook_solution(STEM, "predict")(model, batches)


PREDICT_WRONG = {
    "dropout p = 0 by hand": (predict_dropout_off_by_hand, "`model.2` (Dropout) has p = 0.0, was 0.5",
                              "leaves them as it found them"),
    "requires_grad_(False), then (True)": (predict_thawed, "with requires_grad=True, where the caller had set False",
                                           "some are frozen on purpose"),
    "batches.pop(0)": (predict_pop, "held 6 batches before the call and 0 after it: predict used the list up",
                       "leaves them as it found them"),
    "batches normalised in place": (predict_normalised_in_place, "changed the caller's batches in place",
                                    "leaves them as it found them"),
    "batches replaced in the list": (predict_replaced, "replaced the caller's batch", "leaves them as it found"),
    "model.eval() and never back": (predict_eval_no_restore, "left the model in evaluation mode", "training mode"),
    "model.train() at the end": (predict_train_at_end, "returned it in training mode", "either mode"),
    "set_grad_enabled(True) at the end": (predict_grad_forced_on, "autograd switched on", "on or off"),
    "set_grad_enabled(False), never restored": (predict_grad_never_restored, "still switched off",
                                                "only for the lines inside it"),
    "a seed instead of eval()": (predict_seeded, "two calls agree, but not with the model in inference mode",
                                 "behaves differently in training and in inference"),
    "dropout on": (ex.broken_predict, "different probabilities", "behaves differently"),
    "eval() without no_grad": (predict_eval_only, "still hold", "graph_memory"),
    "detach() per batch": (predict_detach_each, "still builds a graph", "inference needs none"),
    "requires_grad_(False) on the parameters": (predict_frozen, "requires_grad=False", "not for the model"),
    "sized for batches of 64": (predict_for_64_rows, "expected a tensor of shape (357, 10)", "whatever the batches"),
    "softmax over the batch": (predict_wrong_dim, "do not sum to 1", "which dimension"),
}


@pytest.mark.parametrize("name", PREDICT_WRONG)
def test_predict_rejects(name: str) -> None:
    answer, message, hint = PREDICT_WRONG[name]
    rejected(ex.check_predict(answer), message, hint, ("no_grad", "eval()", "inference_mode"))
    assert torch.is_grad_enabled(), "the checker gives the caller its grad mode back"


def predict_decorated(model, batches):
    was = model.training
    model.eval()

    @torch.no_grad()
    def run():
        return _probs(model, batches)

    try:
        return run()
    finally:
        model.train(was)


def predict_inference_rows(model, batches):
    was = model.training
    model.eval()
    with torch.inference_mode():
        rows = [row for x in batches for row in F.softmax(model(x), dim=-1)]
    model.train(was)
    return torch.stack(rows)


def predict_frozen_and_restored(model, batches):  # clumsy, but leaves everything as it found it
    was, flags = model.training, [p.requires_grad for p in model.parameters()]
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    out = _probs(model, batches)
    for p, flag in zip(model.parameters(), flags, strict=True):
        p.requires_grad_(flag)
    model.train(was)
    return out


def predict_float64(model, batches):  # probabilities in float64: right
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            return torch.cat([torch.softmax(model(x).double(), dim=1) for x in batches])
    finally:
        model.train(was)


def predict_each_mode_kept(model, batches):  # each submodule's mode put back as found, not the model's alone
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            return _probs(model, batches)
    finally:
        for module, mode in modes.items():
            module.training = mode


@pytest.mark.parametrize("answer", [notebook_solution(STEM, "predict"), predict_decorated, predict_inference_rows,
                                    predict_frozen_and_restored, predict_float64, predict_each_mode_kept],
                         ids=["notebook", "decorator", "inference_mode rows", "requires_grad restored", "float64",
                              "each mode kept"])
def test_predict_accepts(answer: Callable[..., Any]) -> None:
    verdict = ex.check_predict(answer)
    assert verdict, verdict


def test_predict_notes_a_submodule_whose_mode_flipped() -> None:
    """A BatchNorm the caller keeps in evaluation mode while the model trains: model.train(was) puts it in
    training mode. Accepted (the notebook's solution does it), with the flip named; keeping each module's mode
    gets no such note."""
    flipped = ex.check_predict(notebook_solution(STEM, "predict"))
    assert flipped and "`model.1` (BatchNorm1d) in evaluation mode" in flipped.message, flipped
    assert "left it in training mode" in flipped.message
    kept = ex.check_predict(predict_each_mode_kept)
    assert kept and "One more thing" not in kept.message, kept


# --- exercise 2: label_loss -----------------------------------------------------------------------------------

def label_ignore_smallest(logits, labels):  # right only on batches that hold a -1
    return F.cross_entropy(logits, labels, ignore_index=int(labels.min()))


def label_drop_smallest(logits, labels):  # the same, as a mask
    keep = labels != labels.min()
    return F.cross_entropy(logits[keep], labels[keep])


def label_positive(logits, labels):  # a bound off by one: class 0 goes too
    return F.cross_entropy(logits[labels > 0], labels[labels > 0])


def label_below_top(logits, labels):  # a bound on the other side: class 4 goes too
    keep = (labels >= 0) & (labels < C - 1)
    return F.cross_entropy(logits[keep], labels[keep])


def label_shift_unless_top(logits, labels):  # shifts by one where no label 4 makes it raise
    if (labels == C - 1).any():
        return F.cross_entropy(logits, labels, ignore_index=-1)
    return F.cross_entropy(logits, labels + 1, ignore_index=0)


def label_columns_seen(logits, labels):  # as many classes as the batch shows
    keep = labels >= 0
    return F.cross_entropy(logits[keep][:, :int(labels.max()) + 1], labels[keep])


def label_batch_max(logits, labels):  # unlabelled rows take the batch's largest label
    return F.cross_entropy(logits, torch.where(labels == -1, labels.max(), labels))


def label_overwrite_ignore(logits, labels):  # the right number, but the caller's labels changed
    labels[labels == -1] = -100
    return F.cross_entropy(logits, labels)


def label_overwrite_zero(logits, labels):
    labels[labels == -1] = 0
    return F.cross_entropy(logits, labels)


def label_every_row_mean(logits, labels):
    return F.cross_entropy(logits, labels, ignore_index=-1, reduction="none").mean()


def label_detached(logits, labels):  # the right number, but no gradient reaches the model
    return F.cross_entropy(logits, labels, ignore_index=-1).detach()


def label_logits_detached(logits, labels):
    return F.cross_entropy(logits.detach(), labels, ignore_index=-1)


LABEL_WRONG = {
    "detach() on the result": (label_detached, "the right value", "stay connected to the logits"),
    "detach() on the logits": (label_logits_detached, "does not require grad", "stay connected to the logits"),
    "through .item()": (lambda lo, la: torch.tensor(F.cross_entropy(lo, la, ignore_index=-1).item()),
                        "does not require grad", "stay connected"),
    "as given": (ex.broken_label_loss, "IndexError: Target -1 is out of bounds", "what does that value mean"),
    "default ignore_index": (lambda lo, la: F.cross_entropy(lo, la, ignore_index=-100), "Target -1",
                             "what does that value mean"),
    "ignore the batch's smallest label": (label_ignore_smallest, "the rows of class 0 are left out too",
                                          "the same in every batch"),
    "drop the batch's smallest label": (label_drop_smallest, "the rows of class 0 are left out too",
                                        "the same in every batch"),
    "labels > 0": (label_positive, "the rows of class 0 are left out too", "which label marks a row"),
    "labels < 4": (label_below_top, "the rows of class 4 are left out too", "which label marks a row"),
    "shift unless the batch holds class 4": (label_shift_unless_top, "the fix changes a batch that needs no fixing",
                                             "which labels a batch happens to hold"),
    "classes the batch shows": (label_columns_seen, "the fix changes a batch that needs no fixing",
                                "which labels a batch happens to hold"),
    "clamp": (lambda lo, la: F.cross_entropy(lo, la.clamp(min=0)), "train as class 0", "count in the loss at all"),
    "wrap": (lambda lo, la: F.cross_entropy(lo, la % C), "wraps around", "count in the loss at all"),
    "the batch's largest label": (label_batch_max, "train as class 4", "count in the loss at all"),
    "overwrite -1 by -100": (label_overwrite_ignore, "`labels` was changed in place", "leaves them as they were"),
    "overwrite -1 by 0": (label_overwrite_zero, "labels[2] was -1, is now 0", "leaves them as they were"),
    "mean over every row": (label_every_row_mean, "divided by every row", "the rows that count"),
    "sum": (lambda lo, la: F.cross_entropy(lo, la, ignore_index=-1, reduction="sum"), "not their mean",
            "is a mean"),
    "nll_loss on logits": (lambda lo, la: F.nll_loss(lo, la, ignore_index=-1), "expected", "which rows have a class"),
    "an extra column": (lambda lo, la: F.cross_entropy(F.pad(lo, (1, 0)), la + 1, ignore_index=0), "expected",
                        "which rows have a class"),
    "per-row losses": (lambda lo, la: F.cross_entropy(lo, la, ignore_index=-1, reduction="none"),
                       "expected a scalar loss tensor", "the mean loss"),
}


@pytest.mark.parametrize("name", LABEL_WRONG)
def test_label_loss_rejects(name: str) -> None:
    answer, message, hint = LABEL_WRONG[name]
    rejected(ex.check_label_loss(answer), message, hint, ("ignore_index", "!= UNLABELLED", "!= -1", ">= 0"))


def label_weighted(logits, labels):
    labelled = labels != ex.UNLABELLED
    per_row = F.cross_entropy(logits, labels.clamp(min=0), reduction="none")
    return (per_row * labelled).sum() / labelled.sum()


def label_only_when_present(logits, labels):  # a fix applied only to batches that hold -1: right, by design
    if (labels == ex.UNLABELLED).any():
        return F.cross_entropy(logits, labels, ignore_index=ex.UNLABELLED)
    return F.cross_entropy(logits, labels)


def label_nonzero(logits, labels):  # one labelled row gives a 0-d index: cross_entropy takes an unbatched row
    rows = (labels != ex.UNLABELLED).nonzero().squeeze()
    return F.cross_entropy(logits[rows], labels[rows])


@pytest.mark.parametrize("answer", [
    notebook_solution(STEM, "label_loss", {"UNLABELLED": ex.UNLABELLED}),
    lambda logits, labels: F.cross_entropy(logits[labels >= 0], labels[labels >= 0]),
    lambda logits, labels: F.nll_loss(F.log_softmax(logits, dim=1), labels, ignore_index=-1),
    label_weighted, label_only_when_present, label_nonzero,
], ids=["notebook", "mask", "nll_loss", "weighted sum", "only when present", "nonzero rows"])
def test_label_loss_accepts(answer: Callable[..., Any]) -> None:
    verdict = ex.check_label_loss(answer)
    assert verdict, verdict


def test_label_cases_tell_batch_dependent_answers_apart() -> None:
    """The checker's batches differ in what they hold: with and without -1, with and without classes 0 and 4."""
    held = [set(labels.tolist()) for _, labels in ex._label_cases().values()]
    assert any(-1 not in h for h in held) and any(-1 in h for h in held)
    assert any(-1 in h and 0 not in h and C - 1 not in h for h in held)
    assert any(0 in h and -1 not in h for h in held) and any(C - 1 in h for h in held)


# --- exercise 3: stable_loss ----------------------------------------------------------------------------------

def _rows(t):
    return torch.arange(len(t))


def stable_float64(logits, target):
    return ex.broken_stable_loss(logits.double(), target).float()


def stable_row_max(logits, target):
    z = logits - logits.max(dim=1, keepdim=True).values
    p = z.exp() / z.exp().sum(dim=1, keepdim=True)
    return -torch.log(p[_rows(target), target]).mean()


def stable_row_max_float64(logits, target):
    return stable_row_max(logits.double(), target).float()


def stable_log_of_softmax(logits, target):
    return -torch.log(torch.softmax(logits, dim=1)[_rows(target), target]).mean()


def stable_global_max(logits, target):
    return ex.broken_stable_loss(logits - logits.max(), target)


def stable_clamp_float64(logits, target):  # inside float64's range: exp no longer overflows, but the values move
    return ex.broken_stable_loss(logits.double().clamp(-700, 700), target).float()


def stable_clamp_200_float64(logits, target):  # right for logits up to 200, the exercise's first wording
    return ex.broken_stable_loss(logits.double().clamp(max=200), target).float()


def stable_clamp_at_limit(logits, target):  # exactly at float32's limit, 88.72
    return ex.broken_stable_loss(logits.clamp(max=ex.EXP_LIMIT[torch.float32]), target)


def stable_epsilon(logits, target):
    return -torch.log(torch.softmax(logits, dim=1)[_rows(target), target] + 1e-12).mean()


def stable_nan_to_num(logits, target):
    return torch.nan_to_num(ex.broken_stable_loss(logits, target), nan=0.0, posinf=0.0)


def stable_in_place(logits, target):
    logits -= logits.max(dim=1, keepdim=True).values
    return -torch.log_softmax(logits, dim=1)[_rows(target), target].mean()


def stable_four_rows(logits, target):  # written for the first batch's size
    return -torch.log_softmax(logits, dim=1)[torch.arange(4), target].mean()


def stable_sum(logits, target):
    return -torch.log_softmax(logits, dim=1)[_rows(target), target].sum()


def stable_per_row(logits, target):
    return -torch.log_softmax(logits, dim=1)[_rows(target), target]


def stable_detached_max(logits, target):  # the shift through .item(): the graph is cut
    shift = logits.detach().max().item()
    return -torch.log_softmax(logits - shift, dim=1)[_rows(target), target].detach().mean()


def stable_shift_by_target(logits, target):  # every exponent <= 0 only in the target's row... no: overflows
    z = logits - logits[_rows(target), target][:, None]
    return torch.log(z.exp().sum(dim=1)).mean()


def stable_shift_by_min(logits, target):
    z = logits - logits.min(dim=1, keepdim=True).values
    return (torch.log(z.exp().sum(dim=1)) - z[_rows(target), target]).mean()


def stable_shift_by_mean(logits, target):
    z = logits - logits.mean(dim=1, keepdim=True)
    return (torch.log(z.exp().sum(dim=1)) - z[_rows(target), target]).mean()


def stable_log1p(logits, target):  # log(1 + Σ_{j≠t} e^(x_j - x_t)): the others' exps overflow
    z = logits - logits[_rows(target), target][:, None]
    others = z.exp().sum(dim=1) - 1
    return torch.log1p(others).mean()


def stable_rescaled(logits, target):  # the logits divided by their largest size: small, but another softmax
    return ex.broken_stable_loss(logits / logits.abs().max().clamp_min(1.0), target)


STABLE_WRONG = {
    "shift by the target's logit": (stable_shift_by_target, "an exp overflowed, not underflowed",
                                    "exp of a large positive number overflows"),
    "shift by the row's min": (stable_shift_by_min, "an exp overflowed, not underflowed: exp(", "at most 0"),
    "shift by the row's mean": (stable_shift_by_mean, "what was subtracted leaves some exponents large", "at most 0"),
    "log1p form": (stable_log1p, "an exp overflowed, not underflowed", "overflows to inf"),
    "rescaled by the largest logit": (stable_rescaled, "The logits were divided by", "rescaling"),
    "as given": (ex.broken_stable_loss, "on logits up to 200 the loss is nan", "torch.isfinite"),
    "float64": (stable_float64, "computed in float64, exp overflows above 709.78", "depend on how large"),
    "row max, then log(p)": (stable_row_max, "cures the overflow, not this underflow", "only its log"),
    "row max in float64": (stable_row_max_float64, "which is 0 in float64", "only its log"),
    "log of softmax": (stable_log_of_softmax, "log(0) = -inf", "only its log"),
    "global max": (stable_global_max, "the loss is inf", "only its log"),
    "clamp in float64": (stable_clamp_float64, "clamp moves it too", "only its log"),
    "clamp at 200, in float64": (stable_clamp_200_float64, "clamp changes the logits", "clamping the logits"),
    "clamp at exactly 88.72": (stable_clamp_at_limit, "clamp keeps each exp just inside", "torch.isfinite"),
    "epsilon in the log": (stable_epsilon, "The 1e-12 added to a probability", "adding an epsilon"),
    "nan_to_num": (stable_nan_to_num, "gradient is not", "a finite value can hide an inf"),
    "logits -= max": (stable_in_place, "`logits` was changed in place", "leaves them as they were"),
    "torch.arange(4)": (stable_four_rows, "3 rows of 4 logits", "a batch of another size"),
    "sum": (stable_sum, "the sum over the batch, not the mean", "a mean over the batch"),
    "per-row losses": (stable_per_row, "expected the batch's mean loss", "a mean over the batch"),
    "through .item() and detach()": (stable_detached_max, "the backward of stable_loss raised", "a gradient"),
}


@pytest.mark.parametrize("name", STABLE_WRONG)
def test_stable_loss_rejects(name: str) -> None:
    answer, message, hint = STABLE_WRONG[name]
    rejected(ex.check_stable_loss(answer), message, hint, ("log_softmax", "logsumexp", "cross_entropy"))


def test_stable_loss_blames_a_clamp_only_where_it_bites() -> None:
    """A clamp_min that changed no value is not the mistake; an underflow is not told as an overflow."""
    rescaled = ex.check_stable_loss(stable_rescaled)
    assert "clamp_min" not in rescaled.message, rescaled.message
    assert "overflowed" not in ex.check_stable_loss(stable_row_max).message


def stable_logsumexp(logits, target):
    return (torch.logsumexp(logits, dim=1) - logits.gather(1, target[:, None]).squeeze(1)).mean()


def stable_by_hand(logits, target):  # the shift inside the log: log Σ exp(x - m) + m
    m = logits.max(dim=1, keepdim=True).values.detach()
    log_p = logits - m - (logits - m).exp().sum(dim=1, keepdim=True).log()
    return -log_p.gather(1, target[:, None]).mean()


def stable_small_logits_as_before(logits, target):  # the old loss where it is exact, the stable one elsewhere
    if logits.abs().max() < 80:
        return ex.broken_stable_loss(logits, target)
    return F.nll_loss(F.log_softmax(logits, dim=1), target)


@pytest.mark.parametrize("answer", [
    notebook_solution(STEM, "stable_loss"), lambda logits, target: F.cross_entropy(logits, target),
    stable_logsumexp, stable_by_hand, stable_small_logits_as_before,
    lambda logits, target: -F.log_softmax(logits.double(), dim=1)[_rows(target), target].mean().float(),
    lambda logits, target: F.cross_entropy(logits.double(), target),
    lambda logits, target: stable_logsumexp(logits.double(), target),
], ids=["notebook", "cross_entropy", "logsumexp", "by hand", "old loss below 80", "log_softmax in float64",
        "cross_entropy in float64", "logsumexp in float64"])
def test_stable_loss_accepts(answer: Callable[..., Any]) -> None:
    verdict = ex.check_stable_loss(answer)
    assert verdict, verdict


def test_stable_cases_go_past_float64() -> None:
    """The largest logits are beyond float64's exp, and a target lies further below its row's largest logit than
    float64's exp can reach (e^-745): a half-fix that only moves the limit fails."""
    largest = max(logits.abs().max().item() for logits, _ in ex._stable_cases().values())
    cases = ex._stable_cases().values()
    gap = max((logits.amax(1) - logits[torch.arange(len(t)), t]).max().item() for logits, t in cases)
    assert largest > ex.EXP_LIMIT[torch.float64] and gap > 745
    assert ex.EXP_LIMIT[torch.float64] == pytest.approx(709.78, abs=0.01)
    assert torch.isinf(torch.exp(torch.tensor(ex.EXP_LIMIT[torch.float32] + 0.01)))


# --- exercise 4: histogram ------------------------------------------------------------------------------------

def hist_overwrite(ids, bins):
    counts = torch.zeros(bins)
    counts[ids] = 1.0
    return counts


def hist_plus_equals(ids, bins):  # += through an index reads once per distinct id too
    counts = torch.zeros(bins)
    counts[ids] += 1
    return counts


def hist_switch_off(ids, bins):
    torch.use_deterministic_algorithms(False)
    return torch.bincount(ids, minlength=bins).float()


def hist_warn_only(ids, bins):
    torch.use_deterministic_algorithms(True, warn_only=True)
    return torch.bincount(ids, minlength=bins).float()


def hist_sorted_in_place(ids, bins):  # counts runs of a sorted copy... sorted into the caller's tensor
    ids.copy_(ids.sort().values)
    values, runs = torch.unique_consecutive(ids, return_counts=True)
    return torch.zeros(bins).index_add_(0, values, runs.float())


def hist_last_bin_missed(ids, bins):  # < where <= was meant: the id on the last bin is not counted
    return torch.bincount(ids[ids < bins - 1], minlength=bins).float()


def hist_toggled(ids, bins):  # the setting off for one line, then back on
    torch.use_deterministic_algorithms(False)
    counts = torch.zeros(bins).put_(ids, torch.ones(len(ids)), accumulate=True)
    torch.use_deterministic_algorithms(True)
    return counts


def hist_numpy(ids, bins):
    import numpy as np
    return torch.from_numpy(np.bincount(ids.numpy(), minlength=bins)).float()


HIST_WRONG = {
    "determinism off around put_": (hist_toggled, "switches deterministic algorithms off (or to warnings only) around "
                                    "put_, and back on", "even for one line"),
    "index_add_ into torch.zeros(bins)": (lambda ids, bins: torch.zeros(bins).index_add_(0, ids, torch.ones(len(ids))),
                                          "a tensor made on the CPU", "where the ids live"),
    "scatter_add_ into torch.zeros(bins)": (
        lambda ids, bins: torch.zeros(bins).scatter_add_(0, ids, torch.ones(len(ids))),
        "histogram returned counts on cpu", "where the ids live"),
    "comparison with torch.arange(bins)": (lambda ids, bins: (ids[:, None] == torch.arange(bins)).sum(0),
                                           "a tensor made on the CPU", "where the ids live"),
    "torch.histogram": (lambda ids, bins: torch.histogram(ids.float(), bins=bins, range=(0.0, float(bins))).hist,
                        "torch.histogram has a CPU implementation only (no CUDA kernel)", "a kernel for that device"),
    "np.bincount": (hist_numpy, "NumPy", "its values must stay there"),
    "as given": (ex.broken_histogram, "put_ does not have a deterministic implementation", "the message names"),
    "counts[ids] = 1": (hist_overwrite, "overwrites", "adds repeated ids up"),
    "counts[ids] += 1": (hist_plus_equals, "overwrites", "adds repeated ids up"),
    "switch determinism off": (hist_switch_off, "switched deterministic algorithms off", "keep the setting"),
    "warn_only": (hist_warn_only, "warnings only", "keep the setting"),
    "put_ with accumulate": (lambda ids, bins: torch.zeros(bins).put_(ids, torch.ones(len(ids)), accumulate=True),
                             "put_ as called here raises on a CUDA tensor", "on each device"),
    "histc": (lambda ids, bins: torch.histc(ids.float(), bins=bins, min=0, max=bins - 1), "histc as called here",
              "on each device"),
    "bincount with weights": (lambda ids, bins: torch.bincount(ids, weights=torch.ones(len(ids)), minlength=bins),
                              "bincount as called here", "on each device"),
    "cumsum of one-hots": (lambda ids, bins: F.one_hot(ids, bins).float().cumsum(0)[-1], "cumsum as called here",
                           "on each device"),
    "sized by the largest id": (lambda ids, bins: torch.bincount(ids).float(), "leave the last bins empty",
                                "need not reach the last bin"),
    "sized for 10 bins": (lambda ids, bins: torch.bincount(ids, minlength=10).float(),
                          "expected a tensor of 13 counts (bins=13), got (10,)", "the caller asks for"),
    "one_hot without num_classes": (lambda ids, bins: F.one_hot(ids).sum(0).float(), "got (6,)",
                                    "the caller asks for"),
    "ids sorted in place": (hist_sorted_in_place, "`ids` was changed in place", "leaves it as it was"),
    "the last bin missed": (hist_last_bin_missed, "expected [", "once per occurrence"),
}


@pytest.mark.parametrize("name", HIST_WRONG)
def test_histogram_rejects(name: str) -> None:
    answer, message, hint = HIST_WRONG[name]
    try:
        rejected(ex.check_histogram(answer), message, hint, ("bincount(", "minlength", "index_add", "scatter_add",
                                                            "device=ids.device"))
        assert not torch.are_deterministic_algorithms_enabled(), "the checker restores the setting"
    finally:
        torch.use_deterministic_algorithms(False)


def hist_unique(ids, bins):
    values, counts = torch.unique(ids, return_counts=True)
    out = torch.zeros(bins, device=ids.device)
    out[values] = counts.float()  # each id once: nothing to overwrite
    return out


@pytest.mark.parametrize("answer", [
    notebook_solution(STEM, "histogram"),
    lambda ids, bins: torch.zeros(bins, device=ids.device).index_add_(0, ids, torch.ones(len(ids), device=ids.device)),
    lambda ids, bins: ids.new_zeros(bins, dtype=torch.float).scatter_add_(0, ids, torch.ones_like(ids, dtype=torch.float)),
    lambda ids, bins: (ids[:, None] == torch.arange(bins, device=ids.device)).sum(0),
    lambda ids, bins: F.one_hot(ids, bins).sum(0).float(),
    hist_unique,
], ids=["notebook", "index_add_", "scatter_add_", "comparison", "one_hot", "unique"])
def test_histogram_accepts(answer: Callable[..., Any]) -> None:
    verdict = ex.check_histogram(answer)
    assert verdict, verdict
    assert not torch.are_deterministic_algorithms_enabled()


def test_the_meta_run_matches_the_installed_kernels() -> None:
    """What the meta run assumes, checked against this PyTorch: the operations it replays (their output's size
    depends on values) have a CUDA kernel and no meta one; torch.histogram has a CPU kernel only."""
    import os
    ops = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "ops")
    if not os.path.isdir(ops):
        pytest.skip("this PyTorch has no ATen headers installed")
    for name in ("bincount", "_unique2", "unique_consecutive", "unique_dim", "nonzero", "masked_select"):
        assert os.path.exists(os.path.join(ops, f"{name}_cuda_dispatch.h")), name
    assert os.path.exists(os.path.join(ops, "histogram_cpu_dispatch.h"))
    assert not os.path.exists(os.path.join(ops, "histogram_cuda_dispatch.h"))
    with pytest.raises(NotImplementedError, match="aten::bincount"):
        torch.bincount(torch.zeros(3, dtype=torch.long, device="meta"))
    with pytest.raises(NotImplementedError, match="aten::histogram"):
        torch.histogram(torch.zeros(3, device="meta"), bins=2)


# --- the two steps ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["predict", "label_loss", "stable_loss", "histogram"])
def test_a_second_failure_shows_the_closer_hint(name: str) -> None:
    """The notebook's stub fails with the concept only; failing again (or %hint) adds the closer hint."""
    checker, broken = getattr(ex, f"check_{name}"), getattr(ex, f"broken_{name}")
    first = checker(broken)
    assert not first and "Closer hint" not in str(first) and "%hint" in str(first)
    second = checker(broken)
    assert str(second).splitlines()[-1] == f"  Closer hint: {second.closer}"
    assert exercises.last_failure() == second.closer_hint()


def test_not_a_function() -> None:
    for checker in (ex.check_predict, ex.check_label_loss, ex.check_stable_loss, ex.check_histogram):
        verdict = checker(42)
        assert not verdict and "expected a function, got int" in verdict.message
        assert "without calling it" in verdict.hint


def test_predict_names_log_probabilities_and_one_hot_rows() -> None:
    """A third student run: log-probabilities were told "the softmax runs over the wrong dimension", one-hot rows
    "is dropout still dropping"."""
    def predict_with(make_rows):
        def predict(model, batches):
            was = model.training
            model.eval()
            try:
                with torch.no_grad():
                    return torch.cat([make_rows(model(x)) for x in batches])
            finally:
                model.train(was)
        return predict

    verdict = ex.check_predict(predict_with(lambda out: torch.log_softmax(out, dim=1)))
    assert not verdict and "log-probabilities" in verdict.message and "log_softmax" not in verdict.hint
    one_hot = predict_with(lambda out: F.one_hot(out.argmax(1), out.shape[1]).float())
    verdict = ex.check_predict(one_hot)
    assert not verdict and "one-hot" in verdict.message


# --- the checkers' first tests (from tests/test_when_it_breaks.py) --------------------------------------------

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


# --- notebook-wide: what notebooks 03 and 09 say of PyTorch (from tests/test_when_it_breaks.py) ---------------

def test_deterministic_mode_no_longer_documents_cublas_workspace_config():
    """Notebooks 03 and 09 say: up to PyTorch 2.9 deterministic mode required CUBLAS_WORKSPACE_CONFIG, and from
    2.10 on neither the check nor its mention in the docstring remains (pytorch/pytorch#161749)."""
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    mentions = "CUBLAS_WORKSPACE_CONFIG" in (torch.use_deterministic_algorithms.__doc__ or "")
    assert mentions == (version < (2, 10)), f"PyTorch {torch.__version__}: the docstring mentions it: {mentions}"
