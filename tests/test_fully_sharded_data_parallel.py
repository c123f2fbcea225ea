"""Notebook 08's memory model (parameter_count, activation_bytes, the ZeRO stages) and its exercise checkers.

The notebook's solution cells end in demos that read the results of its torchrun runs (``n_small``,
``reports``, ``PLAN_CASES``), and `plan` and `resume_on_one_process` use names other cells define, so
`conftest.notebook_solution`, which runs the whole cell, cannot build them: `conftest.notebook_functions`
takes only the ``def`` from the cell and runs it with the names it is given.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from conftest import notebook_functions
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.utils.checkpoint import checkpoint

from course_utils.exercises import Verdict
from course_utils.exercises import fully_sharded_data_parallel as ex
from course_utils.memory.accounting import saved_tensor_bytes
from course_utils.memory.planner import plan_memory
from course_utils.models import GPT, GPTConfig, token_batch

NB = "08_fully_sharded_data_parallel"
SMALL = GPTConfig(vocab=256, seq_len=64, d_model=64, n_heads=4, n_layers=2, batch=16)  # the notebook's SMALL
SHAPES = (
    GPTConfig(),
    GPTConfig(vocab=50, seq_len=12, d_model=24, n_heads=3, n_layers=3, batch=5),
    GPTConfig(vocab=256, seq_len=128, d_model=128, n_heads=4, n_layers=4, batch=8),  # the notebook's MID
    GPTConfig(vocab=50_304, seq_len=2048, d_model=4096, n_heads=32, n_layers=32, batch=8),
)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Any:
    """The small GPTs train faster on one thread; on a busy 2-core machine two threads wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- the notebook's own functions ----------------------------------------------------------------------------

def _section_one() -> dict[str, Callable[..., Any]]:
    """parameter_count and activation_bytes as section 1's cell defines them."""
    return notebook_functions(NB, ("parameter_count", "activation_bytes"))


def _solution(name: str, **names: Any) -> Callable[..., Any]:
    """The function ``name`` of the notebook's solution cell; ``names``: what it uses from other cells."""
    return notebook_functions(NB, (name,), {"torch": torch, **names}, tag="solution")[name]


def test_notebook_formulas_equal_the_checkers() -> None:
    nb = _section_one()
    for cfg in SHAPES:
        assert nb["parameter_count"](cfg) == ex.parameter_count(cfg), cfg
        assert nb["activation_bytes"](cfg) == ex.activation_bytes(cfg), cfg
        assert nb["activation_bytes"](cfg, checkpointed=True) == ex.activation_bytes(cfg, checkpointed=True), cfg
        assert nb["activation_bytes"](cfg, True) < nb["activation_bytes"](cfg)  # the flag is not ignored


# --- the reference memory model ----------------------------------------------------------------------------

def test_reference_per_rank_bytes_by_hand() -> None:
    # 100 parameters on 4 ranks: 400 B of weights, 400 B of gradients, 800 B of AdamW moments
    assert ex.reference_per_rank_bytes(100, 4, 0) == 1600  # nothing sharded
    assert ex.reference_per_rank_bytes(100, 4, 1) == 400 + 400 + 200  # the moments
    assert ex.reference_per_rank_bytes(100, 4, 2) == 400 + 100 + 200  # and the gradients
    assert ex.reference_per_rank_bytes(100, 4, 3) == 100 + 100 + 200  # and the weights
    assert ex.reference_per_rank_bytes(100, 1, 3) == 1600  # one rank holds everything at any stage


@pytest.mark.parametrize("cfg", SHAPES[:3], ids=["default", "tiny", "mid"])
def test_parameter_count_equals_a_real_gpt(cfg: GPTConfig) -> None:
    assert ex.parameter_count(cfg) == sum(p.numel() for p in GPT(cfg).parameters())


