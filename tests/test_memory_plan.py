"""course_utils.memory_plan: the planner's terms against what a CPU step really holds, and its bad input.

The allocated peak itself is validated on an H200 by notebook 08's recorded cell ``08-memory-plan``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from course_utils.memory_accounting import saved_tensor_bytes
from course_utils.memory_plan import MemoryPlan, measure_peak, parameter_count, plan_memory
from course_utils.models import GPT, GPTConfig, token_batch

SHAPES = (GPTConfig(), GPTConfig(vocab=50, seq_len=12, d_model=24, n_heads=3, n_layers=3, batch=5),
          GPTConfig(vocab=300, seq_len=40, d_model=48, n_heads=6, n_layers=2, batch=3))


def _term(plan: MemoryPlan, phase: str, name: str) -> float:
    return sum(t.nbytes for t in plan.phases[phase] if t.name == name)


@pytest.mark.parametrize("cfg", SHAPES)
def test_parameter_count_equals_a_real_gpt(cfg: GPTConfig) -> None:
    assert parameter_count(cfg) == sum(p.numel() for p in GPT(cfg).parameters())


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("cfg", SHAPES)
def test_fp32_activation_terms_equal_what_autograd_saves(cfg: GPTConfig, checkpointing: bool) -> None:
    torch.manual_seed(0)
    model = GPT(cfg)
    tokens = token_batch(cfg, torch.Generator().manual_seed(0))

    def loss() -> torch.Tensor:
        if not checkpointing:
            return model.loss(tokens)
        x = model.tok(tokens[:, :-1]) + model.pos(torch.arange(cfg.seq_len - 1))
        for block in model.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return F.cross_entropy(model.head(model.norm(x)).flatten(0, 1), tokens[:, 1:].flatten())

    _, saved = saved_tensor_bytes(loss, exclude=model)
    plan = plan_memory(cfg, "fp32", checkpointing)
    phase = "backward (the loss)"
    predicted = sum(_term(plan, phase, n) for n in ("activations", "activations outside blocks", "the batch"))
    assert predicted == saved


def test_phases_and_terms() -> None:
    cfg = GPTConfig(vocab=8192, seq_len=1024, d_model=1024, n_heads=16, n_layers=8, batch=16)
    n = parameter_count(cfg)
    plan = plan_memory(cfg, "bf16")
    assert plan.peak_phase == "backward (the loss)"
    assert plan.peak == sum(t.nbytes for t in plan.terms)
    assert plan.total == pytest.approx(plan.peak * 1.1 + plan.context)
    assert _term(plan, "optimizer step", "AdamW temporaries") == 4 * n
    assert "AdamW temporaries" not in {t.name for t in plan_memory(cfg, fused_adamw=True).phases["optimizer step"]}
    # sharding divides exactly the states each stage shards
    for stage, sharded in [(1, {"AdamW state"}), (2, {"AdamW state", "gradients"}),
                           (3, {"AdamW state", "gradients", "parameters"})]:
        one, eight = plan_memory(cfg, stage=stage), plan_memory(cfg, stage=stage, world_size=8)
        for name in ("parameters", "AdamW state", "gradients"):
            ratio = _term(one, "optimizer step", name) / _term(eight, "optimizer step", name)
            assert ratio == (8 if name in sharded else 1), (stage, name)
    # checkpointing trades the saved activations for one recomputed block
    ckpt = plan_memory(cfg, "bf16", checkpointing=True)
    assert _term(ckpt, "backward (the loss)", "activations") < _term(plan, "backward (the loss)", "activations")
    assert _term(ckpt, "backward (block 7)", "recomputed block") > 0
    assert "gathered blocks" in {t.name for t in plan_memory(cfg, stage=3, world_size=8).terms}
    # DDP keeps its gradient buckets (a second copy of the gradients) for stages 0 and 1 on several GPUs
    for stage, world, buckets in [(0, 1, 0), (0, 8, 4 * n), (1, 8, 4 * n), (2, 8, 0), (3, 8, 0)]:
        plan_w = plan_memory(cfg, stage=stage, world_size=world)
        assert _term(plan_w, "optimizer step", "DDP gradient buckets") == buckets, (stage, world)
    assert plan.fits(80 * 2**30) and not plan.fits(4 * 2**30)
    assert "needed on the GPU" in plan.table()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"precision": "fp16"}, "precision must be one of"),
    ({"stage": 4}, "ZeRO stages are 0"),
    ({"world_size": 0}, "world_size must be at least 1"),
])
def test_bad_input(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_memory(GPTConfig(), **kwargs)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only message")
def test_measure_peak_needs_a_gpu() -> None:
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        measure_peak(GPTConfig())
