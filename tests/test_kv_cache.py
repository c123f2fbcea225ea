"""course_utils.inference.kv_cache: cached decoding equals recomputing the prefix; the cache's size and errors."""

from __future__ import annotations

import pytest
import torch

from course_utils.inference.kv_cache import (
    StaticKVCache,
    forward_with_cache,
    generate,
    generate_by_recomputing,
    kv_cache_bytes,
)
from course_utils.models import GPT, GPTConfig

CFG = GPTConfig(vocab=97, seq_len=48, d_model=48, n_heads=3, n_layers=3)


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(CFG).eval()


def test_cached_generation_gives_the_tokens_of_recomputing(model: GPT) -> None:
    prompt = torch.randint(CFG.vocab, (3, 5), generator=torch.Generator().manual_seed(1))
    cached = generate(model, prompt, 30)
    assert cached.shape == (3, 35) and torch.equal(cached[:, :5], prompt)
    assert torch.equal(cached, generate_by_recomputing(model, prompt, 30))


def test_prefill_then_decode_logits_equal_the_full_forward(model: GPT) -> None:
    tokens = torch.randint(CFG.vocab, (2, 20), generator=torch.Generator().manual_seed(2))
    cache = StaticKVCache(CFG, 2, 32)
    with torch.inference_mode():
        full = model(tokens)
        prefill = forward_with_cache(model, tokens[:, :12], torch.arange(12), cache)
        steps = [forward_with_cache(model, tokens[:, n:n + 1], torch.tensor([n]), cache) for n in range(12, 20)]
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        last = forward_with_cache(model, tokens[:, :12], torch.arange(12), StaticKVCache(CFG, 2, 32), last_only=True)
    assert last.shape == (2, 1, CFG.vocab)
    torch.testing.assert_close(last, prefill[:, -1:])


def test_a_stale_slot_beyond_the_position_is_masked(model: GPT) -> None:
    """Slots not written yet (here: filled with junk) must not change the logits: the mask hides them."""
    tokens = torch.randint(CFG.vocab, (1, 6), generator=torch.Generator().manual_seed(3))
    clean, junk = StaticKVCache(CFG, 1, 16), StaticKVCache(CFG, 1, 16)
    junk.k.normal_(), junk.v.normal_()
    with torch.inference_mode():
        a = forward_with_cache(model, tokens, torch.arange(6), clean)
        b = forward_with_cache(model, tokens, torch.arange(6), junk)
    torch.testing.assert_close(a, b)


def test_why_the_cache_starts_as_zeros(model: GPT) -> None:
    """A NaN in a masked slot (what torch.empty may hold) still poisons the output: 0 × NaN is NaN."""
    tokens = torch.randint(CFG.vocab, (1, 4), generator=torch.Generator().manual_seed(4))
    nan = StaticKVCache(CFG, 1, 16)
    nan.v[:, :, :, 10] = float("nan")  # slot 10: never attended to by positions 0…3
    with torch.inference_mode():
        out = forward_with_cache(model, tokens, torch.arange(4), nan)
    assert torch.isnan(out).all()
    assert torch.count_nonzero(StaticKVCache(CFG, 1, 16).k) == 0


def test_cache_bytes_formula_is_the_buffers_size() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        cache = StaticKVCache(CFG, 4, 40, dtype=dtype)
        held = sum(b.numel() * b.element_size() for b in cache.buffers())
        assert kv_cache_bytes(CFG, 4, 40, dtype) == held == 2 * 3 * 4 * 40 * 48 * (4 if dtype == torch.float32 else 2)


def test_bad_input_is_named(model: GPT) -> None:
    with pytest.raises(ValueError, match="max_len must be between 1 and the model's seq_len"):
        StaticKVCache(CFG, 1, CFG.seq_len + 1)
    with pytest.raises(ValueError, match="do not fit a cache of 8 positions"):
        generate(model, torch.zeros(1, 5, dtype=torch.long), 4, cache=StaticKVCache(CFG, 1, 8))
    with pytest.raises(ValueError, match="one position per token"):
        forward_with_cache(model, torch.zeros(1, 3, dtype=torch.long), torch.tensor(0), StaticKVCache(CFG, 1, 8))
    with pytest.raises(ValueError, match="at least 1"):
        kv_cache_bytes(CFG, 0, 8)
    with pytest.raises(ValueError, match="pos must be int64"):
        forward_with_cache(model, torch.zeros(1, 2, dtype=torch.long), torch.arange(2, dtype=torch.int32),
                           StaticKVCache(CFG, 1, 8))
    with pytest.raises(ValueError, match="a torch.bfloat16 cache for a torch.float32 model"):
        forward_with_cache(model, torch.zeros(1, 2, dtype=torch.long), torch.arange(2),
                           StaticKVCache(CFG, 1, 8, dtype=torch.bfloat16))


def test_a_custom_step_is_used_for_decoding(model: GPT) -> None:
    calls = []

    def step(*args):  # type: ignore[no-untyped-def]
        calls.append(args[2].item())
        return forward_with_cache(*args)

    generate(model, torch.zeros(1, 4, dtype=torch.long), 5, step=step)
    assert calls == [4, 5, 6, 7]  # the prefill gives the first new token; four steps give the rest

