"""Writes the first draft of notebooks/11_model_parallel.ipynb (cells without outputs; make sync adds the
generated cells, tools/refresh_notebooks.py executes it). Kept while the notebook is drafted; removed once it is
edited in JupyterLab."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
cells: list[tuple[str, str, list[str]]] = []


def md(text: str) -> None:
    cells.append(("markdown", text.strip("\n"), []))


def code(text: str, *tags: str) -> None:
    cells.append(("code", text.strip("\n"), list(tags)))


md("""
# 11 · Model parallelism: tensor, sequence and pipeline

Data parallelism (notebooks [05](05_distributed_data_parallel.ipynb) and
[08](08_fully_sharded_data_parallel.ipynb)) gives every GPU the whole model and a share of the batch. FSDP2
shards the *stored* weights, but each GPU still runs every layer on whole activations. Two walls remain: a layer
whose working set does not fit one GPU, and a batch too small to give thousands of GPUs a share each. Every
large model is therefore also split **inside the model**:

- **tensor parallelism** (TP) cuts each linear layer's weight, so a layer's matrix products run on several GPUs;
- **sequence parallelism** (SP) cuts what TP leaves whole (the norms' activations) along the sequence;
- **pipeline parallelism** (PP) gives each GPU a few consecutive layers, and streams microbatches through them.

What you will learn:
- a **DeviceMesh**: ranks arranged in named dimensions, and why TP lives inside a node and PP/DP across nodes;
- TP of the course's GPT block with **DTensor** placements (`Shard`, `Replicate`, `Partial`), checked equal
  to the unsharded block, its all-reduces **counted by PyTorch** against the Megatron-LM paper;
- SP's all-gather + reduce-scatter (same bytes as the all-reduce), and **loss parallel** for a
  vocabulary-sharded head;
- pipeline **schedules** (GPipe, 1F1B, interleaved): the bubble measured against `(p − 1)/(m + p − 1)`, and
  the activations each keeps.

Everything runs on gloo CPU processes, as in notebooks 05 and 08: the point here is *what* each scheme
computes, moves and keeps, which is the same on a laptop as on a cluster. How fast it runs on NVLink or
InfiniBand is not measured here; where the text says it, it cites a source.
""")

code("""
import matplotlib.pyplot as plt

from course_utils.distributed import model_parallel_demos as M
from course_utils.distributed.launch import launch, start_worker_pool

start_worker_pool()  # the workers' processes import torch once, in the background
""")

md("""
Starting processes costs seconds, so the notebook starts them **twice in all**: once on 2 ranks and once on
4, each running every demo of the lesson in turn (`run_demos`). The later cells only read the results. Each
worker is a function in `course_utils.distributed.model_parallel_demos` (a new process cannot import a
function defined in a notebook); open it to see the code each section describes. A worker returns
verdicts, counts and bytes, which are the same on every machine, and, apart under `"timings"`, what its
clock said.
""")

code("""
TWO = {"tp": (M.tp_block_demo, {}), "sp": (M.tp_block_demo, {"sequence_parallel": True}),
       "loss_parallel": (M.loss_parallel_demo, {}),
       "GPipe": (M.pipeline_demo, {"schedule": "GPipe", "n_microbatches": 8}),
       "1F1B": (M.pipeline_demo, {"schedule": "1F1B", "n_microbatches": 8}),
       "Interleaved1F1B": (M.pipeline_demo, {"schedule": "Interleaved1F1B", "n_microbatches": 4}),
       "bubble GPipe m=4": (M.bubble_demo, {"schedule": "GPipe", "n_microbatches": 4}),
       "bubble 1F1B m=8": (M.bubble_demo, {"schedule": "1F1B", "n_microbatches": 8}),
       "bubble Interleaved1F1B m=4": (M.bubble_demo, {"schedule": "Interleaved1F1B", "n_microbatches": 4})}
FOUR = {"mesh 2-D": (M.mesh_demo, {"shape": (2, 2), "names": ("dp", "tp")}),
        "mesh 3-D": (M.mesh_demo, {"shape": (2, 1, 2), "names": ("pp", "dp", "tp")}),
        "bubble GPipe m=4": (M.bubble_demo, {"schedule": "GPipe", "n_microbatches": 4}),
        "bubble 1F1B m=8": (M.bubble_demo, {"schedule": "1F1B", "n_microbatches": 8})}


def run(calls, world_size):
    \"\"\"{name: [result of rank 0, rank 1, ...]} from one launch of every worker in ``calls``.\"\"\"
    ranks = launch(M.run_demos, world_size, list(calls.values()), timeout=240, quiet=True)
    return {name: [r[i] for r in ranks] for i, name in enumerate(calls)}


two, four = run(TWO, 2), run(FOUR, 4)
print(f"{len(two)} demos ran on 2 ranks, {len(four)} on 4 ranks")
""")

md("""
## 1. The mesh: ranks with named dimensions

With one kind of parallelism, a rank's number says all: rank 3 holds the fourth share of the batch. With
several, each rank has one coordinate per kind: *which* data-parallel replica, *which* tensor-parallel
shard. `init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))` lays the ranks out as a 2 × 2 array,
row-major: the last dimension varies fastest. Each dimension gives every rank a **group**: the ranks that
differ from it only along that dimension, the ones it talks to for that kind of parallelism.
""")

code("""
for name in ("mesh 2-D", "mesh 3-D"):
    results = four[name]
    print(name, "layout:", results[0]["mesh"])
    for r in results:
        print(f"  rank {r['rank']}: coordinate {r['coordinate']}, groups {r['groups']}")
print("tp groups are neighbours (ranks 2k, 2k+1):",
      all(r["groups"]["tp"] == [r["rank"] // 2 * 2, r["rank"] // 2 * 2 + 1] for r in four["mesh 2-D"]))
""")

md("""
The order is a choice, and it matters on real hardware. Launchers number the GPUs of one node consecutively
(ranks 0–7 on node 0, 8–15 on node 1), so the **last** mesh dimension is the one that stays inside a node.
That is where TP goes, because of how often it talks: section 2 counts **four all-reduces of the whole
activation per block per step**, each on the critical path (the next layer waits for it). Data parallelism
all-reduces the gradients once per step, overlapped with the backward pass; pipeline parallelism sends one
activation per microbatch from a stage to the next, point to point. Those tolerate a slower link.

How much slower, cited (not measured here): NVLink 4 gives an H100 or H200 900 GB/s in total to the other GPUs
of its node (NVIDIA's H100 and H200 datasheets); a node's network is typically one 400 Gb/s InfiniBand NDR link
per GPU, 50 GB/s each way. The Ultra-Scale Playbook (Hugging Face, 2025) measures TP's throughput falling
steeply once it spans more than one 8-GPU node, and recommends TP within a node, PP and DP across nodes. Hence
torchtitan's mesh order `("pp", "dp", "tp")`, the 3-D mesh above.
""")

md("""
## 2. Tensor parallelism of a GPT block

A linear layer `y = x Wᵀ` can be split two ways. **Column-wise**: each rank holds some of `W`'s output rows and
computes those output features, from the whole input; no communication, and its output is a *shard* of `y`.
**Row-wise**: each rank holds some of the input features' columns, takes its shard of `x`, and computes a
*partial sum* of the whole `y`; an all-reduce adds the partial sums. Megatron-LM (Shoeybi et al. 2019) pairs
them so that the shard one produces is exactly what the next consumes: column-wise `fc`, then row-wise `out`
in the MLP (the GELU works feature by feature, so it runs on the shard), and column-wise `qkv`, then row-wise
`proj` in attention (attention works head by head, so each rank runs its own heads). One all-reduce per pair
in forward; in backward, one all-reduce of the input's gradient per column-wise layer.

PyTorch writes these states as **DTensor placements**, per mesh dimension: `Shard(d)` (each rank holds a slice
along dimension `d`), `Replicate()` (each rank holds all of it), `Partial()` (each rank holds a summand; the
value is their sum). `ColwiseParallel` makes a weight `Shard(0)`, `RowwiseParallel` makes it `Shard(1)` and its
output `Partial` until the all-reduce turns it into `Replicate`.

**The pitfall: the order of qkv's rows.** The course's `Block` computes q, k and v with one fused linear
whose rows are all of q, then all of k, then all of v. `ColwiseParallel` cuts rows into contiguous pieces:
on 2 ranks, rank 0 would get q and half of k, and no rank could compute a head. Megatron-LM orders the rows
head by head (q, k, v of head 0, then of head 1, ...); then every contiguous piece holds whole heads.
`M.head_major` does that reordering; `M.TPBlock` reads it.
""")

code("""
import torch

from course_utils.models import Block

d, heads = 8, 2
rows = torch.arange(3 * d)  # row i of the fused qkv weight: q rows 0-7, k rows 8-15, v rows 16-23
print("Block's order, rank 0's half:     ", rows[: 3 * d // 2].tolist())
print("head-major order, rank 0's half:  ", M.head_major(rows, heads)[: 3 * d // 2].tolist())
print("qkv_major undoes it:", torch.equal(M.qkv_major(M.head_major(rows, heads), heads), rows))

cfg = M.BLOCK_CFG
torch.manual_seed(0)
block = Block(cfg)
x = torch.randn(cfg.batch, cfg.seq_len, cfg.d_model)
print("TPBlock unsharded equals Block:", torch.allclose(M.TPBlock.from_block(block)(x), block(x), atol=1e-6))
""")

md("""
The plan for a block is four lines (`M.block_plan`), given to `parallelize_module`, which replaces each
named weight by a DTensor with its placement and adds the collectives at the layers' edges:

```python
{"qkv": ColwiseParallel(), "proj": RowwiseParallel(), "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()}
```

`tp_block_demo` runs the block split over 2 ranks and the unsharded block in the same process on the same
input, and compares the outputs and every gradient (of the weights, gathered back, and of the input). Both are
float32; the sums are taken in another order, so they agree to rounding, not to the bit: the tolerance is
`M.TOLERANCE`.
""")

code("""
tp = two["tp"]
print("tolerance:", M.TOLERANCE)
for r in tp:
    print(f"rank {r['rank']}: output equal {r['output_equal']}, gradients equal {r['grads_equal']}, "
          f"local qkv weight {r['local_qkv_weight']} of ({3 * cfg.d_model}, {cfg.d_model})")
""")

md("""
Each rank holds 96 of the 192 rows of qkv: the q, k and v of 2 of the 4 heads, a `Shard(0)` of the weight.

**What it sends.** PyTorch's `CommDebugMode` records every collective that DTensor issues; the worker counts
them in forward and in backward, and sizes each collective's tensor. Megatron-LM's count is two all-reduces
per block in forward (after `proj`, after `out`) and two in backward (before `qkv`'s and `fc`'s input
gradient leaves), each of the whole activation: `b · t · d` numbers.
""")

code("""
r = tp[0]
btd = r["activation_bytes"]  # b·t·d float32 numbers, in bytes
print(f"b·t·d = {cfg.batch}·{cfg.seq_len}·{cfg.d_model} float32 = {btd} bytes")
print("forward: ", r["forward"], r["forward_bytes"])
print("backward:", r["backward"], r["backward_bytes"])
print("two all-reduces of b·t·d each way, as Megatron-LM counts:",
      all(x[k] == {"all_reduce": 2} and x[k + "_bytes"] == {"all_reduce": 2 * btd}
          for x in tp for k in ("forward", "backward")))
""")

md("""
**What it saves.** Each rank holds half of every split weight; the norms and the row-wise layers' biases are
replicated (each rank adds the bias after the all-reduce, so each needs it whole). Gradients and optimizer
state follow their parameters, so they shrink the same way. Activations are split too, but not all of them:
the block's input, its residual stream and the norms' inputs and outputs are whole on every rank.
""")

code("""
replicated = 2 * (2 * cfg.d_model) + 2 * cfg.d_model  # two LayerNorms (weight, bias), proj's and out's bias
print(f"parameters: {r['params_one_process']} in one process, {r['params']} per rank")
print("  = (whole − replicated) / 2 + replicated:",
      r["params"] == (r["params_one_process"] - replicated) // 2 + replicated)
print(f"saved for backward: {r['saved_bytes_one_process']} bytes in one process, {r['saved_bytes']} per rank "
      f"({r['saved_bytes'] / r['saved_bytes_one_process']:.2f} of it)")
""")

md("""
## 3. Sequence parallelism and loss parallel

TP leaves the LayerNorms, the residual additions and (in training) dropout running on the **whole**
activation on every rank: the same work, and the same saved tensors, `tp` times over. Korthikanti et al.
(2022) notice that these work token by token, so they can be split along the **sequence** instead. The
all-reduce after a row-wise layer becomes a **reduce-scatter** (sum the partial results, keep your share of
the tokens), and before the next column-wise layer an **all-gather** rebuilds the whole sequence. An all-reduce
*is* a reduce-scatter followed by an all-gather, so the bytes moved stay the same. In PyTorch:
`SequenceParallel()` on the norms, `input_layouts=Shard(1)` on the column-wise layers,
`output_layouts=Shard(1)` on the row-wise ones (`M.block_plan(sequence_parallel=True)`).
""")

code("""
sp = two["sp"]
for r in sp:
    print(f"rank {r['rank']}: output equal {r['output_equal']}, gradients equal {r['grads_equal']}")
print("forward: ", sp[0]["forward"], sp[0]["forward_bytes"])
print("backward:", sp[0]["backward"], sp[0]["backward_bytes"])
n = 2  # ranks; a ring moves 2(n−1)/n of an all-reduce's tensor per rank, (n−1)/n of the other two's
for k in ("forward_bytes", "backward_bytes"):
    ring_tp = 2 * (n - 1) / n * tp[0][k]["all_reduce"]
    ring_sp = (n - 1) / n * sum(sp[0][k].values())
    print(f"{k[:-6]:8s} ring traffic per rank: TP {ring_tp:.0f} bytes, TP + SP {ring_sp:.0f} bytes")
print(f"saved for backward per rank: TP {tp[0]['saved_bytes']}, TP + SP {sp[0]['saved_bytes']} bytes")
""")

md("""
Each all-gather's output and each reduce-scatter's input is the whole `b · t · d` activation, the size of the
all-reduce it replaces; a ring moves `(n − 1)/n` of it per rank for each, `2 (n − 1)/n` for the all-reduce: the
same traffic. The activations saved per rank fall, but only a little here; which tensors still stay whole
on every rank, compared with Korthikanti et al.'s count, is still to come in this section.

**Loss parallel.** The head's weight is `V × d`; its logits `b · t · V`, for a large vocabulary the largest
activation of all. Made column-wise, the head gives each rank the logits of its share of the vocabulary;
gathering them for the cross-entropy would undo that. Under `loss_parallel()`, the cross-entropy is computed
from the shards: an all-reduce of each token's maximum, one of its sum of exponentials, one of the target's
logit: `b · t` numbers each, not `b · t · V`. The GPT here has two blocks.
""")

code("""
lp = two["loss_parallel"]
for r in lp:
    print(f"rank {r['rank']}: loss equal {r['loss_equal']}, gradients equal {r['grads_equal']}, "
          f"local head weight {r['local_head_weight']}")
blocks = 2 * 2  # two blocks, two all-reduces each way
print("forward:", lp[0]["forward"], "= blocks'", blocks, "+ the cross-entropy's",
      lp[0]["forward"]["all_reduce"] - blocks)
print("backward:", lp[0]["backward"], "= blocks'", blocks, "+ the head's input gradient",
      lp[0]["backward"]["all_reduce"] - blocks)
""")

md("""
## 4. Pipeline parallelism

Pipeline parallelism gives each rank consecutive layers, a **stage**, and passes activations forward and
gradients back between neighbours: little traffic, one activation per microbatch per boundary. The cost is
**waiting**: stage 1 cannot start before stage 0 finishes. Splitting the batch into `m` **microbatches** lets
stages work on different microbatches at once; what remains idle at the start and the end of a step is the
**bubble**. With `p` equal stages, forward and backward each taking the same time per microbatch on every
stage, the idle share of a step is (Huang et al. 2019, GPipe; Narayanan et al. 2021):

`bubble = (p − 1) / (m + p − 1)`

`torch.distributed.pipelining` runs the stages and a **schedule**: the order in which each stage runs its
microbatches' forwards and backwards. First, correctness: the course's 4-block GPT cut into 2 stages
(`M.GPTPart`), one training step against one process on the whole batch.
""")

code("""
for name in ("GPipe", "1F1B", "Interleaved1F1B"):
    results = two[name]
    print(f"{name:16s} gradients equal on every rank: {all(r['grads_equal'] for r in results)}, "
          f"loss equal: {results[-1]['loss_equal']}")
    for r in results:
        print(f"  rank {r['rank']} (stages {r['stages']}): {r['order']}")
""")

md("""
**GPipe** runs every microbatch's forward, then every backward. **1F1B** starts backwards as early as it can:
after a warm-up of `p − rank` forwards, each stage alternates one forward, one backward. Its bubble is the
same as GPipe's, but a stage keeps at most `p − rank` microbatches' activations, not all `m`: that is why 1F1B
exists. **Interleaved 1F1B** (Narayanan et al. 2021) gives each rank `v` smaller stages (here rank 0 runs
stages 0 and 2, rank 1 stages 1 and 3); it cuts the bubble to `(p − 1)/(v·m + p − 1)` at the price of `v`
times more sends.

The activations each rank kept for backward at once, measured by the worker's saved-tensor meter
(`M.SavedActivations`, which counts each saved storage once and leaves out the weights), on 2 ranks: GPipe and
1F1B with 8 microbatches, interleaved with 4:
""")

code("""
for name in ("GPipe", "1F1B", "Interleaved1F1B"):
    print(f"{name:16s}", "  ".join(f"rank {r['rank']}: {r['saved_peak_bytes']:>8} bytes" for r in two[name]))
whole = two["GPipe"][0]["saved_bytes_one_process"]
print(f"one process, whole batch, all 4 blocks: {whole} bytes")
ratio = two["GPipe"][0]["saved_peak_bytes"] / two["1F1B"][0]["saved_peak_bytes"]
print(f"stage 0 keeps {ratio:.1f}× less with 1F1B (8 microbatches in flight with GPipe, 2 with 1F1B)")
""")

md("""
**The bubble, measured.** Real stages on this machine compete for its two cores, so their times would be
anything but equal. The bubble demo uses stages whose forward takes 20 ms and backward 40 ms, by waiting
(`M.FixedTimeStage`), while the sends and receives between the processes are real. From each rank's
timeline, `M.bubble_fractions` measures its idle share of the step. Sending adds a little idle time that the
formula leaves out, so the check allows the measured bubble to lie up to 0.02 below and 0.1 above the ideal.
""")

code("""
LOW, HIGH = 0.02, 0.1  # measured − ideal must lie in [−LOW, +HIGH]


def bubble_check(results, m, v=1):
    \"\"\"The ideal bubble with p ranks, v stages each, m microbatches; each rank's measured; the verdict.\"\"\"
    p = len(results)
    ideal = (p - 1) / (v * m + p - 1)
    measured = M.bubble_fractions([r["timings"]["timeline_ms"] for r in results])
    return ideal, measured, all(ideal - LOW <= b <= ideal + HIGH for b in measured)


for runs, label in ((two, "p=2"), (four, "p=4")):
    for name, m in (("bubble GPipe m=4", 4), ("bubble 1F1B m=8", 8)):
        ideal, _, ok = bubble_check(runs[name], m)
        print(f"{label} {name[7:]:9s} ideal (p−1)/(m+p−1) = {ideal:.3f}; every rank within tolerance: {ok}")
ideal, _, ok = bubble_check(two["bubble Interleaved1F1B m=4"], 4, v=2)
print(f"p=2 Interleaved1F1B m=4, v=2: ideal (p−1)/(v·m+p−1) = {ideal:.3f}; every rank within tolerance: {ok}")
""")

code("""
for runs, label in ((two, "p=2"), (four, "p=4")):
    for name, m in (("bubble GPipe m=4", 4), ("bubble 1F1B m=8", 8)):
        ideal, measured, _ = bubble_check(runs[name], m)
        print(f"{label} {name[7:]:9s} ideal {ideal:.3f}, measured", " ".join(f"{b:.3f}" for b in measured))
ideal, measured, _ = bubble_check(two["bubble Interleaved1F1B m=4"], 4, v=2)
print(f"p=2 Interleaved1F1B m=4 ideal {ideal:.3f}, measured", " ".join(f"{b:.3f}" for b in measured))
""", "nbval-ignore-output")

md("""
The timelines themselves, as the 4 ranks ran them: forwards light, backwards dark, one box per microbatch.
The white is the bubble. In GPipe, the last stage waits for every forward before the first backward; in
1F1B, the later stages alternate from the start and no stage holds more than `p` microbatches.
""")

code("""
fig, axes = plt.subplots(2, 1, figsize=(10, 4.5), sharex=True)
for ax, name in zip(axes, ("bubble GPipe m=4", "bubble 1F1B m=8")):
    for r in four[name]:
        for stage, kind, mb, start, end in r["timings"]["timeline_ms"]:
            color = "tab:blue" if kind == "F" else "navy"
            ax.broken_barh([(start, end - start)], (stage - 0.4, 0.8), color=color, edgecolor="white")
            ax.text((start + end) / 2, stage, str(mb), ha="center", va="center", color="white", fontsize=7)
    ax.set_yticks(range(4), [f"stage {s}" for s in range(4)])
    ax.invert_yaxis()
    ax.set_title(name[7:] + " on 4 ranks (measured)")
axes[-1].set_xlabel("ms since the step started")
fig.tight_layout()
plt.show()
""", "nbval-ignore-output")

md("""
## Still to come

This draft covers sections 1–4. Still to be written: section 3's saved activations compared with
Korthikanti et al.'s formula, tensor by tensor; section 5, 2-D and 3-D parallelism (FSDP2 × TP on a 2 × 2 mesh
trained against one process, a DCP checkpoint loaded on another mesh); section 6, choosing `(dp, tp, pp)` with
the memory plan of notebook 08 extended by tp and pp; the pitfalls with their real error messages; the
checked exercises; the summary.
""")

nb = {"cells": [], "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                               "name": "python3"},
                                "language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
for i, (kind, text, tags) in enumerate(cells):
    lines = text.split("\n")
    cell = {"cell_type": kind, "id": f"c11-{i + 1:03d}", "metadata": {"tags": tags} if tags else {},
            "source": [line + "\n" for line in lines[:-1]] + [lines[-1]]}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    nb["cells"].append(cell)
(ROOT / "notebooks" / "11_model_parallel.ipynb").write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
print(len(nb["cells"]), "cells")
