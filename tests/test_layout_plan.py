"""course_utils.memory.layout_plan: the model's state per GPU and the bytes sent per step for a (dp, tp, pp)
layout, against the whole model's count and the rules its docstring states (the split of a tensor-parallel
GPT is checked against gloo ranks in tests/test_model_parallel_demos.py)."""

from __future__ import annotations

import pytest

from course_utils.memory.layout_plan import Layout, bytes_sent_per_gpu, params_per_gpu, state_bytes_per_gpu
from course_utils.memory.planner import parameter_count
from course_utils.models import GPTConfig

SEVEN_B = GPTConfig(vocab=32_000, seq_len=4096, d_model=4096, n_heads=32, n_layers=32)


def test_one_gpu_holds_the_whole_model() -> None:
    assert params_per_gpu(SEVEN_B, Layout()) == parameter_count(SEVEN_B)
    assert sum(state_bytes_per_gpu(SEVEN_B, Layout()).values()) == 16 * parameter_count(SEVEN_B)


def test_tensor_parallelism_splits_the_linear_layers_not_the_norms_or_embeddings() -> None:
    whole, half = params_per_gpu(SEVEN_B, Layout()), params_per_gpu(SEVEN_B, Layout(tp=2))
    d, v = SEVEN_B.d_model, SEVEN_B.vocab
    replicated = SEVEN_B.n_layers * (2 * d + 4 * d) + (v + SEVEN_B.seq_len) * d + 2 * d
    assert 2 * half - whole == replicated  # what both ranks hold in full
    assert params_per_gpu(SEVEN_B, Layout(tp=2), vocab_parallel_head=False) - half == (d * v + v) // 2


def test_pipeline_stages_hold_their_blocks_and_the_heavier_end() -> None:
    d, v = SEVEN_B.d_model, SEVEN_B.vocab
    block = (parameter_count(SEVEN_B) - (v + SEVEN_B.seq_len) * d - (d * v + v + 2 * d)) // SEVEN_B.n_layers
    assert params_per_gpu(SEVEN_B, Layout(pp=4)) == 8 * block + (v + SEVEN_B.seq_len) * d  # the first stage
    assert params_per_gpu(SEVEN_B, Layout(pp=3)) == 11 * block + (v + SEVEN_B.seq_len) * d  # ceil(32 / 3)


def test_zero_stages_shard_the_state_over_dp() -> None:
    n = params_per_gpu(SEVEN_B, Layout(dp=8))
    expected = {0: 16 * n, 1: 8 * n + 8 * n / 8, 2: 4 * n + 12 * n / 8, 3: 16 * n / 8}
    for zero, total in expected.items():
        assert sum(state_bytes_per_gpu(SEVEN_B, Layout(dp=8, zero=zero)).values()) == pytest.approx(total)


def test_bytes_sent_follow_the_ring_and_each_kind_needs_its_degree() -> None:
    tokens = 8 * 4096
    alone = bytes_sent_per_gpu(SEVEN_B, Layout(), tokens)
    assert alone == {"dp": 0, "tp": 0, "pp": 0}
    dp = bytes_sent_per_gpu(SEVEN_B, Layout(dp=8), tokens)["dp"]
    assert dp == pytest.approx(2 * 7 / 8 * 4 * parameter_count(SEVEN_B))
    assert bytes_sent_per_gpu(SEVEN_B, Layout(dp=8, zero=3), tokens)["dp"] == pytest.approx(1.5 * dp)
    tp = bytes_sent_per_gpu(SEVEN_B, Layout(tp=8), tokens)
    assert tp["tp"] == pytest.approx(32 * 4 * 2 * 7 / 8 * tokens * 4096 * 2)  # four all-reduces per block
    assert bytes_sent_per_gpu(SEVEN_B, Layout(tp=8, sequence_parallel=True), tokens)["tp"] == tp["tp"]
    assert bytes_sent_per_gpu(SEVEN_B, Layout(pp=2), tokens)["pp"] == tokens * 4096 * 2
    assert bytes_sent_per_gpu(SEVEN_B, Layout(pp=4), tokens)["pp"] == 2 * tokens * 4096 * 2  # a middle stage


