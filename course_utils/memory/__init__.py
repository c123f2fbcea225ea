"""Memory: the largest batch that fits, where a step's memory goes, a plan of every phase, and leaks.

- `max_batch_size`: the largest batch size that fits, found by halving after out-of-memory errors; notebook 03.
- `accounting`: where a training step's memory goes: saved activations, a snapshot's timeline, the CPU allocator; notebooks 07 and 08.
- `planner`: a memory plan that predicts each phase of a training step, term by term, and its measurement; notebook 08.
- `inference_plan`: the same for generating with a KV cache: weights, cache, activations of a prefill and a decode step; notebook 10.
- `layout_plan`: the model's state per GPU and the bytes sent per step for a (dp, tp, pp) layout; notebook 11.
- `leaks`: memory that grows every step, measured on any device; notebook 09.
"""

__all__ = ["accounting", "inference_plan", "layout_plan", "leaks", "max_batch_size", "planner"]
