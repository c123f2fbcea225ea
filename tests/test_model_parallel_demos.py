"""course_utils.distributed.model_parallel_demos: notebook 11's workers. The pieces in this process (Megatron-LM's
qkv order, the tensor-parallel block unsharded, the saved-activation meter, the bubble arithmetic), then the
workers in gloo processes: two ranks in one launch (tensor and sequence parallelism, loss parallel, pipeline
schedules, the bubble), four in another (the meshes, FSDP2 × TP)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from course_utils.distributed import model_parallel_demos as M
from course_utils.distributed.launch import launch
from course_utils.memory.accounting import saved_tensor_bytes
from course_utils.memory.layout_plan import Layout, activation_bytes_per_gpu, params_per_gpu
from course_utils.models import GPT, Block, GPTConfig, token_batch

CFG = GPTConfig(vocab=64, seq_len=8, d_model=32, n_heads=4, n_layers=2, batch=3)


def test_head_major_groups_each_heads_q_k_v_and_qkv_major_undoes_it() -> None:
    rows = torch.arange(3 * 4 * 2)  # (q, k, v) × 4 heads × 2 features, numbered
    grouped = M.head_major(rows, 4)
    assert grouped[:6].tolist() == [0, 1, 8, 9, 16, 17]  # head 0's q, k and v
    assert torch.equal(M.qkv_major(grouped, 4), rows)


def test_tp_block_unsharded_computes_what_block_does() -> None:
    torch.manual_seed(0)
    block = Block(CFG)
    x = torch.randn(CFG.batch, CFG.seq_len, CFG.d_model)
    assert torch.allclose(M.TPBlock.from_block(block)(x), block(x), atol=1e-6)
    plain = M.TPBlock(CFG)
    plain.load_state_dict(block.state_dict())  # Block's qkv order read as head-major: other heads
    assert not torch.allclose(plain(x), block(x), atol=1e-3)


def test_saved_activations_peak_is_what_autograd_saves_and_backward_frees_it() -> None:
    torch.manual_seed(0)
    block = Block(CFG)
    x = torch.randn(CFG.batch, CFG.seq_len, CFG.d_model, requires_grad=True)
    _, expected = saved_tensor_bytes(lambda: block(x), exclude=block)
    saved = M.SavedActivations(block)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        out = block(x)
    assert saved.now == saved.peak == expected > 0
    out.sum().backward()
    del out
    assert saved.now == 0 and saved.peak == expected


def test_gpt_parts_chained_are_the_gpt() -> None:
    torch.manual_seed(0)
    gpt = GPT(CFG)
    tokens = token_batch(CFG, torch.Generator().manual_seed(0))
    first, last = M.GPTPart(gpt, 0, 1), M.GPTPart(gpt, 1, 2)
    assert first.head is None and last.tok is None
    assert torch.allclose(last(first(tokens)), gpt(tokens), atol=1e-6)


def test_bubble_fractions_of_a_drawn_gpipe_step() -> None:
    # two stages, two microbatches, forward 1, backward 2: stage 0 idles 3 of 9, stage 1 too
    stage0 = [(0, "F", 0, 0, 1), (0, "F", 1, 1, 2), (0, "B", 0, 5, 7), (0, "B", 1, 7, 9)]
    stage1 = [(1, "F", 0, 1, 2), (1, "F", 1, 2, 3), (1, "B", 0, 3, 5), (1, "B", 1, 5, 7)]
    assert M.bubble_fractions([stage0, stage1]) == pytest.approx([1 / 3, 1 / 3])


TWO_RANKS: list[tuple[Any, dict[str, Any]]] = [
    (M.tp_block_demo, {}), (M.tp_block_demo, {"sequence_parallel": True}), (M.loss_parallel_demo, {}),
    (M.pipeline_demo, {"schedule": "GPipe", "n_microbatches": 8}),
    (M.pipeline_demo, {"schedule": "1F1B", "n_microbatches": 8}),
    (M.pipeline_demo, {"schedule": "Interleaved1F1B", "n_microbatches": 8}),
    (M.bubble_demo, {"schedule": "GPipe", "n_microbatches": 4}),
    (M.bubble_demo, {"schedule": "1F1B", "n_microbatches": 8}),
    (M.bubble_demo, {"schedule": "1F1B", "n_microbatches": 2}),
    (M.bubble_demo, {"schedule": "Interleaved1F1B", "n_microbatches": 2}), (M.pitfalls_demo, {})]


@pytest.fixture(scope="module")
def two_ranks() -> list[list[Any]]:
    """Every two-rank worker, in one launch: ``[demo][rank]``."""
    ranks = launch(M.run_demos, 2, TWO_RANKS, timeout=240, quiet=True)
    return [list(results) for results in zip(*ranks, strict=True)]


def test_tensor_parallel_block_equals_the_block_with_megatrons_two_all_reduces(two_ranks: list[list[Any]]) -> None:
    for r in two_ranks[0]:
        assert r["output_equal"] and r["grads_equal"], r
        assert r["forward"] == r["backward"] == {"all_reduce": 2}  # Megatron-LM: two per block each way
        assert r["forward_bytes"] == {"all_reduce": 2 * r["activation_bytes"]}  # each of b·t·d
        assert r["local_qkv_weight"] == (3 * 64 // 2, 64)  # two heads of four
        assert r["params"] < r["params_one_process"] and r["saved_bytes"] < r["saved_bytes_one_process"]
        # one block, as the layout plan splits it: the two blocks' difference of a one-block and a two-block GPT
        one, two = (params_per_gpu(GPTConfig(n_layers=n, d_model=64), Layout(tp=2)) for n in (1, 2))
        assert r["params"] == two - one


def test_sequence_parallelism_gathers_and_scatters_the_same_bytes(two_ranks: list[list[Any]]) -> None:
    tp, sp = two_ranks[0][0], two_ranks[1][0]
    for r in two_ranks[1]:
        assert r["output_equal"] and r["grads_equal"], r
        assert r["forward"] == r["backward"] == {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2}
    # an all-reduce is a reduce-scatter then an all-gather: the same tensors, split in two collectives
    assert sp["forward_bytes"] == {"all_gather_into_tensor": tp["forward_bytes"]["all_reduce"],
                                   "reduce_scatter_tensor": tp["forward_bytes"]["all_reduce"]}
    assert sp["saved_bytes"] < tp["saved_bytes"]  # the norms' activations are split too
    # What each rank saves, tensor by tensor (float32; u = one b·t·d tensor; the demo's block has 4 heads):
    # tensor parallelism halves q, k, v, the attention's log-sum-exp and output, the GELU's input and output,
    # and keeps whole the norms' inputs and statistics and the two linear layers' inputs (the norms' outputs).
    # Sequence parallelism halves the norms' inputs and statistics too; PyTorch's ColwiseParallel saves the
    # all-gathered input of qkv and fc, so those two stay whole (Megatron-LM keeps its shard and gathers
    # again in backward, which is why Korthikanti et al. divide them by t as well).
    u = tp["activation_bytes"]
    tokens = u // (4 * M.BLOCK_CFG.d_model)
    stats, lse = 2 * 4 * tokens, 4 * M.BLOCK_CFG.n_heads * tokens
    assert tp["saved_bytes"] == 4 * u + 2 * stats + (12 * u + lse) // 2
    assert sp["saved_bytes"] == 2 * u + (2 * u + 2 * stats + 12 * u + lse) // 2
    # and the layout plan, which divides notebook 08's list of a block's saved tensors the same way
    one_block = GPTConfig(vocab=M.BLOCK_CFG.vocab, seq_len=M.BLOCK_CFG.seq_len + 1, d_model=64, n_heads=4, n_layers=1)
    for r, sequence_parallel in ((tp, False), (sp, True)):
        assert r["saved_bytes"] == activation_bytes_per_gpu(
            one_block, Layout(tp=2, sequence_parallel=sequence_parallel), microbatch=M.BLOCK_CFG.batch, act=4, res=4)


def test_loss_parallel_runs_on_gloo_and_equals_one_process(two_ranks: list[list[Any]]) -> None:
    for r in two_ranks[2]:
        assert r["loss_equal"] and r["grads_equal"], r
        assert r["local_head_weight"] == (256 // 2, 64)  # half the vocabulary on each rank
        # what each rank holds is what the layout plan says a tp = 2 GPU holds
        assert r["params"] == params_per_gpu(GPTConfig(n_layers=2), Layout(tp=2))
        assert set(r["forward"]) == {"all_reduce"}  # the blocks' and the softmax's sums over the vocabulary


def test_pipeline_schedules_equal_one_process_and_1f1b_keeps_fewer_activations(
        two_ranks: list[list[Any]]) -> None:
    gpipe, one_f_one_b, interleaved = two_ranks[3:6]
    for r in gpipe + one_f_one_b + interleaved:
        assert r["grads_equal"], r
    for schedule in (gpipe, one_f_one_b, interleaved):
        assert schedule[-1]["loss_equal"]
    assert gpipe[0]["order"] == " ".join([f"F{i}" for i in range(8)] + [f"B{i}" for i in range(8)])
    assert one_f_one_b[0]["order"].startswith("F0 F1 B0 F2 B1")  # two in flight on the first of two stages
    assert interleaved[0]["stages"] == [0, 2] and "F0@2" in interleaved[0]["order"]
    # GPipe keeps all 8 microbatches' activations on stage 0, 1F1B two of them
    assert gpipe[0]["saved_peak_bytes"] / one_f_one_b[0]["saved_peak_bytes"] == pytest.approx(4, rel=0.05)


def _waited_and_idled_at_least_its_replay(results: list[Any], forward_ms: float, backward_ms: float) -> None:
    """Every forward and backward lasted at least its stage's sleep, and each rank idled at least as much as
    the same order with the same measured times and free sends allows."""
    timelines = [r["timings"]["timeline_ms"] for r in results]
    for timeline in timelines:
        k = len({stage for stage, *_ in timeline})
        for _, kind, _, a, b in timeline:
            assert b - a >= (forward_ms if kind == "F" else backward_ms) / k - 0.01, (kind, a, b)
    least = M.bubble_fractions(M.replayed_timelines(timelines))
    for measured, bound in zip(M.bubble_fractions(timelines), least, strict=True):
        assert measured >= bound - 1e-3, (measured, bound)  # the timelines are rounded to the microsecond


def test_fixed_time_stages_show_the_gpipe_bubble(two_ranks: list[list[Any]]) -> None:
    for results, m in ((two_ranks[6], 4), (two_ranks[7], 8)):
        ideal = 1 / (m + 1)  # (p − 1)/(m + p − 1), p = 2
        timelines = [r["timings"]["timeline_ms"] for r in results]
        # the schedule's own order, sends free: the formula exactly
        assert M.bubble_fractions(M.replayed_timelines(timelines, 1, 2)) == pytest.approx([ideal] * 2, abs=1e-9)
        # measured: sends only add idle time, more on a busy machine, so no upper bound holds everywhere
        _waited_and_idled_at_least_its_replay(results, 50, 100)


def test_interleaving_reaches_its_smaller_ideal_bubble(two_ranks: list[list[Any]]) -> None:
    """With 2 microbatches on 2 ranks, plain 1F1B's order idles 1/3 of the step, interleaving's (v = 2 stages per
    rank) (p − 1)/(v·m + p − 1) = 0.2."""
    plain, interleaved = two_ranks[8:10]
    for results, ideal in ((plain, 1 / 3), (interleaved, 0.2)):
        timelines = [r["timings"]["timeline_ms"] for r in results]
        assert M.bubble_fractions(M.replayed_timelines(timelines, 1, 2)) == pytest.approx([ideal] * 2, abs=1e-9)
        _waited_and_idled_at_least_its_replay(results, 50, 100)


def test_replaying_a_drawn_step_removes_the_time_sends_took() -> None:
    # the drawn GPipe step of test_bubble_fractions_of_a_drawn_gpipe_step, with every send 0.5 late on stage 1
    stage0 = [(0, "F", 0, 0, 1), (0, "F", 1, 1, 2), (0, "B", 0, 6, 8), (0, "B", 1, 8.5, 10.5)]
    stage1 = [(1, "F", 0, 1.5, 2.5), (1, "F", 1, 2.5, 3.5), (1, "B", 0, 3.5, 5.5), (1, "B", 1, 5.5, 7.5)]
    assert M.bubble_fractions([stage0, stage1]) > [1 / 3, 1 / 3]
    replayed = M.replayed_timelines([stage0, stage1], forward=1, backward=2)
    assert [e[3:] for e in replayed[1]] == [(1, 2), (2, 3), (3, 5), (5, 7)]
    assert M.bubble_fractions(replayed) == pytest.approx([1 / 3, 1 / 3])
    # with the measured times (here the same 1 and 2): the same, and never more idle than measured
    assert M.replayed_timelines([stage0, stage1]) == replayed
    # a rank with two stages (interleaved) runs each for half its time per microbatch
    one_rank = [[(0, "F", 0, 0, 9), (1, "F", 0, 9, 10), (1, "B", 0, 10, 20), (0, "B", 0, 20, 99)]]
    assert [e[3:] for e in M.replayed_timelines(one_rank, 1, 2)[0]] == [(0, 0.5), (0.5, 1), (1, 2), (2, 3)]
    assert [e[3:] for e in M.replayed_timelines(one_rank)[0]] == [(0, 9), (9, 10), (10, 20), (20, 99)]


def test_what_cannot_be_replayed_is_refused() -> None:
    stage0 = [(0, "B", 0, 0, 1), (0, "F", 0, 1, 2)]  # its backward first: it waits for stage 1's, which waits for it
    stage1 = [(1, "F", 0, 0, 1), (1, "B", 0, 1, 2)]
    with pytest.raises(ValueError, match="wait for each other"):
        M.replayed_timelines([stage0, stage1], 1, 2)
    good0 = [(0, "F", 0, 0, 1), (0, "B", 0, 1, 2)]
    with pytest.raises(ValueError, match="appears twice"):  # two steps in one timeline
        M.replayed_timelines([good0 + good0, stage1])
    with pytest.raises(ValueError, match=r"stages \[1\] ran nothing"):  # rank 1's timeline left out
        M.replayed_timelines([good0, [(2, "F", 0, 0, 1), (2, "B", 0, 1, 2)]])
    with pytest.raises(ValueError, match="different microbatches"):
        M.replayed_timelines([good0, stage1[:1]])
    with pytest.raises(ValueError, match="empty"):
        M.replayed_timelines([[], []])


def test_pitfalls_raise_the_messages_the_notebook_explains(two_ranks: list[list[Any]]) -> None:
    for rank in two_ranks[-1]:
        assert "nll_loss_forward.default got mixed torch.Tensor and DTensor" in rank["loss outside loss_parallel"]
        assert "nll_loss_backward.default got mixed" in rank["backward outside loss_parallel"]


def test_four_ranks_meshes_and_fsdp2_times_tp_training_equals_one_process(tmp_path: Path) -> None:
    calls = [(M.mesh_demo, {}), (M.mesh_demo, {"shape": (2, 1, 2), "names": ("pp", "dp", "tp")}),
             (M.fsdp_tp_demo, {"checkpoint": str(tmp_path / "dcp")})]
    ranks = launch(M.run_demos, 4, calls, timeout=240, quiet=True)
    assert [r[0]["coordinate"] for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert ranks[1][0]["groups"] == {"dp": [1, 3], "tp": [0, 1]}  # tp: neighbours; dp: across
    assert ranks[3][1]["groups"] == {"pp": [1, 3], "dp": [3], "tp": [2, 3]}
    for r in ranks:
        fsdp_tp = r[2]
        assert fsdp_tp["losses_equal"] and fsdp_tp["weights_equal"], fsdp_tp
        assert fsdp_tp["placements"]["blocks.0.proj.weight"] == "(Shard(dim=0), Shard(dim=1))"
        assert fsdp_tp["params"] < fsdp_tp["params_one_process"] / 3
        # PyTorch's clip_grad_norm_ refuses two meshes; M.clip_grad_norm_ clipped as one process's did (above)
        assert "must have the same mesh" in fsdp_tp["clip_error"]
        # the checkpoint loads on a 4-way tensor-parallel mesh equal, into a plain GPT silently wrong
        assert fsdp_tp["loaded_equal"] == {"tp": True, "fsdp plain GPT": False}
        assert fsdp_tp["plain_differs_in"] == [f"blocks.{i}.qkv.{k}" for i in (0, 1) for k in ("bias", "weight")]
        assert fsdp_tp["plain_equal_read_head_major"]  # qkv's rows in TPBlock's order: the layout, not the values
        assert "to a different device mesh" in fsdp_tp["fsdp_first_error"]  # FSDP2 first, then TP: refused
        assert fsdp_tp["grad_norm_before_clipping"] > 0.1  # so clipping acted, and still matched one process
    assert (tmp_path / "dcp" / ".metadata").is_file()


def test_clip_grad_norm_of_plain_parameters_is_pytorchs() -> None:
    torch.manual_seed(0)
    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    b.load_state_dict(a.state_dict())
    x = torch.randn(3, 4)
    a(x).square().sum().backward()
    b(x).square().sum().backward()
    ours = M.clip_grad_norm_(list(a.parameters()), 0.1)
    theirs = torch.nn.utils.clip_grad_norm_(b.parameters(), 0.1)
    assert torch.allclose(ours, theirs)
    assert all(torch.allclose(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_three_dimensions_on_eight_ranks_equal_one_process() -> None:
    ranks = launch(M.three_d_demo, 8, timeout=240, quiet=True)
    assert [r["coordinate"] for r in ranks][:3] == [(0, 0, 0), (0, 0, 1), (0, 1, 0)]
    assert all(r["grads_equal"] for r in ranks), [r["max_diff"] for r in ranks]
    assert [("loss_equal" in r) for r in ranks] == [False] * 4 + [True] * 4  # the last stage computes the loss
    assert all(r["loss_equal"] for r in ranks[4:])
