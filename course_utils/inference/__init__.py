"""Inference: generating tokens with a trained model, and what limits its speed.

- `kv_cache`: prefill and decode, a static KV cache, greedy generation with and without it; notebook 10.
- `int8_weights`: int8 weight-only quantization by hand (what torchao's quantize_ does); notebook 10.
- `decode_timing`: decode steps timed right, and whether a step is launch-bound, from a profile; notebook 10.
- `graphed_step`: an eager decode step captured in a CUDA graph and replayed; notebook 10.
- `roofline`: arithmetic intensity, the roofline, the bytes of a decode step, MBU and the knee; notebook 10.
"""

__all__ = ["decode_timing", "graphed_step", "int8_weights", "kv_cache", "roofline"]
