"""Processes working together: starting them from a notebook, and the jobs and demos they run.

- `launch`: start worker processes from a notebook, joined into a process group; notebooks 05, 08 and 09.
- `torchrun`: `torchrun` from a notebook cell; notebooks 05 and 08.
- `ddp_train`: the DDP training job that `torchrun` launches (`python -m course_utils.distributed.ddp_train`); notebook 05.
- `ddp_demos`: the workers of notebook 05's demos: collectives, gradients three ways, BatchNorm, unused parameters.
- `dp_vs_ddp`: DataParallel against DDP on real GPUs; notebook 05's `%%gpu` cell.
- `data_parallel`: how DataParallel cuts a batch into chunks, and the pictures of its steps; notebook 04.
- `hangs`: a distributed job that hangs, and where each rank waits; notebook 09.
- `model_parallel_demos`: the workers of notebook 11: the device mesh, tensor, sequence and pipeline parallelism,
  loss parallel and FSDP2 × TP, each checked against one process.
"""

__all__ = ["data_parallel", "ddp_demos", "ddp_train", "dp_vs_ddp", "hangs", "launch", "model_parallel_demos",
           "torchrun"]
