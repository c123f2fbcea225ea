"""Checkers for notebook 05 (DistributedDataParallel).

- `check_topology`: world size, global rank, local rank and local world size of one process in a job.
- `check_average_gradients`: a student's ``average_gradients(model)`` run for real on 2, then 3 processes.
- `check_epoch_orders`: a loop over epochs that must reshuffle (``set_epoch``).

How a function written in a notebook cell gets into other processes
-------------------------------------------------------------------
The checker must run ``average_gradients`` in fresh processes. Pickling the function would send only
its *name* (``__main__.average_gradients``), and a spawned or forkserver process has no notebook cells to
find it in: it fails with ``AttributeError: Can't get attribute 'average_gradients' on <module
'__main__'...>``. The fork start method would copy the notebook's memory, but it does not exist on
Windows, is no longer the default on macOS (and, from Python 3.14, on Linux), and forking a process
that runs threads (a Jupyter kernel does) can deadlock. So the checker sends the function's **source
code** (`inspect.getsource`, which works for cells because IPython keeps their text), and each worker
executes it in a fresh namespace that has ``torch``, ``dist`` (torch.distributed) and ``nn``. The
function must therefore be self-contained: it may use those names and what it imports itself.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..formatting import error_message
from . import Verdict, exercise, fail, ok

__all__ = ["check_average_gradients", "check_epoch_orders", "check_topology"]


# --- 1. ranks and world size ------------------------------------------------------------------------

_TOPOLOGY = {"world_size": 8, "rank": 6, "local_rank": 2, "local_world_size": 4}
_KNOWN_SLIPS = {  # (key, value) -> what that value is
    ("world_size", 4): "4 is the number of processes on one node",
    ("world_size", 2): "2 is the number of nodes, not of processes",
    ("world_size", 6): "6 is this process's rank",
    ("local_world_size", 8): "8 is the whole job, on both nodes",
    ("local_world_size", 2): "2 is the number of nodes",
    ("local_rank", 6): "6 is the rank in the whole job",
    ("local_rank", 1): "1 is the node's number, not the process's",
    ("rank", 10): "10 is what you get when nodes count from 1; node 1 is the second node",
    ("rank", 2): "2 is the local rank, the number on this node only",
    ("rank", 4): "4 is the first process of node 1: this one is further along",
    ("rank", 3): "3 counts node 1 as one process, not as 4",
}
_TOPOLOGY_HINTS = {
    "world_size": ("The world is every process of the job, on all its nodes (§1's table).",
                   "--nnodes and --nproc-per-node together say how many processes the job starts."),
    "local_world_size": ("'Local' means 'on this node': how many processes does one node run? (§1's table)",
                         "One torchrun per node starts --nproc-per-node processes."),
    "local_rank": ("The local rank is the process's number on its own node; the question gives it.",
                   "It is the number that picks the GPU: cuda:<local_rank>."),
    "rank": ("How does the rendezvous number the processes of several nodes? (§4, 'Several nodes')",
             "rank = node_rank × nproc_per_node + local_rank, with nodes numbered from 0."),
}


def _as_number(value: Any) -> Any:
    """A value as a number: torchrun's environment variables are strings ("8"), which count as given."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


@exercise
def check_topology(answer: dict[str, int]) -> Verdict:
    """2 nodes × 4 processes; the process with local rank 2 on node 1 (nodes count from 0).

    Values may be numbers or strings of digits (torchrun's environment variables are strings); other keys
    in the dict are ignored."""
    keys = sorted(_TOPOLOGY)
    if not isinstance(answer, dict):
        return fail(f"expected a dict with the keys {keys}, got a {type(answer).__name__}.",
                    "Fill in the dict the exercise cell starts with.")
    missing = [k for k in keys if k not in answer]
    if missing:
        return fail(f"the answer has no {', '.join(missing)}.",
                    f"Keep all four keys of the exercise's dict: {keys}.")
    unset = [k for k in _TOPOLOGY if answer[k] is None]
    if unset:
        return fail(f"{', '.join(unset)} {'is' if len(unset) == 1 else 'are'} still None.",
                    "Fill in a number for each key; §1's table says what each one counts.")
    values = {k: _as_number(answer[k]) for k in _TOPOLOGY}
    text = [k for k, v in values.items() if not isinstance(v, int | float) or isinstance(v, bool)]
    if text:
        return fail(f"{text[0]} is {answer[text[0]]!r}, not a number.", "Give each value as a number.")
    wrong = [k for k in ("world_size", "local_world_size", "local_rank", "rank") if values[k] != _TOPOLOGY[k]]
    if not wrong:
        return ok("all four are right: the world counts every process of the job, the local values count one "
                  "node, and the global rank counts the processes of the nodes before this one first.")
    key = wrong[0]
    value = values[key]
    slip = _KNOWN_SLIPS.get((key, value))
    message = f"{key} = {answer[key]!r} is not right" + (f": {slip}." if slip else ".")
    if len(wrong) > 1:
        message += f" (Not right either: {', '.join(wrong[1:])}.)"
    hint, closer = _TOPOLOGY_HINTS[key]
    return fail(message, hint, closer)


