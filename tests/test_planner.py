"""course_utils.memory.planner: the planner's terms against what a CPU step really holds, and its bad input.

Every phase is validated on an H200 by notebook 08's recorded cell ``08-memory-plan``; here, on the CPU: the
saved activations to the byte (float32, fused and math attention; each tensor a block saves, by name), every
phase of one step measured by the CPU allocator (`measure_peak(device="cpu")`, plain and with FSDP2 on one
rank), the cast cache of autocast, and the structure of the terms (what each stage shards, what each option
adds)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from course_utils.devices import DeviceError
from course_utils.memory.accounting import CpuAllocations, saved_tensor_bytes
from course_utils.memory.planner import (
    MEASURED_PHASES,
    MemoryPlan,
    cublas_workspace_bytes,
    measure_peak,
    parameter_count,
    plan_memory,
    saved_by_a_block,
)
from course_utils.models import GPT, Block, GPTConfig, token_batch

SHAPES = (GPTConfig(), GPTConfig(vocab=50, seq_len=12, d_model=24, n_heads=3, n_layers=3, batch=5),
          GPTConfig(vocab=300, seq_len=40, d_model=48, n_heads=6, n_layers=2, batch=3))
LARGE = GPTConfig(vocab=8192, seq_len=1024, d_model=1024, n_heads=16, n_layers=8, batch=16)


def _term(plan: MemoryPlan, phase: str, name: str) -> float:
    return sum(t.nbytes for t in plan.phases[phase] if t.name == name)


def _names(plan: MemoryPlan, phase: str) -> set[str]:
    return {t.name for t in plan.phases[phase]}


@pytest.mark.parametrize("cfg", SHAPES)
def test_parameter_count_equals_a_real_gpt(cfg: GPTConfig) -> None:
    assert parameter_count(cfg) == sum(p.numel() for p in GPT(cfg).parameters())
    tied = GPT(cfg)
    tied.head.weight = tied.tok.weight  # one tensor, counted once
    assert parameter_count(cfg, tied_head=True) == sum(p.numel() for p in tied.parameters())


def _saved(cfg: GPTConfig, checkpointing: bool, backend: SDPBackend | None = None) -> int:
    torch.manual_seed(0)
    model = GPT(cfg, checkpointed=checkpointing)
    tokens = token_batch(cfg, torch.Generator().manual_seed(0))
    if backend is None:
        return saved_tensor_bytes(lambda: model.loss(tokens), exclude=model)[1]
    with sdpa_kernel(backend):
        return saved_tensor_bytes(lambda: model.loss(tokens), exclude=model)[1]


def _planned_saved(plan: MemoryPlan) -> float:
    return sum(_term(plan, "backward (the loss)", n) for n in ("activations", "activations outside blocks",
                                                                 "the batch"))


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("cfg", SHAPES)
def test_fp32_activation_terms_equal_what_autograd_saves(cfg: GPTConfig, checkpointing: bool) -> None:
    assert _planned_saved(plan_memory(cfg, "fp32", checkpointing)) == _saved(cfg, checkpointing)


def test_math_attention_saves_the_probabilities() -> None:
    """attention="math": PyTorch's reference attention saves the t × t probabilities of every head."""
    cfg = SHAPES[2]
    saved = _saved(cfg, False, SDPBackend.MATH)
    assert _planned_saved(plan_memory(cfg, "fp32", attention="math")) == saved
    assert saved > _saved(cfg, False)


BLOCK_SAVES = ("first norm's input (the block's input)", "first norm's mean and rstd",
               "qkv layer's input (first norm's output)", "q, k, v", "attention output (projection's input)",
               "second norm's input (the residual)", "second norm's mean and rstd",
               "MLP's input (second norm's output)", "GELU's input (first MLP layer's output)",
               "GELU's output (second MLP layer's input)")


def _summed_per_block(cfg: GPTConfig, act: int, res: int, attention: str) -> int:
    """A block's saved bytes as the plan summed them before it named each tensor."""
    b, t, d, h = cfg.batch, cfg.seq_len - 1, cfg.d_model, cfg.n_heads
    btd = b * t * d
    saved_attention = 4 * b * h * t if attention == "fused" else act * b * h * t * t
    return 2 * res * btd + 16 * b * t + 14 * act * btd + saved_attention


