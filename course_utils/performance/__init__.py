"""Making a step fast: profiler traces, `torch.compile`, a CPU stand-in for CUDA graphs, and the input pipeline.

- `traces`: reading a profiler trace and drawing it; notebook 07.
- `compiling`: whether `torch.compile` can generate code here, what it recompiled and what it autotuned; notebook 07.
- `cuda_graph_standin`: a CPU stand-in for CUDA graphs, to check a capture without a GPU; notebook 07.
- `datasets`: data sets for measuring an input pipeline (slow reads, decoded images); notebooks 07 and 09.
- `dataloader_workers`: what a DataLoader worker inherits from its parent under fork and spawn; notebook 09.
"""

__all__ = ["compiling", "cuda_graph_standin", "dataloader_workers", "datasets", "traces"]