def _checkpointed_loss(model: GPT, tokens: torch.Tensor) -> torch.Tensor:
    """GPT.loss with each block checkpointed: it keeps its input and recomputes the rest in backward."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    x = model.tok(inputs) + model.pos(torch.arange(inputs.shape[1]))
    for block in model.blocks:
        x = checkpoint(block, x, use_reentrant=False)
    logits = model.head(model.norm(x))
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@pytest.mark.parametrize("cfg", SHAPES[1:3], ids=["tiny", "mid"])
def test_activation_bytes_equal_what_autograd_saves(cfg: GPTConfig) -> None:
    torch.manual_seed(0)
    model = GPT(cfg)
    tokens = token_batch(cfg, torch.Generator().manual_seed(0))
    _, plain = saved_tensor_bytes(lambda: model.loss(tokens), exclude=model)
    _, checkpointed = saved_tensor_bytes(lambda: _checkpointed_loss(model, tokens), exclude=model)
    assert ex.activation_bytes(cfg) == plain
    assert ex.activation_bytes(cfg, checkpointed=True) == checkpointed < plain


# --- 1. the fewest GPUs -----------------------------------------------------------------------------------

def test_fewest_gpus_reference_by_hand() -> None:
    # the ZeRO paper's 7.5 B parameters (2 + 2 + 12 bytes) on GPUs of 32 GB
    assert ex.reference_fewest_gpus(7_500_000_000, 32e9, 0) is None  # 120 GB whole on every GPU
    assert ex.reference_fewest_gpus(7_500_000_000, 32e9, 1) == 45  # 30 GB whole, then 90 GB / 45 = 2 GB
    assert ex.reference_fewest_gpus(7_500_000_000, 32e9, 2) == 7  # 15 GB whole, 105 GB / 7 = 15 GB
    assert ex.reference_fewest_gpus(7_500_000_000, 32e9, 3) == 4  # 120 GB / 4 = 30 GB
    assert ex.reference_fewest_gpus(1000, 16_000, 0, 4, 4, 8) == 1  # exactly full fits
    assert ex.reference_fewest_gpus(1000, 8_000, 1, 4, 4, 8) is None  # the whole part fills it exactly


def test_fewest_gpus_checker() -> None:
    solution = _solution("fewest_gpus", math=math)
    assert ex.check_fewest_gpus(solution)
    cases = [
        (lambda n, g, s, w, gr, o: 1, "no number of GPUs is enough"),
        (lambda n, g, s, w, gr, o: ex.reference_fewest_gpus(n, g, s), "whatever the call passes"),
        (lambda n, g, s, w, gr, o: (solution(n, g, s, w, gr, o) or 0) + 1 or None, "returned 2, but 1 GPU is enough"),
        (lambda n, g, s, w, gr, o: None, "returned None, but"),
        (lambda n, g, s, w, gr, o: 1.5, "expected a whole number of GPUs"),
        (lambda n, g, s, w, gr, o: n // 0, "raised ZeroDivisionError"),
    ]
    for fn, expected in cases:
        verdict = ex.check_fewest_gpus(fn)
        assert not verdict and expected in verdict.message + verdict.hint, (expected, verdict)


# --- 2. the memory plan -------------------------------------------------------------------------------------

def _solution_plan() -> Callable[..., Any]:
    return _solution("plan", plan_memory=plan_memory)


def test_memory_plan_checker_accepts_the_solution() -> None:
    solution = _solution_plan()
    assert ex.check_memory_plan(solution)
    answers = [solution(*case) for case in ex.PLAN_CASES]
    assert None in answers and any(a and a[1] for a in answers) and any(a and not a[1] for a in answers)


def _plan_states_and_activations(cfg: GPTConfig, world_size: int, budget: float) -> tuple[int, bool] | None:
    """The old model: ZeRO states plus saved activations, no transient terms."""
    for checkpointed in (False, True):
        for stage in range(4):
            if ex.reference_per_rank_bytes(ex.parameter_count(cfg), world_size, stage) + ex.activation_bytes(
                    cfg, checkpointed) <= budget:
                return stage, checkpointed
    return None


def _plan_peak_only(cfg: GPTConfig, world_size: int, budget: float) -> tuple[int, bool] | None:
    """The allocated peak against the budget, without the CUDA context and the allocator's margin."""
    for checkpointed in (False, True):
        for stage in range(4):
            if plan_memory(cfg, "bf16", checkpointed, stage, world_size).peak <= budget:
                return stage, checkpointed
    return None


def _plan_highest_stage(cfg: GPTConfig, world_size: int, budget: float) -> tuple[int, bool] | None:
    for checkpointed in (False, True):
        fits = [s for s in range(4) if plan_memory(cfg, "bf16", checkpointed, s, world_size).fits(budget)]
        if fits:
            return max(fits), checkpointed
    return None