# --- 2. average_gradients on 2, then 3 processes ----------------------------------------------------

WORLD_SIZES = (2, 3)
"""The checker runs the function on 2 processes, then (if right there) on 3: a function that divides by a
fixed 2 is right only on 2."""
_BATCH = 12  # samples in the global batch: split evenly over 2 and over 3 ranks
_ATOL = 1e-6  # absolute tolerance of every gradient comparison (torch.allclose, with its rtol of 1e-5): the
# ranks' sums run in another order than one process's, so the last bits differ


def _source_of(fn: Callable[..., Any]) -> str:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise ValueError(f"cannot read the source of {fn!r} ({exc}); define it with `def` in a cell") from None


def _scale(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float | None:
    """``s`` such that every ``got`` tensor is ``s × ref`` (within the tolerance), else None."""
    dot = sum(float((g * r).sum()) for g, r in zip(got, ref, strict=True))
    norm = sum(float((r * r).sum()) for r in ref)
    if norm == 0.0:
        return None
    s = dot / norm
    if all(torch.allclose(g, r * s, atol=_ATOL) for g, r in zip(got, ref, strict=True)):
        return s
    return None


def _try_answer(source: str, name: str, rank: int, world_size: int) -> dict[str, Any]:
    """In one worker: run one answer after a local backward and describe the gradients it leaves."""
    from ..distributed.ddp_demos import global_batch, grads, local_slice, tiny_model

    x, y = global_batch(_BATCH)
    ref = tiny_model()
    nn.functional.mse_loss(ref(x), y).backward()
    want = grads(ref)
    own = []  # the gradient each rank computes on its own slice
    for r in range(world_size):
        m = tiny_model()
        nn.functional.mse_loss(m(local_slice(x, r, world_size)), local_slice(y, r, world_size)).backward()
        own.append(grads(m))

    model = tiny_model()
    nn.functional.mse_loss(model(local_slice(x, rank, world_size)),
                           local_slice(y, rank, world_size)).backward()
    before = [p.detach().clone() for p in model.parameters()]
    namespace: dict[str, Any] = {"torch": torch, "dist": dist, "nn": nn}
    try:
        exec(compile(source, f"<your {name}>", "exec"), namespace)
        namespace[name](model)
    except Exception as exc:
        return {"error": error_message(exc, first_line=True)}
    got = [p.grad for p in model.parameters()]
    none = sum(g is None for g in got)
    if none:
        return {"none": none, "of": len(got)}
    grads_now = [g for g in got if g is not None]
    scale = _scale(grads_now, want)
    return {"ok": all(torch.allclose(g, w, atol=_ATOL) for g, w in zip(grads_now, want, strict=True)),
            "scale": scale,
            "own_scale": _scale(grads_now, own[rank]),
            "rank0": rank != 0 and _near(_scale(grads_now, own[0]), 1.0),
            "params_changed": any(not torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before,
                                                                                   strict=True))}