@pytest.mark.parametrize("attention", ["fused", "math"])
@pytest.mark.parametrize("cfg", [*SHAPES, LARGE])
def test_a_block_s_saved_tensors_are_named_and_sum_as_before(cfg: GPTConfig, attention: str) -> None:
    """Each tensor a block saves has its name and bytes per token; together, exactly the bytes the plan summed
    from constants before, for every precision (``act``, ``res``: bytes per number), and the plan's
    activations per block."""
    t = cfg.seq_len - 1
    for act, res in [(4, 4), (2, 4), (2, 2)]:  # fp32, autocast, FSDP2's bf16 policy
        saves = saved_by_a_block(cfg.d_model, cfg.n_heads, t, act, res, attention)
        names = [name for name, _ in saves]
        assert len(set(names)) == len(names)
        assert set(names) == {*BLOCK_SAVES, "attention log-sum-exp" if attention == "fused"
                              else "attention probabilities"}
        assert all(isinstance(nbytes, int) and nbytes > 0 for _, nbytes in saves)
        assert cfg.batch * t * sum(nbytes for _, nbytes in saves) == _summed_per_block(cfg, act, res, attention)
    for precision, mixed, act, res in [("fp32", None, 4, 4), ("bf16", "autocast", 2, 4), ("bf16", "policy", 2, 2)]:
        plan = plan_memory(cfg, precision, stage=3 if mixed == "policy" else 0, mixed_precision=mixed,
                           attention=attention)
        assert _term(plan, "backward (the loss)", "activations") == cfg.n_layers * _summed_per_block(
            cfg, act, res, attention)
        recomputed = plan_memory(cfg, precision, True, stage=3 if mixed == "policy" else 0, mixed_precision=mixed,
                                 attention=attention)
        assert _term(recomputed, "backward (block 0)", "recomputed block") == _summed_per_block(
            cfg, act, res, attention)


@pytest.mark.parametrize("backend", [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])
def test_the_named_tensors_are_what_one_block_saves(backend: SDPBackend) -> None:
    """One fp32 block on the CPU: autograd's saved storages add up to the named tensors' bytes."""
    cfg = SHAPES[2]
    torch.manual_seed(0)
    block = Block(cfg)
    t = cfg.seq_len - 1
    x = torch.randn(cfg.batch, t, cfg.d_model, requires_grad=True)
    with sdpa_kernel(backend):
        _, saved = saved_tensor_bytes(lambda: block(x), exclude=block)
    attention = "fused" if backend == SDPBackend.FLASH_ATTENTION else "math"
    named = saved_by_a_block(cfg.d_model, cfg.n_heads, t, 4, 4, attention)
    assert saved == cfg.batch * t * sum(nbytes for _, nbytes in named)


def test_the_checkpointed_gpt_is_the_hand_written_one() -> None:
    """GPT(checkpointed=True) is section 2's loop of checkpoint(block, x, use_reentrant=False): same loss and
    gradients, and the same saved bytes."""
    cfg = SHAPES[2]
    tokens = token_batch(cfg, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = GPT(cfg)

    def by_hand() -> torch.Tensor:
        x = model.tok(tokens[:, :-1]) + model.pos(torch.arange(cfg.seq_len - 1))
        for block in model.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return F.cross_entropy(model.head(model.norm(x)).flatten(0, 1), tokens[:, 1:].flatten())

    loss, saved = saved_tensor_bytes(by_hand, exclude=model)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    model.checkpointed = True
    loss2, saved2 = saved_tensor_bytes(lambda: model.loss(tokens), exclude=model)
    loss2.backward()
    assert torch.equal(loss, loss2) and saved == saved2
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))