def test_memory_plan_checker_names_each_mistake() -> None:
    solution = _solution_plan()
    mistakes: list[tuple[Callable[..., Any], str]] = [
        (_plan_states_and_activations, "Counting only the states and the saved activations"),
        (_plan_peak_only, "The allocated peak alone fits"),
        (lambda cfg, w, budget: next(((s, True) for s in range(4) if plan_memory(cfg, "bf16", True, s, w).fits(budget)),
                                     None), "checkpoints activations, but a ZeRO stage fits without"),
        (_plan_highest_stage, "a lower stage fits too"),
        (lambda cfg, w, budget: solution(cfg, w, budget) or (3, True), "GiB per GPU: its largest phase"),
        (lambda cfg, w, budget: None, "returned None for all 10 jobs"),
        (lambda cfg, w, budget: (solution(cfg, w, budget) or (1, True)) if w > 4 else None, "you found no plan, but"),
        (lambda cfg, w, budget: list(solution(cfg, w, budget) or ()) or None, "returned [0, False]; expected"),
        (lambda cfg, w, budget: (5, False), "returned (5, False); expected (stage, checkpointed)"),
        (lambda cfg, w, budget: (0, 0), "returned (0, 0); expected"),
        (lambda cfg, w, budget: (True, False), "returned (True, False); expected"),
        (lambda cfg, w, budget: cfg.layers, "raised AttributeError"),
    ]
    for plan, expected in mistakes:
        verdict = ex.check_memory_plan(plan)
        assert not verdict and expected in verdict.message, (expected, verdict)


# --- 3. resume in one process -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def resumable(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A DCP folder holding {"model", "optim"} of a SMALL GPT and AdamW after 3 of the job's 5 steps (one
    process, the job's global batches), and the weights after all 5 steps."""
    folder = tmp_path_factory.mktemp("dcp") / "step-3"
    torch.manual_seed(0)
    model = GPT(SMALL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for step in range(1, 6):
        model.loss(token_batch(SMALL, g)).backward()
        opt.step()
        opt.zero_grad()
        if step == 3:
            model_state, optim_state = get_state_dict(model, opt)
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder))
    return folder, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _resume_solution() -> Callable[..., Any]:
    return _solution("resume_on_one_process", GPT=GPT, SMALL=SMALL, dcp=dcp, get_state_dict=get_state_dict,
                     set_state_dict=set_state_dict)


def _weights_only(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = GPT(SMALL)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=folder)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def test_resume_checker_accepts_the_solution(resumable: tuple[Path, dict[str, torch.Tensor]]) -> None:
    folder, expected = resumable
    verdict = ex.check_resume_on_one_process(_resume_solution(), folder, expected)
    assert verdict and "1 shard file(s)" in verdict.message


def test_resume_checker_names_each_mistake(resumable: tuple[Path, dict[str, torch.Tensor]]) -> None:
    folder, expected = resumable
    solution = _resume_solution()

    def other_optimizer(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
        model, _ = solution(folder)
        return model, torch.optim.AdamW(GPT(SMALL).parameters(), lr=1e-3)

    def flat(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
        model = GPT(SMALL)
        dcp.load(model.state_dict(), checkpoint_id=folder)  # without the checkpoint's "model" level
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def stepped(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
        model, opt = solution(folder)
        for state in opt.state.values():
            state["step"] += 1
        return model, opt

    def drifted(folder: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
        model, opt = solution(folder)
        with torch.no_grad():
            model.head.weight.add_(0.01)
        return model, opt

    mistakes: list[tuple[Callable[..., Any], str]] = [
        (torch.load, "raised IsADirectoryError"),
        (_weights_only, "no state for 30 of 30 parameters"),
        (other_optimizer, "does not update the parameters"),
        (flat, "Missing key"),
        (stepped, "step counts are [4], not 3"),
        (drifted, "away from the run that never stopped"),
        (lambda folder: solution(folder)[0], "expected (model, optimizer)"),
    ]
    for fn, expected_message in mistakes:
        verdict = ex.check_resume_on_one_process(fn, folder, expected)
        assert not verdict and expected_message in verdict.message, (expected_message, verdict)


@pytest.mark.parametrize(("check", "call"), [
    (ex.check_fewest_gpus, "check_fewest_gpus(fewest_gpus)"),
    (ex.check_memory_plan, "check_memory_plan(plan)"),
    (lambda fn: ex.check_resume_on_one_process(fn, "no-folder", {}),
     "check_resume_on_one_process(resume_on_one_process, folder, expected)"),
], ids=["fewest_gpus", "memory_plan", "resume_on_one_process"])
def test_checkers_ask_for_the_function_itself(check: Callable[[Any], Verdict], call: str) -> None:
    verdict = check((0, False))
    assert not verdict and "expected your function, got tuple" in verdict.message and call in verdict.hint
