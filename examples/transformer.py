"""A small transformer for `ray-ormas train examples/transformer_fsdp.yaml` (FSDP2, CPU or GPU).

Next-token prediction on synthetic sequences made by the code (no download): each sequence
counts up by a step that depends on its first token, modulo the vocabulary, so the task is
learnable in a few hundred steps. Under FSDP the monitor records gradient alarms, loss checks
and global gradient norms; channel checks, the certificate and repair are off (sharded weights).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset


class TinyTransformer(nn.Module):
    """Token embedding, TransformerEncoder layers, a linear head."""

    def __init__(self, vocab: int = 32, dim: int = 32, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=heads, dim_feedforward=2 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


def model(vocab: int = 32, dim: int = 32, layers: int = 2) -> TinyTransformer:
    return TinyTransformer(vocab, dim, layers)


def sequences(n: int = 2048, length: int = 16, vocab: int = 32, seed: int = 0) -> dict[str, TensorDataset]:
    """{'train', 'val'}: (tokens[:-1], tokens[1:]) pairs of counting sequences."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    stride = 1 + start % 3
    seq = (start + stride * torch.arange(length + 1)) % vocab
    data = TensorDataset(seq[:, :-1], seq[:, 1:])
    cut = n * 7 // 8
    return {"train": torch.utils.data.Subset(data, range(cut)), "val": torch.utils.data.Subset(data, range(cut, n))}


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
