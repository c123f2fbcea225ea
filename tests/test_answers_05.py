"""A catalogue of answers to notebook 05's exercises (course_utils.exercises.distributed_data_parallel), as a
class would write them: plausible wrong answers, each rejected with a message that names its mistake and a hint
that names the concept (never the solution's line), and right answers written differently from the notebook's
solution, each accepted.

The gradient checker runs answers in gloo processes; its catalogue is graded together (one launch on 2
processes, one on 3, for all the answers), and only the notebook's own stub and solution go through the
checker's public entry one by one."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from answers_helpers import cell, cell_defs, define, rejected
from conftest import notebook_solution

from course_utils.exercises import Verdict
from course_utils.exercises import distributed_data_parallel as ddp

NB05 = "05_distributed_data_parallel"


# ================================================================ 05, exercise 1: ranks and world size

RIGHT_TOPOLOGY = {"world_size": 8, "rank": 6, "local_rank": 2, "local_world_size": 4}


def test_topology_the_notebooks_stub_and_solution() -> None:
    namespace: dict[str, Any] = {"check_topology": lambda a: a}
    exec(cell(NB05, "ebe7c96e").replace("#@title", "#"), namespace)  # the solution cell fills in `answer`
    assert ddp.check_topology(namespace["answer"])
    right = ddp.check_topology(namespace["answer"])
    assert not re.search(r"\b[68]\b", right.message), f"the solution's output prints the answers: {right}"
    stub = ddp.check_topology({k: None for k in RIGHT_TOPOLOGY})
    rejected(stub, "world_size, rank, local_rank, local_world_size are still None", "§1's table", closer=False)


@pytest.mark.parametrize(("change", "message", "hint"), [
    ({"rank": 10}, "nodes count from 1", "§4, 'Several nodes'"),  # node 1 taken as the first node
    ({"rank": 2}, "2 is the local rank", "rendezvous number the processes"),  # the local rank again
    ({"world_size": 4}, "4 is the number of processes on one node", "every process of the job"),
    ({"local_world_size": 8}, "8 is the whole job", "'Local' means 'on this node'"),
    ({"world_size": 2, "rank": 3}, "2 is the number of nodes", "every process of the job"),  # nodes, not processes
    ({"local_rank": 6}, "6 is the rank in the whole job", "number on its own node"),
])
def test_topology_wrong_values(change: dict[str, int], message: str, hint: str) -> None:
    verdict = ddp.check_topology({**RIGHT_TOPOLOGY, **change})
    rejected(verdict, message, hint, solution_bits=("× nproc_per_node +", "= 6", "= 8"))
    if len(change) > 1:
        assert "Not right either: rank" in verdict.message


def test_topology_wrong_forms() -> None:
    rejected(ddp.check_topology([8, 6, 2, 4]), "got a list", "Fill in the dict", closer=False)  # type: ignore[arg-type]
    rejected(ddp.check_topology({"world_size": 8, "rank": 6, "local_rank": 2}), "has no local_world_size",
             "Keep all four keys", closer=False)
    rejected(ddp.check_topology({**RIGHT_TOPOLOGY, "rank": "six"}), "'six', not a number", "as a number",
             closer=False)
    rejected(ddp.check_topology({**RIGHT_TOPOLOGY, "local_rank": True}), "True, not a number", "as a number",
             closer=False)


@pytest.mark.parametrize("answer", [
    {"world_size": "8", "rank": "6", "local_rank": "2", "local_world_size": "4"},  # torchrun's env: strings
    {"world_size": 8.0, "rank": 6.0, "local_rank": 2, "local_world_size": 4},  # floats exactly on the value
    {**RIGHT_TOPOLOGY, "node_rank": 1, "nnodes": 2},  # more keys than asked
    dict(reversed(list({"world_size": 2 * 4, "rank": 1 * 4 + 2, "local_rank": 2, "local_world_size": 4}.items()))),
])
def test_topology_right_answers_written_differently(answer: dict[str, Any]) -> None:
    assert ddp.check_topology(answer)


# ================================================================ 05, exercise 2: average_gradients

def _avg(body: str) -> str:
    return "def average_gradients(model):\n" + "".join(f"    {line}\n" for line in body.strip().splitlines())


WRONG_AVERAGES = {  # answer -> (a substring of the message, of the hint)
    "sum only": (_avg("for p in model.parameters():\n    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)"),
                 "2× the average: the sum over the 2 ranks", "what turns a sum"),
    "reduced a copy": (_avg("for p in model.parameters():\n    g = p.grad.clone()\n    dist.all_reduce(g)\n"
                            "    g /= dist.get_world_size()"),
                       "only its own gradient: nothing was exchanged", "works in place"),
    "assigned all_reduce's result": (_avg("for p in model.parameters():\n    p.grad = dist.all_reduce(p.grad)\n"),
                                     "p.grad is None for 4 of the model's 4 parameters",
                                     "What does assigning its result"),
    "divides by a fixed 2": (_avg("for p in model.parameters():\n    dist.all_reduce(p.grad)\n    p.grad /= 2"),
                             "right on 2 processes, but on 3: the gradients are 1.5× the average",
                             "does it assume 2"),
    "broadcast": (_avg("for p in model.parameters():\n    dist.broadcast(p.grad, src=0)"),
                  "every rank now holds rank 0's gradient", "broadcast copies one rank's tensor"),
    "reduce to rank 0": (_avg("for p in model.parameters():\n    dist.reduce(p.grad, dst=0)\n"
                              "    p.grad /= dist.get_world_size()"),
                         "rank 0 has the average, rank 1 has not", "every rank needs the average"),
    "divides only": (_avg("for p in model.parameters():\n    p.grad /= dist.get_world_size()"),
                     "its own gradient / 2: divided, but not exchanged", "which collective brings them"),
    "all-reduced the weights": (_avg("for p in model.parameters():\n    dist.all_reduce(p.data)\n"
                                     "    p.grad /= dist.get_world_size()"),
                                "changed the parameters (the weights)", "what backward() computed"),
    "a notebook global": (_avg("for p in model.parameters():\n    dist.all_reduce(p.grad)\n    p.grad /= WORLD"),
                          "NameError: name 'WORLD' is not defined", "only your function's source"),
    "divided twice": (_avg("n = dist.get_world_size()\nfor p in model.parameters():\n    p.grad /= n\n"
                           "    dist.all_reduce(p.grad)\n    p.grad /= n"),
                      "1/2 of the average", "Count the divisions"),
}
RIGHT_AVERAGES = {
    "divide first, then sum": _avg("for p in model.parameters():\n    p.grad.div_(dist.get_world_size())\n"
                                   "    dist.all_reduce(p.grad)"),
    "one flat buffer, as DDP's buckets": _avg(
        "grads = [p.grad for p in model.parameters()]\nflat = torch.cat([g.flatten() for g in grads])\n"
        "dist.all_reduce(flat)\nflat /= dist.get_world_size()\nstart = 0\nfor g in grads:\n"
        "    g.copy_(flat[start:start + g.numel()].view_as(g))\n    start += g.numel()"),
    "ReduceOp.AVG (gloo has it too)": _avg("for p in model.parameters():\n"
                                           "    dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)"),
    "async, world size from torchrun's environment": _avg(
        "import os\nn = int(os.environ['WORLD_SIZE'])\n"
        "handles = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]\n"
        "for h in handles:\n    h.wait()\nfor p in model.parameters():\n    p.grad = p.grad / n"),
    "all_gather, then the mean": _avg(
        "for p in model.parameters():\n    parts = [torch.empty_like(p.grad) for _ in range(dist.get_world_size())]\n"
        "    dist.all_gather(parts, p.grad)\n    p.grad = torch.stack(parts).mean(dim=0)"),
}


@pytest.fixture(scope="module")
def graded_averages() -> dict[str, Verdict]:
    """Every catalogued answer, graded together: one launch on 2 processes, one on 3."""
    names = list(WRONG_AVERAGES) + list(RIGHT_AVERAGES)
    sources = [WRONG_AVERAGES[n][0] for n in WRONG_AVERAGES] + list(RIGHT_AVERAGES.values())
    return dict(zip(names, ddp._grade_answers([(s, "average_gradients") for s in sources]), strict=True))


@pytest.mark.parametrize("name", WRONG_AVERAGES)
def test_average_gradients_wrong_answers(graded_averages: dict[str, Verdict], name: str) -> None:
    _, message, hint = WRONG_AVERAGES[name]
    rejected(graded_averages[name], message, hint, solution_bits=("get_world_size()", "all_reduce(p.grad"))


@pytest.mark.parametrize("name", RIGHT_AVERAGES)
def test_average_gradients_right_answers_written_differently(graded_averages: dict[str, Verdict],
                                                             name: str) -> None:
    assert graded_averages[name], graded_averages[name]


def test_average_gradients_the_notebooks_stub_and_solution() -> None:
    """Through the checker's entry, as the notebook calls it: the stub fails at its first step, the solution
    passes on 2 and on 3 processes."""
    solution = "\n".join(line for line in cell(NB05, "01f11b63").splitlines() if not line.startswith("check_"))
    verdict = ddp.check_average_gradients(define(solution, "average_gradients"))
    assert verdict and "on 2 and on 3 processes" in verdict.message, verdict
    stub = ddp.check_average_gradients(define(cell_defs(NB05, "eddc8adf", "average_gradients"),
                                              "average_gradients"))
    rejected(stub, "only its own gradient: nothing was exchanged", "works in place",
             solution_bits=("all_reduce(p.grad",))


def test_average_gradients_answers_that_cannot_be_sent() -> None:
    rejected(ddp.check_average_gradients(lambda model: None), "a lambda", "with def", closer=False)
    rejected(ddp.check_average_gradients("average_gradients"), "got str", "the function itself", closer=False)
    namespace: dict[str, Any] = {}
    exec("def average_gradients(model):\n    pass\n", namespace)  # no source anywhere
    rejected(ddp.check_average_gradients(namespace["average_gradients"]), "cannot read the source", "with def",
             closer=False)


# ================================================================ 05, exercise 3: epoch orders

def stub_orders(sampler, epochs):  # type: ignore[no-untyped-def]
    namespace: dict[str, Any] = {}
    exec(cell_defs(NB05, "c65e78c0", "epoch_orders"), namespace)
    return namespace["epoch_orders"](sampler, epochs)


def set_epoch_after(sampler, epochs):  # type: ignore[no-untyped-def]
    orders = []
    for epoch in range(epochs):
        orders.append(list(sampler))
        sampler.set_epoch(epoch)
    return orders


def epochs_from_one(sampler, epochs):  # type: ignore[no-untyped-def]
    orders = []
    for epoch in range(1, epochs + 1):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders


def three_epochs(sampler, epochs):  # type: ignore[no-untyped-def]  # the demo's range(3): the test's size only
    orders = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders


def seed_as_epoch(sampler, epochs):  # type: ignore[no-untyped-def]  # right only while the seed is 0
    orders = []
    for epoch in range(epochs):
        sampler.seed = epoch
        orders.append(list(sampler))
    return orders


def random_shuffle(sampler, epochs):  # type: ignore[no-untyped-def]
    orders = []
    for _ in range(epochs):
        order = list(sampler)
        random.shuffle(order)
        orders.append(order)
    return orders


def randperm_of_everything(sampler, epochs):  # type: ignore[no-untyped-def]
    return [torch.randperm(len(sampler.dataset)).tolist() for _ in range(epochs)]


def randperm_of_the_share(sampler, epochs):  # type: ignore[no-untyped-def]
    n, size = sampler.num_replicas, len(sampler.dataset)
    return [torch.randperm(size)[sampler.rank::n].tolist() for _ in range(epochs)]


def nothing_returned(sampler, epochs):  # type: ignore[no-untyped-def]
    for epoch in range(epochs):
        sampler.set_epoch(epoch)


@pytest.mark.parametrize(("fn", "message", "hint"), [
    (stub_orders, "every epoch still sees the same order", "seed its shuffle with"),
    (set_epoch_after, "the first two epochs have the same order", "when must it know the epoch"),
    (epochs_from_one, "orders of epochs 1, 2, 3", "The loop's epochs are 0"),
    (three_epochs, "3 orders for 4 epochs", "any number of epochs"),
    (seed_as_epoch, "not for another one (10 items, 3 replicas, rank 1, seed 7", "any sampler"),
    (random_shuffle, "reorders the same 8 indices", "decided by the sampler's shuffle"),
    (randperm_of_everything, "has 16 indices; this rank's share of the 16 items is 8", "its own part"),
    (randperm_of_the_share, "two calls on two identical samplers gave different orders", "the same on every rank"),
    (nothing_returned, "returned None", "Return the list", ),
])
def test_epoch_orders_wrong_answers(fn: Callable[..., Any], message: str, hint: str) -> None:
    rejected(ddp.check_epoch_orders(fn), message, hint, solution_bits=("set_epoch(epoch)",),
             closer=fn is not nothing_returned)


def epoch_attribute(sampler, epochs):  # type: ignore[no-untyped-def]
    orders = []
    for epoch in range(epochs):
        sampler.epoch = epoch  # what set_epoch does
        orders.append(list(sampler))
    return orders


def one_comprehension(sampler, epochs):  # type: ignore[no-untyped-def]
    return [(sampler.set_epoch(e), [int(i) for i in sampler])[1] for e in range(epochs)]


def a_generator(sampler, epochs):  # type: ignore[no-untyped-def]
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        yield torch.tensor(list(sampler))  # tensors of indices count as lists


@pytest.mark.parametrize("fn", [epoch_attribute, one_comprehension, a_generator,
                                notebook_solution(NB05, "epoch_orders")])
def test_epoch_orders_right_answers(fn: Callable[..., Any]) -> None:
    assert ddp.check_epoch_orders(fn)


def test_check_topology() -> None:
    assert ddp.check_topology({"world_size": 8, "rank": 6, "local_rank": 2, "local_world_size": 4})
    v = ddp.check_topology({"world_size": 8, "rank": 10, "local_rank": 2, "local_world_size": 4})
    assert not v and "nodes count from 1" in v.message and "numbered from 0" in v.closer
    assert not ddp.check_topology({"world_size": 4, "rank": 6, "local_rank": 2, "local_world_size": 4})
    assert "no local_world_size" in ddp.check_topology({"world_size": 8, "rank": 6, "local_rank": 2}).message


def test_check_epoch_orders() -> None:
    def fixed(sampler, epochs):  # type: ignore[no-untyped-def]
        return [list(sampler) for _ in range(epochs)]

    def good(sampler, epochs):  # type: ignore[no-untyped-def]
        out = []
        for e in range(epochs):
            sampler.set_epoch(e)
            out.append(list(sampler))
        return out

    v = ddp.check_epoch_orders(fixed)
    assert not v and "same order" in v.message
    assert ddp.check_epoch_orders(good)


def average_gradients_ok(model):  # type: ignore[no-untyped-def]
    for p in model.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)  # noqa: F821 - the checker provides dist
        p.grad /= dist.get_world_size()  # noqa: F821


def average_gradients_sum_only(model):  # type: ignore[no-untyped-def]
    for p in model.parameters():
        dist.all_reduce(p.grad)  # noqa: F821


def average_gradients_nothing(model):  # type: ignore[no-untyped-def]
    for p in model.parameters():
        p.grad.clone()


def test_check_average_gradients() -> None:
    assert ddp.check_average_gradients(average_gradients_ok)
    v = ddp.check_average_gradients(average_gradients_sum_only)
    assert not v and "2× the average" in v.message
    v = ddp.check_average_gradients(average_gradients_nothing)
    assert not v and "only its own gradient" in v.message