def _run_answers(rank: int, world_size: int, answers: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Worker (runs in each process): every answer (source, function name) in turn, each on a new model."""
    return [_try_answer(source, name, rank, world_size) for source, name in answers]


def _near(x: float | None, target: float) -> bool:
    return x is not None and abs(x - target) < 1e-4


def _grade(world_size: int, ranks: list[dict[str, Any]]) -> Verdict | None:
    """The failing verdict for one answer's results on ``world_size`` processes (one dict per rank), or None
    when every rank has the whole-batch gradient."""
    n = world_size
    errors = [r["error"] for r in ranks if "error" in r]
    if errors:
        if "is not defined" in errors[0]:
            return fail(f"your function raised in the worker processes: {errors[0]}.",
                        "The worker processes get only your function's source, not the notebook's other "
                        "cells (§1: a new process does not share the notebook's memory).",
                        "Use only torch, dist and nn in it, or import or compute what else it needs inside it.")
        return fail(f"your function raised in the worker processes: {errors[0]}.",
                    "Run it in your head on one parameter: what is p.grad, and what does each call do to it? "
                    "(§2: all_reduce works on the tensor you give it, in place.)",
                    "The function receives the model after backward(); each parameter's gradient is p.grad.")
    nones = [r for r in ranks if "none" in r]
    if nones:
        return fail(f"after your function, p.grad is None for {nones[0]['none']} of the model's "
                    f"{nones[0]['of']} parameters: the gradients are gone.",
                    "A collective returns nothing useful: it changes the tensor you give it, in place (§2). "
                    "What does assigning its result to p.grad do?",
                    "Call dist.all_reduce(...) on its own line; keep p.grad the tensor it works on.")
    if all(r["ok"] for r in ranks):
        if any(r["params_changed"] for r in ranks):
            return fail("the gradients are right, but your function also changed the parameters themselves.",
                        "average_gradients runs between backward() and the optimizer's step: it must leave "
                        "the weights alone.")
        return None
    if any(r["params_changed"] for r in ranks):
        return fail("your function changed the parameters (the weights), and the gradients are not the "
                    "average: it all-reduced p or p.data instead of p.grad.",
                    "Which tensor holds what backward() computed for a parameter? (§2, 'Averaging "
                    "gradients')",
                    "Work on each parameter's .grad.")
    right = [i for i, r in enumerate(ranks) if r["ok"]]
    if right:
        others = [i for i in range(n) if i not in right]
        return fail(f"rank {', '.join(map(str, right))} has the average, rank {', '.join(map(str, others))} "
                    "has not: only some ranks got the result.",
                    "Every rank takes the same optimizer step, so every rank needs the average. Which of §2's "
                    "collectives leaves its result on every rank, and which on one rank only?",
                    "dist.reduce and dist.gather deliver to one rank; dist.all_reduce to all of them.")
    scales = [r["scale"] for r in ranks]
    if all(_near(s, n) for s in scales):
        return fail(f"the gradients are {n}× the average: the sum over the {n} ranks, not their mean.",
                    f"all_reduce(SUM) adds the {n} ranks' gradients: what turns a sum of {n} terms into "
                    "their mean? (§2, 'Averaging gradients')",
                    "Divide by the number of processes, which your function asks the process group for "
                    "(dist.get_world_size()): the checker runs it on 2 and on 3 processes.")
    if all(_near(s, 1.0 / n) for s in scales):
        return fail(f"the gradients are 1/{n} of the average: divided by the world size twice?",
                    "Count the divisions on the way from the ranks' gradients to their mean (§2, 'Averaging "
                    "gradients').",
                    "One division by the world size: before the all_reduce or after it, not both.")
    if all(s is not None for s in scales) and all(_near(s, scales[0]) for s in scales):
        return fail(f"the gradients are {scales[0]:.3g}× the average.",
                    "The mean over ranks is their sum divided by how many ranks there are (§2).",
                    "Ask the process group how many ranks there are: dist.get_world_size().")
    if all(_near(r["own_scale"], 1.0) for r in ranks):
        return fail("each rank still has only its own gradient: nothing was exchanged.",
                    "A collective works in place on the tensor you give it (§2: all_reduce replaces t on "
                    "every rank). Which tensor must that be, for the result to end up in p.grad?",
                    "Pass p.grad itself to dist.all_reduce: a copy (clone, a new variable, torch.cat of the "
                    "grads) is reduced and then lost, unless you copy it back.")
    if all(_near(r["own_scale"], 1.0 / n) for r in ranks):
        return fail(f"each rank's gradient is its own gradient / {n}: divided, but not exchanged.",
                    "The average needs the other ranks' gradients: which collective brings them? (§2)",
                    "dist.all_reduce(p.grad, ...) before the division.")
    if all(r["rank0"] or i == 0 for i, r in enumerate(ranks)) and _near(ranks[0]["own_scale"], 1.0):
        return fail("every rank now holds rank 0's gradient: the other ranks' gradients were dropped.",
                    "broadcast copies one rank's tensor to all; what you need combines all of them (§2).",
                    "dist.all_reduce sums every rank's tensor.")
    return fail("the gradients differ from those of one process on the whole batch (the average over ranks).",
                "After your function, every rank must hold the mean of all ranks' gradients (§2, 'Averaging "
                "gradients').",
                "For every parameter: the sum over ranks of p.grad, then divided by the number of ranks.")


def _grade_answers(answers: list[tuple[str, str]]) -> list[Verdict]:
    """Grade answers (source, function name) together: one launch per world size for all of them. An answer
    wrong on 2 processes is not run on 3."""
    from ..distributed.launch import WorkerError, launch

    verdicts: dict[int, Verdict] = {}
    for n in WORLD_SIZES:
        todo = [i for i in range(len(answers)) if i not in verdicts]
        if not todo:
            break
        try:
            results = launch(_run_answers, n, [answers[i] for i in todo], timeout=60, group_timeout=20)
        except WorkerError as exc:
            last = str(exc).strip().splitlines()[-1]
            stuck = fail(f"on {n} processes the workers did not finish: {last}",
                         "A collective returns when every rank has called it: do all ranks call the same "
                         "collectives, in the same order, with tensors of the same shape? (§6, 'A hung rank')")
            return [verdicts[i] if i in verdicts else stuck for i in range(len(answers))]
        for j, i in enumerate(todo):
            bad = _grade(n, [results[rank][j] for rank in range(n)])
            if bad is not None:
                if n != WORLD_SIZES[0]:
                    bad = fail(f"right on {WORLD_SIZES[0]} processes, but on {n}: {bad.message}",
                               "Your function must work for any number of processes; does it assume 2 "
                               "somewhere?",
                               "The number of processes comes from the process group: dist.get_world_size().")
                verdicts[i] = bad
    right = ok("on 2 and on 3 processes, every rank now has the gradient of the whole batch.")
    return [verdicts[i] if i in verdicts else right for i in range(len(answers))]


@exercise
def check_average_gradients(fn: Callable[..., Any]) -> Verdict:
    """Run ``fn(model)`` after a local backward on 2 processes, then on 3 (gloo, this machine).

    Correct when every rank then holds the gradient of the whole global batch (the mean over ranks), within
    ``torch.allclose(atol=1e-6)``, and the parameters themselves are unchanged. Answers are compared with the
    whole-batch gradient by their ratio to it (2× on 2 ranks: summed, not divided), with each rank's own
    gradient (nothing exchanged) and with rank 0's (a broadcast), to say which mistake was made.
    """
    if not callable(fn):
        return fail(f"expected your function average_gradients, got {type(fn).__name__}.",
                    "Pass the function itself: check_average_gradients(average_gradients).")
    if getattr(fn, "__name__", "") == "<lambda>":
        return fail("your answer is a lambda: the checker sends a function's source to the worker "
                    "processes, and a lambda's is the whole line around it.",
                    "Define average_gradients with def.")
    try:
        source = _source_of(fn)
    except ValueError as exc:
        return fail(str(exc), "Define average_gradients with def, in a notebook cell or a file.")
    return _grade_answers([(source, fn.__name__)])[0]


# --- 3. every epoch the same order ------------------------------------------------------------------

def _sampler(size: int, replicas: int, rank: int, seed: int) -> Any:
    from torch.utils.data import DistributedSampler

    # A list is data enough: the sampler only asks its len(), as in the notebook's cell.
    return DistributedSampler(list(range(size)), num_replicas=replicas, rank=rank,  # type: ignore[arg-type]
                              shuffle=True, seed=seed)


_NOTEBOOKS_SAMPLER = (16, 2, 0, 0)  # the exercise cell's: 16 items, 2 replicas, rank 0, seed 0
_OTHER_SAMPLER = (10, 3, 1, 7)  # another data set, number of ranks, rank and seed


def _orders(case: tuple[int, int, int, int], epochs: int, first_epoch: int = 0) -> list[list[int]]:
    sampler = _sampler(*case)
    out = []
    for epoch in range(first_epoch, first_epoch + epochs):
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def _call(fn: Callable[..., Any], case: tuple[int, int, int, int], epochs: int) -> list[list[int]] | Verdict:
    try:
        got = fn(_sampler(*case), epochs)
    except Exception as exc:
        return fail(f"your function raised {type(exc).__name__}: {exc}",
                    "It gets a DistributedSampler and a number of epochs; it returns one list of indices per "
                    "epoch.")
    if got is None:
        return fail("your function returned None.", "Return the list of orders, one per epoch.")
    try:
        return [[int(i) for i in order] for order in got]
    except TypeError:
        return fail(f"expected a list with one list of indices per epoch, got {type(got).__name__} "
                    "(or its items are not lists).",
                    "One list per epoch: the indices the sampler yields in that epoch.")


@exercise
def check_epoch_orders(fn: Callable[..., Any]) -> Verdict:
    """``fn(sampler, epochs)`` must return the list of indices the sampler yields in each epoch, epochs
    0 … epochs-1, as every rank of a job would see them (a new shuffle per epoch, the same on every rank).

    Tried on the exercise's sampler (16 items, 2 replicas, rank 0, seed 0) for 3 epochs, twice (the ranks
    must agree, so the orders must be the same on every call), and on another one (10 items, 3 replicas,
    rank 1, seed 7) for 4 epochs."""
    got = _call(fn, _NOTEBOOKS_SAMPLER, 3)
    if isinstance(got, Verdict):
        return got
    if len(got) != 3:
        return fail(f"asked for 3 epochs, got {len(got)} orders.", "One list per epoch: `epochs` of them.")
    length = len(_sampler(*_NOTEBOOKS_SAMPLER))
    if any(len(order) != length for order in got):
        return fail(f"an epoch's list has {len(next(o for o in got if len(o) != length))} indices; this rank's "
                    f"share of the 16 items is {length}.",
                    "Each rank gets its own part of the data set: the sampler yields only this rank's indices.",
                    "Take each epoch's indices from the sampler itself: list(sampler).")
    want = _orders(_NOTEBOOKS_SAMPLER, 3)
    if got == [want[0]] * 3:
        return fail("every epoch still sees the same order.",
                    "What does DistributedSampler seed its shuffle with, and which part of that changes from "
                    "one epoch to the next? (§3, point 2)",
                    "The sampler has a method that tells it the epoch; call it before taking that epoch's list.")
    if got == [want[0], want[0], want[1]]:
        return fail("the first two epochs have the same order, then each is one epoch late: the sampler "
                    "learns the epoch after that epoch's list was taken.",
                    "The sampler shuffles when you iterate it: when must it know the epoch?",
                    "Tell it the epoch first thing in the loop's body, then take list(sampler).")
    if got == _orders(_NOTEBOOKS_SAMPLER, 3, first_epoch=1):
        return fail("your epochs get the orders of epochs 1, 2, 3: the epoch numbers are shifted by one.",
                    "The loop's epochs are 0 … epochs-1, and the sampler must hear the same number (a job "
                    "resumed at epoch k must see epoch k's order again).",
                    "Give the sampler the loop's own epoch number, unchanged.")
    again = _call(fn, _NOTEBOOKS_SAMPLER, 3)
    if again != got and all(sorted(order) == sorted(want[0]) for order in got):
        return fail("each epoch reorders the same 8 indices, differently on every call: this rank's share of "
                    "the data never changes, and no run can be repeated.",
                    "Which samples go to which rank is decided by the sampler's shuffle: what makes it change "
                    "from one epoch to the next, the same way on every rank? (§3, point 2)",
                    "Use the sampler's own shuffle (its seed and epoch), not random or torch.randperm.")
    if again != got:
        return fail("two calls on two identical samplers gave different orders: in a real job the ranks, each "
                    "shuffling on its own, would not agree, and their shares would overlap.",
                    "Every rank must compute the same shuffle without talking to the others: what makes "
                    "DistributedSampler's shuffle the same on every rank? (§3, point 2)",
                    "Use the sampler's own shuffle (its seed and epoch), not random or torch.randperm.")
    if got != want:
        return fail("the orders differ from what DistributedSampler yields in epochs 0, 1, 2.",
                    "Use the sampler's own shuffle, which every rank computes the same way (§3, point 2).",
                    "Tell the sampler the epoch, then take list(sampler).")
    other = _call(fn, _OTHER_SAMPLER, 4)
    if isinstance(other, Verdict) or other != _orders(_OTHER_SAMPLER, 4):
        seen = other.message if isinstance(other, Verdict) else (
            f"{len(other)} orders for 4 epochs" if len(other) != 4 else "other orders than the sampler's")
        return fail("right for the exercise's sampler, but not for another one (10 items, 3 replicas, rank 1, "
                    f"seed 7, 4 epochs): {seen}.",
                    "Your function must work for any sampler and any number of epochs: does it count on the "
                    "exercise's (3 epochs, seed 0)?",
                    "Loop over range(epochs), and change only the sampler's epoch (not its seed).")
    return ok("a new order each epoch, and every rank agrees on it (same seed + epoch).")
