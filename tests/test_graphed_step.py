"""course_utils.inference.graphed_step: a CPU model gets a clear error; on a CUDA GPU the replayed step gives the
tokens of the eager one."""

from __future__ import annotations

import pytest
import torch

from course_utils.inference.graphed_step import GraphedStep
from course_utils.inference.kv_cache import StaticKVCache, generate
from course_utils.models import GPT, GPTConfig

CFG = GPTConfig(vocab=97, seq_len=48, d_model=48, n_heads=3, n_layers=2)


def test_a_cpu_model_is_refused_with_what_to_do() -> None:
    model = GPT(CFG).eval()
    cache = StaticKVCache(CFG, 1, 8)
    with pytest.raises(ValueError, match="CUDA graphs need .* CUDA GPU.*forward_with_cache"):
        GraphedStep()(model, torch.zeros(1, 1, dtype=torch.long), torch.tensor([0]), cache)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_replaying_the_graph_generates_the_eager_tokens() -> None:
    torch.manual_seed(0)
    model = GPT(CFG).eval().cuda()
    prompt = torch.randint(CFG.vocab, (2, 5), generator=torch.Generator().manual_seed(1)).cuda()
    step = GraphedStep()
    assert torch.equal(generate(model, prompt, 20, step=step), generate(model, prompt, 20))
    assert torch.equal(generate(model, prompt, 20, step=step), generate(model, prompt, 20))  # a second replay
