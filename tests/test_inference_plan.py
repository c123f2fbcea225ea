"""course_utils.memory.inference_plan: the weights as stored, the plan against the CPU allocator's running total
(float32, where the CPU's kernels allocate what CUDA's do), the largest batch, and the errors."""

from __future__ import annotations

import pytest
import torch

from course_utils.inference.int8_weights import quantize_linears
from course_utils.inference.kv_cache import StaticKVCache, forward_with_cache
from course_utils.inference.roofline import weight_bytes
from course_utils.memory.accounting import CpuAllocations
from course_utils.memory.inference_plan import (
    largest_batch,
    measure_inference,
    plan_inference,
    stored_weight_bytes,
)
from course_utils.models import GPT, GPTConfig

CFG = GPTConfig(vocab=256, seq_len=256, d_model=128, n_heads=4, n_layers=2)


@pytest.mark.parametrize("weights", ["fp32", "bf16", "int8"])
def test_stored_weight_bytes_are_what_the_built_model_stores(weights: str) -> None:
    model = GPT(CFG)
    if weights != "fp32":
        model = model.to(torch.bfloat16)
    if weights == "int8":
        quantize_linears(model, skip=("head",))
    assert stored_weight_bytes(CFG, weights) == weight_bytes(model)


@pytest.mark.parametrize(("batch", "max_len", "prompt"), [(4, 200, 128), (2, 256, 250), (8, 64, 1)])
def test_the_plan_predicts_the_cpu_allocators_peaks_in_float32(batch: int, max_len: int, prompt: int) -> None:
    torch.manual_seed(0)
    with torch.inference_mode(), CpuAllocations() as cpu:
        model = GPT(CFG).eval()
        cache = StaticKVCache(CFG, batch, max_len)
        tokens = torch.randint(CFG.vocab, (batch, prompt), generator=torch.Generator().manual_seed(0))
        cpu.mark("ready")
        token = forward_with_cache(model, tokens, torch.arange(prompt), cache, last_only=True).argmax(-1)
        cpu.mark("prefill")
        pos = torch.tensor([prompt])
        for _ in range(min(2, max_len - prompt)):
            token = forward_with_cache(model, token, pos, cache)[:, -1:].argmax(-1)
            pos += 1
        cpu.mark("decode")
    del model, cache, tokens, token, pos
    plan = plan_inference(CFG, batch, max_len, prompt, "fp32")
    predicted = {phase: sum(t.nbytes for t in terms if t.name != "cuBLAS workspace")
                 for phase, terms in plan.phases.items()}
    assert cpu.at["ready"] - 8 * batch * prompt == predicted["prefill"] - plan.phases["prefill"][-1].nbytes
    assert cpu.peak["prefill"] == pytest.approx(predicted["prefill"], rel=0.02)
    if max_len > prompt:
        assert cpu.peak["decode"] == pytest.approx(predicted["decode"], rel=0.02)


def test_the_peak_phase_follows_the_prompt() -> None:
    assert plan_inference(CFG, 8, 256, 200).peak_phase == "prefill"
    long_cache = plan_inference(CFG, 8, 256, 1)
    assert long_cache.phases["prefill"] == long_cache.phases["decode"]


def test_int8_weights_halve_the_weights_and_keep_a_bf16_cache() -> None:
    big = GPTConfig(vocab=32_000, seq_len=4096, d_model=4096, n_heads=32, n_layers=32)
    bf16, int8 = plan_inference(big, 1, 128, 16, "bf16"), plan_inference(big, 1, 128, 16, "int8")
    assert 0.5 < int8.phases["decode"][0].nbytes / bf16.phases["decode"][0].nbytes < 0.53
    assert int8.phases["decode"][1] == bf16.phases["decode"][1]
    # a decode step at batch 1 is the dequantized MLP weight, not the activations
    assert int8.phases["decode"][-1].nbytes > 4 * 4096 * 4096 * 2


def test_largest_batch_is_the_boundary_of_what_fits() -> None:
    big = GPTConfig(vocab=32_000, seq_len=8192, d_model=4096, n_heads=32, n_layers=32)
    gpu = 80e9
    best = largest_batch(big, 8192, 4096, gpu)
    assert best > 0
    assert plan_inference(big, best, 8192, 4096).fits(gpu)
    assert not plan_inference(big, best + 1, 8192, 4096).fits(gpu)
    assert largest_batch(big, 8192, 4096, 10e9) == 0  # the weights alone do not fit
    assert largest_batch(big, 8192, 4096, gpu, "int8") >= best


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="weights must be one of"):
        plan_inference(CFG, 1, 16, 4, "fp16")
    with pytest.raises(ValueError, match="prompt_len ≤ max_len"):
        plan_inference(CFG, 1, 16, 17)
    with pytest.raises(ValueError, match="seq_len"):
        plan_inference(CFG, 1, 512, 4)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            measure_inference(CFG, 1, 16, 4, device="cpu")
