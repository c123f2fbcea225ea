"""Notebook 11: the workers of model parallelism on a DeviceMesh of gloo CPU processes: the mesh, tensor and
sequence parallelism of the course's `Block`, loss parallel, pipeline schedules of the course's `GPT`, and
FSDP2 × TP on a 2 × 2 mesh and PP × FSDP2 × TP on 2 × 2 × 2; each checked against one process.

Each worker runs in a process started by `course_utils.distributed.launch.launch`, with the gloo process group
already set up, and returns small picklable results: verdicts, counts and byte sizes (the same on every
machine), and, apart under ``"timings"``, what the clock said. Every launch costs seconds: `run_demos` runs
several workers in one.

- `head_major`, `qkv_major`, `TPBlock`: the course's `Block` made ready for tensor parallelism. Its fused qkv
  weight holds all of q, then k, then v; ``ColwiseParallel`` cuts the rows into contiguous pieces, so rank 0
  would get q and half of k. Megatron-LM orders the rows by head (q, k, v of head 0, then head 1, ...):
  then each piece holds whole heads. `TPBlock` reads that order and counts its heads from the tensor it gets.
- `block_plan`, `tensor_parallel_gpt`: the ``parallelize_module`` plans (column-wise qkv and fc, row-wise proj
  and out; with sequence parallelism, the norms sharded along the sequence).
- `SavedActivations`: the bytes autograd holds for backward while a block runs, and the most it held.
- `CollectiveBytes`: the size of each collective's tensor (``CommDebugMode`` counts them, without sizes).
- Workers: `mesh_demo`, `tp_block_demo`, `loss_parallel_demo`, `pipeline_demo`, `bubble_demo`,
  `fsdp_tp_demo`, `three_d_demo`, `pitfalls_demo`; `run_demos` runs several in one launch.
- `GPTPart`: blocks ``start:stop`` of a `GPT`, a pipeline stage; `FixedTimeStage`: a stage whose forward and
  backward take a fixed time (a sleep), for a bubble free of this machine's noise.
- `bubble_fractions`: each stage's idle share of a pipeline step, from the ranks' timelines;
  `replayed_timelines`: the same order of work with sends that cost nothing (the schedule's own bubble, or
  the least one the measured times allow).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from ..models import GPT, Block, GPTConfig, token_batch

__all__ = ["BLOCK_CFG", "PIPE_CFG", "TOLERANCE", "CollectiveBytes", "FixedTimeStage", "GPTPart",
           "SavedActivations", "TPBlock", "block_plan", "bubble_demo", "bubble_fractions", "clip_grad_norm_",
           "fsdp_tp_demo", "head_major", "loss_parallel_demo", "mesh_demo", "pipeline_demo", "pitfalls_demo",
           "qkv_major", "replayed_timelines", "run_demos", "tensor_parallel_gpt", "three_d_demo", "tp_block_demo"]

# PyTorch documents __torch_dispatch__ modes with this class ("Extending PyTorch"); it lives in a module whose
# name starts with an underscore, which `import torch` has already loaded.
TorchDispatchMode: Any = torch.utils._python_dispatch.TorchDispatchMode

TOLERANCE = 1e-5  # the largest difference from one process allowed (float32 sums taken in another order)
BLOCK_CFG = GPTConfig(vocab=256, seq_len=16, d_model=64, n_heads=4, n_layers=1, batch=4)  # `tp_block_demo`'s


# --- the block, ready for tensor parallelism -------------------------------------------------------------


def head_major(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """qkv rows ordered (q, k, v) × heads, as `Block` has them, reordered heads × (q, k, v) (Megatron-LM)."""
    return t.unflatten(0, (3, n_heads, -1)).transpose(0, 1).flatten(0, 2)


def qkv_major(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of `head_major`: back to `Block`'s order."""
    return t.unflatten(0, (n_heads, 3, -1)).transpose(0, 1).flatten(0, 2)


class TPBlock(Block):
    """`Block` with its qkv rows in `head_major` order, whose attention takes the number of heads from the
    tensor: under ``ColwiseParallel`` each rank's qkv gives ``3 · d / tp`` features, its own ``n_heads / tp``
    heads (`Block` would ``view`` them as all ``n_heads`` and fail). Unsharded, it computes what `Block` does."""

    @classmethod
    def from_block(cls, block: Block) -> TPBlock:
        """A `TPBlock` with ``block``'s weights (qkv rows reordered)."""
        d = block.norm1.normalized_shape[0]
        new = cls(GPTConfig(d_model=d, n_heads=block.n_heads))
        state = block.state_dict()
        for name in ("qkv.weight", "qkv.bias"):
            state[name] = head_major(state[name], block.n_heads)
        new.load_state_dict(state)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape  # a DTensor (sequence parallelism) reports its global shape
        head = d // self.n_heads
        q, k, v = self.qkv(self.norm1(x)).view(b, t, -1, 3, head).unbind(3)  # -1: the heads this rank holds
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp(self.norm2(x))