def test_bad_layouts_are_named() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Layout(tp=0)
    with pytest.raises(ValueError, match="ZeRO"):
        Layout(zero=4)
    with pytest.raises(ValueError, match="heads"):
        params_per_gpu(SEVEN_B, Layout(tp=3))
    with pytest.raises(ValueError, match="vocabulary"):
        params_per_gpu(GPTConfig(vocab=30_001, n_heads=4), Layout(tp=2))
    with pytest.raises(ValueError, match="stages"):
        params_per_gpu(SEVEN_B, Layout(pp=64))
    with pytest.raises(ValueError, match="tokens"):
        bytes_sent_per_gpu(SEVEN_B, Layout(), 0)


def test_activations_follow_the_block_list_the_split_and_the_schedule() -> None:
    from course_utils.memory.layout_plan import activation_bytes_per_gpu
    from course_utils.memory.planner import saved_by_a_block

    cfg = GPTConfig(vocab=256, seq_len=65, d_model=64, n_heads=4, n_layers=8)
    one = activation_bytes_per_gpu(cfg, Layout(), microbatch=2)
    per_token = sum(n for _, n in saved_by_a_block(64, 4, 64, 2, 4, "fused"))
    assert one == 8 * 2 * 64 * per_token  # one GPU: notebook 08's count, every block
    tp, sp = (activation_bytes_per_gpu(cfg, Layout(tp=2, sequence_parallel=s), microbatch=2) for s in (False, True))
    assert one / 2 < sp < tp < one  # some tensors stay whole on every rank
    gpipe = activation_bytes_per_gpu(cfg, Layout(pp=4), microbatch=2, microbatches=16, schedule="GPipe")
    one_f_one_b = activation_bytes_per_gpu(cfg, Layout(pp=4), microbatch=2, microbatches=16)
    assert gpipe == 4 * one_f_one_b == 16 * one / 4  # 16 microbatches in flight against 4; 2 of 8 blocks
    with pytest.raises(ValueError, match="schedule"):
        activation_bytes_per_gpu(cfg, Layout(), 1, schedule="zigzag")


def test_block_activations_tensor_by_tensor() -> None:
    """Tensor parallelism leaves the norms' inputs and statistics and the inputs of qkv and fc whole (Korthikanti
    et al.'s 10 sbh of 34, less the dropout masks this block does not have); Megatron-LM's sequence parallelism
    divides every tensor by tp, PyTorch's keeps the gathered inputs of qkv and fc whole."""
    from course_utils.memory.layout_plan import activation_bytes_per_gpu, block_activations

    cfg = GPTConfig(d_model=64, n_heads=4, seq_len=17)
    rows = block_activations(cfg, Layout(tp=4), act=4, res=4)
    whole = {name for name, one, rank in rows if rank == one}
    assert whole == {"first norm's input (the block's input)", "first norm's mean and rstd",
                     "qkv layer's input (first norm's output)", "second norm's input (the residual)",
                     "second norm's mean and rstd", "MLP's input (second norm's output)"}
    megatron = block_activations(cfg, Layout(tp=4, sequence_parallel=True), keep_gathered_inputs=False)
    assert all(rank == one / 4 for _, one, rank in megatron)
    pytorch = block_activations(cfg, Layout(tp=4, sequence_parallel=True))
    assert {name for name, one, rank in pytorch if rank == one} == {"qkv layer's input (first norm's output)",
                                                                    "MLP's input (second norm's output)"}
    one_block = GPTConfig(d_model=64, n_heads=4, seq_len=17, n_layers=1)
    assert sum(r for *_, r in rows) * 16 == activation_bytes_per_gpu(one_block, Layout(tp=4), microbatch=1, act=4)
