"""course_utils.models: the networks several notebooks share (notebook 05's small MLP, the GPT's checkpointing).

The small MLP had two definitions before (``ddp_train.make_model`` and ``ddp_demos.tiny_model``); the tests pin
the layers, their names, the weights of a seed and what it draws from the RNG to those definitions, written out
here, so that every seeded result of notebook 05 (the weights hash of its torchrun job) stays the same.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_utils import models
from course_utils.distributed import ddp_demos, ddp_train
from course_utils.models import GPT, GPTConfig, small_mlp, token_batch


def _as_written_before(seed: int, dropout: bool) -> nn.Sequential:
    """The two definitions ``small_mlp`` replaces, as they were."""
    torch.manual_seed(seed)
    if dropout:  # ddp_train.make_model
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))  # ddp_demos.tiny_model


def _same(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("seed", [0, 1, 123])
@pytest.mark.parametrize("dropout", [False, True])
def test_small_mlp_is_the_network_it_replaces(seed: int, dropout: bool) -> None:
    torch.manual_seed(99)
    before = _as_written_before(seed, dropout)
    rng_before = torch.get_rng_state()
    torch.manual_seed(99)
    now = small_mlp(seed, dropout=0.1 if dropout else None)
    assert repr(now) == repr(before)  # the same layers, numbered the same
    assert _same(now, before)  # the same weights, under the same names
    assert torch.equal(torch.get_rng_state(), rng_before)  # and the same draws from the RNG


def test_the_notebook_05_names_are_small_mlp() -> None:
    """``ddp_demos.tiny_model`` is ``small_mlp`` itself (an import); ``ddp_train.make_model`` is it with dropout."""
    assert ddp_demos.tiny_model is small_mlp
    assert _same(ddp_train.make_model(3), small_mlp(3, dropout=0.1))
    assert isinstance(ddp_train.make_model()[2], nn.Dropout) and ddp_train.make_model()[2].p == 0.1
    assert not any(isinstance(m, nn.Dropout) for m in ddp_demos.tiny_model())
    # dropout makes no weights and draws nothing: the weights agree, under the last layer's other number
    with_dropout, without = small_mlp(5, dropout=0.1).state_dict(), small_mlp(5).state_dict()
    assert torch.equal(with_dropout["3.weight"], without["2.weight"])
    assert ddp_train.weights_sha256(ddp_train.make_model(7)) == ddp_train.weights_sha256(_as_written_before(7, True))


def test_small_mlp_takes_the_job_s_inputs() -> None:
    x, y = ddp_train.make_dataset(8).tensors
    assert small_mlp()(x).shape == y.shape
    assert small_mlp()(ddp_demos.global_batch()[0]).shape == (8, 1)


def test_gpt_checkpointing_is_off_by_default_and_changes_no_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """``GPT(cfg, checkpointed=True)`` runs each block through ``checkpoint(block, x, use_reentrant=False)``:
    the same loss and gradients; without it, no block is checkpointed."""
    cfg = GPTConfig(vocab=50, seq_len=12, d_model=24, n_heads=3, n_layers=3, batch=5)
    tokens = token_batch(cfg, torch.Generator().manual_seed(0))
    calls: list[dict[str, object]] = []
    real = models.checkpoint

    def spy(fn: nn.Module, *args: torch.Tensor, **kwargs: bool) -> torch.Tensor:
        calls.append({"block": fn, **kwargs})
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(models, "checkpoint", spy)
    results = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = GPT(cfg, checkpointed=checkpointed) if checkpointed else GPT(cfg)
        assert model.checkpointed is checkpointed
        loss = model.loss(tokens)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
        if not checkpointed:
            assert calls == []
    assert [c["block"] for c in calls] == list(model.blocks)
    assert all(c == {"block": c["block"], "use_reentrant": False} for c in calls)
    (loss0, grads0), (loss1, grads1) = results
    assert torch.equal(loss0, loss1)
    assert all(torch.equal(g0, g1) for g0, g1 in zip(grads0, grads1, strict=True))