def block_plan(sequence_parallel: bool = False, prefix: str = "") -> dict[str, ParallelStyle]:
    """Megatron-LM's plan for a block: qkv and the MLP's fc column-wise (each rank computes its heads, its
    quarter of the hidden features), proj and the MLP's out row-wise (partial sums, added by an all-reduce).
    With ``sequence_parallel`` the norms run on each rank's share of the sequence; an all-gather brings the
    whole sequence before qkv and fc, a reduce-scatter replaces the all-reduce after proj and out (the
    block's input and output are then DTensors sharded along the sequence)."""
    if not sequence_parallel:
        plan: dict[str, ParallelStyle] = {"qkv": ColwiseParallel(), "proj": RowwiseParallel(),
                                          "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()}
    else:
        seq = Shard(1)
        plan = {"norm1": SequenceParallel(), "qkv": ColwiseParallel(input_layouts=seq),
                "proj": RowwiseParallel(output_layouts=seq, use_local_output=False),
                "norm2": SequenceParallel(), "mlp.0": ColwiseParallel(input_layouts=seq),
                "mlp.2": RowwiseParallel(output_layouts=seq, use_local_output=False)}
    return {prefix + name: style for name, style in plan.items()}


def tensor_parallel_gpt(cfg: GPTConfig, mesh: DeviceMesh, vocab_sharded_head: bool = False,
                        seed: int = 0, sequence_parallel: bool = False) -> GPT:
    """The course's `GPT` (made after ``torch.manual_seed(seed)``, the weights of any process's GPT) with
    `TPBlock` blocks, parallelized over ``mesh`` by `block_plan`; embeddings replicated. With
    ``vocab_sharded_head`` the head is column-wise too and its logits stay a DTensor sharded over the
    vocabulary (for ``loss_parallel``).

    With ``sequence_parallel``, the blocks run `block_plan(sequence_parallel=True)` and the edges change:
    before block 0 each rank keeps its share of the embeddings' output (``PrepareModuleInput``, ``Replicate()``
    to ``Shard(1)``); the final norm runs on the shares (``SequenceParallel()``); the head gets the whole
    sequence gathered (``PrepareModuleInput``, ``Shard(1)`` to ``Replicate()``), or, vocabulary-sharded, is
    column-wise with ``input_layouts=Shard(1)``. Without it the final norm and the head are replicated."""
    torch.manual_seed(seed)
    gpt = GPT(cfg)
    plan: dict[str, ParallelStyle] = {}
    for i, block in enumerate(gpt.blocks):
        assert isinstance(block, Block)
        gpt.blocks[i] = TPBlock.from_block(block)
        plan |= block_plan(sequence_parallel, prefix=f"blocks.{i}.")
    seq = Shard(1)
    if sequence_parallel:
        plan["blocks.0"] = PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=seq)
        plan["norm"] = SequenceParallel()
    if vocab_sharded_head:
        plan["head"] = ColwiseParallel(input_layouts=seq if sequence_parallel else Replicate(),
                                       output_layouts=Shard(-1), use_local_output=False)
    elif sequence_parallel:
        plan["head"] = PrepareModuleInput(input_layouts=seq, desired_input_layouts=Replicate(),
                                          use_local_output=True)
    parallelize_module(gpt, mesh, plan)  # in place
    return gpt


def _full(name: str, t: torch.Tensor, n_heads: int | None) -> torch.Tensor:
    """A parameter or gradient as one process has it: gathered, and qkv rows back in `Block`'s order (from
    `TPBlock`'s, for ``n_heads`` heads; ``None``: as stored)."""
    whole = t.full_tensor() if isinstance(t, DTensor) else t
    return qkv_major(whole, n_heads) if n_heads and name.endswith(("qkv.weight", "qkv.bias")) else whole


def _max_diff(model: nn.Module, reference: nn.Module, n_heads: int | None, grads: bool = True) -> float:
    """The largest difference between the gradients (or the weights) of ``model`` and ``reference``."""
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        a, b = (p.grad, q.grad) if grads else (p, q)
        assert a is not None and b is not None, f"{name} has no gradient"
        worst = max(worst, (_full(name, a, n_heads) - b).abs().max().item())
    return worst


