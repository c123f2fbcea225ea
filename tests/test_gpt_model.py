"""The GPT of course_utils.models (the small language model of notebooks 07 and 08): its configuration's
checks, its seeded token batches, and that it is causal and trains. test_models.py tests the module's other
networks and the GPT's activation checkpointing."""

from __future__ import annotations

import pytest
import torch

from course_utils.models import GPT, GPTConfig, token_batch


def test_gpt_config_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="multiple of n_heads"):
        GPTConfig(d_model=10, n_heads=4)
    with pytest.raises(ValueError, match="at least 1"):
        GPTConfig(batch=0)


def test_token_batch_is_seeded_and_learnable() -> None:
    cfg = GPTConfig(vocab=50, seq_len=12, batch=5)
    a = token_batch(cfg, torch.Generator().manual_seed(3))
    b = token_batch(cfg, torch.Generator().manual_seed(3))
    assert a.shape == (5, 12) and torch.equal(a, b)
    steps = (a[:, 1:] - a[:, :-1]) % cfg.vocab  # each row counts up with one stride of 1 to 4
    assert all(len(set(row.tolist())) == 1 and 1 <= row[0] <= 4 for row in steps)


def test_gpt_is_causal_and_trains() -> None:
    cfg = GPTConfig()
    torch.manual_seed(0)
    model = GPT(cfg)
    tokens = token_batch(cfg, torch.Generator().manual_seed(0))
    logits = model(tokens)
    assert logits.shape == (cfg.batch, cfg.seq_len, cfg.vocab)
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % cfg.vocab  # the last token must not change earlier predictions
    assert torch.allclose(model(changed)[:, :-1], logits[:, :-1], atol=1e-6)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = model.loss(tokens).item()
    for _ in range(30):
        loss = model.loss(tokens)
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert loss.item() < first - 1
