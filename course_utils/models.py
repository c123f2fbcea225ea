"""The networks several places share: notebook 05 (DistributedDataParallel: its torchrun job and its
workers, through `course_utils.distributed.ddp_train` and `course_utils.distributed.ddp_demos`), notebook 06
(loading across devices) and the tool that saved its GPU checkpoints (tools/make_gpu_checkpoints.py),
notebooks 07 (the performance toolbox), 08 (when the model does not fit) and 11 (model parallelism), and the
tests. One definition,
so that a checkpoint saved from one always fits the other, and a seeded network is the same everywhere.

- `small_mlp`: notebook 05's network, 16 features → 32 → 1 with a ReLU (and, for the torchrun job, dropout).
- `FooNet`: the 2019 lecture's network, three 3×3 linear layers without bias, each followed by a ReLU.
- `TinyClassifier`: notebook 06's exercise network, 4 → 8 → 2.
- `GPT`, `GPTConfig`, `token_batch`: notebook 07's model family, a small GPT-like stack of transformer
  blocks (causal self-attention through ``F.scaled_dot_product_attention``, a GELU MLP, pre-norm), and
  the synthetic token sequences it learns (no data set to download).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["GPT", "Block", "FooNet", "GPTConfig", "TinyClassifier", "small_mlp", "token_batch"]


class FooNet(nn.Module):
    """The lecture's network: three 3×3 linear layers without bias, each followed by a ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.linears = nn.ModuleList([nn.Linear(3, 3, bias=False) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for linear in self.linears:
            x = torch.relu(linear(x))
        return x


def small_mlp(seed: int = 0, dropout: float | None = None) -> nn.Sequential:
    """Notebook 05's small MLP: 16 features → 32 with a ReLU → 1, made after ``torch.manual_seed(seed)`` (which
    it calls), so that every process that makes it gets the same weights.

    ``dropout``: an ``nn.Dropout(dropout)`` after the ReLU (`course_utils.distributed.ddp_train`'s job, where
    the RNG state then matters); left out, there is none, and one process and several compute exactly the
    same function (`course_utils.distributed.ddp_demos`). Dropout has no weights and draws nothing when made:
    the weights are the same either way, only the layer numbers of the last ``Linear`` differ (3 against 2)."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(16, 32), nn.ReLU()]
    if dropout is not None:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers, nn.Linear(32, 1))


class TinyClassifier(nn.Module):
    """Notebook 06's exercise network: 4 inputs, 8 hidden units with a ReLU, 2 outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(4, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a `GPT`: vocabulary, context length, width, heads, blocks; and the batch it trains on."""

    vocab: int = 256
    seq_len: int = 64
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    batch: int = 8

    def __post_init__(self) -> None:
        if min(self.vocab, self.seq_len, self.d_model, self.n_heads, self.n_layers, self.batch) < 1:
            raise ValueError(f"GPTConfig: every size must be at least 1, got {self}")
        if self.d_model % self.n_heads:
            raise ValueError(f"GPTConfig: d_model ({self.d_model}) must be a multiple of n_heads "
                             f"({self.n_heads}): each head gets d_model // n_heads features")


class Block(nn.Module):
    """One pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).unbind(2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """A small GPT-like language model: token and position embeddings, `GPTConfig.n_layers` blocks, a final
    norm and a linear head. ``model(tokens)`` returns logits; ``model.loss(tokens)`` the next-token
    cross-entropy of a batch of sequences.

    ``checkpointed=True`` runs every block through ``torch.utils.checkpoint.checkpoint(block, x,
    use_reentrant=False)`` (notebook 08): each block keeps only its input and is recomputed in backward."""

    def __init__(self, cfg: GPTConfig, checkpointed: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.checkpointed = checkpointed
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return self.head(self.norm(x))

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of predicting ``tokens[:, 1:]`` from what comes before each."""
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


def token_batch(cfg: GPTConfig, generator: torch.Generator | None = None) -> torch.Tensor:
    """A ``(batch, seq_len)`` tensor of token sequences a model can learn: each row counts up from a random
    start in a random stride of 1 to 4, modulo the vocabulary (the stride is visible from two tokens on).
    Drawn on the CPU (move it where you train), so a seeded generator gives the same batch everywhere."""
    start = torch.randint(cfg.vocab, (cfg.batch, 1), generator=generator)
    stride = torch.randint(1, 5, (cfg.batch, 1), generator=generator)
    return (start + stride * torch.arange(cfg.seq_len)) % cfg.vocab