# --- what a rank holds and sends ------------------------------------------------------------------------


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class SavedActivations:
    """The bytes autograd keeps for backward, counted while they are kept::

        saved = SavedActivations(model)
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            loss = model(x).sum()      # saved.now grows ...
        loss.backward()                # ... and falls as backward frees what it used
        saved.peak                     # the most held at once

    A storage saved several times counts once; ``exclude``'s parameters (which ``linear`` saves for its
    backward) do not count; a DTensor counts its local shard."""

    def __init__(self, exclude: nn.Module | None = None) -> None:
        params = exclude.parameters() if exclude is not None else []
        self.skip = {_local(p).untyped_storage().data_ptr() for p in params}
        self.refs: dict[int, int] = defaultdict(int)  # storage → how many saved tensors use it
        self.now = 0
        self.peak = 0

    def pack(self, t: torch.Tensor) -> Any:
        storage = _local(t).untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if key in self.skip or size == 0:
            return t
        if self.refs[key] == 0:
            self.now += size
            self.peak = max(self.peak, self.now)
        self.refs[key] += 1
        return _Kept(t, self, key, size)

    def unpack(self, kept: Any) -> torch.Tensor:
        return kept.tensor if isinstance(kept, _Kept) else kept

    def release(self, key: int, size: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            self.now -= size


class _Kept:
    """A saved tensor; when autograd lets go of it (after its backward), `SavedActivations` is told."""

    def __init__(self, tensor: torch.Tensor, saved: SavedActivations, key: int, size: int) -> None:
        self.tensor, self.saved, self.key, self.size = tensor, saved, key, size

    def __del__(self) -> None:
        self.saved.release(self.key, self.size)


class CollectiveBytes(TorchDispatchMode):
    """The bytes of each collective's full tensor (an all-reduce's input, an all-gather's output, a
    reduce-scatter's input), summed by collective: ``with CollectiveBytes() as c: ...; c.bytes``.
    A ring moves ``2 (n−1)/n`` of that per rank for an all-reduce, ``(n−1)/n`` for the other two."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if any(t is DTensor for t in types):
            return NotImplemented  # let DTensor turn the op into local ops and collectives, seen next
        out = func(*args, **(kwargs or {}))
        if getattr(func, "namespace", None) == "_c10d_functional" and isinstance(args[0], torch.Tensor):
            name = func._overloadpacket.__name__
            if name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"):
                self.bytes[name] += max(args[0].nbytes, out.nbytes)
        return out


def _counts(mode: CommDebugMode) -> dict[str, int]:
    """``CommDebugMode``'s counts, by the collective's short name (``all_reduce``)."""
    return {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}


def _params(model: nn.Module) -> int:
    """Parameters this rank holds (a DTensor's local shard)."""
    return sum(_local(p).numel() for p in model.parameters())


# --- the workers ----------------------------------------------------------------------------------------


def mesh_demo(rank: int, world_size: int, shape: tuple[int, ...] = (2, 2),
              names: tuple[str, ...] = ("dp", "tp")) -> dict[str, Any]:
    """``init_device_mesh("cpu", shape, mesh_dim_names=names)``: the ranks' layout, this rank's coordinate,
    and the ranks of its group along each dimension (the ranks it talks to for that kind of parallelism)."""
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    return {"rank": rank, "mesh": mesh.mesh.tolist(), "coordinate": tuple(mesh.get_coordinate() or ()),
            "groups": {name: dist.get_process_group_ranks(mesh.get_group(name)) for name in names}}


def tp_block_demo(rank: int, world_size: int, sequence_parallel: bool = False) -> dict[str, Any]:
    """The course's `Block` split over ``world_size`` ranks (`TPBlock`, `block_plan`) against the whole
    block in this process, on the same input: the outputs and every gradient (weights and input) equal
    within `TOLERANCE`; ``CommDebugMode``'s collectives in forward and backward, with their sizes
    (`CollectiveBytes`); the parameters and the activations saved for backward on this rank and in one
    process."""
    cfg = BLOCK_CFG
    torch.manual_seed(0)
    reference = Block(cfg)
    x = torch.randn(cfg.batch, cfg.seq_len, cfg.d_model, generator=torch.Generator().manual_seed(1))
    x_ref = x.clone().requires_grad_()
    whole = SavedActivations(reference)
    with torch.autograd.graph.saved_tensors_hooks(whole.pack, whole.unpack):
        out_ref = reference(x_ref)
    out_ref.square().mean().backward()

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    block = TPBlock.from_block(reference)
    parallelize_module(block, mesh, block_plan(sequence_parallel))  # in place: the same module, sharded
    x_tp = x.clone().requires_grad_()
    # with sequence parallelism each rank starts with its share of the sequence: a tensor of its own (as the
    # previous block's output would be), not a view that keeps the whole input's storage alive
    share = x_tp.chunk(world_size, dim=1)[rank].clone()
    inp = DTensor.from_local(share, mesh, [Shard(1)]) if sequence_parallel else x_tp
    saved = SavedActivations(block)
    with CommDebugMode() as fwd, CollectiveBytes() as fwd_bytes:
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            out = block(inp)
    with CommDebugMode() as bwd, CollectiveBytes() as bwd_bytes:
        # this rank's part of mean(out²): the gradient of each rank's share of the output is exact
        (_local(out).square().sum() / out_ref.numel()).backward()

    assert x_tp.grad is not None and x_ref.grad is not None
    mine, expected = x_tp.grad, x_ref.grad
    if sequence_parallel:  # this rank's share of the sequence is where its gradient lands
        mine, expected = mine.chunk(world_size, dim=1)[rank], expected.chunk(world_size, dim=1)[rank]
    out_diff = (_full("out", out, cfg.n_heads) - out_ref).abs().max().item()
    grad_diff = max(_max_diff(block, reference, cfg.n_heads), (mine - expected).abs().max().item())
    return {"rank": rank, "sequence_parallel": sequence_parallel,
            "output_equal": out_diff < TOLERANCE, "grads_equal": grad_diff < TOLERANCE,
            "max_diff": max(out_diff, grad_diff),
            "forward": _counts(fwd), "backward": _counts(bwd),
            "forward_bytes": dict(fwd_bytes.bytes), "backward_bytes": dict(bwd_bytes.bytes),
            "activation_bytes": x.nbytes,  # b·t·d·4, the paper's unit
            "params": _params(block), "params_one_process": _params(reference),
            "saved_bytes": saved.peak, "saved_bytes_one_process": whole.peak,
            "local_qkv_weight": tuple(_local(block.qkv.weight).shape),
            "norm_grad_placements": str(getattr(block.norm1.weight.grad, "placements", "a plain tensor"))}


def loss_parallel_demo(rank: int, world_size: int) -> dict[str, Any]:
    """A GPT with tensor-parallel blocks and a head sharded over the vocabulary: under ``loss_parallel`` the
    cross-entropy is computed from the sharded logits (no rank holds all b·t·V of them). Its loss and
    gradients against one process, and ``CommDebugMode``'s collectives in forward and backward."""
    cfg = GPTConfig(n_layers=2)
    tokens = token_batch(cfg, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    reference = GPT(cfg)
    ref_loss = reference.loss(tokens)
    ref_loss.backward()

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    gpt = tensor_parallel_gpt(cfg, mesh, vocab_sharded_head=True)
    with loss_parallel():  # the backward too must run inside it
        with CommDebugMode() as fwd:
            loss = gpt.loss(tokens)
        with CommDebugMode() as bwd:
            loss.backward()
    loss_diff = abs(_full("loss", loss, cfg.n_heads).item() - ref_loss.item())
    grad_diff = _max_diff(gpt, reference, cfg.n_heads)
    return {"rank": rank, "loss_equal": loss_diff < TOLERANCE, "grads_equal": grad_diff < TOLERANCE,
            "max_diff": max(loss_diff, grad_diff), "forward": _counts(fwd), "backward": _counts(bwd),
            "local_head_weight": tuple(_local(gpt.head.weight).shape), "params": _params(gpt)}


# --- pipeline parallelism -------------------------------------------------------------------------------

PIPE_CFG = GPTConfig(vocab=256, seq_len=33, d_model=64, n_heads=4, n_layers=4, batch=16)  # `pipeline_demo`'s


class GPTPart(nn.Module):
    """Blocks ``start:stop`` of ``gpt`` (sharing its weights), with the embeddings in the first part and the
    final norm and head in the last: one pipeline stage."""

    def __init__(self, gpt: GPT, start: int, stop: int) -> None:
        super().__init__()
        first, last = start == 0, stop == len(gpt.blocks)
        self.tok: nn.Module | None = gpt.tok if first else None
        self.pos: nn.Module | None = gpt.pos if first else None
        self.blocks = nn.ModuleList(gpt.blocks[start:stop])
        self.norm: nn.Module | None = gpt.norm if last else None
        self.head: nn.Module | None = gpt.head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None and self.pos is not None:  # tokens in, vectors out
            x = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        for block in self.blocks:
            x = block(x)
        if self.norm is not None and self.head is not None:
            x = self.head(self.norm(x))
        return x


def _next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """`GPT.loss` from logits: the pipeline's last stage computes it for each microbatch."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


Timeline = list[tuple[int, str, int, float, float]]  # (stage, "F" or "B", microbatch, start s, end s)


def _timed(stage: Any, timeline: Timeline) -> Any:
    """``stage`` with its forward and backward of one microbatch timed into ``timeline`` (the schedules call
    these two methods; receiving and sending happen outside them)."""
    for kind, name in (("F", "forward_one_chunk"), ("B", "backward_one_chunk")):
        setattr(stage, name, _timer(getattr(stage, name), stage.stage_index, kind, timeline))
    return stage


def _timer(run: Callable[..., Any], stage: int, kind: str, timeline: Timeline) -> Callable[..., Any]:
    """``run(chunk, ...)``, noting ``(stage, kind, chunk, start, end)`` in ``timeline``."""
    def timed(chunk: int, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = run(chunk, *args, **kwargs)
        timeline.append((stage, kind, chunk, start, time.perf_counter()))
        return out
    return timed


def _schedule(parts: dict[int, nn.Module], n_stages: int, schedule: str, n_microbatches: int,
              loss_fn: Callable[..., torch.Tensor], timeline: Timeline) -> Any:
    """A ``torch.distributed.pipelining`` schedule (``"GPipe"``, ``"1F1B"``, ``"Interleaved1F1B"``...) over
    this rank's stages ``{stage index: module}``, each timed into ``timeline``."""
    from torch.distributed import pipelining
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti

    stages = [_timed(pipelining.PipelineStage(part, index, n_stages, torch.device("cpu")), timeline)
              for index, part in parts.items()]
    cls = getattr(pipelining, f"Schedule{schedule}")
    several = issubclass(cls, PipelineScheduleMulti)  # interleaved: several stages per rank
    return cls(stages if several else stages[0], n_microbatches, loss_fn=loss_fn)


def _stages_of(rank: int, world_size: int, schedule: str) -> list[int]:
    """The stages a rank runs: one, or with an interleaved schedule two, ``rank`` and ``rank + world_size``
    (the loop: stage 0 → 1 → ... on the ranks in turn, twice)."""
    return [rank, rank + world_size] if schedule.startswith("Interleaved") else [rank]


def _step(pipe: Any, rank: int, world_size: int, inputs: torch.Tensor, targets: torch.Tensor) -> list[Any]:
    """One pipeline step: the first rank feeds the inputs, the last the targets; the losses come back there."""
    losses: list[Any] = []
    if rank == 0:
        pipe.step(inputs)
    elif rank == world_size - 1:
        pipe.step(target=targets, losses=losses)
    else:
        pipe.step()
    return losses


def _first_step(pipe: Any, rank: int, world_size: int, inputs: torch.Tensor, targets: torch.Tensor,
                model: nn.Module) -> None:
    """A step not measured: the stages learn the shapes they send and receive from it. It leaves
    ``model``'s weights as they were (no optimizer) and its gradients are cleared."""
    _step(pipe, rank, world_size, inputs, targets)
    model.zero_grad()


def _timed_step(pipe: Any, rank: int, world_size: int, inputs: torch.Tensor, targets: torch.Tensor,
                timeline: Timeline, saved: SavedActivations | None = None) -> tuple[list[Any], float, float]:
    """A measured step: its losses, the time it took, and the common origin of its timeline (rank 0's clock;
    one machine, one monotonic clock). ``saved`` counts the bytes kept for backward meanwhile."""
    timeline.clear()
    origin = torch.tensor([time.perf_counter()], dtype=torch.float64)
    dist.barrier()
    dist.broadcast(origin, 0)
    start = time.perf_counter()
    if saved is None:
        losses = _step(pipe, rank, world_size, inputs, targets)
    else:
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            losses = _step(pipe, rank, world_size, inputs, targets)
    return losses, time.perf_counter() - start, origin.item()


def _order(timeline: Timeline, several: bool) -> str:
    """The order this rank ran its microbatches in: ``"F0 F1 B0 ..."`` (``F0@2``: stage 2's)."""
    return " ".join(f"{kind}{mb}" + (f"@{stage}" if several else "") for stage, kind, mb, _, _ in timeline)


def _ms(timeline: Timeline, origin: float) -> list[tuple[int, str, int, float, float]]:
    return [(stage, kind, mb, round((a - origin) * 1e3, 3), round((b - origin) * 1e3, 3))
            for stage, kind, mb, a, b in timeline]


def pipeline_demo(rank: int, world_size: int, schedule: str = "GPipe", n_microbatches: int = 4) -> dict[str, Any]:
    """The course's GPT (4 blocks) cut into one stage per rank (two with an interleaved schedule), trained
    one step with ``torch.distributed.pipelining``'s ``Schedule<schedule>`` on ``n_microbatches``
    microbatches. Against one process on the whole batch: the loss (on the last rank) and this rank's
    gradients. The order its microbatches ran in, the most bytes its stages kept for backward at once
    (`SavedActivations`), and under ``"timings"`` each forward and backward's start and end (ms)."""
    cfg = PIPE_CFG
    tokens = token_batch(cfg, torch.Generator().manual_seed(0))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    torch.manual_seed(0)
    reference = GPT(cfg)
    whole = SavedActivations(reference)
    with torch.autograd.graph.saved_tensors_hooks(whole.pack, whole.unpack):
        ref_loss = reference.loss(tokens)
    ref_loss.backward()

    torch.manual_seed(0)
    gpt = GPT(cfg)  # the same weights; this rank keeps only its stages' part of them
    indices = _stages_of(rank, world_size, schedule)
    n_stages, per = world_size * len(indices), cfg.n_layers // (world_size * len(indices))
    parts: dict[int, nn.Module] = {i: GPTPart(gpt, i * per, (i + 1) * per) for i in indices}
    timeline: Timeline = []
    pipe = _schedule(parts, n_stages, schedule, n_microbatches, _next_token_loss, timeline)
    _first_step(pipe, rank, world_size, inputs, targets, gpt)
    saved = SavedActivations(gpt)
    losses, seconds, origin = _timed_step(pipe, rank, world_size, inputs, targets, timeline, saved)

    mine = {id(p) for part in parts.values() for p in part.parameters()}
    grad_diff = max((p.grad - q.grad).abs().max().item()  # type: ignore[operator]
                    for p, q in zip(gpt.parameters(), reference.parameters(), strict=True) if id(p) in mine)
    found: dict[str, Any] = {"rank": rank, "stages": indices, "grads_equal": grad_diff < TOLERANCE,
                             "max_diff": grad_diff, "order": _order(timeline, len(indices) > 1),
                             "saved_peak_bytes": saved.peak, "saved_bytes_one_process": whole.peak,
                             "timings": {"step_s": seconds, "timeline_ms": _ms(timeline, origin)}}
    if losses:
        # the losses of the measured step (no optimizer: the first step left the weights as they were)
        loss_diff = abs(torch.stack(losses).mean().item() - ref_loss.item())
        found |= {"loss_equal": loss_diff < TOLERANCE, "max_diff": max(grad_diff, loss_diff)}
    return found


class _Wait(torch.autograd.Function):
    """The identity, which takes a fixed time in forward and in backward (a sleep: it leaves the cores free)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
        ctx.backward_s = backward_s
        time.sleep(forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        time.sleep(ctx.backward_s)
        return grad, None, None


class FixedTimeStage(nn.Module):
    """A pipeline stage whose forward takes ``forward_s`` seconds and whose backward ``backward_s`` (a small
    linear layer, then `_Wait`): stages of equal, known cost, as ``(p − 1)/(m + p − 1)`` assumes, that do not
    compete for this machine's few cores."""

    def __init__(self, forward_s: float, backward_s: float) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.forward_s, self.backward_s = forward_s, backward_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Wait.apply(self.linear(x), self.forward_s, self.backward_s)


def bubble_demo(rank: int, world_size: int, schedule: str = "GPipe", n_microbatches: int = 4,
                forward_s: float = 0.05, backward_s: float = 0.1) -> dict[str, Any]:
    """One step of ``Schedule<schedule>`` over `FixedTimeStage` stages (each rank's work per microbatch
    takes ``forward_s`` + ``backward_s``, split between its stages when it has two): the order of its
    microbatches and, under ``"timings"``, its timeline (ms), from which `bubble_fractions` measures the
    bubble. The sends and receives are real; only the compute is a wait."""
    indices = _stages_of(rank, world_size, schedule)
    k = len(indices)
    torch.manual_seed(0)
    stages = {i: FixedTimeStage(0.0, 0.0) for i in indices}  # no waiting in the first step
    timeline: Timeline = []
    pipe = _schedule(dict(stages), world_size * k, schedule, n_microbatches, F.mse_loss, timeline)
    batch = torch.randn(2 * n_microbatches, 8, generator=torch.Generator().manual_seed(0))
    _first_step(pipe, rank, world_size, batch, batch, nn.ModuleList(stages.values()))
    for stage in stages.values():
        stage.forward_s, stage.backward_s = forward_s / k, backward_s / k
    _, seconds, origin = _timed_step(pipe, rank, world_size, batch, batch, timeline)
    return {"rank": rank, "stages": indices, "order": _order(timeline, k > 1),
            "timings": {"step_s": seconds, "timeline_ms": _ms(timeline, origin)}}


def bubble_fractions(timelines: Sequence[Sequence[tuple[int, str, int, float, float]]]) -> list[float]:
    """Each rank's idle share of a pipeline step, from the ranks' timelines (``result["timings"]
    ["timeline_ms"]`` of `bubble_demo` or `pipeline_demo`, one per rank): 1 − (its time computing) / (from
    the first start to the last end on any rank). ``(p − 1)/(m + p − 1)`` is the ideal for GPipe and 1F1B
    with p equal stages and m microbatches, when sending costs nothing."""
    start = min(a for timeline in timelines for *_, a, _ in timeline)
    end = max(b for timeline in timelines for *_, b in timeline)
    return [1 - sum(b - a for *_, a, b in timeline) / (end - start) for timeline in timelines]



def replayed_timelines(timelines: Sequence[Timeline], forward: float | None = None,
                       backward: float | None = None) -> list[Timeline]:
    """The ranks' timelines of one step (every rank's) run again on paper, in the order each rank ran its
    microbatches, with sends that cost nothing: a stage's forward of a microbatch starts once the previous
    stage's forward of it has ended, its backward once its own forward and the next stage's backward have.
    Each forward takes ``forward`` and each backward ``backward`` on a rank (split evenly between a rank's
    stages, as in `bubble_demo`; any unit, only their ratio matters to the bubble), or with None the time it
    took in the timeline. `bubble_fractions` of the result is what the order alone leaves idle (with given
    times: ``(p − 1)/(m + p − 1)`` exactly when the schedule reaches the ideal), or with the measured times the
    least idle time those times allow: a measured timeline idles at least as much."""
    ops = [(stage, kind, mb) for timeline in timelines for stage, kind, mb, *_ in timeline]
    if not ops:
        raise ValueError("the timelines are empty: nothing to replay")
    if len(set(ops)) != len(ops):
        raise ValueError("a stage's forward or backward of a microbatch appears twice: give the timelines of one step")
    stages = sorted({stage for stage, *_ in ops})
    if stages != list(range(len(stages))):
        raise ValueError(f"stages {sorted(set(range(stages[-1] + 1)) - set(stages))} ran nothing: give every rank's timeline")
    work = {(kind, mb) for stage, kind, mb in ops if stage == 0}
    if any({(kind, mb) for st, kind, mb in ops if st == stage} != work for stage in stages):
        raise ValueError("the stages ran different microbatches: give the timelines of one whole step")
    last_stage = stages[-1]
    per_rank = [len({stage for stage, *_ in timeline}) or 1 for timeline in timelines]
    ended: dict[tuple[int, str, int], float] = {}
    free, done = [0.0] * len(timelines), [0] * len(timelines)
    replayed: list[Timeline] = [[] for _ in timelines]
    while any(d < len(timeline) for d, timeline in zip(done, timelines, strict=True)):
        moved = False
        for r, timeline in enumerate(timelines):
            while done[r] < len(timeline):
                stage, kind, mb, start, end = timeline[done[r]]
                if kind == "F":  # the previous stage's forward of this microbatch
                    waits = [(stage - 1, "F", mb)] if stage > 0 else []
                else:  # its own forward, and the next stage's backward of this microbatch
                    waits = [(stage, "F", mb)] + ([(stage + 1, "B", mb)] if stage < last_stage else [])
                if any(w not in ended for w in waits):
                    break
                given = forward if kind == "F" else backward
                took = end - start if given is None else given / per_rank[r]
                begin = max([free[r], *(ended[w] for w in waits)])
                ended[(stage, kind, mb)] = free[r] = begin + took
                replayed[r].append((stage, kind, mb, begin, begin + took))
                done[r] += 1
                moved = True
        if not moved:
            raise ValueError("the ranks' orders wait for each other: no rank can run its next microbatch")
    return replayed


# --- FSDP2 × TP -----------------------------------------------------------------------------------------


def clip_grad_norm_(parameters: Sequence[nn.Parameter], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for a model whose parameters live on different meshes, as FSDP2 ×
    TP leaves them (the split ones on the ``("dp", "tp")`` mesh, the others on ``"dp"`` alone), where
    PyTorch's raises "All operands in aten.stack.default must have the same mesh". The norm of each mesh's
    gradients, made a plain tensor (``full_tensor``), then one total; then each mesh's gradients scaled.
    Returns the total norm, as PyTorch's does. The 2-norm only: no ``norm_type``, ``foreach`` or
    ``error_if_nonfinite``."""
    groups: dict[Any, list[nn.Parameter]] = defaultdict(list)
    for p in parameters:
        if p.grad is not None:
            groups[p.device_mesh if isinstance(p, DTensor) else None].append(p)
    norms = []
    for params in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.tensor(0.0)
    for params in groups.values():
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def _train(model: nn.Module, batches: Sequence[torch.Tensor], lr: float, max_norm: float,
           clip: Callable[[Sequence[nn.Parameter], float], Any], loss_group: Any = None) -> list[float]:
    """SGD steps on ``batches``, gradients clipped to ``max_norm`` by ``clip``; each step's loss (averaged over
    ``loss_group``'s ranks, which trained on the other shares of the batch)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for tokens in batches:
        loss = model.loss(tokens)  # type: ignore[operator]
        loss.backward()
        clip(list(model.parameters()), max_norm)
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        if loss_group is not None:
            dist.all_reduce(total, group=loss_group)
            total /= dist.get_world_size(loss_group)
        losses.append(total.item())
    return losses


def _first_line(run: Callable[[], Any]) -> str:
    """The first line of the error ``run`` raises ("" if none)."""
    try:
        run()
    except Exception as exc:  # the pitfall's message is the point
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return ""


def fsdp_tp_demo(rank: int, world_size: int, checkpoint: str, steps: int = 3, lr: float = 0.1,
                 max_norm: float = 0.1) -> dict[str, Any]:
    """The torchtitan recipe on a ``("dp", "tp")`` mesh of 2 × (``world_size`` / 2): tensor-parallel blocks
    (`tensor_parallel_gpt`) within each "tp" group first, then FSDP2's ``fully_shard`` of each block and of
    the model across "dp"; each "dp" group trains on its share of the batch. ``steps`` SGD steps with the
    gradients clipped to ``max_norm`` against one process on the whole batch: the losses and the weights
    equal within `TOLERANCE`; each weight's placements, and this rank's share of the parameters; the error
    PyTorch's ``clip_grad_norm_`` raises here (`clip_grad_norm_` is the fix), and the one ``fully_shard``
    before ``parallelize_module`` raises.

    Then the DCP checkpoint (notebook 08's ``save_sharded``) of the trained 2-D model, in ``checkpoint``,
    loaded on other meshes: the same GPT tensor-parallel over all ``world_size`` ranks (equal to the trained
    weights?); and a plain `GPT`, FSDP2 over all ranks, which loads it without a word and yet differs from the
    trained model: the checkpoint holds qkv's rows in `TPBlock`'s head-major order."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.fsdp import fully_shard

    from ..checkpoints.sharded import load_sharded, save_sharded

    cfg = GPTConfig(n_layers=2)
    tokens = token_batch(cfg, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    reference = GPT(cfg)
    ref_losses = _train(reference, [tokens] * steps, lr, max_norm, torch.nn.utils.clip_grad_norm_)

    mesh = init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("dp", "tp"))
    gpt = tensor_parallel_gpt(cfg, mesh["tp"])
    for block in gpt.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(gpt, mesh=mesh["dp"])
    mine = tokens.chunk(2)[mesh.get_local_rank("dp")]  # the same rows for the ranks of one "tp" group
    gpt.loss(mine).backward()
    pitfall = _first_line(lambda: torch.nn.utils.clip_grad_norm_(gpt.parameters(), max_norm))
    norm_before = clip_grad_norm_(list(gpt.parameters()), float("inf")).item()  # measures, clips nothing
    gpt.zero_grad()
    losses = _train(gpt, [mine] * steps, lr, max_norm, clip_grad_norm_, mesh.get_group("dp"))
    loss_diff = max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True))
    weight_diff = _max_diff(gpt, reference, cfg.n_heads, grads=False)
    save_sharded(get_model_state_dict(gpt), checkpoint)

    def fsdp_first() -> None:  # the other order: FSDP2 over "dp", then tensor parallelism over "tp"
        torch.manual_seed(0)
        other = GPT(cfg)
        fully_shard(other, mesh=mesh["dp"])
        parallelize_module(other, mesh["tp"], block_plan(prefix="blocks.0."))

    loaded, fixed = {}, {}
    whole = init_device_mesh("cpu", (world_size,), mesh_dim_names=("all",))
    other_tp = tensor_parallel_gpt(cfg, whole, seed=1)  # other weights, overwritten by the load
    torch.manual_seed(1)
    plain = GPT(cfg)
    for block in plain.blocks:
        fully_shard(block, mesh=whole)
    fully_shard(plain, mesh=whole)
    for name, model in (("tp", other_tp), ("fsdp plain GPT", plain)):
        state = get_model_state_dict(model)
        load_sharded(state, checkpoint)
        set_model_state_dict(model, state)
        # a plain GPT's qkv as it is stored; then read in TPBlock's order (qkv_major of the gathered weight)
        loaded[name] = _max_diff(model, reference, cfg.n_heads if model is other_tp else None, grads=False)
        fixed[name] = _max_diff(model, reference, cfg.n_heads, grads=False)
    differ = sorted(n for (n, p), q in zip(plain.named_parameters(), reference.parameters(), strict=True)
                    if (_full(n, p, None) - q).abs().max().item() >= TOLERANCE)
    return {"rank": rank, "coordinate": tuple(mesh.get_coordinate() or ()),
            "losses_equal": loss_diff < TOLERANCE, "weights_equal": weight_diff < TOLERANCE,
            "max_diff": max(loss_diff, weight_diff), "losses": [round(x, 4) for x in losses],
            "clip_error": pitfall, "grad_norm_before_clipping": round(norm_before, 3),
            "fsdp_first_error": _first_line(fsdp_first),
            "placements": {name: str(p.placements) for name, p in gpt.named_parameters()  # type: ignore[attr-defined]
                           if name.startswith("blocks.0.") or not name.startswith("blocks.")},
            "params": _params(gpt), "params_one_process": _params(reference),
            "loaded_equal": {name: diff < TOLERANCE for name, diff in loaded.items()},
            "loaded_max_diff": loaded, "plain_differs_in": differ,
            "plain_equal_read_head_major": fixed["fsdp plain GPT"] < TOLERANCE}


def three_d_demo(rank: int, world_size: int, n_microbatches: int = 4) -> dict[str, Any]:
    """All three on a ``("pp", "dp", "tp")`` mesh of 2 × 2 × (``world_size`` / 4), as torchtitan builds it: the
    course's GPT (`PIPE_CFG`) tensor-parallel over "tp" (`tensor_parallel_gpt`), cut into two pipeline stages
    (`GPTPart`) along "pp", each stage's blocks and the stage sharded by FSDP2 over "dp", one 1F1B step of
    ``n_microbatches`` per "dp" group on its half of the batch. Against one process on the whole batch: this
    rank's gradients (gathered over "dp" and "tp") and, on the last stage, the loss of its half."""
    from torch.distributed import pipelining
    from torch.distributed.fsdp import fully_shard

    cfg = PIPE_CFG
    tokens = token_batch(cfg, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    reference = GPT(cfg)
    reference.loss(tokens).backward()

    mesh = init_device_mesh("cpu", (2, 2, world_size // 4), mesh_dim_names=("pp", "dp", "tp"))
    pp, dp = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    per = cfg.n_layers // 2
    part = GPTPart(tensor_parallel_gpt(cfg, mesh["tp"]), pp * per, (pp + 1) * per)  # seed 0: the same weights
    for block in part.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(part, mesh=mesh["dp"])
    stage = pipelining.PipelineStage(part, pp, 2, torch.device("cpu"), group=mesh.get_group("pp"))
    pipe = pipelining.Schedule1F1B(stage, n_microbatches, loss_fn=_next_token_loss)
    mine = tokens.chunk(2)[dp]  # the same half for every rank of one "dp" group's pipeline
    losses: list[torch.Tensor] = []
    if pp == 0:
        pipe.step(mine[:, :-1])
    else:
        pipe.step(target=mine[:, 1:], losses=losses)

    whole = dict(reference.named_parameters())
    worst = 0.0
    for name, p in part.named_parameters():
        if name.startswith("blocks."):  # the stage's block i is the GPT's block pp · per + i
            _, i, rest = name.split(".", 2)
            name = f"blocks.{int(i) + pp * per}.{rest}"
        mine_grad, one_grad = p.grad, whole[name].grad
        assert mine_grad is not None and one_grad is not None, f"{name} has no gradient"
        worst = max(worst, (_full(name, mine_grad, cfg.n_heads) - one_grad).abs().max().item())
    found: dict[str, Any] = {"rank": rank, "coordinate": tuple(mesh.get_coordinate() or ()),
                             "grads_equal": worst < TOLERANCE, "max_diff": worst}
    if losses:
        with torch.no_grad():
            half = reference.loss(mine).item()
        found["loss_equal"] = abs(torch.stack(losses).mean().item() - half) < TOLERANCE
    return found


# --- the pitfalls ---------------------------------------------------------------------------------------


def pitfalls_demo(rank: int, world_size: int) -> dict[str, str]:
    """The first line of the error each common mistake with ``loss_parallel`` raises, on ``world_size`` ranks:
    the cross-entropy of vocabulary-sharded logits outside it, or with only its forward inside. (`fsdp_tp_demo`
    shows those of FSDP2 × TP.)"""
    cfg = GPTConfig(n_layers=1)
    tokens = token_batch(cfg, torch.Generator().manual_seed(0))
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    gpt = tensor_parallel_gpt(cfg, mesh, vocab_sharded_head=True)

    def forward_only_inside() -> None:
        with loss_parallel():
            loss = gpt.loss(tokens)
        loss.backward()

    return {"loss outside loss_parallel": _first_line(lambda: gpt.loss(tokens)),
            "backward outside loss_parallel": _first_line(forward_only_inside)}


# --- several workers in one launch ----------------------------------------------------------------------


def run_demos(rank: int, world_size: int, calls: Sequence[tuple[Callable[..., Any], dict[str, Any]]],
              ) -> list[Any]:
    """Run each ``(worker, keyword arguments)`` of ``calls`` in turn, in the same process group: one launch
    (seconds of start-up) for several demos. ``launch(run_demos, 2, [(tp_block_demo, {}), (pipeline_demo,
    {"schedule": "1F1B"})])``."""
    return [worker(rank, world_size, **kwargs) for worker, kwargs in calls]