@pytest.mark.parametrize(("checkpointing", "stage"), [(False, 0), (True, 0), (True, 3)])
def test_every_phase_against_the_cpu_allocator(checkpointing: bool, stage: int) -> None:
    """One step measured by the CPU allocator: forward, the loss's backward and the optimizer's step within 1%;
    backward through the blocks, where the plan adds up what several moments hold, at most 6% high.
    (Fused AdamW: the CPU's default AdamW has none of foreach's temporaries; a CPU has no cuBLAS workspace.)"""
    cfg = GPTConfig(vocab=256, seq_len=128, d_model=128, n_heads=4, n_layers=4, batch=4)
    plan = plan_memory(cfg, "fp32", checkpointing, stage, fused_adamw=True, workspace=0)
    got = measure_peak(cfg, "fp32", checkpointing, stage, fused_adamw=True, device="cpu")
    assert set(got) >= {*MEASURED_PHASES, "peak", "between steps"}
    for phase in MEASURED_PHASES:
        error = plan.by_measured_phase[phase] / got[phase] - 1
        if phase == "backward (blocks)":
            assert -0.01 <= error <= 0.06, (phase, error, got)
        else:
            assert abs(error) <= 0.01, (phase, error, got)
    n = parameter_count(cfg)
    assert got["between steps"] >= 12 * n  # the parameters and AdamW's two moments stay


def test_autocast_keeps_its_casts_until_it_exits() -> None:
    """The cast cache, measured: six checkpointed layers keep their bf16 weights until autocast exits, unless
    cache_enabled=False; the plan's forward phase counts them when the blocks are checkpointed."""
    layers = [torch.nn.Linear(256, 256) for _ in range(6)]
    x = torch.randn(8, 256, requires_grad=True)
    casts = 6 * 256 * 256 * 2

    def alive(cache_enabled: bool) -> tuple[int, int]:
        with CpuAllocations() as cpu:
            with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache_enabled):
                h = x
                for layer in layers:
                    h = checkpoint(layer, h, use_reentrant=False)
                cpu.mark("end of forward")
            cpu.mark("exited")
            del h
        return cpu.at["end of forward"], cpu.at["exited"]

    end, exited = alive(True)
    assert end - exited >= casts
    end, exited = alive(False)
    assert end - exited < casts / 6
    plan = plan_memory(LARGE, "bf16", checkpointing=True)
    cache = _term(plan, "forward (the loss)", "autocast's cast cache")
    assert cache >= 2 * parameter_count(LARGE) - 2 * (LARGE.vocab + LARGE.seq_len) * LARGE.d_model - 2 * 10**6
    assert "autocast's cast cache" not in _names(plan_memory(LARGE, "bf16", True, autocast_cache=False),
                                                 "forward (the loss)")


def test_phases_and_terms() -> None:
    n = parameter_count(LARGE)
    plan = plan_memory(LARGE, "bf16")
    assert plan.peak_phase == "backward (the loss)"
    assert plan.peak == sum(t.nbytes for t in plan.terms)
    assert plan.total == pytest.approx(plan.peak * 1.1 + plan.context)
    assert set(plan.by_measured_phase) == set(MEASURED_PHASES)
    assert max(plan.by_measured_phase.values()) == plan.peak
    assert _term(plan, "optimizer step", "AdamW temporaries") == 4 * n
    assert "AdamW temporaries" not in _names(plan_memory(LARGE, fused_adamw=True), "optimizer step")
    assert _term(plan, "optimizer step", "cuBLAS workspaces") == 2 * cublas_workspace_bytes(9) == 64 * 2**20
    assert cublas_workspace_bytes(8) == 8 * 2**20 + 128 * 2**10
    # what each stage divides by the world size: 1 the optimizer state, 2 and 3 (FSDP2) gradients and parameters
    for stage, sharded in [(1, {"AdamW state"}), (2, {"AdamW state", "gradients", "parameters"}),
                           (3, {"AdamW state", "gradients", "parameters"})]:
        one, eight = plan_memory(LARGE, stage=stage), plan_memory(LARGE, stage=stage, world_size=8)
        for name in ("parameters", "AdamW state", "gradients"):
            ratio = _term(one, "optimizer step", name) / _term(eight, "optimizer step", name)
            assert ratio == (8 if name in sharded else 1), (stage, name)
    # checkpointing trades the saved activations for one recomputed block
    ckpt = plan_memory(LARGE, "bf16", checkpointing=True)
    assert _term(ckpt, "backward (the loss)", "activations") < _term(plan, "backward (the loss)", "activations")
    assert _term(ckpt, "backward (block 7)", "recomputed block") > 0
    # DDP keeps its gradient buckets (a second copy of the gradients) for stages 0 and 1 on several GPUs
    for stage, world, buckets in [(0, 1, 0), (0, 8, 4 * n), (1, 8, 4 * n), (2, 8, 0), (3, 8, 0)]:
        assert _term(plan_memory(LARGE, stage=stage, world_size=world), "optimizer step",
                     "DDP gradient buckets") == buckets, (stage, world)
    assert plan.fits(80 * 2**30) and not plan.fits(4 * 2**30)
    assert "needed on the GPU" in plan.table()


