"""Checkpoints: reading them on any device, and saying why one does not load.

- `loading`: load a checkpoint or its weights onto any device (`load_checkpoint`, `load_weights`, `strip_prefixes`, optimizer state); notebooks 06 and 08.
- `diagnosis`: what is wrong with a file or folder that does not load, and what to do; behind `loading`.
- `sharded`: checkpoints of `torch.distributed.checkpoint` (one folder, a shard per rank), saved on N ranks and loaded on M; notebook 08.
"""

__all__ = ["diagnosis", "loading", "sharded"]