def test_fsdp2_terms() -> None:
    """Stages 2 and 3 are FSDP2: the root stays gathered through backward (not at the optimizer's step), a
    block's gradient goes through a float32 reduce-scatter input, and on several GPUs the all-gather's buffer
    comes on top; with the policy, what is gathered is bf16."""
    policy, autocast = plan_memory(LARGE, "bf16", stage=3, world_size=8), plan_memory(
        LARGE, "bf16", stage=3, world_size=8, mixed_precision="autocast")
    assert "bf16 (FSDP2 MixedPrecisionPolicy)" in policy.job and "bf16 (autocast)" in autocast.job
    assert "gathered root" in _names(policy, "backward (block 0)")
    assert "gathered root" not in _names(policy, "optimizer step")
    one = plan_memory(LARGE, "bf16", stage=3)
    gathered = _term(policy, "backward (block 0)", "gathered blocks")
    assert gathered == 2 * _term(one, "backward (block 0)", "gathered blocks")  # the prefetch buffer on 8 GPUs
    assert _term(autocast, "backward (block 0)", "gathered blocks") == 2 * gathered  # float32 against bf16
    assert _term(policy, "backward (block 0, reduce-scatter)", "reduce-scatter input") > 0
    assert "autocast's cast cache" in _names(autocast, "forward (the loss)")
    assert "autocast's cast cache" not in _names(policy, "forward (the loss)")
    stage2 = plan_memory(LARGE, "bf16", stage=2, world_size=8)
    assert _term(stage2, "forward (the loss)", "gathered blocks") > _term(stage2, "backward (block 0)",
                                                                           "gathered blocks")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"precision": "fp16"}, "precision must be one of"),
    ({"stage": 4}, "ZeRO stages are 0"),
    ({"world_size": 0}, "world_size must be at least 1"),
    ({"precision": "bf16", "stage": 1, "mixed_precision": "policy"}, "has no MixedPrecisionPolicy"),
    ({"precision": "bf16", "mixed_precision": "fp8"}, "mixed_precision must be one of"),
    ({"mixed_precision": "autocast"}, "is for precision 'bf16'"),
    ({"attention": "flash"}, "attention must be one of"),
])
def test_bad_input(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_memory(GPTConfig(), **kwargs)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only message")
def test_measure_peak_needs_a_gpu_for_cuda() -> None:
    """The device goes through course_utils.devices: a missing GPU, or a name that is no device, is a DeviceError
    that says what this machine has."""
    with pytest.raises(DeviceError, match=r"measure_peak\(device='cuda'\): this machine has no such device \(it "
                                          r"has cpu\); device='cpu' measures the CPU's allocator"):
        measure_peak(GPTConfig())
    with pytest.raises(DeviceError, match="'gpu'"):  # not a device name at all: find_device's own message
        measure_peak(GPTConfig(), device="gpu")
    with pytest.raises(DeviceError, match="measure_peak\\(device='cpu:1'\\): this machine has no such device"):
        measure_peak(GPTConfig(), device="cpu:1")
    with pytest.raises(ValueError, match="stage 1 is DDP"):
        measure_peak(GPTConfig(), stage=1, device="cpu")
    with pytest.raises(ValueError, match="needs device='cuda'"):
        measure_peak(GPTConfig(), device="cpu", snapshot="x.pickle")
